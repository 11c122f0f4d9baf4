// spgate-sim's length distributions and batch packing: --lengths parsing (errors name the
// part), batches never exceed tokens_per_batch, bucketing gives low-CV batches, traces
// replay in order.
#include "tools/sim/lengths.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_policy.h"
#include "tests/testing/status_matchers.h"

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

struct BadSpec {
  const char* spec;
  const char* message;
};

TEST(ParseLengthsTest, RejectsBadSpecsNamingThePart) {
  for (const BadSpec& c : {BadSpec{"gamma:k=2", "unknown distribution"},
                           BadSpec{"lognormal:mean=4096", "missing sigma="},
                           BadSpec{"lognormal:mean=4096,sigma=x", "\"sigma=x\" is not name=number"},
                           BadSpec{"lognormal:mean=4096,sigma=0.8,k=1", "unexpected parameter"},
                           BadSpec{"uniform:min=10,max=5", "min <= max"},
                           BadSpec{"bimodal:short=512,long=16384,p_long=2", "p_long <= 1"},
                           BadSpec{"file:/nonexistent/trace.txt", "cannot open"}}) {
    EXPECT_THAT(ParseLengths(c.spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr(c.message)))
        << c.spec;
  }
}

TEST(ParseLengthsTest, LognormalHasTheRequestedMean) {
  auto d = ParseLengths("lognormal:mean=4096,sigma=0.8");
  ASSERT_THAT(d.status(), IsOk());
  std::mt19937_64 rng(3);
  double sum = 0;
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) sum += static_cast<double>((*d)->Sample(rng));
  EXPECT_NEAR(sum / kN, 4096, 4096 * 0.02);
}

TEST(ParseLengthsTest, FileTraceReplaysInOrderAndReportsBadLines) {
  const std::string path = ::testing::TempDir() + "/lengths_trace.txt";
  std::ofstream(path) << "# a trace\n100\n\n200\n300\n";
  auto d = ParseLengths("file:" + path);
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_TRUE((*d)->is_trace());
  std::mt19937_64 rng(1);
  std::vector<int64_t> got;
  for (int i = 0; i < 4; ++i) got.push_back((*d)->Sample(rng));
  EXPECT_EQ(got, (std::vector<int64_t>{100, 200, 300, 100}));
  std::ofstream(path) << "100\nabc\n";
  EXPECT_THAT(ParseLengths("file:" + path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
}

double MeanCv(BatchSource& src, int n, int64_t tokens_per_batch) {
  double cv = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> b = src.Next();
    EXPECT_FALSE(b.empty());
    EXPECT_LE(std::accumulate(b.begin(), b.end(), int64_t{0}), tokens_per_batch);
    cv += ComputeLengthStats(b)->cv;
  }
  return cv / n;
}

TEST(BatchSourceTest, BucketingLowersTheLengthCv) {
  std::shared_ptr<LengthDistribution> d = *ParseLengths("lognormal:mean=2048,sigma=0.8");
  BatchSource bucketed(d, {.tokens_per_batch = 65536, .bucketing = true}, 1);
  BatchSource raw(d, {.tokens_per_batch = 65536, .bucketing = false}, 1);
  const double cv_b = MeanCv(bucketed, 500, 65536);
  const double cv_r = MeanCv(raw, 500, 65536);
  EXPECT_LT(cv_b, 0.15);
  EXPECT_GT(cv_r, 0.5);
}

TEST(BatchSourceTest, SequencesLongerThanABatchAreCut) {
  std::shared_ptr<LengthDistribution> d = *ParseLengths("uniform:min=5000,max=9000");
  BatchSource src(d, {.tokens_per_batch = 4096, .bucketing = false}, 1);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(src.Next(), std::vector<int64_t>{4096});
}

}  // namespace
}  // namespace spgate::sim
