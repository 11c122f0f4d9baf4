// The simulator's pipelines: the schedule's timeline against hand-computed step times
// (equal stages give (M + P − 1)·t; a slow stage off the bound; p2p on the critical path;
// interleaving shrinks the bubble), the per-stage costs (embedding first, loss last,
// TP-only's boundary all-gathers), the oracle per (stage, micro-batch) under the memory
// gate, and the PP cells of --compare: the oracle bounds every policy, no policy that
// respects memory goes over it, early stages stay SP where late ones run TP-only, and
// pp = microbatches = 1 is the one-stage pipeline of the group's whole step.
#include "tools/sim/pipeline.h"

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "tests/testing/status_matchers.h"
#include "tools/sim/compare.h"

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

using Times = std::vector<std::vector<double>>;

// ---------------------------------------------------------------- timeline

struct TimelineCase {
  std::string name;
  PipelineLayout layout;
  Times fwd, bwd;  // [stage][micro-batch]
  double p2p;
  double want_step;
};

Times Same(int p, int m, double v) { return Times(p, std::vector<double>(m, v)); }

TEST(SimulatePipelineTest, StepTimesByHand) {
  const std::vector<TimelineCase> cases = {
      // Equal stages: the classic 1F1B bound (M + P − 1)·(f + b).
      {"p4_m8_equal", {.pp = 4, .microbatches = 8}, Same(4, 8, 1), Same(4, 8, 2), 0, 11 * 3},
      {"p4_m4_equal", {.pp = 4, .microbatches = 4}, Same(4, 4, 1), Same(4, 4, 2), 0, 7 * 3},
      {"p1_m4_is_a_sum", {.pp = 1, .microbatches = 4}, Same(1, 4, 1), Same(1, 4, 2), 0, 12},
      {"p8_m1_no_overlap", {.pp = 8, .microbatches = 1}, Same(8, 1, 1), Same(8, 1, 2), 0, 24},
      // One micro-batch over two stages with a message each way: 1 + .5 + 1 + 2 + .5 + 2.
      {"p2_m1_p2p", {.pp = 2, .microbatches = 1}, Same(2, 1, 1), Same(2, 1, 2), 0.5, 7},
      // Stage 1 twice as slow (a mode that is slower there): S0 F0 [0,1] F1 [1,2];
      // S1 F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13]; S0 B0 [7,9] B1 [13,15]. The simple bound
      // (M + P − 1) × the slowest stage would say 18.
      {"p2_m2_slow_last_stage",
       {.pp = 2, .microbatches = 2},
       {{1, 1}, {2, 2}},
       {{2, 2}, {4, 4}},
       0,
       15},
      // A micro-batch that is slower on one stage only: stage 0's micro-batch 1 takes
      // f = 3, b = 6. S0 F0 [0,1] F1 [1,4]; S1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7];
      // S0 B0 [4,6] B1 [7,13].
      {"p2_m2_one_slow_microbatch",
       {.pp = 2, .microbatches = 2},
       {{1, 3}, {1, 1}},
       {{2, 6}, {2, 2}},
       0,
       13},
  };
  for (const TimelineCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<double> p2p(c.layout.microbatches, c.p2p);
    absl::StatusOr<PipelineTimeline> t = SimulatePipeline(c.layout, c.fwd, c.bwd, p2p);
    ASSERT_THAT(t.status(), IsOk());
    EXPECT_DOUBLE_EQ(t->step_time_s, c.want_step);
    ASSERT_EQ(t->busy_s.size(), static_cast<size_t>(c.layout.pp));
    for (int s = 0; s < c.layout.pp; ++s) {
      double busy = 0;
      for (int m = 0; m < c.layout.microbatches; ++m) busy += c.fwd[s][m] + c.bwd[s][m];
      EXPECT_DOUBLE_EQ(t->busy_s[s], busy) << "stage " << s;
    }
  }
}

