// The ADAPTIVE policy (docs/design.md §11): bands, the learned table with forgetting and
// its sample floor, change detection, the static gates' choice as the incumbent it departs
// from only on confident evidence (the margin that prefers SP on TP-only's side),
// change-triggered exploration over a floor, the flip cap and the switch cost where one is
// measured, and pin and memory precedence. Pure: each case
// builds a table by hand or by observing steps, and asks for one decision or a run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <numeric>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "policy/band_pool.h"
#include "policy/exploration.h"
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
  c.adaptive_explore_floor = 0.004;
  c.adaptive_change_threshold = 0.05;
  c.adaptive_explore_boost_steps = 200;
  c.adaptive_flip_interval_steps = 50;
  return c;
}

// Adaptive() with another half-life (the table's tests).
GateConfig HalfLife(int64_t h) {
  GateConfig c = Adaptive();
  c.adaptive_half_life_steps = h;
  return c;
}

// A step outside the probe runs of the share (period 134) and of the floor (1000).
constexpr int64_t kStep = 1010;

// `n` samples of each mode at the given rates in `band`, ending at `step`.
ThroughputTable Learned(int band, double sp_rate, double tp_rate, int n = 50,
                        int64_t step = kStep - 1) {
  ThroughputTable t;
  for (int i = n - 1; i >= 0; --i) {
    t.Observe(Adaptive(), band, kSp, step - i, sp_rate, 1.0);
    t.Observe(Adaptive(), band, kTp, step - i, tp_rate, 1.0);
  }
  return t;
}

// The band's exploration share at `step`, over its estimate there.
double ShareOf(const GateConfig& c, const ThroughputTable* t, int band, int64_t step) {
  return ExploreShareOf(c, t, band, step, EstimateBand(c, t, band, step));
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
  const GateConfig c = HalfLife(100);
  EXPECT_TRUE(t.empty());
  t.Observe(c, 3, kSp, 10, 1000, 1.0);
  t.Observe(c, 3, kSp, 10, 3000, 1.0);  // same step: no decay between them
  const CellView v = t.At(c, 3, kSp, 10);
  EXPECT_DOUBLE_EQ(v.tokens_per_s, 2000.0);
  EXPECT_DOUBLE_EQ(v.samples, 2.0);
  EXPECT_EQ(t.At(c, 3, kTp, 10).samples, 0.0);
  EXPECT_EQ(t.At(c, 4, kSp, 10).samples, 0.0);
  EXPECT_EQ(t.newest_step(), 10);
}

TEST(ThroughputTableTest, WeightHalvesEveryHalfLife) {
  ThroughputTable t;
  const GateConfig c = HalfLife(50);
  t.Observe(c, 0, kTp, 100, 1000, 1.0);
  EXPECT_DOUBLE_EQ(t.At(c, 0, kTp, 150).samples, 0.5);
  EXPECT_DOUBLE_EQ(t.At(c, 0, kTp, 200).samples, 0.25);
  EXPECT_DOUBLE_EQ(t.At(c, 0, kTp, 90).samples, 1.0);  // reading the past: no growth
  // A late sample (another group behind) enters with the weight it has now.
  t.Observe(c, 0, kTp, 50, 3000, 1.0);
  EXPECT_DOUBLE_EQ(t.cell(0, kTp).weight, 1.5);
  EXPECT_DOUBLE_EQ(t.cell(0, kTp).tokens_per_s(), (1000 + 1500) / 1.5);
  EXPECT_EQ(t.cell(0, kTp).last_step, 100);
}

// The sample floor: a cell that had adaptive_min_samples never decays below them, so an
// estimate does not come to rest on one or two stale steps and one new sample moves it by
// at most 1 / (floor + 1); a cell that never had them decays as before.
TEST(ThroughputTableTest, ForgettingKeepsASampleFloor) {
  const GateConfig c = HalfLife(100);  // min_samples 8
  struct Case {
    const char* what;
    int samples;
    int64_t read_at;  // steps after the last sample
    double want;
  } cases[] = {
      {"50 samples, fresh", 50, 0, 50.0 / 1.0},
      {"50 samples, one half-life", 50, 100, 8.0},  // 50 decayed is 25 > 8: see below
      {"50 samples, ten half-lives", 50, 1000, 8.0},
      {"4 samples, two half-lives", 4, 200, 1.0},
      {"8 samples, ten half-lives", 8, 1000, 8.0},
      {"49 samples, ten half-lives: exactly the floor", 49, 1000, 8.0},
  };
  for (const Case& k : cases) {
    ThroughputTable t;
    for (int i = 0; i < k.samples; ++i) t.Observe(c, 2, kSp, 1000, 100, 1.0);  // same step
    const double got = t.At(c, 2, kSp, 1000 + k.read_at).samples;
    if (k.read_at == 100 && k.samples == 50) {
      EXPECT_DOUBLE_EQ(got, 25.0) << k.what;
    } else {
      EXPECT_EQ(got, k.want) << k.what;  // exactly: a band at the floor stays known
    }
  }
  // A stale estimate of 100 tokens/s (floored at 8), then one sample at 10: 1/9 of the way.
  ThroughputTable t;
  for (int i = 0; i < 50; ++i) t.Observe(c, 2, kSp, 1000, 100, 1.0);
  t.Observe(c, 2, kSp, 3000, 10, 1.0);
  EXPECT_NEAR(t.cell(2, kSp).tokens_per_s(), (8 * 100 + 10) / 9.0, 1e-9);
  EXPECT_DOUBLE_EQ(t.cell(2, kSp).weight, 9.0);
}

// Change detection: a sustained move of the rate beyond the threshold and the noise
// re-bases the cell on the recent samples and marks the band changed; noise of the same
// size, a single outlier, a move below the threshold or a cell with fewer than the floor's
// samples does not. A band back after a half-life without samples is marked changed.
TEST(ThroughputTableTest, DetectsChangesNotNoise) {
  const GateConfig c = HalfLife(2000);  // threshold 5 %, min_samples 8
  struct Case {
    const char* what;
    int before;           // samples at 100 tokens/s, alternating ±noise
    double noise;         // relative
    std::vector<double> after;  // the next samples' rates
    bool changed;
  } cases[] = {
      {"a drop to 70", 40, 0.0, std::vector<double>(12, 70), true},
      {"a rise to 130", 40, 0.0, std::vector<double>(12, 130), true},
      {"a drop to 70, not yet held for kChangeConfirmSamples", 40, 0.0,
       std::vector<double>(6, 70), false},
      {"a drop of 3 %, under the threshold", 40, 0.0, std::vector<double>(30, 97), false},
      {"one outlier", 40, 0.0, {40, 100, 100, 100, 100}, false},
      {"noise of ±20 %, its own size", 200, 0.2, {120, 80, 120, 80, 120, 80}, false},
      {"a drop of 10 % inside ±20 % noise", 200, 0.2, std::vector<double>(6, 90), false},
      {"a drop to 50 inside ±20 % noise", 200, 0.2, std::vector<double>(14, 50), true},
      {"too few samples before", 5, 0.0, {50, 50, 50}, false},
  };
  for (const Case& k : cases) {
    ThroughputTable t;
    int64_t step = 100;
    for (int i = 0; i < k.before; ++i, ++step) {
      t.Observe(c, 4, kTp, step, 100 * (1 + (i % 2 == 0 ? k.noise : -k.noise)), 1.0);
    }
    for (double r : k.after) t.Observe(c, 4, kTp, step++, r, 1.0);
    EXPECT_EQ(t.BandChangedStep(4) >= 0, k.changed) << k.what;
    EXPECT_EQ(t.changes() > 0, k.changed) << k.what << ": counted";
    if (k.changed) {
      // Re-based: the estimate is nearer the new rate than the old mean.
      const double est = t.cell(4, kTp).tokens_per_s();
      EXPECT_LT(std::abs(est - k.after.back()), std::abs(est - 100.0)) << k.what << " " << est;
      EXPECT_EQ(t.BandChangedStep(5), -1) << "other bands untouched";
    }
  }
  // Stragglers: every 7th step at half the rate, then a burst of them, 10 in a row, and
  // normal steps again. The burst carries the fast mean past the bound for 5 samples in a
  // row, not kChangeConfirmSamples: no change (with a change on the first sample beyond
  // the bound, this burst re-based the cell).
  ThroughputTable stragglers;
  int64_t step = 100;
  for (int i = 0; i < 200; ++i) stragglers.Observe(c, 4, kTp, step++, i % 7 == 6 ? 50 : 100, 1.0);
  for (int i = 0; i < 10; ++i) stragglers.Observe(c, 4, kTp, step++, 50, 1.0);
  EXPECT_LT(stragglers.cell(4, kTp).beyond, 0) << "beyond the bound, not yet held";
  for (int i = 0; i < 40; ++i) stragglers.Observe(c, 4, kTp, step++, i % 7 == 6 ? 50 : 100, 1.0);
  EXPECT_EQ(stragglers.BandChangedStep(4), -1) << "a straggler burst";
  EXPECT_EQ(stragglers.cell(4, kTp).beyond, 0) << "back inside the bound";
  // A band back after more than a half-life without samples.
  ThroughputTable t;
  for (int i = 0; i < 10; ++i) t.Observe(c, 7, kSp, 10 + i, 100, 1.0);
  t.Observe(c, 7, kSp, 2019, 100, 1.0);
  EXPECT_EQ(t.BandChangedStep(7), -1);
  t.Observe(c, 7, kSp, 4020, 100, 1.0);
  EXPECT_EQ(t.BandChangedStep(7), 4020);
}

// A change detected in one mode's cell is taken as the band's: a stale other mode's
// estimate (no sample within kPairGapSteps) moves by the factor the changed cell was
// re-based by, once between its own samples, so the running mode's detections cannot
// ratchet it; a cell sampled that lately is left to its own detector.
TEST(ThroughputTableTest, AChangeMovesTheOtherModeOnceBetweenItsSamples) {
  const GateConfig c = HalfLife(2000);  // threshold 5 %, min_samples 8
  ThroughputTable t;
  int64_t step = 100;
  for (int i = 0; i < 40; ++i, ++step) {
    t.Observe(c, 4, kSp, step, 100, 1.0);
    t.Observe(c, 4, kTp, step, 90, 1.0);
  }
  const double tp_weight = t.cell(4, kTp).weight;
  // SP's samples at `rate` until a change is detected; SP's estimate before the last one.
  double sp_before = 0;
  const auto drop_sp_to = [&](double rate) {
    const int64_t before = t.BandChangedStep(4);
    for (int i = 0; i < 20 && t.BandChangedStep(4) == before; ++i) {
      sp_before = t.cell(4, kSp).tokens_per_s();
      t.Observe(c, 4, kSp, step++, rate, 1.0);
    }
    return t.BandChangedStep(4) != before;
  };
  // SP drops to 70 and holds there: the detector re-bases SP and moves TP-only with it.
  ASSERT_TRUE(drop_sp_to(70));
  const double sp1 = t.cell(4, kSp).tokens_per_s(), tp1 = t.cell(4, kTp).tokens_per_s();
  EXPECT_LT(sp1, 85.0) << "SP re-based near its new rate";
  EXPECT_LT(tp1, 0.85 * 90) << "TP-only moved with it";
  // The factor: SP's re-based estimate (its sums less the detecting sample, 70 tokens in
  // 1 s) over its estimate before that sample.
  const ThroughputCell& sp = t.cell(4, kSp);
  const double factor = (sp.tokens - 70) / (sp.seconds - 1.0) / sp_before;
  EXPECT_NEAR(tp1, 90 * factor, 1e-9);
  EXPECT_DOUBLE_EQ(t.cell(4, kTp).weight, tp_weight) << "moved, not re-weighed";
  EXPECT_LT(t.cell(4, kTp).changed_step, t.BandChangedStep(4)) << "SP's change, not TP-only's";
  // A second drop before TP-only has a sample of its own: SP re-based, TP-only left.
  ASSERT_TRUE(drop_sp_to(45));
  EXPECT_LT(t.cell(4, kSp).tokens_per_s(), 0.8 * sp1);
  EXPECT_DOUBLE_EQ(t.cell(4, kTp).tokens_per_s(), tp1) << "no ratchet";
  // A TP-only sample since that change: the next change moves it again.
  t.Observe(c, 4, kTp, step++, tp1, 1.0);
  ASSERT_GT(kChangeConfirmSamples, kPairGapSteps) << "the next change finds it stale";
  const double tp2 = t.cell(4, kTp).tokens_per_s();
  ASSERT_TRUE(drop_sp_to(25));
  EXPECT_LT(t.cell(4, kTp).tokens_per_s(), 0.8 * tp2);
  // A cell sampled within kPairGapSteps of the change (here every kPairGapSteps steps)
  // is current: left.
  ThroughputTable now;
  step = 100;
  for (int i = 0; i < 40; ++i, ++step) {
    now.Observe(c, 4, kSp, step, 100, 1.0);
    now.Observe(c, 4, kTp, step, 90, 1.0);
  }
  for (int i = 0; i < 20 && now.BandChangedStep(4) < 0; ++i, ++step) {
    if (i % kPairGapSteps == 0) now.Observe(c, 4, kTp, step, 90, 1.0);
    now.Observe(c, 4, kSp, step, 70, 1.0);
  }
  ASSERT_GE(now.BandChangedStep(4), 0);
  EXPECT_LE(now.BandChangedStep(4) - now.cell(4, kTp).last_step, kPairGapSteps);
  EXPECT_NEAR(now.cell(4, kTp).tokens_per_s(), 90.0, 1e-9);
}

