// LocalGatePolicy: the config schedule honours effective_from_step, and a leader that
// adopts the daemon's decisions holds exactly the daemon's group state — so its next
// local decision is the one the daemon would have made. Checked against a reference
// "daemon" that runs EvaluateGates the way server/gate_state.cc does.
#include "worker/client/local_policy.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "policy/exploration.h"
#include "policy/gate_policy.h"
#include "policy/rolling_window.h"
#include "policy/step_plan.h"
#include "tests/testing/policy_printers.h"

namespace spgate::client {
namespace {

GateConfig WithCv(double cv) {
  GateConfig c;
  c.max_length_cv = cv;
  return c;
}

TEST(LocalGatePolicyTest, ConfigAppliesFromEffectiveStep) {
  LocalGatePolicy p(WithCv(0.18), 1);
  p.ScheduleConfig(WithCv(0.5), 2, 10);
  EXPECT_EQ(p.ConfigFor(9).version, 1);
  EXPECT_EQ(p.ConfigFor(10).version, 2);
  EXPECT_EQ(p.ConfigFor(10).config.max_length_cv, 0.5);
  EXPECT_EQ(p.ConfigFor(1000).version, 2);

  // Batch with CV 0.3: TP-only under 0.18, SP under 0.5 — the switch is exactly at 10.
  for (int64_t step = 8; step <= 11; ++step) {
    LocalDecision d = p.Decide({.step = step, .length_cv = 0.3});
    EXPECT_EQ(d.config_version, step < 10 ? 1 : 2) << "step " << step;
    EXPECT_EQ(d.decision.mode, step < 10 ? Mode::kTensorParallelOnly : Mode::kSequenceParallel)
        << "step " << step;
  }
}

TEST(LocalGatePolicyTest, LaterScheduleReplacesOverlappingOnes) {
  LocalGatePolicy p(WithCv(0.18), 1);
  p.ScheduleConfig(WithCv(0.3), 2, 20);
  p.ScheduleConfig(WithCv(0.4), 3, 30);
  p.ScheduleConfig(WithCv(0.5), 4, 25);  // a newer update from step 25 drops v3
  EXPECT_EQ(p.ConfigFor(19).version, 1);
  EXPECT_EQ(p.ConfigFor(24).version, 2);
  EXPECT_EQ(p.ConfigFor(30).version, 4);
  p.ScheduleConfig(WithCv(0.6), 5, 0);  // from step 0: replaces every scheduled one
  EXPECT_EQ(p.ConfigFor(-5).version, 1);  // before step 0 the initial config stays
  EXPECT_EQ(p.ConfigFor(100).version, 5);
}

TEST(LocalGatePolicyTest, PastConfigsArePrunedButTheCurrentOneStays) {
  LocalGatePolicy p(WithCv(0.18), 1);
  p.ScheduleConfig(WithCv(0.3), 2, 5);
  p.Decide({.step = 7, .length_cv = 0.0});
  EXPECT_EQ(p.ConfigFor(8).version, 2);
}

TEST(LocalGatePolicyTest, PinSeenFromTheDaemonOutlivesItsAbsence) {
  LocalGatePolicy p;
  p.Adopt(1, Mode::kTensorParallelOnly, Reason::kPinned);
  LocalDecision d = p.Decide({.step = 2, .length_cv = 0.0});
  EXPECT_EQ(d.decision.mode, Mode::kTensorParallelOnly);
  EXPECT_EQ(d.decision.reason, Reason::kPinned);
  p.Adopt(3, Mode::kSequenceParallel, Reason::kGatesPassed);  // the daemon lifted it
  EXPECT_EQ(p.Decide({.step = 4, .length_cv = 0.5}).decision.reason, Reason::kLengthCv);
}

TEST(LocalGatePolicyTest, OnlySpStepsFeedTheRollingWaitShare) {
  LocalGatePolicy p;
  p.ObserveRsWaitShare(1, Mode::kSequenceParallel, 0.4);
  p.ObserveRsWaitShare(2, Mode::kTensorParallelOnly, 0.9);
  EXPECT_EQ(p.rs_wait().samples, 1);
  EXPECT_DOUBLE_EQ(p.rs_wait().mean, 0.4);
}

// The daemon's side, as server/gate_state.cc runs it: EvaluateGates over its group state
// and an rs_wait window that SP steps feed and entering the RS_WAIT fallback clears.
struct ReferenceDaemon {
  GateConfig config;
  GroupGateState state;
  RollingWindow window{1};
  Decision Decide(const BatchFacts& f) {
    window.Resize(config.window_steps);
    GateOutcome out = EvaluateGates(config, state, f, {window.Mean(), window.size()}, std::nullopt);
    state = out.next;
    if (out.reset_rs_wait_window) window.Clear();
    return out.decision;
  }
  void Observe(Mode mode, double share) {
    if (mode == Mode::kSequenceParallel) {
      window.Resize(config.window_steps);
      window.Push(share);
    }
  }
};

bool Same(const Decision& a, const Decision& b) { return a.mode == b.mode && a.reason == b.reason; }

void ExpectSameState(const GroupGateState& a, const GroupGateState& b, int64_t step) {
  EXPECT_EQ(a.has_decision, b.has_decision) << "step " << step;
  EXPECT_EQ(a.last_step, b.last_step) << "step " << step;
  EXPECT_EQ(a.mode, b.mode) << "step " << step;
  EXPECT_EQ(a.reason, b.reason) << "step " << step;
  EXPECT_EQ(a.rs_wait_fallback, b.rs_wait_fallback) << "step " << step;
  EXPECT_EQ(a.rs_wait_changed_step, b.rs_wait_changed_step) << "step " << step;
  EXPECT_EQ(a.last_sp_step, b.last_sp_step) << "step " << step;
  EXPECT_EQ(a.mode_switches, b.mode_switches) << "step " << step;
  // ADAPTIVE's: the flip cap's history and the forced-run counts its charge reads.
  EXPECT_EQ(a.decisions, b.decisions) << "step " << step;
  EXPECT_EQ(a.has_chosen_mode, b.has_chosen_mode) << "step " << step;
  EXPECT_EQ(a.chosen_mode, b.chosen_mode) << "step " << step;
  EXPECT_EQ(a.last_switch_at, b.last_switch_at) << "step " << step;
  EXPECT_EQ(a.prev_switch_at, b.prev_switch_at) << "step " << step;
  EXPECT_EQ(a.chosen_weight, b.chosen_weight) << "step " << step;
  EXPECT_EQ(a.forced_runs[0], b.forced_runs[0]) << "step " << step;
  EXPECT_EQ(a.forced_runs[1], b.forced_runs[1]) << "step " << step;
  EXPECT_EQ(a.probe_from, b.probe_from) << "step " << step;
}

// Random batches and wait shares with small probe/dwell/window settings, so every gate
// (memory, CV, RS_WAIT, probes, re-enable, dwell) fires many times.
TEST(LocalGatePolicyTest, AdoptingDaemonDecisionsKeepsTheDaemonsState) {
  GateConfig config;
  config.probe_interval_steps = 7;
  config.min_dwell_steps = 3;
  config.window_steps = 5;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    ReferenceDaemon daemon{config};
    LocalGatePolicy leader(config, 0);
    int gates_seen[kNumReasons] = {};
    for (int64_t step = 0; step < 2000; ++step) {
      BatchFacts f;
      f.step = step;
      f.length_cv = u(rng) < 0.2 ? 0.3 : 0.05;
      if (u(rng) < 0.05) {
        f.memory_budget_bytes = 100;
        f.predicted_peak_bytes_tp = 95;
        f.predicted_peak_bytes_sp = u(rng) < 0.5 ? 50 : 99;
      }
      // What the leader would decide alone must equal what the daemon decides.
      LocalGatePolicy copy = leader;
      const Decision local = copy.Decide(f).decision;
      const Decision d = daemon.Decide(f);
      ASSERT_TRUE(Same(local, d)) << "seed " << seed << " step " << step << ": local "
                                  << ::testing::PrintToString(local) << " daemon "
                                  << ::testing::PrintToString(d);
      ++gates_seen[static_cast<int>(d.reason)];
      leader.Adopt(step, d.mode, d.reason);
      ExpectSameState(leader.state(), daemon.state, step);
      // Wait share: phases of high and low imbalance.
      const double share = ((step / 150) % 2 == 1 ? 0.35 : 0.05) + 0.05 * u(rng);
      daemon.Observe(d.mode, share);
      leader.ObserveRsWaitShare(step, d.mode, share);
      ASSERT_EQ(leader.rs_wait().samples, daemon.window.size()) << "step " << step;
    }
    for (Reason r : {Reason::kGatesPassed, Reason::kLengthCv, Reason::kRsWait, Reason::kProbe,
                     Reason::kMemoryRequiresSp, Reason::kMemoryOverBudget}) {
      EXPECT_GT(gates_seen[static_cast<int>(r)], 0) << ReasonLabel(r) << " never fired";
    }
  }
}

// Mixed: some steps the daemon decides, some the leader decides alone (it adopted its
// own decisions by deciding them). Both sides running the same sequence of decisions
// must stay identical.
TEST(LocalGatePolicyTest, LocalAndAdoptedDecisionsInterleave) {
  GateConfig config;
  config.probe_interval_steps = 5;
  config.min_dwell_steps = 2;
  config.window_steps = 4;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  ReferenceDaemon daemon{config};
  LocalGatePolicy leader(config, 0);
  for (int64_t step = 0; step < 3000; ++step) {
    BatchFacts f{.step = step, .length_cv = u(rng) < 0.1 ? 0.4 : 0.01};
    const Decision d = daemon.Decide(f);
    if (u(rng) < 0.5) {
      ASSERT_TRUE(Same(leader.Decide(f).decision, d)) << "step " << step;
    } else {
      leader.Adopt(step, d.mode, d.reason);
    }
    const double share = ((step / 100) % 2 == 1 ? 0.3 : 0.1) + 0.02 * u(rng);
    daemon.Observe(d.mode, share);
    leader.ObserveRsWaitShare(step, d.mode, share);
  }
  ExpectSameState(leader.state(), daemon.state, 3000);
}

// The fallback under ADAPTIVE decides with the last table the daemon sent, exactly as
// EvaluateAdaptive does over that table: a daemon outage keeps the learned choice (TP-only
// here, where the static gates would run SP), and without a table it is the gates.
TEST(LocalGatePolicyTest, AdaptiveFallbackUsesTheLearnedTable) {
  GateConfig c;
  c.policy = GatePolicyKind::kAdaptive;
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable t;
  for (int i = 0; i < 50; ++i) {
    t.Observe(c, band, Mode::kSequenceParallel, 99 - i, 1000, 1.0);
    t.Observe(c, band, Mode::kTensorParallelOnly, 99 - i, 1300, 1.0);
  }
  LocalGatePolicy without(c, 1);
  LocalGatePolicy with(c, 1);
  with.SetLearnedTable(t);
  GroupGateState reference;
  for (int64_t step = 101; step < 130; ++step) {
    const BatchFacts f{.step = step, .length_cv = 0.05, .tokens = 4096};
    const GateOutcome want = EvaluateAdaptive(c, reference, f, {}, std::nullopt, &t);
    reference = want.next;
    EXPECT_EQ(with.Decide(f).decision, want.decision) << step;
    const Decision prior = without.Decide(f).decision;
    EXPECT_EQ(prior.reason, MayExplore(c, step) ? Reason::kProbe : Reason::kGatesPassed)
        << step;
  }
  EXPECT_EQ(with.Decide({.step = 131, .length_cv = 0.05, .tokens = 4096}).decision,
            (Decision{Mode::kTensorParallelOnly, Reason::kAdaptive}));
}

// A pipeline stage's fallback decides its step plans over the table the daemon pushed to
// its leader (its stage's): the learned TP-only here, where the gates would run SP, and
// exactly what DecideStagePlan makes of that table.
TEST(LocalGatePolicyTest, StageFallbackDecidesWithItsStagesTable) {
  GateConfig c;
  c.policy = GatePolicyKind::kAdaptive;
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable t;
  for (int i = 0; i < 50; ++i) {
    t.Observe(c, band, Mode::kSequenceParallel, 99 - i, 1000, 1.0);
    t.Observe(c, band, Mode::kTensorParallelOnly, 99 - i, 1300, 1.0);
  }
  const JobLayout layout{.tp = 2, .pp = 2, .microbatches = 2};
  const std::vector<MicrobatchFacts> facts{{.id = 0, .length_cv = 0.05, .tokens = 4096},
                                           {.id = 1, .length_cv = 0.05, .tokens = 4096}};
  LocalGatePolicy with(c, 1);
  LocalGatePolicy without(c, 1);
  with.SetLearnedTable(t);
  GroupPolicyState reference;
  for (int64_t step = 103; step < 112; ++step) {  // no exploration step (0-3, then 134 on)
    const StagePlanFacts plan{.step = step, .stage = 1, .microbatches = facts};
    const StagePlanOutcome want =
        DecideStagePlan(reference, c, layout, plan, std::nullopt, &t, /*sp_required=*/false);
    const StagePlanOutcome got = with.DecideStage(layout, plan, /*sp_required=*/false);
    EXPECT_EQ(got.decisions, want.decisions) << step;
    EXPECT_EQ(got.bands, want.bands) << step;
    for (const Decision& d : got.decisions) {
      EXPECT_EQ(d, (Decision{Mode::kTensorParallelOnly, Reason::kAdaptive})) << step;
    }
    for (const Decision& d : without.DecideStage(layout, plan, false).decisions) {
      EXPECT_EQ(d.mode, Mode::kSequenceParallel) << step;  // the gates: CV 0.05 passes
    }
  }
}

}  // namespace
}  // namespace spgate::client
