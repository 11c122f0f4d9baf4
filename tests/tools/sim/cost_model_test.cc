// The cost model's invariants: every rank holds the same rows under SP (the
// reduce-scatter wait is the transfer alone) unless attention runs on the shard, where a
// shard's causal cost sets its weight; TP-only has no reduce-scatter; collectives per kind
// from the hardware curves; the gather boundary's norm stalls; overlap; presets; and the
// memory prediction is Korthikanti et al.'s per-layer formula.
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

// Megatron SP runs attention on the gathered sequence, heads split: every rank holds the
// same rows whatever the lengths, so a mixed batch shards as evenly as an equal one (the
// old model's imbalance constant is gone; the what-if below replaces it).
TEST(CostModelTest, MixedLengthsShardEvenlyUnderMegatronSp) {
  const CostModel m(Quiet());
  std::mt19937_64 rng(1);
  const std::vector<int64_t> mixed = {12288, 1024, 1024, 1024, 1024};
  const GroupStep x = m.Step(mixed, Mode::kSequenceParallel, rng);
  for (const RankStep& r : x.ranks) {
    EXPECT_DOUBLE_EQ(r.busy_s, x.ranks[0].busy_s);
    EXPECT_DOUBLE_EQ(r.rs_wait_s, x.ranks[0].rs_wait_s);
  }
  // TP-only: no reduce-scatter, no all-gather.
  const GroupStep t = m.Step(mixed, Mode::kTensorParallelOnly, rng);
  for (const RankStep& r : t.ranks) {
    EXPECT_EQ(r.rs_wait_s, 0);
    EXPECT_EQ(r.all_gather_s, 0);
  }
  EXPECT_EQ(t.group_rs_wait_share, 0);
}

// With attention on the sequence shard (--shard_work_fraction=1, as context parallelism
// runs it), a shard's cost is the causal cost of its positions, Σ (p + 1): one 8,192-token
// sequence over 8 shards of 1,024 gives rank r Σ_{p=1024r}^{1024r+1023} (p + 1) =
// 1024·(1024r + 512.5), a weight (1024r + 512.5) / 4096.5 of the mean, so rank 0 waits at
// the reduce-scatter for rank 7 by 7168 / 4096.5 of the balanced attention time; 8
// sequences of one shard each are balanced again.
TEST(CostModelTest, AttentionOnTheShardWeighsEachShardsCausalCost) {
  CostParams p = Quiet();
  p.shard_work_fraction = 1;
  const CostModel m(p);
  std::mt19937_64 rng(1);
  const std::vector<int64_t> one = {8192};
  const GroupStep x = m.Step(one, Mode::kSequenceParallel, rng);
  const double attention = m.Terms(8192, 8192.0 * 8192, Mode::kSequenceParallel).attention_s;
  for (int r = 0; r < 8; ++r) {
    EXPECT_NEAR(x.ranks[r].busy_s - x.ranks[0].busy_s, attention * 1024 * r / 4096.5,
                1e-12 * x.step_time_s) << r;
  }
  EXPECT_NEAR(x.ranks[0].rs_wait_s - x.ranks[7].rs_wait_s, attention * 7168 / 4096.5, 1e-12);
  const GroupStep e = m.Step(std::vector<int64_t>(8, 1024), Mode::kSequenceParallel, rng);
  for (const RankStep& r : e.ranks) EXPECT_NEAR(r.busy_s, e.ranks[0].busy_s, 1e-15);
  EXPECT_GT(x.group_rs_wait_share, e.group_rs_wait_share + 0.05);
  // TP-only splits attention by heads whatever the fraction.
  const GroupStep t = m.Step(one, Mode::kTensorParallelOnly, rng);
  for (const RankStep& r : t.ranks) EXPECT_DOUBLE_EQ(r.busy_s, t.ranks[0].busy_s);
}