// Exploration's switches — into a probe or back from one — are charged to exploration: the
// step enters its cell less the switch cost measured before it (at most half the step
// off); any other switch's step enters as it ran. Before any switch was measured,
// exploration's step does not enter a cell under the sample floor, where it would carry
// the whole unmeasured cost.
TEST(ThroughputTableTest, ExplorationsSwitchesAreChargedToExploration) {
  const GateConfig c = HalfLife(1000);  // min_samples 8
  const auto measured = [&] {  // 100 tokens/s, a switch measured at 0.5 s (weight 20)
    ThroughputTable t;
    for (int i = 0; i < 10; ++i) t.Observe(c, 1, kSp, 10, 100, 1.0);
    t.SetSwitchCost(SwitchCostCell{0.5 * 20, 20, 10});
    return t;
  };
  ASSERT_NEAR(MeasuredSwitchCost(c, measured(), 10), 0.5, 1e-12);
  struct Case {
    const char* what;
    double seconds;
    bool exploration;
    double rate;  // the cell's after it
  } cases[] = {
      {"a probe's 1.5 s enters as 1.0 s", 1.5, true, 100.0},
      {"a chosen switch's 1.5 s enters as it ran", 1.5, false, 1100 / 11.5},
      {"no more than half the step comes off", 0.6, true, 1100 / 10.3},
  };
  for (const Case& k : cases) {
    ThroughputTable t = measured();
    EXPECT_TRUE(t.ObserveAfterSwitch(c, 1, kSp, 10, 100, k.seconds, k.exploration)) << k.what;
    EXPECT_NEAR(t.cell(1, kSp).tokens_per_s(), k.rate, 1e-9) << k.what;
    EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 11.0) << k.what;
  }
  ThroughputTable cold;
  EXPECT_FALSE(cold.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.5, /*exploration=*/true));
  EXPECT_EQ(cold.cell(1, kSp).weight, 0.0) << "exploration's, before any switch was measured";
  cold.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.5, /*exploration=*/false);
  EXPECT_DOUBLE_EQ(cold.cell(1, kSp).weight, 1.0) << "a chosen switch's enters";
  for (int i = 0; i < 8; ++i) cold.Observe(c, 2, kTp, 5, 100, 1.0);
  EXPECT_TRUE(cold.ObserveAfterSwitch(c, 2, kTp, 5, 100, 1.0, /*exploration=*/true))
      << "a free switch, measured against a cell at the floor";
  EXPECT_DOUBLE_EQ(cold.cell(2, kTp).weight, 9.0);
  cold.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.5, /*exploration=*/true);
  EXPECT_DOUBLE_EQ(cold.cell(1, kSp).weight, 2.0) << "a switch was measured: it enters";
}

// A forced step after a switch (the memory gate's SP for a batch TP-only cannot fit) enters
// its cell as it ran but measures no switch cost: the gate forces a band's largest batches,
// which take longer than its mean after a switch or not, and read as a cost where switching
// is free.
TEST(ThroughputTableTest, AForcedStepMeasuresNoSwitchCost) {
  const GateConfig c = HalfLife(1000);  // min_samples 8
  for (const bool forced : {false, true}) {
    ThroughputTable t;
    for (int i = 0; i < 10; ++i) t.Observe(c, 1, kSp, 10, 100, 1.0);  // 100 tokens/s
    // A batch 20 % slower than the band's mean, right after a switch, switching free.
    EXPECT_EQ(t.ObserveAfterSwitch(c, 1, kSp, 10, 100, 1.2, /*exploration=*/false, forced),
              !forced);
    EXPECT_NEAR(t.SwitchCostSeconds(), forced ? 0.0 : 0.2, 1e-9) << forced;
    EXPECT_NEAR(t.cell(1, kSp).tokens_per_s(), 1100 / 11.2, 1e-9) << "enters as it ran";
    EXPECT_EQ(t.switch_cost().last_step, forced ? -1 : 10);
  }
  // Through ObserveGroupStep, as the daemon and the simulator feed it.
  ThroughputTable t;
  for (int i = 0; i < 10; ++i) t.Observe(c, 1, kSp, 10, 100, 1.0);
  EXPECT_FALSE(ObserveGroupStep(c, t, {.band = 1, .mode = kSp, .step = 11, .tokens = 100,
                                       .seconds = 1.2, .after_switch = true, .forced = true}));
  EXPECT_EQ(t.SwitchCostSeconds(), 0.0);
}

// One absurd step time (a clock glitch) cannot make the detector inf or NaN, and a tiny
// exploration share cannot overflow the period.
TEST(ThroughputTableTest, AbsurdSamplesStayFinite) {
  const GateConfig c = HalfLife(1000);
  ThroughputTable t;
  for (int i = 0; i < 20; ++i) t.Observe(c, 2, kSp, 10 + i, 100, 1.0);
  t.Observe(c, 2, kSp, 40, 100, 1e-300);
  t.Observe(c, 2, kSp, 41, 100, 1.0);
  EXPECT_TRUE(std::isfinite(t.cell(2, kSp).drift));
  EXPECT_TRUE(std::isfinite(t.cell(2, kSp).noise));
  EXPECT_EQ(ExplorePeriod(1e-300), INT64_MAX);
  GateConfig tiny = c;
  tiny.adaptive_explore_floor = 1e-300;
  EXPECT_FALSE(MayExplore(tiny, 7));
}

// The first step after a switch: its excess over the cell's estimate is the switch's
// cost, and it enters the cell as it ran; against a cell under the sample floor nothing is
// measured.
TEST(ThroughputTableTest, LearnsTheSwitchCost) {
  const GateConfig c = HalfLife(1000);  // min_samples 8
  ThroughputTable t;
  EXPECT_EQ(t.SwitchCostSeconds(), 0.0);
  EXPECT_FALSE(t.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.0));  // no estimate: a sample
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 1.0);
  EXPECT_FALSE(t.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.0)) << "2 samples: under the floor";
  for (int i = 0; i < 8; ++i) t.Observe(c, 1, kSp, 5, 100, 1.0);  // 100 tokens/s, weight 10
  EXPECT_TRUE(t.ObserveAfterSwitch(c, 1, kSp, 5, 100, 1.5));      // 0.5 s over
  EXPECT_NEAR(t.SwitchCostSeconds(), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).tokens_per_s(), 1100.0 / 11.5) << "entered as it ran";
  // 200 tokens at 1100 / 11.5 tokens/s take 2.0909 s: 0.0091 s over.
  EXPECT_TRUE(t.ObserveAfterSwitch(c, 1, kSp, 5, 200, 2.1));
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 12.0);
  EXPECT_NEAR(t.cell(1, kSp).tokens_per_s(), 1300.0 / 13.6, 1e-9);
  EXPECT_NEAR(t.SwitchCostSeconds(), (0.5 + 2.1 - 200 * 11.5 / 1100) / 2, 1e-12);
  // Every step of a mode after a switch, one slow step first and then the switches free:
  // the cost falls back towards 0. (Entering the steps less the learned cost raised the
  // estimate by it, so the cost measured itself and stayed at 0.5 s.)
  ThroughputTable alternating;
  for (int i = 0; i < 8; ++i) alternating.Observe(c, 2, kTp, 19, 100, 1.0);
  alternating.ObserveAfterSwitch(c, 2, kTp, 19, 100, 1.5);
  ASSERT_NEAR(alternating.SwitchCostSeconds(), 0.5, 1e-12);
  for (int i = 0; i < 200; ++i) alternating.ObserveAfterSwitch(c, 2, kTp, 20 + i, 100, 1.0);
  EXPECT_LT(alternating.SwitchCostSeconds(), 0.05);
  EXPECT_EQ(t.switch_cost().last_step, 5);
  // Faster than the estimate on average: a cost of 0, never negative.
  ThroughputTable fast = t;
  for (int i = 0; i < 10; ++i) fast.ObserveAfterSwitch(c, 1, kSp, 6, 100, 0.5);
  EXPECT_EQ(fast.SwitchCostSeconds(), 0.0);
  EXPECT_FALSE(t.ObserveAfterSwitch(c, 1, kSp, 6, 100, std::nan("")));
}

// A slowdown of the whole job (a straggler burst) is no switch cost: the step after a
// switch is measured against its mode's estimate slowed as the mode left behind runs now
// (its fast mean of recent seconds), where that mode has the sample floor's weight and
// ran within kPairGapSteps. A cost on top still measures; a mode running faster than its
// estimate moves nothing (whether the entered cell took in the slowdown it came from is
// not known).
TEST(ThroughputTableTest, ASlowdownOfBothModesIsNoSwitchCost) {
  const GateConfig c = HalfLife(1000);  // min_samples 8
  ThroughputTable t;
  for (int i = 0; i < 200; ++i) {  // both modes at 100 tokens/s
    t.Observe(c, 1, kSp, i, 100, 1.0);
    t.Observe(c, 1, kTp, i, 100, 1.0);
  }
  // SP runs 4 % slower for 20 steps (under the change threshold: no re-base); its
  // estimate takes in a little of it, its fast mean most.
  ThroughputTable slow = t;
  for (int i = 200; i < 220; ++i) slow.Observe(c, 1, kSp, i, 100, 1.04);
  ASSERT_EQ(slow.cell(1, kSp).changed_step, -1);
  const double level = 1.0 + slow.cell(1, kSp).seconds_drift;
  ASSERT_GT(level, 1.03);
  // SP 4 % faster instead: its level is under 1.
  ThroughputTable fast = t;
  for (int i = 200; i < 220; ++i) fast.Observe(c, 1, kSp, i, 100, 0.96);
  ASSERT_LT(fast.cell(1, kSp).seconds_drift, -0.03);
  // TP-only's cell alone at the floor, SP's 3 samples, the last two 30 % slower.
  ThroughputTable thin;
  for (int i = 0; i < 200; ++i) thin.Observe(c, 1, kTp, i, 100, 1.0);
  thin.Observe(c, 1, kSp, 217, 100, 1.0);
  thin.Observe(c, 1, kSp, 218, 100, 1.3);
  thin.Observe(c, 1, kSp, 219, 100, 1.3);
  ASSERT_GT(thin.cell(1, kSp).seconds_drift, 0.04);
  struct Case {
    const char* what;
    const ThroughputTable& table;
    int64_t step;
    double seconds;
    double cost;
  } cases[] = {
      {"TP-only as slow as SP now, right after it", slow, 220, 1.04, 1.04 - level},
      {"and 0.5 s on top: that is the cost", slow, 220, 1.54, 1.54 - level},
      {"SP last ran 7 steps before: the estimate as it is", slow, 226, 1.04, 0.04},
      {"SP's newest sample 6 steps after (another group's): it counts", slow, 213, 1.04,
       1.04 - level},
      {"SP faster than its estimate: the estimate as it is", fast, 220, 1.02, 0.02},
      {"SP under the sample floor: the estimate as it is", thin, 220, 1.3, 0.3},
  };
  for (const Case& k : cases) {
    ThroughputTable after = k.table;
    EXPECT_TRUE(after.ObserveAfterSwitch(c, 1, kTp, k.step, 100, k.seconds)) << k.what;
    EXPECT_NEAR(after.SwitchCostSeconds(), k.cost, 1e-9) << k.what;
  }
  // What the level is for: the slowdown, 0.04 s, is mostly not taken for a cost (against
  // the estimate alone it all was: the third case).
  EXPECT_LT(1.04 - level, 0.01);
}

// Within adaptive_explore_boost_steps of a change detected in the band, a cell the change
// left from before it measures no switch: the re-based cell took in what changed (a long
// slowdown of the whole band re-bases the running mode, whose level is then 1 again), the
// other at most by the re-based cell's factor. The cell the change re-based measures, and
// so does the other after.
TEST(ThroughputTableTest, ACellFromBeforeTheBandsChangeMeasuresNoSwitch) {
  const GateConfig c = HalfLife(1000);  // boost 200 steps
  ThroughputTable t;
  for (int i = 0; i < 200; ++i) {
    t.Observe(c, 1, kSp, i, 100, 1.0);
    t.Observe(c, 1, kTp, i, 100, 1.0);
  }
  int64_t step = 200;
  for (; step < 260 && t.cell(1, kSp).changed_step < 0; ++step) {
    t.Observe(c, 1, kSp, step, 100, 1.5);
  }
  const int64_t changed = t.cell(1, kSp).changed_step;
  ASSERT_GE(changed, 200) << "SP 50 % slower: a change";
  ASSERT_EQ(t.BandChangedStep(1), changed);
  ThroughputTable tp_after = t;
  EXPECT_FALSE(tp_after.ObserveAfterSwitch(c, 1, kTp, step, 100, 1.5));
  EXPECT_EQ(tp_after.switch_cost().last_step, -1) << "nothing measured";
  EXPECT_EQ(tp_after.cell(1, kTp).last_step, step) << "the step still enters its cell";
  ThroughputTable sp_after = t;
  EXPECT_TRUE(sp_after.ObserveAfterSwitch(c, 1, kSp, step, 100, 1.5)) << "the re-based cell";
  ThroughputTable later = t;
  EXPECT_TRUE(later.ObserveAfterSwitch(c, 1, kTp, changed + 200, 100, 1.0))
      << "after the change's window";
}

// The one rule the daemon and the simulator feed their tables through: a step after a
// switch measures the switch (and enters its cell as it ran), any other is a sample; an
// SP step with a known length CV feeds the physics prior too, unless the caller keeps the
// prior out; a step whose band is not known teaches nothing.
TEST(ThroughputTableTest, AGroupStepIsASampleOrASwitchAndFeedsThePrior) {
  const GateConfig c = HalfLife(1000);  // min_samples 8
  ThroughputTable t;
  GroupStepSample x{.band = 1, .mode = kSp, .step = 5, .tokens = 100, .seconds = 1.0,
                    .length_cv = 0.1, .all_gather_s = 0.01, .rs_wait_s = 0.02};
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(ObserveGroupStep(c, t, x));
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 8.0);
  EXPECT_EQ(t.SwitchCostSeconds(), 0.0);
  EXPECT_DOUBLE_EQ(t.prior_sums().weight, 8.0) << "every SP step with its CV";

  GroupStepSample after = x;
  after.after_switch = true;
  after.seconds = 1.5;  // 0.5 s over the estimate
  EXPECT_TRUE(ObserveGroupStep(c, t, after));
  EXPECT_NEAR(t.SwitchCostSeconds(), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 9.0) << "entered as it ran";

  const ThroughputTable before = t;
  GroupStepSample unknown_cv = x;
  unknown_cv.length_cv = -1;
  ObserveGroupStep(c, t, unknown_cv);
  EXPECT_EQ(t.prior_sums(), before.prior_sums()) << "no CV: not the prior's";
  GroupStepSample tp = x;
  tp.mode = kTp;
  ObserveGroupStep(c, t, tp);
  EXPECT_EQ(t.prior_sums(), before.prior_sums()) << "TP-only: not the prior's";
  EXPECT_DOUBLE_EQ(t.cell(1, kSp).weight, 10.0);
  ObserveGroupStep(c, t, x, /*prior=*/false);
  EXPECT_EQ(t.prior_sums(), before.prior_sums()) << "the prior kept out";

  const ThroughputTable known = t;
  GroupStepSample no_band = after;
  no_band.band = -1;
  EXPECT_FALSE(ObserveGroupStep(c, t, no_band));
  EXPECT_EQ(t, known) << "no band: nothing learned, the prior included";
}

