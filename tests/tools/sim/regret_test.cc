// Regret per window (tools/sim/regret.h) on hand-made step times whose windows are known,
// and what --compare derives from its runs: agreement with the oracle, flips, exploration,
// the switch cost in the step times, the expected-value oracle and the regret against it,
// and the flags checked naming the flag.
#include "tools/sim/regret.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tools/sim/compare.h"
#include "tools/sim/sim.h"

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

struct Case {
  std::string name;
  std::vector<double> policy, oracle, fixed;
  int64_t window;
  // Expected.
  int64_t window_steps, windows;
  double median, p95, worst;
  int64_t worst_start;
  double worst_vs_fixed, min_vs_fixed;
};

TEST(WindowedRegretTest, KnownWindows) {
  const std::vector<double> ones(5, 1.0);
  const std::vector<Case> cases = {
      // Window 1: each step's regret 1 − 1/t = 0, 0.2, 0.5, 0.75, 0.375; nearest rank:
      // the median is the 3rd of 5 sorted, the p95 the 5th.
      {"one step per window", {1, 1.25, 2, 4, 1.6}, ones, ones, 1,
       1, 5, 0.375, 0.75, 0.75, 3, 0.25, 0.25},
      // Window 2 of 10 steps, one slow step at the end: 8 windows at 0, the last at 0.5.
      {"a window shorter than the run", {1, 1, 1, 1, 1, 1, 1, 1, 1, 3},
       std::vector<double>(10, 1.0), std::vector<double>(10, 1.0), 2,
       2, 9, 0.0, 0.5, 0.5, 8, 0.5, 0.5},
      // A run of 3 steps under a window of 1,000: one window over the run, 1 − 3/6.
      {"a run shorter than the window", {1, 2, 3}, {1, 1, 1}, {1, 1, 1}, 1000,
       3, 1, 0.5, 0.5, 0.5, 0, 0.5, 0.5},
      // Window sums 4, 3, 2, 3, 4: the first and last windows tie for worst; the earliest
      // stays. Regrets sorted 0, 1/3, 1/3, 0.5, 0.5.
      {"ties keep the earliest worst window", {2, 2, 1, 1, 2, 2},
       std::vector<double>(6, 1.0), std::vector<double>(6, 1.0), 2,
       2, 5, 1.0 / 3, 0.5, 0.5, 0, 0.5, 0.5},
      // The best fixed choice: 1.5x the policy in its worst window (start 0), but 0.5x in
      // the last one (the policy runs at half its speed there).
      {"best fixed at the worst window and at its lowest", {2, 2, 1, 1}, {1, 1, 1, 1},
       {3, 3, 0.5, 0.5}, 2,
       2, 3, 1.0 / 3, 0.5, 0.5, 0, 1.5, 0.5},
      // A policy faster than the "oracle" (possible once switches cost: the oracle ignores
      // that cost) has negative regret; it is not clamped.
      {"negative regret", {1, 1}, {2, 2}, {1, 1}, 1, 1, 2, -1.0, -1.0, -1.0, 0, 1.0, 1.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<WindowedRegret> r = WindowedRegretOf(c.policy, c.oracle, c.fixed, c.window);
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->window, c.window_steps);
    EXPECT_EQ(r->windows, c.windows);
    EXPECT_DOUBLE_EQ(r->median, c.median);
    EXPECT_DOUBLE_EQ(r->p95, c.p95);
    EXPECT_DOUBLE_EQ(r->worst, c.worst);
    EXPECT_EQ(r->worst_start, c.worst_start);
    EXPECT_DOUBLE_EQ(r->worst_vs_best_fixed, c.worst_vs_fixed);
    EXPECT_DOUBLE_EQ(r->min_vs_best_fixed, c.min_vs_fixed);
  }
}

TEST(WindowedRegretTest, TheOracleHasNoRegret) {
  const std::vector<double> t = {0.1, 0.3, 0.7, 0.2, 0.11, 0.13};
  absl::StatusOr<WindowedRegret> r = WindowedRegretOf(t, t, t, 4);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->median, 0);
  EXPECT_EQ(r->p95, 0);
  EXPECT_EQ(r->worst, 0);
  EXPECT_EQ(r->worst_vs_best_fixed, 1);
}

