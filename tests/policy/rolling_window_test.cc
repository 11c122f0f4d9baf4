// RollingWindow: the last N samples, mean in O(1) (re-summed once per lap so rounding
// cannot drift), nearest-rank quantiles, resizing that keeps the newest samples.
// Quantiles are checked against the integer definition rank = ceil(p * n / 100) for
// every n up to 300, so a floating-point off-by-one in the rank would show.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/rolling_window.h"

namespace spgate {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

double ExactMean(const std::vector<double>& v) {
  long double s = 0;
  for (double x : v) s += x;
  return static_cast<double>(s / static_cast<long double>(v.size()));
}

TEST(RollingWindowTest, EmptyWindowReportsZeros) {
  RollingWindow w(50);
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.size(), 0);
  EXPECT_EQ(w.capacity(), 50);
  EXPECT_EQ(w.Mean(), 0.0);
  EXPECT_EQ(w.Sum(), 0.0);
  EXPECT_EQ(w.Quantile(0.95), 0.0);
  EXPECT_EQ(w.Max(), 0.0);
  EXPECT_THAT(w.Samples(), IsEmpty());
}

TEST(RollingWindowTest, CapacityIsAtLeastOne) {
  EXPECT_EQ(RollingWindow(0).capacity(), 1);
  EXPECT_EQ(RollingWindow(-7).capacity(), 1);
  EXPECT_EQ(RollingWindow().capacity(), 1);
  RollingWindow w(0);
  w.Push(1.0);
  w.Push(2.0);
  EXPECT_THAT(w.Samples(), ElementsAre(2.0));
  EXPECT_EQ(w.Mean(), 2.0);
}

TEST(RollingWindowTest, KeepsTheLastCapacitySamplesOldestFirst) {
  RollingWindow w(4);
  w.Push(1);
  w.Push(2);
  EXPECT_THAT(w.Samples(), ElementsAre(1, 2));
  EXPECT_EQ(w.Mean(), 1.5);
  w.Push(3);
  w.Push(4);
  EXPECT_THAT(w.Samples(), ElementsAre(1, 2, 3, 4));
  w.Push(5);
  EXPECT_THAT(w.Samples(), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(w.Mean(), 3.5);
  EXPECT_EQ(w.Sum(), 14.0);
  EXPECT_EQ(w.Max(), 5.0);
  for (int i = 6; i <= 11; ++i) w.Push(i);
  EXPECT_THAT(w.Samples(), ElementsAre(8, 9, 10, 11));
  EXPECT_EQ(w.size(), 4);
  EXPECT_EQ(w.Mean(), 9.5);
}

TEST(RollingWindowTest, MatchesAReferenceDequeOverManyPushes) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  for (int64_t cap : {1, 2, 3, 50, 64, 1000}) {
    RollingWindow w(cap);
    std::vector<double> all;
    for (int i = 0; i < 5000; ++i) {
      const double x = dist(rng);
      w.Push(x);
      all.push_back(x);
      if (i % 97 == 0 || i == 4999) {
        const size_t keep = std::min<size_t>(all.size(), static_cast<size_t>(cap));
        const std::vector<double> last(all.end() - keep, all.end());
        ASSERT_EQ(w.Samples(), last) << cap << " @" << i;
        ASSERT_NEAR(w.Mean(), ExactMean(last), 1e-14) << cap << " @" << i;
        ASSERT_EQ(w.Max(), *std::max_element(last.begin(), last.end()));
      }
    }
  }
}