TEST(ThroughputTableTest, BadSamplesAreIgnored) {
  ThroughputTable t;
  const GateConfig c = HalfLife(10);
  t.Observe(c, 0, kSp, 1, 100, std::nan(""));
  t.Observe(c, 0, kSp, 1, 100, 0.0);
  t.Observe(c, 0, kSp, 1, 100, -1.0);
  t.Observe(c, 0, kSp, 1, -5, 1.0);
  t.Observe(c, 0, kSp, 1, INFINITY, 1.0);
  t.Observe(c, 0, kSp, -3, 100, 1.0);
  t.Observe(c, -1, kSp, 1, 100, 1.0);
  t.Observe(c, kBands, kSp, 1, 100, 1.0);
  t.ObserveAfterSwitch(c, kBands, kSp, 1, 100, 1.0);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t, ThroughputTable{});
}

// Exploitation: a departure from the gates' SP to TP-only only when TP-only beats SP by more
// than the margin; within it the gates' SP stands, with the gates' reason.
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
    EXPECT_EQ(out.decision,
              (Decision{k.want, k.want == kTp ? Reason::kAdaptive : Reason::kGatesPassed}))
        << k.tp_rate;
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
    for (int i = 0; i < 50; ++i) sparse.Observe(c, band, kSp, kStep - 1 - i, 100, 1);
    for (int i = 0; i < n; ++i) sparse.Observe(c, band, kTp, kStep - 1 - i, 200, 1);
    std::vector<GateCheck> trace;
    GateOutcome out =
        EvaluateAdaptive(c, GroupGateState{}, Batch(0.35), {}, std::nullopt, &sparse, &trace);
    EXPECT_EQ(out.decision, (Decision{kTp, Reason::kLengthCv})) << n;
    EXPECT_FALSE(out.static_choice.has_value());
    EXPECT_TRUE(std::any_of(trace.begin(), trace.end(), [](const GateCheck& g) {
      return g.gate == "prior" && g.outcome == "skip" &&
             g.detail.find("the gates' choice stands") != std::string::npos;
    }));
    // With no TP-only sample anywhere the prior predicts nothing: no ratio (it read 0).
    if (n == 0) {
      const auto prior = std::find_if(trace.begin(), trace.end(),
                                      [](const GateCheck& g) { return g.gate == "prior"; });
      ASSERT_NE(prior, trace.end());
      EXPECT_FALSE(prior->observed.has_value()) << prior->detail;
    }
    // A band with data elsewhere: still the prior.
    out = EvaluateAdaptive(c, GroupGateState{}, Batch(0.05), {}, std::nullopt, &t);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed}));
  }
  // A decayed table keeps its sample floor: 50 samples, 4 half-lives old, still decide.
  const ThroughputTable old = Learned(band, 100, 200, 50, kStep + 2000 - 1 - 4 * 500);
  ASSERT_EQ(old.newest_step(), kStep + 2000 - 1 - 4 * 500);
  const BatchFacts later = Batch(0.35, 4096, kStep + 2000);
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, later, {}, std::nullopt, &old).static_choice,
            kTp);
  // Null table: the prior.
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(0.05), {}, std::nullopt, nullptr).decision,
            (Decision{kSp, Reason::kGatesPassed}));
}

// With an empty table and no flip cap the ADAPTIVE policy is the STATIC one on every step
// but the exploration steps. With the cap, it holds the group's mode between the flips
// the cap allows.
TEST(EvaluateAdaptiveTest, EmptyTableIsTheStaticPolicyOutsideExploration) {
  GateConfig a = Adaptive();
  a.adaptive_flip_interval_steps = 1;
  const GateConfig s;
  GroupPolicyState ga, gs;
  const ThroughputTable empty;
  int compared = 0;
  for (int64_t step = 1; step < 600; ++step) {
    const BatchFacts f = Batch((step % 7) * 0.05, 4096, step);
    if (MayExplore(a, step)) continue;
    const GateOutcome oa = ga.Decide(a, f, std::nullopt, &empty);
    const GateOutcome os = gs.Decide(s, f, std::nullopt);
    ASSERT_EQ(oa.decision, os.decision) << step;
    ga.ObserveRsWaitShare(step, oa.decision.mode, 0.3 * (step % 3 == 0), a.window_steps);
    gs.ObserveRsWaitShare(step, os.decision.mode, 0.3 * (step % 3 == 0), s.window_steps);
    ++compared;
  }
  EXPECT_GT(compared, 500);
}

// A band still learning explores at the full share only while it carries kLearnMinTraffic
// (1/32) of the table's recent samples; a rarer one at the floor (its probe runs those of
// the floor's period alone). A new job's table (under 32 × adaptive_min_samples samples)
// counts every band as common.
TEST(EvaluateAdaptiveTest, ARareLearningBandExploresAtTheFloor) {
  GateConfig c = Adaptive();  // share 0.03 → period 134; floor 0.004 → period 1000
  c.adaptive_half_life_steps = 1000000;  // the table barely decays over the run
  const int common = BandOf(c, 0.05, 4096);
  const int rare = BandOf(c, 0.25, 4096);
  const int other = BandOf(c, 0.35, 4096);
  ASSERT_NE(common, rare);
  ASSERT_NE(common, other);
  ThroughputTable t;
  for (int i = 0; i < 150; ++i) {
    t.Observe(c, common, kSp, 5000 - i, 120, 1);
    t.Observe(c, common, kTp, 5000 - i, 100, 1);
  }
  // 300 samples in all, 300 / (32 × 8) ≥ 1: no longer a new job's table.
  for (int i = 0; i < 5; ++i) t.Observe(c, rare, kTp, 5000 - i, 100, 1);
  EXPECT_NEAR(BandTrafficShare(c, t, rare, 5000), 5.0 / 305, 1e-4);
  EXPECT_NEAR(BandTrafficShare(c, t, common, 5000), 300.0 / 305, 1e-4);
  EXPECT_EQ(BandTrafficShare(c, t, other, 5000), 0);
  EXPECT_EQ(BandTrafficShare(c, t, -1, 5000), 0);
  EXPECT_EQ(ShareOf(c, &t, rare, 5000), 0.004);
  EXPECT_EQ(ShareOf(c, &t, other, 5000), 0.004);
  // Twenty samples of 325 (6 %) make it common enough to learn at the full share.
  ThroughputTable busier = t;
  for (int i = 5; i < 20; ++i) busier.Observe(c, rare, kTp, 5000 - i, 100, 1);
  EXPECT_GE(BandTrafficShare(c, busier, rare, 5000), kLearnMinTraffic);
  EXPECT_EQ(ShareOf(c, &busier, rare, 5000), 0.03);
  // The bound itself, 1/32: 30 samples of 1,000 learn at the floor, 32 at the share.
  for (const auto& [in_rare, want] : {std::pair<int, double>{30, 0.004}, {32, 0.03}}) {
    ThroughputTable edge;
    const int per_mode = (1000 - in_rare) / 2;
    for (int i = 0; i < per_mode; ++i) {
      edge.Observe(c, common, kSp, 5000 - i, 120, 1);
      edge.Observe(c, common, kTp, 5000 - i, 100, 1);
    }
    for (int i = 0; i < in_rare; ++i) edge.Observe(c, rare, kTp, 5000 - i, 100, 1);
    EXPECT_NEAR(BandTrafficShare(c, edge, rare, 5000), in_rare / 1000.0, 1e-3) << in_rare;
    EXPECT_EQ(ShareOf(c, &edge, rare, 5000), want) << in_rare;
  }
  // Recent, not all-time: 2,000 samples of the common band at step 1,000 and 40 of the
  // rare one at 1,500 weigh 1,000 against 40 at 1,500 under a half-life of 500 (3.8 %: the
  // share), 2,000 against 40 under the long one (2.0 %: the floor).
  ThroughputTable aged;
  for (int i = 0; i < 1000; ++i) {
    aged.Observe(c, common, kSp, 1000, 120, 1);
    aged.Observe(c, common, kTp, 1000, 100, 1);
  }
  for (int i = 0; i < 40; ++i) aged.Observe(c, rare, kTp, 1500, 100, 1);
  GateConfig short_half_life = c;
  short_half_life.adaptive_half_life_steps = 500;
  EXPECT_NEAR(BandTrafficShare(short_half_life, aged, rare, 1500), 40.0 / 1040, 1e-3);
  EXPECT_EQ(ShareOf(short_half_life, &aged, rare, 1500), 0.03);
  EXPECT_NEAR(BandTrafficShare(c, aged, rare, 1500), 40.0 / 2040, 1e-3);
  EXPECT_EQ(ShareOf(c, &aged, rare, 1500), 0.004);
  // A new job's table: every band learns at the share.
  ThroughputTable young;
  for (int i = 0; i < 100; ++i) young.Observe(c, common, kSp, 5000 - i, 120, 1);
  EXPECT_EQ(BandTrafficShare(c, young, rare, 5000), 1);
  EXPECT_EQ(ShareOf(c, &young, rare, 5000), 0.03);
  // Decided (CV 0.25: the gates run TP-only): the rare band's batches probe SP, its
  // less-sampled mode, in the floor's runs only; the busier one's in the share's.
  // The floor's first run comes a period in (ExploreOffset).
  struct Schedule {
    const ThroughputTable* table;
    int64_t period, offset;
  };
  for (const Schedule& k : {Schedule{&t, 1000, 1000}, Schedule{&busier, 134, 0}}) {
    GroupPolicyState g;
    int64_t probes = 0;
    for (int64_t step = 5001; step < 7001; ++step) {
      const GateOutcome out = g.Decide(c, Batch(0.25, 4096, step), std::nullopt, k.table);
      if (out.decision.reason != Reason::kProbe) continue;
      ++probes;
      EXPECT_TRUE(out.explored);
      EXPECT_EQ(out.decision.mode, kSp) << step;
      EXPECT_TRUE(InProbeRun(step, k.period, k.offset)) << k.period << " " << step;
    }
    int64_t due = 0;
    for (int64_t step = 5001; step < 7001; ++step) due += InProbeRun(step, k.period, k.offset);
    EXPECT_EQ(probes, due) << k.period;
  }
}

// Exploration: only in the probe runs of the band's period, the mode not chosen: at the floor
// while the band is stable, at the full share while it learns or within
// adaptive_explore_boost_steps of a change in it, then at the floor again.
TEST(EvaluateAdaptiveTest, ExplorationRisesAfterAChangeAndFallsToTheFloor) {
  GateConfig c = Adaptive();  // share 0.03 → period 134; floor 0.004 → period 1000
  c.adaptive_half_life_steps = 1000000;  // the table barely decays over the run
  EXPECT_EQ(ExplorePeriod(c.adaptive_explore_share), 134);
  EXPECT_EQ(ExplorePeriod(c.adaptive_explore_floor), 1000);
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable stable;
  for (int i = 0; i < 100; ++i) {
    stable.Observe(c, band, kSp, 10000 - i, 120, 1);
    stable.Observe(c, band, kTp, 10000 - i, 100, 1);
  }
  ASSERT_EQ(stable.BandChangedStep(band), -1);
  ThroughputTable changed = stable;  // TP-only got 30 % slower at step 10001
  for (int i = 1; i <= 12; ++i) changed.Observe(c, band, kTp, 10000 + i, 70, 1);
  const int64_t at = changed.BandChangedStep(band);  // held for kChangeConfirmSamples
  ASSERT_GT(at, 10000 + kChangeConfirmSamples);
  ASSERT_LE(at, 10012);
  // The same, with a switch's cost measured (the cap binds only then).
  ThroughputTable costly = changed;
  costly.SetSwitchCost(SwitchCostCell{.seconds = 0.4, .weight = 4, .last_step = at});
  ASSERT_GT(MeasuredSwitchCost(c, costly, at), 0.0);
  struct Case {
    const char* what;
    const ThroughputTable* table;
    int64_t from, to;
    int64_t period;
    int64_t offset;  // the floor's first run comes a period in; a change's, at once
    int64_t flip_interval;
    int64_t probes;  // -1: every step due
  } cases[] = {
      {"stable band: the floor", &stable, 10005, 20000, 1000, 1000, 50, -1},
      // Switching free: the first run at once, from the step after the change.
      {"within the boost after a change: the share", &changed, at, at + 200, 134, at + 1, 1,
       -1},
      {"within the boost, a cap of 2 switches in 200, switching free: every run", &changed, at,
       at + 200, 134, at + 1, 100, -1},
      // A measured cost: the share's own runs (pairs do not end a re-learning; a run at
      // once would pay the cost for nothing).
      {"within the boost, a cap of 2 switches in 200, a measured cost: one run", &costly, at,
       at + 200, 134, 0, 100, 4},
      {"after the boost: the floor", &changed, at + 200, 20000, 1000, 1000, 50, -1},
  };
  for (const Case& k : cases) {
    c.adaptive_flip_interval_steps = k.flip_interval;
    GroupPolicyState g;
    int64_t probes = 0, steps = 0, first = -1;
    for (int64_t step = k.from; step < k.to; ++step, ++steps) {
      const GateOutcome out = g.Decide(c, Batch(0.05, 4096, step), std::nullopt, k.table);
      if (out.decision.reason == Reason::kProbe) {
        if (first < 0) first = step;
        ++probes;
        EXPECT_EQ(out.decision.mode, kTp) << k.what << " " << step;
        EXPECT_TRUE(InProbeRun(step, k.period, k.offset)) << k.what << " " << step;
      } else {
        EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed})) << k.what << " " << step;
      }
    }
    int64_t due = 0;
    for (int64_t step = k.from; step < k.to; ++step) {
      due += InProbeRun(step, k.period, k.offset);
    }
    EXPECT_GT(due, 0) << k.what;
    EXPECT_EQ(probes, k.probes < 0 ? due : k.probes) << k.what;
    if (k.offset == at + 1) {
      EXPECT_EQ(first, at + 1) << k.what << ": explores at once";
    }
    EXPECT_LE(static_cast<double>(probes),
              static_cast<double>(steps) * kProbeRunSteps / k.period + kProbeRunSteps)
        << k.what;
  }
  // The floor is at most the share; a share of 1 explores every step.
  GateConfig all = c;
  all.adaptive_explore_share = 0.001;
  EXPECT_EQ(ShareOf(all, &stable, band, 20000), 0.001);
  EXPECT_EQ(ExplorePeriod(1.0), kProbeRunSteps);
  EXPECT_EQ(ExplorePeriod(1e-6), 4000000);
  // An unknown band of a table under 32 × 8 samples learns at the share; no table at all
  // too (ARareLearningBandExploresAtTheFloor has the larger tables).
  EXPECT_EQ(BandTrafficShare(c, stable, band + 1, 20000), 1);  // 200 samples in all
  EXPECT_EQ(ShareOf(c, &stable, band + 1, 20000), 0.03);
  EXPECT_EQ(ExploreShareOf(c, nullptr, band, 20000, BandEstimate{}), 0.03);
  // The same inputs give the same decisions: a second group agrees step for step.
  c.adaptive_flip_interval_steps = 50;
  GroupPolicyState g2, g3;
  for (int64_t step = 30000; step < 30600; ++step) {
    EXPECT_EQ(g2.Decide(c, Batch(0.05, 4096, step), std::nullopt, &changed).decision,
              g3.Decide(c, Batch(0.05, 4096, step), std::nullopt, &changed).decision);
  }
}

