// ComputeLengthStats (docs/design.md §2 length_cv): population stddev / mean of the batch's
// lengths, 0 for one sequence; lengths must be in [1, kMaxSequenceLength] and a batch
// must not be empty. The implementation sums x and x^2 in integers, in chunks of 1024;
// these tests check it against a two-pass reference in long double, on sizes that
// straddle the chunk boundaries, and at the largest lengths and batch sizes allowed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_policy.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::DoubleEq;
using ::testing::Eq;
using ::testing::Field;
using ::testing::HasSubstr;

// Two-pass reference: mean first, then the mean squared deviation.
struct RefStats {
  int64_t tokens = 0;
  int64_t max_length = 0;
  double mean = 0.0;
  double cv = 0.0;
};
RefStats Reference(const std::vector<int64_t>& v) {
  RefStats r;
  long double sum = 0;
  for (int64_t x : v) {
    r.tokens += x;
    r.max_length = std::max(r.max_length, x);
    sum += static_cast<long double>(x);
  }
  const long double mean = sum / static_cast<long double>(v.size());
  long double ss = 0;
  for (int64_t x : v) {
    const long double d = static_cast<long double>(x) - mean;
    ss += d * d;
  }
  r.mean = static_cast<double>(mean);
  r.cv = static_cast<double>(std::sqrt(ss / static_cast<long double>(v.size())) / mean);
  return r;
}

void ExpectMatchesReference(const std::vector<int64_t>& lengths, const std::string& what) {
  SCOPED_TRACE(what + ", n = " + std::to_string(lengths.size()));
  absl::StatusOr<LengthStats> got = ComputeLengthStats(lengths);
  ASSERT_THAT(got, IsOk());
  const RefStats want = Reference(lengths);
  EXPECT_EQ(got->sequences, static_cast<int64_t>(lengths.size()));
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->max_length, want.max_length);
  EXPECT_DOUBLE_EQ(got->mean, want.mean);
  // The integer moments are exact, so the only error is the final rounding of the
  // variance to double and the sqrt: far below 1e-12 relative.
  EXPECT_NEAR(got->cv, want.cv, 1e-12 * std::max(want.cv, 1e-300)) << "reference " << want.cv;
}

std::vector<int64_t> Lognormal(size_t n, double mean_len, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> dist(std::log(mean_len) - sigma * sigma / 2, sigma);
  std::vector<int64_t> out(n);
  for (int64_t& x : out) {
    x = std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 1, kMaxSequenceLength);
  }
  return out;
}

std::vector<int64_t> Uniform(size_t n, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<int64_t> out(n);
  for (int64_t& x : out) x = dist(rng);
  return out;
}

// ---- Invalid input ----

TEST(ComputeLengthStatsTest, EmptyBatchIsInvalid) {
  EXPECT_THAT(ComputeLengthStats({}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths")));
}

TEST(ComputeLengthStatsTest, OutOfRangeLengthNamesItsIndex) {
  struct Case {
    std::vector<int64_t> lengths;
    std::string named;  // the lengths[i] the message must name
  };
  const int64_t kMax = kMaxSequenceLength;
  const Case cases[] = {
      {{0}, "lengths[0] = 0"},
      {{-1}, "lengths[0] = -1"},
      {{std::numeric_limits<int64_t>::min()}, "lengths[0]"},
      {{kMax + 1}, "lengths[0] = 16777217"},
      // 2^25 + 5 would look like 5 after the implementation's 25-bit mask: still refused.
      {{(int64_t{1} << 25) + 5}, "lengths[0]"},
      {{int64_t{1} << 40}, "lengths[0]"},
      {{std::numeric_limits<int64_t>::max()}, "lengths[0]"},
      {{512, 0, 4096}, "lengths[1] = 0"},
      {{512, 4096, -7}, "lengths[2] = -7"},
      {{3, 0, -1, kMax + 1}, "lengths[1] = 0"},  // the first offender is named
  };
  for (const Case& tc : cases) {
    EXPECT_THAT(ComputeLengthStats(tc.lengths),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(tc.named)))
        << tc.named;
  }
}

TEST(ComputeLengthStatsTest, OutOfRangeLengthFoundInAnyChunk) {
  for (size_t bad_at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{2047},
                        size_t{2048}, size_t{4999}}) {
    for (int64_t bad : {int64_t{0}, int64_t{-3}, kMaxSequenceLength + 1}) {
      std::vector<int64_t> v(5000, 4096);
      v[bad_at] = bad;
      EXPECT_THAT(ComputeLengthStats(v),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("lengths[" + std::to_string(bad_at) + "] = " +
                                           std::to_string(bad)),
                                 HasSubstr("[1, 16777216]"))))
          << "bad " << bad << " at " << bad_at;
    }
  }
}

