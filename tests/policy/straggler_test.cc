// ADAPTIVE's straggler steps (docs/design.md §11, "Straggler steps"): a step whose slowest
// rank lagged the median rank by more than adaptive_straggler_share of it, above what the
// cell's steps lag by as a rule, is not learned; a mode's own steady spread is; a job
// whose telemetry leaves one mode's collectives untimed learns every step.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_config.h"

namespace spgate {
namespace {

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;

GateConfig Config() {
  GateConfig c;
  c.policy = GatePolicyKind::kAdaptive;
  c.adaptive_min_samples = 4;
  c.adaptive_straggler_share = 0.1;
  return c;
}

GroupStepSample Step(int64_t step, double seconds, double straggler_s, Mode mode = kSp) {
  return {.band = 3, .mode = mode, .step = step, .tokens = 1000, .seconds = seconds,
          .straggler_s = straggler_s, .timed = true};
}

// A table whose job has timed both modes' collectives (as the simulator's from its start).
ThroughputTable Timed() {
  ThroughputTable t;
  t.MarkCollectivesTimed();
  return t;
}

// Clean steps of 1 s (2 % lag) with a straggler's step of 1.5 s (a rank half as fast
// again) among them: the straggler's step enters nothing but its lag, the rest are learned.
TEST(StragglerStepTest, AStragglersStepIsNotLearned) {
  const GateConfig c = Config();
  ThroughputTable t = Timed();
  for (int64_t k = 0; k < 6; ++k) {
    bool straggler = true;
    ObserveGroupStep(c, t, Step(k, 1.0, 0.02), true, &straggler);
    EXPECT_FALSE(straggler) << k;
  }
  const ThroughputCell before = t.cell(3, kSp);
  bool straggler = false;
  EXPECT_FALSE(ObserveGroupStep(c, t, Step(6, 1.5, 0.5), true, &straggler));
  EXPECT_TRUE(straggler);
  const ThroughputCell after = t.cell(3, kSp);
  EXPECT_EQ(after.weight, before.weight);
  EXPECT_EQ(after.seconds, before.seconds);
  EXPECT_EQ(after.last_step, before.last_step);
  EXPECT_DOUBLE_EQ(t.At(c, 3, kSp, 6).tokens_per_s, 1000.0) << "the clean steps' rate";
  // Its lag entered the cell's usual share, held to the bound: 0.02 + (0.12 - 0.02) / 8.
  EXPECT_NEAR(after.straggler_share, 0.0325, 1e-12);
  EXPECT_EQ(t.cell(3, kTp).weight, 0) << "the other mode's cell is untouched";

  // Learned again once the lag is gone; the same lag in a cell with a higher usual share
  // is no straggler.
  EXPECT_FALSE(ObserveGroupStep(c, t, Step(7, 1.0, 0.02), true, &straggler));
  EXPECT_FALSE(straggler);
  EXPECT_EQ(t.cell(3, kSp).last_step, 7);
}

// A mode whose ranks differ by design (SP with its own imbalance: 30 % of every step)
// spreads every step alike: its steps are learned after the first few set the usual share,
// and a straggler's on top of it is still caught.
TEST(StragglerStepTest, AModesOwnSpreadIsLearned) {
  const GateConfig c = Config();
  ThroughputTable t = Timed();
  int not_learned = 0;
  for (int64_t k = 0; k < 40; ++k) {
    bool straggler = false;
    ObserveGroupStep(c, t, Step(k, 1.0, 0.3), true, &straggler);
    not_learned += straggler ? 1 : 0;
  }
  // The first step's share counts at most the bound (a first step may be a straggler's);
  // the usual share then climbs by an eighth of the bound a step until 0.3 is within it.
  EXPECT_EQ(not_learned, 8);
  EXPECT_GT(t.cell(3, kSp).straggler_share, 0.29);
  EXPECT_EQ(t.cell(3, kSp).last_step, 39);
  bool straggler = false;
  ObserveGroupStep(c, t, Step(40, 1.5, 0.8), true, &straggler);
  EXPECT_TRUE(straggler) << "0.53 of the step, over 0.3 + 0.1";
}

// Table-driven: the bound, an unknown delay, and a share of 1 (every step learned).
TEST(StragglerStepTest, Bounds) {
  struct Case {
    double share;        // adaptive_straggler_share
    double straggler_s;  // of a 1.5 s step after clean 1 s steps lagging 0.02 s
    bool want;
  };
  for (const Case& k : std::vector<Case>{
           {0.1, 0.5, true},
           {0.1, 0.17, false},  // 0.113 of the step: within 0.02 + 0.1
           {0.1, 0.19, true},   // 0.127
           {0.1, -1, false},    // not known
           {0.2, 0.5, true},    // 0.33 > 0.22
           {0.4, 0.5, false},
           {1.0, 1.5, false},   // no share exceeds 1 + the usual share
       }) {
    GateConfig c = Config();
    c.adaptive_straggler_share = k.share;
    ThroughputTable t = Timed();
    for (int64_t s = 0; s < 6; ++s) ObserveGroupStep(c, t, Step(s, 1.0, 0.02));
    bool straggler = !k.want;
    ObserveGroupStep(c, t, Step(6, 1.5, k.straggler_s), true, &straggler);
    EXPECT_EQ(straggler, k.want) << k.share << " " << k.straggler_s;
    EXPECT_EQ(t.cell(3, kSp).last_step, k.want ? 5 : 6);
  }
}

// The usual share travels with the table (it persists and is pushed; convert_test and
// learned_store_test check the wire) and survives the cell's first sample.
TEST(StragglerStepTest, UsualShareIsKeptByTheCellsFirstSample) {
  const GateConfig c = Config();
  ThroughputTable t = Timed();
  // A first step that is a straggler's counts at most the bound as the usual share, and
  // is then judged against it: not learned.
  bool straggler = false;
  ObserveGroupStep(c, t, Step(0, 1.5, 0.5), true, &straggler);
  EXPECT_TRUE(straggler);
  EXPECT_DOUBLE_EQ(t.cell(3, kSp).straggler_share, 0.1 + 0.1 / 8);
  EXPECT_EQ(t.cell(3, kSp).weight, 0);
  // The cell's first learned sample keeps it.
  ObserveGroupStep(c, t, Step(1, 1.0, 0.0), true, &straggler);
  EXPECT_FALSE(straggler);
  EXPECT_EQ(t.cell(3, kSp).weight, 1);
  EXPECT_DOUBLE_EQ(t.cell(3, kSp).straggler_share, 0.1125 * 7 / 8);
  EXPECT_EQ(t.cell(3, kTp).straggler_share, -1) << "no delay known yet";
}

// The rule counts delays once steps of both modes have come timed, and never again after
// a step of either came untimed (a worker that does not time TP-only's all-reduces: SP's
// stragglers alone would be left out, and SP would read fast). A new table learns every
// step until then; the state persists with the table (convert_test).
TEST(StragglersKnownTest, OnceBothModesAreTimedAndNoneUntimed) {
  const GateConfig c = Config();
  ThroughputTable t;
  EXPECT_FALSE(t.StragglersKnown());
  bool straggler = true;
  for (int64_t k = 0; k < 6; ++k) ObserveGroupStep(c, t, Step(k, 1.0, 0.02));
  ObserveGroupStep(c, t, Step(6, 1.5, 0.5), true, &straggler);
  EXPECT_FALSE(straggler) << "TP-only not yet seen timed: learned";
  EXPECT_EQ(t.cell(3, kSp).last_step, 6);
  ObserveGroupStep(c, t, Step(7, 1.0, 0.02, kTp));
  EXPECT_TRUE(t.StragglersKnown());
  ObserveGroupStep(c, t, Step(8, 1.0, 0.02));
  ObserveGroupStep(c, t, Step(9, 1.5, 0.5), true, &straggler);
  EXPECT_TRUE(straggler);
  GroupStepSample untimed = Step(10, 1.0, 0.0, kTp);
  untimed.timed = false;
  ObserveGroupStep(c, t, untimed);
  EXPECT_FALSE(t.StragglersKnown());
  ObserveGroupStep(c, t, Step(11, 1.5, 0.5), true, &straggler);
  EXPECT_FALSE(straggler) << "off for good";
  EXPECT_EQ(t.cell(3, kSp).last_step, 11);

  ThroughputTable sp_untimed;
  GroupStepSample first = Step(0, 1.0, 0.0);
  first.timed = false;
  ObserveGroupStep(c, sp_untimed, first);
  ObserveGroupStep(c, sp_untimed, Step(1, 1.0, 0.0, kTp));
  EXPECT_FALSE(sp_untimed.StragglersKnown());
}

}  // namespace
}  // namespace spgate