// The floor's first probe run comes a period into the job: its bands learn in the share's
// first run (steps 0-3), and a band known by step 1 is not probed again at steps 2-3 by a
// floor run that also began at 0; it is re-measured at the end of the floor's first period.
TEST(EvaluateAdaptiveTest, TheFloorsFirstRunComesAPeriodIn) {
  const GateConfig c = Adaptive();  // share 0.03 → period 134; floor 0.004 → period 1000
  EXPECT_EQ(ExploreOffset(c, c.adaptive_explore_share), 0);
  EXPECT_EQ(ExploreOffset(c, c.adaptive_explore_floor), 1000);
  EXPECT_EQ(ExploreOffset(c, 1e-300), INT64_MAX);  // a floor too small to have a period
  // The first run of a schedule starts its first period; later ones at ProbeRunStart.
  const int64_t second = 2000 + ProbeRunStart(1, 1000), third = 3000 + ProbeRunStart(2, 1000);
  for (int64_t step : {int64_t{1000}, int64_t{1003}, second, second + 3, third + 3}) {
    EXPECT_TRUE(InProbeRun(step, 1000, 1000)) << step;
    EXPECT_TRUE(MayExplore(c, step)) << step;
  }
  for (int64_t step : {int64_t{0}, int64_t{3}, int64_t{500}, int64_t{1004}, int64_t{1999},
                       second - 1, second + 4}) {
    EXPECT_FALSE(InProbeRun(step, 1000, 1000)) << step;
  }
  EXPECT_TRUE(InProbeRun(2, 134, 0));  // the share's first run
  EXPECT_TRUE(StartsProbeRun(second, 1000, 1000));
  EXPECT_FALSE(StartsProbeRun(second + 1, 1000, 1000));
  EXPECT_FALSE(StartsProbeRun(0, 1000, 1000));  // before the first run
  const int64_t share_second = 134 + ProbeRunStart(1, 134);  // the share's second run
  EXPECT_TRUE(MayExplore(c, share_second + 2));
  EXPECT_FALSE(InProbeRun(share_second + 4, 134)) << "a run is kProbeRunSteps long";
  EXPECT_FALSE(MayExplore(c, kStep)) << "kStep is outside every run";

  // A stable known band from step 0: no probe in the share's first run, four in the
  // floor's at 1000-1003, the mode not chosen.
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable known;
  for (int i = 0; i < 50; ++i) {
    known.Observe(c, band, kSp, 0, 120, 1);
    known.Observe(c, band, kTp, 0, 100, 1);
  }
  GroupPolicyState g;
  std::vector<int64_t> probed;
  for (int64_t step = 0; step < 1500; ++step) {
    const GateOutcome out = g.Decide(c, Batch(0.05, 4096, step), std::nullopt, &known);
    if (out.decision.reason != Reason::kProbe) continue;
    probed.push_back(step);
    EXPECT_EQ(out.decision.mode, kTp) << step;
  }
  EXPECT_EQ(probed, (std::vector<int64_t>{1000, 1001, 1002, 1003}));
  // A floor too small to have a period never probes the band, at step 0 either.
  GateConfig tiny = c;
  tiny.adaptive_explore_floor = 1e-300;
  GroupPolicyState t;
  for (int64_t step = 0; step < 1500; ++step) {
    EXPECT_NE(t.Decide(tiny, Batch(0.05, 4096, step), std::nullopt, &known).decision.reason,
              Reason::kProbe)
        << step;
  }
}

// Each period has one run of kProbeRunSteps steps, at a place a pure function of the
// period's number picks (the same for the daemon and every fallback), where the whole run
// fits. Fixed places aliased with anything periodic in a job: at the defaults the floor's
// period is 1,600 steps, and a neighbour's burst of stragglers every 400 steps put every
// floor run at the burst's start, so a mode measured only there was measured slow.
TEST(ExplorationScheduleTest, RunsFallAtPseudoRandomPlacesInTheirPeriods) {
  for (int64_t period : {int64_t{4}, int64_t{5}, int64_t{134}, int64_t{1600}}) {
    EXPECT_EQ(ProbeRunStart(0, period), 0) << period;
    for (int64_t k = 0; k < 300; ++k) {
      const int64_t at = ProbeRunStart(k, period);
      ASSERT_GE(at, 0) << period << " " << k;
      ASSERT_LE(at, period - kProbeRunSteps) << period << " " << k;
      int64_t in_run = 0;
      for (int64_t step = k * period; step < (k + 1) * period; ++step) {
        in_run += InProbeRun(step, period);
        EXPECT_EQ(StartsProbeRun(step, period), step == k * period + at) << period << " " << step;
      }
      ASSERT_EQ(in_run, kProbeRunSteps) << period << " " << k;
    }
  }
  EXPECT_EQ(ProbeRunStart(7, 4), 0) << "a period of one run has one place";
  EXPECT_EQ(ProbeRunStart(7, INT64_MAX), 0);
  // The floor's 1,600 steps against a 400-step cycle whose first 100 are a burst: runs in
  // the burst about as often as the burst's share of the time (all of them, fixed).
  int64_t in_burst = 0;
  const int64_t runs = 400;
  for (int64_t k = 1; k <= runs; ++k) in_burst += (k * 1600 + ProbeRunStart(k, 1600)) % 400 < 100;
  EXPECT_GT(in_burst, runs / 8);
  EXPECT_LT(in_burst, runs * 3 / 8);
  // The places spread over the period (a constant or a few values would alias as fixed
  // places do): of 300 runs of the share's 134-step period, many distinct places, and
  // their mean near the middle of the 131 a run can start at.
  std::vector<int64_t> places;
  for (int64_t k = 1; k <= 300; ++k) places.push_back(ProbeRunStart(k, 134));
  const double mean =
      static_cast<double>(std::accumulate(places.begin(), places.end(), int64_t{0})) / 300;
  std::sort(places.begin(), places.end());
  EXPECT_GT(std::unique(places.begin(), places.end()) - places.begin(), 100);
  EXPECT_NEAR(mean, 65.0, 10.0);
}

// A known band whose estimates lean to the mode the gates did not choose by more than the
// margin, without the confidence to depart, explores at the full share where switching is
// free (its samples of that mode cost nothing expected and settle the question); one that
// leans the gates' way, or where a switch's cost is measured, stays at the floor.
TEST(EvaluateAdaptiveTest, AnUndecidedBandLeaningToTheOtherModeExploresAtTheShare) {
  GateConfig c = Adaptive();
  c.adaptive_half_life_steps = 1000000;
  const int band = BandOf(c, 0.25, 4096);  // CV 0.25: the gates run TP-only
  // SP 4 % ahead (the margin is 2 %) on 12 noisy samples (a 20 % spread): not enough to
  // depart; TP-only well measured. And the other way round.
  const auto noisy = [&](double sp_rate, double tp_rate) {
    ThroughputTable t;
    for (int i = 0; i < 200; ++i) t.Observe(c, band, kTp, 5000 - 200 + i, tp_rate, 1.0);
    for (int i = 0; i < 12; ++i) {
      t.Observe(c, band, kSp, 5000 - 400 + i, sp_rate * (i % 2 ? 1.2 : 0.8), 1.0);
    }
    return t;
  };
  const ThroughputTable leans_sp = noisy(104, 100), leans_tp = noisy(96, 100);
  const ThroughputTable costly = [&] {  // a switch costs 0.1 s: each probe run pays it twice
    ThroughputTable t = leans_sp;
    t.SetSwitchCost(SwitchCostCell{.seconds = 0.4, .weight = 4, .last_step = 4999});
    return t;
  }();
  ASSERT_GT(MeasuredSwitchCost(c, costly, 5000), 0.0);
  for (const ThroughputTable* t : {&leans_sp, &leans_tp, &costly}) {
    const BandEstimate e = EstimateBand(c, t, band, 5000);
    ASSERT_TRUE(e.known) << "a known band: not the learning share";
    ASSERT_FALSE(Relearning(c, *t, band, 5000, e));
  }
  for (const auto& [table, share, what] :
       {std::tuple{&leans_sp, c.adaptive_explore_share, "leans to SP"},
        std::tuple{&leans_tp, c.adaptive_explore_floor, "leans to the gates' TP-only"},
        std::tuple{&costly, c.adaptive_explore_floor, "leans to SP, a switch's cost measured"}}) {
    GroupPolicyState g;
    int64_t probes = 0;
    for (int64_t step = 5000; step < 7000; ++step) {
      const GateOutcome out = g.Decide(c, Batch(0.25, 4096, step), std::nullopt, table);
      ASSERT_NE(out.decision, (Decision{kSp, Reason::kAdaptive})) << what << ": no departure";
      if (out.decision.reason != Reason::kProbe) continue;
      ++probes;
      EXPECT_EQ(out.decision.mode, kSp) << what;
      EXPECT_TRUE(InProbeRun(step, ExplorePeriod(share), ExploreOffset(c, share)))
          << what << " " << step;
    }
    EXPECT_GT(probes, 0) << what << ": the floor's runs explore too";
    EXPECT_NEAR(static_cast<double>(probes) / 2000, share, 0.01) << what;
  }
}

// The flip cap: at most two switches in any 2 × adaptive_flip_interval_steps decisions,
// whatever asks for them, where a switch's cost is measured; where switching is free it
// does not bind; a probe only when the switch back is left too; a flip the memory gate or
// a pin forces is never held but counts.
TEST(EvaluateAdaptiveTest, FlipCapBoundsSwitches) {
  struct Case {
    const char* what;
    int64_t interval;
    std::vector<int64_t> switches;  // decision indices of earlier switches
    int64_t next;                   // the next decision's index
    int flips;
    bool allowed;
  } cases[] = {
      {"no switches yet", 50, {}, 10, 1, true},
      {"one switch 10 ago", 50, {0}, 10, 1, true},
      {"two switches within 100", 50, {0, 5}, 10, 1, false},
      {"two switches, the older 100 ago", 50, {0, 5}, 100, 1, true},
      {"two switches, the older 99 ago", 50, {1, 5}, 100, 1, false},
      {"a probe (out and back), one recent switch", 50, {0, 60}, 100, 2, false},
      {"a probe whose way back has 3 switches in 100", 50, {0, 2}, 100, 2, false},
      {"a probe, both earlier switches old enough", 50, {0, 1}, 100, 2, true},
      {"interval 1: any switch", 1, {8, 9}, 10, 2, true},
  };
  for (const Case& k : cases) {
    GateConfig c = Adaptive();
    c.adaptive_flip_interval_steps = k.interval;
    GroupGateState s;
    s.has_decision = s.has_chosen_mode = true;
    s.decisions = k.next;
    if (k.switches.size() >= 1) s.last_switch_at = k.switches.back();
    if (k.switches.size() >= 2) s.prev_switch_at = k.switches[k.switches.size() - 2];
    EXPECT_EQ(FlipsAllowed(c, s, k.flips), k.allowed) << k.what;
  }

  // A run: the band's preference alternates every 10 steps (the table is swapped). With a
  // switch's cost measured (1 s, against a saving of ~13 s a batch) a group under the cap
  // switches at most twice in any 100 decisions; with switching free the same cap does not
  // bind and the group follows every change.
  const GateConfig capped = Adaptive();
  const int band = BandOf(capped, 0.05, 4096);
  const ThroughputTable tp_free = Learned(band, 100, 150, 50, 999);
  const ThroughputTable sp_free = Learned(band, 150, 100, 50, 999);
  const SwitchCostCell one_second{.seconds = 4.0, .weight = 4, .last_step = 999};
  ThroughputTable tp_better = tp_free, sp_better = sp_free;
  tp_better.SetSwitchCost(one_second);
  sp_better.SetSwitchCost(one_second);
  ASSERT_NEAR(MeasuredSwitchCost(capped, tp_better, 1000), 1.0, 1e-12);
  ASSERT_EQ(MeasuredSwitchCost(capped, tp_free, 1000), 0.0);
  for (const bool free : {false, true}) {
    GroupPolicyState g;
    std::vector<int64_t> switch_steps;
    int held = 0;
    for (int64_t step = 1001; step < 2001; ++step) {
      if (MayExplore(capped, step)) continue;
      const bool tp_phase = (step / 10) % 2 == 0;
      const ThroughputTable& t =
          free ? (tp_phase ? tp_free : sp_free) : (tp_phase ? tp_better : sp_better);
      const int64_t before = g.gate().mode_switches;
      const GateOutcome out = g.Decide(capped, Batch(0.05, 4096, step), std::nullopt, &t);
      held += out.flip_held;
      if (g.gate().mode_switches != before) switch_steps.push_back(g.gate().decisions - 1);
    }
    if (free) {
      EXPECT_GT(switch_steps.size(), 90u);
      EXPECT_EQ(held, 0);
    } else {
      EXPECT_GT(held, 0);
      for (size_t i = 2; i < switch_steps.size(); ++i) {
        EXPECT_GE(switch_steps[i] - switch_steps[i - 2], 100) << i;
      }
      EXPECT_LE(switch_steps.size(), 2u + 990u / 50u);
    }
  }

  // Memory forces a flip the cap would hold: never held, and exempt from the cap (it
  // switches the group but not the mode the policy chose), so is the way back.
  GroupGateState s;
  s.has_decision = true;
  s.mode = kTp;
  s.has_chosen_mode = true;
  s.chosen_mode = kTp;
  s.decisions = 10;
  s.last_switch_at = 9;
  s.prev_switch_at = 8;
  BatchFacts tight = Batch();
  tight.memory_budget_bytes = 1000;
  tight.predicted_peak_bytes_sp = 500;
  tight.predicted_peak_bytes_tp = 950;
  const GateOutcome forced = EvaluateAdaptive(capped, s, tight, {}, std::nullopt, &tp_better);
  EXPECT_EQ(forced.decision, (Decision{kSp, Reason::kMemoryRequiresSp}));
  EXPECT_FALSE(forced.flip_held);
  EXPECT_EQ(forced.next.last_switch_at, 9);
  EXPECT_EQ(forced.next.chosen_mode, kTp);
  EXPECT_EQ(forced.next.mode_switches, 1);
  const GateOutcome back =
      EvaluateAdaptive(capped, forced.next, Batch(), {}, std::nullopt, &tp_better);
  EXPECT_EQ(back.decision, (Decision{kTp, Reason::kAdaptive})) << "the way back is not held";
  EXPECT_FALSE(back.flip_held);
  EXPECT_EQ(back.next.mode_switches, 2);
  EXPECT_EQ(back.next.last_switch_at, 9);
  // ... and a pin too.
  EXPECT_EQ(EvaluateAdaptive(capped, s, Batch(), {}, PinDirective(kSp), &tp_better).decision,
            (Decision{kSp, Reason::kPinned}));
  // Without a flip left, a TP-only group stays TP-only although the band prefers SP.
  std::vector<GateCheck> trace;
  const GateOutcome kept = EvaluateAdaptive(capped, s, Batch(), {}, std::nullopt, &sp_better, &trace);
  EXPECT_EQ(kept.decision, (Decision{kTp, Reason::kAdaptive}));
  EXPECT_TRUE(kept.flip_held);
  EXPECT_EQ(trace.back().gate, "flip_cap");
  // The same group with switching free: nothing holds it in the slower mode.
  const GateOutcome moved = EvaluateAdaptive(capped, s, Batch(), {}, std::nullopt, &sp_free);
  EXPECT_EQ(moved.decision, (Decision{kSp, Reason::kGatesPassed}));
  EXPECT_FALSE(moved.flip_held);
}

