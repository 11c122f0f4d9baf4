// A band's paired evidence (docs/design.md §11, "Paired evidence"): the sums, their
// forgetting and floor, and how the learned table forms pairs
// (a step beside the other mode's level, only within kPairGapSteps of its newest
// sample). What the pairs do to a decision is in adaptive_policy_test.cc.
#include "policy/paired_evidence.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"

namespace spgate {
namespace {

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;

GateConfig Config() {
  GateConfig c;
  c.adaptive_half_life_steps = 100;
  c.adaptive_min_samples = 4;
  c.adaptive_change_threshold = 0.05;
  return c;
}

TEST(PairedEvidenceTest, TheRatioIsOfTheSumsNotOfThePairs) {
  const GateConfig c = Config();
  PairedCell p;
  ASSERT_TRUE(AddPair(c, p, 10, 1.0, 1.1));  // TP-only 10 % slower on a short batch
  ASSERT_TRUE(AddPair(c, p, 10, 3.0, 3.0));  // even on a batch three times as long
  const PairedView v = PairAt(c, p, 10);
  EXPECT_DOUBLE_EQ(v.ratio, 4.0 / 4.1);  // not the mean of 1/1.1 and 1
  EXPECT_DOUBLE_EQ(v.samples, 2.0);
  EXPECT_EQ(v.last_step, 10);
}

TEST(PairedEvidenceTest, PairsForgetLikeCellsDownToTheFloor) {
  const GateConfig c = Config();  // half-life 100, floor 4
  PairedCell few;
  AddPair(c, few, 0, 1.0, 1.0);
  AddPair(c, few, 0, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(PairAt(c, few, 100).samples, 1.0);  // halved: under the floor, no floor
  PairedCell many;
  for (int i = 0; i < 8; ++i) AddPair(c, many, 0, 1.0, 2.0);
  EXPECT_DOUBLE_EQ(PairAt(c, many, 100).samples, 4.0);  // 8 halved, at the floor
  EXPECT_DOUBLE_EQ(PairAt(c, many, 1000).samples, 4.0);  // and kept there
  // A newer pair enters at full weight over the decayed sums.
  AddPair(c, many, 100, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(many.weight, 5.0);
  EXPECT_DOUBLE_EQ(PairAt(c, many, 100).ratio, 5.0 / 9.0);
  // A late pair (another group behind) enters already decayed.
  AddPair(c, many, 0, 2.0, 2.0);
  EXPECT_DOUBLE_EQ(many.weight, 5.5);
  EXPECT_DOUBLE_EQ(many.sp_seconds, 5.0 + 1.0);
  EXPECT_EQ(many.last_step, 100);
}

TEST(PairedEvidenceTest, BadPairsAreIgnored) {
  const GateConfig c = Config();
  PairedCell p;
  AddPair(c, p, 5, 1.0, 1.2);
  const PairedCell before = p;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(AddPair(c, p, -1, 1.0, 1.0));
  EXPECT_FALSE(AddPair(c, p, 6, 0.0, 1.0));
  EXPECT_FALSE(AddPair(c, p, 6, 1.0, -1.0));
  EXPECT_FALSE(AddPair(c, p, 6, inf, 1.0));
  EXPECT_FALSE(AddPair(c, p, 6, 1.0, std::nan("")));
  EXPECT_EQ(p, before);
  EXPECT_EQ(PairAt(c, PairedCell{}, 5).ratio, 0.0);
  EXPECT_EQ(PairAt(c, PairedCell{}, 5).last_step, -1);
}

// The table pairs a probe step with the other mode's level: its estimate moved by the fast
// mean of its recent seconds, so a mode running through a slowdown pairs at the
// slowdown's level.
TEST(PairedEvidenceTest, AProbePairsWithTheRunningModesLevelNow) {
  const GateConfig c = Config();
  ThroughputTable t;
  for (int64_t s = 0; s < 20; ++s) t.Observe(c, 2, kSp, s, 100, 1.0);
  const ThroughputCell& sp = t.cell(2, kSp);
  const double level = sp.tokens_per_s() / (1 + sp.seconds_drift);
  t.Observe(c, 2, kTp, 20, 90, 1.0);
  const PairedView v = PairAt(c, t.pair(2), 20);
  EXPECT_EQ(v.samples, 1.0);
  EXPECT_NEAR(v.ratio, 90 / level, 1e-12);
  // SP slows by 4 % (under the change threshold): its estimate lags, its fast mean does not.
  for (int64_t s = 21; s < 41; ++s) t.Observe(c, 2, kSp, s, 96, 1.0);
  const ThroughputCell& now = t.cell(2, kSp);
  EXPECT_GT(now.tokens_per_s(), 97.0) << "the estimate still remembers 100";
  const double level_now = now.tokens_per_s() / (1 + now.seconds_drift);
  EXPECT_NEAR(level_now, 96.0, 0.6) << "the level is near 96";
  t.Observe(c, 2, kTp, 41, 86.4, 1.0);  // TP-only 10 % behind, as before
  // Both pairs' SP seconds at the level of their time; the first decayed by 21 steps.
  const double k = std::exp2(-21.0 / 100);
  EXPECT_NEAR(PairAt(c, t.pair(2), 41).ratio, (k * 90 / level + 86.4 / level_now) / (k + 1),
              1e-9);
  EXPECT_NEAR(PairAt(c, t.pair(2), 41).ratio, 0.9, 0.006) << "TP-only's true 0.9x";
}

// Stragglers: one step in ten at half the rate. The mean of the rates runs above the ratio
// of the sums (the estimate) by Jensen's gap; the seconds' fast mean does not, so a probe
// at the same rates pairs at a ratio near 1, not the gap.
TEST(PairedEvidenceTest, StragglersDoNotTiltThePairsTowardsTheRunningMode) {
  GateConfig c = Config();
  c.adaptive_half_life_steps = 100000;
  c.adaptive_change_threshold = 0.5;
  ThroughputTable t;
  int64_t step = 0;
  double drift_sum = 0;
  int n = 0;
  for (int run = 0; run < 400; ++run) {
    for (int i = 0; i < 20; ++i, ++step) {
      t.Observe(c, 2, kSp, step, 100, step % 10 == 3 ? 2.0 : 1.0);
      drift_sum += t.cell(2, kSp).drift;
      ++n;
    }
    // TP-only at SP's very rates, straggling alike.
    t.Observe(c, 2, kTp, step, 100, step % 10 == 3 ? 2.0 : 1.0);
    ++step;
  }
  EXPECT_GT(drift_sum / n, 0.03) << "the rates' mean runs above the estimate";
  EXPECT_NEAR(PairAt(c, t.pair(2), step).ratio, 1.0, 0.02);
}

// Any step pairs — a probe's, or one around a switch (a departure, a return to the gates'
// choice) — but only beside the other mode's sample within kPairGapSteps, in its band.
TEST(PairedEvidenceTest, AStepPairsOnlyBesideARecentSampleOfTheOtherMode) {
  const GateConfig c = Config();
  ThroughputTable t;
  for (int64_t s = 0; s < 10; ++s) t.Observe(c, 2, kSp, s, 100, 1.0);
  EXPECT_EQ(t.pair(2).last_step, -1) << "SP's own steps: TP-only was never measured";
  t.Observe(c, 2, kTp, 9 + kPairGapSteps + 1, 90, 1.0);  // SP too long ago
  EXPECT_EQ(t.pair(2).last_step, -1);
  t.Observe(c, 2, kTp, 9 + kPairGapSteps, 90, 1.0);  // within the gap
  EXPECT_EQ(t.pair(2).last_step, 9 + kPairGapSteps);
  EXPECT_NEAR(t.pair(2).weight, 1.0, 1e-12);
  // A step of the running mode pairs too, beside TP-only's, once that cell has the floor.
  ThroughputTable both = t;
  for (int64_t s = 16; s < 19; ++s) both.Observe(c, 2, kTp, s, 90, 1.0);
  ASSERT_GE(both.cell(2, kTp).weight, 4.0);
  const double before = both.pair(2).weight;
  both.Observe(c, 2, kSp, 19, 100, 1.0);
  EXPECT_EQ(both.pair(2).last_step, 19);
  EXPECT_GT(both.pair(2).weight, before);
  // A step beside a cell under the sample floor pairs with nothing.
  ThroughputTable sparse;
  for (int64_t s = 0; s < 3; ++s) sparse.Observe(c, 2, kSp, s, 100, 1.0);
  sparse.Observe(c, 2, kTp, 3, 90, 1.0);
  EXPECT_EQ(sparse.pair(2).last_step, -1);
  // Another band's cells are not the other mode.
  sparse.Observe(c, 3, kTp, 3, 90, 1.0);
  EXPECT_EQ(sparse.pair(3).last_step, -1);
}

// A late probe from before the band's last change (another group behind) pairs with
// nothing: the change voided its time's pairs, and it would bring one back.
TEST(PairedEvidenceTest, ALateProbeFromBeforeAChangePairsWithNothing) {
  const GateConfig c = Config();  // floor 4, threshold 5 %
  ThroughputTable t;
  for (int64_t s = 0; s < 40; ++s) t.Observe(c, 2, kSp, s, 100, 1.0);
  t.Observe(c, 2, kTp, 40, 90, 1.0);
  ASSERT_EQ(t.pair(2).last_step, 40);
  int64_t s = 41;
  for (; t.BandChangedStep(2) < 0 && s < 80; ++s) t.Observe(c, 2, kSp, s, 50, 1.0);
  const int64_t changed = t.BandChangedStep(2);
  ASSERT_GT(changed, 40);
  EXPECT_EQ(t.pair(2), PairedCell{}) << "the change voids the pairs";
  t.Observe(c, 2, kTp, changed - 1, 90, 1.0);  // late, from before it
  EXPECT_EQ(t.pair(2), PairedCell{});
  t.Observe(c, 2, kTp, s, 45, 1.0);  // after it
  EXPECT_EQ(t.pair(2).last_step, s);
}

// Four modes of a band's pairs through EstimateBand, on hand-made cells: SP measured at
// the step, TP-only `tp_age` steps before; 10 pairs at TP-only / SP 0.9 measured at
// `pair_step`; cells at 100 and 100 tokens/s with the given relative noise.
BandEstimate Estimate(double noise, int64_t tp_last, int64_t pair_step, double variance_floor) {
  GateConfig c = Config();
  c.adaptive_min_samples = 8;
  ThroughputTable t;
  ThroughputCell sp{100.0 * 50, 50, 50, 1000};
  ThroughputCell tp{100.0 * 50, 50, 50, tp_last};
  sp.noise = tp.noise = noise;
  t.SetCell(2, kSp, sp);
  t.SetCell(2, kTp, tp);
  t.SetPair(2, PairedCell{9.0, 10.0, 10, pair_step});
  const TableFacts facts{.switch_cost = 0, .variance_floor = variance_floor};
  return EstimateBand(c, &t, 2, 1000, &facts);
}

TEST(PairedEvidenceTest, AStaleCellIsReadThroughNewerPairsThatDisagreeBeyondTheNoise) {
  // TP-only 100 steps stale, the pairs as new as its last sample, noise-free cells: read.
  BandEstimate e = Estimate(0, 900, 900, 0);
  ASSERT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.tp.tokens_per_s, 90.0, 1e-9);
  EXPECT_EQ(e.tp.samples, e.pair.samples);
  EXPECT_EQ(e.pair.samples, 8.0) << "10 pairs a half-life old, held at the floor";
  // The read cell's variance is a pair's: both modes' (a sample of each).
  e = Estimate(0.0004, 900, 900, 0);
  ASSERT_TRUE(e.read_through_pairs);
  EXPECT_NEAR(e.tp.relative_variance, 2 * e.sp.relative_variance, 1e-12);
  // Pairs older than the stale cell's newest sample do not replace it.
  e = Estimate(0, 900, 899, 0);
  EXPECT_TRUE(e.paired);
  EXPECT_FALSE(e.read_through_pairs);
  EXPECT_NEAR(e.ratio, 1.0, 1e-12);
  // The table's noise floors the cells' (as in the departure test): noise-free cells in a
  // table whose steps spread by 30 % are no surer than it, and 10 % is within that.
  e = Estimate(0, 900, 900, 0.09);
  EXPECT_FALSE(e.read_through_pairs);
  // Cells measured side by side are not stale.
  e = Estimate(0, 1000 - kPairGapSteps, 1000, 0);
  EXPECT_FALSE(e.read_through_pairs);
}

}  // namespace
}  // namespace spgate