TEST(SimulatePipelineTest, BubbleOfEqualStages) {
  // (P − 1) / (M + P − 1) of every stage's time is idle.
  absl::StatusOr<PipelineTimeline> t =
      SimulatePipeline({.pp = 4, .microbatches = 8}, Same(4, 8, 1), Same(4, 8, 2),
                       std::vector<double>(8, 0.0));
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_NEAR(t->bubble_share(), 3.0 / 11.0, 1e-12);
}

TEST(SimulatePipelineTest, InterleavingShrinksTheBubble) {
  // vp chunks per stage: each chunk f/vp, b/vp; the warm-up covers (P − 1)/vp of a
  // micro-batch's time instead of P − 1 of it.
  const PipelineLayout one{.pp = 4, .microbatches = 8};
  const PipelineLayout two{.pp = 4, .vp = 2, .microbatches = 8,
                           .schedule = PipelineSchedule::kInterleaved1F1B};
  const std::vector<double> p2p(8, 0.0);
  absl::StatusOr<PipelineTimeline> a = SimulatePipeline(one, Same(4, 8, 1), Same(4, 8, 2), p2p);
  absl::StatusOr<PipelineTimeline> b = SimulatePipeline(two, Same(4, 8, 1), Same(4, 8, 2), p2p);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_DOUBLE_EQ(a->step_time_s, 33);
  EXPECT_LT(b->step_time_s, a->step_time_s);
  EXPECT_GE(b->step_time_s, 8 * 3);  // never below one stage's work
}