// The collectives per kind from the h100-sxm curves: at TP 8 with NVLS, TP-only's
// all-reduce moves a large activation faster than SP's all-gather + reduce-scatter of the
// same bytes (~1.3x, nccl-tests #212/#326); without NVLS, and at TP 4 where NCCL runs a
// ring (NVIDIA/nccl #1455), they cost the same.
TEST(CostModelTest, AllReduceBeatsThePairOnlyWithNvls) {
  const double bytes = 32768.0 * 5120 * 2;  // a 32K-token 13B activation
  CostParams p = Quiet();
  const auto pair_over_ar = [&](const CostParams& q) {
    const CostModel m(q);
    return (m.CollectiveSeconds(CollectiveKind::kAllGather, bytes) +
            m.CollectiveSeconds(CollectiveKind::kReduceScatter, bytes)) /
           m.CollectiveSeconds(CollectiveKind::kAllReduce, bytes);
  };
  EXPECT_GT(pair_over_ar(p), 1.25);
  p.nvls = false;
  EXPECT_NEAR(pair_over_ar(p), 1.0, 1e-12);
  p.nvls = true;
  p.tp = 4;
  EXPECT_NEAR(pair_over_ar(p), 1.0, 1e-12);
  // The terms of a step: 4 all-reduces per layer for TP-only; 4 reduce-scatters and
  // 4 all-gathers for SP, the backward re-gathers hidden behind the input-gradient GEMMs
  // at this size.
  p = Quiet();
  const CostModel m(p);
  const StepTerms tp = m.Terms(32768, 0, Mode::kTensorParallelOnly);
  const StepTerms sp = m.Terms(32768, 0, Mode::kSequenceParallel);
  EXPECT_NEAR(tp.all_reduce_s, 4 * p.layers * m.CollectiveSeconds(CollectiveKind::kAllReduce, bytes), 1e-15);
  EXPECT_NEAR(sp.reduce_scatter_s,
              4 * p.layers * m.CollectiveSeconds(CollectiveKind::kReduceScatter, bytes), 1e-15);
  EXPECT_NEAR(sp.all_gather_s, 4 * p.layers * m.CollectiveSeconds(CollectiveKind::kAllGather, bytes),
              1e-15);
  EXPECT_GT(sp.all_gather_s + sp.reduce_scatter_s, tp.all_reduce_s);
  // ... while SP streams 1/t of the element-wise region.
  EXPECT_NEAR(sp.elementwise_s * 8, tp.elementwise_s, 1e-15);
  EXPECT_EQ(sp.gemm_s, tp.gemm_s);
}

// --norm_boundary=gather: LayerNorm runs on the gathered sequence, one all-gather of each
// norm's input forward and one backward (norm_stall), and its passes are whole again;
// the LayerNorm inputs are kept whole in memory.
TEST(CostModelTest, TheGatherBoundaryCostsNormStallsAndMemory) {
  CostParams p = Quiet();
  const CostModel shard(p);
  p.norm_boundary = NormBoundary::kGather;
  const CostModel gather(p);
  const std::vector<int64_t> batch(4, 4096);
  std::mt19937_64 a(1), b(1);
  const GroupStep s = shard.Step(batch, Mode::kSequenceParallel, a);
  const GroupStep g = gather.Step(batch, Mode::kSequenceParallel, b);
  const double ag = gather.CollectiveSeconds(CollectiveKind::kAllGather, 16384.0 * 5120 * 2);
  EXPECT_EQ(s.ranks[0].norm_stall_s, 0);
  EXPECT_NEAR(g.ranks[0].norm_stall_s, 4 * p.layers * ag, 1e-15);
  const double h = 5120, T = 16384, L = p.layers;
  const double elementwise_extra = L * h * 2 * p.norm_passes * (T - T / 8) / (p.hbm_gbps * 1e9);
  EXPECT_NEAR(g.step_time_s - s.step_time_s, 4 * L * ag + elementwise_extra, 1e-12);
  EXPECT_EQ(gather.PredictMemory(batch).sp - shard.PredictMemory(batch).sp,
            static_cast<uint64_t>(L * 4 * T * h * 7 / 8));
  // TP-only does not care where SP would run LayerNorm.
  std::mt19937_64 c(1), d(1);
  EXPECT_EQ(shard.Step(batch, Mode::kTensorParallelOnly, c).step_time_s,
            gather.Step(batch, Mode::kTensorParallelOnly, d).step_time_s);
  EXPECT_TRUE(ParseNormBoundary("gather").ok());
  EXPECT_EQ(ParseNormBoundary("full").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseNormBoundary("full").status().message().find("--norm_boundary"),
            std::string::npos);
}

// --tp_comm_overlap hides SP's collectives behind the GEMMs: only what exceeds them shows.
TEST(CostModelTest, OverlapExposesOnlyWhatExceedsTheGemms) {
  CostParams p = Quiet();
  const StepTerms plain = CostModel(p).Terms(32768, 0, Mode::kSequenceParallel);
  p.tp_comm_overlap = true;
  const StepTerms hidden = CostModel(p).Terms(32768, 0, Mode::kSequenceParallel);
  const double comm = plain.all_gather_s + plain.reduce_scatter_s;
  EXPECT_NEAR(hidden.all_gather_s + hidden.reduce_scatter_s,
              std::max(0.0, comm - plain.gemm_s), 1e-15);
  // TP-only's all-reduce sits between dependent GEMMs: nothing to overlap.
  EXPECT_EQ(CostModel(p).Terms(32768, 0, Mode::kTensorParallelOnly).all_reduce_s,
            CostModel(Quiet()).Terms(32768, 0, Mode::kTensorParallelOnly).all_reduce_s);
}

