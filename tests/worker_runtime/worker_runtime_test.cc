// Single-process tests of the worker runtime: length sources, packing and
// bucket_by_tokens, the memory arena and model, flag/shape validation, the summary's
// aggregation rules, and the stack at tp = 1 (LocalCommunicator) against the double
// reference. Multi-rank behaviour is in worker_runtime_mpi_test.cc (under mpirun).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker_runtime/reference_model.h"
#include "tests/worker_runtime/test_util.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/lengths.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/memory_model.h"
#include "worker/runtime/model.h"
#include "worker/runtime/summary.h"
#include "worker/runtime/transformer_stack.h"
#include "worker/runtime/worker.h"

namespace spgate::runtime {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<int64_t> Draw(LengthSource& s, int n) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = s.Next();
  return v;
}

// ---------------------------------------------------------------- length sources

TEST(LengthSourceTest, SameSeedSameStreamAndDifferentSeedDifferentStream) {
  for (const char* spec : {"lognormal:mean=4096,sigma=0.8",
                           "bimodal:short=512,long=16384,p_long=0.2",
                           "uniform:min=128,max=8192"}) {
    ASSERT_OK_AND_ASSIGN(auto a, ParseLengthSource(spec, 7, 1 << 20));
    ASSERT_OK_AND_ASSIGN(auto b, ParseLengthSource(spec, 7, 1 << 20));
    ASSERT_OK_AND_ASSIGN(auto c, ParseLengthSource(spec, 8, 1 << 20));
    const auto va = Draw(*a, 200);
    EXPECT_EQ(va, Draw(*b, 200)) << spec;
    EXPECT_NE(va, Draw(*c, 200)) << spec;
  }
}

TEST(LengthSourceTest, DistributionsHaveTheirParameters) {
  ASSERT_OK_AND_ASSIGN(auto ln, ParseLengthSource("lognormal:mean=4096,sigma=0.5", 1, 1 << 24));
  double sum = 0;
  const auto v = Draw(*ln, 20000);
  for (int64_t x : v) sum += x;
  EXPECT_NEAR(sum / v.size(), 4096, 4096 * 0.03);  // the arithmetic mean is the parameter

  ASSERT_OK_AND_ASSIGN(auto bi, ParseLengthSource("bimodal:short=100,long=1000,p_long=0.25,jitter=0",
                                                  1, 1 << 24));
  int longs = 0;
  for (int64_t x : Draw(*bi, 8000)) {
    ASSERT_TRUE(x == 100 || x == 1000) << x;
    longs += x == 1000;
  }
  EXPECT_NEAR(longs / 8000.0, 0.25, 0.02);

  ASSERT_OK_AND_ASSIGN(auto un, ParseLengthSource("uniform:min=3,max=5", 1, 1 << 24));
  for (int64_t x : Draw(*un, 300)) EXPECT_TRUE(x >= 3 && x <= 5) << x;
}

TEST(LengthSourceTest, ClampsToTheMaximumLength) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("uniform:min=50,max=500", 3, 100));
  for (int64_t x : Draw(*s, 200)) EXPECT_LE(x, 100);
}

TEST(LengthSourceTest, DistributionsHaveNoCycle) {
  for (const char* spec : {"lognormal:mean=4096,sigma=0.8",
                           "bimodal:short=512,long=16384,p_long=0.2", "uniform:min=1,max=9"}) {
    ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource(spec, 1, 1 << 20));
    EXPECT_EQ(s->cycle_length(), 0) << spec;
  }
}

TEST(LengthSourceTest, FileIsReplayedInOrderAndCycled) {
  const std::string path = ::testing::TempDir() + "/lengths.txt";
  {
    std::ofstream f(path);
    f << "# a trace\n7\n\n300\n 12 \n";
  }
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("file:" + path, 99, 1000));
  EXPECT_EQ(Draw(*s, 7), (std::vector<int64_t>{7, 300, 12, 7, 300, 12, 7}));
  EXPECT_EQ(s->cycle_length(), 3);
  {
    std::ofstream f(path);
    f << "7\nseven\n";
  }
  EXPECT_THAT(ParseLengthSource("file:" + path, 1, 1000).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(ParseLengthSource("file:/nonexistent/x", 1, 1000).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--lengths")));
}

// shift: the first N lengths from one source, the rest from the other; bad specs named.
TEST(LengthSourceTest, ShiftSwitchesSourcesAfterN) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("shift:after=5|uniform:min=3,max=3|uniform:min=9,max=9",
                                                 1, 1000));
  EXPECT_EQ(Draw(*s, 8), (std::vector<int64_t>{3, 3, 3, 3, 3, 9, 9, 9}));
  EXPECT_EQ(s->cycle_length(), 0);
  EXPECT_EQ(s->Describe(), "shift:after=5|uniform:min=3,max=3|uniform:min=9,max=9");
  for (const char* bad : {"shift:after=5|uniform:min=3,max=3", "shift:after=-1|uniform:min=3,max=3|"
                          "uniform:min=9,max=9", "shift:5|uniform:min=3,max=3|uniform:min=9,max=9",
                          "shift:after=5|uniform:min=3,max=3|gamma:k=1",
                          "shift:after=5|shift:after=1|a|b|uniform:min=9,max=9"}) {
    EXPECT_THAT(ParseLengthSource(bad, 1, 1000).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")))
        << bad;
  }
}