// A million pushes through a 50-sample window: the running sum is rebuilt every lap, so
// the mean stays as accurate as a fresh sum however long the group runs.
TEST(RollingWindowTest, ManyLapsDoNotDrift) {
  RollingWindow w(50);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  std::vector<double> last;
  for (int i = 0; i < 1'000'000; ++i) {
    const double x = dist(rng);
    w.Push(x);
    last.push_back(x);
    if (last.size() > 50) last.erase(last.begin());
  }
  EXPECT_NEAR(w.Mean(), ExactMean(last), 1e-15);

  // Constant input: the mean is that constant exactly after any number of laps.
  RollingWindow c(50);
  for (int i = 0; i < 100'000; ++i) c.Push(0.25);
  EXPECT_EQ(c.Mean(), 0.25);
}

// A huge sample leaves rounding error in the running sum while it is in the window; it
// is gone once a lap has passed without it.
TEST(RollingWindowTest, HugeSampleLeavesNoTraceAfterALap) {
  RollingWindow w(4);
  w.Push(1e15);
  for (int i = 0; i < 4 + 3; ++i) w.Push(0.1);
  EXPECT_THAT(w.Samples(), ElementsAre(0.1, 0.1, 0.1, 0.1));
  EXPECT_NEAR(w.Mean(), 0.1, 1e-16);
}

TEST(RollingWindowTest, QuantileIsNearestRank) {
  for (int64_t n = 1; n <= 300; ++n) {
    // A shuffled 1..n, so the value at rank r is r.
    std::vector<double> values(n);
    std::iota(values.begin(), values.end(), 1.0);
    std::shuffle(values.begin(), values.end(), std::mt19937_64(n));
    RollingWindow w(n);
    for (double v : values) w.Push(v);
    for (int64_t p : {0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 100}) {
      const int64_t rank = std::max<int64_t>(1, (p * n + 99) / 100);  // ceil(p n / 100)
      ASSERT_EQ(w.Quantile(static_cast<double>(p) / 100.0), static_cast<double>(rank))
          << "n " << n << " p" << p;
    }
  }
}

TEST(RollingWindowTest, QuantileExamples) {
  RollingWindow w(50);
  for (int i = 1; i <= 50; ++i) w.Push(i * 0.001);
  EXPECT_DOUBLE_EQ(w.Quantile(0.95), 0.048);  // ceil(47.5) = 48
  EXPECT_DOUBLE_EQ(w.Quantile(0.5), 0.025);
  EXPECT_DOUBLE_EQ(w.Quantile(1.0), 0.050);
  EXPECT_DOUBLE_EQ(w.Quantile(0.0), 0.001);
  // Out-of-range q clamps to the extremes.
  EXPECT_DOUBLE_EQ(w.Quantile(-1.0), 0.001);
  EXPECT_DOUBLE_EQ(w.Quantile(2.0), 0.050);
  // Quantile does not disturb the ring.
  EXPECT_EQ(w.Samples().front(), 0.001);
  EXPECT_EQ(w.Samples().back(), 0.050);
}

TEST(RollingWindowTest, ResizeKeepsTheNewestSamples) {
  RollingWindow w(5);
  for (int i = 1; i <= 8; ++i) w.Push(i);  // wrapped: 4 5 6 7 8
  ASSERT_THAT(w.Samples(), ElementsAre(4, 5, 6, 7, 8));

  w.Resize(3);
  EXPECT_EQ(w.capacity(), 3);
  EXPECT_THAT(w.Samples(), ElementsAre(6, 7, 8));
  EXPECT_EQ(w.Mean(), 7.0);
  w.Push(9);
  EXPECT_THAT(w.Samples(), ElementsAre(7, 8, 9));

  w.Resize(6);
  EXPECT_EQ(w.capacity(), 6);
  EXPECT_THAT(w.Samples(), ElementsAre(7, 8, 9));
  for (int i = 10; i <= 14; ++i) w.Push(i);
  EXPECT_THAT(w.Samples(), ElementsAre(9, 10, 11, 12, 13, 14));
  EXPECT_EQ(w.Mean(), 11.5);

  w.Resize(6);  // same capacity: nothing changes
  EXPECT_THAT(w.Samples(), ElementsAre(9, 10, 11, 12, 13, 14));
  w.Resize(0);  // clamps to 1
  EXPECT_THAT(w.Samples(), ElementsAre(14));
  EXPECT_EQ(w.Mean(), 14.0);
}

TEST(RollingWindowTest, ClearEmptiesButKeepsCapacity) {
  RollingWindow w(3);
  for (int i = 1; i <= 5; ++i) w.Push(i);
  w.Clear();
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.capacity(), 3);
  EXPECT_EQ(w.Mean(), 0.0);
  EXPECT_EQ(w.Sum(), 0.0);
  w.Push(10);
  EXPECT_THAT(w.Samples(), ElementsAre(10));
  EXPECT_EQ(w.Mean(), 10.0);
  for (int i = 11; i <= 14; ++i) w.Push(i);
  EXPECT_THAT(w.Samples(), ElementsAre(12, 13, 14));
  EXPECT_EQ(w.Mean(), 13.0);
}

}  // namespace
}  // namespace spgate