// The presets set every device constant; a flat link is the old formula; bad constants
// and a TP degree without curves are refused naming the flag.
TEST(CostModelTest, PresetsFlatLinkAndValidation) {
  const CostParams h100;
  EXPECT_EQ(h100.hardware, "h100-sxm");
  EXPECT_EQ(h100.hbm_gbps, 2900);
  EXPECT_EQ(h100.device_memory_gib, 80);
  CostParams h200;
  ApplyHardwarePreset(**FindHardwarePreset("h200-sxm"), h200);
  EXPECT_EQ(h200.hbm_gbps, 4010);
  EXPECT_EQ(h200.device_memory_gib, 141);
  EXPECT_LT(CostModel(h200).Terms(8192, 0, Mode::kTensorParallelOnly).elementwise_s,
            CostModel(h100).Terms(8192, 0, Mode::kTensorParallelOnly).elementwise_s);
  CostParams flat = Quiet();
  flat.flat_link = true;
  flat.link_gbps = 100;
  flat.collective_latency_us = 10;
  const CostModel f(flat);
  EXPECT_NEAR(f.CollectiveSeconds(CollectiveKind::kAllReduce, 1e9), 1e9 * 1.75 / 100e9 + 10e-6, 1e-15);
  EXPECT_NEAR(f.CollectiveSeconds(CollectiveKind::kAllGather, 1e9), 1e9 * 0.875 / 100e9 + 10e-6, 1e-15);
  EXPECT_TRUE(ValidateCostParams(Quiet()).ok());
  struct Case {
    void (*set)(CostParams&);
    const char* flag;
  } cases[] = {
      {[](CostParams& c) { c.mfu = 1.5; }, "--mfu"},
      {[](CostParams& c) { c.hbm_gbps = 0; }, "--hbm_gbps"},
      {[](CostParams& c) { c.attention_tflops = std::nan(""); }, "--attention_tflops"},
      {[](CostParams& c) { c.shard_work_fraction = 2; }, "--shard_work_fraction"},
      {[](CostParams& c) { c.hardware = "b200"; }, "--hardware"},
      {[](CostParams& c) { c.switch_cost_s = -1; }, "--switch_cost_s"},
      {[](CostParams& c) { c.hidden = -1; }, "--hidden"},
      {[](CostParams& c) { c.layers = 0; }, "--layers"},
      {[](CostParams& c) { c.heads = 0; }, "--heads"},
      {[](CostParams& c) { c.heads = c.hidden + 1; }, "--heads"},
      // Shapes that cannot be meant: a head of 5120 / 3 values; without flash attention,
      // 20 heads over 8 ranks (the score memory counts 2.5 heads a rank).
      {[](CostParams& c) { c.heads = 3; }, "--hidden=5120 is not divisible by --heads=3"},
      {[](CostParams& c) {
         c.heads = 20;
         c.flash_attention = false;
       },
       "--heads=20 is not divisible by --tp=8"},
      // Bursts need both flags and a burst shorter than its period (else they were ignored).
      {[](CostParams& c) { c.straggler_burst_steps = 5; },
       "--straggler_burst_steps=5 needs --straggler_burst_every"},
      {[](CostParams& c) { c.straggler_burst_every = 10; },
       "--straggler_burst_every=10 needs --straggler_burst_steps"},
      {[](CostParams& c) {
         c.straggler_burst_every = 10;
         c.straggler_burst_steps = 20;
       },
       "--straggler_burst_steps=20 must be less than --straggler_burst_every=10"},
      {[](CostParams& c) {
         c.straggler_burst_every = 10;
         c.straggler_burst_steps = 10;
       },
       "--straggler_burst_steps=10 must be less than"},
  };
  for (const Case& k : cases) {
    CostParams c = Quiet();
    k.set(c);
    const absl::Status s = ValidateCostParams(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.flag;
    EXPECT_NE(s.message().find(k.flag), std::string::npos) << s;
  }
  // With flash attention no term reads the head count: 20 heads at TP 8 run (spgate-sim
  // notes it), as do bursts of 9 steps in 10.
  CostParams heads = Quiet();
  heads.heads = 20;
  EXPECT_TRUE(ValidateCostParams(heads).ok());
  CostParams bursts = Quiet();
  bursts.straggler_burst_every = 10;
  bursts.straggler_burst_steps = 9;
  EXPECT_TRUE(ValidateCostParams(bursts).ok());
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
  {
    // At the shape flags' bounds, without flash attention, the bytes pass 2^64: they
    // saturate (a cast past the range is undefined; a negative --hidden wrapped).
    CostParams big = p;
    big.layers = 1024;
    big.hidden = 1 << 20;
    big.heads = 1 << 20;
    const MemoryPrediction m = CostModel(big).PredictMemory(std::vector<int64_t>{200000});
    EXPECT_EQ(m.tp, std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(m.sp, std::numeric_limits<uint64_t>::max());
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
