// The pipeline schedules a stage runs and the schedule-aware memory gate: what is in
// flight where (1F1B: p − s on stage s; interleaved: more), and a budget that fits TP-only
// on the last stage but not on the first.
#include "policy/pipeline_memory.h"

#include <algorithm>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<PipelineOp> Ops(const PipelineLayout& l, int stage) {
  auto ops = StageSchedule(l, stage);
  EXPECT_THAT(ops.status(), IsOk());
  return ops.ok() ? *ops : std::vector<PipelineOp>{};
}

// Every (micro-batch, chunk) runs forward once and backward once, backward after forward.
void ExpectWellFormed(const PipelineLayout& l, const std::vector<PipelineOp>& ops) {
  ASSERT_EQ(ops.size(), 2u * l.microbatches * l.vp);
  std::map<std::pair<int, int>, int> state;  // 0 none, 1 forward seen, 2 backward seen
  for (const PipelineOp& op : ops) {
    ASSERT_GE(op.microbatch, 0);
    ASSERT_LT(op.microbatch, l.microbatches);
    ASSERT_GE(op.chunk, 0);
    ASSERT_LT(op.chunk, l.vp);
    int& s = state[{op.microbatch, op.chunk}];
    ASSERT_EQ(s, op.forward ? 0 : 1) << "mb " << op.microbatch << " chunk " << op.chunk;
    s = op.forward ? 1 : 2;
  }
  EXPECT_EQ(state.size(), static_cast<size_t>(l.microbatches * l.vp));
}

struct InFlightCase {
  PipelineLayout layout;
  int stage;
  int in_flight;
};

TEST(StageScheduleTest, InFlightIsWhatTheScheduleHolds) {
  const PipelineSchedule kI = PipelineSchedule::kInterleaved1F1B;
  const InFlightCase cases[] = {
      // 1F1B: stage s of p holds p - s micro-batches (at most the step's).
      {{.pp = 4, .microbatches = 8}, 0, 4},
      {{.pp = 4, .microbatches = 8}, 1, 3},
      {{.pp = 4, .microbatches = 8}, 3, 1},
      {{.pp = 4, .microbatches = 2}, 0, 2},
      {{.pp = 1, .microbatches = 8}, 0, 1},
      // Interleaved, vp = 2: warm-up (p - s - 1) * 2 + (vp - 1) * p chunks, plus one.
      {{.pp = 4, .vp = 2, .microbatches = 8, .schedule = kI}, 0, 11},
      {{.pp = 4, .vp = 2, .microbatches = 8, .schedule = kI}, 3, 5},
      // One group of micro-batches: every forward before the first backward.
      {{.pp = 4, .vp = 2, .microbatches = 4, .schedule = kI}, 3, 8},
  };
  for (const InFlightCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "pp " << c.layout.pp << " vp " << c.layout.vp << " m "
                                      << c.layout.microbatches << " stage " << c.stage);
    const std::vector<PipelineOp> ops = Ops(c.layout, c.stage);
    ExpectWellFormed(c.layout, ops);
    EXPECT_EQ(MaxInFlight(ops), c.in_flight);
  }
}

TEST(StageScheduleTest, OneF1BOrderAndInterleavedChunks) {
  // Stage 2 of 4, 5 micro-batches: one warm-up forward, then F/B in turn, then backwards.
  const std::vector<PipelineOp> ops = Ops({.pp = 4, .microbatches = 5}, 2);
  const std::vector<PipelineOp> want = {
      {true, 0, 0},  {true, 1, 0},  {false, 0, 0}, {true, 2, 0},  {false, 1, 0},
      {true, 3, 0},  {false, 2, 0}, {true, 4, 0},  {false, 3, 0}, {false, 4, 0}};
  EXPECT_EQ(ops, want);
  // Interleaved, pp 2, vp 2, 4 micro-batches, last stage: micro-batches 0, 1 through chunk
  // 0, then through chunk 1, ...; the first backward is micro-batch 0's chunk 1.
  const std::vector<PipelineOp> il =
      Ops({.pp = 2, .vp = 2, .microbatches = 4, .schedule = PipelineSchedule::kInterleaved1F1B},
          1);
  ASSERT_GE(il.size(), 4u);
  EXPECT_EQ(il[0], (PipelineOp{true, 0, 0}));
  EXPECT_EQ(il[1], (PipelineOp{true, 1, 0}));
  EXPECT_EQ(il[2], (PipelineOp{true, 0, 1}));
  const auto first_backward =
      std::find_if(il.begin(), il.end(), [](const PipelineOp& op) { return !op.forward; });
  ASSERT_NE(first_backward, il.end());
  EXPECT_EQ(*first_backward, (PipelineOp{false, 0, 1}));
}

