// A band's paired evidence (docs/design.md §11, "Paired evidence"): the sums, their
// forgetting and floor, and how the learned table forms pairs
// (a probe step beside the other mode's level, only within kPairGapSteps of its newest
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
  t.Observe(c, 2, kTp, 20, 90, 1.0, /*probe=*/true);
  const PairedView v = PairAt(c, t.pair(2), 20);
  EXPECT_EQ(v.samples, 1.0);
  EXPECT_NEAR(v.ratio, 90 / level, 1e-12);
  // SP slows by 4 % (under the change threshold): its estimate lags, its fast mean does not.
  for (int64_t s = 21; s < 41; ++s) t.Observe(c, 2, kSp, s, 96, 1.0);
  const ThroughputCell& now = t.cell(2, kSp);
  EXPECT_GT(now.tokens_per_s(), 97.0) << "the estimate still remembers 100";
  const double level_now = now.tokens_per_s() / (1 + now.seconds_drift);
  EXPECT_NEAR(level_now, 96.0, 0.6) << "the level is near 96";
  t.Observe(c, 2, kTp, 41, 86.4, 1.0, /*probe=*/true);  // TP-only 10 % behind, as before
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
    t.Observe(c, 2, kTp, step, 100, step % 10 == 3 ? 2.0 : 1.0, /*probe=*/true);
    ++step;
  }
  EXPECT_GT(drift_sum / n, 0.03) << "the rates' mean runs above the estimate";
  EXPECT_NEAR(PairAt(c, t.pair(2), step).ratio, 1.0, 0.02);
}

TEST(PairedEvidenceTest, OnlyProbesPairAndOnlyBesideARecentSample) {
  const GateConfig c = Config();
  ThroughputTable t;
  for (int64_t s = 0; s < 10; ++s) t.Observe(c, 2, kSp, s, 100, 1.0);
  t.Observe(c, 2, kTp, 10, 90, 1.0);  // not a probe
  EXPECT_EQ(t.pair(2).last_step, -1);
  t.Observe(c, 2, kTp, 9 + kPairGapSteps + 1, 90, 1.0, /*probe=*/true);  // SP too long ago
  EXPECT_EQ(t.pair(2).last_step, -1);
  t.Observe(c, 2, kTp, 9 + kPairGapSteps, 90, 1.0, /*probe=*/true);  // within the gap
  EXPECT_EQ(t.pair(2).last_step, 9 + kPairGapSteps);
  // A probe beside a cell under the sample floor pairs with nothing.
  ThroughputTable sparse;
  for (int64_t s = 0; s < 3; ++s) sparse.Observe(c, 2, kSp, s, 100, 1.0);
  sparse.Observe(c, 2, kTp, 3, 90, 1.0, /*probe=*/true);
  EXPECT_EQ(sparse.pair(2).last_step, -1);
  // Another band's cells are not the other mode.
  sparse.Observe(c, 3, kTp, 3, 90, 1.0, /*probe=*/true);
  EXPECT_EQ(sparse.pair(3).last_step, -1);
}

}  // namespace
}  // namespace spgate
