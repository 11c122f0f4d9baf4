// The simulator's own stage-peak count (tools/sim/peak_replay.h) against the gate's
// (StagePeakBytes, policy/pipeline_memory.h): equal on every stage of a table of layouts,
// modes and per-micro-batch memories, equal to hand-computed peaks, and an error naming the
// op for ops that are not a step. If either count drifts (a backward that forgets its
// workspace, an activation freed early) the table disagrees.
#include "tools/sim/peak_replay.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/pipeline_memory.h"
#include "tests/testing/status_matchers.h"

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

constexpr PipelineSchedule kInterleaved = PipelineSchedule::kInterleaved1F1B;

enum class Pattern { kAllSp, kAllTp, kAlternating, kFirstTp, kRandom };

std::vector<Mode> ModesFor(Pattern p, int m, std::mt19937_64& rng) {
  std::vector<Mode> modes(static_cast<size_t>(m), Mode::kSequenceParallel);
  for (int i = 0; i < m; ++i) {
    const bool tp = p == Pattern::kAllTp || (p == Pattern::kAlternating && i % 2 == 0) ||
                    (p == Pattern::kFirstTp && i == 0) || (p == Pattern::kRandom && rng() % 2);
    if (tp) modes[i] = Mode::kTensorParallelOnly;
  }
  return modes;
}

// Per micro-batch bytes that differ by micro-batch and mode, with SP's workspace sometimes
// the larger (a gathered buffer), so that a count using the wrong micro-batch's or mode's
// bytes, or leaving one term out, gives a different peak.
std::vector<MicrobatchMemory> MemoryFor(int m, std::mt19937_64& rng) {
  std::vector<MicrobatchMemory> mem;
  for (int i = 0; i < m; ++i) {
    mem.push_back({.activation_sp = 100 + rng() % 400, .activation_tp = 400 + rng() % 1600,
                   .workspace_sp = 10 + rng() % 500, .workspace_tp = 10 + rng() % 500});
  }
  return mem;
}

TEST(ReplayStagePeakTest, AgreesWithTheGatesCountOnEveryStage) {
  const PipelineLayout layouts[] = {
      {.pp = 1, .microbatches = 1},
      {.pp = 1, .microbatches = 5},
      {.pp = 2, .microbatches = 1},
      {.pp = 4, .microbatches = 2},
      {.pp = 4, .microbatches = 8},
      {.pp = 8, .microbatches = 13},
      {.pp = 2, .vp = 2, .microbatches = 2, .schedule = kInterleaved},
      {.pp = 2, .vp = 2, .microbatches = 4, .schedule = kInterleaved},
      {.pp = 4, .vp = 2, .microbatches = 8, .schedule = kInterleaved},
      {.pp = 4, .vp = 3, .microbatches = 12, .schedule = kInterleaved},
  };
  std::mt19937_64 rng(33);
  int compared = 0;
  for (const PipelineLayout& l : layouts) {
    for (int stage = 0; stage < l.pp; ++stage) {
      absl::StatusOr<std::vector<PipelineOp>> ops = StageSchedule(l, stage);
      ASSERT_TRUE(ops.ok()) << ops.status();
      for (Pattern p : {Pattern::kAllSp, Pattern::kAllTp, Pattern::kAlternating,
                        Pattern::kFirstTp, Pattern::kRandom}) {
        SCOPED_TRACE(::testing::Message() << "pp " << l.pp << " vp " << l.vp << " m "
                                          << l.microbatches << " stage " << stage << " pattern "
                                          << static_cast<int>(p));
        const std::vector<MicrobatchMemory> mem = MemoryFor(l.microbatches, rng);
        const std::vector<Mode> modes = ModesFor(p, l.microbatches, rng);
        const uint64_t resident = 1000 + rng() % 1000;
        EXPECT_THAT(ReplayStagePeak(*ops, resident, mem, modes),
                    IsOkAndHolds(StagePeakBytes(*ops, resident, mem, modes)));
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 5 * (1 + 1 + 2 + 4 + 4 + 8 + 2 + 2 + 4 + 4));
}

// Two of tests/policy/pipeline_memory_test.cc's hand-computed peaks (worked out there op
// by op; SP 100 + 30, TP-only 400 + 250 bytes per chunk, resident 1000): 1F1B stage 0 of
// 4 with micro-batch 0 of 6 TP-only peaks at its backward, 1000 + 700 + 250 = 1950;
// interleaved pp 2 vp 2 with micro-batch 0 of 4 TP-only at its chunk 1's backward,
// 1000 + 1100 + 250 = 2350.
TEST(ReplayStagePeakTest, HandComputedPeaks) {
  const MicrobatchMemory mem{
      .activation_sp = 100, .activation_tp = 400, .workspace_sp = 30, .workspace_tp = 250};
  struct Case {
    PipelineLayout layout;
    uint64_t peak;
  };
  for (const Case& c : {Case{{.pp = 4, .microbatches = 6}, 1950},
                        Case{{.pp = 2, .vp = 2, .microbatches = 4, .schedule = kInterleaved},
                             2350}}) {
    absl::StatusOr<std::vector<PipelineOp>> ops = StageSchedule(c.layout, 0);
    ASSERT_TRUE(ops.ok()) << ops.status();
    std::vector<Mode> modes(c.layout.microbatches, Mode::kSequenceParallel);
    modes[0] = Mode::kTensorParallelOnly;
    const std::vector<MicrobatchMemory> mems(modes.size(), mem);
    EXPECT_THAT(ReplayStagePeak(*ops, 1000, mems, modes), IsOkAndHolds(c.peak));
  }
  EXPECT_THAT(ReplayStagePeak({}, 1000, {}, {}), IsOkAndHolds(1000u)) << "no ops: resident";
}

TEST(ReplayStagePeakTest, OpsThatAreNotAStepNameTheOp) {
  const std::vector<MicrobatchMemory> mem(2, MicrobatchMemory{.activation_sp = 1});
  const std::vector<Mode> modes(2, Mode::kSequenceParallel);
  struct Case {
    std::vector<PipelineOp> ops;
    const char* error;
  };
  const Case cases[] = {
      {{{false, 0, 0}}, "ops[0]: micro-batch 0 chunk 0 runs backward without its forward"},
      {{{true, 1, 0}, {true, 1, 0}}, "ops[1]: micro-batch 1 chunk 0 runs forward twice"},
      {{{true, 0, 0}, {true, 2, 0}}, "ops[1]: micro-batch 2 outside [0, 2)"},
      {{{true, 0, 0}, {true, 0, 1}, {false, 0, 0}},
       "micro-batch 0 chunk 1 runs forward without its backward"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ReplayStagePeak(c.ops, 0, mem, modes),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
  EXPECT_THAT(ReplayStagePeak({}, 0, mem, std::vector<Mode>(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory: 2 micro-batches")));
}

}  // namespace
}  // namespace spgate::sim
