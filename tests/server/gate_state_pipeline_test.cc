// Pipelined jobs in the live state (docs/design.md §12): layouts checked at Register with
// nothing changed on a refusal, step plans answered with one decision per micro-batch
// (idempotent, keyed by id), the schedule-aware memory gate per stage, CP peers answered
// alike, and SP-required jobs.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/gate_state.h"
#include "tests/server/state_harness.h"
#include "tests/server/test_util.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = "pipe";

class GateStatePipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StateOptions o;
    o.clock = [this] { return clock_.Now(); };
    o.stale_after = absl::Seconds(5);
    o.decision_cache_steps = 8;
    auto h = StateHarness::Create(o, StoreOptions{}, &metrics_);
    ASSERT_THAT(h.status(), IsOk());
    h_ = std::move(*h);
    // The length-CV gate wants TP-only for the plans below (CV 1.0 > 0.5).
    v1::UpdateGateConfigRequest u;
    u.mutable_config()->set_max_length_cv(0.5);
    u.mutable_config()->set_memory_headroom(1.0);
    ASSERT_THAT(h_->UpdateGateConfig(u).status(), IsOk());
  }

  // TP2 x PP4 x CP(cp) x DP1 with 4 micro-batches per step, 1F1B.
  static v1::JobLayout Layout(int cp = 1) {
    v1::JobLayout l;
    l.set_tp(2);
    l.set_pp(4);
    l.set_cp(cp);
    l.set_dp(1);
    l.set_microbatches(4);
    return l;
  }

  static v1::RegisterRequest Reg(int stage, int cp_rank = 0, int cp = 1) {
    v1::RegisterRequest r;
    r.set_job_id(kJob);
    r.set_group(stage * cp + cp_rank);
    r.set_rank_in_group(0);
    r.set_group_size(2);
    r.set_global_rank(2 * (stage * cp + cp_rank));
    r.set_group_session(true);
    *r.mutable_layout() = Layout(cp);
    r.mutable_coordinates()->set_stage(stage);
    r.mutable_coordinates()->set_cp_rank(cp_rank);
    return r;
  }

  // Micro-batches with lengths {1, 3} (CV 0.5... made 1.0 by {1, 1, 4}) and 10 / 20 bytes
  // of activations under SP / TP-only; resident 100; budget 145 (see the policy's test:
  // stage 0 of 4 holds 4 micro-batches, stage 3 one).
  static v1::BatchPlan StepPlan(int group, int64_t step, std::vector<int> order = {0, 1, 2, 3}) {
    v1::BatchPlan p;
    p.set_job_id(kJob);
    p.set_group(group);
    p.set_step(step);
    p.set_resident_bytes(100);
    p.set_memory_budget_bytes(145);
    for (int id : order) {
      v1::MicroBatchPlan* m = p.add_micro_batches();
      m->set_id(id);
      for (int64_t l : {1, 1, 10}) m->add_lengths(l);  // CV ~1.06
      m->set_activation_bytes_sp(10);
      m->set_activation_bytes_tp(20);
    }
    return p;
  }

  static std::vector<std::pair<v1::Mode, v1::Reason>> Modes(const v1::Decision& d) {
    std::vector<std::pair<v1::Mode, v1::Reason>> out;
    for (const auto& m : d.micro_batches()) out.emplace_back(m.mode(), m.reason());
    return out;
  }

  FakeClock clock_;
  Metrics metrics_;
  std::unique_ptr<StateHarness> h_;
};

TEST_F(GateStatePipelineTest, FirstStageRunsSpWhereTheLastRunsTpOnly) {
  ASSERT_THAT(h_->Register(Reg(0)).status(), IsOk());
  ASSERT_THAT(h_->Register(Reg(3)).status(), IsOk());
  v1::Decision first, last;
  ASSERT_THAT(h_->Decide(StepPlan(0, 0), &first), IsOk());
  ASSERT_THAT(h_->Decide(StepPlan(3, 0), &last), IsOk());
  const auto sp = std::make_pair(v1::SEQUENCE_PARALLEL, v1::MEMORY_REQUIRES_SP);
  const auto tp = std::make_pair(v1::TENSOR_PARALLEL_ONLY, v1::LENGTH_CV);
  EXPECT_THAT(Modes(first), ElementsAre(sp, sp, sp, sp));
  EXPECT_THAT(Modes(last), ElementsAre(tp, tp, tp, tp));
  EXPECT_EQ(first.predicted_stage_peak_bytes(), 140u);
  EXPECT_EQ(last.predicted_stage_peak_bytes(), 120u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first.micro_batches(i).id(), i);

  // Every micro-batch decision counts, and GetJob shows the layout and where groups sit.
  // The stages' series (the sweep exports them): stage 0 all SP at 140 bytes, stage 3 all
  // TP-only at 120.
  h_->Sweep();
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_stage_predicted_peak_bytes{job_id=\"pipe\",stage=\"0\"} 140"));
  EXPECT_THAT(text, HasSubstr("spgate_stage_tp_only_share{job_id=\"pipe\",stage=\"0\"} 0"));
  EXPECT_THAT(text, HasSubstr("spgate_stage_tp_only_share{job_id=\"pipe\",stage=\"3\"} 1"));
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->layout().pp(), 4);
  EXPECT_EQ(job->layout().microbatches(), 4);
  int64_t counted = 0;
  for (const auto& c : job->decisions()) counted += c.count();
  EXPECT_EQ(counted, 8);
  ASSERT_EQ(job->groups_size(), 2);
  EXPECT_EQ(job->groups(1).coordinates().stage(), 3);
  EXPECT_EQ(job->groups(0).predicted_stage_peak_bytes(), 140u);
}

