// The ADAPTIVE policy (docs/design.md §11): bands, the learned table with forgetting, the
// margin that prefers SP, the static gates as the prior while a band has too few samples,
// the bounded deterministic exploration share, and pin and memory precedence. Pure: each
// case builds a table by hand or by observing steps, and asks for one decision or a run.
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "tests/testing/policy_printers.h"

namespace spgate {
namespace {

using ::testing::HasSubstr;

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;

// The cases below are written for these values, not for whatever the defaults become.
GateConfig Adaptive() {
  GateConfig c;
  c.policy = GatePolicyKind::kAdaptive;
  c.adaptive_half_life_steps = 500;
  c.adaptive_margin = 0.02;
  c.adaptive_min_samples = 8;
  c.adaptive_explore_share = 0.03;
  c.adaptive_cv_band_width = 0.05;
  c.adaptive_tokens_band_base = 8192;
  return c;
}

// A step that is not an exploration step under the default share (period 34).
constexpr int64_t kStep = 1001;

// `n` samples of each mode at the given rates in `band`, ending at `step`.
ThroughputTable Learned(int band, double sp_rate, double tp_rate, int n = 50,
                        int64_t step = kStep - 1) {
  ThroughputTable t;
  for (int i = n - 1; i >= 0; --i) {
    t.Observe(band, kSp, step - i, sp_rate, 1.0, 500);
    t.Observe(band, kTp, step - i, tp_rate, 1.0, 500);
  }
  return t;
}

BatchFacts Batch(double cv = 0.05, int64_t tokens = 4096, int64_t step = kStep) {
  return BatchFacts{.step = step, .length_cv = cv, .tokens = tokens};
}

TEST(BandOfTest, EdgesBelongToTheUpperBand) {
  GateConfig c = Adaptive();
  c.adaptive_cv_band_width = 0.1;  // base 8192
  struct Case {
    double cv;
    int64_t tokens;
    int band;
  } cases[] = {
      {0.0, 1, 0},          {0.0999, 8191, 0},  {0.1, 8191, 4},       {0.1, 8192, 5},
      {0.25, 16383, 9},     {0.25, 16384, 10},  {0.3, 32767, 14},     {0.3, 32768, 15},
      {0.7, 1, 28},         {0.69, 1, 24},      {9.5, 1 << 30, 31},   {-1.0, 0, 0},
      {std::nan(""), 0, 0}, {0.05, 20000, 2},
  };
  for (const Case& k : cases) {
    EXPECT_EQ(BandOf(c, k.cv, k.tokens), k.band) << k.cv << " " << k.tokens;
  }
  EXPECT_EQ(BandLabel(14), "cv3.tok2");
  EXPECT_EQ(BandLabel(31), "cv7.tok3");
  EXPECT_EQ(BandLabel(-1), "none");
  EXPECT_EQ(BandLabel(kBands), "none");
  EXPECT_EQ(BandRangeText(c, 5), "cv [0.1, 0.2), tokens [8192, 16384)");
  EXPECT_EQ(BandRangeText(c, 15), "cv [0.3, 0.4), tokens >= 32768");
  EXPECT_EQ(BandRangeText(c, 29), "cv >= 0.7, tokens [8192, 16384)");
}

TEST(ThroughputTableTest, EstimateIsTokensOverSecondsAndWeightCountsSamples) {
  ThroughputTable t;
  EXPECT_TRUE(t.empty());
  t.Observe(3, kSp, 10, 1000, 1.0, 100);
  t.Observe(3, kSp, 10, 3000, 1.0, 100);  // same step: no decay between them
  const CellView v = t.At(3, kSp, 10, 100);
  EXPECT_DOUBLE_EQ(v.tokens_per_s, 2000.0);
  EXPECT_DOUBLE_EQ(v.samples, 2.0);
  EXPECT_EQ(t.At(3, kTp, 10, 100).samples, 0.0);
  EXPECT_EQ(t.At(4, kSp, 10, 100).samples, 0.0);
  EXPECT_EQ(t.newest_step(), 10);
}

TEST(ThroughputTableTest, WeightHalvesEveryHalfLife) {
  ThroughputTable t;
  t.Observe(0, kTp, 100, 1000, 1.0, 50);
  EXPECT_DOUBLE_EQ(t.At(0, kTp, 150, 50).samples, 0.5);
  EXPECT_DOUBLE_EQ(t.At(0, kTp, 200, 50).samples, 0.25);
  EXPECT_DOUBLE_EQ(t.At(0, kTp, 90, 50).samples, 1.0);  // reading the past: no growth
  // A late sample (another group behind) enters with the weight it has now.
  t.Observe(0, kTp, 50, 3000, 1.0, 50);
  EXPECT_DOUBLE_EQ(t.cell(0, kTp).weight, 1.5);
  EXPECT_DOUBLE_EQ(t.cell(0, kTp).tokens_per_s(), (1000 + 1500) / 1.5);
  EXPECT_EQ(t.cell(0, kTp).last_step, 100);
}

// The estimate follows a shift: after the rate halves, the estimate is within 5 % of the
// new rate five half-lives later, and still near the old one a tenth of a half-life in.
TEST(ThroughputTableTest, ForgettingFollowsAShift) {
  ThroughputTable t;
  const int64_t h = 200;
  for (int64_t s = 0; s < 2000; ++s) t.Observe(1, kSp, s, 100, 1.0, h);
  for (int64_t s = 2000; s < 2020; ++s) t.Observe(1, kSp, s, 50, 1.0, h);
  EXPECT_GT(t.At(1, kSp, 2020, h).tokens_per_s, 90.0);
  for (int64_t s = 2020; s < 2000 + 5 * h; ++s) t.Observe(1, kSp, s, 50, 1.0, h);
  EXPECT_NEAR(t.At(1, kSp, 3000, h).tokens_per_s, 50.0, 2.5);
}

TEST(ThroughputTableTest, BadSamplesAreIgnored) {
  ThroughputTable t;
  t.Observe(0, kSp, 1, 100, std::nan(""), 10);
  t.Observe(0, kSp, 1, 100, 0.0, 10);
  t.Observe(0, kSp, 1, 100, -1.0, 10);
  t.Observe(0, kSp, 1, -5, 1.0, 10);
  t.Observe(0, kSp, 1, INFINITY, 1.0, 10);
  t.Observe(0, kSp, -3, 100, 1.0, 10);
  t.Observe(-1, kSp, 1, 100, 1.0, 10);
  t.Observe(kBands, kSp, 1, 100, 1.0, 10);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t, ThroughputTable{});
}

// Exploitation: TP-only only when it beats SP by more than the margin; SP within it.
TEST(EvaluateAdaptiveTest, MarginPrefersSp) {
  const GateConfig c = Adaptive();  // margin 0.02
  const int band = BandOf(c, 0.05, 4096);
  struct Case {
    double tp_rate;
    Mode want;
  } cases[] = {{90, kSp}, {100, kSp}, {101.9, kSp}, {102.0, kSp}, {102.1, kTp}, {150, kTp}};
  for (const Case& k : cases) {
    const ThroughputTable t = Learned(band, 100, k.tp_rate);
    std::vector<GateCheck> trace;
    const GateOutcome out = EvaluateAdaptive(c, GroupGateState{}, Batch(), {}, std::nullopt, &t,
                                             &trace);
    EXPECT_EQ(out.decision, (Decision{k.want, Reason::kAdaptive})) << k.tp_rate;
    EXPECT_EQ(out.band, band);
    ASSERT_TRUE(out.static_choice.has_value());
    EXPECT_EQ(*out.static_choice, kSp);  // cv 0.05 passes the static gates
    ASSERT_FALSE(trace.empty());
    EXPECT_EQ(trace.back().gate, "adaptive");
  }
}

// The learned preference overrides the thresholds in both directions: TP-only below the
// length-CV threshold, SP above it, where the table says so.
TEST(EvaluateAdaptiveTest, LearnedPreferenceOverridesTheThresholds) {
  const GateConfig c = Adaptive();
  const BatchFacts high_cv = Batch(0.35);  // static: LENGTH_CV → TP-only
  const ThroughputTable sp_better = Learned(BandOf(c, 0.35, 4096), 120, 100);
  GateOutcome out = EvaluateAdaptive(c, GroupGateState{}, high_cv, {}, std::nullopt, &sp_better);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive}));
  EXPECT_EQ(out.static_choice, kTp);

  const ThroughputTable tp_better = Learned(BandOf(c, 0.05, 4096), 100, 120);
  out = EvaluateAdaptive(c, GroupGateState{}, Batch(0.05), {}, std::nullopt, &tp_better);
  EXPECT_EQ(out.decision, (Decision{kTp, Reason::kAdaptive}));
  EXPECT_EQ(out.static_choice, kSp);
}