// What a hold never does: switch the group (after a forced decision the group may already
// run the choice); weigh a switch's cost where the band has no estimates and the prior no
// prediction (the gates' switches obey the cap alone; with a prediction they pay for the
// cost, cost_prior_test.cc); keep the group in a probed mode after the probe run.
TEST(EvaluateAdaptiveTest, HoldsNeverSwitchOrStrand) {
  const GateConfig c = Adaptive();
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable t = Learned(band, 150, 100, 50, kStep - 1);  // SP preferred
  for (int i = 0; i < 4; ++i) t.ObserveAfterSwitch(c, band, kSp, kStep - 1, 4096, 4096 / 150.0 + 5);
  ASSERT_GT(t.SwitchCostSeconds(), 1.0);
  // Memory forced SP on a group that had chosen TP-only, the cap exhausted: SP runs on.
  GroupGateState forced;
  forced.has_decision = forced.has_chosen_mode = true;
  forced.mode = kSp;
  forced.reason = Reason::kMemoryRequiresSp;
  forced.chosen_mode = kTp;
  forced.decisions = 100;
  forced.last_switch_at = 99;
  forced.prev_switch_at = 98;
  ASSERT_GT(MeasuredSwitchCost(c, t, kStep), 1.0);
  GateOutcome out = EvaluateAdaptive(c, forced, Batch(), {}, std::nullopt, &t);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed}));
  EXPECT_FALSE(out.flip_held);
  // An unknown band (CV 0.35: the gates say TP-only) with a large learned cost and no
  // prediction (no SP collectives for the prior): the cap allows the switch, so it happens.
  ASSERT_FALSE(PriorOf(c, &t, Batch(0.35)).has);
  GroupGateState sp;
  sp.has_decision = sp.has_chosen_mode = true;
  sp.mode = sp.chosen_mode = kSp;
  sp.decisions = 100;
  out = EvaluateAdaptive(c, sp, Batch(0.35), {}, std::nullopt, &t);
  EXPECT_EQ(out.decision, (Decision{kTp, Reason::kLengthCv}));
  EXPECT_FALSE(out.flip_held);
  // After a probe run in TP-only, the way back to SP is not weighed against the cost.
  GroupGateState probed = sp;
  probed.mode = probed.chosen_mode = kTp;
  probed.reason = Reason::kProbe;
  probed.last_switch_at = 96;
  out = EvaluateAdaptive(c, probed, Batch(), {}, std::nullopt, &t);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed}));
  EXPECT_FALSE(out.flip_held);
}

// A held group's probe run and its way back (design.md §11, "A probe run is an
// excursion"). The band at CV 0.35, where the gates say TP-only: learned in both modes,
// TP-only 3 % ahead (not beyond the margin), then SP alone, 20 % slower, until its cell
// detects the change; TP-only's cell is from before it (moved by SP's factor). A switch
// costs 100 s, measured in another band: a switch to TP-only never pays, so a group on SP
// is held there.
struct HeldBand {
  GateConfig c = Adaptive();
  int band = BandOf(Adaptive(), 0.35, 4096);
  ThroughputTable t;
  int64_t changed = -1;  // the band's change; -1: no change (SP never slowed)
};

HeldBand HeldOffStaleTpOnly(bool change, double tp_rate = 103) {
  HeldBand h;
  const int costly = BandOf(h.c, 0.05, 4096);
  for (int64_t s = 0; s < 300; ++s) {
    h.t.Observe(h.c, h.band, kSp, s, 4096, 4096 / 100.0);
    h.t.Observe(h.c, h.band, kTp, s, 4096, 4096 / tp_rate);
    h.t.Observe(h.c, costly, kSp, s, 4096, 4096 / 100.0);
  }
  h.t.ObserveAfterSwitch(h.c, costly, kSp, 300, 4096, 4096 / 100.0 + 100);
  for (int64_t s = 301; s < 340 && h.t.BandChangedStep(h.band) < 0; ++s) {
    h.t.Observe(h.c, h.band, kSp, s, 4096, 4096 / (change ? 80.0 : 100.0));
  }
  h.changed = h.t.BandChangedStep(h.band);
  return h;
}

// The first step at or after `from` that starts one of the band's probe runs where a
// switch's cost is measured (no lean, no re-learning run at once).
int64_t NextProbeRun(const HeldBand& h, int64_t from) {
  for (int64_t s = from; s < from + 5000; ++s) {
    const double share = ShareOf(h.c, &h.t, h.band, s);
    const int64_t period = ExplorePeriod(share);
    if (MayExplore(h.c, s) && period > 0 && StartsProbeRun(s, period, ExploreOffset(h.c, share)))
      return s;
  }
  return -1;
}

GroupGateState OnSp(int64_t last_step) {
  GroupGateState s;
  s.has_decision = s.has_chosen_mode = true;
  s.mode = s.chosen_mode = kSp;
  s.reason = Reason::kAdaptive;
  s.decisions = 500;
  s.last_step = last_step;
  return s;
}

bool HasCheck(const std::vector<GateCheck>& trace, const char* gate, const char* text = "") {
  return std::any_of(trace.begin(), trace.end(), [&](const GateCheck& g) {
    return g.gate == gate && g.outcome == "fire" && g.detail.find(text) != std::string::npos;
  });
}

TEST(EvaluateAdaptiveTest, AHeldGroupProbesTheModeItIsKeptOffWhereItsEstimateIsStale) {
  for (const bool change : {true, false}) {
    SCOPED_TRACE(change ? "TP-only's estimate from before the band's change"
                        : "no change: TP-only's estimate is the band's");
    const HeldBand h = HeldOffStaleTpOnly(change);
    ASSERT_EQ(h.changed >= 0, change);
    ASSERT_GT(MeasuredSwitchCost(h.c, h.t, 400), 50.0);
    ASSERT_TRUE(EstimateBand(h.c, &h.t, h.band, 400).known);
    ASSERT_EQ(h.t.cell(h.band, kTp).last_step < h.t.BandChangedStep(h.band), change);
    // The band's next probe run after the change (re-learning: the full share's period).
    const int64_t run = NextProbeRun(h, change ? h.changed + 2 : 400);
    ASSERT_GT(run, (change ? h.changed : 400) + 2);
    const double share = ShareOf(h.c, &h.t, h.band, run);
    ASSERT_FALSE(InProbeRun(run - 1, ExplorePeriod(share), ExploreOffset(h.c, share)));
    // Outside a probe run the group is held on SP either way.
    GateOutcome out = EvaluateAdaptive(h.c, OnSp(run - 2), Batch(0.35, 4096, run - 1), {},
                                       std::nullopt, &h.t);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive}));
    EXPECT_TRUE(out.flip_held);
    // In the run: TP-only is measured only where its estimate is a guess; otherwise the
    // mode not chosen before the hold is SP, which the group runs.
    std::vector<GateCheck> trace;
    out = EvaluateAdaptive(h.c, OnSp(run - 1), Batch(0.35, 4096, run), {}, std::nullopt, &h.t,
                           &trace);
    EXPECT_EQ(out.decision, change ? (Decision{kTp, Reason::kProbe})
                                   : (Decision{kSp, Reason::kAdaptive}));
    EXPECT_EQ(out.explored, change);
    EXPECT_EQ(HasCheck(trace, "explore", "held off"), change);
    if (!change) continue;
    GroupGateState s = AdvanceGroupState(OnSp(run - 1), run, out.decision,
                                         GatePolicyKind::kAdaptive)
                           .next;
    EXPECT_EQ(s.probe_from, kSp);
    // A step plan's later micro-batch of the same step goes back (the run covers its
    // step's first micro-batch; design.md §11).
    trace.clear();
    out = EvaluateAdaptive(h.c, s, Batch(0.35, 4096, run), {}, std::nullopt, &h.t, &trace);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive})) << "a later micro-batch";
    EXPECT_TRUE(HasCheck(trace, "probe_return", "back to sp"));
    // The run's later steps go on in TP-only, still a probe run although TP-only is the
    // gates' choice too (the way back each sets, the run overrides and its trace drops).
    for (int64_t k = run + 1; k < run + kProbeRunSteps; ++k) {
      trace.clear();
      out = EvaluateAdaptive(h.c, s, Batch(0.35, 4096, k), {}, std::nullopt, &h.t, &trace);
      EXPECT_EQ(out.decision, (Decision{kTp, Reason::kProbe})) << "step " << k;
      EXPECT_FALSE(HasCheck(trace, "probe_return")) << "step " << k;
      s = out.next;
    }
    EXPECT_EQ(s.probe_from, kSp);
    // The run over, in a band still re-learning (no evidence: the gates' TP-only), the
    // switch from SP to TP-only still would not pay: back to SP.
    const int64_t after = run + kProbeRunSteps;
    ASSERT_TRUE(Relearning(h.c, h.t, h.band, after, EstimateBand(h.c, &h.t, h.band, after)));
    ASSERT_FALSE(InProbeRun(after, ExplorePeriod(share), ExploreOffset(h.c, share)));
    trace.clear();
    out = EvaluateAdaptive(h.c, s, Batch(0.35, 4096, after), {}, std::nullopt, &h.t, &trace);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive}));
    EXPECT_TRUE(HasCheck(trace, "probe_return", "back to sp"));
  }
}