TEST_F(GateStatePipelineTest, StepPlansAreIdempotentByMicrobatchId) {
  ASSERT_THAT(h_->Register(Reg(3)).status(), IsOk());
  v1::Decision a, b;
  ASSERT_THAT(h_->Decide(StepPlan(3, 0), &a), IsOk());
  // The same micro-batches sent in another order are the same plan.
  ASSERT_THAT(h_->Decide(StepPlan(3, 0, {3, 1, 0, 2}), &b), IsOk());
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  // Another plan for the decided step is refused.
  v1::BatchPlan other = StepPlan(3, 0);
  other.mutable_micro_batches(2)->set_activation_bytes_tp(21);
  EXPECT_THAT(h_->Decide(other, &b), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(GateStatePipelineTest, BadStepPlansNameTheMicrobatch) {
  ASSERT_THAT(h_->Register(Reg(1)).status(), IsOk());
  v1::Decision d;
  EXPECT_THAT(h_->Decide(StepPlan(1, 0, {0, 1, 1, 3}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 1 repeats")));
  EXPECT_THAT(h_->Decide(StepPlan(1, 0, {0, 1, 3}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 2 is missing")));
  v1::BatchPlan bad_len = StepPlan(1, 0);
  bad_len.mutable_micro_batches(2)->set_lengths(1, 0);
  EXPECT_THAT(h_->Decide(bad_len, &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro_batches[id=2]")));
  v1::BatchPlan plain;
  plain.set_job_id(kJob);
  plain.set_group(1);
  plain.set_step(0);
  plain.add_lengths(5);
  EXPECT_THAT(h_->Decide(plain, &d), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("one entry per micro-batch")));
  // Nothing was decided by any of them.
  ASSERT_THAT(h_->Decide(StepPlan(1, 0), &d), IsOk());
  EXPECT_EQ(d.micro_batches_size(), 4);
}

TEST_F(GateStatePipelineTest, ALayoutThatDisagreesIsRefusedAndChangesNothing) {
  ASSERT_THAT(h_->Register(Reg(0)).status(), IsOk());
  v1::RegisterRequest other = Reg(1);
  other.mutable_layout()->set_microbatches(8);
  EXPECT_THAT(h_->Register(other).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.microbatches")));
  v1::RegisterRequest wrong_group = Reg(1);
  wrong_group.set_group(2);
  EXPECT_THAT(h_->Register(wrong_group).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("coordinates")));
  v1::RegisterRequest no_layout = Reg(1);
  no_layout.clear_layout();
  no_layout.clear_coordinates();
  EXPECT_THAT(h_->Register(no_layout).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sent none")));
  v1::RegisterRequest tp_mismatch = Reg(1);
  tp_mismatch.set_group_size(4);
  EXPECT_THAT(h_->Register(tp_mismatch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.tp")));
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->groups_size(), 1);  // no refused rank created its group
  EXPECT_EQ(job->layout().microbatches(), 4);

  // A job of ranks without a layout refuses one with, and takes no step plans.
  v1::RegisterRequest legacy = Reg(0);
  legacy.set_job_id("legacy");
  legacy.clear_layout();
  legacy.clear_coordinates();
  ASSERT_THAT(h_->Register(legacy).status(), IsOk());
  v1::RegisterRequest late = Reg(1);
  late.set_job_id("legacy");
  EXPECT_THAT(h_->Register(late).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a layout")));
  v1::BatchPlan p = StepPlan(0, 0);
  p.set_job_id("legacy");
  v1::Decision d;
  EXPECT_THAT(h_->Decide(p, &d),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("micro_batches: job legacy registered no layout")));
}

// The CP ranks' groups of one (replica, stage) run one decision whichever asks first, and
// must send the same plan.
TEST_F(GateStatePipelineTest, CpPeersGetOneDecision) {
  ASSERT_THAT(h_->Register(Reg(0, 0, 2)).status(), IsOk());
  ASSERT_THAT(h_->Register(Reg(0, 1, 2)).status(), IsOk());
  v1::Decision a0, b0, a1, b1;
  ASSERT_THAT(h_->Decide(StepPlan(0, 0), &a0), IsOk());
  clock_.Advance(absl::Milliseconds(5));
  ASSERT_THAT(h_->Decide(StepPlan(1, 0), &b0), IsOk());
  EXPECT_EQ(b0.group(), 1);
  b0.set_group(0);
  EXPECT_EQ(a0.SerializeAsString(), b0.SerializeAsString());  // even its time
  // The other peer first this time.
  ASSERT_THAT(h_->Decide(StepPlan(1, 1), &b1), IsOk());
  ASSERT_THAT(h_->Decide(StepPlan(0, 1), &a1), IsOk());
  EXPECT_EQ(Modes(a1), Modes(b1));
  v1::BatchPlan differs = StepPlan(0, 2);
  ASSERT_THAT(h_->Decide(differs, &a1), IsOk());
  v1::BatchPlan peer = StepPlan(1, 2);
  peer.set_resident_bytes(101);
  EXPECT_THAT(h_->Decide(peer, &b1),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("CP peer group 0")));
}

// A CP peer runs its first group's answer, ADAPTIVE's probes among them: the job's
// exploration counter counts them once per group that runs them, as the decision counter
// counts the decisions (the alert on the wait gate's fallback share subtracts the one
// from the other).
TEST_F(GateStatePipelineTest, CpPeersCountTheExplorationTheyRun) {
  v1::UpdateGateConfigRequest u;
  u.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  u.mutable_config()->set_adaptive_explore_share(1.0);  // a band still learning: every step
  ASSERT_THAT(h_->UpdateGateConfig(u).status(), IsOk());
  ASSERT_THAT(h_->Register(Reg(0, 0, 2)).status(), IsOk());
  ASSERT_THAT(h_->Register(Reg(0, 1, 2)).status(), IsOk());
  int probes = 0;
  for (int64_t step = 0; step < 8; ++step) {
    v1::Decision first, peer;
    ASSERT_THAT(h_->Decide(StepPlan(0, step), &first), IsOk());
    ASSERT_THAT(h_->Decide(StepPlan(1, step), &peer), IsOk());
    for (const v1::MicroBatchDecision& m : first.micro_batches()) {
      probes += m.reason() == v1::PROBE ? 1 : 0;
    }
  }
  ASSERT_GT(probes, 0);
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr(absl::StrCat("spgate_adaptive_exploration_steps_total{job_id=\"pipe\"} ",
                                           2 * probes)));
}

// A stage that has not learned a micro-batch's lengths sends none: that micro-batch runs
// SP, and the reasons reach the decision counters (which the dashboards read).
TEST_F(GateStatePipelineTest, MicrobatchesWithoutLengthsRunSpAndAreCounted) {
  ASSERT_THAT(h_->Register(Reg(3)).status(), IsOk());
  v1::BatchPlan p = StepPlan(3, 0);
  p.mutable_micro_batches(1)->clear_lengths();
  v1::Decision d;
  ASSERT_THAT(h_->Decide(p, &d), IsOk());
  EXPECT_EQ(d.micro_batches(1).mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(d.micro_batches(1).reason(), v1::LENGTHS_UNKNOWN);
  EXPECT_EQ(d.micro_batches(2).mode(), v1::TENSOR_PARALLEL_ONLY);
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("reason=\"lengths_unknown\"} 1"));
  EXPECT_THAT(text, HasSubstr("reason=\"length_cv\"} 3"));
}

// One decision per (replica, stage) means one pin: the unit's first CP group's.
TEST_F(GateStatePipelineTest, CpPeersFollowTheirFirstGroupsPin) {
  ASSERT_THAT(h_->Register(Reg(0, 0, 2)).status(), IsOk());
  ASSERT_THAT(h_->Register(Reg(0, 1, 2)).status(), IsOk());
  v1::PinModeRequest pin;
  pin.set_job_id(kJob);
  pin.set_group(0);
  pin.set_mode(v1::SEQUENCE_PARALLEL);
  pin.mutable_duration()->set_seconds(60);
  ASSERT_THAT(h_->PinMode(pin).status(), IsOk());
  v1::Decision d;
  ASSERT_THAT(h_->Decide(StepPlan(1, 0), &d), IsOk());  // the second peer asks first
  const auto pinned = std::make_pair(v1::SEQUENCE_PARALLEL, v1::PINNED);
  EXPECT_THAT(Modes(d), ElementsAre(pinned, pinned, pinned, pinned));
}

// The step-plan cache is bounded in bytes: an answer whose micro-batch part was evicted is
// not served without it (a retry that old is refused, as any evicted step is).
TEST(GateStatePipelineCacheTest, EvictedStepPlansAreRefusedNotAnsweredHalf) {
  FakeClock clock;
  Metrics metrics;
  StateOptions o;
  o.clock = [&clock] { return clock.Now(); };
  o.decision_cache_steps = 64;
  o.max_sequences_per_plan = 1 << 16;
  auto h = StateHarness::Create(o, StoreOptions{}, &metrics);
  ASSERT_THAT(h.status(), IsOk());
  v1::RegisterRequest r;
  r.set_job_id("big");
  r.set_group_size(1);
  r.mutable_layout()->set_tp(1);
  r.mutable_layout()->set_pp(1);
  r.mutable_layout()->set_dp(1);
  r.mutable_layout()->set_microbatches(4096);
  ASSERT_THAT((*h)->Register(r).status(), IsOk());
  auto plan = [](int64_t step) {
    v1::BatchPlan p;
    p.set_job_id("big");
    p.set_step(step);
    for (int id = 0; id < 4096; ++id) {
      v1::MicroBatchPlan* m = p.add_micro_batches();
      m->set_id(id);
      m->add_lengths(100 + id % 7);
    }
    return p;
  };
  v1::Decision d;
  for (int64_t step = 0; step < 20; ++step) {
    clock.Advance(absl::Milliseconds(10));
    ASSERT_THAT((*h)->Decide(plan(step), &d), IsOk()) << step;
  }
  // 64 KiB keeps 16 steps of 4,096 micro-batches: step 19 is answered whole, step 2 not.
  ASSERT_THAT((*h)->Decide(plan(19), &d), IsOk());
  EXPECT_EQ(d.micro_batches_size(), 4096);
  EXPECT_THAT((*h)->Decide(plan(2), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no longer cached")));
}

TEST_F(GateStatePipelineTest, SpRequiredFeaturesLockTheJobToSp) {
  v1::RegisterRequest r = Reg(3);
  r.add_sp_required("cuda_graphs");
  ASSERT_THAT(h_->Register(r).status(), IsOk());
  v1::PinModeRequest pin;
  pin.set_job_id(kJob);
  pin.set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin.set_force(true);
  pin.mutable_duration()->set_seconds(60);
  ASSERT_THAT(h_->PinMode(pin).status(), IsOk());
  v1::Decision d;
  ASSERT_THAT(h_->Decide(StepPlan(3, 0), &d), IsOk());
  const auto locked = std::make_pair(v1::SEQUENCE_PARALLEL, v1::SP_REQUIRED);
  EXPECT_THAT(Modes(d), ElementsAre(locked, locked, locked, locked));
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_THAT(job->sp_required(), ElementsAre("cuda_graphs"));
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()),
              HasSubstr("reason=\"sp_required\"} 4"));

  v1::RegisterRequest bad = Reg(2);
  bad.add_sp_required("CUDA graphs");
  EXPECT_THAT(h_->Register(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sp_required")));

  // A job without a layout is locked the same way.
  v1::RegisterRequest legacy = Reg(0);
  legacy.set_job_id("moe");
  legacy.clear_layout();
  legacy.clear_coordinates();
  legacy.add_sp_required("moe_expert_tp");
  ASSERT_THAT(h_->Register(legacy).status(), IsOk());
  v1::BatchPlan p;
  p.set_job_id("moe");
  p.set_group(0);
  p.set_step(0);
  for (int64_t l : {1, 1, 10}) p.add_lengths(l);
  ASSERT_THAT(h_->Decide(p, &d), IsOk());
  EXPECT_EQ(d.mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(d.reason(), v1::SP_REQUIRED);

  // The what-if view answers as the job's decisions do, with and without a group; a job
  // without the feature gets the length-CV gate's TP-only for the same lengths.
  const std::vector<int64_t> lengths = {1, 1, 10};
  for (const auto& [job_id, group, mode, reason] :
       {std::tuple{"moe", std::optional<int>(0), Mode::kSequenceParallel, Reason::kSpRequired},
        std::tuple{"moe", std::optional<int>(), Mode::kSequenceParallel, Reason::kSpRequired},
        std::tuple{"", std::optional<int>(), Mode::kTensorParallelOnly,
                   Reason::kLengthCv}}) {
    GateConfig config;
    config.max_length_cv = 0.5;
    const absl::StatusOr<WhatIfResult> w = h_->state->WhatIf(
        {.job_id = job_id, .group = group, .config = config, .lengths = lengths});
    ASSERT_THAT(w.status(), IsOk());
    EXPECT_EQ(w->decision.mode, mode) << job_id;
    EXPECT_EQ(w->decision.reason, reason) << job_id;
  }
}


// A stage's telemetry: one record per micro-batch, ids 0 and 1 run SP, 2 and 3 TP-only,
// each 12 tokens in `sp_s` / `tp_s` seconds of compute; the group's record (ranks = 2).
v1::StepTelemetry StageTelemetry(int group, int64_t step, double sp_s, double tp_s) {
  v1::StepTelemetry t;
  t.set_job_id(kJob);
  t.set_group(group);
  t.set_step(step);
  t.set_mode(v1::SEQUENCE_PARALLEL);
  t.set_step_time_s(4 * (sp_s + tp_s));
  t.set_effective_tokens(48);
  t.set_ranks(2);
  for (int id = 0; id < 4; ++id) {
    v1::MicroBatchTelemetry* m = t.add_micro_batches();
    m->set_id(id);
    const bool sp = id < 2;
    m->set_mode(sp ? v1::SEQUENCE_PARALLEL : v1::TENSOR_PARALLEL_ONLY);
    m->set_forward_s((sp ? sp_s : tp_s) / 3);
    m->set_backward_s((sp ? sp_s : tp_s) * 2 / 3);
    m->set_effective_tokens(12);
  }
  return t;
}

// ADAPTIVE learns each stage from its own micro-batches: stage 0, where TP-only is
// slower, departs from the gates' TP-only (CV ~1.06) to SP; stage 3, where it is faster,
// runs the gates' TP-only with their reason; each stage's leader gets its stage's table.
TEST_F(GateStatePipelineTest, EachStageLearnsFromItsOwnMicrobatches) {
  v1::UpdateGateConfigRequest u;
  u.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  ASSERT_THAT(h_->UpdateGateConfig(u).status(), IsOk());
  absl::StatusOr<v1::RegisterResponse> r0 = h_->Register(Reg(0));
  absl::StatusOr<v1::RegisterResponse> r3 = h_->Register(Reg(3));
  ASSERT_THAT(r0.status(), IsOk());
  ASSERT_THAT(r3.status(), IsOk());
  auto sink0 = std::make_shared<RecordingSink>(), sink3 = std::make_shared<RecordingSink>();
  absl::StatusOr<std::shared_ptr<Session>> s0 = h_->AttachSession(r0->session_id(), sink0);
  absl::StatusOr<std::shared_ptr<Session>> s3 = h_->AttachSession(r3->session_id(), sink3);
  ASSERT_THAT(s0.status(), IsOk());
  ASSERT_THAT(s3.status(), IsOk());
  auto plan = [](int group, int64_t step) {
    v1::BatchPlan p = StepPlan(group, step);
    p.set_memory_budget_bytes(0);  // the learned rates decide, not memory
    return p;
  };
  constexpr int kSteps = 10;  // 20 samples a mode: past adaptive_min_samples, no probes
  for (int64_t step = 0; step < kSteps; ++step) {
    v1::Decision d;
    ASSERT_THAT(h_->Decide(plan(0, step), &d), IsOk());
    ASSERT_THAT(h_->Decide(plan(3, step), &d), IsOk());
    ASSERT_THAT(h_->RecordTelemetry(**s0, StageTelemetry(0, step, 0.1, 0.2)), IsOk());
    ASSERT_THAT(h_->RecordTelemetry(**s3, StageTelemetry(3, step, 0.2, 0.1)), IsOk());
    clock_.Advance(absl::Seconds(2));  // past learned_push_interval
  }
  v1::Decision first, last;
  ASSERT_THAT(h_->Decide(plan(0, kSteps), &first), IsOk());
  ASSERT_THAT(h_->Decide(plan(3, kSteps), &last), IsOk());
  const auto sp = std::make_pair(v1::SEQUENCE_PARALLEL, v1::ADAPTIVE);
  const auto tp = std::make_pair(v1::TENSOR_PARALLEL_ONLY, v1::LENGTH_CV);
  EXPECT_THAT(Modes(first), ElementsAre(sp, sp, sp, sp));
  EXPECT_THAT(Modes(last), ElementsAre(tp, tp, tp, tp));

  // Each leader's fallback got its own stage's table: SP ahead on stage 0, TP-only on 3.
  ASSERT_FALSE(sink0->learned.empty());
  ASSERT_FALSE(sink3->learned.empty());
  const GateConfig config = [&] {
    GateConfig c;
    c.policy = GatePolicyKind::kAdaptive;
    c.max_length_cv = 0.5;
    c.memory_headroom = 1.0;
    return c;
  }();
  const int band = BandOf(config, 1.0606601717798212, 12);
  const BandEstimate e0 = EstimateBand(config, &sink0->learned.back(), band, kSteps);
  const BandEstimate e3 = EstimateBand(config, &sink3->learned.back(), band, kSteps);
  ASSERT_TRUE(e0.known);
  ASSERT_TRUE(e3.known);
  EXPECT_EQ(e0.preferred, Mode::kSequenceParallel);
  EXPECT_EQ(e3.preferred, Mode::kTensorParallelOnly);
  EXPECT_NEAR(e0.sp.tokens_per_s, 120, 1e-6);  // 12 tokens in 0.1 s
  EXPECT_NEAR(e3.tp.tokens_per_s, 120, 1e-6);
  EXPECT_NEAR(e0.ratio, 0.5, 1e-9);
  // And the stages' estimates are exported per (stage, band, mode).
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  const std::string series = absl::StrCat("spgate_stage_adaptive_tokens_per_second{band=\"",
                                          BandLabel(band), "\",job_id=\"pipe\",");
  const auto value = [&](const std::string& labels) {  // the series' value; NaN: absent
    const std::string head = absl::StrCat(series, labels, "} ");
    const size_t at = text.find(head);
    double v = std::nan("");
    if (at != std::string::npos) {
      const size_t end = text.find('\n', at);
      EXPECT_TRUE(absl::SimpleAtod(text.substr(at + head.size(), end - at - head.size()), &v));
    }
    return v;
  };
  EXPECT_NEAR(value("mode=\"sp\",stage=\"0\""), 120, 1e-9);
  EXPECT_FALSE(std::isnan(value("mode=\"tp_only\",stage=\"0\"")));
  EXPECT_NEAR(value("mode=\"tp_only\",stage=\"3\""), 120, 1e-9);
}

// GetJob's MODES window counts micro-batches by the mode each ran (docs/design.md §12): a
// stage's record is SP when any of its micro-batches ran SP, yet half of them ran TP-only;
// each mode's tokens/s is its micro-batches' tokens over their compute on the stage. The
// summary counts group-steps and micro-batch decisions apart.
TEST_F(GateStatePipelineTest, ModesCountMicrobatchesByTheModeEachRan) {
  absl::StatusOr<v1::RegisterResponse> r0 = h_->Register(Reg(0));
  absl::StatusOr<v1::RegisterResponse> r3 = h_->Register(Reg(3));
  ASSERT_THAT(r0.status(), IsOk());
  ASSERT_THAT(r3.status(), IsOk());
  auto sink = std::make_shared<RecordingSink>();
  absl::StatusOr<std::shared_ptr<Session>> s0 = h_->AttachSession(r0->session_id(), sink);
  absl::StatusOr<std::shared_ptr<Session>> s3 = h_->AttachSession(r3->session_id(), sink);
  ASSERT_THAT(s0.status(), IsOk());
  ASSERT_THAT(s3.status(), IsOk());
  constexpr int kSteps = 11;  // 2 stages x 11 steps x 2 TP-only micro-batches = 44
  for (int64_t step = 0; step < kSteps; ++step) {
    v1::Decision d;
    ASSERT_THAT(h_->Decide(StepPlan(0, step), &d), IsOk());
    ASSERT_THAT(h_->Decide(StepPlan(3, step), &d), IsOk());
    v1::StepTelemetry t0 = StageTelemetry(0, step, 0.1, 0.2);
    v1::StepTelemetry t3 = StageTelemetry(3, step, 0.1, 0.2);
    t0.set_peak_memory_bytes(1000);
    t3.set_peak_memory_bytes(2000);
    ASSERT_THAT(h_->RecordTelemetry(**s0, t0), IsOk());
    ASSERT_THAT(h_->RecordTelemetry(**s3, t3), IsOk());
  }
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->summary().group_steps_decided(), 2 * kSteps);
  EXPECT_EQ(job->summary().steps_decided(), 2 * kSteps * 4) << "one per micro-batch";
  ASSERT_EQ(job->mode_stats_size(), 2);
  for (const v1::ModeStats& m : job->mode_stats()) {
    const bool sp = m.mode() == v1::SEQUENCE_PARALLEL;
    SCOPED_TRACE(v1::Mode_Name(m.mode()));
    EXPECT_EQ(m.microbatches(), 2 * kSteps * 2);
    EXPECT_EQ(m.steps(), 2 * kSteps) << "group-steps with a micro-batch of the mode";
    EXPECT_NEAR(m.effective_tokens_per_s(), sp ? 120 : 60, 1e-6);  // 12 tokens in 0.1 / 0.2 s
    EXPECT_NEAR(m.step_time_p95_s(), sp ? 0.1 : 0.2, 1e-9);
    EXPECT_EQ(m.peak_memory_bytes(), 2000u);
  }
  EXPECT_NEAR(job->mode_stats(0).tokens_per_s_vs_tp(), 2.0, 1e-9);
}

// A stage learns a switch's cost per micro-batch, as a plain group does per step: on
// stage 0 the micro-batch after a change of the stage's mode (id 2, SP -> TP-only; id 0 of
// the next step, TP-only -> SP) takes 0.05 s longer, and its table measures that excess
// on id 2 (id 0's SP is the memory gate's: a forced step measures no cost); stage 1, the
// same without the excess, measures none.
TEST_F(GateStatePipelineTest, AStageLearnsTheSwitchCostFromTheMicrobatchAfterASwitch) {
  constexpr double kExtra[] = {0.05, 0.0};  // by stage
  std::shared_ptr<Session> sessions[2];
  for (int stage : {0, 1}) {
    absl::StatusOr<v1::RegisterResponse> r = h_->Register(Reg(stage));
    ASSERT_THAT(r.status(), IsOk());
    absl::StatusOr<std::shared_ptr<Session>> s = h_->state->FindSession(r->session_id());
    ASSERT_THAT(s.status(), IsOk());
    sessions[stage] = *s;
  }
  for (int64_t step = 0; step < 30; ++step) {
    for (int stage : {0, 1}) {
      v1::Decision d;
      ASSERT_THAT(h_->Decide(StepPlan(stage, step), &d), IsOk());
      v1::StepTelemetry t = StageTelemetry(stage, step, 0.1, 0.2);
      for (v1::MicroBatchTelemetry& m : *t.mutable_micro_batches()) {
        if (m.id() == 2 || (m.id() == 0 && step > 0)) {
          m.set_forward_s(m.forward_s() + kExtra[stage]);
        }
      }
      t.set_step_time_s(t.step_time_s() + 2 * kExtra[stage]);
      ASSERT_THAT(h_->RecordTelemetry(*sessions[stage], t), IsOk());
    }
  }
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_GE(job->stage_learned_size(), 2);
  const v1::LearnedSwitchCost& switching = job->stage_learned(0).switch_cost();
  const v1::LearnedSwitchCost& free = job->stage_learned(1).switch_cost();
  // The cost is a forgetting mean: its weighted sum over its weight.
  ASSERT_GT(switching.weight(), 0);
  ASSERT_GT(free.weight(), 0);
  // Below the 0.05 s injected — the step after a switch enters its cell as it ran, so
  // TP-only's estimate holds half the excess (id 2's, beside id 3) — and well above 0.
  EXPECT_GT(switching.seconds() / switching.weight(), 0.02);
  EXPECT_LT(switching.seconds() / switching.weight(), 0.05 + 1e-9);
  EXPECT_NEAR(free.seconds() / free.weight(), 0, 1e-9);
}

// A stage's exploration micro-batches are counted where a plain job's exploration steps
// are: GetJob's exploration_steps and spgate_adaptive_exploration_steps_total agree.
TEST_F(GateStatePipelineTest, StageExplorationIsCountedInTheMetric) {
  v1::UpdateGateConfigRequest u;
  u.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  ASSERT_THAT(h_->UpdateGateConfig(u).status(), IsOk());
  absl::StatusOr<v1::RegisterResponse> r0 = h_->Register(Reg(0));
  ASSERT_THAT(r0.status(), IsOk());
  absl::StatusOr<std::shared_ptr<Session>> s0 = h_->state->FindSession(r0->session_id());
  ASSERT_THAT(s0.status(), IsOk());
  for (int64_t step = 0; step < 40; ++step) {
    v1::BatchPlan p = StepPlan(0, step);
    p.set_memory_budget_bytes(0);
    v1::Decision d;
    ASSERT_THAT(h_->Decide(p, &d), IsOk());
    ASSERT_THAT(h_->RecordTelemetry(**s0, StageTelemetry(0, step, 0.1, 0.2)), IsOk());
  }
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_GT(job->exploration_steps(), 0) << "a learning band explores";
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()),
              HasSubstr(absl::StrCat("spgate_adaptive_exploration_steps_total{job_id=\"pipe\"} ",
                                     job->exploration_steps(), "\n")));
}

TEST_F(GateStatePipelineTest, BadMicrobatchTelemetryIsRefusedByName) {
  absl::StatusOr<v1::RegisterResponse> r0 = h_->Register(Reg(0));
  ASSERT_THAT(r0.status(), IsOk());
  absl::StatusOr<std::shared_ptr<Session>> s0 = h_->state->FindSession(r0->session_id());
  ASSERT_THAT(s0.status(), IsOk());
  v1::Decision d;
  ASSERT_THAT(h_->Decide(StepPlan(0, 0), &d), IsOk());
  v1::StepTelemetry repeated = StageTelemetry(0, 0, 0.1, 0.2);
  repeated.mutable_micro_batches(3)->set_id(1);
  EXPECT_THAT(h_->RecordTelemetry(**s0, repeated),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 1 repeats")));
  v1::StepTelemetry short_of_one = StageTelemetry(0, 0, 0.1, 0.2);
  short_of_one.mutable_micro_batches()->RemoveLast();
  EXPECT_THAT(h_->RecordTelemetry(**s0, short_of_one),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 records")));
  v1::StepTelemetry no_time = StageTelemetry(0, 0, 0.1, 0.2);
  no_time.mutable_micro_batches(2)->set_forward_s(0);
  no_time.mutable_micro_batches(2)->set_backward_s(0);
  EXPECT_THAT(h_->RecordTelemetry(**s0, no_time),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[id 2]")));
  // The refusals changed nothing: the step's good record is still taken.
  EXPECT_THAT(h_->RecordTelemetry(**s0, StageTelemetry(0, 0, 0.1, 0.2)), IsOk());

  // A job without a layout has no micro-batches to report.
  v1::BatchPlan plain;
  plain.set_job_id("plain");
  plain.set_group(0);
  plain.set_step(0);
  for (int64_t l : {100, 200}) plain.add_lengths(l);
  ASSERT_THAT(h_->Decide(plain, &d), IsOk());
  v1::StepTelemetry t = StageTelemetry(0, 0, 0.1, 0.2);
  t.set_job_id("plain");
  t.clear_ranks();
  absl::StatusOr<std::shared_ptr<Session>> plain_session =
      h_->state->FindSession(h_->LeaderSession("plain", 0));
  ASSERT_THAT(plain_session.status(), IsOk());
  EXPECT_THAT(h_->RecordTelemetry(**plain_session, t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only a job with a layout")));
}

// A record cannot poison a stage's learned table (docs/design.md §2, "Range rules"): the
// largest int64 of tokens over the smallest positive double, more tokens than the plan
// gave the micro-batch (or the step), 1e18 tokens over 1e-300 s, or a wait longer than
// its micro-batch's compute, is refused naming the micro-batch and the field before it
// is folded in. The stage's cells and their exported rates stay as they were, finite,
// and the step's good record is still taken afterwards (the refusals marked nothing).
TEST_F(GateStatePipelineTest, ARecordCannotPoisonTheStagesLearnedTable) {
  v1::UpdateGateConfigRequest u;
  u.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  ASSERT_THAT(h_->UpdateGateConfig(u).status(), IsOk());
  absl::StatusOr<v1::RegisterResponse> r0 = h_->Register(Reg(0));
  ASSERT_THAT(r0.status(), IsOk());
  absl::StatusOr<std::shared_ptr<Session>> s0 = h_->state->FindSession(r0->session_id());
  ASSERT_THAT(s0.status(), IsOk());
  v1::Decision d;
  for (int64_t step = 0; step < 4; ++step) {
    ASSERT_THAT(h_->Decide(StepPlan(0, step), &d), IsOk());
    ASSERT_THAT(h_->RecordTelemetry(**s0, StageTelemetry(0, step, 0.1, 0.2)), IsOk());
  }
  ASSERT_THAT(h_->Decide(StepPlan(0, 4), &d), IsOk());
  auto stage0 = [&] {
    absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
    EXPECT_THAT(job.status(), IsOk());
    return job.ok() && job->stage_learned_size() > 0 ? job->stage_learned(0).SerializeAsString()
                                                     : std::string();
  };
  const std::string before = stage0();
  ASSERT_FALSE(before.empty());

  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  struct Case {
    std::function<void(v1::StepTelemetry&)> poison;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](v1::StepTelemetry& t) {
         v1::MicroBatchTelemetry* m = t.mutable_micro_batches(2);
         m->set_effective_tokens(kHuge);
         m->set_forward_s(5e-324);
         m->set_backward_s(0);
       },
       "telemetry.micro_batches[id 2]: forward_s + backward_s must be finite and >= 1e-06"},
      {[](v1::StepTelemetry& t) { t.mutable_micro_batches(2)->set_effective_tokens(kHuge); },
       "telemetry.micro_batches[id 2].effective_tokens: must be in [0, 2^53 - 1]"},
      {[](v1::StepTelemetry& t) { t.mutable_micro_batches(2)->set_effective_tokens(13); },
       "telemetry.micro_batches[id 2].effective_tokens: 13 exceeds the "
       "plan's 12 tokens for micro-batch 2"},
      {[](v1::StepTelemetry& t) {
         v1::MicroBatchTelemetry* m = t.mutable_micro_batches(1);
         m->set_effective_tokens(1'000'000'000'000'000'000);
         m->set_forward_s(1e-300);
         m->set_backward_s(0);
       },
       "telemetry.micro_batches[id 1]: forward_s + backward_s"},
      {[](v1::StepTelemetry& t) { t.mutable_micro_batches(0)->set_rs_wait_s(1.0); },
       "telemetry.micro_batches[id 0].rs_wait_s: 1 is more than the micro-batch's"},
      {[](v1::StepTelemetry& t) { t.set_effective_tokens(1'000'000'000'000'000); },
       "telemetry.effective_tokens: 1000000000000000 exceeds the plan's 48 tokens"},
      {[](v1::StepTelemetry& t) { t.set_step_time_s(1e-300); },
       "telemetry.step_time_s: must be finite and >= 1e-06"},
  };
  for (const Case& c : cases) {
    v1::StepTelemetry t = StageTelemetry(0, 4, 0.1, 0.2);
    c.poison(t);
    EXPECT_THAT(h_->RecordTelemetry(**s0, t),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.message;
  }
  EXPECT_EQ(stage0(), before) << "a refused record changes no learned cell";
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "spgate_stage_adaptive_tokens_per_second{")) continue;
    EXPECT_THAT(line, Not(AnyOf(HasSubstr("Inf"), HasSubstr("NaN"), HasSubstr("inf"),
                                HasSubstr("nan"))));
  }
  // The step's own record is still taken and learned from.
  ASSERT_THAT(h_->RecordTelemetry(**s0, StageTelemetry(0, 4, 0.1, 0.2)), IsOk());
  EXPECT_NE(stage0(), before);
}

// A layout whose TP groups (dp x pp x cp) exceed --max_groups_per_job is refused at
// Register naming the flag, before anything changes: the job takes the next rank's
// smaller layout.
TEST_F(GateStatePipelineTest, ALayoutOfMoreGroupsThanTheLimitIsRefused) {
  // A live launch of the job; a new launch with too many groups is refused before it
  // could take the job over: the live one keeps it and its decisions.
  ASSERT_THAT(h_->Register(Reg(0)).status(), IsOk());
  v1::Decision d;
  ASSERT_THAT(h_->Decide(StepPlan(0, 0), &d), IsOk());
  v1::RegisterRequest big = Reg(0);
  big.set_incarnation("relaunch-too-big");
  big.set_launch_credential("another-launch-credential-0123456789abcdef");
  big.mutable_layout()->set_dp(1025);  // 4 stages x 1025 = 4100 groups > 4096
  EXPECT_THAT(h_->Register(big).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4100 TP groups, more than 4096 (--max_groups_per_job)")));
  absl::StatusOr<v1::Job> job = h_->GetJob(kJob);
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->summary().incarnation(), StateHarness::kIncarnation);
  ASSERT_THAT(h_->Decide(StepPlan(0, 1), &d), IsOk());

  big = Reg(0);
  big.set_job_id("pipe-at-the-limit");
  big.mutable_layout()->set_dp(1024);  // 4096: at the limit
  EXPECT_THAT(h_->Register(big).status(), IsOk());
}

}  // namespace
}  // namespace spgate::server