TEST(StageScheduleTest, BadLayoutsNameTheField) {
  EXPECT_THAT(StageSchedule({.pp = 0}, 0), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("pp: must be in")));
  EXPECT_THAT(StageSchedule({.pp = 2, .microbatches = 0}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("microbatches")));
  EXPECT_THAT(StageSchedule({.pp = 2, .vp = 2}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one model chunk")));
  EXPECT_THAT(StageSchedule({.pp = 2, .vp = 1, .schedule = PipelineSchedule::kInterleaved1F1B}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 2")));
  EXPECT_THAT(StageSchedule({.pp = 4, .vp = 2, .microbatches = 6,
                             .schedule = PipelineSchedule::kInterleaved1F1B},
                            0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a multiple")));
  EXPECT_THAT(StageSchedule({.pp = 4, .microbatches = 4}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage: must be in")));
}

// 8 micro-batches, each 10 GB of activations under TP-only and 2.5 GB under SP (t = 4),
// 1 GB of workspace either way, 20 GB resident, a 60 GB limit. The first stage of 4 holds
// 4 in flight: all TP-only would be 20 + 40 + 1 = 61 GB, so the gate lets the first
// micro-batches run TP-only only while the step's peak stays under 60. The last stage holds
// one at a time: 20 + 10 + 1 = 31 GB, every micro-batch TP-only.
TEST(PipelineMemoryGateTest, TheFirstStageKeepsSpWhereTheLastRunsTpOnly) {
  constexpr uint64_t kGB = 1000ull * 1000 * 1000;
  const PipelineLayout layout{.pp = 4, .microbatches = 8};
  const std::vector<MicrobatchMemory> mem(8, {.activation_sp = 2500 * 1000 * 1000ull,
                                              .activation_tp = 10 * kGB,
                                              .workspace_sp = kGB,
                                              .workspace_tp = kGB});
  const std::vector<Mode> wanted(8, Mode::kTensorParallelOnly);
  const uint64_t limit = 60 * kGB;

  const std::vector<PipelineOp> last = Ops(layout, 3);
  const PipelineMemoryVerdict v3 = ApplyPipelineMemoryGate(last, 20 * kGB, mem, wanted, limit);
  EXPECT_EQ(v3.modes, wanted);
  EXPECT_EQ(v3.peak_bytes, 31 * kGB);
  EXPECT_FALSE(v3.over_budget);

  const std::vector<PipelineOp> first = Ops(layout, 0);
  EXPECT_EQ(StagePeakBytes(first, 20 * kGB, mem, wanted), 61 * kGB) << "all TP-only: 4 in flight";
  const PipelineMemoryVerdict v0 = ApplyPipelineMemoryGate(first, 20 * kGB, mem, wanted, limit);
  EXPECT_LE(v0.peak_bytes, limit);
  EXPECT_EQ(v0.peak_bytes, StagePeakBytes(first, 20 * kGB, mem, v0.modes))
      << "the incremental peak is the replayed one";
  int tp = 0;
  for (size_t i = 0; i < v0.modes.size(); ++i) {
    if (v0.modes[i] == Mode::kTensorParallelOnly) {
      ++tp;
      EXPECT_EQ(v0.reasons[i], Reason::kGatesPassed);
    } else {
      EXPECT_EQ(v0.reasons[i], Reason::kMemoryRequiresSp) << "micro-batch " << i;
    }
  }
  EXPECT_GT(tp, 0);
  EXPECT_LT(tp, 8) << "a per-micro-batch gate (20 + 10 + 1 = 31 GB) would let all 8 through";
  // Greedy in micro-batch order: the ones let through come first.
  EXPECT_EQ(v0.modes[0], Mode::kTensorParallelOnly);
  EXPECT_EQ(v0.modes[7], Mode::kSequenceParallel);

  // Wanted SP stays SP; no limit keeps the wanted modes; an all-SP step over the limit is
  // over budget, all SP.
  std::vector<Mode> mixed = wanted;
  mixed[0] = Mode::kSequenceParallel;
  const PipelineMemoryVerdict vm = ApplyPipelineMemoryGate(first, 20 * kGB, mem, mixed, limit);
  EXPECT_EQ(vm.modes[0], Mode::kSequenceParallel);
  EXPECT_EQ(vm.reasons[0], Reason::kGatesPassed);
  EXPECT_EQ(ApplyPipelineMemoryGate(first, 20 * kGB, mem, wanted, 0).modes, wanted);
  const PipelineMemoryVerdict over = ApplyPipelineMemoryGate(first, 20 * kGB, mem, wanted, 25 * kGB);
  EXPECT_TRUE(over.over_budget);
  EXPECT_EQ(over.modes, std::vector<Mode>(8, Mode::kSequenceParallel));
  EXPECT_EQ(over.reasons[3], Reason::kMemoryOverBudget);
}

// Interleaved: the incremental gate agrees with a full replay for every prefix of choices,
// over chunks that overlap in time.
TEST(PipelineMemoryGateTest, InterleavedPeaksMatchTheReplay) {
  const PipelineLayout layout{.pp = 2, .vp = 3, .microbatches = 6,
                              .schedule = PipelineSchedule::kInterleaved1F1B};
  std::vector<MicrobatchMemory> mem;
  for (int i = 0; i < 6; ++i) {
    mem.push_back({.activation_sp = 100u + 10u * i, .activation_tp = 400u + 7u * i,
                   .workspace_sp = 50, .workspace_tp = 90});
  }
  const std::vector<Mode> wanted(6, Mode::kTensorParallelOnly);
  for (int stage = 0; stage < 2; ++stage) {
    const std::vector<PipelineOp> ops = Ops(layout, stage);
    ExpectWellFormed(layout, ops);
    const uint64_t sp_peak =
        StagePeakBytes(ops, 1000, mem, std::vector<Mode>(6, Mode::kSequenceParallel));
    const uint64_t tp_peak = StagePeakBytes(ops, 1000, mem, wanted);
    for (uint64_t limit = sp_peak; limit <= tp_peak; limit += 97) {
      const PipelineMemoryVerdict v = ApplyPipelineMemoryGate(ops, 1000, mem, wanted, limit);
      EXPECT_LE(v.peak_bytes, limit);
      EXPECT_EQ(v.peak_bytes, StagePeakBytes(ops, 1000, mem, v.modes)) << "limit " << limit;
    }
  }
}

}  // namespace
}  // namespace spgate
