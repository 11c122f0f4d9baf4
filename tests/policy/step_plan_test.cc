// Job layouts and step plans: the layout's checks name their field, micro-batch ids are
// checked by id, and DecideStagePlan applies the schedule-aware memory gate over a stage's
// whole step (the first of four stages runs SP where the last runs TP-only; where it holds
// only some TP-only micro-batches, those expected to gain most), honours
// SP-required jobs and unknown lengths, and decides the CP ranks' groups alike from the
// plan alone.
#include "policy/step_plan.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

TEST(JobLayout, ValidationNamesTheField) {
  EXPECT_THAT(ValidateJobLayout({.tp = 8, .pp = 4, .cp = 2, .dp = 2, .microbatches = 8}), IsOk());
  EXPECT_THAT(ValidateJobLayout({.tp = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.tp")));
  EXPECT_THAT(ValidateJobLayout({.cp = 2000}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.cp")));
  EXPECT_THAT(ValidateJobLayout({.pp = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.pp")));
  EXPECT_THAT(ValidateJobLayout({.pp = 2, .vp = 2, .microbatches = 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.vp")));
  EXPECT_THAT(ValidateJobLayout({.tp = 1024, .pp = 1024, .dp = 1024}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranks")));
  // A step's walk stays bounded: the daemon decides it under its lock.
  EXPECT_THAT(ValidateJobLayout({.pp = 4, .vp = 8, .microbatches = 4096,
                                 .schedule = PipelineSchedule::kInterleaved1F1B}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model-chunk passes")));
}

TEST(JobLayout, MismatchNamesTheFirstDifferentField) {
  const JobLayout job{.tp = 2, .pp = 4, .microbatches = 8};
  EXPECT_EQ(JobLayoutMismatch(job, job), "");
  JobLayout other = job;
  other.microbatches = 4;
  EXPECT_THAT(JobLayoutMismatch(job, other), HasSubstr("layout.microbatches"));
  other = job;
  other.schedule = PipelineSchedule::kInterleaved1F1B;
  EXPECT_THAT(JobLayoutMismatch(job, other), HasSubstr("layout.schedule"));
  EXPECT_EQ(FormatJobLayout(job), "tp=2 pp=4 vp=1 cp=1 dp=1 microbatches=8 schedule=1f1b");
}

TEST(JobLayout, GroupsAreNumberedWithCpInnermost) {
  const JobLayout l{.tp = 2, .pp = 3, .cp = 2, .dp = 2};
  int64_t expect = 0;
  for (int d = 0; d < l.dp; ++d) {
    for (int s = 0; s < l.pp; ++s) {
      for (int c = 0; c < l.cp; ++c) {
        const StageCoordinates at{.dp_index = d, .stage = s, .cp_rank = c};
        EXPECT_THAT(ValidateCoordinates(l, at), IsOk());
        EXPECT_EQ(GroupOf(l, at), expect);
        EXPECT_EQ(CoordinatesOf(l, expect), at);
        ++expect;
      }
    }
  }
  EXPECT_EQ(expect, l.groups());
  EXPECT_THAT(ValidateCoordinates(l, {.stage = 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("coordinates.stage")));
  EXPECT_THAT(ValidateCoordinates(l, {.cp_rank = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("coordinates.cp_rank")));
}

TEST(JobLayout, SpRequiredFeatureNames) {
  EXPECT_THAT(ValidateSpRequiredFeature("moe_expert_tp"), IsOk());
  EXPECT_THAT(ValidateSpRequiredFeature(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateSpRequiredFeature("CUDA graphs"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sp_required")));
  EXPECT_THAT(ValidateSpRequiredFeature(std::string(33, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StepPlan, MicrobatchIdsAreCheckedById) {
  EXPECT_THAT(CheckMicrobatchIds(std::vector<int>{2, 0, 1}, 3), IsOk());
  EXPECT_THAT(CheckMicrobatchIds(std::vector<int>{0, 1, 1}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 1 repeats")));
  EXPECT_THAT(CheckMicrobatchIds(std::vector<int>{0, 2}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 1 is missing")));
  EXPECT_THAT(CheckMicrobatchIds(std::vector<int>{0, 1, 3}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 3 is outside")));
  EXPECT_THAT(CheckMicrobatchIds(std::vector<int>{0, 1, 2, 3}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 sent")));
}

// Every micro-batch wants TP-only (its length CV is above the gate's threshold).
GateConfig Config() {
  GateConfig c;
  c.max_length_cv = 0.5;
  c.memory_headroom = 1.0;
  return c;
}

std::vector<MicrobatchFacts> Uniform(int m, double cv, MicrobatchMemory memory) {
  std::vector<MicrobatchFacts> f(m);
  for (int i = 0; i < m; ++i) {
    f[i] = {.id = i, .length_cv = cv, .tokens = 4096, .memory = memory};
  }
  return f;
}

std::vector<Mode> Modes(const StagePlanOutcome& out) {
  std::vector<Mode> m;
  for (const Decision& d : out.decisions) m.push_back(d.mode);
  return m;
}

// Resident 100, activations 10 per micro-batch under SP and 20 under TP-only. 1F1B with 4
// stages and 4 micro-batches: stage 0 holds 4 micro-batches at once, stage 3 one. A budget
// of 145 fits TP-only on the last stage (100 + 20) but on the first not even for one
// micro-batch (100 + 20 + 3 x 10 = 150; all SP is 140): the first stage runs SP, the last
// TP-only.
TEST(StepPlan, FirstStageRunsSpWhereTheLastRunsTpOnly) {
  const JobLayout l{.tp = 2, .pp = 4, .microbatches = 4};
  const auto mbs = Uniform(4, 1.0, {.activation_sp = 10, .activation_tp = 20});
  for (int stage : {0, 3}) {
    GroupPolicyState group;
    const StagePlanFacts plan{.step = 5, .stage = stage, .resident_bytes = 100,
                              .memory_budget_bytes = 145, .microbatches = mbs};
    const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
    ASSERT_EQ(out.decisions.size(), 4u);
    if (stage == 0) {
      EXPECT_THAT(out.decisions, Each(Decision{Mode::kSequenceParallel, Reason::kMemoryRequiresSp}));
      EXPECT_EQ(out.peak_bytes, 140u);
    } else {
      EXPECT_THAT(out.decisions, Each(Decision{Mode::kTensorParallelOnly, Reason::kLengthCv}));
      EXPECT_EQ(out.peak_bytes, 120u);
    }
    EXPECT_LE(out.peak_bytes, 145u);
    EXPECT_FALSE(out.over_budget);
    // The group's state advanced to the step, and counted its micro-batches' switches.
    EXPECT_EQ(group.gate().last_step, 5);
    EXPECT_EQ(group.gate().mode, out.decisions.back().mode);
  }
}

// Stage 1 of 4 holds 3 micro-batches: with a budget of 150 two of them may be TP-only
// (100 + 20 + 20 + 10 = 150); micro-batches alike, in micro-batch order.
TEST(StepPlan, MemoryGateBreaksTiesInMicrobatchOrder) {
  const JobLayout l{.pp = 4, .microbatches = 4};
  const auto mbs = Uniform(4, 1.0, {.activation_sp = 10, .activation_tp = 20});
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 0, .stage = 1, .resident_bytes = 100,
                            .memory_budget_bytes = 150, .microbatches = mbs};
  const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  EXPECT_EQ(Modes(out), (std::vector<Mode>{Mode::kTensorParallelOnly, Mode::kTensorParallelOnly,
                                           Mode::kSequenceParallel, Mode::kTensorParallelOnly}));
  EXPECT_EQ(out.decisions[2].reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(out.peak_bytes, 150u);
}

// The same stage, where micro-batches 2 and 3 are the longer-tailed (CV 2.0 against 1.0):
// STATIC has no throughput estimate, so the gate ranks by the length-CV gate's own measure
// (CV x tokens) and gives them TP-only first, then micro-batch 0 (never in flight with 3);
// id order would have run 0, 1 and 3 TP-only. The plan is decided twice, the group's state
// once: four decisions, and the switches of the modes it ran.
TEST(StepPlan, MemoryGateGivesTpOnlyToTheLongestTailedFirst) {
  const JobLayout l{.pp = 4, .microbatches = 4};
  auto mbs = Uniform(4, 1.0, {.activation_sp = 10, .activation_tp = 20});
  mbs[2].length_cv = mbs[3].length_cv = 2.0;
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 0, .stage = 1, .resident_bytes = 100,
                            .memory_budget_bytes = 150, .microbatches = mbs};
  const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  const Decision refused{Mode::kSequenceParallel, Reason::kMemoryRequiresSp};
  const Decision tp{Mode::kTensorParallelOnly, Reason::kLengthCv};
  EXPECT_EQ(out.decisions, (std::vector<Decision>{tp, refused, tp, tp}));
  EXPECT_EQ(out.peak_bytes, 150u);
  EXPECT_EQ(group.gate().decisions, 4);
  EXPECT_EQ(group.gate().mode_switches, 2);
  EXPECT_EQ(group.gate().mode, Mode::kTensorParallelOnly);

  // Larger micro-batches gain more at one CV: the 8,192-token ones go first, and fill
  // every point where three are held.
  auto sized = Uniform(4, 1.0, {.activation_sp = 10, .activation_tp = 20});
  sized[1].tokens = sized[2].tokens = 8192;
  GroupPolicyState g2;
  const StagePlanFacts plan2{.step = 0, .stage = 1, .resident_bytes = 100,
                             .memory_budget_bytes = 150, .microbatches = sized};
  EXPECT_EQ(Modes(DecideStagePlan(g2, Config(), l, plan2, {}, nullptr, false)),
            (std::vector<Mode>{Mode::kSequenceParallel, Mode::kTensorParallelOnly,
                               Mode::kTensorParallelOnly, Mode::kSequenceParallel}));
}

// ADAPTIVE ranks by its learned estimates, not by CV: in the band of micro-batches 1 and 2
// (CV 0.12) TP-only takes half of SP's time, in that of 0 and 3 (CV 0.32, the longer tail)
// 90 %. Both bands want TP-only; 1 and 2 gain most and fill the stage. With a measured
// switch cost, id order.
TEST(StepPlan, AdaptiveGivesTpOnlyWhereItsEstimatesGainMost) {
  const JobLayout l{.pp = 4, .microbatches = 4};
  GateConfig c = Config();
  c.policy = GatePolicyKind::kAdaptive;
  c.max_length_cv = 0.1;  // the gates' choice is TP-only in both bands
  c.adaptive_explore_share = 0;
  c.adaptive_explore_floor = 0;
  auto mbs = Uniform(4, 0.12, {.activation_sp = 10, .activation_tp = 20});
  mbs[0].length_cv = mbs[3].length_cv = 0.32;
  const int big = BandOf(c, 0.12, 4096), small = BandOf(c, 0.32, 4096);
  ASSERT_NE(big, small);
  ThroughputTable table;
  for (int64_t s = 100; s < 150; ++s) {
    table.Observe(c, big, Mode::kSequenceParallel, s, 1000, 2.0);
    table.Observe(c, big, Mode::kTensorParallelOnly, s, 1000, 1.0);
    table.Observe(c, small, Mode::kSequenceParallel, s, 1000, 1.0);
    table.Observe(c, small, Mode::kTensorParallelOnly, s, 1000, 0.9);
  }
  const StagePlanFacts plan{.step = 150, .stage = 1, .resident_bytes = 100,
                            .memory_budget_bytes = 150, .microbatches = mbs};
  GroupPolicyState group;
  const StagePlanOutcome out = DecideStagePlan(group, c, l, plan, {}, &table, false);
  EXPECT_EQ(Modes(out), (std::vector<Mode>{Mode::kSequenceParallel, Mode::kTensorParallelOnly,
                                           Mode::kTensorParallelOnly, Mode::kSequenceParallel}));
  EXPECT_EQ(out.decisions[0].reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(out.decisions[3].reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(out.peak_bytes, 150u);
  // Without the table ADAPTIVE ranks by CV x tokens, as STATIC: where 2 and 3 are the
  // longer-tailed, 2 and 3, then 0 (id order would give 0, 1 and 3).
  auto tailed = mbs;
  tailed[0].length_cv = 0.12;
  tailed[2].length_cv = tailed[3].length_cv = 0.32;
  const StagePlanFacts tailed_plan{.step = 150, .stage = 1, .resident_bytes = 100,
                                   .memory_budget_bytes = 150, .microbatches = tailed};
  GroupPolicyState cold;
  EXPECT_EQ(Modes(DecideStagePlan(cold, c, l, tailed_plan, {}, nullptr, false)),
            (std::vector<Mode>{Mode::kTensorParallelOnly, Mode::kSequenceParallel,
                               Mode::kTensorParallelOnly, Mode::kTensorParallelOnly}));
  // Where the table has measured a switch's cost (0.1 s, against steps of about 1 s), the
  // gate keeps id order: a ranking would interleave the modes, and its switches are not in
  // the gain.
  ASSERT_EQ(MeasuredSwitchCost(c, table, plan.step), 0);
  table.SetSwitchCost(SwitchCostCell{.seconds = 0.1 * 20, .weight = 20, .last_step = 149});
  ASSERT_GT(MeasuredSwitchCost(c, table, plan.step), 0);
  GroupPolicyState costly;
  const StagePlanOutcome in_order = DecideStagePlan(costly, c, l, plan, {}, &table, false);
  EXPECT_EQ(Modes(in_order), (std::vector<Mode>{Mode::kTensorParallelOnly,
                                                Mode::kTensorParallelOnly,
                                                Mode::kSequenceParallel,
                                                Mode::kTensorParallelOnly}));
}

// A plan decided by gain passes the client's commit as it is: stage 0 of pp 2 runs F0 F1
// B0 B1, and micro-batch 1's TP-only workspace is below its SP one, so both TP-only peak
// at 150 (limit 160) while 0 alone peaks at 170 (pipeline_memory_test.cc works them out).
// 1 is the longer-tailed, so it goes first, and then 0 fits beside it; the commit
// (ApplyStageMemoryGate) keeps both.
TEST(StepPlan, APlanDecidedByGainPassesTheClientsCommit) {
  const JobLayout l{.pp = 2, .microbatches = 2};
  std::vector<MicrobatchFacts> mbs = {
      {.id = 0, .length_cv = 1.0, .tokens = 4096,
       .memory = {.activation_sp = 10, .activation_tp = 20}},
      {.id = 1, .length_cv = 2.0, .tokens = 4096,
       .memory = {.activation_sp = 10, .activation_tp = 20, .workspace_sp = 40,
                  .workspace_tp = 10}}};
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 0, .stage = 0, .resident_bytes = 100,
                            .memory_budget_bytes = 160, .microbatches = mbs};
  StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  EXPECT_THAT(out.decisions, Each(Decision{Mode::kTensorParallelOnly, Reason::kLengthCv}));
  EXPECT_EQ(out.peak_bytes, 150u);
  const std::vector<PipelineOp> ops = StageSchedule(l.pipeline(), 0).value();
  const std::vector<MicrobatchMemory> memory = {mbs[0].memory, mbs[1].memory};
  StageMemoryGate commit(ops, 100, memory, 160);
  EXPECT_EQ(ApplyStageMemoryGate(commit, out.decisions), 0) << "no memory_override";
  EXPECT_EQ(commit.peak_bytes(), 150u);
}

// The second pass's answers can differ from the first's, and then the plan never goes
// over the limit. A STATIC group in the wait-share fallback with a probe due: stage 1 of 4
// holds 3 micro-batches, the budget of 140 one TP-only among any 3. First pass, in id
// order: 0 TP-only (CV 0.6 > 0.5), 1 the probe (SP), 2 and 3 TP-only (the fallback's
// RS_WAIT), 2 refused (0 and 2 together are 150). Ranked by CV x tokens, 2 and 3 (100,000
// tokens each) come before 0, so the set is {2}. Decided again: 0 runs SP for memory, so
// 1's probe is no longer due and 1 answers TP-only, an answer the first pass did not
// give: the gate admits it in id order, and with 2 that is 150 > 140. That pass is not
// returned; the first pass's decisions are, and the group's state advanced once by them.
TEST(StepPlan, ASecondPassThatWouldNotFitFallsBackToIdOrder) {
  const JobLayout l{.pp = 4, .microbatches = 4};
  auto mbs = Uniform(4, 0.1, {.activation_sp = 10, .activation_tp = 20});
  mbs[0].length_cv = 0.6;
  mbs[2].tokens = mbs[3].tokens = 100000;
  GroupPolicyState group;
  group.Adopt(0, {Mode::kTensorParallelOnly, Reason::kRsWait}, Config());
  ASSERT_TRUE(group.gate().rs_wait_fallback);
  const StagePlanFacts plan{.step = 1, .stage = 1, .resident_bytes = 100,
                            .memory_budget_bytes = 140, .microbatches = mbs};
  const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  EXPECT_EQ(out.decisions, (std::vector<Decision>{
                               {Mode::kTensorParallelOnly, Reason::kLengthCv},
                               {Mode::kSequenceParallel, Reason::kProbe},
                               {Mode::kSequenceParallel, Reason::kMemoryRequiresSp},
                               {Mode::kTensorParallelOnly, Reason::kRsWait}}));
  EXPECT_EQ(out.peak_bytes, 140u);
  EXPECT_EQ(group.gate().decisions, 5);  // the fallback's step and the plan's four
  EXPECT_EQ(group.gate().last_sp_step, 1);
}

TEST(StepPlan, OverBudgetRunsEverythingSp) {
  const JobLayout l{.pp = 2, .microbatches = 2};
  const auto mbs = Uniform(2, 1.0, {.activation_sp = 10, .activation_tp = 20});
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 0, .stage = 0, .resident_bytes = 100,
                            .memory_budget_bytes = 110, .microbatches = mbs};
  const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  EXPECT_TRUE(out.over_budget);
  EXPECT_THAT(out.decisions, Each(Decision{Mode::kSequenceParallel, Reason::kMemoryOverBudget}));
}

TEST(StepPlan, SpRequiredBeatsEvenAForcedPin) {
  const JobLayout l{.pp = 2, .microbatches = 3};
  const auto mbs = Uniform(3, 1.0, {});
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 1, .stage = 1, .microbatches = mbs};
  const StagePlanOutcome out =
      DecideStagePlan(group, Config(), l, plan, PinDirective(Mode::kTensorParallelOnly, true),
                      nullptr, /*sp_required=*/true);
  EXPECT_THAT(out.decisions, Each(Decision{Mode::kSequenceParallel, Reason::kSpRequired}));
}

TEST(StepPlan, PinsYieldToTheStageGateUnlessForced) {
  const JobLayout l{.pp = 4, .microbatches = 4};
  const auto mbs = Uniform(4, 0.0, {.activation_sp = 10, .activation_tp = 20});
  const StagePlanFacts plan{.step = 0, .stage = 0, .resident_bytes = 100,
                            .memory_budget_bytes = 145, .microbatches = mbs};
  GroupPolicyState a;
  EXPECT_THAT(DecideStagePlan(a, Config(), l, plan, PinDirective(Mode::kTensorParallelOnly),
                              nullptr, false)
                  .decisions,
              Each(Decision{Mode::kSequenceParallel, Reason::kMemoryRequiresSp}));
  GroupPolicyState b;
  const StagePlanOutcome forced = DecideStagePlan(
      b, Config(), l, plan, PinDirective(Mode::kTensorParallelOnly, true), nullptr, false);
  EXPECT_THAT(forced.decisions, Each(Decision{Mode::kTensorParallelOnly, Reason::kPinned}));
  EXPECT_EQ(forced.peak_bytes, 180u);  // a forced pin is the operator's risk, and counted
}

TEST(StepPlan, MicrobatchesWithoutLengthsRunSp) {
  const JobLayout l{.pp = 2, .microbatches = 2};
  auto mbs = Uniform(2, 1.0, {});
  mbs[1].lengths_known = false;
  GroupPolicyState group;
  const StagePlanFacts plan{.step = 0, .stage = 1, .microbatches = mbs};
  const StagePlanOutcome out = DecideStagePlan(group, Config(), l, plan, {}, nullptr, false);
  EXPECT_EQ(out.decisions[0], (Decision{Mode::kTensorParallelOnly, Reason::kLengthCv}));
  EXPECT_EQ(out.decisions[1], (Decision{Mode::kSequenceParallel, Reason::kLengthsUnknown}));
}

// Two CP ranks' groups of one (replica, stage) whose own wait-share windows differ: from
// the plan alone they decide alike; with their windows they would not.
TEST(StepPlan, PlanOnlyDecidesCpGroupsAlike) {
  const JobLayout l{.pp = 2, .cp = 2, .microbatches = 2};
  GateConfig c;  // defaults: the wait-share gate is live
  const auto mbs = Uniform(2, 0.0, {});
  GroupPolicyState quiet, waiting;
  for (int64_t s = 0; s < 4; ++s) {
    waiting.ObserveRsWaitShare(-10 + s, Mode::kSequenceParallel, 0.9, c.window_steps);
  }
  const StagePlanFacts plan{.step = 0, .stage = 0, .microbatches = mbs};
  GroupPolicyState q1 = quiet, w1 = waiting;
  const auto own_q = DecideStagePlan(q1, c, l, plan, {}, nullptr, false);
  const auto own_w = DecideStagePlan(w1, c, l, plan, {}, nullptr, false);
  EXPECT_NE(Modes(own_q), Modes(own_w));  // the windows matter when read
  GroupPolicyState q2 = quiet, w2 = waiting;
  const auto plan_q = DecideStagePlan(q2, c, l, plan, {}, nullptr, false, {.plan_only = true});
  const auto plan_w = DecideStagePlan(w2, c, l, plan, {}, nullptr, false, {.plan_only = true});
  EXPECT_EQ(plan_q.decisions, plan_w.decisions);
  EXPECT_EQ(q2.gate().mode, w2.gate().mode);
}

}  // namespace
}  // namespace spgate