// Too few samples in either mode: the static gates decide, with their own reasons, and
// the trace says why. Other bands' samples do not count.
TEST(EvaluateAdaptiveTest, TooFewSamplesFallBackToTheGates) {
  const GateConfig c = Adaptive();  // min_samples 8
  const int band = BandOf(c, 0.35, 4096);
  for (int n : {0, 1, 7}) {
    ThroughputTable t = Learned(band, 100, 200, 50);
    ThroughputTable sparse;
    for (int i = 0; i < 50; ++i) sparse.Observe(band, kSp, kStep - 1 - i, 100, 1, 500);
    for (int i = 0; i < n; ++i) sparse.Observe(band, kTp, kStep - 1 - i, 200, 1, 500);
    std::vector<GateCheck> trace;
    GateOutcome out =
        EvaluateAdaptive(c, GroupGateState{}, Batch(0.35), {}, std::nullopt, &sparse, &trace);
    EXPECT_EQ(out.decision, (Decision{kTp, Reason::kLengthCv})) << n;
    EXPECT_FALSE(out.static_choice.has_value());
    EXPECT_TRUE(std::any_of(trace.begin(), trace.end(), [](const GateCheck& g) {
      return g.gate == "adaptive" && g.outcome == "skip" &&
             g.detail.find("the static gates decide") != std::string::npos;
    }));
    // A band with data elsewhere: still the prior.
    out = EvaluateAdaptive(c, GroupGateState{}, Batch(0.05), {}, std::nullopt, &t);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed}));
  }
  // A decayed table falls below min_samples again: 50 samples, 4 half-lives old → ~3.
  const ThroughputTable old = Learned(band, 100, 200, 50, kStep - 1 - 4 * 500);
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(0.35), {}, std::nullopt, &old).decision,
            (Decision{kTp, Reason::kLengthCv}));
  // Null table: the prior.
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(0.05), {}, std::nullopt, nullptr).decision,
            (Decision{kSp, Reason::kGatesPassed}));
}

