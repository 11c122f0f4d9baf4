// The transformer stack (worker/runtime/transformer_stack.h) at tp = 1 on the
// LocalCommunicator against the double reference, and the batch geometry; multi-rank
// SP and TP-only are in worker_runtime_mpi_test.cc (under mpirun).
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/reference_model.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/device.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/memory_model.h"
#include "worker/runtime/transformer_stack.h"

namespace spgate::runtime {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TransformerStackTest, OneRankMatchesTheDoubleReferenceAndThePrediction) {
  const ModelShape shape{.layers = 2, .hidden = 32, .heads = 4, .ffn_hidden = 48};
  const std::vector<int64_t> lengths = {5, 1, 17, 9};
  auto device = CreateCpuDevice();
  auto comm = CreateLocalCommunicator(device.get());
  MemoryArena arena(device.get());
  ASSERT_OK_AND_ASSIGN(auto stack, TransformerStack::Create({.shape = shape, .param_seed = 3},
                                                            &arena, comm.get()));
  ASSERT_OK_AND_ASSIGN(auto ref, reference::RunReference(shape, 3, lengths, 11));
  for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    SCOPED_TRACE(ModeLabel(mode));
    ASSERT_OK(stack->ZeroGrads());
    arena.ResetPeak();
    StackCapture cap;
    ASSERT_OK(stack->ForwardBackward({.lengths = lengths, .data_seed = 11}, mode, &cap));
    ASSERT_OK(stack->FinishGradients(nullptr));
    EXPECT_EQ(cap.geometry.padding_tokens(), 0);
    EXPECT_ALL_CLOSE(cap.output, ref.output, "output");
    EXPECT_ALL_CLOSE(cap.input_grad, ref.input_grad, "input gradient");
    ASSERT_OK_AND_ASSIGN(auto grads, stack->DownloadGrads());
    EXPECT_ALL_CLOSE(grads, reference::ShardGrads(shape, 1, 0, ref.grads), "parameter gradients");
    EXPECT_EQ(arena.peak_bytes(), PredictPeak({.shape = shape, .mode = mode}, lengths).peak_bytes);
  }
}

TEST(TransformerStackTest, PreparedBatchDataGivesTheSameStepAsGeneratedData) {
  const ModelShape shape{.layers = 1, .hidden = 16, .heads = 2, .ffn_hidden = 32};
  const std::vector<int64_t> lengths = {4, 9};
  auto device = CreateCpuDevice();
  auto comm = CreateLocalCommunicator(device.get());
  MemoryArena arena(device.get());
  ASSERT_OK_AND_ASSIGN(auto stack, TransformerStack::Create({.shape = shape}, &arena, comm.get()));
  const BatchData data = MakeBatchData(lengths, 5, shape.hidden);
  StackCapture generated, prepared;
  ASSERT_OK(stack->ForwardBackward({.lengths = lengths, .data_seed = 5}, Mode::kSequenceParallel,
                                   &generated));
  ASSERT_OK(stack->ForwardBackward({.lengths = lengths, .data_seed = 5, .data = &data},
                                   Mode::kSequenceParallel, &prepared));
  EXPECT_EQ(prepared.output, generated.output);
  EXPECT_EQ(prepared.input_grad, generated.input_grad);
  const std::vector<int64_t> other = {4};
  const BatchData wrong = MakeBatchData(other, 5, shape.hidden);
  EXPECT_THAT(stack->ForwardBackward({.lengths = lengths, .data = &wrong}, Mode::kSequenceParallel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch data")));
}

TEST(TransformerStackTest, RefusesMismatchedCommunicatorsAndEmptyBatches) {
  auto device = CreateCpuDevice();
  auto comm = CreateLocalCommunicator(device.get());
  MemoryArena arena(device.get());
  StackOptions two;
  two.tp = 2;
  EXPECT_THAT(TransformerStack::Create(two, &arena, comm.get()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TP communicator")));
  ASSERT_OK_AND_ASSIGN(auto stack, TransformerStack::Create({}, &arena, comm.get()));
  EXPECT_THAT(stack->ForwardBackward({}, Mode::kSequenceParallel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty batch")));
}

TEST(BatchGeometryTest, SpPadsToAMultipleOfTWithOneExtraSegment) {
  const std::vector<int64_t> lengths = {3, 4};
  BatchGeometry sp = MakeBatchGeometry(lengths, Mode::kSequenceParallel, 4, 3);
  EXPECT_EQ(sp.padded_tokens, 8);
  EXPECT_EQ(sp.padding_tokens(), 1);
  EXPECT_EQ(sp.rows_local, 2);
  EXPECT_EQ(sp.row_offset, 6);
  EXPECT_EQ(sp.cu_seqlens, (std::vector<int64_t>{0, 3, 7, 8}));
  BatchGeometry tp = MakeBatchGeometry(lengths, Mode::kTensorParallelOnly, 4, 3);
  EXPECT_EQ(tp.padded_tokens, 7);
  EXPECT_EQ(tp.rows_local, 7);
  EXPECT_EQ(tp.row_offset, 0);
  EXPECT_EQ(tp.cu_seqlens, (std::vector<int64_t>{0, 3, 7}));
}

}  // namespace
}  // namespace spgate::runtime