TEST(WindowedRegretTest, RefusesBadInput) {
  const std::vector<double> a = {1, 1}, b = {1};
  for (int64_t w : {0, -5}) {
    EXPECT_THAT(WindowedRegretOf(a, a, a, w),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--regret_window")));
  }
  EXPECT_THAT(WindowedRegretOf(a, b, a, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one step time per step")));
  EXPECT_THAT(WindowedRegretOf({}, {}, {}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one step time per step")));
  const std::vector<double> zero = {0, 0};
  EXPECT_THAT(WindowedRegretOf(zero, a, a, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no positive time")));
}

// ---- What Compare derives ----

SimOptions Plain() {
  SimOptions o;
  o.groups = 3;
  o.steps = 400;
  o.cost.tp = 8;
  o.bucketing = false;  // mixed batches: the oracle switches often
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  // Half the attention on the sequence shard (the what-if imbalance, docs/sim.md): Megatron
  // SP alone is balanced and wins every batch here; with it the modes trade places.
  o.cost.shard_work_fraction = 0.5;
  return o;
}

SimOptions Pipelined() {
  SimOptions o = Plain();
  o.groups = 2;
  o.steps = 40;
  o.pp = 4;
  o.microbatches = 8;
  o.lengths = "bimodal:short=512,long=12000,p_long=0.3";
  o.cost.device_memory_gib = 1000;  // no memory limit: tp_only is TP-only everywhere
  return o;
}

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// Agreement and flips from the counts: sp agrees with the oracle exactly where the oracle
// runs SP, tp_only (nothing forced) where it runs TP-only; fixed choices never flip or
// explore, and the oracle agrees with itself and has no regret.
void CheckDerived(const CompareResult& r, int64_t decisions) {
  const PolicyResult& oracle = *r.Find("oracle");
  const PolicyResult& sp = *r.Find("sp");
  const PolicyResult& tp = *r.Find("tp_only");
  ASSERT_EQ(oracle.sp_steps + oracle.tp_steps, decisions);
  EXPECT_EQ(oracle.oracle_agreement, 1.0);
  EXPECT_EQ(oracle.regret.worst, 0.0);
  EXPECT_DOUBLE_EQ(sp.oracle_agreement, static_cast<double>(oracle.sp_steps) / decisions);
  EXPECT_DOUBLE_EQ(tp.oracle_agreement, static_cast<double>(oracle.tp_steps) / decisions);
  EXPECT_EQ(sp.flips_per_1000_steps, 0);
  EXPECT_EQ(sp.explore_share, 0);
  EXPECT_GT(oracle.switches, 0);
  EXPECT_DOUBLE_EQ(oracle.flips_per_1000_steps, 1000.0 * oracle.switches / decisions);
  // Exploration is ADAPTIVE's own (the steps it ran the mode neither the gates nor its
  // evidence chose), not every PROBE: the gates' wait-share probes are the incumbent's.
  const PolicyResult& adaptive = *r.Find("adaptive");
  const PolicyResult& gates = *r.Find("static");
  EXPECT_GT(adaptive.explored_steps, 0);
  EXPECT_LE(adaptive.explored_steps, adaptive.probe_steps);
  EXPECT_DOUBLE_EQ(adaptive.explore_share,
                   static_cast<double>(adaptive.explored_steps) / decisions);
  EXPECT_EQ(gates.explored_steps, 0);
  EXPECT_EQ(gates.explore_share, 0);
  for (const PolicyResult& p : r.policies) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(p.step_seconds.size(), static_cast<size_t>(r.steps));
    EXPECT_GE(p.regret.worst, p.regret.p95);
    EXPECT_GE(p.regret.p95, p.regret.median);
    EXPECT_GE(p.regret.median, -1e-12);  // no switch cost: nothing beats the oracle
  }
  // Whole-run figures and windows agree on a run of one window.
  EXPECT_THAT(CompareJson(r), HasSubstr("\"regret_window_median\": "));
  EXPECT_THAT(CompareJson(r), HasSubstr("\"oracle_agreement\": 1.000000, "));
  EXPECT_THAT(CompareTable(r), HasSubstr("| window regret % median | p95 | worst |"));
}

TEST(CompareRegretTest, PlainCells) {
  absl::StatusOr<CompareResult> r = Compare(Plain(), GateConfig{}, 0, 100);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->Find("adaptive")->regret.windows, 301);
  CheckDerived(*r, 3 * 400);
  // One window over the run: its regret is the whole run's, 1 − ratio to the oracle.
  r = Compare(Plain(), GateConfig{}, 0, 1000);
  ASSERT_THAT(r.status(), IsOk());
  for (const PolicyResult& p : r->policies) {
    EXPECT_EQ(p.regret.windows, 1) << p.name;
    EXPECT_NEAR(p.regret.worst, 1 - p.ratio_to_oracle, 1e-9) << p.name;
    EXPECT_EQ(p.regret.median, p.regret.worst) << p.name;
  }
}

// A heavy shard imbalance trips the gates' wait-share gate, whose fallback probes SP every
// probe_interval_steps under STATIC and, where ADAPTIVE keeps the gates' choice, under
// ADAPTIVE too (the incumbent's rule): those PROBE steps count in probe_steps but are no
// exploration of ADAPTIVE's.
TEST(CompareRegretTest, GatesProbesAreNotExploration) {
  SimOptions o = Plain();
  o.steps = 1000;
  o.lengths = "lognormal:mean=4096,sigma=0.8";
  o.cost.shard_work_fraction = 0.9;
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 0, 100);
  ASSERT_THAT(r.status(), IsOk());
  const PolicyResult& gates = *r->Find("static");
  const PolicyResult& adaptive = *r->Find("adaptive");
  EXPECT_GT(gates.probe_steps, 0);
  EXPECT_EQ(gates.explored_steps, 0);
  EXPECT_GT(adaptive.explored_steps, 0);
  EXPECT_GT(adaptive.probe_steps, adaptive.explored_steps);
  EXPECT_THAT(CompareJson(*r),
              HasSubstr(absl::StrFormat("\"explored_steps\": %d,", adaptive.explored_steps)));
}

TEST(CompareRegretTest, PipelineCells) {
  absl::StatusOr<CompareResult> r = Compare(Pipelined(), GateConfig{}, 0, 10);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->pipelined());
  EXPECT_EQ(r->Find("oracle")->regret.windows, 31);
  CheckDerived(*r, 2 * 40 * 4 * 8);  // (stage, micro-batch) decisions
  EXPECT_THAT(CompareJson(*r), HasSubstr("\"flips_per_1000_steps\": "));
  EXPECT_THAT(CompareJson(*r), HasSubstr(", \"explore_share\": "));
}

// Every switch makes its step longer by --switch_cost_s, for every policy, the oracle
// included. Where the decisions do not depend on step times (sp, tp_only, the oracle, and
// the static gates, whose wait share is the collectives'), a run's time grows by exactly
// switches × cost; sp never switches and runs the same.
TEST(CompareRegretTest, SwitchCostIsAddedToTheStepItHappensOn) {
  SimOptions o = Plain();
  absl::StatusOr<CompareResult> free = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(free.status(), IsOk());
  o.cost.switch_cost_s = 0.05;
  absl::StatusOr<CompareResult> costly = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(costly.status(), IsOk());
  EXPECT_EQ(costly->switch_cost_s, 0.05);
  for (const char* name : {"sp", "tp_only", "static", "oracle"}) {
    SCOPED_TRACE(name);
    const PolicyResult& a = *free->Find(name);
    const PolicyResult& b = *costly->Find(name);
    ASSERT_EQ(a.switches, b.switches);
    EXPECT_NEAR(Sum(b.step_seconds) - Sum(a.step_seconds), 0.05 * a.switches, 1e-9);
  }
  EXPECT_EQ(costly->Find("sp")->step_seconds, free->Find("sp")->step_seconds);
  // The oracle still takes each batch's faster mode, so its switches now cost it more than
  // they buy: a policy that stays in one mode beats it.
  EXPECT_GT(costly->Find("sp")->ratio_to_oracle, 1.0);
  EXPECT_LT(costly->Find("sp")->regret.median, 0.0);
  // The static row is still plain replay, which pays the same for its switches.
  absl::StatusOr<Summary> replay = Replay(o, GateConfig{});
  ASSERT_THAT(replay.status(), IsOk());
  EXPECT_DOUBLE_EQ(costly->Find("static")->effective_tokens_per_s,
                   o.groups * replay->all.tokens / replay->all.time_s);
}

// In a pipeline the cost lengthens the switching micro-batch's forward on its stage: the
// step grows by at most the switches' seconds (an op off the critical path may cost less)
// and never shrinks.
TEST(CompareRegretTest, SwitchCostGoesThroughThePipelineTimeline) {
  SimOptions o = Pipelined();
  absl::StatusOr<CompareResult> free = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(free.status(), IsOk());
  o.cost.switch_cost_s = 0.01;
  absl::StatusOr<CompareResult> costly = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(costly.status(), IsOk());
  EXPECT_EQ(costly->Find("sp")->step_seconds, free->Find("sp")->step_seconds);
  const PolicyResult& a = *free->Find("oracle");
  const PolicyResult& b = *costly->Find("oracle");
  ASSERT_EQ(a.switches, b.switches);
  ASSERT_GT(a.switches, 0);
  const double added = Sum(b.step_seconds) - Sum(a.step_seconds);
  EXPECT_GT(added, 0);
  EXPECT_LE(added, 0.01 * a.switches + 1e-9);
}

// The expected-value oracle picks each batch's mode from the noise-free model and runs it
// on the same noisy steps. Without noise it is the clairvoyant oracle (same modes, same
// step times), so every policy's regret against it is its regret against the oracle. With
// noise and no switch cost the clairvoyant oracle is ahead of it in every window (it picks
// each step's faster mode after the noise), it has no regret against itself, and the
// regret keys are in every policy's JSON.
TEST(CompareRegretTest, ExpectedOracle) {
  for (const bool pipelined : {false, true}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "plain");
    SimOptions quiet = pipelined ? Pipelined() : Plain();
    quiet.cost.jitter = 0;
    quiet.cost.straggler_prob = 0;
    absl::StatusOr<CompareResult> r = Compare(quiet, GateConfig{}, 0, 10);
    ASSERT_THAT(r.status(), IsOk());
    const PolicyResult* e = r->Find("expected_oracle");
    ASSERT_NE(e, nullptr);
    const PolicyResult& oracle = *r->Find("oracle");
    EXPECT_EQ(e->step_seconds, oracle.step_seconds);
    EXPECT_EQ(e->oracle_agreement, 1.0);
    EXPECT_GT(e->switches, 0);
    for (const PolicyResult& p : r->policies) {
      SCOPED_TRACE(p.name);
      EXPECT_EQ(p.expected_regret.median, p.regret.median);
      EXPECT_EQ(p.expected_regret.p95, p.regret.p95);
      EXPECT_EQ(p.expected_regret.worst, p.regret.worst);
    }

    SimOptions noisy = quiet;
    noisy.cost.jitter = 0.05;
    noisy.cost.straggler_prob = 0.05;
    r = Compare(noisy, GateConfig{}, 0, 10);
    ASSERT_THAT(r.status(), IsOk());
    e = r->Find("expected_oracle");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->expected_regret.worst, 0.0);
    EXPECT_EQ(e->expected_regret.median, 0.0);
    EXPECT_GT(e->regret.worst, 0.0) << "the noise costs what only foresight avoids";
    EXPECT_LT(e->oracle_agreement, 1.0);
    EXPECT_LE(r->Find("oracle")->expected_regret.worst, 1e-12);
    for (const PolicyResult& p : r->policies) {
      SCOPED_TRACE(p.name);
      EXPECT_EQ(p.step_seconds.size(), static_cast<size_t>(r->steps));
      EXPECT_GE(p.expected_regret.p95, p.expected_regret.median);
      EXPECT_GE(p.expected_regret.worst, p.expected_regret.p95);
      // Against the oracle a policy is never ahead; against the expected oracle it is
      // behind by less (the two windows' difference is the expected oracle's own regret).
      EXPECT_LE(p.expected_regret.median, p.regret.median + 1e-12);
    }
    const std::string json = CompareJson(*r);
    EXPECT_THAT(json, HasSubstr("\"expected_oracle\": {\"effective_tokens_per_s\": "));
    size_t keys = 0;
    for (size_t at = json.find("\"expected_regret_window_median\": "); at != std::string::npos;
         at = json.find("\"expected_regret_window_median\": ", at + 1)) {
      ++keys;
    }
    EXPECT_EQ(keys, r->policies.size());
    EXPECT_THAT(json, HasSubstr("\"expected_regret_window_p95\": "));
    EXPECT_THAT(CompareTable(*r), HasSubstr("| vs expected oracle: median | p95 |"));
  }
}

TEST(CompareRegretTest, FlagsAreCheckedNamingTheFlag) {
  for (int64_t w : {0, -1}) {
    EXPECT_THAT(Compare(Plain(), GateConfig{}, 0, w),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--regret_window")));
    EXPECT_THAT(Compare(Pipelined(), GateConfig{}, 0, w),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--regret_window")));
  }
  for (double c : {-0.1, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(c);
    SimOptions o = Plain();
    o.cost.switch_cost_s = c;
    EXPECT_THAT(Compare(o, GateConfig{}, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--switch_cost_s")));
    EXPECT_THAT(Replay(o, GateConfig{}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--switch_cost_s")));
    EXPECT_THAT(RunLive(o),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--switch_cost_s")));
  }
}

}  // namespace
}  // namespace spgate::sim