// With an empty table the ADAPTIVE policy is the STATIC one on every step but the
// exploration steps.
TEST(EvaluateAdaptiveTest, EmptyTableIsTheStaticPolicyOutsideExploration) {
  const GateConfig a = Adaptive();
  const GateConfig s;
  GroupPolicyState ga, gs;
  const ThroughputTable empty;
  const int64_t period = ExplorePeriod(a);
  int compared = 0;
  for (int64_t step = 1; step < 600; ++step) {
    const BatchFacts f = Batch((step % 7) * 0.05, 4096, step);
    if (step % period == 0) continue;
    const GateOutcome oa = ga.Decide(a, f, std::nullopt, &empty);
    const GateOutcome os = gs.Decide(s, f, std::nullopt);
    ASSERT_EQ(oa.decision, os.decision) << step;
    ga.ObserveRsWaitShare(step, oa.decision.mode, 0.3 * (step % 3 == 0), a.window_steps);
    gs.ObserveRsWaitShare(step, os.decision.mode, 0.3 * (step % 3 == 0), s.window_steps);
    ++compared;
  }
  EXPECT_GT(compared, 500);
}

// Exploration: only on multiples of the period, only the less-sampled mode, and never
// more than the share of a run's steps.
TEST(EvaluateAdaptiveTest, ExplorationIsDeterministicAndBounded) {
  const GateConfig c = Adaptive();  // share 0.03 → period 34
  const int64_t period = ExplorePeriod(c);
  EXPECT_EQ(period, 34);
  const int band = BandOf(c, 0.05, 4096);
  // SP well sampled and better; TP-only fewer samples (enough to decide, fewer than
  // twice that: still explored).
  ThroughputTable t;
  for (int i = 0; i < 100; ++i) t.Observe(band, kSp, 10000 - i, 120, 1, 1000000);
  for (int i = 0; i < 12; ++i) t.Observe(band, kTp, 10000 - i, 100, 1, 1000000);
  GroupPolicyState g;
  int64_t probes = 0, steps = 0;
  GateConfig slow = c;
  slow.adaptive_half_life_steps = 1000000;  // the table barely decays over the run
  for (int64_t step = 10001; step <= 20000; ++step, ++steps) {
    const GateOutcome out = g.Decide(slow, Batch(0.05, 4096, step), std::nullopt, &t);
    if (out.decision.reason == Reason::kProbe) {
      ++probes;
      EXPECT_EQ(out.decision.mode, kTp) << step;
      EXPECT_EQ(step % period, 0) << step;
    } else {
      EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive})) << step;
    }
  }
  EXPECT_EQ(probes, (20000 / period) - (10000 / period));
  EXPECT_LE(static_cast<double>(probes), 0.03 * static_cast<double>(steps));
  // The same inputs give the same decisions: a second group agrees step for step.
  GroupPolicyState g2;
  GroupPolicyState g3;
  for (int64_t step = 30000; step < 30100; ++step) {
    EXPECT_EQ(g2.Decide(slow, Batch(0.05, 4096, step), std::nullopt, &t).decision,
              g3.Decide(slow, Batch(0.05, 4096, step), std::nullopt, &t).decision);
  }
  // Once the less-sampled mode has twice min_samples, exploration pauses.
  for (int i = 0; i < 8; ++i) t.Observe(band, kTp, 10000 - i, 100, 1, 1000000);
  GroupPolicyState g4;
  for (int64_t step = 34 * 400; step < 34 * 410; step += 34) {
    EXPECT_EQ(g4.Decide(slow, Batch(0.05, 4096, step), std::nullopt, &t).decision,
              (Decision{kSp, Reason::kAdaptive}))
        << step;
  }
  // A share of 1 explores every step; a tiny share almost never.
  GateConfig all = c;
  all.adaptive_explore_share = 1.0;
  EXPECT_EQ(ExplorePeriod(all), 1);
  all.adaptive_explore_share = 1e-6;
  EXPECT_EQ(ExplorePeriod(all), 1000000);
}

