// The memory model (worker/runtime/memory_model.h): SP keeps less than TP-only, its
// closed form, and the one-sided bound the measured peaks are held to; the stack's
// measured peaks against it are in transformer_stack_test.cc (exact, host),
// worker_runtime_mpi_test.cc and worker_runtime_gpu_test.cc (PredictionCovers).
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/memory_model.h"
#include "worker/runtime/model.h"

namespace spgate::runtime {
namespace {

TEST(MemoryModelTest, SpKeepsLessThanTpOnlyAtLongLengthsAndGatherCostsMore) {
  const ModelShape shape{.layers = 4, .hidden = 256, .heads = 8, .ffn_hidden = 1024};
  const std::vector<int64_t> long_batch = {8192, 8192};
  auto predict = [&](Mode m, NormBoundary b, int tp, const std::vector<int64_t>& l) {
    return PredictPeak({.shape = shape, .tp = tp, .mode = m, .norm_boundary = b}, l);
  };
  const auto sp = predict(Mode::kSequenceParallel, NormBoundary::kShard, 4, long_batch);
  const auto tp = predict(Mode::kTensorParallelOnly, NormBoundary::kShard, 4, long_batch);
  const auto gather = predict(Mode::kSequenceParallel, NormBoundary::kGather, 4, long_batch);
  EXPECT_LT(sp.peak_bytes, tp.peak_bytes);
  // Kept per token: TP-only 4H + (4H + 2F)/t + a, SP 4H/t + (4H + 2F)/t + a: 0.57x here.
  EXPECT_LT(static_cast<double>(sp.activation_bytes), 0.6 * tp.activation_bytes);
  EXPECT_GT(gather.peak_bytes, sp.peak_bytes);
  EXPECT_EQ(sp.resident_bytes, tp.resident_bytes);
  // The closed form of memory_model.h for the kept activations (floats, per layer).
  const double T = 16384, H = 256, F = 1024, t = 4, a = 2;
  const double per_layer_sp = 4 * (T / t) * H + 4 * (T / t) + T * (4 * H / t + 2 * F / t + a);
  const double per_layer_tp = 4 * T * H + 4 * T + T * (4 * H / t + 2 * F / t + a);
  EXPECT_DOUBLE_EQ(sp.activation_bytes, 4 * 4 * per_layer_sp);
  EXPECT_DOUBLE_EQ(tp.activation_bytes, 4 * 4 * per_layer_tp);
  // One rank: the modes are the same computation.
  EXPECT_EQ(predict(Mode::kSequenceParallel, NormBoundary::kShard, 1, long_batch).peak_bytes,
            predict(Mode::kTensorParallelOnly, NormBoundary::kShard, 1, long_batch).peak_bytes);
}

// Recompute keeps only the input rows between the forward and the backward (T/t·H floats
// under SP, T·H under TP-only), and its peak is the plain one plus those rows: the
// backward rebuilds the same activations after the saved copy is spent.
TEST(MemoryModelTest, RecomputeKeepsTheInputRowsOnly) {
  const ModelShape shape{.layers = 4, .hidden = 256, .heads = 8, .ffn_hidden = 1024};
  const std::vector<int64_t> batch = {8192, 8192};
  for (const Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const MemoryModelInput plain{.shape = shape, .tp = 4, .mode = mode};
    MemoryModelInput recompute = plain;
    recompute.recompute = true;
    const MemoryPrediction p = PredictPeak(plain, batch);
    const MemoryPrediction r = PredictPeak(recompute, batch);
    const double rows = mode == Mode::kSequenceParallel ? 16384.0 / 4 : 16384.0;
    EXPECT_DOUBLE_EQ(r.activation_bytes, 4 * rows * 256) << static_cast<int>(mode);
    EXPECT_LT(r.activation_bytes * 10, p.activation_bytes) << static_cast<int>(mode);
    EXPECT_EQ(r.resident_bytes, p.resident_bytes);
    EXPECT_GE(r.peak_bytes, p.peak_bytes);
    EXPECT_LE(r.peak_bytes, p.peak_bytes + r.activation_bytes);
  }
}

// The bound the measured-peak tests hold the model to (test_util.h) is one-sided: 1 %
// under at most (the gate has no margin but the headroom), 5 % over.
TEST(MemoryModelTest, PredictionCoversCapsUnderPredictionTighterThanOver) {
  EXPECT_TRUE(PredictionCovers(1000, 1000));
  EXPECT_TRUE(PredictionCovers(990, 1000));
  EXPECT_FALSE(PredictionCovers(989, 1000));
  EXPECT_TRUE(PredictionCovers(1050, 1000));
  EXPECT_FALSE(PredictionCovers(1051, 1000));
  EXPECT_FALSE(PredictionCovers(1, 0)) << "no measured peak covers nothing";
}

}  // namespace
}  // namespace spgate::runtime
