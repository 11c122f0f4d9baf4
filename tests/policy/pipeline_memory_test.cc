// The pipeline schedules a stage runs and the schedule-aware memory gate: what is in
// flight where (1F1B: p − s on stage s; interleaved: more), and a budget that fits TP-only
// on the last stage but not on the first.
#include "policy/pipeline_memory.h"

#include <algorithm>
#include <map>
#include <span>
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

// The stage gate over a step's wanted modes (no pins), as the worker's commit and the
// simulator's fixed choices run it (ApplyStageMemoryGate): the modes and reasons it lets
// run (kGatesPassed where it kept the wanted mode), the stage's peak with them, and whether
// even the all-SP step is over the limit.
struct Verdict {
  std::vector<Mode> modes;
  std::vector<Reason> reasons;
  uint64_t peak_bytes = 0;
  bool over_budget = false;
};
Verdict Gate(std::span<const PipelineOp> ops, uint64_t resident,
             std::span<const MicrobatchMemory> memory, std::span<const Mode> wanted,
             uint64_t limit) {
  StageMemoryGate gate(ops, resident, memory, limit);
  std::vector<Decision> d;
  for (Mode m : wanted) d.push_back({m, Reason::kGatesPassed});
  ApplyStageMemoryGate(gate, d);
  Verdict v{.modes = gate.modes(), .peak_bytes = gate.peak_bytes(),
            .over_budget = !gate.all_sp_fits()};
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].mode, v.modes[i]) << "the decisions run the gate's modes";
    v.reasons.push_back(d[i].reason);
  }
  return v;
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
  const Verdict v3 = Gate(last, 20 * kGB, mem, wanted, limit);
  EXPECT_EQ(v3.modes, wanted);
  EXPECT_EQ(v3.peak_bytes, 31 * kGB);
  EXPECT_FALSE(v3.over_budget);

  const std::vector<PipelineOp> first = Ops(layout, 0);
  EXPECT_EQ(StagePeakBytes(first, 20 * kGB, mem, wanted), 61 * kGB) << "all TP-only: 4 in flight";
  const Verdict v0 = Gate(first, 20 * kGB, mem, wanted, limit);
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
  const Verdict vm = Gate(first, 20 * kGB, mem, mixed, limit);
  EXPECT_EQ(vm.modes[0], Mode::kSequenceParallel);
  EXPECT_EQ(vm.reasons[0], Reason::kGatesPassed);
  EXPECT_EQ(Gate(first, 20 * kGB, mem, wanted, 0).modes, wanted);
  const Verdict over = Gate(first, 20 * kGB, mem, wanted, 25 * kGB);
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
      const Verdict v = Gate(ops, 1000, mem, wanted, limit);
      EXPECT_LE(v.peak_bytes, limit);
      EXPECT_EQ(v.peak_bytes, StagePeakBytes(ops, 1000, mem, v.modes)) << "limit " << limit;
    }
  }
}

// Hand-computed stage peaks (the numbers below are worked out by hand from the schedule's
// op order, not by calling the code). Every micro-batch costs, per model chunk, SP: 100
// activation bytes and 30 workspace bytes; TP-only: 400 and 250 (kMem), unless the case
// says otherwise; resident 1000. Modes are written one letter per micro-batch: S = SP,
// T = TP-only. At each op the stage holds resident + the activations in flight (a forward
// counts its own, a backward still holds its own) + the op's own workspace. Each case's
// peak falls on a backward op whose workspace is larger than that of every forward at the
// same height, over an in-flight set of mixed modes, so a backward that left out its own
// workspace (or a gate that did) would under-count it: `without_backward_workspace` is
// what such a mutation would report.
constexpr MicrobatchMemory kMem{
    .activation_sp = 100, .activation_tp = 400, .workspace_sp = 30, .workspace_tp = 250};