// An exploration step in an empty band runs the mode the prior did not choose.
TEST(EvaluateAdaptiveTest, ExplorationTeachesAnEmptyBand) {
  const GateConfig c = Adaptive();
  const int64_t step = 34 * 10;
  const GateOutcome out =
      EvaluateAdaptive(c, GroupGateState{}, Batch(0.05, 4096, step), {}, std::nullopt, nullptr);
  EXPECT_EQ(out.decision, (Decision{kTp, Reason::kProbe}));
  const GateOutcome hi =
      EvaluateAdaptive(c, GroupGateState{}, Batch(0.5, 4096, step), {}, std::nullopt, nullptr);
  EXPECT_EQ(hi.decision, (Decision{kSp, Reason::kProbe}));
}

// Memory stays absolute and pins come first, whatever the table says and on exploration
// steps too.
TEST(EvaluateAdaptiveTest, MemoryAndPinsComeFirst) {
  const GateConfig c = Adaptive();
  const int band = BandOf(c, 0.05, 4096);
  const ThroughputTable tp_much_better = Learned(band, 100, 300);
  BatchFacts tight = Batch();
  tight.memory_budget_bytes = 1000;
  tight.predicted_peak_bytes_sp = 500;
  tight.predicted_peak_bytes_tp = 950;  // over 1000 x 0.9
  EXPECT_EQ(EvaluateAdaptive(c, {}, tight, {}, std::nullopt, &tp_much_better).decision,
            (Decision{kSp, Reason::kMemoryRequiresSp}));
  BatchFacts tight_probe = tight;
  tight_probe.step = 34 * 100;  // an exploration step with SP the well-known mode
  ThroughputTable sp_known = tp_much_better;
  for (int i = 0; i < 100; ++i) sp_known.Observe(band, kSp, tight_probe.step - 1, 100, 1, 500);
  EXPECT_EQ(EvaluateAdaptive(c, {}, tight_probe, {}, std::nullopt, &sp_known).decision.mode, kSp);
  // Pins.
  EXPECT_EQ(EvaluateAdaptive(c, {}, Batch(), {}, PinDirective(kSp), &tp_much_better).decision,
            (Decision{kSp, Reason::kPinned}));
  const ThroughputTable sp_better = Learned(band, 300, 100);
  EXPECT_EQ(EvaluateAdaptive(c, {}, Batch(), {}, PinDirective(kTp), &sp_better).decision,
            (Decision{kTp, Reason::kPinned}));
  EXPECT_EQ(EvaluateAdaptive(c, {}, tight, {}, PinDirective(kTp), &sp_better).decision,
            (Decision{kSp, Reason::kMemoryRequiresSp}));
  EXPECT_EQ(EvaluateAdaptive(c, {}, tight, {}, PinDirective(kTp, true), &sp_better).decision,
            (Decision{kTp, Reason::kPinned}));
}

