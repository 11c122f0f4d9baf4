// Batching (worker/runtime/batching.h): packing in arrival order under the token
// budget, bucket_by_tokens' CV bound, and the batch helpers both tools share.
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/types.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/lengths.h"
#include "worker/runtime/transformer_stack.h"

namespace spgate::runtime {
namespace {

TEST(BatchingTest, PackingKeepsArrivalOrderAndTheBudget) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("uniform:min=1,max=900", 5, 1000));
  ASSERT_OK_AND_ASSIGN(auto ref, ParseLengthSource("uniform:min=1,max=900", 5, 1000));
  BatchBuilder builder(std::move(s), {.tokens_per_batch = 1000, .bucketing = false});
  std::vector<int64_t> seen;
  for (int i = 0; i < 200; ++i) {
    Batch b = builder.Next(0.15);
    ASSERT_FALSE(b.lengths.empty());
    EXPECT_LE(b.tokens, 1000);
    EXPECT_DOUBLE_EQ(b.length_cv, LengthCv(b.lengths));
    seen.insert(seen.end(), b.lengths.begin(), b.lengths.end());
  }
  EXPECT_EQ(seen, Draw(*ref, static_cast<int>(seen.size())));
}

// With the budget as the maximum length (as both tools parse --lengths), a sequence
// longer than a batch is cut to one full batch.
TEST(BatchingTest, SequencesLongerThanTheBudgetAreCutToOneBatch) {
  for (bool bucketing : {false, true}) {
    ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("uniform:min=5000,max=9000", 1, 4096));
    BatchBuilder builder(std::move(s), {.tokens_per_batch = 4096, .bucketing = bucketing});
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(builder.Next(0.15).lengths, std::vector<int64_t>{4096}) << bucketing;
    }
  }
}

TEST(BatchingTest, BucketRatioMakesTheWorstCaseCvExactlyTheTarget) {
  for (double c : {0.05, 0.15, 0.3}) {
    const double r = BucketRatio(c);
    // Two points a and r a with weight 1 / (r + 1) on the top: the largest CV in [a, r a].
    const double w = 1 / (r + 1), mean = (1 - w) + w * r;
    const double var = (1 - w) * (1 - mean) * (1 - mean) + w * (r - mean) * (r - mean);
    EXPECT_NEAR(std::sqrt(var) / mean, c, 1e-12) << c;
  }
}

TEST(BatchingTest, BucketingKeepsEveryBatchUnderTheTargetCvAndWithinBudget) {
  for (double target : {0.05, 0.15}) {
    ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("lognormal:mean=2048,sigma=0.9", 11, 16384));
    BatchBuilder builder(std::move(s), {.tokens_per_batch = 16384, .bucketing = true});
    double plain_cv = 0;
    for (int i = 0; i < 400; ++i) {
      Batch b = builder.Next(target);
      EXPECT_LE(b.length_cv, target + 1e-12) << "batch " << i;
      EXPECT_LE(b.tokens, 16384);
      plain_cv += b.length_cv;
    }
    EXPECT_LE(builder.waiting_tokens(), 9 * 16384);  // the pool stays bounded
  }
}

TEST(BatchingTest, ANewTargetRebucketsWaitingSequences) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("lognormal:mean=1024,sigma=1.0", 2, 8192));
  BatchBuilder builder(std::move(s), {.tokens_per_batch = 8192, .bucketing = true});
  for (int i = 0; i < 20; ++i) builder.Next(0.3);
  for (int i = 0; i < 50; ++i) {
    Batch b = builder.Next(0.02);
    if (i >= 10) {  // batches cut under the old target drain first
      EXPECT_LE(b.length_cv, 0.02 + 1e-12) << i;
    }
  }
}

// SP pads a batch to a multiple of t; the step record's padding and the stack's geometry
// both come from SpPaddedTokens.
TEST(BatchingTest, MakeBatchAndSpPadding) {
  const Batch b = MakeBatch({3, 5, 9});
  EXPECT_EQ(b.tokens, 17);
  EXPECT_EQ(TokenCount(b.lengths), 17);
  EXPECT_DOUBLE_EQ(b.length_cv, LengthCv(b.lengths));
  EXPECT_EQ(MakeBatch({}).tokens, 0);
  EXPECT_EQ(SpPaddedTokens(17, 1), 17);
  EXPECT_EQ(SpPaddedTokens(17, 4), 20);
  EXPECT_EQ(SpPaddedTokens(16, 4), 16);
  EXPECT_EQ(SpPaddedTokens(1, 8), 8);
  for (int t : {1, 2, 3, 4, 8}) {
    EXPECT_EQ(MakeBatchGeometry(b.lengths, Mode::kSequenceParallel, t, 0).padded_tokens,
              SpPaddedTokens(b.tokens, t))
        << t;
  }
}

}  // namespace
}  // namespace spgate::runtime