TEST(EvaluateAdaptiveTest, AProbeRunInABandWithoutEvidenceGoesBackToTheModeItLeft) {
  struct Case {
    const char* what;
    bool change;     // the band re-learns after a change: no evidence, the gates' TP-only
    double cost_s;   // the switch cost measured (0: switching free)
    Mode from;       // the mode the run left
    bool cap_spent;  // the run's switch and one before it within the cap's window
    double tp_rate;  // TP-only's rate before the change (SP's: 100)
    Decision want;
  } cases[] = {
      {"re-learning: the switch from SP does not pay, back to SP", true, 100, kSp, false, 103,
       {kSp, Reason::kAdaptive}},
      {"the band's evidence stands: TP-only stays", false, 100, kSp, false, 103,
       {kTp, Reason::kLengthCv}},
      // TP-only slower than SP: a switch to it from SP would not pay even free.
      {"switching free: TP-only stays", true, 0, kSp, false, 97, {kTp, Reason::kLengthCv}},
      {"the run left TP-only: it ended where it began", true, 100, kTp, false, 103,
       {kTp, Reason::kLengthCv}},
      {"the cap has no switch back left: TP-only stays", true, 100, kSp, true, 103,
       {kTp, Reason::kLengthCv}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    HeldBand h = HeldOffStaleTpOnly(k.change, k.tp_rate);
    if (k.cost_s == 0) h.t.SetSwitchCost(SwitchCostCell{});
    ASSERT_EQ(MeasuredSwitchCost(h.c, h.t, 400) > 0, k.cost_s > 0);
    // A run of TP-only from `from` that ended on the step before: the next step is the
    // gates' TP-only (CV 0.35) and in no run.
    const int64_t step = (k.change ? h.changed : 340) + 5;
    ASSERT_EQ(Relearning(h.c, h.t, h.band, step, EstimateBand(h.c, &h.t, h.band, step)),
              k.change);
    GroupGateState s = OnSp(step - 1);
    s.mode = s.chosen_mode = kTp;
    s.reason = Reason::kProbe;
    s.probe_from = k.from;
    if (k.cap_spent) {
      s.last_switch_at = s.decisions - 4;
      s.prev_switch_at = s.decisions - 20;
    }
    const double share = ShareOf(h.c, &h.t, h.band, step);
    ASSERT_FALSE(InProbeRun(step, ExplorePeriod(share), ExploreOffset(h.c, share)));
    std::vector<GateCheck> trace;
    const GateOutcome out =
        EvaluateAdaptive(h.c, s, Batch(0.35, 4096, step), {}, std::nullopt, &h.t, &trace);
    EXPECT_EQ(out.decision, k.want);
    EXPECT_EQ(HasCheck(trace, "probe_return"), k.want.mode == kSp);
    EXPECT_FALSE(out.flip_held) << "a way back is no hold";
  }
}

// The way back to the policy's mode after a forced decision is a switch like any other
// where a switch's cost is measured: it pays for it (out and back, or as a move) or the
// group stays in the mode it runs. It stays exempt from the flip cap.
TEST(EvaluateAdaptiveTest, TheWayBackFromAForcedDecisionPaysTheSwitch) {
  const GateConfig c = Adaptive();
  const BatchFacts high_cv = Batch(0.35);  // the gates: TP-only (length_cv)
  const int band = BandOf(c, high_cv.length_cv, high_cv.tokens);
  // TP-only 10 % faster: 2.98 s on this batch (TP-only counted 1 + margin times), 0.076 s
  // a step on the band's mix.
  const ThroughputTable tp_faster = Learned(band, 100, 110);
  struct Case {
    const char* what;
    double cost;
    bool cap_spent;
    Decision want;
  } cases[] = {
      {"the saving pays out and back", 1.0, false, {kTp, Reason::kLengthCv}},
      {"the cap spent: exempt, it pays as a move", 1.0, true, {kTp, Reason::kLengthCv}},
      {"neither out and back nor over the move", 8.0, false, {kSp, Reason::kAdaptive}},
  };
  for (const Case& k : cases) {
    ThroughputTable t = tp_faster;
    t.SetSwitchCost({.seconds = 4 * k.cost, .weight = 4, .last_step = kStep - 1});
    ASSERT_NEAR(MeasuredSwitchCost(c, t, kStep), k.cost, 1e-12) << k.what;
    GroupGateState s;  // chose TP-only; the memory gate forced SP on the last batch
    s.has_decision = s.has_chosen_mode = true;
    s.mode = kSp;
    s.reason = Reason::kMemoryRequiresSp;
    s.chosen_mode = kTp;
    s.decisions = 100;
    if (k.cap_spent) s.last_switch_at = 99, s.prev_switch_at = 98;
    std::vector<GateCheck> trace;
    const GateOutcome out = EvaluateAdaptive(c, s, high_cv, {}, std::nullopt, &t, &trace);
    EXPECT_EQ(out.decision, k.want) << k.what;
    EXPECT_EQ(out.flip_held, k.want.mode == kSp) << k.what;
    if (k.want.mode == kSp) {
      EXPECT_EQ(trace.back().gate, "switch_cost") << k.what;
      // The hold keeps SP: the policy's mode now, without a switch for the cap.
      EXPECT_EQ(out.next.chosen_mode, kSp) << k.what;
      EXPECT_EQ(out.next.last_switch_at, s.last_switch_at) << k.what;
      EXPECT_EQ(out.next.prev_switch_at, s.prev_switch_at) << k.what;
    }
  }
  // Only the way back to the policy's mode is exempt from the cap: a group that chose SP,
  // kept in SP by the memory gate, switching to TP-only is the policy's own switch.
  ThroughputTable t = tp_faster;
  t.SetSwitchCost({.seconds = 4, .weight = 4, .last_step = kStep - 1});
  GroupGateState s;
  s.has_decision = s.has_chosen_mode = true;
  s.mode = s.chosen_mode = kSp;
  s.reason = Reason::kMemoryRequiresSp;
  s.decisions = 100;
  s.last_switch_at = 99, s.prev_switch_at = 98;
  std::vector<GateCheck> trace;
  const GateOutcome out = EvaluateAdaptive(c, s, high_cv, {}, std::nullopt, &t, &trace);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kAdaptive}));
  EXPECT_TRUE(out.flip_held);
  EXPECT_EQ(trace.back().gate, "flip_cap");
}

// A run of decisions the memory gate forced into SP costs a group that chose TP-only two
// switches; the way in is charged to TP-only's evidence, per decision the policy chose.
// Where TP-only's own lead is smaller, ADAPTIVE leaves the gates' TP-only for SP.
TEST(EvaluateAdaptiveTest, ForcedRunsAreChargedToTheModeTheyInterrupt) {
  const GateConfig c = Adaptive();
  const BatchFacts high_cv = Batch(0.35);  // the gates: TP-only (length_cv)
  const int band = BandOf(c, high_cv.length_cv, high_cv.tokens);
  ThroughputTable t = Learned(band, 100, 101);  // TP-only 1 % faster: 0.41 s on this batch
  t.SetSwitchCost({.seconds = 16, .weight = 4, .last_step = kStep - 1});  // 4 s
  ASSERT_NEAR(MeasuredSwitchCost(c, t, kStep), 4.0, 1e-12);
  struct Case {
    const char* what;
    double forced_sp_runs;  // per 10 decisions the policy chose
    double forced_tp_runs;
    Mode want;
  } cases[] = {
      {"no forced runs: the gates' TP-only", 0, 0, kTp},
      {"a forced SP run per 20 decisions: 0.2 s, under TP-only's lead", 0.5, 0, kTp},
      {"one per 2 decisions: 2 s a decision, SP", 5, 0, kSp},
      {"forced TP-only runs charge SP, not TP-only", 0, 5, kTp},
  };
  for (const Case& k : cases) {
    GroupGateState s;
    s.has_decision = s.has_chosen_mode = true;
    s.mode = s.chosen_mode = kTp;
    s.reason = Reason::kLengthCv;
    s.decisions = 100;
    s.chosen_weight = 10;
    s.forced_runs[0] = k.forced_sp_runs;
    s.forced_runs[1] = k.forced_tp_runs;
    const GateOutcome out = EvaluateAdaptive(c, s, high_cv, {}, std::nullopt, &t);
    EXPECT_EQ(out.decision.mode, k.want) << k.what;
    if (k.want == kSp) {
      EXPECT_EQ(out.decision.reason, Reason::kAdaptive) << k.what;
    }
  }
}

// The counts the charge reads: each decision forgets kForcedRunKeep of them; a policy's
// decision adds to the chosen weight, a forced one right after it starts a run (of its
// mode), a forced one after a forced one continues it.
TEST(AdvanceGroupStateTest, CountsForcedRuns) {
  const double k = kForcedRunKeep;
  ASSERT_NEAR(std::pow(k, static_cast<double>(kMoveHorizonDecisions)), 0.5, 1e-12);
  const Decision chosen_tp{kTp, Reason::kLengthCv}, forced_sp{kSp, Reason::kMemoryRequiresSp};
  const std::vector<Decision> run = {forced_sp, chosen_tp, forced_sp, forced_sp,
                                     chosen_tp, forced_sp, {kSp, Reason::kProbe}, forced_sp};
  GroupGateState s;
  for (size_t i = 0; i < run.size(); ++i) {
    s = AdvanceGroupState(s, static_cast<int64_t>(i), run[i], GatePolicyKind::kAdaptive).next;
  }
  // Chosen at 1, 4 and 6 (a probe is the policy's); runs start at 2, 5 and 7 (the first
  // decision follows none).
  EXPECT_NEAR(s.chosen_weight, std::pow(k, 6) + std::pow(k, 3) + k, 1e-12);
  EXPECT_NEAR(s.forced_runs[0], std::pow(k, 5) + std::pow(k, 2) + 1, 1e-12);
  EXPECT_EQ(s.forced_runs[1], 0.0);
}

// A probe run keeps the mode it left (the first decision of a run), through its steps.
TEST(AdvanceGroupStateTest, AProbeRunKeepsTheModeItLeft) {
  const auto advance = [](const GroupGateState& s, int64_t step, Decision d) {
    return AdvanceGroupState(s, step, d, GatePolicyKind::kAdaptive).next;
  };
  GroupGateState s = advance(GroupGateState{}, 1, {kTp, Reason::kProbe});
  EXPECT_EQ(s.probe_from, kTp) << "a group's first decision left no mode";
  s = advance(s, 2, {kSp, Reason::kAdaptive});
  s = advance(s, 3, {kTp, Reason::kProbe});
  EXPECT_EQ(s.probe_from, kSp);
  s = advance(s, 4, {kTp, Reason::kProbe});
  EXPECT_EQ(s.probe_from, kSp) << "the run's later steps keep it";
  s = advance(s, 5, {kTp, Reason::kAdaptive});
  s = advance(s, 6, {kSp, Reason::kProbe});
  EXPECT_EQ(s.probe_from, kTp) << "a new run from TP-only";
  // After a forced decision, the mode the policy had chosen: a run does not go back to
  // the memory gate's mode.
  s = advance(s, 7, {kTp, Reason::kAdaptive});
  s = advance(s, 8, {kSp, Reason::kMemoryRequiresSp});
  s = advance(s, 9, {kSp, Reason::kProbe});
  EXPECT_EQ(s.probe_from, kTp);
}

// A move is judged over the bands the lengths still bring: a band they stopped bringing
// leaves the mix within a few kMoveHorizonDecisions, not half-lives; and a band whose change
// was detected lately counts in the mix's weight but saves nothing.
TEST(SwitchSavingTest, TheMixIsTheBandsTheLengthsStillBring) {
  const GateConfig c = HalfLife(2000);
  ThroughputTable t;
  // Until step 199 band 1 (SP 100 tokens/s, TP-only 80), then band 2 (SP 80, TP-only 100),
  // each sample 100 tokens.
  for (int64_t s = 0; s < 400; ++s) {
    const int band = s < 200 ? 1 : 2;
    t.Observe(c, band, kSp, s, 100, band == 1 ? 1.0 : 1.25);
    t.Observe(c, band, kTp, s, 100, band == 1 ? 1.25 : 1.0);
  }
  // Band 2's saving per step, SP -> TP-only (TP-only counted 1 + margin times): 0.23 s.
  const double band2 = 1.25 - 1.0 * (1 + c.adaptive_margin);
  const SwitchSaving now = SwitchSavingOf(c, t, kSp, kTp, Batch(0.05, 100, 400), {});
  // Band 1's weight, 200 steps past, at 2^-4 of band 2's: the mix within 20 % of band 2's
  // saving. (At the half-life's weights the two bands were about even: below 0.)
  EXPECT_GT(now.mix_per_step, 0.8 * band2);
  EXPECT_LT(now.mix_per_step, band2);
  // TP-only in band 2 twice as fast from step 400: a change, detected and re-learning.
  for (int64_t s = 400; s < 400 + 2 * kChangeConfirmSamples; ++s) {
    t.Observe(c, 2, kSp, s, 100, 1.25);
    t.Observe(c, 2, kTp, s, 100, 0.5);
  }
  const int64_t at = 400 + 2 * kChangeConfirmSamples;
  ASSERT_GE(t.BandChangedStep(2), 400);
  const SwitchSaving changed = SwitchSavingOf(c, t, kSp, kTp, Batch(0.05, 100, at), {});
  EXPECT_LT(changed.mix_per_step, 0) << "band 1's loss alone, over both bands' weight";
  EXPECT_GT(changed.mix_per_step, -0.1);
}

// Where a switch's cost c is measured (with confidence, and above the margin of a step), a
// switch must pay for it: as an excursion (this batch's confident saving ≥ 2c, the cap
// leaving the way back) or as a move (this batch plus 49 steps of the band mix ≥ c), and
// the cap must leave it. Where switching is free neither the cap nor the mix holds the
// group: the evidence decides alone.
TEST(EvaluateAdaptiveTest, ASwitchMustPayForItsCost) {
  const int band = BandOf(Adaptive(), 0.05, 4096);   // 4096 tokens a batch
  const int other = BandOf(Adaptive(), 0.35, 4096);  // the rest of the mix
  struct Case {
    const char* what;
    double cost_s;        // learned switch cost (measured: the samples carry no noise)
    int64_t interval;
    double other_tp_rate;  // the other band: SP 100, TP-only this (the mix's weight: equal)
    int recent_switches;   // switches 10 and 5 decisions ago (the cap of 50: none left)
    bool switches;        // SP → TP-only for a batch of `band` (SP 100, TP-only 110 tokens/s)
  } cases[] = {
      // This batch saves 4096/100 − 4096/110 × 1.02 ≈ 2.98 s; the mix per step half of
      // that plus half the other band's (TP-only 50: −42.6 s; 110: 2.98 s).
      {"free, no cap: the band decides", 0.0, 1, 50, 0, true},
      {"free, the mix prefers SP: not held", 0.0, 50, 50, 1, true},
      {"free, the cap spent: does not bind", 0.0, 50, 50, 2, true},
      {"a cost of 100 s, the mix for TP-only: a move saves ~149 s", 100.0, 50, 110, 0, true},
      {"a cost of 500 s: more than a move saves", 500.0, 50, 110, 0, false},
      {"a cost of 1.2 s, no cap: 2.98 s pays out and back", 1.2, 1, 50, 0, true},
      {"a cost of 2 s, no cap: 2.98 s does not pay out and back", 2.0, 1, 50, 0, false},
      {"a cost of 1.2 s, no excursion left, the mix prefers SP", 1.2, 50, 50, 1, false},
      {"a cost of 1.2 s, the cap spent", 1.2, 50, 110, 2, false},
      // Below the margin (2 %) of a mean step (~50 s): no difference the policy acts on.
      {"a cost of 0.9 s, the cap spent: not material, switching free", 0.9, 50, 50, 2, true},
  };
  for (const Case& k : cases) {
    GateConfig c = Adaptive();
    c.adaptive_flip_interval_steps = k.interval;
    ThroughputTable t;
    for (int i = 0; i < 50; ++i) {
      const int64_t step = 950 + i;
      t.Observe(c, band, kSp, step, 4096, 4096 / 100.0);
      t.Observe(c, band, kTp, step, 4096, 4096 / 110.0);
      t.Observe(c, other, kSp, step, 4096, 4096 / 100.0);
      t.Observe(c, other, kTp, step, 4096, 4096 / k.other_tp_rate);
    }
    if (k.cost_s > 0) {
      t.ObserveAfterSwitch(c, band, kSp, 999, 4096, 40.96 + k.cost_s);
    }
    ASSERT_NEAR(t.SwitchCostSeconds(), k.cost_s, 1e-9) << k.what;
    ASSERT_NEAR(MeasuredSwitchCost(c, t, kStep), k.cost_s < 1.0 ? 0.0 : k.cost_s, 1e-9)
        << k.what;
    GroupGateState s;
    s.has_decision = s.has_chosen_mode = true;
    s.mode = s.chosen_mode = kSp;
    s.decisions = 500;
    if (k.recent_switches >= 1) s.last_switch_at = 495;
    if (k.recent_switches >= 2) s.prev_switch_at = 490;
    const GateOutcome out = EvaluateAdaptive(c, s, Batch(0.05, 4096), {}, std::nullopt, &t);
    EXPECT_EQ(out.decision.mode, k.switches ? kTp : kSp) << k.what;
    EXPECT_EQ(out.flip_held, !k.switches) << k.what;
    EXPECT_EQ(out.decision.reason, Reason::kAdaptive) << k.what;
  }
}