TEST(ComputeLengthStatsTest, TooManySequences) {
  std::vector<int64_t> v(kMaxSequencesPerBatch + 1, 1);
  EXPECT_THAT(ComputeLengthStats(v),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lengths"), HasSubstr("1048577"))));
}

// ---- Exact values ----

TEST(ComputeLengthStatsTest, SingleSequenceHasCvZero) {
  for (int64_t x : {int64_t{1}, int64_t{7}, int64_t{4096}, kMaxSequenceLength}) {
    const std::vector<int64_t> v = {x};
    EXPECT_THAT(ComputeLengthStats(v),
                IsOkAndHolds(AllOf(Field(&LengthStats::sequences, 1),
                                   Field(&LengthStats::tokens, x),
                                   Field(&LengthStats::max_length, x),
                                   Field(&LengthStats::mean, static_cast<double>(x)),
                                   Field(&LengthStats::cv, 0.0))))
        << x;
  }
}

TEST(ComputeLengthStatsTest, UniformBatchHasCvExactlyZero) {
  for (size_t n : {size_t{2}, size_t{3}, size_t{1000}, size_t{1023}, size_t{1024},
                   size_t{1025}, size_t{3001}, size_t{100'000}}) {
    for (int64_t x : {int64_t{1}, int64_t{333}, int64_t{4096}, int64_t{32'767},
                      kMaxSequenceLength}) {
      const std::vector<int64_t> v(n, x);
      absl::StatusOr<LengthStats> s = ComputeLengthStats(v);
      ASSERT_THAT(s, IsOk());
      EXPECT_EQ(s->cv, 0.0) << n << " x " << x;  // exactly: no rounding noise
      EXPECT_EQ(s->mean, static_cast<double>(x));
      EXPECT_EQ(s->tokens, static_cast<int64_t>(n) * x);
    }
  }
}

TEST(ComputeLengthStatsTest, KnownValues) {
  struct Case {
    std::vector<int64_t> lengths;
    double mean;
    double cv;
  };
  const Case cases[] = {
      {{1, 3}, 2.0, 0.5},                               // stddev 1
      {{2, 4, 4, 4, 5, 5, 7, 9}, 5.0, 0.4},             // stddev 2
      {{512, 512, 512, 1536}, 768.0, std::sqrt(3.0) / 3.0},  // stddev 256*sqrt(3)
      {{100, 300}, 200.0, 0.5},
      {{1, kMaxSequenceLength}, (1.0 + 16777216.0) / 2,
       (16777216.0 - 1.0) / (16777216.0 + 1.0)},
  };
  for (const Case& tc : cases) {
    EXPECT_THAT(ComputeLengthStats(tc.lengths),
                IsOkAndHolds(AllOf(Field(&LengthStats::mean, DoubleEq(tc.mean)),
                                   Field(&LengthStats::cv, DoubleEq(tc.cv)))))
        << tc.lengths.size();
  }
}

TEST(ComputeLengthStatsTest, MatchesTwoPassReferenceAcrossChunkBoundaries) {
  const size_t sizes[] = {1, 2, 3, 17, 999, 1000, 1023, 1024, 1025, 2047, 2048,
                          2049, 3071, 4096, 4097, 10'000, 65'537};
  uint64_t seed = 1;
  for (size_t n : sizes) {
    ExpectMatchesReference(Lognormal(n, 4096, 0.8, seed++), "lognormal 4096/0.8");
    ExpectMatchesReference(Lognormal(n, 300'000, 1.5, seed++), "lognormal 300k/1.5");
    ExpectMatchesReference(Uniform(n, 128, 8192, seed++), "uniform 128..8192");
    ExpectMatchesReference(Uniform(n, 1, kMaxSequenceLength, seed++), "uniform full range");
  }
}

// A nearly uniform batch has a tiny CV that subtractive formulas in double lose entirely.
TEST(ComputeLengthStatsTest, NearlyUniformBatchKeepsItsSmallCv) {
  std::vector<int64_t> v(4099, kMaxSequenceLength);
  v[4098] = kMaxSequenceLength - 1;
  ExpectMatchesReference(v, "one shorter by a token");
  absl::StatusOr<LengthStats> s = ComputeLengthStats(v);
  ASSERT_THAT(s, IsOk());
  EXPECT_GT(s->cv, 0.0);
  EXPECT_LT(s->cv, 1e-8);
}

TEST(ComputeLengthStatsTest, MaxFoundInEveryPosition) {
  for (size_t n : {size_t{1025}, size_t{2049}}) {
    for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, n - 1}) {
      std::vector<int64_t> v(n, 100);
      v[at] = 99'999;
      EXPECT_THAT(ComputeLengthStats(v), IsOkAndHolds(Field(&LengthStats::max_length, 99'999)))
          << n << " @" << at;
    }
  }
}

// The largest batch of the largest sequences: 2^20 * 2^24 = 2^44 tokens, sum of squares
// 2^68 (past 64 bits), so the 128-bit accumulation is what keeps this exact.
TEST(ComputeLengthStatsTest, LargestBatchOfLargestLengthsIsExact) {
  const int64_t n = kMaxSequencesPerBatch;
  const std::vector<int64_t> same(n, kMaxSequenceLength);
  EXPECT_THAT(ComputeLengthStats(same),
              IsOkAndHolds(AllOf(Field(&LengthStats::sequences, n),
                                 Field(&LengthStats::tokens, int64_t{1} << 44),
                                 Field(&LengthStats::max_length, kMaxSequenceLength),
                                 Field(&LengthStats::mean, 16777216.0),
                                 Field(&LengthStats::cv, 0.0))));

  // Alternating 1 and 2^24: mean (2^24+1)/2, stddev (2^24-1)/2.
  std::vector<int64_t> alt(n);
  for (int64_t i = 0; i < n; ++i) alt[i] = (i % 2 == 0) ? 1 : kMaxSequenceLength;
  EXPECT_THAT(ComputeLengthStats(alt),
              IsOkAndHolds(AllOf(Field(&LengthStats::tokens, (n / 2) * (kMaxSequenceLength + 1)),
                                 Field(&LengthStats::mean, DoubleEq((16777216.0 + 1) / 2)),
                                 Field(&LengthStats::cv, DoubleEq((16777216.0 - 1) /
                                                                  (16777216.0 + 1))))));
  ExpectMatchesReference(Uniform(n, 1, kMaxSequenceLength, 99), "largest batch, full range");
}

TEST(ComputeLengthStatsTest, IsPermutationInvariant) {
  std::vector<int64_t> v = Lognormal(3000, 4096, 1.0, 7);
  absl::StatusOr<LengthStats> a = ComputeLengthStats(v);
  std::reverse(v.begin(), v.end());
  absl::StatusOr<LengthStats> b = ComputeLengthStats(v);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->cv, b->cv);  // bit-identical: integer sums do not depend on order
  EXPECT_EQ(a->mean, b->mean);
}

}  // namespace
}  // namespace spgate