// SP's workspace larger than TP-only's (a gathered buffer): SP 100 + 400, TP-only 400 + 50.
constexpr MicrobatchMemory kSpWideMem{
    .activation_sp = 100, .activation_tp = 400, .workspace_sp = 400, .workspace_tp = 50};

struct HandPeakCase {
  const char* name;
  PipelineLayout layout;
  int stage;
  const char* modes;
  MicrobatchMemory memory;
  uint64_t peak;
  uint64_t without_backward_workspace;
};

std::vector<Mode> ModesOf(const char* letters) {
  std::vector<Mode> modes;
  for (const char* c = letters; *c != '\0'; ++c) {
    modes.push_back(*c == 'T' ? Mode::kTensorParallelOnly : Mode::kSequenceParallel);
  }
  return modes;
}

constexpr PipelineSchedule kInterleaved = PipelineSchedule::kInterleaved1F1B;

const HandPeakCase kHandPeakCases[] = {
    // 1F1B, stage 0 of 4, 6 micro-batches, warm-up 3: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5.
    //   F0 T 1000+400+250=1650  F1 S 1000+500+30=1530  F2 S 1630  F3 S 1730
    //   B0 T holds {0T,1S,2S,3S} = 700: 1000+700+250 = 1950  <- peak
    //   F4 S {1,2,3,4} all S = 400: 1430; B1..B5 at most 1430.
    //   Without B0's workspace: 1700, so the peak would read 1730 (F3).
    {"1f1b stage 0", {.pp = 4, .microbatches = 6}, 0, "TSSSSS", kMem, 1950, 1730},
    // 1F1B, stage 1 of 4, warm-up 2: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5.
    //   F0 S 1130  F1 T 1000+500+250=1750  F2 S 1000+600+30=1630  B0 S 1630 (then 500)
    //   F3 S {1T,2S,3S} 600: 1630
    //   B1 T {1T,2S,3S} 600: 1000+600+250 = 1850  <- peak (then 200)
    //   F4, B2, F5, B3: 300 held, 1330; B4 1230; B5 1130.
    //   Without B1's workspace: 1600, so the peak would read 1750 (F1).
    {"1f1b stage 1", {.pp = 4, .microbatches = 6}, 1, "STSSSS", kMem, 1850, 1750},
    // SP's workspace the larger one, 1F1B stage 0 of 4 (the same order as the first case).
    //   F0 S 1000+100+400=1500  F1 T 1000+500+50=1550  F2 T 1950  F3 T 2350
    //   B0 S {0S,1T,2T,3T} 1300: 1000+1300+400 = 2700  <- peak (then 1200)
    //   F4 T {1,2,3,4} 1600: 2650; B1 T 2650; F5 T 2650; B2 2650; B3 2250; B4 1850; B5 1450.
    //   Without B0's workspace: 2300, so the peak would read 2650 (F4).
    {"1f1b sp wider", {.pp = 4, .microbatches = 6}, 0, "STTTTT", kSpWideMem, 2700, 2650},
    // Interleaved, pp 2, vp 2, 4 micro-batches, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4.
    // Forward units (mb, chunk): 00 10 01 11 20 30 21 31; backward units: 01 11 00 10 21 31
    // 20 30. Ops: F00 F10 F01 F11 | F20 B01 | F30 B11 | F21 B00 | F31 B10 | B21 B31 B20 B30.
    //   F00 T 1650  F10 S 1530  F01 T 1000+900+250=2150  F11 S 2030  F20 S 1000+1100+30=2130
    //   B01 T holds {00T,10S,01T,11S,20S} 1100: 1000+1100+250 = 2350  <- peak (then 700)
    //   F30 S 800: 1830  B11 S 1830 (then 700)  F21 S 1830
    //   B00 T 800: 2050 (then 400)  F31 S 1530  B10 S 1530  B21 1430  B31 1330  B20 1230
    //   B30 1130. Without B01's and B00's workspaces: 2100 and 1800, so the peak would read
    //   2150 (F01).
    {"interleaved stage 0",
     {.pp = 2, .vp = 2, .microbatches = 4, .schedule = kInterleaved}, 0, "TSSS", kMem, 2350,
     2150},
    // Interleaved, pp 2, vp 2, 2 micro-batches (one group): every forward first.
    // Ops: F00 F10 F01 F11 B01 B11 B00 B10.
    //   F00 T 1650  F10 S 1530  F01 T 2150  F11 S 1000+1000+30 = 2030
    //   B01 T holds {00T,10S,01T,11S} 1000: 1000+1000+250 = 2250  <- peak (then 600)
    //   B11 S 1630  B00 T 1000+500+250 = 1750  B10 S 1130.
    //   Without the backward workspaces the peak would read 2150 (F01).
    {"interleaved one group",
     {.pp = 2, .vp = 2, .microbatches = 2, .schedule = kInterleaved}, 0, "TS", kMem, 2250, 2150},
};