// `n` samples of each mode in `band`, alternating ±noise around the given rates, into `t`.
void AddNoisy(ThroughputTable& t, int band, double sp_rate, double tp_rate, double noise, int n,
              int64_t step = kStep - 1) {
  for (int i = n - 1; i >= 0; --i) {
    const double f = i % 2 == 0 ? 1 + noise : 1 - noise;
    t.Observe(Adaptive(), band, kSp, step - i, sp_rate * f, 1.0);
    t.Observe(Adaptive(), band, kTp, step - i, tp_rate * (2 - f), 1.0);
  }
}

ThroughputTable NoisyLearned(int band, double sp_rate, double tp_rate, double noise,
                             int n = 50, int64_t step = kStep - 1) {
  ThroughputTable t;
  AddNoisy(t, band, sp_rate, tp_rate, noise, n, step);
  return t;
}

// The incumbent rule: the gates' decision stands, with its reason, unless the band's
// evidence says the other mode is faster at 95 % confidence (a move to TP-only by more
// than the margin) and no change was detected in the band within the boost; a switch's
// cost holds the group only where it is measured with confidence, and then a departure
// must pay for it.
TEST(EvaluateAdaptiveTest, DepartsFromTheGatesOnlyOnConfidentEvidence) {
  const GateConfig c = Adaptive();  // margin 0.02, flip interval 50
  const int low = BandOf(c, 0.05, 4096);   // the gates: SP (GATES_PASSED)
  const int high = BandOf(c, 0.35, 4096);  // the gates: TP-only (LENGTH_CV)
  const Decision gates_sp{kSp, Reason::kGatesPassed};
  const Decision gates_tp{kTp, Reason::kLengthCv};
  const Decision to_tp{kTp, Reason::kAdaptive};
  const Decision to_sp{kSp, Reason::kAdaptive};
  struct Case {
    const char* what;
    ThroughputTable table;
    double cv;
    Mode running;              // the group's mode, chosen by the policy
    int recent_switches;       // 0-2 in the last 10 decisions (2: the cap is spent)
    SwitchCostCell cost;       // {}: none learned
    Decision want;
  } cases[] = {
      {"no evidence (7 samples): the gates' SP", Learned(low, 100, 200, 7), 0.05, kSp, 0, {},
       gates_sp},
      {"no evidence (7 samples): the gates' TP-only", Learned(high, 200, 100, 7), 0.35, kTp, 0,
       {}, gates_tp},
      {"the evidence agrees: the gates' reason", Learned(low, 120, 100), 0.05, kSp, 0, {},
       gates_sp},
      {"TP-only 4 % faster, exact: departs", Learned(low, 100, 104), 0.05, kSp, 0, {}, to_tp},
      {"TP-only 4 % faster within ±20 % noise: stays", NoisyLearned(low, 100, 104, 0.2), 0.05,
       kSp, 0, {}, gates_sp},
      {"TP-only 30 % faster within ±20 % noise: departs", NoisyLearned(low, 100, 130, 0.2),
       0.05, kSp, 0, {}, to_tp},
      {"SP 1 % faster than the gates' TP-only: departs (no margin towards SP)",
       Learned(high, 101, 100), 0.35, kTp, 0, {}, to_sp},
      {"SP and TP-only tie: the gates' TP-only", Learned(high, 100, 100), 0.35, kTp, 0, {},
       gates_tp},
      {"SP 5 % faster within ±20 % noise: the gates' TP-only", NoisyLearned(high, 105, 100, 0.2),
       0.35, kTp, 0, {}, gates_tp},
      {"switching free, the cap spent: departs", Learned(low, 100, 130), 0.05, kSp, 2, {},
       to_tp},
      {"a measured cost, the cap spent: holds SP", Learned(low, 100, 130), 0.05, kSp, 2,
       {.seconds = 4, .weight = 4, .last_step = kStep - 1}, {kSp, Reason::kAdaptive}},
      {"a measured cost larger than the saving: holds SP", Learned(low, 100, 130), 0.05, kSp, 0,
       {.seconds = 4000, .weight = 4, .last_step = kStep - 1}, {kSp, Reason::kAdaptive}},
      {"a cost within the steps' noise is not measured: departs, the cap spent",
       NoisyLearned(low, 100, 160, 0.2), 0.05, kSp, 2,
       {.seconds = 0.4, .weight = 4, .last_step = kStep - 1}, to_tp},
      {"back to the gates' SP after a departure, switching free", Learned(low, 120, 100), 0.05,
       kTp, 2, {}, gates_sp},
  };
  // A change detected in the band (SP fell to 60 tokens/s): SP's estimate re-based,
  // TP-only's (stale: its newest sample 9 or more steps before) moved by the same factor;
  // the band is no evidence within the boost, evidence after it.
  ThroughputTable changed = Learned(low, 100, 130, 50, kStep - 20);
  for (int i = 1; i <= 12; ++i) changed.Observe(c, low, kSp, kStep - 20 + i, 60, 1.0);
  ASSERT_GE(changed.BandChangedStep(low), kStep - 19);
  EXPECT_LT(changed.cell(low, kTp).tokens_per_s(), 0.8 * 130.0);
  EXPECT_GT(changed.cell(low, kTp).tokens_per_s() / changed.cell(low, kSp).tokens_per_s(), 1.2);
  for (const auto& [step, want] : {std::pair{kStep, gates_sp},
                                   std::pair{kStep + c.adaptive_explore_boost_steps, to_tp}}) {
    GroupGateState s;
    const GateOutcome out =
        EvaluateAdaptive(c, s, Batch(0.05, 4096, step + 1), {}, std::nullopt, &changed);
    EXPECT_EQ(out.decision.mode, want.mode) << step;
  }
  for (const Case& k : cases) {
    ThroughputTable t = k.table;
    if (k.cost.last_step >= 0) t.SetSwitchCost(k.cost);
    GroupGateState s;
    s.has_decision = s.has_chosen_mode = true;
    s.mode = s.chosen_mode = k.running;
    s.reason = Reason::kAdaptive;
    s.decisions = 500;
    if (k.recent_switches >= 1) s.last_switch_at = 495;
    if (k.recent_switches >= 2) s.prev_switch_at = 490;
    std::vector<GateCheck> trace;
    const GateOutcome out = EvaluateAdaptive(c, s, Batch(k.cv), {}, std::nullopt, &t, &trace);
    EXPECT_EQ(out.decision, k.want) << k.what;
    EXPECT_EQ(out.flip_held, k.want.reason == Reason::kAdaptive && k.want.mode == k.running)
        << k.what;
  }
  // The measured cost: exact samples make any cost confident; with steps of 1 s spread by
  // ±20 %, 0.1 s over 4 measurements is not (1.645 × 0.2 s / 2 ≈ 0.16 s), 1 s is, and 0.1 s
  // over 64 is (0.04 s).
  ThroughputTable noisy = NoisyLearned(low, 100, 160, 0.2);
  noisy.SetSwitchCost({.seconds = 0.4, .weight = 4, .last_step = kStep - 1});
  EXPECT_EQ(MeasuredSwitchCost(c, noisy, kStep), 0.0);
  noisy.SetSwitchCost({.seconds = 4, .weight = 4, .last_step = kStep - 1});
  EXPECT_NEAR(MeasuredSwitchCost(c, noisy, kStep), 1.0, 1e-9);
  noisy.SetSwitchCost({.seconds = 6.4, .weight = 64, .last_step = kStep - 1});
  EXPECT_NEAR(MeasuredSwitchCost(c, noisy, kStep), 0.1, 1e-9);
  EXPECT_EQ(MeasuredSwitchCost(c, ThroughputTable{}, kStep), 0.0);
}

// The pool of the known bands' log gaps: where they agree the between-band variance is 0
// and the pooled mean is their gap; where their true gaps spread it is about that spread.
TEST(PoolBandsTest, BetweenBandVarianceIsTheGapsSpreadBeyondTheirNoise) {
  const GateConfig c = Adaptive();
  ThroughputTable agree, spread;
  const double gaps[] = {0.1, -0.1, 0.1, -0.1};  // log(SP / TP-only) of four bands
  for (int b = 0; b < 4; ++b) {
    AddNoisy(agree, b, 100, 104, 0.05, 200);
    AddNoisy(spread, b, 100 * std::exp(gaps[b]), 100, 0.001, 200);
  }
  const BandPool a = PoolBands(c, agree, kStep, 0);
  EXPECT_EQ(a.bands, 4);
  EXPECT_NEAR(a.mean, std::log(100.0 / 104), 1e-3);
  EXPECT_EQ(a.between, 0.0);
  EXPECT_GT(a.mean_variance, 0.0);
  const BandPool s = PoolBands(c, spread, kStep, 0);
  EXPECT_NEAR(s.mean, 0.0, 1e-3);
  // The sample variance of ±0.1 over four bands (k − 1 = 3) is 0.04 / 3.
  EXPECT_NEAR(s.between, 0.04 / 3, 0.002);
  // Fewer than kMinPooledBands known bands: no pool.
  ThroughputTable two;
  AddNoisy(two, 0, 100, 104, 0.05, 200);
  AddNoisy(two, 1, 100, 104, 0.05, 200);
  EXPECT_EQ(PoolBands(c, two, kStep, 0).bands, 2);
}

// A band whose own evidence cannot tell the modes apart (TP-only 4 % faster within ±20 %
// noise: the gates' SP stands alone) departs when the other bands, agreeing with each
// other, measured the same gap precisely; it does not where they disagree (their spread
// says a band's gap is its own) or are too few.
TEST(EvaluateAdaptiveTest, ABandTooNoisyAloneBorrowsTheOtherBandsEvidence) {
  const GateConfig c = Adaptive();  // margin 0.02
  const int here = BandOf(c, 0.05, 4096);  // the gates: SP
  const auto others = [&](ThroughputTable& t, std::vector<double> tp_rates) {
    int b = BandOf(c, 0.05, 20000);  // another token band of the same CV
    for (const double tp : tp_rates) {
      AddNoisy(t, b, 100, tp, 0.2, 400);
      b += kTokenBands;  // the next CV band
    }
  };
  struct Case {
    const char* what;
    std::vector<double> tp_rates;  // the other bands' TP-only rates (SP: 100)
    Mode want;
  } cases[] = {
      {"alone: the gates' SP", {}, kSp},
      {"one other band: too few to pool (2 with the band), the gates' SP", {104}, kSp},
      {"two other bands: a pool of 3, its mean too uncertain to depart on, the gates' SP",
       {104, 104}, kSp},
      {"four other bands agree on TP-only 4 % faster: departs", {104, 104, 104, 104}, kTp},
      {"four other bands disagree (±30 %): the gates' SP", {70, 130, 70, 130}, kSp},
  };
  for (const Case& k : cases) {
    ThroughputTable t = NoisyLearned(here, 100, 104, 0.2);
    others(t, k.tp_rates);
    GroupGateState s;
    const GateOutcome out = EvaluateAdaptive(c, s, Batch(0.05), {}, std::nullopt, &t);
    EXPECT_EQ(out.decision.mode, k.want) << k.what;
    EXPECT_EQ(out.decision.reason, k.want == kTp ? Reason::kAdaptive : Reason::kGatesPassed)
        << k.what;
  }
}

// Where the evidence never says the other mode is faster, ADAPTIVE is the STATIC policy on
// every step but the exploration steps, the wait-share fallback included: the incumbent
// keeps its reasons, so the group's gate state moves as STATIC's does.
TEST(EvaluateAdaptiveTest, TiedEvidenceIsTheStaticPolicy) {
  const GateConfig a = Adaptive();
  GateConfig s = a;
  s.policy = GatePolicyKind::kStatic;
  ThroughputTable tied;
  for (int b = 0; b < kBands; ++b) {
    for (int i = 0; i < 20; ++i) {
      tied.Observe(a, b, kSp, 99 - i, 100, 1);
      tied.Observe(a, b, kTp, 99 - i, 100, 1);
    }
  }
  GroupPolicyState ga, gs;
  int compared = 0, rs_wait = 0;
  for (int64_t step = 100; step < 1300; ++step) {
    if (MayExplore(a, step)) continue;
    const BatchFacts f = Batch((step % 7) * 0.05, 4096 << (step % 3), step);
    const GateOutcome oa = ga.Decide(a, f, std::nullopt, &tied);
    const GateOutcome os = gs.Decide(s, f, std::nullopt);
    ASSERT_EQ(oa.decision, os.decision) << step;
    rs_wait += os.decision.reason == Reason::kRsWait;
    const double share = (step / 100) % 2 == 0 ? 0.4 : 0.05;
    ga.ObserveRsWaitShare(step, oa.decision.mode, share, a.window_steps);
    gs.ObserveRsWaitShare(step, os.decision.mode, share, s.window_steps);
    ++compared;
  }
  EXPECT_GT(compared, 1100);
  EXPECT_GT(rs_wait, 0) << "the fallback was exercised";
}

