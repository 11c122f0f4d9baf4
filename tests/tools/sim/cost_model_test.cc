// The cost model's invariants: equal lengths shard evenly under SP (the reduce-scatter
// wait is the transfer alone), mixed lengths make some ranks wait, TP-only has no
// reduce-scatter, collectives end a step together, and the memory prediction is
// Korthikanti et al.'s per-layer formula.
#include "tools/sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace spgate::sim {
namespace {

CostParams Quiet() {
  CostParams p;
  p.jitter = 0;
  return p;
}

TEST(CostModelTest, EqualLengthsShardEvenlyUnderSp) {
  const CostModel m(Quiet());
  std::mt19937_64 rng(1);
  const std::vector<int64_t> even(8, 2048);
  GroupStep s = m.Step(even, Mode::kSequenceParallel, rng);
  ASSERT_EQ(s.ranks.size(), 8u);
  for (const RankStep& r : s.ranks) {
    EXPECT_DOUBLE_EQ(r.busy_s, s.ranks[0].busy_s);
    EXPECT_DOUBLE_EQ(r.rs_wait_s, s.ranks[0].rs_wait_s);  // transfer only
    EXPECT_GT(r.all_gather_s, 0);
  }
  EXPECT_DOUBLE_EQ(s.group_rs_wait_share, s.ranks[0].rs_wait_s / s.step_time_s);
}

TEST(CostModelTest, MixedLengthsMakeRanksWaitAtTheReduceScatter) {
  const CostModel m(Quiet());
  std::mt19937_64 rng(1);
  const std::vector<int64_t> even(8, 2048);
  const std::vector<int64_t> mixed = {12288, 1024, 1024, 1024, 1024};
  const GroupStep e = m.Step(even, Mode::kSequenceParallel, rng);
  const GroupStep x = m.Step(mixed, Mode::kSequenceParallel, rng);
  EXPECT_GT(x.group_rs_wait_share, e.group_rs_wait_share + 0.05);
  const auto [lo, hi] = std::minmax_element(x.ranks.begin(), x.ranks.end(),
                                            [](auto& a, auto& b) { return a.busy_s < b.busy_s; });
  EXPECT_NEAR(lo->rs_wait_s - hi->rs_wait_s, hi->busy_s - lo->busy_s, 1e-12);
  // TP-only: no reduce-scatter, balanced ranks, and faster than SP on this batch.
  const GroupStep t = m.Step(mixed, Mode::kTensorParallelOnly, rng);
  for (const RankStep& r : t.ranks) EXPECT_EQ(r.rs_wait_s, 0);
  EXPECT_EQ(t.group_rs_wait_share, 0);
  EXPECT_LT(t.step_time_s, x.step_time_s);
  // ...while on the even batch SP wins (the element-wise region is sharded).
  EXPECT_LT(e.step_time_s, m.Step(even, Mode::kTensorParallelOnly, rng).step_time_s);
}

// A switch costs --switch_cost_s on the step it happens on: not on a group's first step,
// not when the mode stays; a negative or non-finite cost is refused naming the flag.
TEST(CostModelTest, ASwitchCostsTheStepItHappensOn) {
  CostParams p = Quiet();
  p.switch_cost_s = 0.25;
  const CostModel m(p);
  const Mode sp = Mode::kSequenceParallel, tp = Mode::kTensorParallelOnly;
  EXPECT_EQ(m.SwitchSeconds(std::nullopt, sp), 0);
  EXPECT_EQ(m.SwitchSeconds(sp, sp), 0);
  EXPECT_EQ(m.SwitchSeconds(sp, tp), 0.25);
  EXPECT_EQ(m.SwitchSeconds(tp, sp), 0.25);
  EXPECT_EQ(CostModel(Quiet()).SwitchSeconds(sp, tp), 0);  // free by default
  EXPECT_TRUE(ValidateSwitchCost(p).ok());
  for (double bad : {-0.001, std::nan(""), std::numeric_limits<double>::infinity()}) {
    p.switch_cost_s = bad;
    const absl::Status s = ValidateSwitchCost(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--switch_cost_s"), std::string::npos) << s;
  }
}

TEST(CostModelTest, MemoryIsKorthikantisFormula) {
  CostParams p = Quiet();
  p.tp = 8;
  p.layers = 2;
  p.hidden = 1024;
  p.heads = 16;
  p.param_bytes_per_param = 16;
  const std::vector<int64_t> lengths = {1000, 3000};  // T = 4000, Σs² = 1e7
  const double states = 12.0 * 1024 * 1024 * 2 * 16 / 8;
  const double T = 4000, h = 1024, t = 8, a = 16, L = 2;
  {
    p.flash_attention = true;
    const MemoryPrediction m = CostModel(p).PredictMemory(lengths);
    EXPECT_EQ(m.tp, static_cast<uint64_t>(states + L * T * h * (10 + 24 / t)));
    EXPECT_EQ(m.sp, static_cast<uint64_t>(states + L * T * h * 34 / t));
  }
  {
    p.flash_attention = false;
    const MemoryPrediction m = CostModel(p).PredictMemory(lengths);
    const double scores = 5 * a * 1e7 / t;
    EXPECT_EQ(m.tp, static_cast<uint64_t>(states + L * (T * h * (10 + 24 / t) + scores)));
    EXPECT_EQ(m.sp, static_cast<uint64_t>(states + L * (T * h * 34 / t + scores)));
  }
}

TEST(CostModelTest, SpPadsTheBatchToAMultipleOfT) {
  const CostModel m(Quiet());
  std::mt19937_64 rng(1);
  const GroupStep s = m.Step(std::vector<int64_t>{1001}, Mode::kSequenceParallel, rng);
  EXPECT_EQ(s.effective_tokens, 1001);
  EXPECT_EQ(s.padding_tokens, 7);
  EXPECT_EQ(m.Step(std::vector<int64_t>{1001}, Mode::kTensorParallelOnly, rng).padding_tokens, 0);
}

// Straggler bursts: slow ranks only inside the bursts; the draws per call do not depend
// on the step or the mode, so calls from one generator state see the same noise.
TEST(CostModelTest, StragglersComeInBurstsAndNoiseIsCommon) {
  CostParams p = Quiet();
  p.straggler_prob = 1.0;  // every rank slow, inside a burst
  p.straggler_burst_every = 100;
  p.straggler_burst_steps = 10;
  const CostModel m(p);
  const std::vector<int64_t> even(8, 1024);
  std::mt19937_64 a(3), b(3);
  const double in = m.Step(even, Mode::kTensorParallelOnly, a, 205).step_time_s;
  const double out = m.Step(even, Mode::kTensorParallelOnly, b, 250).step_time_s;
  EXPECT_GT(in, out * 1.3);
  EXPECT_EQ(a(), b());  // the same number of draws in and out of a burst
  std::mt19937_64 c(5), d(5);
  (void)m.Step(even, Mode::kSequenceParallel, c, 1);
  (void)m.Step(even, Mode::kTensorParallelOnly, d, 1);
  EXPECT_EQ(c(), d());  // and in either mode
}

}  // namespace
}  // namespace spgate::sim