TEST(LengthSourceTest, BadSpecsNameTheFlagAndTheProblem) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"gaussian:mean=3", "unknown distribution"},
      {"lognormal:mean=4096", "missing sigma"},
      {"lognormal:mean=4096,sigma=0.8,skew=1", "unknown parameter skew"},
      {"lognormal:mean=abc,sigma=1", "not NAME=NUMBER"},
      {"bimodal:short=512,long=100,p_long=0.2", "short <= long"},
      {"bimodal:short=512,long=1000,p_long=1.5", "p_long"},
      {"uniform:min=10,max=5", "min <= max"},
      {"4096", "KIND:PARAMS"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseLengthSource(c.spec, 1, 1 << 20).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("--lengths="), HasSubstr(c.message))))
        << c.spec;
  }
}

// ---------------------------------------------------------------- batching

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

// ---------------------------------------------------------------- validation

TEST(ValidationTest, ImpossibleShapesNameTheFlags) {
  ModelShape s{.layers = 2, .hidden = 96, .heads = 6, .ffn_hidden = 256};
  EXPECT_THAT(ValidateModelShape(s, 4), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 ::testing::AllOf(HasSubstr("--heads=6"),
                                                                  HasSubstr("--tp=4"))));
  EXPECT_OK(ValidateModelShape(s, 2));
  s.ffn_hidden = 250;
  EXPECT_THAT(ValidateModelShape(s, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--heads=6")));
  s.heads = 4;
  s.hidden = 64;
  EXPECT_THAT(ValidateModelShape(s, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--ffn_hidden=250")));
  s.hidden = 66;
  EXPECT_THAT(ValidateModelShape(s, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--hidden=66")));
  s = {.layers = 0};
  EXPECT_THAT(ValidateModelShape(s, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--layers=0")));
}

TEST(ValidationTest, WorkerOptionsNameTheFlags) {
  WorkerOptions o;
  o.tokens_per_batch = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tokens_per_batch")));
  o = WorkerOptions{};
  o.steps = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--steps")));
  o.duration = absl::Seconds(3);
  EXPECT_OK(ValidateWorkerOptions(o));
  o = WorkerOptions{};
  o.lengths = "lognormal:mean=0,sigma=1";
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")));
  o = WorkerOptions{};
  o.grad_accum_steps = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--grad_accum_steps")));
}

// ---------------------------------------------------------------- memory

TEST(MemoryArenaTest, RecordsLiveAndPeakBytesByCategoryAndReusesBlocks) {
  auto device = CreateCpuDevice();
  MemoryArena arena(device.get());
  {
    ASSERT_OK_AND_ASSIGN(Buffer p, arena.Allocate(100, MemoryCategory::kParameters));
    ASSERT_OK_AND_ASSIGN(Buffer a, arena.Allocate(50, MemoryCategory::kActivations));
    EXPECT_EQ(arena.live().total, 600u);  // bytes asked for, not the class slack
    {
      ASSERT_OK_AND_ASSIGN(Buffer w, arena.Allocate(25, MemoryCategory::kWorkspace));
      EXPECT_EQ(arena.peak_bytes(), 700u);
    }
    EXPECT_EQ(arena.live().total, 600u);
    EXPECT_EQ(arena.peak().by_category[static_cast<int>(MemoryCategory::kWorkspace)], 100u);
    arena.ResetPeak();
    EXPECT_EQ(arena.peak_bytes(), 600u);
    EXPECT_EQ(arena.cached_bytes(), 256u);  // 100 bytes come from the 256-byte class
    const uint64_t taken = arena.device_allocated_bytes();
    ASSERT_OK_AND_ASSIGN(Buffer again, arena.Allocate(25, MemoryCategory::kWorkspace));
    EXPECT_EQ(arena.cached_bytes(), 0u);  // the cached block came back
    EXPECT_EQ(arena.device_allocated_bytes(), taken);
    ASSERT_OK_AND_ASSIGN(Buffer none, arena.Allocate(0, MemoryCategory::kWorkspace));
    EXPECT_TRUE(none.empty());
  }
  EXPECT_EQ(arena.live().total, 0u);
  EXPECT_EQ(arena.cached_bytes(), 416u + 256 + 256);  // 400 bytes: the 416-byte class
  arena.TrimCache();  // the end of the step that released them
  for (uint64_t i = 0; i + 1 < ArenaOptions{}.trim_after_steps; ++i) arena.TrimCache();
  EXPECT_EQ(arena.cached_bytes(), 416u + 256 + 256);  // unused for trim_after_steps - 1 steps
  arena.TrimCache();  // unused for trim_after_steps steps: back to the device
  EXPECT_EQ(arena.cached_bytes(), 0u);
}

TEST(MemoryArenaTest, SizeClassesAreAtMostAnEighthLargerAndServeNearbySizes) {
  EXPECT_EQ(MemoryArena::SizeClass(1), 256u);
  EXPECT_EQ(MemoryArena::SizeClass(256), 256u);
  EXPECT_EQ(MemoryArena::SizeClass(257), 288u);
  EXPECT_EQ(MemoryArena::SizeClass(4096), 4096u);
  EXPECT_EQ(MemoryArena::SizeClass(4097), 4608u);
  for (size_t bytes = 1; bytes < (size_t{1} << 26); bytes = bytes * 3 / 2 + 7) {
    const size_t c = MemoryArena::SizeClass(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(static_cast<double>(c), std::max(256.0, 1.125 * static_cast<double>(bytes)));
    EXPECT_EQ(MemoryArena::SizeClass(c), c) << "a class is its own class";
  }
  // A batch a little shorter than the last one reuses its block: no device allocation.
  auto device = CreateCpuDevice();
  MemoryArena arena(device.get());
  { ASSERT_OK_AND_ASSIGN(Buffer x, arena.Allocate(1000 * 64, MemoryCategory::kActivations)); }
  arena.TrimCache();
  const uint64_t taken = arena.device_allocated_bytes();
  { ASSERT_OK_AND_ASSIGN(Buffer y, arena.Allocate(960 * 64, MemoryCategory::kActivations)); }
  EXPECT_EQ(arena.device_allocated_bytes(), taken);
  // The exact-size cache (the baseline) cannot: a new size is a new block.
  MemoryArena exact(device.get(), ArenaOptions::Exact());
  { ASSERT_OK_AND_ASSIGN(Buffer x, exact.Allocate(1000 * 64, MemoryCategory::kActivations)); }
  exact.TrimCache();
  const uint64_t exact_taken = exact.device_allocated_bytes();
  { ASSERT_OK_AND_ASSIGN(Buffer y, exact.Allocate(960 * 64, MemoryCategory::kActivations)); }
  EXPECT_EQ(exact.device_allocated_bytes(), exact_taken + 960 * 64 * sizeof(float));
}

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

// ---------------------------------------------------------------- stack at tp = 1

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

// ---------------------------------------------------------------- summary

StepRecord Rec(int64_t step, Mode mode, Reason reason, StepSource src, double t, int64_t tokens) {
  StepRecord r;
  r.step = step;
  r.mode = static_cast<uint8_t>(mode);
  r.reason = static_cast<uint8_t>(reason);
  r.source = static_cast<uint8_t>(src);
  r.step_time_s = t;
  r.tokens = tokens;
  r.peak_bytes = 1000;
  r.predicted_peak_bytes = 1040;
  r.rs_wait_s = t * 0.1;
  return r;
}

// The switch cost: per token, the first step after a switch against the mode's others.
TEST(SummaryTest, SwitchCostIsTheFirstStepAfterASwitchPerTokenOverTheRest) {
  constexpr Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
  const auto f = StepSource::kFlag;
  const auto r = Reason::kPinned;
  // One group of one rank: SP SP TP TP TP TP SP SP. Switches at steps 2 (to TP) and 6 (to
  // SP). Medians: the preempted TP step 5 (0.1 s/token) does not move the steady figure.
  std::vector<std::vector<StepRecord>> recs(1);
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 2.0, 200),
             Rec(2, kTp, r, f, 3.0, 100),  // 0.03 s/token after the switch
             Rec(3, kTp, r, f, 1.0, 100), Rec(4, kTp, r, f, 2.0, 200),  // 0.01 steady
             Rec(5, kTp, r, f, 10.0, 100),  // an outlier
             Rec(6, kSp, r, f, 1.5, 100),  // 0.015 after the switch
             Rec(7, kSp, r, f, 1.0, 100)};  // steady SP: 0.01 (step 0 has no previous step)
  recs[0][2].device_allocated_bytes = 4096;  // the switch step took new blocks
  recs[0][3].device_allocated_bytes = 1024;
  RunDescription run;
  run.tp = 1;
  const RunSummary s = Summarize(run, recs, {{}});
  EXPECT_DOUBLE_EQ(s.switch_cost_ratio.at("tp_only"), 3.0);
  EXPECT_DOUBLE_EQ(s.switch_cost_ratio.at("sp"), 1.5);
  EXPECT_EQ(s.switch_steps.at("tp_only"), 1);
  EXPECT_EQ(s.switch_steps.at("sp"), 1);
  EXPECT_DOUBLE_EQ(s.switch_device_alloc_bytes.at("tp_only"), 4096);
  EXPECT_DOUBLE_EQ(s.steady_device_alloc_bytes.at("tp_only"), 1024.0 / 3);
  EXPECT_DOUBLE_EQ(s.switch_device_alloc_bytes.at("sp"), 0);
  EXPECT_THAT(SummaryJson(s), HasSubstr("\"switch_cost_ratio\": {\"sp\": 1.5"));
  // A run that never switches has no switch figures.
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 1.0, 100)};
  EXPECT_TRUE(Summarize(run, recs, {{}}).switch_cost_ratio.empty());
  // A mode that only ever ran right after a switch has no steady steps to compare with:
  // its switches are counted, and it has no ratio (not 0, which would read as free).
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 1.0, 100),
             Rec(2, kTp, r, f, 3.0, 100), Rec(3, kSp, r, f, 1.5, 100),
             Rec(4, kTp, r, f, 3.0, 100), Rec(5, kSp, r, f, 1.0, 100)};
  const RunSummary alternating = Summarize(run, recs, {{}});
  EXPECT_EQ(alternating.switch_steps.at("tp_only"), 2);
  EXPECT_EQ(alternating.switch_steps.at("sp"), 2);
  EXPECT_EQ(alternating.switch_cost_ratio.count("tp_only"), 0u);
  EXPECT_DOUBLE_EQ(alternating.switch_cost_ratio.at("sp"), 1.25);  // median(1.5, 1.0) / 1.0
}

TEST(SummaryTest, AggregatesGroupsRanksAndModes) {
  constexpr Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
  // Two TP groups of two ranks, two steps.
  std::vector<std::vector<StepRecord>> recs(4);
  recs[0] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 100),
             Rec(1, kTp, Reason::kLengthCv, StepSource::kFallback, 2.0, 300)};
  recs[1] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.5, 100),   // slower
             Rec(1, kTp, Reason::kLengthCv, StepSource::kFallback, 2.0, 300)};
  recs[2] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50),
             Rec(1, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50)};
  recs[3] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50),
             Rec(1, kTp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50)};  // disagrees
  recs[1][0].peak_bytes = 5000;
  RunDescription run;
  run.tp = 2;
  const RunSummary s = Summarize(run, recs, {{.telemetry_sent = 10, .telemetry_acked = 7},
                                             {.telemetry_sent = 5, .telemetry_acked = 5}});
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.consistency_violations, 1);
  EXPECT_EQ(s.decisions.at("sp").at("gates_passed"), 3);
  EXPECT_EQ(s.decisions.at("tp_only").at("length_cv"), 1);
  EXPECT_EQ(s.local_decisions, 1);
  EXPECT_EQ(s.lost_telemetry, 3);
  // Group 0: 100 tokens in 1.5 s (slowest rank) SP, 300 in 2 s TP; group 1: 100 in 2 s SP.
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("sp"), 100 / 1.5 + 100 / 2.0);
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("tp_only"), 300 / 2.0);
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("all"), 400 / 3.5 + 100 / 2.0);
  EXPECT_DOUBLE_EQ(s.step_time_p95_s.at("sp"), 1.5);
  EXPECT_DOUBLE_EQ(s.step_time_p95_s.at("all"), 2.0);
  EXPECT_EQ(s.peak_memory_bytes.at("sp"), 5000u);
  EXPECT_EQ(s.peak_memory_bytes.at("tp_only"), 1000u);
  EXPECT_FALSE(s.verify_max_abs_diff.has_value());
  const std::string json = SummaryJson(s);
  for (const char* key : {"\"steps\"", "\"decisions\"", "\"local_decisions\"",
                          "\"consistency_violations\"", "\"lost_telemetry\"",
                          "\"effective_tokens_per_s\"", "\"step_time_p95_s\"",
                          "\"peak_memory_bytes\""}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
  EXPECT_THAT(json, HasSubstr("\"decisions\": {\"sp\": {\"gates_passed\": 3}, "
                              "\"tp_only\": {\"length_cv\": 1}}"));
}

}  // namespace
}  // namespace spgate::runtime
