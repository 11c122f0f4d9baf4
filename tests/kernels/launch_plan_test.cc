// Host-side launch plans of the CUDA kernels, checked here because they need
// no GPU: the row plan must cover every column of every supported hidden size
// exactly once within the register budget, and the reduction plans must match
// the workspace sizes the worker accounts for.
#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/internal/launch_plan.h"
#include "kernels/internal/row_plan.h"
#include "kernels/layernorm.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels::internal {
namespace {

TEST(RowPlanTest, CoversEverySupportedHiddenSize) {
  for (int max_threads : {kRowFwdMaxThreads, kRowMaxThreads}) {
    for (int vec : {1, 4, 8}) {
      for (int64_t hidden = vec; hidden <= kLayerNormMaxHiddenGpu; hidden += vec) {
        // Large sizes: sample, the small ones exhaustively.
        if (hidden > 4096 && hidden % 509 != 0 && hidden != kLayerNormMaxHiddenGpu) continue;
        absl::StatusOr<RowPlan> p = PlanRow(hidden, vec, max_threads);
        ASSERT_TRUE(p.ok()) << "hidden " << hidden << " vec " << vec << " max_threads "
                            << max_threads << ": " << p.status();
        EXPECT_EQ(p->threads % 32, 0);
        EXPECT_LE(p->threads, 1024);
        EXPECT_LE(p->items * vec, kRowMaxElementsPerThread);
        EXPECT_EQ(p->items & (p->items - 1), 0) << "items must be a power of two";
        // Every column is owned: the last pack index fits in items * threads.
        const int64_t packs = (hidden + vec - 1) / vec;
        EXPECT_GE(static_cast<int64_t>(p->items) * p->threads, packs) << "hidden " << hidden;
        // And the block is not grossly oversized (at most one idle warp per item).
        EXPECT_LT(static_cast<int64_t>(p->items) * (p->threads - 32), packs) << "hidden " << hidden;
        // A capped plan stays within the elements per thread that do not spill, or is
        // the uncapped plan.
        if (max_threads < kRowMaxThreads && p->items * vec > kRowCappedMaxElementsPerThread) {
          absl::StatusOr<RowPlan> u = PlanRow(hidden, vec);
          ASSERT_TRUE(u.ok());
          EXPECT_EQ(p->threads, u->threads) << "hidden " << hidden << " vec " << vec;
          EXPECT_EQ(p->items, u->items) << "hidden " << hidden << " vec " << vec;
        }
      }
    }
  }
}

TEST(RowPlanTest, ForwardCapTakesUpToSixteenElementsPerThread) {
  // bf16 (vec 8) rows of 8192: 1024 threads of 8 elements uncapped, 512 of 16 capped.
  ASSERT_OK_AND_ASSIGN(RowPlan wide, PlanRow(8192, 8));
  EXPECT_EQ(wide.threads, 1024);
  EXPECT_EQ(wide.items, 1);
  ASSERT_OK_AND_ASSIGN(RowPlan capped, PlanRow(8192, 8, kRowFwdMaxThreads));
  EXPECT_EQ(capped.threads, 512);
  EXPECT_EQ(capped.items, 2);
  // At 4096 the cap changes nothing.
  ASSERT_OK_AND_ASSIGN(RowPlan small, PlanRow(4096, 8, kRowFwdMaxThreads));
  EXPECT_EQ(small.threads, 512);
  EXPECT_EQ(small.items, 1);
  // Rows that would need more than 16 elements per thread at 512 threads keep the
  // uncapped plan: 1024 threads of 16 at 16384, of 32 at the widest.
  ASSERT_OK_AND_ASSIGN(RowPlan wider, PlanRow(16384, 8, kRowFwdMaxThreads));
  EXPECT_EQ(wider.threads, 1024);
  EXPECT_EQ(wider.items, 2);
  ASSERT_OK_AND_ASSIGN(RowPlan widest, PlanRow(kLayerNormMaxHiddenGpu, 8, kRowFwdMaxThreads));
  EXPECT_EQ(widest.threads, kRowMaxThreads);
  EXPECT_EQ(widest.items * 8, kRowMaxElementsPerThread);
  // The scalar path (unaligned rows): 8191 fits 512 threads of 16.
  ASSERT_OK_AND_ASSIGN(RowPlan scalar, PlanRow(8191, 1, kRowFwdMaxThreads));
  EXPECT_EQ(scalar.threads, 512);
  EXPECT_EQ(scalar.items, 16);
}

TEST(RowPlanTest, RefusesHiddenBeyondTheLimit) {
  EXPECT_THAT(PlanRow(kLayerNormMaxHiddenGpu + 1, 1).status().code(),
              absl::StatusCode::kUnimplemented);
  EXPECT_THAT(PlanRow(2 * kLayerNormMaxHiddenGpu, 4).status().code(),
              absl::StatusCode::kUnimplemented);
}

TEST(ReducePlanTest, ChunksAreBoundedAndCoverAllRows) {
  EXPECT_EQ(ColumnReduceChunks(0), 0);
  for (int64_t rows : {1, 31, 32, 33, 1000, 4096, 4097, 1 << 20}) {
    const int64_t chunks = ColumnReduceChunks(rows);
    EXPECT_GE(chunks, 1);
    EXPECT_LE(chunks, kColumnMaxChunks);
    const int64_t chunk_rows = ColumnChunkRows(rows);
    EXPECT_GE(chunk_rows, kColumnChunkMinRows);
    EXPECT_GE(chunk_rows * chunks, rows);
    EXPECT_LT(chunk_rows * (chunks - 1), rows) << "no empty trailing chunk for " << rows;
  }
  EXPECT_EQ(LayerNormBwdBlocks(3), 3);
  EXPECT_EQ(LayerNormBwdBlocks(100000), kLayerNormBwdMaxBlocks);
}

}  // namespace
}  // namespace spgate::kernels::internal