TEST(SimulatePipelineTest, RefusesMisSizedInputs) {
  EXPECT_THAT(SimulatePipeline({.pp = 2, .microbatches = 2}, Same(1, 2, 1), Same(2, 2, 1),
                               std::vector<double>(2, 0.0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stages")));
  EXPECT_THAT(SimulatePipeline({.pp = 2, .microbatches = 2}, Same(2, 2, 1), Same(2, 1, 1),
                               std::vector<double>(2, 0.0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 0")));
  EXPECT_THAT(SimulatePipeline({.pp = 0, .microbatches = 2}, {}, {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pp")));
}

// ---------------------------------------------------------------- per-stage costs

TEST(PipelineCostModelTest, FirstAndLastStagesDiffer) {
  CostParams p;
  p.tp = 8;
  p.jitter = 0;  // deterministic times
  const JobLayout layout{.tp = 8, .pp = 4, .microbatches = 8};
  const PipelineCostModel model(p, layout);
  const std::vector<int64_t> lengths = {4096, 4096, 4096, 4096};
  // Embedding on the first stage, the output layer on the last: V·h/t params each.
  const uint64_t middle = model.ResidentBytes(1);
  const double vocab_params = 51200.0 * 5120 / 8 * 16;
  EXPECT_NEAR(static_cast<double>(model.ResidentBytes(0) - middle), vocab_params, 16);
  EXPECT_NEAR(static_cast<double>(model.ResidentBytes(3) - middle), vocab_params, 16);
  EXPECT_EQ(model.ResidentBytes(2), middle);
  // The last stage keeps the fp32 logits: 4·T·V/t more in both modes, + 2·T·h (÷ t SP).
  const MicrobatchMemory mid = model.Memory(1, lengths), last = model.Memory(3, lengths);
  const double T = 16384, h = 5120;
  EXPECT_NEAR(static_cast<double>(last.activation_tp - mid.activation_tp),
              4 * T * 51200 / 8 + 2 * T * h, 2);
  EXPECT_NEAR(static_cast<double>(last.activation_sp - mid.activation_sp),
              4 * T * 51200 / 8 + 2 * T * h / 8, 2);
  EXPECT_LT(mid.activation_sp, mid.activation_tp);
  EXPECT_GT(model.Memory(0, lengths).activation_tp, mid.activation_tp);  // dropout mask

  std::mt19937_64 rng(1);
  StageMicrobatchCost c[4];
  for (int s = 0; s < 4; ++s) {
    std::mt19937_64 same = rng;  // every stage the same noise: only the stage differs
    c[s] = model.Cost(s, lengths, same, 0);
  }
  EXPECT_EQ(c[1].forward_s, c[2].forward_s);
  EXPECT_EQ(c[1].backward_s, c[2].backward_s);
  for (int m = 0; m < 2; ++m) {
    EXPECT_GT(c[0].forward_s[m], c[1].forward_s[m]) << "embedding, mode " << m;
    EXPECT_GT(c[3].forward_s[m], c[1].forward_s[m]) << "logits, mode " << m;
    EXPECT_GT(c[3].backward_s[m], c[3].forward_s[m]);
  }
  // Uniform lengths: a middle stage's layers are CostModel's, split 1 : 2.
  const CostModel layers(p);
  std::mt19937_64 again(1);
  const GroupStep sp = layers.Step(lengths, Mode::kSequenceParallel, again, 0);
  EXPECT_NEAR(c[1].forward_s[0], sp.step_time_s / 3, 1e-15);
  EXPECT_NEAR(c[1].backward_s[0], 2 * sp.step_time_s / 3, 1e-15);
  // The sharded boundary: s/t rows in both modes; TP-only's native format sends all rows.
  EXPECT_EQ(model.ShardedBoundaryBytes(16384), 16384u / 8 * 5120 * 2);
  EXPECT_EQ(model.NativeBoundaryBytes(16384, 16384, Mode::kTensorParallelOnly),
            8 * model.ShardedBoundaryBytes(16384));
  EXPECT_EQ(model.NativeBoundaryBytes(16383, 16384, Mode::kSequenceParallel),
            model.ShardedBoundaryBytes(16384));
}

// ---------------------------------------------------------------- the oracle

StageMicrobatchCost Mb(double sp_s, double tp_s, uint64_t act_tp) {
  StageMicrobatchCost c;
  c.forward_s = {sp_s / 3, tp_s / 3};
  c.backward_s = {2 * sp_s / 3, 2 * tp_s / 3};
  c.memory = {.activation_sp = 10, .activation_tp = act_tp};
  return c;
}

TEST(OracleStageModesTest, FasterModePerMicrobatchWhileItFits) {
  // Stage 0 of 2 with 4 micro-batches: it holds two at once.
  const std::vector<PipelineOp> ops = StageSchedule({.pp = 2, .microbatches = 4}, 0).value();
  const std::vector<StageMicrobatchCost> costs = {
      Mb(1.0, 0.9, 100),   // saves 0.1
      Mb(1.0, 1.2, 100),   // SP faster
      Mb(1.0, 0.5, 100),   // saves 0.5
      Mb(1.0, 0.7, 100)};  // saves 0.3
  struct Case {
    std::string name;
    uint64_t limit;
    std::vector<Mode> want;
    int64_t kept_sp;
  };
  constexpr Mode S = Mode::kSequenceParallel, T = Mode::kTensorParallelOnly;
  const std::vector<Case> cases = {
      {"no limit: every faster TP-only", 0, {T, S, T, T}, 0},
      // Resident 1,000; any two in flight TP-only hold 200: fits.
      {"room for all", 1200, {T, S, T, T}, 0},
      // On stage 0 of 2, micro-batches 0 and 1, 1 and 2, 2 and 3 are in flight together:
      // one TP-only beside an SP one fits (1,000 + 100 + 10), two do not. Micro-batch 2
      // (saves most) first; 3 overlaps it and stays SP; 0 overlaps only the SP 1.
      {"one in flight at a time", 1110, {T, S, T, S}, 1},
      {"nothing fits", 1050, {S, S, S, S}, 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Mode> modes;
    EXPECT_EQ(OracleStageModes(ops, 1000, costs, c.limit, modes), c.kept_sp);
    EXPECT_EQ(modes, c.want);
  }
}

// ---------------------------------------------------------------- --compare

SimOptions Pipelined() {
  SimOptions o;
  o.groups = 2;
  o.steps = 60;
  o.pp = 4;
  o.microbatches = 8;
  o.cost.tp = 8;
  o.bucketing = false;
  o.lengths = "bimodal:short=512,long=12000,p_long=0.3";
  return o;
}

double Tps(const CompareResult& r, const char* name) {
  return r.Find(name)->effective_tokens_per_s;
}

TEST(CompareCellTest, OracleBoundsEveryPolicyWithoutALimit) {
  SimOptions o = Pipelined();
  o.cost.device_memory_gib = 1000;  // nothing is over: the oracle is exact
  // Half the attention on the sequence shard (the what-if imbalance, docs/sim.md), so the
  // modes trade places between micro-batches (Megatron SP alone wins every one here).
  o.cost.shard_work_fraction = 0.5;
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->pipelined());
  ASSERT_EQ(r->policies.size(), 6u);  // five and the expected-value oracle
  const double oracle = Tps(*r, "oracle");
  for (const PolicyResult& p : r->policies) {
    EXPECT_LE(p.effective_tokens_per_s, oracle * (1 + 1e-12)) << p.name;
    EXPECT_EQ(p.sp_steps + p.tp_steps, 2 * 60 * 4 * 8) << p.name;
    EXPECT_EQ(p.memory_forced_sp, 0) << p.name;
    ASSERT_EQ(p.stages.size(), 4u);
    // The sharded boundary's bytes do not depend on the modes.
    EXPECT_DOUBLE_EQ(p.p2p_bytes_per_step, r->Find("sp")->p2p_bytes_per_step) << p.name;
    EXPECT_GT(p.bubble_share, 0) << p.name;
  }
  EXPECT_EQ(r->Find("tp_only")->sp_steps, 0);
  EXPECT_GT(r->Find("tp_only")->p2p_native_bytes_per_step,
            4 * r->Find("tp_only")->p2p_bytes_per_step);
  EXPECT_DOUBLE_EQ(r->Find("sp")->p2p_native_bytes_per_step, r->Find("sp")->p2p_bytes_per_step);
  EXPECT_DOUBLE_EQ(r->Find("oracle")->ratio_to_best_fixed,
                   oracle / std::max(Tps(*r, "sp"), Tps(*r, "tp_only")));
  // The oracle mixes modes on this workload, and ADAPTIVE explores and learns.
  EXPECT_GT(r->Find("oracle")->tp_steps, 0);
  EXPECT_GT(r->Find("oracle")->sp_steps, 0);
  EXPECT_GT(r->Find("adaptive")->probe_steps, 0);
  // Deterministic.
  absl::StatusOr<CompareResult> again = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(CompareJson(*again), CompareJson(*r));
  EXPECT_THAT(CompareJson(*r),
              HasSubstr("\"pipeline\": {\"pp\": 4, \"vp\": 1, \"microbatches\": 8"));
  EXPECT_THAT(CompareJson(*r), HasSubstr("\"stages\": [{\"stage\": 0, \"tp_only_share\""));
  EXPECT_THAT(CompareTable(*r), HasSubstr("| TP-only share per stage |"));
}

// --compare_batches's records: one per (replica, step, stage, micro-batch), the batch's
// statistics and both modes' seconds, which are what the oracles compare (no memory limit
// here, so each oracle runs TP-only exactly where its seconds say TP-only is faster), and
// recording them changes nothing. A cell without a pipeline records its whole steps.
TEST(CompareCellTest, BatchRecordsAreWhatTheOraclesCompare) {
  for (const bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipeline" : "whole steps");
    SimOptions o = Pipelined();
    if (!pipelined) o.pp = o.microbatches = 1;
    o.cost.device_memory_gib = 1000;
    o.cost.shard_work_fraction = 0.5;  // the modes trade places (as above)
    GateConfig config;  // bands other than the defaults': the run's config sets them
    config.adaptive_cv_band_width = 0.2;
    config.adaptive_tokens_band_base = 4096;
    std::vector<BatchRecord> records;
    absl::StatusOr<CompareResult> r = Compare(o, config, 0, kDefaultRegretWindow,
                                              [&](const BatchRecord& b) { records.push_back(b); });
    ASSERT_THAT(r.status(), IsOk());
    const int per_step = o.pp * o.microbatches;
    ASSERT_EQ(records.size(), static_cast<size_t>(o.groups * o.steps * per_step));
    int64_t expected_tp = 0, drawn_tp = 0;
    std::set<int> bands;
    double tokens = 0, sp_seconds = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      const BatchRecord& b = records[i];
      // In step, then replica, then micro-batch, then stage order.
      EXPECT_EQ(b.step, static_cast<int64_t>(i) / (o.groups * per_step));
      EXPECT_EQ(b.group, static_cast<int>(i / per_step) % o.groups);
      EXPECT_EQ(b.microbatch, static_cast<int>(i % per_step) / o.pp);
      EXPECT_EQ(b.stage, static_cast<int>(i % o.pp));
      expected_tp += b.expected_s[0] > b.expected_s[1];
      drawn_tp += b.drawn_s[0] > b.drawn_s[1];
      if (b.stage == 0) tokens += static_cast<double>(b.stats.tokens);
      sp_seconds += b.drawn_s[0];
      EXPECT_GT(b.stats.max_length, 0);
      EXPECT_EQ(b.band, BandOf(config, b.stats.cv, b.stats.tokens));
      bands.insert(b.band);
      EXPECT_NE(b.expected_s[0], b.drawn_s[0]) << "the drawn seconds carry the noise";
    }
    EXPECT_EQ(r->Find("expected_oracle")->tp_steps, expected_tp);
    EXPECT_EQ(r->Find("oracle")->tp_steps, drawn_tp);
    EXPECT_GT(bands.size(), 2u);
    EXPECT_GT(drawn_tp, 0);
    EXPECT_LT(drawn_tp, static_cast<int64_t>(records.size()));
    EXPECT_DOUBLE_EQ(r->Find("sp")->tokens, tokens);
    // A whole step's time is its SP seconds; a pipeline's adds the bubble and p2p.
    if (!pipelined) {
      EXPECT_NEAR(r->Find("sp")->time_s, sp_seconds, 1e-9 * sp_seconds);
    }
    absl::StatusOr<CompareResult> without = Compare(o, config, 0);
    ASSERT_THAT(without.status(), IsOk());
    EXPECT_EQ(CompareJson(*without), CompareJson(*r));
  }
  // The CSV: a row per record, the header's columns.
  BatchRecord b{.group = 1, .step = 7, .stage = 2, .microbatch = 3,
                .stats = {.sequences = 2, .tokens = 300, .max_length = 200, .mean = 150,
                          .cv = 1.0 / 3},
                .band = 24,
                .expected_s = {0.5, 0.25},
                .drawn_s = {0.75, 0.125}};
  EXPECT_EQ(std::string(kBatchCsvHeader),
            "group,step,stage,microbatch,sequences,tokens,max_length,length_cv,band,"
            "sp_expected_s,tp_only_expected_s,sp_s,tp_only_s\n");
  EXPECT_EQ(CompareBatchesCsvRow(b), "1,7,2,3,2,300,200,0.333333,24,0.5,0.25,0.75,0.125\n");
}

TEST(CompareCellTest, EarlyStagesStaySpWhereLateOnesFit) {
  // Stage 0 of 4 holds four micro-batches at once, stage 3 one: with this budget TP-only
  // fits the late stages, not the early ones (and it is the faster mode on most of these
  // mixed-length micro-batches, so the gates want it).
  SimOptions o = Pipelined();
  o.cost.device_memory_gib = 24;
  o.cost.shard_work_fraction = 0.9;
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(r.status(), IsOk());
  const PolicyResult& tp = *r->Find("tp_only");
  EXPECT_GT(tp.memory_forced_sp, 0);
  EXPECT_LT(tp.stages[0].tp_only_share, 0.5);
  EXPECT_GT(tp.stages[3].tp_only_share, 0.95);
  for (int s = 0; s + 1 < 4; ++s) {
    EXPECT_LE(tp.stages[s].tp_only_share, tp.stages[s + 1].tp_only_share) << "stage " << s;
  }
  for (const PolicyResult& p : r->policies) {
    for (size_t s = 0; s < p.stages.size(); ++s) {
      // Every policy runs the daemon's schedule-aware gate: no stage over the limit.
      EXPECT_EQ(p.stages[s].over_limit_steps, 0) << p.name << " stage " << s;
      EXPECT_LE(p.stages[s].peak_memory_bytes, r->memory_limit_bytes) << p.name << " stage " << s;
    }
  }
  // STATIC is DecideStagePlan: its TP-only answers on early stages meet the memory gate.
  const PolicyResult& st = *r->Find("static");
  EXPECT_GT(st.memory_forced_sp, 0);
  ASSERT_TRUE(st.decisions.contains("sp"));
  EXPECT_EQ(st.decisions.at("sp").at("memory_requires_sp"), st.memory_forced_sp);
  EXPECT_LT(st.stages[0].tp_only_share, st.stages[3].tp_only_share);
}

TEST(CompareCellTest, OnePipelineStageOfOneMicrobatchIsTodaysCompare) {
  SimOptions o;
  o.groups = 2;
  o.steps = 150;
  o.cost.tp = 4;
  o.bucketing = false;
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  absl::StatusOr<CompareResult> before = Compare(o, GateConfig{}, 0);
  o.pp = 1;
  o.microbatches = 1;
  o.vp = 1;
  o.schedule = PipelineSchedule::k1F1B;
  absl::StatusOr<CompareResult> after = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(before.status(), IsOk());
  ASSERT_THAT(after.status(), IsOk());
  EXPECT_FALSE(after->pipelined());
  EXPECT_EQ(CompareJson(*after), CompareJson(*before));
  EXPECT_EQ(CompareTable(*after), CompareTable(*before));
  EXPECT_THAT(CompareJson(*after), Not(HasSubstr("pipeline")));
  EXPECT_THAT(CompareJson(*after), Not(HasSubstr("stages")));
}

// The plain cell is the one-stage, one-micro-batch pipeline whose one op is the group's
// whole step: the fixed choices' tokens/s are CostModel's steps on the same batches and
// noise, replayed here by hand (a memory limit the batches all fit under).
TEST(CompareCellTest, PlainCellIsTheWholeStepAsOneOp) {
  SimOptions o;
  o.groups = 3;
  o.steps = 40;
  o.cost.tp = 4;
  o.cost.device_memory_gib = 1000;
  o.cost.switch_cost_s = 0.003;  // the fixed choices never switch: no cost
  o.bucketing = false;
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_FALSE(r->pipelined());
  EXPECT_EQ(r->pp, 1);
  EXPECT_EQ(r->microbatches, 1);
  const CostModel model(o.cost);
  double tokens = 0, sp_s = 0, tp_s = 0;
  uint64_t sp_peak = 0;
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, gi);
    ASSERT_THAT(b.status(), IsOk());
    std::mt19937_64 rng(GroupNoiseSeed(o.seed, gi));
    for (int64_t k = 0; k < o.steps; ++k) {
      const std::vector<int64_t> lengths = (*b)->Next(GateConfig{}.bucket_target_cv).lengths;
      std::mt19937_64 for_tp = rng;
      const GroupStep sp = model.Step(lengths, Mode::kSequenceParallel, rng, k);
      const GroupStep tp = model.Step(lengths, Mode::kTensorParallelOnly, for_tp, k);
      tokens += static_cast<double>(sp.effective_tokens);
      sp_s += sp.step_time_s;
      tp_s += tp.step_time_s;
      sp_peak = std::max(sp_peak, sp.peak_memory_bytes);
    }
  }
  EXPECT_DOUBLE_EQ(Tps(*r, "sp"), o.groups * tokens / sp_s);
  EXPECT_DOUBLE_EQ(Tps(*r, "tp_only"), o.groups * tokens / tp_s);
  EXPECT_EQ(r->Find("sp")->peak_memory_bytes, sp_peak);
  EXPECT_EQ(r->Find("sp")->switches, 0);
  EXPECT_EQ(r->Find("tp_only")->sp_steps, 0);
  // One stage, never idle: no bubble, no boundary.
  EXPECT_DOUBLE_EQ(r->Find("sp")->bubble_share, 0);
  EXPECT_EQ(r->Find("sp")->p2p_bytes_per_step, 0);
  EXPECT_EQ(r->Find("oracle")->sp_steps + r->Find("oracle")->tp_steps, o.groups * o.steps);
}

TEST(CompareCellTest, FlagsAreCheckedNamingTheFlag) {
  struct Case {
    std::string name;
    int pp, vp, microbatches;
    PipelineSchedule schedule;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"no stages", 0, 1, 1, PipelineSchedule::k1F1B, "--pp: must be in [1, 1024], got 0"},
      {"no micro-batches", 2, 1, 0, PipelineSchedule::k1F1B, "--microbatches: must be in"},
      {"chunks under 1F1B", 2, 2, 4, PipelineSchedule::k1F1B, "--vp: the 1F1B schedule"},
      {"interleaved, one chunk", 2, 1, 4, PipelineSchedule::kInterleaved1F1B,
       "--vp: the interleaved schedule needs at least 2"},
      {"interleaved, ragged groups", 4, 2, 6, PipelineSchedule::kInterleaved1F1B,
       "--microbatches: the interleaved schedule runs micro-batches in groups of pp=4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SimOptions o = Pipelined();
    o.pp = c.pp;
    o.vp = c.vp;
    o.microbatches = c.microbatches;
    o.schedule = c.schedule;
    EXPECT_THAT(PipelineLayoutOf(o),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.want)));
    EXPECT_THAT(Compare(o, GateConfig{}, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.want)));
  }
  SimOptions o = Pipelined();
  o.groups = 0;
  EXPECT_THAT(PipelineLayoutOf(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--groups")));
  o = Pipelined();
  o.cost.vocab = 0;
  EXPECT_THAT(Compare(o, GateConfig{}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--vocab must be >= 1")));
  o = Pipelined();
  o.cost.p2p_gbps = 0;
  EXPECT_THAT(Compare(o, GateConfig{}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--p2p_gbps must be > 0")));
  // Only --compare models pipelines.
  EXPECT_THAT(Replay(Pipelined(), GateConfig{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("replay --compare")));
  EXPECT_THAT(ParseSchedule("zb"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--schedule")));
  EXPECT_THAT(ParseSchedule("interleaved"), IsOkAndHolds(PipelineSchedule::kInterleaved1F1B));
  // The name the output prints reads back.
  EXPECT_THAT(ParseSchedule("interleaved_1f1b"),
              IsOkAndHolds(PipelineSchedule::kInterleaved1F1B));
}

TEST(CompareCellTest, InterleavedRuns) {
  SimOptions o = Pipelined();
  o.steps = 20;
  o.vp = 2;
  o.schedule = PipelineSchedule::kInterleaved1F1B;
  o.cost.layers = 8;  // 4 per chunk
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 0);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->vp, 2);
  EXPECT_EQ(r->schedule, "interleaved_1f1b");
  SimOptions flat = Pipelined();
  flat.steps = 20;
  absl::StatusOr<CompareResult> f = Compare(flat, GateConfig{}, 0);
  ASSERT_THAT(f.status(), IsOk());
  // Same work, a smaller bubble (the p2p messages double, chunk per chunk).
  EXPECT_LT(r->Find("sp")->bubble_share, f->Find("sp")->bubble_share);
  EXPECT_GT(r->Find("sp")->p2p_bytes_per_step, f->Find("sp")->p2p_bytes_per_step);
}

}  // namespace
}  // namespace spgate::sim