// EvaluatePolicy follows config.policy.
TEST(EvaluatePolicyTest, DispatchesOnThePolicy) {
  GateConfig c = Adaptive();
  c.policy = GatePolicyKind::kStatic;
  const ThroughputTable tp_better = Learned(BandOf(c, 0.05, 4096), 100, 200);
  EXPECT_EQ(EvaluatePolicy(c, {}, Batch(), {}, std::nullopt, &tp_better).decision,
            (Decision{kSp, Reason::kGatesPassed}));
  c.policy = GatePolicyKind::kAdaptive;
  EXPECT_EQ(EvaluatePolicy(c, {}, Batch(), {}, std::nullopt, &tp_better).decision,
            (Decision{kTp, Reason::kAdaptive}));
}

// Under ADAPTIVE a PROBE is exploration: it does not enter the RS_WAIT fallback (under
// STATIC a PROBE seen outside the fallback means the entry was missed, and enters it).
TEST(AdvanceGroupStateTest, AdaptiveProbeLeavesTheWaitShareHysteresisAlone) {
  const GroupGateState s;
  EXPECT_FALSE(AdvanceGroupState(s, 5, {kTp, Reason::kProbe}, GatePolicyKind::kAdaptive)
                   .next.rs_wait_fallback);
  EXPECT_TRUE(AdvanceGroupState(s, 5, {kSp, Reason::kProbe}, GatePolicyKind::kStatic)
                  .next.rs_wait_fallback);
  GroupPolicyState adopted;
  adopted.Adopt(5, {kTp, Reason::kProbe}, Adaptive());
  EXPECT_FALSE(adopted.gate().rs_wait_fallback);
  EXPECT_EQ(adopted.gate().mode, kTp);
}

TEST(PreferenceBitsTest, ChangeWhenABandsPreferenceChanges) {
  const GateConfig c = Adaptive();
  const int band = 6;
  EXPECT_EQ(ThroughputTable{}.PreferenceBits(c, kStep), 0u);
  const uint64_t sp = Learned(band, 100, 100).PreferenceBits(c, kStep);
  const uint64_t tp = Learned(band, 100, 110).PreferenceBits(c, kStep);
  EXPECT_EQ(sp, uint64_t{1} << (2 * band));
  EXPECT_EQ(tp, uint64_t{3} << (2 * band));
  // The last band's bits are the top ones.
  EXPECT_EQ(Learned(kBands - 1, 100, 110).PreferenceBits(c, kStep), uint64_t{3} << 62);
}