TEST(StagePeakBytesTest, HandComputedPeaksOnABackwardOverMixedModes) {
  for (const HandPeakCase& c : kHandPeakCases) {
    SCOPED_TRACE(c.name);
    const std::vector<PipelineOp> ops = Ops(c.layout, c.stage);
    const std::vector<Mode> modes = ModesOf(c.modes);
    ASSERT_EQ(modes.size(), static_cast<size_t>(c.layout.microbatches));
    const std::vector<MicrobatchMemory> mem(modes.size(), c.memory);
    const uint64_t peak = StagePeakBytes(ops, 1000, mem, modes);
    EXPECT_EQ(peak, c.peak) << "without the backward's own workspace it would read "
                            << c.without_backward_workspace;
  }
}

// The op orders the hand-computed cases above were worked out from.
TEST(StagePeakBytesTest, HandCasesRunTheOrderWorkedOut) {
  const std::vector<PipelineOp> stage1 = Ops({.pp = 4, .microbatches = 6}, 1);
  const std::vector<PipelineOp> want1 = {
      {true, 0, 0},  {true, 1, 0},  {true, 2, 0},  {false, 0, 0}, {true, 3, 0},  {false, 1, 0},
      {true, 4, 0},  {false, 2, 0}, {true, 5, 0},  {false, 3, 0}, {false, 4, 0}, {false, 5, 0}};
  EXPECT_EQ(stage1, want1);
  const std::vector<PipelineOp> il =
      Ops({.pp = 2, .vp = 2, .microbatches = 4, .schedule = kInterleaved}, 0);
  const std::vector<PipelineOp> want_il = {
      {true, 0, 0},  {true, 1, 0},  {true, 0, 1},  {true, 1, 1},
      {true, 2, 0},  {false, 0, 1}, {true, 3, 0},  {false, 1, 1},
      {true, 2, 1},  {false, 0, 0}, {true, 3, 1},  {false, 1, 0},
      {false, 2, 1}, {false, 3, 1}, {false, 2, 0}, {false, 3, 0}};
  EXPECT_EQ(il, want_il);
}