// An exploration step in an empty band runs the mode the prior did not choose.
TEST(EvaluateAdaptiveTest, ExplorationTeachesAnEmptyBand) {
  const GateConfig c = Adaptive();
  const int64_t step = 134 * 10 + ProbeRunStart(10, 134);  // the share's 11th run
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
  tight_probe.step = 134 * 100 + ProbeRunStart(100, 134);  // exploring, SP the known mode
  ASSERT_TRUE(InProbeRun(tight_probe.step, 134));
  ThroughputTable sp_known = tp_much_better;
  for (int i = 0; i < 100; ++i) sp_known.Observe(c, band, kSp, tight_probe.step - 1, 100, 1);
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
    if (k.known) {  // the gates' SP (CV 0.12), departed from where TP-only is preferred
      EXPECT_EQ(out.decision,
                (Decision{k.preferred,
                          k.preferred == kTp ? Reason::kAdaptive : Reason::kGatesPassed}))
          << k.what;
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

// Paired evidence (docs/design.md §11). A band where SP runs and TP-only was last measured
// long ago; then every step slows by 8 % (a burst of stragglers, under the change
// threshold). SP's cell absorbs the burst, TP-only's never saw it: the cells say TP-only
// is faster by more than the margin. TP-only's three probe runs in the burst (12 steps at
// its true 3 % behind SP) say otherwise, when paired with SP's level of their time (and
// SP's steps after each run with TP-only's). `pairs` false: the same cells, the pairs
// cleared.
ThroughputTable BurstTheStaleCellNeverSaw(const GateConfig& c, int band, bool pairs) {
  ThroughputTable t;
  for (int64_t s = 0; s < 400; ++s) {
    t.Observe(c, band, kSp, s, 103, 1.0);
    t.Observe(c, band, kTp, s, 100, 1.0);
  }
  for (int64_t s = 400; s < kStep; ++s) {
    const bool probe = (s >= 900 && s < 904) || (s >= 950 && s < 954) || (s >= 990 && s < 994);
    if (probe) {
      t.Observe(c, band, kTp, s, 100 * 0.92, 1.0);
    } else {
      t.Observe(c, band, kSp, s, 103 * 0.92, 1.0);
    }
  }
  if (!pairs) t.SetPair(band, PairedCell{});
  return t;
}

TEST(EvaluateAdaptiveTest, PairsReadABurstTheStaleCellNeverSaw) {
  GateConfig c = Adaptive();
  c.adaptive_change_threshold = 0.10;  // the burst is no detected change
  const int band = BandOf(c, 0.05, 4096);
  const ThroughputTable cells = BurstTheStaleCellNeverSaw(c, band, false);
  ASSERT_EQ(cells.BandChangedStep(band), -1);
  const BandEstimate stale = EstimateBand(c, &cells, band, kStep);
  EXPECT_FALSE(stale.paired);
  EXPECT_GT(stale.ratio, 1.02) << "TP-only looks faster than it is";
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(), {}, std::nullopt, &cells).decision,
            (Decision{kTp, Reason::kAdaptive}));

  const ThroughputTable paired = BurstTheStaleCellNeverSaw(c, band, true);
  const BandEstimate e = EstimateBand(c, &paired, band, kStep);
  ASSERT_TRUE(e.paired);
  EXPECT_TRUE(e.read_through_pairs);
  // The pairs see TP-only's true 0.971x; a little over it, as SP's steps after each run
  // pair beside TP-only's level, partly of its run before (design.md §11).
  EXPECT_NEAR(e.pair.ratio, 100.0 / 103, 0.003);
  EXPECT_NEAR(e.ratio, e.pair.ratio, 1e-12) << "the stale TP-only cell reads SP's times it";
  EXPECT_EQ(e.tp.samples, e.pair.samples);
  EXPECT_EQ(e.sp.tokens_per_s, stale.sp.tokens_per_s) << "the fresh cell is as it was";
  EXPECT_EQ(e.preferred, kSp);
  const GateOutcome out =
      EvaluateAdaptive(c, GroupGateState{}, Batch(), {}, std::nullopt, &paired);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed})) << "the gates' choice";
  // The preference bits the workers' fallback reads say the same.
  EXPECT_EQ(paired.PreferenceBits(c, kStep) >> (2 * band) & 3, 1u) << "known, SP";
  EXPECT_EQ(cells.PreferenceBits(c, kStep) >> (2 * band) & 3, 3u) << "known, TP-only";
}

// A stale cell is read through the pairs only where the pairs' gap differs from the cells'
// beyond their noise: a few pairs under random stragglers are noisier than a stale but
// steady cell, and cells measured side by side are never stale.
TEST(EstimateBandTest, PairsReplaceAStaleCellOnlyWhereTheyDisagreeBeyondTheNoise) {
  const GateConfig c = Adaptive();  // min_samples 8
  const int band = 4;
  const auto table = [&](double noise, int64_t tp_last) {
    ThroughputTable t;
    ThroughputCell sp{100.0 * 50, 50, 50, kStep - 1};
    ThroughputCell tp{102.0 * 50, 50, 50, tp_last};
    sp.noise = tp.noise = noise;  // relative variance of one sample (past 64 samples' start)
    t.SetCell(band, kSp, sp);
    t.SetCell(band, kTp, tp);
    // 10 pairs at TP-only / SP 0.98, 4 % from the cells' 1.02.
    t.SetPair(band, PairedCell{10.0, 10.0 / 0.98, 10, tp_last});
    return t;
  };
  // Noisy samples (a 20 % spread): the pairs alone are ±9 %, the 4 % is within it.
  ThroughputTable t = table(0.04, kStep - 100);
  BandEstimate e = EstimateBand(c, &t, band, kStep);
  EXPECT_TRUE(e.paired);
  EXPECT_FALSE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 1.02, 1e-9);
  EXPECT_EQ(e.preferred, kSp) << "within the margin";
  // A 2 % spread: the 4 % is beyond it, and TP-only's stale cell reads SP's × 0.98.
  t = table(0.0004, kStep - 100);
  e = EstimateBand(c, &t, band, kStep);
  EXPECT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 0.98, 1e-9);
  EXPECT_NEAR(e.tp.tokens_per_s, 98.0, 1e-9);
  EXPECT_EQ(e.tp.samples, e.pair.samples);
  // Cells no more than kPairGapSteps apart are not stale: they stand.
  t = table(0.0004, kStep - 1 - kPairGapSteps);
  e = EstimateBand(c, &t, band, kStep);
  EXPECT_TRUE(e.paired);
  EXPECT_FALSE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 1.02, 1e-9);
}

// Where a switch's cost is measured, pairs still read a stale cell: the burst the stale
// cell never saw misleads no more than switching free.
TEST(EvaluateAdaptiveTest, WhereASwitchCostsPairsStillReadAStaleCell) {
  GateConfig c = Adaptive();
  c.adaptive_change_threshold = 0.10;
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable t = BurstTheStaleCellNeverSaw(c, band, true);
  t.SetSwitchCost(SwitchCostCell{0.5 * 20, 20, kStep - 1});  // 0.5 s a switch, 1 s a step
  ASSERT_GT(MeasuredSwitchCost(c, t, kStep), 0.0);
  const BandEstimate e = EstimateBand(c, &t, band, kStep);
  EXPECT_FALSE(e.paired) << "they end no re-learning";
  EXPECT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, e.pair.ratio, 1e-12);
  EXPECT_EQ(e.preferred, kSp);
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(), {}, std::nullopt, &t).decision,
            (Decision{kSp, Reason::kGatesPassed}));
  // Without the pairs the cells alone say TP-only, as switching free.
  ThroughputTable cells = BurstTheStaleCellNeverSaw(c, band, false);
  cells.SetSwitchCost(t.switch_cost());
  EXPECT_GT(EstimateBand(c, &cells, band, kStep).ratio, 1.02);
}

// Switching free, the pairs measured since a change end the band's re-learning and read
// the cell the change did not re-base; where a cost is measured they do neither: the
// cells would then decide, and a cell measured mostly on steps after a switch is off by
// what is left of its cost (docs/design.md §11).
TEST(EstimateBandTest, PairsEndARelearningOnlyWhereSwitchingIsFree) {
  const GateConfig c = Adaptive();  // boost 200 steps, floor 8
  const int band = 4;
  ThroughputTable t;
  ThroughputCell sp{100.0 * 50, 50, 50, kStep - 1};
  sp.changed_step = kStep - 20;  // re-based by a change 20 steps ago
  t.SetCell(band, kSp, sp);
  // TP-only's cell is from before the change and stale (its newest sample 14 steps before
  // SP's): outside the window it would be read through the pairs, cost or not.
  t.SetCell(band, kTp, ThroughputCell{130.0 * 50, 50, 50, kStep - 15});
  t.SetPair(band, PairedCell{10.0, 10.0 / 1.03, 10, kStep - 1});  // all since the change
  ASSERT_TRUE(ChangedLately(c, t, band, kStep));
  const TableFacts free{.switch_cost = 0}, costly{.switch_cost = 0.5};
  BandEstimate e = EstimateBand(c, &t, band, kStep, &free);
  EXPECT_TRUE(e.paired);
  EXPECT_FALSE(Relearning(c, t, band, kStep, e));
  EXPECT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 1.03, 1e-9);
  e = EstimateBand(c, &t, band, kStep, &costly);
  EXPECT_FALSE(e.paired);
  EXPECT_TRUE(Relearning(c, t, band, kStep, e)) << "no evidence for the window";
  EXPECT_FALSE(e.read_through_pairs) << "not even the stale cell, within the window";
  EXPECT_NEAR(e.ratio, 1.3, 1e-9);
  // Past the window the same pairs read the stale cell, with the cost as without.
  ThroughputTable later = t;
  ThroughputCell old = later.cell(band, kSp);
  old.changed_step = kStep - 1 - c.adaptive_explore_boost_steps;
  later.SetCell(band, kSp, old);
  ASSERT_FALSE(ChangedLately(c, later, band, kStep));
  e = EstimateBand(c, &later, band, kStep, &costly);
  EXPECT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 1.03, 1e-9);
}

// A change detected in a band voids its pairs (they measured the gap before it); until the
// pairs measured since have adaptive_min_samples' weight the band's estimates are no
// evidence (Relearning) and the band explores at the full share; then the cell the change
// re-based stands, the other reads it times the pairs' ratio, and the band departs on
// that evidence and explores at the floor again.
TEST(EvaluateAdaptiveTest, AfterAChangeThePairsSinceItAreTheEvidence) {
  const GateConfig c = Adaptive();  // boost 200 steps, floor 8, change threshold 5 %
  const int band = BandOf(c, 0.05, 4096);
  ThroughputTable t;
  for (int64_t s = 0; s < 300; ++s) {
    t.Observe(c, band, kSp, s, 100, 1.0);
    t.Observe(c, band, kTp, s, 103, 1.0);
  }
  // SP runs, TP-only probes between its steps: 20 pairs at TP-only / SP 1.03.
  for (int64_t s = 300; s < 340; ++s) t.Observe(c, band, s % 2 ? kTp : kSp, s, s % 2 ? 103 : 100, 1.0);
  ASSERT_EQ(t.BandChangedStep(band), -1);
  ASSERT_TRUE(EstimateBand(c, &t, band, 340).paired);
  // Every step slows by 20 %: SP's cell detects it on its 10th sample and is re-based.
  int64_t s = 340;
  for (; t.BandChangedStep(band) < 0 && s < 360; ++s) t.Observe(c, band, kSp, s, 80, 1.0);
  const int64_t changed = t.BandChangedStep(band);
  ASSERT_GE(changed, 340);
  EXPECT_EQ(t.pair(band), PairedCell{}) << "voided";
  BandEstimate e = EstimateBand(c, &t, band, s);
  EXPECT_FALSE(e.paired);
  EXPECT_TRUE(Relearning(c, t, band, s, e));
  // TP-only's cell, stale (its newest sample 10 steps before), moved by SP's factor: near
  // the true 1.03, where left as it was it would read over 1.2 (103 over SP's re-based
  // estimate, which lags the new 80).
  EXPECT_GT(e.ratio, 1.03);
  EXPECT_LT(e.ratio, 1.1);
  // Switching free, the band explores at once: the mode not chosen runs from the step after
  // the change; outside that run the gates' choice stands (no evidence).
  ASSERT_EQ(s, changed + 1);
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(0.05, 4096, s), {}, std::nullopt, &t)
                .decision,
            (Decision{kTp, Reason::kProbe}))
      << "re-learning: a probe run at once";
  EXPECT_EQ(EvaluateAdaptive(c, GroupGateState{}, Batch(0.05, 4096, changed + kProbeRunSteps + 1),
                             {}, std::nullopt, &t)
                .decision,
            (Decision{kSp, Reason::kGatesPassed}))
      << "no evidence: the gates' choice";
  // TP-only runs between SP's steps again, at its new rate. Every step pairs beside the
  // other mode's level of its time: under the floor's weight, still re-learning at the
  // full share.
  const int64_t first = s;
  for (; t.pair(band).weight < 6.5 && s < first + 20; ++s) {
    t.Observe(c, band, s % 2 ? kTp : kSp, s, s % 2 ? 82.4 : 80, 1.0);
  }
  e = EstimateBand(c, &t, band, s);
  EXPECT_FALSE(e.paired);
  EXPECT_TRUE(Relearning(c, t, band, s, e));
  EXPECT_EQ(ExploreShareOf(c, &t, band, s, e), c.adaptive_explore_share) << "boosted";
  // Two more: the pairs speak, TP-only's cell (mostly from before) reads SP's times their
  // ratio.
  for (const int64_t end = s + 2; s < end; ++s) {
    t.Observe(c, band, s % 2 ? kTp : kSp, s, s % 2 ? 82.4 : 80, 1.0);
  }
  ASSERT_EQ(t.BandChangedStep(band), changed) << "TP-only's samples are no change yet";
  e = EstimateBand(c, &t, band, s);
  ASSERT_TRUE(e.paired);
  EXPECT_FALSE(Relearning(c, t, band, s, e));
  EXPECT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, e.pair.ratio, 1e-12);
  // TP-only's true 1.03, over it: SP's steps pair beside TP-only's level, whose fast mean
  // is still partly of its samples from before the change (design.md §11, "Paired
  // evidence").
  EXPECT_GT(e.ratio, 1.03);
  EXPECT_LT(e.ratio, 1.1);
  EXPECT_TRUE(ChangedLately(c, t, band, s));
  EXPECT_EQ(ExploreShareOf(c, &t, band, s, e), c.adaptive_explore_floor)
      << "the pairs re-measured both modes: exploration back at the floor";
  // The band decides on its evidence again (no longer skipped as re-learning, the rule
  // weighs it: "pass", not "skip"): TP-only ahead on the pairs, but not at 95 % confidence
  // on so few of them, with the noise the change left in the cells, so the gates' SP
  // stands until more pairs come.
  std::vector<GateCheck> trace;
  const GateOutcome out = EvaluateAdaptive(c, GroupGateState{}, Batch(0.05, 4096, s), {},
                                           std::nullopt, &t, &trace);
  EXPECT_EQ(out.decision, (Decision{kSp, Reason::kGatesPassed}));
  const auto adaptive = std::find_if(trace.begin(), trace.end(), [](const GateCheck& g) {
    return std::string(g.gate) == "adaptive";
  });
  ASSERT_NE(adaptive, trace.end());
  EXPECT_EQ(std::string(adaptive->outcome), "pass") << adaptive->detail;
  EXPECT_FALSE(ChangedLately(c, t, band, changed + c.adaptive_explore_boost_steps));
}

}  // namespace
}  // namespace spgate