// EstimateBand is the one place the band rule lives (the policy, the preference bits and
// spgatectl's LEARNED table read it): known only with min_samples of both modes and a
// positive SP rate; TP-only only above the margin.
TEST(EstimateBandTest, SamplesAndMarginDecide) {
  const GateConfig c = Adaptive();  // margin 0.02, min_samples 8
  const int band = 9;  // cv [0.10, 0.15), tokens [8192, 16384)
  struct Case {
    const char* what;
    ThroughputTable table;
    bool known;
    Mode preferred;
    double ratio;
  } cases[] = {
      {"empty", ThroughputTable{}, false, kSp, 0},
      {"7 samples each", Learned(band, 100, 150, 7), false, kSp, 1.5},
      {"9 samples each, within the margin", Learned(band, 100, 101.5, 9), true, kSp, 1.015},
      {"above the margin", Learned(band, 100, 102.5), true, kTp, 1.025},
      {"TP-only slower", Learned(band, 100, 80), true, kSp, 0.8},
      {"no SP rate", Learned(band, 0, 100), false, kSp, 0},
  };
  for (const Case& k : cases) {
    const BandEstimate e = EstimateBand(c, &k.table, band, kStep);
    EXPECT_EQ(e.known, k.known) << k.what;
    EXPECT_EQ(e.preferred, k.preferred) << k.what;
    EXPECT_NEAR(e.ratio, k.ratio, 1e-9) << k.what;
    // The decision agrees with the estimate on a non-exploration step.
    const GateOutcome out =
        EvaluateAdaptive(c, GroupGateState{}, Batch(0.12, 8192), {}, std::nullopt, &k.table);
    ASSERT_EQ(out.band, band) << k.what;
    if (k.known) {
      EXPECT_EQ(out.decision, (Decision{k.preferred, Reason::kAdaptive})) << k.what;
    } else {
      EXPECT_NE(out.decision.reason, Reason::kAdaptive) << k.what;
    }
  }
  EXPECT_FALSE(EstimateBand(c, nullptr, band, kStep).known);
}

// The ledger adds a batch's learned seconds under the mode run and under the static
// gates' choice, only when the band decided and both rates are known.
TEST(AdaptiveGainLedgerTest, CountsOnlyDecidedBandsWithBothRates) {
  const GateConfig c = Adaptive();
  const int band = BandOf(c, 0.05, 4096);
  const ThroughputTable t = Learned(band, 100, 200);  // TP-only twice SP's tokens/s
  AdaptiveGainLedger ledger;
  EXPECT_EQ(ledger.ratio(), 0.0);

  GateOutcome gates_decided;  // no static_choice: the prior decided, nothing to compare
  gates_decided.band = band;
  gates_decided.decision = {kTp, Reason::kLengthCv};
  EXPECT_FALSE(ledger.Add(c, t, gates_decided, kStep, 1000));

  GateOutcome learned = gates_decided;
  learned.decision = {kTp, Reason::kAdaptive};
  learned.static_choice = kSp;
  ASSERT_TRUE(ledger.Add(c, t, learned, kStep, 1000));  // 5 s under TP-only, 10 s under SP
  EXPECT_NEAR(ledger.ratio(), 2.0, 1e-9);

  GateOutcome same = learned;  // ADAPTIVE and the gates agree: 10 s each
  same.decision = {kSp, Reason::kAdaptive};
  ASSERT_TRUE(ledger.Add(c, t, same, kStep, 2000));
  EXPECT_NEAR(ledger.ratio(), (10.0 + 20.0) / (5.0 + 20.0), 1e-9);

  GateOutcome unknown_band = learned;  // a band with no rates
  unknown_band.band = band + 1;
  EXPECT_FALSE(ledger.Add(c, t, unknown_band, kStep, 1000));
  EXPECT_NEAR(ledger.ratio(), 30.0 / 25.0, 1e-9);

  ledger.Clear();
  EXPECT_EQ(ledger.ratio(), 0.0);
}

}  // namespace
}  // namespace spgate