// The gate on the hand-computed cases: micro-batch 0 wants TP-only, the rest SP. The
// all-SP step peaks at 1000 + 4 x 100 + 30 = 1430 (1F1B stage 0: four in flight) and
// 1000 + 5 x 100 + 30 = 1530 (interleaved stage 0: five chunks); with micro-batch 0
// TP-only at the hand-computed 1950 and 2350, on its backward. One byte under that
// refuses it; at it, it runs TP-only. A gate that left the backward's workspace out
// would let it through one byte under (its count: 1730 and 2150).
TEST(StageMemoryGateTest, HandComputedLimitOnTheBackward) {
  struct GateCase {
    const char* name;
    PipelineLayout layout;
    uint64_t all_sp_peak, tp_peak;
  };
  const GateCase cases[] = {
      {"1f1b stage 0", {.pp = 4, .microbatches = 6}, 1430, 1950},
      {"interleaved stage 0", {.pp = 2, .vp = 2, .microbatches = 4, .schedule = kInterleaved},
       1530, 2350},
  };
  for (const GateCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<PipelineOp> ops = Ops(c.layout, 0);
    const size_t m = static_cast<size_t>(c.layout.microbatches);
    const std::vector<MicrobatchMemory> mem(m, kMem);
    std::vector<Mode> wanted(m, Mode::kSequenceParallel);
    wanted[0] = Mode::kTensorParallelOnly;

    const Verdict under = Gate(ops, 1000, mem, wanted, c.tp_peak - 1);
    EXPECT_FALSE(under.over_budget);
    EXPECT_EQ(under.modes, std::vector<Mode>(m, Mode::kSequenceParallel));
    EXPECT_EQ(under.reasons[0], Reason::kMemoryRequiresSp);
    EXPECT_EQ(under.peak_bytes, c.all_sp_peak);

    const Verdict at = Gate(ops, 1000, mem, wanted, c.tp_peak);
    EXPECT_EQ(at.modes, wanted);
    EXPECT_EQ(at.reasons[0], Reason::kGatesPassed);
    EXPECT_EQ(at.peak_bytes, c.tp_peak);

    StageMemoryGate gate(ops, 1000, mem, c.all_sp_peak - 1);
    EXPECT_FALSE(gate.all_sp_fits()) << "the all-SP peak is " << c.all_sp_peak;
    EXPECT_EQ(gate.all_sp_peak_bytes(), c.all_sp_peak);
  }
}

// Stage 0 of pp 2 with two micro-batches runs F0 F1 B0 B1. Micro-batch 1's TP-only
// workspace is below its SP one (10 against 40), so with both TP-only the peak is 150,
// under the limit of 160, while micro-batch 0 TP-only alone peaks at 170 (at F1, beside 1's
// SP workspace). Over the whole set the commit keeps both; the id-order gate would have
// refused 0. By hand: all SP 110 / 160 / 120 / 150; 0 TP-only 120 / 170 / 130 / 150; both
// 120 / 150 / 140 / 130.
TEST(StageMemoryGateTest, ASetThatFitsAsAWholeIsKeptWhereItsIdOrderPrefixDoesNot) {
  const std::vector<PipelineOp> ops = Ops({.pp = 2, .microbatches = 2}, 0);
  const std::vector<MicrobatchMemory> mem = {
      {.activation_sp = 10, .activation_tp = 20},
      {.activation_sp = 10, .activation_tp = 20, .workspace_sp = 40, .workspace_tp = 10}};
  const std::vector<Mode> both(2, Mode::kTensorParallelOnly);
  EXPECT_EQ(StagePeakBytes(ops, 100, mem, both), 150u);
  EXPECT_EQ(StagePeakBytes(ops, 100, mem, std::vector<Mode>{Mode::kTensorParallelOnly,
                                                            Mode::kSequenceParallel}),
            170u);
  const Verdict whole = Gate(ops, 100, mem, both, 160);
  EXPECT_EQ(whole.modes, both);
  EXPECT_EQ(whole.peak_bytes, 150u);
  EXPECT_THAT(whole.reasons, ::testing::Each(Reason::kGatesPassed));

  StageMemoryGate gate(ops, 100, mem, 160);
  EXPECT_FALSE(gate.TryTpOnly(0)) << "alone, in id order: 170";
  EXPECT_TRUE(gate.TryTpOnly(1));
  EXPECT_TRUE(gate.TryTpOnly(0)) << "beside 1's TP-only: 150";
  EXPECT_TRUE(gate.fits());
  gate.Reset();
  EXPECT_EQ(gate.modes(), std::vector<Mode>(2, Mode::kSequenceParallel));
  EXPECT_EQ(gate.peak_bytes(), 160u);
}

}  // namespace
}  // namespace spgate
