// GateState driven by a fake clock: sessions, staleness, idempotent decisions, the
// rolling window, effective_from_step scheduling, pins, and what operator changes made
// through the real store do to live groups and streams (persist-before-apply included).
// The operator store on its own is operator_store_test.cc.
#include "server/gate_state.h"

#include <cmath>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/exploration.h"
#include "prometheus/text_serializer.h"
#include "proto/convert.h"
#include "server/audit_log.h"
#include "server/gate_state_internal.h"
#include "server/identity.h"
#include "server/persistence.h"
#include "tests/server/state_harness.h"
#include "tests/server/test_util.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

class GateStateTest : public ::testing::Test {
 protected:
  std::unique_ptr<StateHarness> Make(const std::string& state_dir = "",
                                     v1::GateConfig file_layer = {},
                                     const std::function<void(StateOptions&)>& tweak = {}) {
    StateOptions o;
    o.clock = [this] { return clock_.Now(); };
    o.stale_after = absl::Seconds(5);
    o.forget_after = absl::Minutes(10);
    o.decision_cache_steps = 8;
    o.state_dir = state_dir;
    if (tweak) tweak(o);
    StoreOptions so;
    so.state_dir = state_dir;
    auto s = StateHarness::Create(o, so, &metrics_, std::move(file_layer));
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Ranks 0 and 1 of group 0 of the two-rank job `job`, registered and attached without a
  // sink: their sessions (null for one that failed, which the expectations name).
  static std::vector<std::shared_ptr<Session>> TwoRanks(StateHarness& state,
                                                        const std::string& job) {
    return Ranks(state, job, 2);
  }

  // Group 0's `size` ranks, each with its own session (null where one failed).
  static std::vector<std::shared_ptr<Session>> Ranks(StateHarness& state,
                                                     const std::string& job, int size) {
    std::vector<std::shared_ptr<Session>> out;
    for (int rank = 0; rank < size; ++rank) {
      auto r = state.Register(Reg(job, 0, rank, size));
      EXPECT_THAT(r.status(), IsOk()) << rank;
      auto s = r.ok() ? state.AttachSession(r->session_id(), std::weak_ptr<SessionSink>())
                      : absl::StatusOr<std::shared_ptr<Session>>(r.status());
      EXPECT_THAT(s.status(), IsOk()) << rank;
      out.push_back(s.ok() ? *s : nullptr);
    }
    return out;
  }

  // Group 0's leader's group session for its `size` ranks.
  static absl::StatusOr<std::shared_ptr<Session>> LeaderSession(StateHarness& state,
                                                               const std::string& job,
                                                               int size) {
    v1::RegisterRequest leader = Reg(job, 0, 0, size);
    leader.set_group_session(true);
    auto r = state.Register(leader);
    if (!r.ok()) return r.status();
    return state.AttachSession(r->session_id(), std::weak_ptr<SessionSink>());
  }

  static v1::RegisterRequest Reg(const std::string& job, int group, int rank, int size) {
    v1::RegisterRequest r;
    r.set_job_id(job);
    r.set_incarnation(StateHarness::kIncarnation);
    r.set_group(group);
    r.set_rank_in_group(rank);
    r.set_group_size(size);
    r.set_global_rank(group * size + rank);
    return r;
  }

  static v1::BatchPlan Plan(const std::string& job, int group, int64_t step,
                            std::vector<int64_t> lengths) {
    v1::BatchPlan p;
    p.set_job_id(job);
    p.set_group(group);
    p.set_step(step);
    for (int64_t l : lengths) p.add_lengths(l);
    return p;
  }

  // A what-if for job `job`'s batch of `lengths`, no group.
  static v1::EvaluateGatesRequest Eval(const std::string& job, std::vector<int64_t> lengths) {
    v1::EvaluateGatesRequest r;
    r.set_job_id(job);
    for (int64_t l : lengths) r.add_lengths(l);
    return r;
  }

  static v1::PinModeRequest Pin(const std::string& job, v1::Mode mode, int64_t seconds) {
    v1::PinModeRequest p;
    p.set_job_id(job);
    p.set_mode(mode);
    p.mutable_duration()->set_seconds(seconds);
    return p;
  }

  static v1::StepTelemetry Tel(const std::string& job, int group, int rank, int64_t step,
                               v1::Mode mode, double step_s, double rs_s) {
    v1::StepTelemetry t;
    t.set_job_id(job);
    t.set_group(group);
    t.set_rank_in_group(rank);
    t.set_step(step);
    t.set_mode(mode);
    t.set_step_time_s(step_s);
    t.set_rs_wait_s(rs_s);
    t.set_effective_tokens(1000);  // the tokens of a {500, 500} plan: at most its plan's
    return t;
  }

  FakeClock clock_;
  Metrics metrics_;
};

TEST_F(GateStateTest, RetriedStepGetsTheIdenticalDecision) {
  auto state = Make();
  v1::Decision first, again;
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {100, 100}), &first), IsOk());
  // The same plan again (a retry after a reconnect): the cache answers, nothing is
  // re-decided. Another plan for the step is refused
  // (ACachedDecisionAnswersOnlyThePlanItWasMadeFor).
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {100, 100}), &again), IsOk());
  EXPECT_EQ(first.SerializeAsString(), again.SerializeAsString());
  EXPECT_EQ(again.reason(), v1::GATES_PASSED);
}

TEST_F(GateStateTest, StepsBehindTheGroupAreRefusedOnceEvicted) {
  auto state = Make();
  v1::Decision d;
  for (int64_t s = 0; s < 20; ++s) ASSERT_THAT(state->Decide(Plan("j", 0, s, {64}), &d), IsOk());
  EXPECT_THAT(state->Decide(Plan("j", 0, 3, {64}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
  EXPECT_THAT(state->Decide(Plan("j", 0, 15, {64}), &d), IsOk());  // still cached
  EXPECT_EQ(d.step(), 15);
}

TEST_F(GateStateTest, InvalidPlansNameTheField) {
  auto state = Make();
  v1::Decision d;
  EXPECT_THAT(state->Decide(Plan("", 0, 1, {1}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
  EXPECT_THAT(state->Decide(Plan("j", 0, -1, {1}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
  EXPECT_THAT(state->Decide(Plan("j", 0, 1, {}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths")));
  EXPECT_THAT(state->Decide(Plan("j", 0, 1, {5, 0}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths[1]")));
  EXPECT_THAT(state->Decide(Plan("j", -2, 1, {5}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group")));
  EXPECT_THAT(state->Decide(Plan("bad job", 0, 1, {5}), &d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
}

TEST_F(GateStateTest, HeartbeatsKeepRanksActiveAndSilenceMakesThemStale) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 2));
  auto r1 = state->Register(Reg("j", 0, 1, 2));
  ASSERT_THAT(r0.status(), IsOk());
  ASSERT_THAT(r1.status(), IsOk());
  auto sink = std::make_shared<RecordingSink>();
  auto s0 = state->AttachSession(r0->session_id(), sink);
  ASSERT_THAT(s0.status(), IsOk());
  clock_.Advance(absl::Seconds(4));
  ASSERT_THAT(state->Heartbeat(**s0, v1::Heartbeat()).status(), IsOk());
  clock_.Advance(absl::Seconds(2));  // rank 1 silent for 6 s, rank 0 for 2 s
  state->Sweep();
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->groups(0).ranks_active(), 1);
  EXPECT_EQ(job->groups(0).ranks_stale(), 1);
  EXPECT_EQ(job->summary().ranks_stale(), 1);
}

TEST_F(GateStateTest, UnknownSessionIsNotFound) {
  auto state = Make();
  EXPECT_THAT(state->AttachSession("nope", std::weak_ptr<SessionSink>()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session_id")));
}

TEST_F(GateStateTest, RsWaitWindowRollsOverAndTripsTheGate) {
  v1::GateConfig file;
  file.set_window_steps(4);
  file.set_min_dwell_steps(1);
  auto state = Make("", file);
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto session = state->AttachSession(reg->session_id(), std::weak_ptr<SessionSink>());
  ASSERT_THAT(session.status(), IsOk());
  v1::Decision d;
  int64_t step = 0;
  // Four SP steps with a low wait share fill the window.
  for (; step < 4; ++step) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
    EXPECT_EQ(d.mode(), v1::SEQUENCE_PARALLEL);
    // No rolling value until an SP step is in the window (step 0's telemetry comes later).
    EXPECT_EQ(d.has_rolling_rs_wait_share(), step > 0) << "step " << step;
    ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, step, v1::SEQUENCE_PARALLEL, 1.0, 0.1)),
                IsOk());
  }
  // Each high sample replaces the oldest: the mean crosses 0.22 after the third.
  const double expected_means[] = {0.1, 0.175, 0.25};
  for (double mean : expected_means) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
    EXPECT_NEAR(d.rolling_rs_wait_share(), mean, 1e-12) << "step " << step;
    EXPECT_EQ(d.mode(), mean > 0.22 ? v1::TENSOR_PARALLEL_ONLY : v1::SEQUENCE_PARALLEL);
    ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, step, v1::SEQUENCE_PARALLEL, 1.0, 0.4)),
                IsOk());
    ++step;
  }
  EXPECT_EQ(d.reason(), v1::RS_WAIT);
  auto job = state->GetJob("j");
  EXPECT_TRUE(job->groups(0).rs_wait_fallback());
}

// After a trip the window is empty: decisions and the group report no rolling share (not
// a measured-looking 0). Plans run ahead of telemetry, so the last SP step's record can
// arrive after the plan that tripped the gate; the window refuses it (it is from before
// the trip), and the gauge keeps the value that tripped the gate.
TEST_F(GateStateTest, AfterATripTheRollingShareIsUnsetAndTheGaugeKeepsTheTrippingValue) {
  v1::GateConfig file;
  file.set_window_steps(2);
  auto state = Make("", file);
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto session = state->AttachSession(reg->session_id(), std::weak_ptr<SessionSink>());
  ASSERT_THAT(session.status(), IsOk());
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {512, 512}), &d), IsOk());
  EXPECT_FALSE(d.has_rolling_rs_wait_share()) << "no SP step in the window yet";
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {512, 512}), &d), IsOk());
  ASSERT_EQ(d.mode(), v1::SEQUENCE_PARALLEL);
  ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 1.0, 0.5)),
              IsOk());
  ASSERT_THAT(state->Decide(Plan("j", 0, 2, {512, 512}), &d), IsOk());
  ASSERT_EQ(d.reason(), v1::RS_WAIT) << "the trip";
  EXPECT_NEAR(d.rolling_rs_wait_share(), 0.5, 1e-12) << "the trip's own decision read the window";
  ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, 1, v1::SEQUENCE_PARALLEL, 1.0, 0.5)),
              IsOk());
  ASSERT_THAT(state->Decide(Plan("j", 0, 3, {512, 512}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::RS_WAIT);
  EXPECT_FALSE(d.has_rolling_rs_wait_share()) << d.ShortDebugString();
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_FALSE(job->groups(0).has_rolling_rs_wait_share()) << job->groups(0).ShortDebugString();
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()),
              HasSubstr("spgate_rs_wait_share{group=\"0\",job_id=\"j\"} 0.5\n"));
}

// A reused Decision keeps nothing of the last one: a stream writes every answer into the
// same message.
TEST(DecisionToProtoTest, AReusedMessageKeepsNothingOfTheLastDecision) {
  DecisionRecord pinned{.job_id = "j", .step = 1, .mode = Mode::kTensorParallelOnly,
                        .reason = Reason::kPinned, .rolling_rs_wait_share = 0.3,
                        .pin_expire = absl::FromUnixSeconds(1900000000), .pin_forced = true};
  pinned.microbatches = {{Mode::kTensorParallelOnly, Reason::kPinned}};
  pinned.stage_peak_bytes = 1 << 20;
  const DecisionRecord plain{.job_id = "j", .step = 2};
  v1::Decision reused, fresh;
  ToProto(pinned, &reused);
  ASSERT_TRUE(reused.has_pin_expire_time());
  ToProto(plain, &reused);
  ToProto(plain, &fresh);
  EXPECT_EQ(reused.SerializeAsString(), fresh.SerializeAsString()) << reused.ShortDebugString();
  EXPECT_FALSE(reused.has_rolling_rs_wait_share());
}

TEST_F(GateStateTest, GroupValueIsTheMaxOverRanks) {
  auto state = Make();
  const auto s = TwoRanks(*state, "j");
  ASSERT_NE(s[1], nullptr);
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {500, 500}), &d), IsOk());
  ASSERT_THAT(state->RecordTelemetry(*s[0], Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 2.0, 0.2)), IsOk());
  ASSERT_THAT(state->RecordTelemetry(*s[1], Tel("j", 0, 1, 0, v1::SEQUENCE_PARALLEL, 1.0, 0.3)), IsOk());
  auto job = state->GetJob("j");
  EXPECT_DOUBLE_EQ(job->groups(0).rolling_rs_wait_share(), 0.3);  // max(0.1, 0.3)
}

// Per-rank sessions: the group's slowest rank is the one the others waited for — the most
// step time outside its collective waits — not the longest step: a group's ranks end a
// step together, so their step times differ by noise. Step 0: rank 1's step is the
// longest by 1 ms but it waited 0.3 s; rank 0 waited 0.05 s. Step 1 (TP-only, no waits
// reported): the longest step.
TEST_F(GateStateTest, TheSlowestRankIsTheOneTheOthersWaitedFor) {
  auto state = Make();
  const auto s = TwoRanks(*state, "j");
  ASSERT_NE(s[1], nullptr);
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {500, 500}), &d), IsOk());
  v1::StepTelemetry waited = Tel("j", 0, 1, 0, v1::SEQUENCE_PARALLEL, 1.001, 0.3);
  waited.set_all_gather_s(0.1);
  ASSERT_THAT(state->RecordTelemetry(*s[1], waited), IsOk());
  ASSERT_THAT(state->RecordTelemetry(*s[0], Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 1.0, 0.05)),
              IsOk());
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->groups(0).slowest_rank(), 0);
  EXPECT_DOUBLE_EQ(job->groups(0).slowest_step_time_s(), 1.001) << "the group's step time";
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {500, 500}), &d), IsOk());
  ASSERT_THAT(state->RecordTelemetry(*s[0], Tel("j", 0, 0, 1, v1::TENSOR_PARALLEL_ONLY, 1.0, 0)),
              IsOk());
  ASSERT_THAT(state->RecordTelemetry(*s[1], Tel("j", 0, 1, 1, v1::TENSOR_PARALLEL_ONLY, 1.2, 0)),
              IsOk());
  job = state->GetJob("j");
  EXPECT_EQ(job->groups(0).slowest_rank(), 1);
  EXPECT_DOUBLE_EQ(job->groups(0).slowest_step_time_s(), 1.2);
}

// A straggler's step (docs/design.md §11, "Straggler steps") from per-rank records: the
// daemon reads each rank's busy time (step time less its timed collectives) and the step's
// delay (the slowest rank's lead over the median rank). Four ranks, SP steps of 1 s where
// the ranks are busy 0.88-0.90 s; step 6 takes 1.4 s with rank 2 busy 1.3 s: not learned,
// counted. Once a TP-only step arrives without its all-reduce time, delays are no longer
// known for the job, and the same straggler's step is learned.
TEST_F(GateStateTest, AStragglersStepFromRankRecordsIsNotLearned) {
  auto state = Make();
  const std::vector<std::shared_ptr<Session>> s = Ranks(*state, "j", 4);
  ASSERT_NE(s[3], nullptr);
  auto run = [&](int64_t step, v1::Mode mode, double step_s, std::vector<double> waits,
                 double all_reduce_s = 0) {
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {500, 500}), &d), IsOk()) << step;
    for (int rank = 0; rank < 4; ++rank) {
      v1::StepTelemetry t = Tel("j", 0, rank, step, mode, step_s,
                                mode == v1::SEQUENCE_PARALLEL ? waits[rank] : 0);
      t.set_all_reduce_s(all_reduce_s);
      ASSERT_THAT(state->RecordTelemetry(*s[rank], t), IsOk()) << step << " " << rank;
    }
  };
  const GateConfig c;
  const int band = BandOf(c, 0.0, 1000);
  auto sp_weight = [&] {
    return spgate::FromProto(state->GetJob("j")->learned())
        .cell(band, Mode::kSequenceParallel).weight;
  };
  auto counted = [&](int n) {
    return HasSubstr(absl::StrCat("spgate_adaptive_straggler_steps_total{job_id=\"j\"} ", n));
  };
  // Before a TP-only step came timed the rule is not on: a straggler's SP step is learned.
  run(0, v1::SEQUENCE_PARALLEL, 1.4, {0.5, 0.5, 0.1, 0.5});
  EXPECT_GT(sp_weight(), 0.9);
  run(1, v1::TENSOR_PARALLEL_ONLY, 0.9, {}, /*all_reduce_s=*/0.1);  // timed: now it is
  for (int64_t step = 2; step < 8; ++step) {
    run(step, v1::SEQUENCE_PARALLEL, 1.0, {0.10, 0.11, 0.12, 0.10});
  }
  const double clean = sp_weight();
  EXPECT_GT(clean, 6.9);
  run(8, v1::SEQUENCE_PARALLEL, 1.4, {0.5, 0.5, 0.1, 0.5});
  EXPECT_EQ(sp_weight(), clean) << "the straggler's step is not learned";
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()), counted(1));
  run(9, v1::SEQUENCE_PARALLEL, 1.0, {0.10, 0.11, 0.12, 0.10});
  EXPECT_GT(sp_weight(), clean) << "the next clean step is";

  run(10, v1::TENSOR_PARALLEL_ONLY, 0.9, {}, /*all_reduce_s=*/0);  // untimed: the rule is off
  const double before = sp_weight();
  run(11, v1::SEQUENCE_PARALLEL, 1.4, {0.5, 0.5, 0.1, 0.5});
  EXPECT_GT(sp_weight(), before);
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()), counted(1));
  EXPECT_TRUE(state->GetJob("j")->learned().straggler_untimed()) << "persisted with the table";
}

// A step plan's rank records: each rank's compute per micro-batch lands in its own column
// (its arrival's, as its step busy time), so each micro-batch's delay is its ranks'
// StragglerSeconds; a group record's delays are taken as sent, and micro-batches × ranks
// past kMaxStragglerBusyValues keep no busy times.
TEST(PendingStepTest, MicrobatchBusyTimesByRank) {
  gate_state_internal::PendingStep p;
  constexpr size_t kRanks = 4;
  for (size_t rank = 0; rank < kRanks; ++rank) {
    std::vector<MicrobatchTelemetryValues> mbs;
    for (int id = 0; id < 2; ++id) {
      // Micro-batch 1: rank 3 computes 0.5 s where the others compute 0.3 s and wait
      // 0.2 s in TP-only's all-reduce.
      const bool slow = id == 1 && rank == 3;
      mbs.push_back({.id = id, .mode = Mode::kTensorParallelOnly, .forward_s = 0.2,
                     .backward_s = 0.3, .effective_tokens = 10,
                     .all_reduce_s = id == 1 && !slow ? 0.2 : 0.0});
    }
    p.busy.push_back(0.5);  // the step's, kept first (FoldTelemetry)
    p.FoldMicrobatches(mbs, /*group_record=*/false, kRanks);
  }
  ASSERT_EQ(p.microbatch_busy.size(), 2 * kRanks);
  EXPECT_EQ(StragglerSeconds(std::span<double>(p.microbatch_busy).subspan(0, kRanks)), 0.0);
  EXPECT_NEAR(StragglerSeconds(std::span<double>(p.microbatch_busy).subspan(kRanks, kRanks)),
              0.2, 1e-12);
  EXPECT_DOUBLE_EQ(p.microbatches[1].all_reduce_s, 0.2) << "the largest over the ranks";

  gate_state_internal::PendingStep group;
  group.FoldMicrobatches(std::vector<MicrobatchTelemetryValues>{{.id = 0, .straggler_s = 0.3}},
                         /*group_record=*/true, kRanks);
  EXPECT_EQ(group.microbatches[0].straggler_s, 0.3);
  EXPECT_TRUE(group.microbatch_busy.empty());

  gate_state_internal::PendingStep wide;
  wide.busy.push_back(1.0);
  wide.FoldMicrobatches(std::vector<MicrobatchTelemetryValues>(2, {.id = 0}), false,
                        kMaxStragglerBusyValues);
  EXPECT_TRUE(wide.microbatch_busy.empty()) << "2 x 4096 values: past the bound";
}

// A group record carries its leader's delay (GroupDecider gathers the ranks' busy times):
// the daemon takes it as sent, per step and per micro-batch alike.
TEST_F(GateStateTest, AGroupRecordsStragglerDelayIsTakenAsSent) {
  auto state = Make();
  auto s0 = LeaderSession(*state, "j", 4);
  ASSERT_THAT(s0.status(), IsOk());
  const int band = BandOf(GateConfig{}, 0.0, 1000);
  auto weight = [&] {
    return spgate::FromProto(state->GetJob("j")->learned())
        .cell(band, Mode::kSequenceParallel).weight;
  };
  for (int64_t step = 0; step < 7; ++step) {
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {500, 500}), &d), IsOk());
    // Step 0 runs TP-only with its all-reduces timed (the rule needs both modes timed).
    v1::StepTelemetry t = Tel("j", 0, 0, step, step == 0 ? v1::TENSOR_PARALLEL_ONLY
                                                         : v1::SEQUENCE_PARALLEL,
                              step == 6 ? 1.5 : 1.0, step == 0 ? 0 : 0.1);
    t.set_all_reduce_s(step == 0 ? 0.1 : 0);
    t.set_ranks(4);
    t.set_straggler_s(step == 6 ? 0.5 : 0.01);
    ASSERT_THAT(state->RecordTelemetry(**s0, t), IsOk());
    if (step == 5) {
      EXPECT_GT(weight(), 4.9);
    }
  }
  EXPECT_LT(weight(), 5.1) << "step 6 (a third of it a straggler's) is not learned";
}

// A leader's group session speaks for its group: one session counts the group's ranks,
// one record (the group's, reduced in the group) completes a step with the group's
// values, and the slowest and peak-memory ranks it names are the group's.
TEST_F(GateStateTest, AGroupSessionsRecordIsTheWholeGroupsStep) {
  auto state = Make();
  v1::RegisterRequest follower = Reg("j", 0, 3, 4);
  follower.set_group_session(true);
  EXPECT_THAT(state->Register(follower).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only the group's leader (rank_in_group 0)")));
  auto s0 = LeaderSession(*state, "j", 4);
  ASSERT_THAT(s0.status(), IsOk());
  state->Sweep();
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_TRUE(job->groups(0).group_session());
  EXPECT_EQ(job->groups(0).ranks_active(), 4) << "one session for the group's four ranks";
  EXPECT_EQ(job->summary().ranks_active(), 4);
  EXPECT_EQ(job->groups(0).slowest_rank(), -1) << "no step complete yet";

  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {500, 500}), &d), IsOk());
  v1::StepTelemetry t = Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 2.0, 0.6);
  t.set_ranks(4);
  t.set_slowest_rank(2);
  t.set_peak_memory_rank(1);
  t.set_peak_memory_bytes(5000);
  ASSERT_THAT(state->RecordTelemetry(**s0, t), IsOk());
  job = state->GetJob("j");
  EXPECT_DOUBLE_EQ(job->groups(0).rolling_rs_wait_share(), 0.3) << "complete at once: 0.6 / 2.0";
  EXPECT_EQ(job->groups(0).slowest_rank(), 2);
  EXPECT_DOUBLE_EQ(job->groups(0).slowest_step_time_s(), 2.0);
  EXPECT_EQ(job->groups(0).peak_memory_rank(), 1);
  // A plain plan's group-step is the MODES window's one micro-batch, decided once.
  ASSERT_EQ(job->mode_stats_size(), 2);
  EXPECT_EQ(job->mode_stats(0).mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(job->mode_stats(0).microbatches(), 1);
  EXPECT_EQ(job->mode_stats(0).steps(), 1);
  EXPECT_DOUBLE_EQ(job->mode_stats(0).step_time_p95_s(), 2.0);
  EXPECT_EQ(job->mode_stats(0).peak_memory_bytes(), 5000u);
  EXPECT_EQ(job->mode_stats(1).microbatches(), 0);
  EXPECT_EQ(job->summary().group_steps_decided(), 1);
  EXPECT_EQ(job->summary().steps_decided(), 1);
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()),
              HasSubstr("spgate_slowest_rank{group=\"0\",job_id=\"j\"} 2"));

  // Group records must name the group's size and ranks inside it.
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {500, 500}), &d), IsOk());
  v1::StepTelemetry wrong = Tel("j", 0, 0, 1, v1::SEQUENCE_PARALLEL, 1.0, 0.1);
  wrong.set_ranks(8);
  EXPECT_THAT(state->RecordTelemetry(**s0, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("telemetry.ranks: must be 0 or 1 (one rank's record) or the group's size 4")));
  wrong.set_ranks(4);
  wrong.set_slowest_rank(4);
  EXPECT_THAT(state->RecordTelemetry(**s0, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("telemetry.slowest_rank: must be in [0, ranks=4)")));
  wrong.set_ranks(-1);
  EXPECT_THAT(state->RecordTelemetry(**s0, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("telemetry.ranks: must be")));
  job = state->GetJob("j");
  EXPECT_EQ(job->groups(0).slowest_rank(), 2) << "refused records change nothing";

  // A follower with a session of its own (per-rank) cannot send the group's record.
  auto r1 = state->Register(Reg("j", 0, 1, 4));
  ASSERT_THAT(r1.status(), IsOk());
  auto s1 = state->AttachSession(r1->session_id(), std::weak_ptr<SessionSink>());
  ASSERT_THAT(s1.status(), IsOk());
  v1::StepTelemetry from_follower = Tel("j", 0, 1, 1, v1::SEQUENCE_PARALLEL, 1.0, 0.1);
  from_follower.set_ranks(4);
  EXPECT_THAT(state->RecordTelemetry(**s1, from_follower),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only from a group session")));
  // And a group session's own one-rank record would stand for one rank of four.
  EXPECT_THAT(state->RecordTelemetry(**s0, Tel("j", 0, 0, 1, v1::SEQUENCE_PARALLEL, 1.0, 0.1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sends the group's records")));
  state->Sweep();
  job = state->GetJob("j");
  EXPECT_EQ(job->groups(0).ranks_active(), 4) << "overlapping sessions count at most the group";
}

// A record cannot poison the job's learned table (docs/design.md §2, "Range rules"): the
// largest int64 of tokens over the smallest positive double (once NaN in GetJob's cells
// and +Inf in spgate_adaptive_tokens_per_second), more tokens than the step's plan held,
// 1e18 tokens over 1e-300 s, or a wait longer than the step, is refused naming the field
// before it is folded in; the cells stay as they were and finite, and the step's good
// record is still taken afterwards.
TEST_F(GateStateTest, ARecordCannotPoisonTheLearnedTable) {
  auto state = Make();
  auto reg = state->Register(Reg("j", 0, 0, 1));
  ASSERT_THAT(reg.status(), IsOk());
  auto session = state->AttachSession(reg->session_id(), std::weak_ptr<SessionSink>());
  ASSERT_THAT(session.status(), IsOk());
  v1::Decision d;
  for (int64_t step = 0; step < 4; ++step) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {500, 500}), &d), IsOk());
    ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, step, d.mode(), 1.0, 0.1)),
                IsOk());
  }
  ASSERT_THAT(state->Decide(Plan("j", 0, 4, {500, 500}), &d), IsOk());
  const v1::Mode mode = d.mode();
  auto learned = [&] { return state->GetJob("j")->learned().SerializeAsString(); };
  const std::string before = learned();
  ASSERT_FALSE(before.empty());

  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  struct Case {
    double step_time_s;
    int64_t tokens;
    double rs_wait_s;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {5e-324, kHuge, 0, "telemetry.step_time_s: must be finite and >= 1e-06"},
           {1.0, kHuge, 0,
            "telemetry.effective_tokens: must be in [0, 2^53 - 1] (exact as a double), got "
            "9223372036854775807"},
           {1e-300, 1'000'000'000'000'000'000, 0, "telemetry.step_time_s"},
           {1.0, 1001, 0, "telemetry.effective_tokens: 1001 exceeds"},
           {1.0, 1000, 1.5, "telemetry.rs_wait_s: must be finite, >= 0 and at most step_time_s"},
       }) {
    v1::StepTelemetry t = Tel("j", 0, 0, 4, mode, c.step_time_s, c.rs_wait_s);
    t.set_effective_tokens(c.tokens);
    EXPECT_THAT(state->RecordTelemetry(**session, t),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.message;
  }
  EXPECT_EQ(learned(), before) << "a refused record changes no learned cell";
  const ThroughputTable table = spgate::FromProto(state->GetJob("j")->learned());
  for (int band = 0; band < kBands; ++band) {
    for (Mode m : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      EXPECT_TRUE(std::isfinite(table.cell(band, m).tokens_per_s())) << band;
    }
  }
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "spgate_adaptive_tokens_per_second{")) continue;
    EXPECT_THAT(line, Not(AnyOf(HasSubstr("Inf"), HasSubstr("NaN")))) << line;
  }
  ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, 4, mode, 1.0, 0.1)), IsOk());
  EXPECT_NE(learned(), before) << "the step's good record is learned";
}

// Register range-checks every model field as it does hidden and layers, naming it.
TEST_F(GateStateTest, ModelFieldsOutOfRangeAreRefusedByName) {
  auto state = Make();
  struct Case {
    void (v1::ModelShape::*set)(int32_t);
    const char* field;
  };
  for (const Case& c : std::vector<Case>{{&v1::ModelShape::set_hidden, "model.hidden"},
                                         {&v1::ModelShape::set_layers, "model.layers"},
                                         {&v1::ModelShape::set_heads, "model.heads"},
                                         {&v1::ModelShape::set_ffn_hidden, "model.ffn_hidden"},
                                         {&v1::ModelShape::set_tp, "model.tp"}}) {
    for (int32_t bad : {-1, (1 << 20) + 1}) {
      v1::RegisterRequest r = Reg("m", 0, 0, 1);
      (r.mutable_model()->*c.set)(bad);
      EXPECT_THAT(state->Register(r).status(),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
          << c.field << " = " << bad;
    }
    v1::RegisterRequest ok = Reg("m", 0, 0, 1);
    (ok.mutable_model()->*c.set)(1 << 20);
    EXPECT_THAT(state->Register(ok).status(), IsOk()) << c.field << " at the bound";
  }
}

TEST_F(GateStateTest, TelemetryThatDoesNotMatchTheSessionIsRefused) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 1));
  auto s0 = state->AttachSession(r0->session_id(), std::weak_ptr<SessionSink>());
  EXPECT_THAT(state->RecordTelemetry(**s0, Tel("j", 1, 0, 0, v1::SEQUENCE_PARALLEL, 1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not match")));
  EXPECT_THAT(state->RecordTelemetry(**s0, Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 0, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step_time_s")));
  EXPECT_THAT(state->RecordTelemetry(**s0, Tel("j", 0, 0, 0, v1::SEQUENCE_PARALLEL, 1, -1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rs_wait_s")));
  EXPECT_EQ((*s0)->telemetry_received.load(), 0);
}

TEST_F(GateStateTest, ConfigChangeAppliesFromEffectiveFromStep) {
  auto state = Make();
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto sink = std::make_shared<RecordingSink>();
  auto session = state->AttachSession(reg->session_id(), sink);
  ASSERT_THAT(session.status(), IsOk());
  // CV of {100, 300} is 0.5: TP-only under the default 0.18.
  v1::Decision d;
  for (int64_t s = 0; s <= 10; ++s) ASSERT_THAT(state->Decide(Plan("j", 0, s, {100, 300}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::LENGTH_CV);

  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.6);
  up.mutable_update_mask()->add_paths("max_length_cv");
  auto updated = state->UpdateGateConfig(up);
  ASSERT_THAT(updated.status(), IsOk());
  ASSERT_EQ(sink->updates.size(), 1u);
  EXPECT_EQ(sink->updates[0].effective_from_step(), 12);  // last decided 10, lead 2
  EXPECT_DOUBLE_EQ(sink->updates[0].config().config().max_length_cv(), 0.6);

  ASSERT_THAT(state->Decide(Plan("j", 0, 11, {100, 300}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::LENGTH_CV) << "step 11 is before effective_from_step";
  ASSERT_THAT(state->Decide(Plan("j", 0, 12, {100, 300}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::GATES_PASSED);
  EXPECT_EQ(d.config_version(), updated->effective_version());
}

// A group tripped into the RS_WAIT fallback waits probe_interval_steps for its probe.
// An operator raising max_rs_wait_share makes the probe due from the step the change takes
// effect, and the group resumes SP once the probe's share is below the new level.
TEST_F(GateStateTest, RaisingTheWaitThresholdProbesATrippedGroupAtOnce) {
  auto state = Make();
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto sink = std::make_shared<RecordingSink>();
  auto session = state->AttachSession(reg->session_id(), sink);
  ASSERT_THAT(session.status(), IsOk());
  v1::Decision d;
  int64_t step = 0;
  for (; d.reason() != v1::RS_WAIT && step < 10; ++step) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
    ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, step, d.mode(), 1.0, 0.3)),
                IsOk());
  }
  ASSERT_EQ(d.reason(), v1::RS_WAIT) << "tripped at 0.3 > 0.22";
  for (int i = 0; i < 5; ++i, ++step) {  // waiting: the probe is 200 steps away
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
    ASSERT_EQ(d.reason(), v1::RS_WAIT) << "step " << step;
  }
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_rs_wait_share(0.5);
  up.mutable_update_mask()->add_paths("max_rs_wait_share");
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  ASSERT_EQ(sink->updates.size(), 1u);
  const int64_t from = sink->updates[0].effective_from_step();
  for (; step < from; ++step) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
    EXPECT_EQ(d.reason(), v1::RS_WAIT) << "step " << step << " is before the change";
  }
  ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::PROBE) << "the first step under the raised level probes";
  ASSERT_THAT(state->RecordTelemetry(**session, Tel("j", 0, 0, step, d.mode(), 1.0, 0.3)),
              IsOk());
  ++step;
  // The dwell (min_dwell_steps since the trip) passes, then the probe's 0.3 < 0.5 - 0.03.
  for (int i = 0; i < 20 && d.reason() != v1::GATES_PASSED; ++i, ++step) {
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {512, 512}), &d), IsOk());
  }
  EXPECT_EQ(d.reason(), v1::GATES_PASSED);
  EXPECT_EQ(d.mode(), v1::SEQUENCE_PARALLEL);
}

TEST_F(GateStateTest, UnknownJobIsNotFound) {
  auto state = Make();
  EXPECT_THAT(state->GetJob("ghost").status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ghost")));
  // A malformed id is INVALID_ARGUMENT, as on every other call, not "unknown".
  EXPECT_THAT(state->GetJob("bad id").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
  EXPECT_THAT(state->GetJob(std::string(129, 'a')).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
  EXPECT_THAT(state->GetGateConfig("ghost").status(), StatusIs(absl::StatusCode::kNotFound));
  v1::UnpinRequest unpin;
  unpin.set_job_id("ghost");
  EXPECT_THAT(state->Unpin(unpin).status(), StatusIs(absl::StatusCode::kNotFound));
}

// A pin may come before its job registers: it is kept, answered as pending, listed, and
// decides the group's first plan. Register's own limits still hold for it.
TEST_F(GateStateTest, PinBeforeRegisterAppliesAtRegister) {
  auto state = Make();
  struct Case {
    std::string name;
    std::optional<int> group;
  };
  for (const Case& c : {Case{"whole job", std::nullopt}, Case{"one group", 1}}) {
    SCOPED_TRACE(c.name);
    const std::string job = c.group ? "later-g" : "later";
    v1::PinModeRequest pin = Pin(job, v1::TENSOR_PARALLEL_ONLY, 600);
    if (c.group) pin.set_group(*c.group);
    auto pinned = state->PinMode(pin);
    ASSERT_THAT(pinned.status(), IsOk());
    EXPECT_TRUE(pinned->pending());
    auto listed = state->GetJob(job);
    ASSERT_THAT(listed.status(), IsOk());
    EXPECT_EQ(listed->pins_size(), 1);
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan(job, c.group.value_or(0), 0, {64}), &d), IsOk());
    EXPECT_EQ(d.mode(), v1::TENSOR_PARALLEL_ONLY);
    EXPECT_EQ(d.reason(), v1::PINNED);
    // Registered now: the same pin again is no longer pending.
    pinned = state->PinMode(pin);
    ASSERT_THAT(pinned.status(), IsOk());
    EXPECT_FALSE(pinned->pending());
  }
  v1::PinModeRequest far = Pin("later", v1::SEQUENCE_PARALLEL, 60);
  far.set_group(1 << 30);
  EXPECT_THAT(state->PinMode(far).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max_groups_per_job")));
  far.set_job_id("bad id!");
  far.clear_group();
  EXPECT_THAT(state->PinMode(far).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  // A pending group pin can be removed before its group exists.
  v1::UnpinRequest unpin;
  unpin.set_job_id("later");
  unpin.set_group(5);
  v1::PinModeRequest g5 = Pin("later", v1::SEQUENCE_PARALLEL, 60);
  g5.set_group(5);
  ASSERT_THAT(state->PinMode(g5).status(), IsOk());
  auto removed = state->Unpin(unpin);
  ASSERT_THAT(removed.status(), IsOk());
  EXPECT_EQ(removed->removed(), 1);
}

TEST_F(GateStateTest, PinsWinAndExpire) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  v1::PinModeRequest pin = Pin("j", v1::TENSOR_PARALLEL_ONLY, 60);
  ASSERT_THAT(state->PinMode(pin).status(), IsOk());
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::PINNED);
  EXPECT_EQ(d.mode(), v1::TENSOR_PARALLEL_ONLY);
  // The group's status shows the job's pin that holds it (its group unset).
  auto held = state->GetJob("j");
  ASSERT_EQ(held->groups_size(), 1);
  ASSERT_TRUE(held->groups(0).has_pin());
  EXPECT_FALSE(held->groups(0).pin().has_group());
  EXPECT_EQ(held->groups(0).pin().mode(), v1::TENSOR_PARALLEL_ONLY);
  clock_.Advance(absl::Seconds(61));
  ASSERT_THAT(state->Decide(Plan("j", 0, 2, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::GATES_PASSED);
  EXPECT_FALSE(state->GetJob("j")->groups(0).has_pin());

  pin.mutable_duration()->set_seconds(0);
  EXPECT_THAT(state->PinMode(pin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duration")));
  pin.mutable_duration()->set_seconds(60);
  pin.set_mode(v1::MODE_UNSPECIFIED);
  EXPECT_THAT(state->PinMode(pin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mode")));
}

TEST_F(GateStateTest, FailedPersistChangesNothing) {
  const std::string dir = TempDir();
  auto state = Make(dir);
  const auto before = state->GetGateConfig("");
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());  // the job's launch, persisted
  // A regular file where the directory was: every write fails, even for root.
  std::filesystem::remove_all(dir);
  std::ofstream(dir) << "not a directory";
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.3);
  auto r = state->UpdateGateConfig(up);
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("persist")));
  EXPECT_EQ(state->GetGateConfig("")->SerializeAsString(), before->SerializeAsString());
  v1::PinModeRequest pin;
  pin.set_job_id("j");
  pin.set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin.mutable_duration()->set_seconds(60);
  EXPECT_THAT(state->PinMode(pin).status(), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::GATES_PASSED) << "a pin that was not persisted must not apply";
  v1::UnpinRequest unpin;
  unpin.set_job_id("j");
  EXPECT_THAT(state->Unpin(unpin).status(), StatusIs(absl::StatusCode::kUnavailable));
  v1::RollbackGateConfigRequest rb;
  rb.set_to_version(1);
  EXPECT_THAT(state->RollbackGateConfig(rb).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(state->GetGateConfig("")->SerializeAsString(), before->SerializeAsString());
  EXPECT_EQ(ReadAll(dir), "not a directory") << "no audit line anywhere";
  std::filesystem::remove(dir);
}

// Both halves of persist before apply fail in turn: the audit append (audit.log is a
// directory) and the state write after a good append (the state file is a directory, so
// the rename fails). Every mutation is UNAVAILABLE naming the file, the config in force
// stays, and the audit log keeps exactly the lines it had.
TEST_F(GateStateTest, PersistFailureLeavesConfigAndAuditLogAlone) {
  for (const bool audit_fails : {true, false}) {
    SCOPED_TRACE(audit_fails ? "audit.log unwritable" : "state file unwritable");
    const std::string dir = TempDir();
    auto state = Make(dir);
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
    auto v = state->UpdateGateConfig(SetCv(0.3));
    ASSERT_THAT(v.status(), IsOk());
    v1::PinModeRequest pin = Pin("j", v1::TENSOR_PARALLEL_ONLY, 60);
    ASSERT_THAT(state->PinMode(pin).status(), IsOk());
    const auto before = state->GetGateConfig("");
    const std::string log_before = ReadAll(AuditLogPath(dir));
    std::string broken;
    if (audit_fails) {
      broken = AuditLogPath(dir);
      std::filesystem::rename(broken, dir + "/audit.saved");
      std::filesystem::create_directory(broken);
    } else {
      broken = StateFilePath(dir);
      std::filesystem::remove(broken);
      std::filesystem::create_directories(broken + "/occupied");
    }
    const auto unavailable = StatusIs(absl::StatusCode::kUnavailable, HasSubstr(broken));
    EXPECT_THAT(state->UpdateGateConfig(SetCv(0.5)).status(), unavailable);
    pin.set_mode(v1::SEQUENCE_PARALLEL);
    EXPECT_THAT(state->PinMode(pin).status(), unavailable);
    v1::UnpinRequest unpin;
    unpin.set_job_id("j");
    EXPECT_THAT(state->Unpin(unpin).status(), unavailable);
    v1::RollbackGateConfigRequest rb;
    rb.set_to_version(v->version());
    if (!audit_fails) {  // the rollback reads the log first, so it needs a readable one
      EXPECT_THAT(state->RollbackGateConfig(rb).status(), unavailable);
    }
    EXPECT_EQ(state->GetGateConfig("")->SerializeAsString(), before->SerializeAsString());
    ASSERT_THAT(state->Decide(Plan("j", 0, 1, {64}), &d), IsOk());
    EXPECT_EQ(d.reason(), v1::PINNED) << "the first pin stays, unchanged";
    EXPECT_EQ(d.mode(), v1::TENSOR_PARALLEL_ONLY);
    EXPECT_EQ(ReadAll(audit_fails ? dir + "/audit.saved" : AuditLogPath(dir)), log_before);
    std::filesystem::remove_all(dir);
  }
}

TEST_F(GateStateTest, LocalDecisionsAreCountedOnceFromCumulativeHeartbeats) {
  auto state = Make();
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto session = state->AttachSession(reg->session_id(), std::weak_ptr<SessionSink>());
  v1::Heartbeat hb;
  auto* c = hb.add_local_decisions();
  c->set_reason(v1::LENGTH_CV);
  c->set_count(3);
  ASSERT_THAT(state->Heartbeat(**session, hb).status(), IsOk());
  c->set_count(5);
  ASSERT_THAT(state->Heartbeat(**session, hb).status(), IsOk());
  ASSERT_THAT(state->Heartbeat(**session, hb).status(), IsOk());  // repeated: no increase
  EXPECT_EQ(state->GetJob("j")->local_decisions(), 5);
}

// Every string a worker sends is bounded (docs/design.md §10) and refused past its
// maximum with INVALID_ARGUMENT naming the field, before anything is stored: 250
// Registers with a 4 MiB host once grew the daemon by a gigabyte.
TEST_F(GateStateTest, ClientStringsPastTheirMaximumAreRefusedNamingTheField) {
  auto state = Make();
  v1::RegisterRequest r = Reg("j", 0, 0, 1);
  r.set_host(std::string(kMaxHostLength + 1, 'h'));
  EXPECT_THAT(state->Register(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host")));
  EXPECT_THAT(state->GetJob("j").status(), StatusIs(absl::StatusCode::kNotFound));
  r.set_host(std::string(kMaxHostLength, 'h'));
  ASSERT_THAT(state->Register(r).status(), IsOk());
  // A session id longer than any the daemon makes is refused without a lookup.
  const std::string long_id(1 << 20, 'a');
  EXPECT_THAT(state->state->FindSession(long_id).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("session_id")));
  EXPECT_THAT(state->AttachSession(long_id, std::weak_ptr<SessionSink>()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("session_id")));
}

// Cumulative local-decision counts near INT64_MAX from two sessions saturate the job's
// total instead of wrapping it negative.
TEST_F(GateStateTest, LocalDecisionCountsSaturate) {
  auto state = Make();
  v1::Heartbeat hb;
  auto* c = hb.add_local_decisions();
  c->set_reason(v1::LENGTH_CV);
  c->set_count(std::numeric_limits<int64_t>::max());
  for (int rank : {0, 1}) {
    auto reg = state->Register(Reg("j", 0, rank, 2));
    ASSERT_THAT(reg.status(), IsOk());
    auto session = state->AttachSession(reg->session_id(), std::weak_ptr<SessionSink>());
    ASSERT_THAT(session.status(), IsOk());
    ASSERT_THAT(state->Heartbeat(**session, hb).status(), IsOk());
  }
  EXPECT_EQ(state->GetJob("j")->local_decisions(), std::numeric_limits<int64_t>::max());
}

// PinMode and Unpin validate a group index and a Duration as Register and the wire do:
// a negative group is INVALID_ARGUMENT (not NOT_FOUND), and so are nanos outside
// [0, 1e9) or of the other sign than the seconds.
TEST_F(GateStateTest, PinRequestsValidateGroupAndDurationLikeTheOtherRpcs) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  v1::PinModeRequest pin = Pin("j", v1::SEQUENCE_PARALLEL, 60);
  pin.set_group(-1);
  EXPECT_THAT(state->PinMode(pin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group")));
  pin.clear_group();
  pin.mutable_duration()->set_nanos(2'000'000'000);
  EXPECT_THAT(state->PinMode(pin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nanos")));
  pin.mutable_duration()->set_seconds(-1);
  pin.mutable_duration()->set_nanos(500'000'000);
  EXPECT_THAT(state->PinMode(pin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("duration")));
  pin.mutable_duration()->set_seconds(0);
  pin.mutable_duration()->set_nanos(999'999'999);
  EXPECT_THAT(state->PinMode(pin).status(), IsOk());  // just under a second
  v1::UnpinRequest unpin;
  unpin.set_job_id("j");
  unpin.set_group(-1);
  EXPECT_THAT(state->Unpin(unpin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group")));
}

TEST_F(GateStateTest, EvaluateGatesHasNoSideEffects) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  v1::EvaluateGatesRequest r = Eval("j", {100, 300});
  auto e = state->EvaluateGates(r);
  ASSERT_THAT(e.status(), IsOk());
  EXPECT_EQ(e->decision().reason(), v1::LENGTH_CV);
  ASSERT_GE(e->checks_size(), 3);
  EXPECT_EQ(e->checks(2).gate(), "length_cv");
  EXPECT_EQ(e->checks(2).outcome(), "fire");
  r.mutable_config()->set_max_length_cv(0.9);
  EXPECT_EQ(state->EvaluateGates(r)->decision().reason(), v1::GATES_PASSED);
  r.mutable_config()->set_max_length_cv(-1);
  EXPECT_THAT(state->EvaluateGates(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_length_cv")));
  EXPECT_EQ(state->GetJob("j")->summary().steps_decided(), 1);
  // An ADAPTIVE what-if where every step explores (share 1) answers, with a probe.
  r.mutable_config()->set_max_length_cv(0.9);
  r.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  r.mutable_config()->set_adaptive_explore_share(1.0);
  auto all = state->EvaluateGates(r);
  ASSERT_THAT(all.status(), IsOk());
  EXPECT_EQ(all->decision().reason(), v1::PROBE);
  // The wait-share row says where its value came from: none without a group or a given
  // share, or the share given.
  v1::EvaluateGatesRequest even = Eval("j", {100, 100});
  auto no_share = state->EvaluateGates(even);
  ASSERT_THAT(no_share.status(), IsOk());
  EXPECT_THAT(no_share->checks(no_share->checks_size() - 1).detail(),
              HasSubstr("no --group or --rs_wait_share"));
  even.set_rs_wait_share(0.5);
  auto given = state->EvaluateGates(even);
  ASSERT_THAT(given.status(), IsOk());
  EXPECT_EQ(given->decision().reason(), v1::RS_WAIT);
  EXPECT_THAT(given->checks(given->checks_size() - 1).detail(),
              HasSubstr("(the wait share given, --rs_wait_share)"));
  // The job's pin holds every group: a what-if without a group is pinned too.
  v1::EvaluateGatesRequest plain = Eval("j", {100, 300});
  ASSERT_THAT(state->PinMode(Pin("j", v1::SEQUENCE_PARALLEL, 60)).status(), IsOk());
  auto pinned = state->EvaluateGates(plain);
  ASSERT_THAT(pinned.status(), IsOk());
  EXPECT_EQ(pinned->decision().reason(), v1::PINNED);
  EXPECT_EQ(pinned->checks(0).outcome(), "fire");
}

TEST_F(GateStateTest, IdleJobsAreForgotten) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  clock_.Advance(absl::Minutes(11));
  state->Sweep();
  EXPECT_THAT(state->GetJob("j").status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GateStateTest, AnUpdateThatChangesNothingKeepsTheVersionAndPushesNothing) {
  const std::string dir = TempDir();
  auto state = Make(dir);
  auto reg = state->Register(Reg("j", 0, 0, 1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(reg->session_id(), sink).status(), IsOk());
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.3);
  auto first = state->UpdateGateConfig(up);
  ASSERT_THAT(first.status(), IsOk());
  const size_t pushes = sink->updates.size();
  ASSERT_EQ(pushes, 1u);
  std::ifstream in(StateFilePath(dir));
  const std::string file_before((std::istreambuf_iterator<char>(in)), {});
  const int64_t global_before = state->GetGateConfig("")->version();
  auto again = state->UpdateGateConfig(up);  // the value it already has
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->version(), first->version());
  auto empty = state->UpdateGateConfig(v1::UpdateGateConfigRequest());  // no mask, no fields
  ASSERT_THAT(empty.status(), IsOk());
  EXPECT_EQ(empty->version(), global_before);
  EXPECT_EQ(state->GetGateConfig("")->version(), global_before);
  EXPECT_EQ(state->GetGateConfig("j")->version(), first->version()) << "no new version";
  EXPECT_EQ(sink->updates.size(), pushes) << "nothing pushed to workers";
  std::ifstream in2(StateFilePath(dir));
  const std::string file_after((std::istreambuf_iterator<char>(in2)), {});
  EXPECT_EQ(file_after, file_before) << "nothing written";
  // An empty mask for the job's own scope changes nothing either, and no call above
  // left an audit line beyond the first update's.
  v1::UpdateGateConfigRequest empty_job;
  empty_job.set_job_id("j");
  ASSERT_THAT(state->UpdateGateConfig(empty_job).status(), IsOk());
  EXPECT_EQ(state->GetGateConfig("j")->version(), first->version());
  EXPECT_EQ(sink->updates.size(), pushes);
  auto records = ReadAuditLog(AuditLogPath(dir));
  ASSERT_THAT(records.status(), IsOk());
  EXPECT_EQ(records->size(), 1u) << "no audit line for an update that changes nothing";
}

// ---- the ADAPTIVE policy's learning (docs/design.md §11) ----

// ADAPTIVE's prior (docs/design.md §11): the job's table takes the first declared model
// shape with the group size, and every SP step's collective telemetry (the group record's
// all-gather seconds and wait); TP-only steps add nothing. The deprecated `hardware` an
// old client may send is ignored, whatever its values.
TEST_F(GateStateTest, PriorTakesTheShapeAndSpCollectiveTelemetryAndIgnoresHardware) {
  auto state = Make();
  v1::RegisterRequest r = Reg("j", 0, 0, 1);
  r.mutable_model()->set_hidden(5120);
  r.mutable_model()->set_layers(8);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  r.mutable_hardware()->set_link_gbps(std::nan(""));
  r.mutable_hardware()->set_link_latency_us(-1);
#pragma GCC diagnostic pop
  auto reg = state->Register(r);
  ASSERT_THAT(reg.status(), IsOk());
  auto sink = std::make_shared<RecordingSink>();
  auto session = state->AttachSession(reg->session_id(), sink);
  ASSERT_THAT(session.status(), IsOk());
  int sp_steps = 0;
  for (int64_t step = 0; step < 12; ++step) {
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {500, 500}), &d), IsOk());
    // Every third step reports TP-only (a worker's override): not a prior sample.
    const v1::Mode ran = step % 3 == 2 ? v1::TENSOR_PARALLEL_ONLY : d.mode();
    v1::StepTelemetry t = Tel("j", 0, 0, step, ran, 1.0, 0.15);  // under the RS_WAIT gate
    t.set_all_gather_s(0.1);
    sp_steps += ran == v1::SEQUENCE_PARALLEL;
    ASSERT_THAT(state->RecordTelemetry(**session, t), IsOk());
  }
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  const ThroughputTable table = spgate::FromProto(job->learned());
  EXPECT_EQ(table.prior_inputs(), (PriorInputs{.tp = 1, .hidden = 5120, .layers = 8}));
  const PriorSums& sums = table.prior_sums();
  ASSERT_EQ(sp_steps, 8);
  EXPECT_GT(sums.weight, 7.9);  // 8 steps, within a few steps of a 1,000-step half-life
  EXPECT_LT(sums.weight, 8.0);
  EXPECT_NEAR(sums.all_gather / sums.weight, 0.1, 1e-12);
  EXPECT_NEAR(sums.wait / sums.weight, 0.05, 1e-12);  // (0.15 - 0.1) / 1 s
  EXPECT_NEAR(sums.tokens / sums.weight, 1000, 1e-9);
  // A later rank's different declaration does not replace the job's.
  v1::RegisterRequest other = Reg("j", 1, 0, 1);
  other.mutable_model()->set_hidden(4096);
  ASSERT_THAT(state->Register(other).status(), IsOk());
  EXPECT_EQ(spgate::FromProto(state->GetJob("j")->learned()).prior_inputs().hidden, 5120);
  // Out of range, by field name.
  v1::RegisterRequest negative = Reg("j", 2, 0, 1);
  negative.mutable_model()->set_hidden(-1);
  EXPECT_THAT(state->Register(negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.hidden")));
}

// A rank that declares nothing does not set the job's prior inputs (its group size alone
// is no declaration); the next that does, does; a new launch starts without them.
TEST_F(GateStateTest, PriorInputsComeFromTheFirstDeclaringRankOfTheLaunch) {
  auto state = Make();
  ASSERT_THAT(state->Register(Reg("k", 0, 0, 2)).status(), IsOk());
  EXPECT_EQ(spgate::FromProto(state->GetJob("k")->learned()).prior_inputs(), PriorInputs{});
  v1::RegisterRequest declares = Reg("k", 0, 1, 2);
  declares.mutable_model()->set_layers(4);
  ASSERT_THAT(state->Register(declares).status(), IsOk());
  EXPECT_EQ(spgate::FromProto(state->GetJob("k")->learned()).prior_inputs(),
            (PriorInputs{.tp = 2, .layers = 4}));
  // A new launch, once the old one's ranks are silent: its first rank declares nothing.
  clock_.Advance(absl::Seconds(10));
  v1::RegisterRequest relaunch = Reg("k", 0, 0, 2);
  relaunch.set_incarnation("second");
  ASSERT_THAT(state->Register(relaunch).status(), IsOk());
  EXPECT_EQ(spgate::FromProto(state->GetJob("k")->learned()).prior_inputs(), PriorInputs{});
}


// The daemon tells exploration's switches from its own decisions (docs/design.md §11): a
// learning band's probe run (steps 0-3, TP-only, kept for the run) and the first step back
// to SP after it follow a switch made to measure, so before any switch was measured the
// step back does not enter SP's empty cell; the SP steps after it do, as the run's later
// TP-only steps did.
TEST_F(GateStateTest, AStepBackFromAProbeRunIsExplorations) {
  auto state = Make();
  const auto s = TwoRanks(*state, "x");
  ASSERT_NE(s[1], nullptr);
  v1::UpdateGateConfigRequest up;
  up.set_job_id("x");
  up.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  std::vector<std::pair<v1::Mode, v1::Reason>> ran;
  for (int64_t step = 0; step < 7; ++step) {
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("x", 0, step, {500, 500}), &d), IsOk()) << step;
    ran.emplace_back(d.mode(), d.reason());
    ASSERT_THAT(state->RecordTelemetry(*s[0], Tel("x", 0, 0, step, d.mode(), 1.0, 0)), IsOk());
    ASSERT_THAT(state->RecordTelemetry(*s[1], Tel("x", 0, 1, step, d.mode(), 1.0, 0)), IsOk());
  }
  for (int64_t step = 0; step < 4; ++step) {
    EXPECT_EQ(ran[step], std::pair(v1::TENSOR_PARALLEL_ONLY, v1::PROBE)) << step;
  }
  for (int64_t step = 4; step < 7; ++step) {
    EXPECT_EQ(ran[step].first, v1::SEQUENCE_PARALLEL) << step;
  }
  auto job = state->GetJob("x");
  ASSERT_THAT(job.status(), IsOk());
  const ThroughputTable table = spgate::FromProto(job->learned());
  const GateConfig c = spgate::LayerGateConfig(GateConfig{}, job->config().config());
  const int band = BandOf(c, 0.0, 1000);
  EXPECT_NEAR(table.cell(band, Mode::kTensorParallelOnly).weight, 4.0, 0.01);  // decayed
  EXPECT_NEAR(table.cell(band, Mode::kSequenceParallel).weight, 2.0, 0.01)
      << "steps 5 and 6; step 4, back from the probe run, not";
  EXPECT_EQ(table.switch_cost().last_step, -1) << "no switch measured";
}

// A step the worker's own memory gate ran in SP for the daemon's TP-only decision (reason
// MEMORY_REQUIRES_SP in its record) is forced: the switch into it measures no cost, as a
// memory-forced decision of the daemon's does not; the same step run by the worker's
// fallback (CONTROLLER_UNAVAILABLE) measures one. Each group's length CV gets TP-only
// (LENGTH_CV, a chosen reason) on every step: steps 0-9 ran it, 10-19 SP, 20 TP-only
// again (a switch with no excess, measured alike), and 21 SP 0.5 s slower.
TEST_F(GateStateTest, TheWorkersMemoryOverrideMeasuresNoSwitchCost) {
  auto state = Make();
  auto learned_cost = [&](const std::string& job, v1::Reason sp_reason) {
    const auto ranks = TwoRanks(*state, job);
    for (int64_t step = 0; step < 22; ++step) {
      v1::Decision d;
      EXPECT_THAT(state->Decide(Plan(job, 0, step, {100, 900}), &d), IsOk()) << step;
      EXPECT_EQ(std::pair(d.mode(), d.reason()),
                std::pair(v1::TENSOR_PARALLEL_ONLY, v1::LENGTH_CV)) << step;
      const bool sp = (step >= 10 && step < 20) || step == 21;
      for (int rank : {0, 1}) {
        if (ranks[rank] == nullptr) return v1::LearnedSwitchCost();  // named by TwoRanks
        v1::StepTelemetry t = Tel(job, 0, rank, step,
                                  sp ? v1::SEQUENCE_PARALLEL : v1::TENSOR_PARALLEL_ONLY,
                                  step == 21 ? 1.5 : 1.0, 0);
        t.set_reason(sp ? sp_reason : v1::LENGTH_CV);
        EXPECT_THAT(state->RecordTelemetry(*ranks[rank], t), IsOk()) << step;
      }
    }
    auto j = state->GetJob(job);
    EXPECT_THAT(j.status(), IsOk());
    return j->learned().switch_cost();
  };
  const v1::LearnedSwitchCost overridden = learned_cost("o", v1::MEMORY_REQUIRES_SP);
  const v1::LearnedSwitchCost fallback = learned_cost("f", v1::CONTROLLER_UNAVAILABLE);
  ASSERT_GT(overridden.weight(), 0) << "step 20's switch back to TP-only is measured";
  EXPECT_NEAR(overridden.seconds(), 0, 1e-9) << "step 21's excess is not";
  ASSERT_GT(fallback.weight(), overridden.weight());
  EXPECT_GT(fallback.seconds() / fallback.weight(), 0.2) << "step 21's 0.5 s excess, measured";
}

// The daemon learns each (band, mode)'s tokens/s from the group's step time (the max
// over its ranks) and the batch's tokens, whatever the policy; it sends the table to the
// group's leader only, when a band's preference changes and at most once per interval;
// and an ADAPTIVE job then decides with it (reason ADAPTIVE) and explores (PROBE).
TEST_F(GateStateTest, LearnsThroughputFromTelemetryAndTellsTheLeader) {
  auto state = Make("", {}, [](StateOptions& o) { o.decision_cache_steps = 64; });
  auto r0 = state->Register(Reg("j", 0, 0, 2));
  auto r1 = state->Register(Reg("j", 0, 1, 2));
  auto leader = std::make_shared<RecordingSink>();
  auto other = std::make_shared<RecordingSink>();
  auto s0 = state->AttachSession(r0->session_id(), leader);
  auto s1 = state->AttachSession(r1->session_id(), other);
  ASSERT_THAT(s0.status(), IsOk());
  ASSERT_THAT(s1.status(), IsOk());
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  up.mutable_config()->set_adaptive_min_samples(4);
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  // Uniform batches (CV 0): SP 2 s per step (rank 1 the slowest), TP-only 1 s: TP-only
  // learns twice SP's tokens/s. The prior (the gates) runs SP; exploration runs TP-only
  // (steps 0-3, then one run in each 134 steps, at a place the schedule picks: the second
  // at steps 134 + ProbeRunStart(1, 134)). The band has its samples after that run; 300
  // steps leave over 50 decisions after it.
  ASSERT_LT(134 + ProbeRunStart(1, 134) + kProbeRunSteps, 300 - 50);
  int64_t adaptive = 0, probes = 0;
  for (int64_t step = 0; step < 300; ++step) {
    v1::Decision d;
    ASSERT_THAT(state->Decide(Plan("j", 0, step, {500, 500}), &d), IsOk()) << step;
    adaptive += d.reason() == v1::ADAPTIVE;
    probes += d.reason() == v1::PROBE;
    const bool sp = d.mode() == v1::SEQUENCE_PARALLEL;
    v1::StepTelemetry t0 = Tel("j", 0, 0, step, d.mode(), sp ? 1.5 : 1.0, 0);
    v1::StepTelemetry t1 = Tel("j", 0, 1, step, d.mode(), sp ? 2.0 : 0.5, 0);
    ASSERT_THAT(state->RecordTelemetry(**s0, t0), IsOk());
    ASSERT_THAT(state->RecordTelemetry(**s1, t1), IsOk());
    clock_.Advance(absl::Milliseconds(100));
  }
  EXPECT_GT(probes, 0);
  EXPECT_GT(adaptive, 50) << "the band learned and decided";
  auto job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  const ThroughputTable table = spgate::FromProto(job->learned());
  const GateConfig c = spgate::LayerGateConfig(GateConfig{}, job->config().config());
  const int band = BandOf(c, 0.0, 1000);
  EXPECT_NEAR(table.cell(band, Mode::kSequenceParallel).tokens_per_s(), 500.0, 1e-9);  // 1000 / 2
  EXPECT_NEAR(table.cell(band, Mode::kTensorParallelOnly).tokens_per_s(), 1000.0, 1e-9);
  EXPECT_GT(job->exploration_steps(), 0);
  EXPECT_DOUBLE_EQ(job->adaptive_gain_ratio(), 2.0) << "static would run SP at half the rate";
  // The leader heard of it; the other rank did not; no more than once a second.
  ASSERT_FALSE(leader->learned.empty());
  EXPECT_TRUE(other->learned.empty());
  EXPECT_LE(leader->learned.size(), 30u + 1u);  // 30 s of steps
  EXPECT_NEAR(leader->learned.back().cell(band, Mode::kTensorParallelOnly).tokens_per_s(), 1000.0,
              1e-6);
  // A leader that reconnects gets the table at once.
  auto again = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(r0->session_id(), again).status(), IsOk());
  ASSERT_EQ(again->learned.size(), 1u);
  // A new launch, once this one's streams have closed, starts the table afresh when it
  // declares another shape (learned_store_test: one of the same shape starts from it).
  state->state->DetachSession(**s0, leader.get());
  state->state->DetachSession(**s0, again.get());
  state->state->DetachSession(**s1, other.get());
  v1::RegisterRequest relaunch = Reg("j", 0, 0, 2);
  relaunch.set_incarnation("launch-2");
  relaunch.mutable_model()->set_layers(2);
  ASSERT_THAT(state->Register(relaunch).status(), IsOk());
  EXPECT_EQ(state->GetJob("j")->learned().cells_size(), 0);
}

// ---- job identity and sessions (docs/design.md §10) ----

TEST_F(GateStateTest, ANewIncarnationStartsTheJobAfreshAndKeepsOperatorSettings) {
  auto state = Make();
  v1::RegisterRequest a0 = Reg("j", 0, 0, 2), a1 = Reg("j", 0, 1, 2);
  a0.set_incarnation("launch-A");
  a1.set_incarnation("launch-A");
  auto ra0 = state->Register(a0), ra1 = state->Register(a1);
  ASSERT_THAT(ra0.status(), IsOk());
  ASSERT_THAT(ra1.status(), IsOk());
  auto leader_a = state->state->FindSession(ra0->session_id());
  auto rank1_a = state->state->FindSession(ra1->session_id());
  ASSERT_THAT(leader_a.status(), IsOk());
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.5);
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  for (int64_t s = 0; s < 10; ++s) {
    ASSERT_THAT(state->state->Decide(**leader_a, PlanFromProto(Plan("j", 0, s, {64, 64})))
                    .status(),
                IsOk());
  }

  // The relaunch: same job id, new incarnation, once launch A's ranks have gone quiet.
  // Step 3 is decided afresh for its batch (the old launch's cached answer for step 3
  // was for another batch).
  clock_.Advance(absl::Seconds(5));
  v1::RegisterRequest b0 = Reg("j", 0, 0, 1);
  b0.set_incarnation("launch-B");
  auto rb0 = state->Register(b0);
  ASSERT_THAT(rb0.status(), IsOk());
  EXPECT_EQ(rb0->last_decided_step(), -1) << "the new launch starts afresh";
  EXPECT_DOUBLE_EQ(rb0->config().config().max_length_cv(), 0.5) << "operator settings stay";
  auto leader_b = state->state->FindSession(rb0->session_id());
  ASSERT_THAT(leader_b.status(), IsOk());
  auto fresh = state->state->Decide(**leader_b, PlanFromProto(Plan("j", 0, 3, {100, 5000})));
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_EQ(fresh->reason, Reason::kLengthCv);
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "launch-B");
  EXPECT_EQ(state->GetJob("j")->summary().steps_decided(), 1);

  // The old launch's sessions are refused, clearly, and change nothing.
  EXPECT_THAT(state->state->FindSession(ra0->session_id()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // ... without naming the launch that replaced them (the caller did not send it).
  EXPECT_THAT(state->state->Decide(**leader_a, PlanFromProto(Plan("j", 0, 11, {64}))).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("launch-A"), HasSubstr("replaced"),
                             Not(HasSubstr("launch-B")))));
  EXPECT_THAT(state->RecordTelemetry(**rank1_a, Tel("j", 0, 1, 9, v1::SEQUENCE_PARALLEL, 1, 0.1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("incarnation")));
  EXPECT_THAT(state->Heartbeat(**rank1_a, v1::Heartbeat()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Its streams ending later do not touch the new launch's ranks.
  state->state->DetachSession(**rank1_a, nullptr);
  state->state->Touch(**rank1_a);
  EXPECT_EQ(state->GetJob("j")->groups(0).ranks_active(), 1);
  // A rank of the old launch cannot rejoin and flip the job back.
  EXPECT_THAT(state->Register(a1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replaced")));
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "launch-B");
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"stale_incarnation\"} 4"));
}

// A second launch under a running job's id is refused while the first holds streams, so
// a stray or hostile Register cannot take the job away; once the first launch's streams
// have closed (its processes exited) the new one takes over. A rank that restarts inside
// its launch resumes after the group's last decided step, and pins outlive launches.
TEST_F(GateStateTest, ALaunchWithOpenStreamsKeepsItsJobAndARestartedRankResumes) {
  auto state = Make();
  v1::RegisterRequest a0 = Reg("j", 0, 0, 1);
  a0.set_incarnation("launch-A");
  auto ra0 = state->Register(a0);
  ASSERT_THAT(ra0.status(), IsOk());
  EXPECT_EQ(ra0->last_decided_step(), -1);
  auto sink = std::make_shared<RecordingSink>();
  auto leader = state->state->AttachSession(ra0->session_id(), sink);
  ASSERT_THAT(leader.status(), IsOk());
  for (int64_t s = 0; s < 5; ++s) {
    ASSERT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("j", 0, s, {64, 64}))).status(),
                IsOk());
  }
  v1::PinModeRequest pin = Pin("j", v1::SEQUENCE_PARALLEL, 3600);
  ASSERT_THAT(state->PinMode(pin).status(), IsOk());

  v1::RegisterRequest b0 = Reg("j", 0, 0, 1);
  b0.set_incarnation("launch-B");
  EXPECT_THAT(state->Register(b0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("held by another launch"), HasSubstr("launch-B"),
                             Not(HasSubstr("launch-A")))));
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "launch-A");
  // The running launch is untouched: its session decides on, after step 4.
  auto d5 = state->state->Decide(**leader, PlanFromProto(Plan("j", 0, 5, {64, 64})));
  ASSERT_THAT(d5.status(), IsOk());
  EXPECT_EQ(d5->reason, Reason::kPinned);

  // The leader restarts inside launch A: it resumes after the group's last decided step.
  auto again = state->Register(a0);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->last_decided_step(), 5);

  // Launch A's stream closes (its processes are gone): launch B takes over, afresh, and
  // the operator's pin still holds.
  state->state->DetachSession(**leader, sink.get());
  auto rb0 = state->Register(b0);
  ASSERT_THAT(rb0.status(), IsOk());
  EXPECT_EQ(rb0->last_decided_step(), -1);
  auto leader_b = state->state->FindSession(rb0->session_id());
  ASSERT_THAT(leader_b.status(), IsOk());
  auto d0 = state->state->Decide(**leader_b, PlanFromProto(Plan("j", 0, 0, {100, 5000})));
  ASSERT_THAT(d0.status(), IsOk());
  EXPECT_EQ(d0->reason, Reason::kPinned) << "pins are the operator's: they outlive a launch";
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"live_incarnation\"} 1"));
}

TEST_F(GateStateTest, SessionIdsAreLongAndUnrelated) {
  auto state = Make();
  std::set<std::string> seen;
  for (int r = 0; r < 64; ++r) {
    auto reg = state->Register(Reg("j", r, 0, 1));
    ASSERT_THAT(reg.status(), IsOk());
    EXPECT_THAT(reg->session_id(), MatchesRegex("[0-9a-f]{32}"));
    seen.insert(reg->session_id());
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST_F(GateStateTest, RegisterNeedsAnIncarnation) {
  auto state = Make();
  v1::RegisterRequest r = Reg("j", 0, 0, 1);
  r.set_incarnation(std::string(200, 'x'));
  EXPECT_THAT(state->Register(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("incarnation")));
  r.set_incarnation("has space");
  EXPECT_THAT(state->Register(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("incarnation")));
  EXPECT_THAT(state->state->Register(RegisterInput{.job_id = "j", .group_size = 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("incarnation: required")));
}

TEST_F(GateStateTest, OnlyTheLeaderPlansAndNeverTooFarAhead) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 2));
  auto r1 = state->Register(Reg("j", 0, 1, 2));
  auto leader = state->state->FindSession(r0->session_id());
  auto follower = state->state->FindSession(r1->session_id());
  ASSERT_THAT(follower.status(), IsOk());
  EXPECT_THAT(state->state->Decide(**follower, PlanFromProto(Plan("j", 0, 0, {64}))).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("leader")));
  EXPECT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("other", 0, 0, {64}))).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
  ASSERT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("j", 0, 0, {64}))).status(),
              IsOk());
  // One plan far in the future must not take the group away from the daemon.
  const int64_t far = 1'000'000'000'000'000;
  EXPECT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("j", 0, far, {64}))).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_plan_lead_steps")));
  auto next = state->state->Decide(**leader, PlanFromProto(Plan("j", 0, 1, {64})));
  ASSERT_THAT(next.status(), IsOk()) << "the group is still the daemon's";
  EXPECT_EQ(next->step, 1);
  EXPECT_EQ(state->GetJob("j")->groups(0).last_step(), 1);
  EXPECT_THAT(state->state->FindSession("").status(),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(state->state->FindSession("0123456789abcdef").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GateStateTest, AnUnforcedTpPinYieldsToMemoryAForcedOneDoesNot) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  v1::PinModeRequest pin = Pin("j", v1::TENSOR_PARALLEL_ONLY, 60);
  ASSERT_THAT(state->PinMode(pin).status(), IsOk());
  v1::BatchPlan tight = Plan("j", 0, 1, {64});
  tight.set_memory_budget_bytes(1000);
  tight.set_predicted_peak_bytes_tp(950);  // over 0.9 x budget
  tight.set_predicted_peak_bytes_sp(600);
  ASSERT_THAT(state->Decide(tight, &d), IsOk());
  EXPECT_EQ(d.reason(), v1::MEMORY_REQUIRES_SP);
  EXPECT_EQ(d.mode(), v1::SEQUENCE_PARALLEL);
  pin.set_force(true);
  auto forced = state->PinMode(pin);
  ASSERT_THAT(forced.status(), IsOk());
  EXPECT_TRUE(forced->force());
  tight.set_step(2);
  ASSERT_THAT(state->Decide(tight, &d), IsOk());
  EXPECT_EQ(d.reason(), v1::PINNED);
  EXPECT_EQ(d.mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_TRUE(d.pin_forced());
  EXPECT_EQ(d.pin_expire_time().seconds(), absl::ToUnixSeconds(clock_.Now() + absl::Seconds(60)));
  EXPECT_TRUE(state->GetJob("j")->pins(0).force());
}

TEST_F(GateStateTest, APinEndsWhenItExpires) {
  auto state = Make();
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  v1::PinModeRequest pin;
  pin.set_job_id("j");
  pin.set_group(0);
  pin.set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin.mutable_duration()->set_seconds(30);
  ASSERT_THAT(state->PinMode(pin).status(), IsOk());
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::PINNED);
  clock_.Advance(absl::Seconds(29));
  ASSERT_THAT(state->Decide(Plan("j", 0, 2, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::PINNED);
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(state->Decide(Plan("j", 0, 3, {64}), &d), IsOk());
  EXPECT_EQ(d.reason(), v1::GATES_PASSED);
  EXPECT_EQ(state->GetJob("j")->pins_size(), 0);
}

// ---- launch credentials, the step window and plans answered from their own facts
// (docs/security.md, docs/design.md §10) ----

TEST_F(GateStateTest, ALaunchIsJoinedOnlyWithItsCredential) {
  auto state = Make();
  v1::RegisterRequest r0 = Reg("j", 0, 0, 2), r1 = Reg("j", 0, 1, 2);
  r0.set_launch_credential("0123456789abcdef0123456789abcdef");
  auto first = state->Register(r0);
  ASSERT_THAT(first.status(), IsOk());
  // The launch's other ranks must present the credential its first Register set.
  r1.clear_launch_credential();
  EXPECT_THAT(state->state->Register(*RegisterFromProto(r1)).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("launch_credential: required")));
  r1.set_launch_credential("not-the-launch-credential");
  EXPECT_THAT(state->Register(r1).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("launch_credential: does not match"),
                             Not(HasSubstr("0123456789abcdef")))));
  r1.set_launch_credential("short");
  EXPECT_THAT(state->Register(r1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 to 128 characters")));
  r1.set_launch_credential("0123456789abcdef0123456789abcde f");
  EXPECT_THAT(state->Register(r1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("printable ASCII")));
  // The same seat, taken over by someone who knows only the launch's public names, is
  // refused: the leader's session and its stream stay.
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(first->session_id(), sink).status(), IsOk());
  v1::RegisterRequest attacker = Reg("j", 0, 0, 2);
  attacker.set_launch_credential("guessed-guessed-guessed-guessed");
  EXPECT_THAT(state->Register(attacker).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(state->state->FindSession(first->session_id()).status(), IsOk());
  EXPECT_TRUE(sink->ended.empty());
  r1.set_launch_credential("0123456789abcdef0123456789abcdef");
  ASSERT_THAT(state->Register(r1).status(), IsOk());
  // The leader's process restarts and registers again with the credential: it takes its
  // own seat back, and the old session's stream is ended saying so.
  auto again = state->Register(r0);
  ASSERT_THAT(again.status(), IsOk());
  ASSERT_EQ(sink->ended.size(), 1u);
  EXPECT_THAT(sink->ended[0],
              StatusIs(absl::StatusCode::kAborted, HasSubstr("session replaced")));
  EXPECT_THAT(state->state->FindSession(first->session_id()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"launch_credential\"} 2"));
}

// A rank refused for its group index is refused before the launch book is asked: it
// neither creates its job (which would count against --max_jobs) nor claims its launch
// with its credential (which would lock the launch's real ranks out).
TEST_F(GateStateTest, ARankRefusedForItsGroupCreatesNoJobAndClaimsNoLaunch) {
  auto state = Make("", {}, [](StateOptions& o) {
    o.max_jobs = 1;
    o.max_groups_per_job = 2;
  });
  v1::RegisterRequest bad = Reg("j", 5, 0, 2);
  bad.set_launch_credential("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  EXPECT_THAT(state->Register(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("group: must be in [0, 2) (--max_groups_per_job), got 5")));
  EXPECT_THAT(state->GetJob("j").status(), StatusIs(absl::StatusCode::kNotFound));
  bad.set_job_id("other");
  EXPECT_THAT(state->Register(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  // The one job the daemon may track, with another credential: the launch is its.
  v1::RegisterRequest good = Reg("j", 0, 0, 2);
  good.set_launch_credential("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
  EXPECT_THAT(state->Register(good).status(), IsOk());
  bad.set_job_id("j");
  bad.set_launch_credential("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
  EXPECT_THAT(state->Register(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(state->GetJob("j")->groups_size(), 1);
}

// --max_jobs is one pool: a job scope made through the admin API (a setting or a pin for
// a job that is not running) is a tracked job as a registered one is, so it is refused
// once the daemon tracks that many, and a restart, which restores both kinds, finds no
// more jobs than ran before it.
TEST_F(GateStateTest, MaxJobsCountsSettingsOnlyJobsWithLiveOnesAndARestartAgrees) {
  const std::string dir = TempDir();
  const auto two_jobs = [](StateOptions& o) { o.max_jobs = 2; };
  const auto set_cv = [](const std::string& job) {
    v1::UpdateGateConfigRequest up;
    up.set_job_id(job);
    up.mutable_config()->set_max_length_cv(0.3);
    up.mutable_update_mask()->add_paths("max_length_cv");
    return up;
  };
  {
    auto state = Make(dir, {}, two_jobs);
    ASSERT_THAT(state->Register(Reg("ja", 0, 0, 1)).status(), IsOk());
    ASSERT_THAT(state->Register(Reg("jb", 0, 0, 1)).status(), IsOk());
    const auto full = StatusIs(absl::StatusCode::kResourceExhausted,
                               HasSubstr("job jd: the daemon already tracks 2 jobs (--max_jobs=2)"));
    EXPECT_THAT(state->UpdateGateConfig(set_cv("jd")).status(), full);
    EXPECT_THAT(state->PinMode(Pin("jd", v1::TENSOR_PARALLEL_ONLY, 600)).status(), full);
    EXPECT_THAT(state->GetGateConfig("jd").status(), StatusIs(absl::StatusCode::kNotFound));
    // The jobs it tracks take settings and pins as ever.
    EXPECT_THAT(state->UpdateGateConfig(set_cv("ja")).status(), IsOk());
    EXPECT_THAT(state->PinMode(Pin("jb", v1::SEQUENCE_PARALLEL, 600)).status(), IsOk());
    EXPECT_THAT(state->Register(Reg("jc", 0, 0, 1)).status(),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_jobs")));
  }
  auto restarted = Make(dir, {}, two_jobs);
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(restarted->ListJobs().jobs_size(), 2);
}

// A job listed only for a pin that expired is forgotten once idle; pinning it again adds
// a job like any new one, so it is refused while the daemon tracks --max_jobs others.
TEST_F(GateStateTest, SettingAForgottenJobsScopeAgainCountsAsANewJob) {
  auto state = Make("", {}, [](StateOptions& o) { o.max_jobs = 1; });
  ASSERT_THAT(state->PinMode(Pin("p", v1::SEQUENCE_PARALLEL, 1)).status(), IsOk());
  clock_.Advance(absl::Minutes(11));  // the pin ran out, and the job idled past forget_after
  state->Sweep();
  EXPECT_THAT(state->GetJob("p").status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(state->Register(Reg("ja", 0, 0, 1)).status(), IsOk());
  EXPECT_THAT(state->PinMode(Pin("p", v1::SEQUENCE_PARALLEL, 600)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("job p: the daemon already tracks 1 job (--max_jobs=1)")));
  EXPECT_EQ(state->ListJobs().jobs_size(), 1);
}

// A daemon comes back with everything it persisted even past --max_jobs (lowered since):
// a warning names the count and the flag, and new jobs are refused until fewer are
// tracked. (Refusing to start would restart it in a loop, over its own files.)
TEST_F(GateStateTest, ARestartPastMaxJobsRestoresEveryJobAndRefusesNewOnesUntilUnder) {
  const std::string dir = TempDir();
  {
    auto state = Make(dir, {}, [](StateOptions& o) { o.max_jobs = 3; });
    ASSERT_THAT(state->Register(Reg("ja", 0, 0, 1)).status(), IsOk());
    ASSERT_THAT(state->Register(Reg("jb", 0, 0, 1)).status(), IsOk());
    ASSERT_THAT(state->PinMode(Pin("jd", v1::TENSOR_PARALLEL_ONLY, 3600)).status(), IsOk());
  }
  std::vector<std::string> log;
  auto state = Make(dir, {}, [&log](StateOptions& o) {
    o.max_jobs = 2;
    o.log = [&log](const std::string& line) { log.push_back(line); };
  });
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->ListJobs().jobs_size(), 3);
  EXPECT_EQ(state->GetJob("ja")->summary().incarnation(), StateHarness::kIncarnation);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], AllOf(HasSubstr("restored 3 jobs, more than --max_jobs=2"),
                            HasSubstr("refused until fewer jobs than that are tracked")));
  const auto over = StatusIs(absl::StatusCode::kResourceExhausted,
                             HasSubstr("already tracks 3 jobs (--max_jobs=2)"));
  EXPECT_THAT(state->Register(Reg("je", 0, 0, 1)).status(), over);
  EXPECT_THAT(state->PinMode(Pin("jf", v1::SEQUENCE_PARALLEL, 600)).status(), over);
  EXPECT_THAT(state->PinMode(Pin("jd", v1::SEQUENCE_PARALLEL, 600)).status(), IsOk())
      << "a job it tracks";
  v1::ForgetJobRequest forget;
  forget.set_job_id("jd");
  forget.set_forget_operator_settings(true);
  ASSERT_THAT(state->store->ForgetJob(forget, {"ops"}).status(), IsOk());
  EXPECT_THAT(state->Register(Reg("je", 0, 0, 1)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("tracks 2 jobs")));
  forget.set_job_id("jb");
  ASSERT_THAT(state->store->ForgetJob(forget, {"ops"}).status(), IsOk());
  EXPECT_THAT(state->Register(Reg("je", 0, 0, 1)).status(), IsOk());
}

// Holding a stream open is not holding a job: a launch lets go once its ranks have sent
// nothing for stale_after (or closed their streams), so a squatter that registered a
// job id first cannot keep the real launch out. A unary-only launch (no stream) holds
// its job while it decides.
TEST_F(GateStateTest, ALaunchHoldsItsJobOnlyWhileItsRanksAreHeardFrom) {
  auto state = Make();
  v1::RegisterRequest squat = Reg("j", 0, 0, 1);
  squat.set_incarnation("squatter");
  auto sq = state->Register(squat);
  ASSERT_THAT(sq.status(), IsOk());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(sq->session_id(), sink).status(), IsOk());
  v1::RegisterRequest real = Reg("j", 0, 0, 1);
  real.set_incarnation("slurm-4711.0");
  EXPECT_THAT(state->Register(real).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  clock_.Advance(absl::Seconds(5));  // the squatter's stream is open but silent
  ASSERT_THAT(state->Register(real).status(), IsOk());
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "slurm-4711.0");

  // A unary-only launch: deciding keeps it; silence releases it.
  v1::Decision d;
  auto unary = state->Register(Reg("u", 0, 0, 1));
  ASSERT_THAT(unary.status(), IsOk());
  auto s = state->state->FindSession(unary->session_id());
  ASSERT_THAT(s.status(), IsOk());
  v1::RegisterRequest next = Reg("u", 0, 0, 1);
  next.set_incarnation("launch-2");
  for (int64_t step = 0; step < 3; ++step) {
    clock_.Advance(absl::Seconds(4));
    ASSERT_THAT(state->state->Decide(**s, PlanFromProto(Plan("u", 0, step, {64}))).status(),
                IsOk());
    EXPECT_THAT(state->Register(next).status(), StatusIs(absl::StatusCode::kFailedPrecondition))
        << "a unary-only job that decides every 4 s keeps its launch";
  }
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(state->Register(next).status(), IsOk());
}

TEST_F(GateStateTest, LaunchesAndTheirCredentialsSurviveARestart) {
  const std::string dir = TempDir();
  const std::string credential = "launch-A-credential-0123456789";
  {
    auto state = Make(dir);
    v1::RegisterRequest a = Reg("j", 0, 0, 1);
    a.set_incarnation("launch-A");
    a.set_launch_credential(credential);
    ASSERT_THAT(state->Register(a).status(), IsOk());
  }
  // The file holds the digest, never the credential.
  EXPECT_THAT(ReadAll(LaunchesFilePath(dir)), AllOf(HasSubstr("launch-A"), HasSubstr(LaunchCredentialDigest(credential)),
                          Not(HasSubstr(credential))));
  {
    // After a restart (kill -9 leaves the same files) the first registrant of launch A
    // must still present its credential.
    auto state = Make(dir);
    v1::RegisterRequest a = Reg("j", 0, 1, 2);
    a.set_incarnation("launch-A");
    a.set_launch_credential("someone-else-entirely-0000");
    EXPECT_THAT(state->Register(a).status(), StatusIs(absl::StatusCode::kPermissionDenied));
    EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "launch-A");
    a.set_launch_credential(credential);
    ASSERT_THAT(state->Register(a).status(), IsOk());
    // No other launch takes the job while A's ranks may still be coming back after the
    // restart (restored_launch_hold, 15 s), even once the one that came back is silent.
    v1::RegisterRequest b = Reg("j", 0, 0, 1);
    b.set_incarnation("launch-B");
    clock_.Advance(absl::Seconds(6));
    EXPECT_THAT(state->Register(b).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
    // Launch B replaces A once the hold is over and A's ranks are silent.
    clock_.Advance(absl::Seconds(10));
    ASSERT_THAT(state->Register(b).status(), IsOk());
  }
  {
    // ... and A stays replaced across the next restart.
    auto state = Make(dir);
    v1::RegisterRequest a = Reg("j", 0, 0, 1);
    a.set_incarnation("launch-A");
    a.set_launch_credential(credential);
    EXPECT_THAT(state->Register(a).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replaced")));
    EXPECT_EQ(state->GetJob("j")->summary().incarnation(), "launch-B");
  }
  // A launches file that does not parse stops start-up; it is never replaced.
  std::ofstream(LaunchesFilePath(dir)) << "launches { job_id: ";
  StateOptions o;
  o.clock = [this] { return clock_.Now(); };
  o.state_dir = dir;
  StoreOptions so;
  so.state_dir = dir;
  EXPECT_THAT(StateHarness::Create(o, so, &metrics_).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(kLaunchesFileName)));
}

TEST_F(GateStateTest, ANewLaunchThatCannotBePersistedChangesNothing) {
  const std::string dir = TempDir();
  auto state = Make(dir);
  ASSERT_THAT(state->Register(Reg("j", 0, 0, 1)).status(), IsOk());
  std::filesystem::permissions(dir, std::filesystem::perms::owner_read |
                                        std::filesystem::perms::owner_exec);
  if (::geteuid() == 0) {
    // root writes regardless of permissions: make the file's name a directory instead.
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
    std::filesystem::remove(LaunchesFilePath(dir));
    std::filesystem::create_directory(LaunchesFilePath(dir));
  }
  clock_.Advance(absl::Seconds(6));
  v1::RegisterRequest b = Reg("j", 0, 0, 1);
  b.set_incarnation("launch-2");
  EXPECT_THAT(state->Register(b).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot persist")));
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), StateHarness::kIncarnation);
  // A new job's first launch, refused alike, leaves no job behind to be listed.
  EXPECT_THAT(state->Register(Reg("new", 0, 0, 1)).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot persist")));
  EXPECT_THAT(state->GetJob("new").status(), StatusIs(absl::StatusCode::kNotFound));
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
}

// A read-only state directory (--allow_read_only_state_dir) is read, never written: a new
// launch is granted in memory where its write would fail, and nothing counts as a failed
// write.
TEST_F(GateStateTest, AReadOnlyStateDirGrantsLaunchesInMemory) {
  const std::string dir = TempDir();
  std::filesystem::create_directory(LaunchesFilePath(dir));  // any write of it would fail
  auto state = Make(dir, {}, [](StateOptions& o) { o.read_only_state_dir = true; });
  ASSERT_THAT(state->Register(Reg("j", 0, 0, 1)).status(), IsOk());
  EXPECT_EQ(state->GetJob("j")->summary().incarnation(), StateHarness::kIncarnation);
  EXPECT_EQ(metrics_.state_persist_failures.Value(), 0);
  EXPECT_TRUE(std::filesystem::is_directory(LaunchesFilePath(dir)));
}

TEST_F(GateStateTest, ACachedDecisionAnswersOnlyThePlanItWasMadeFor) {
  auto state = Make();
  v1::BatchPlan plan = Plan("j", 0, 0, {4096, 4096});
  plan.set_memory_budget_bytes(80'000'000'000);
  plan.set_predicted_peak_bytes_sp(50'000'000'000);
  plan.set_predicted_peak_bytes_tp(79'000'000'000);  // TP-only does not fit 0.9 x budget
  v1::Decision first, again;
  ASSERT_THAT(state->Decide(plan, &first), IsOk());
  EXPECT_EQ(first.reason(), v1::MEMORY_REQUIRES_SP);
  ASSERT_THAT(state->Decide(plan, &again), IsOk());
  EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString()) << "a retry, answered alike";
  // The same step with other facts (say, one that left out the memory facts) is refused:
  // the cached answer says nothing about whether that plan fits.
  v1::BatchPlan other = plan;
  other.clear_predicted_peak_bytes_tp();
  EXPECT_THAT(state->Decide(other, &again),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("different plan")));
  other = plan;
  other.set_lengths(0, 4097);
  EXPECT_THAT(state->Decide(other, &again),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("different plan")));
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"plan_mismatch\"} 2"));
  EXPECT_EQ(state->GetJob("j")->summary().steps_decided(), 1);
}

TEST_F(GateStateTest, TelemetryIsTakenOnlyForDecidedStepsAndOncePerRank) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 4));
  auto r1 = state->Register(Reg("j", 0, 1, 4));
  auto leader = state->state->FindSession(r0->session_id());
  auto rank1 = state->state->FindSession(r1->session_id());
  ASSERT_THAT(rank1.status(), IsOk());
  EXPECT_THAT(state->RecordTelemetry(**rank1, Tel("j", 0, 1, 0, v1::SEQUENCE_PARALLEL, 1, 0.9)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no decided step")));
  ASSERT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("j", 0, 0, {500, 500}))).status(),
              IsOk());
  // 2,000 future steps of a 90 % reduce-scatter wait: none is taken.
  for (int64_t s = 1; s <= 2000; ++s) {
    EXPECT_THAT(state->RecordTelemetry(**rank1, Tel("j", 0, 1, s, v1::SEQUENCE_PARALLEL, 1, 0.9)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after its last decided")));
  }
  // One rank repeating its record for a decided step does not stand in for the others.
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(state->RecordTelemetry(**rank1, Tel("j", 0, 1, 0, v1::SEQUENCE_PARALLEL, 1, 0.9)),
                IsOk());
  }
  EXPECT_FALSE(state->GetJob("j")->groups(0).has_rolling_rs_wait_share())
      << "the step is not final until every rank reported it";
  for (int64_t s = 1; s <= 120; ++s) {
    auto d = state->state->Decide(**leader, PlanFromProto(Plan("j", 0, s, {500, 500})));
    ASSERT_THAT(d.status(), IsOk());
    EXPECT_EQ(d->reason, Reason::kGatesPassed) << s;
  }
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"undecided_step\"} 2001"));
}

// One plan far ahead costs the group at most the lead; a leader that (re)attaches, or a
// group that was silent (it ran on its fallback), resumes wherever it is.
TEST_F(GateStateTest, OnePlanAheadCostsAtMostTheLeadAndAReattachedLeaderResumes) {
  auto state = Make("", {}, [](StateOptions& o) { o.max_plan_lead_steps = 16; });
  auto r0 = state->Register(Reg("j", 0, 0, 1));
  auto leader = state->state->FindSession(r0->session_id());
  ASSERT_THAT(leader.status(), IsOk());
  auto decide = [&](int64_t step) {
    return state->state->Decide(**leader, PlanFromProto(Plan("j", 0, step, {64}))).status();
  };
  ASSERT_THAT(decide(0), IsOk());
  EXPECT_THAT(decide(17), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("--max_plan_lead_steps")));
  ASSERT_THAT(decide(16), IsOk());
  int refused = 0;
  for (int64_t s = 1; s < 16; ++s) refused += decide(s).ok() ? 0 : 1;
  EXPECT_EQ(refused, 15);
  ASSERT_THAT(decide(17), IsOk()) << "the group is the daemon's again";
  // The leader reconnects after running 1,000 steps on its fallback.
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(r0->session_id(), sink).status(), IsOk());
  ASSERT_THAT(decide(1017), IsOk());
  EXPECT_THAT(decide(5000), StatusIs(absl::StatusCode::kInvalidArgument));
  // A unary leader silent for stale_after resumes too.
  clock_.Advance(absl::Seconds(5));
  ASSERT_THAT(decide(5000), IsOk());
}

TEST_F(GateStateTest, ASessionHasOneStreamAndANewerOneEndsTheOlder) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 1));
  auto first = std::make_shared<RecordingSink>(), second = std::make_shared<RecordingSink>();
  ASSERT_THAT(state->AttachSession(r0->session_id(), first).status(), IsOk());
  ASSERT_THAT(state->AttachSession(r0->session_id(), second).status(), IsOk());
  ASSERT_EQ(first->ended.size(), 1u);
  EXPECT_THAT(first->ended[0], StatusIs(absl::StatusCode::kAborted, HasSubstr("newer")));
  EXPECT_TRUE(second->ended.empty());
  // Config pushes go to the newer stream only.
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.4);
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  EXPECT_TRUE(first->updates.empty());
  EXPECT_EQ(second->updates.size(), 1u);
}

TEST_F(GateStateTest, MemoryOverridesAreCountedFromCumulativeHeartbeats) {
  auto state = Make();
  auto r0 = state->Register(Reg("j", 0, 0, 1));
  auto s0 = state->state->FindSession(r0->session_id());
  ASSERT_THAT(s0.status(), IsOk());
  v1::Heartbeat hb;
  for (int64_t count : {2, 2, 5, 1 /* a restarted process */}) {
    hb.set_memory_overrides(count);
    ASSERT_THAT(state->Heartbeat(**s0, hb).status(), IsOk());
  }
  EXPECT_EQ(state->GetJob("j")->memory_overrides(), 6);
  const std::string text =
      prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_THAT(text, HasSubstr("spgate_worker_memory_overrides_total{job_id=\"j\"} 6"));
}

// ---- limits and bounded memory (docs/design.md §10) ----

double LimitCount(Metrics& m, Limit limit) { return m.LimitRefusals(limit).Value(); }

TEST_F(GateStateTest, SessionsPerJobAreCappedAndRegisteringAgainReplacesTheRanksSession) {
  auto state = Make("", {}, [](StateOptions& o) { o.max_sessions_per_job = 2; });
  auto first = state->Register(Reg("j", 0, 0, 2));
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT(state->Register(Reg("j", 0, 1, 2)).status(), IsOk());
  EXPECT_THAT(state->Register(Reg("j", 1, 0, 1)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_sessions_per_job")));
  EXPECT_EQ(LimitCount(metrics_, Limit::kSessionsPerJob), 1);
  // A rank registering again (a restarted process, a reconnect) is not a new session:
  // it replaces its own, and the old token stops working.
  for (int i = 0; i < 5; ++i) {
    ASSERT_THAT(state->Register(Reg("j", 0, 0, 2)).status(), IsOk()) << i;
  }
  EXPECT_THAT(state->state->FindSession(first->session_id()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(LimitCount(metrics_, Limit::kSessionsPerJob), 1);
  // Other jobs have their own room.
  EXPECT_THAT(state->Register(Reg("k", 0, 0, 1)).status(), IsOk());
  // Once the job's ranks are forgotten their sessions go, and room comes back.
  clock_.Advance(absl::Minutes(11));
  state->Sweep();
  EXPECT_THAT(state->Register(Reg("j", 1, 0, 1)).status(), IsOk());
}

TEST_F(GateStateTest, PlansWithTooManySequencesAreRefusedBeforeTheyAreRead) {
  auto state = Make("", {}, [](StateOptions& o) { o.max_sequences_per_plan = 4; });
  v1::Decision d;
  EXPECT_THAT(state->Decide(Plan("j", 0, 0, {64, 64, 64, 64}), &d), IsOk());
  EXPECT_THAT(state->Decide(Plan("j", 0, 1, {64, 64, 64, 64, 64}), &d),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_sequences_per_plan")));
  EXPECT_EQ(LimitCount(metrics_, Limit::kSequencesPerPlan), 1);
  EXPECT_EQ(state->GetJob("j")->summary().steps_decided(), 1) << "nothing decided";
  // eval refuses the batch as the daemon would refuse the plan (not counted: no plan).
  const std::vector<int64_t> five = {64, 64, 64, 64, 64};
  EXPECT_THAT(state->state->WhatIf({.lengths = five}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("5 sequences in one plan, more than 4 (--max_sequences_per_plan)")));
  const std::vector<int64_t> four = {64, 64, 64, 64};
  EXPECT_THAT(state->state->WhatIf({.lengths = four}).status(), IsOk());
  EXPECT_EQ(LimitCount(metrics_, Limit::kSequencesPerPlan), 1);
}

TEST_F(GateStateTest, PlansAndTelemetryAreRateLimitedPerSession) {
  auto state = Make("", {}, [](StateOptions& o) {
    o.max_plans_per_second = 5;        // bursts of 10
    o.max_telemetry_per_second = 2;    // bursts of 4
  });
  auto reg = state->Register(Reg("j", 0, 0, 1));
  ASSERT_THAT(reg.status(), IsOk());
  auto session = state->state->FindSession(reg->session_id());
  ASSERT_THAT(session.status(), IsOk());
  int decided = 0, refused = 0;
  for (int64_t step = 0; step < 15; ++step) {
    absl::StatusOr<DecisionRecord> d =
        state->state->Decide(**session, PlanFromProto(Plan("j", 0, step, {64})));
    if (d.ok()) {
      ++decided;
    } else {
      EXPECT_THAT(d.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("decide this step locally")));
      ++refused;
    }
  }
  EXPECT_EQ(decided, 10) << "the burst";
  EXPECT_EQ(refused, 5);
  EXPECT_EQ(LimitCount(metrics_, Limit::kPlanRate), 5);
  // Another session of the same job has its own bucket.
  auto other = state->Register(Reg("j", 1, 0, 1));
  auto other_session = state->state->FindSession(other->session_id());
  EXPECT_THAT(state->state->Decide(**other_session, PlanFromProto(Plan("j", 1, 0, {64}))).status(),
              IsOk());
  // 1 s later: 5 more tokens.
  clock_.Advance(absl::Seconds(1));
  for (int64_t step = 20; step < 25; ++step) {
    EXPECT_THAT(state->state->Decide(**session, PlanFromProto(Plan("j", 0, step, {64}))).status(),
                IsOk())
        << step;
  }
  EXPECT_THAT(state->state->Decide(**session, PlanFromProto(Plan("j", 0, 25, {64}))).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));

  int accepted = 0;
  for (int64_t step = 0; step < 6; ++step) {
    absl::Status s =
        state->RecordTelemetry(**session, Tel("j", 0, 0, step, v1::SEQUENCE_PARALLEL, 1, 0.1));
    if (s.ok()) ++accepted;
    else EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("telemetry")));
  }
  EXPECT_EQ(accepted, 4);
  EXPECT_EQ(LimitCount(metrics_, Limit::kTelemetryRate), 2);
  EXPECT_EQ((*session)->telemetry_received.load(), 4) << "refused records are not acknowledged";
}

TEST_F(GateStateTest, AJobWithOnlyOperatorSettingsDropsItsLiveStateWhenIdle) {
  auto state = Make();
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.5);
  up.mutable_update_mask()->add_paths("max_length_cv");
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  auto reg = state->Register(Reg("j", 0, 0, 1));
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  ASSERT_THAT(state->Decide(Plan("j", 0, 1, {64}), &d), IsOk());
  EXPECT_EQ(state->GetJob("j")->groups_size(), 1);

  clock_.Advance(absl::Minutes(11));
  state->Sweep();
  absl::StatusOr<v1::Job> job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk()) << "the settings keep it listed";
  EXPECT_EQ(job->groups_size(), 0) << "but its live state is gone";
  EXPECT_EQ(job->summary().steps_decided(), 0);
  EXPECT_EQ(job->summary().incarnation(), "");
  EXPECT_DOUBLE_EQ(job->config().config().max_length_cv(), 0.5);
  EXPECT_THAT(state->state->FindSession(reg->session_id()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // The same launch may come back and starts afresh.
  auto again = state->Register(Reg("j", 0, 0, 1));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->last_decided_step(), -1);
}

TEST_F(GateStateTest, GroupsWithoutRanksAreDroppedWhenIdle) {
  auto state = Make();
  ASSERT_THAT(state->Register(Reg("j", 0, 0, 1)).status(), IsOk());
  ASSERT_THAT(state->Register(Reg("j", 1, 0, 1)).status(), IsOk());
  clock_.Advance(absl::Minutes(6));
  ASSERT_THAT(state->Register(Reg("j", 1, 0, 1)).status(), IsOk());  // group 1 stays alive
  clock_.Advance(absl::Minutes(6));
  state->Sweep();
  absl::StatusOr<v1::Job> job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_EQ(job->groups_size(), 1);
  EXPECT_EQ(job->groups(0).group(), 1);
}

TEST_F(GateStateTest, AJobPinnedBeforeItStartsHasNoLiveStateToForget) {
  auto state = Make();
  ASSERT_THAT(state->PinMode(Pin("ghost", v1::SEQUENCE_PARALLEL, 300)).status(), IsOk());
  v1::ForgetJobRequest forget;
  forget.set_job_id("ghost");
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::ForgetJobResponse> out = state->store->ForgetJob(forget, {"alice"});
    ASSERT_THAT(out.status(), IsOk());
    EXPECT_FALSE(out->had_live_state()) << "forget " << i;
    EXPECT_EQ(out->sessions_ended(), 0);
  }
  ASSERT_THAT(state->Register(Reg("ghost", 0, 0, 1)).status(), IsOk());
  absl::StatusOr<v1::ForgetJobResponse> out = state->store->ForgetJob(forget, {"alice"});
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_TRUE(out->had_live_state()) << "a registered rank is live state";
}

TEST_F(GateStateTest, ForgetJobDropsLiveStateAndOnRequestTheSettingsAudited) {
  const std::string dir = TempDir();
  auto state = Make(dir);
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_max_length_cv(0.5);
  up.mutable_update_mask()->add_paths("max_length_cv");
  ASSERT_THAT(state->UpdateGateConfig(up).status(), IsOk());
  auto r0 = state->Register(Reg("j", 0, 0, 2));
  auto r1 = state->Register(Reg("j", 0, 1, 2));
  v1::Decision d;
  ASSERT_THAT(state->Decide(Plan("j", 0, 0, {64}), &d), IsOk());
  auto leader = state->state->FindSession(r0->session_id());
  ASSERT_THAT(leader.status(), IsOk());

  v1::ForgetJobRequest forget;
  forget.set_job_id("j");
  absl::StatusOr<v1::ForgetJobResponse> out = state->store->ForgetJob(forget, {"alice"});
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_TRUE(out->had_live_state());
  EXPECT_EQ(out->sessions_ended(), 2);
  EXPECT_FALSE(out->removed_operator_settings());
  absl::StatusOr<v1::Job> job = state->GetJob("j");
  ASSERT_THAT(job.status(), IsOk()) << "its settings keep it listed";
  EXPECT_EQ(job->groups_size(), 0);
  EXPECT_DOUBLE_EQ(job->config().config().max_length_cv(), 0.5);
  EXPECT_THAT(state->state->FindSession(r1->session_id()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // A stream still holding the old session is told to register again.
  EXPECT_THAT(state->state->Decide(**leader, PlanFromProto(Plan("j", 0, 1, {64}))).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));

  forget.set_forget_operator_settings(true);
  out = state->store->ForgetJob(forget, {"alice"});
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_FALSE(out->had_live_state()) << "listed for its settings only, after the first forget";
  EXPECT_EQ(out->sessions_ended(), 0);
  EXPECT_TRUE(out->removed_operator_settings());
  EXPECT_THAT(state->GetJob("j").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(state->GetGateConfig("j").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(state->store->ForgetJob(forget, {"alice"}).status(),
              StatusIs(absl::StatusCode::kNotFound));

  auto records = ReadAuditLog(AuditLogPath(dir));
  ASSERT_THAT(records.status(), IsOk());
  ASSERT_EQ(records->size(), 3u);  // the update and two forgets; not the refused one
  const v1::AuditEntry& last = records->back().entry;
  EXPECT_EQ(last.rpc(), "ForgetJob");
  EXPECT_EQ(last.principal(), "alice");
  EXPECT_TRUE(last.forgot_operator_settings());
  ASSERT_EQ(last.changes_size(), 1);
  EXPECT_EQ(last.changes(0).field(), "max_length_cv");
  EXPECT_FALSE(last.changes(0).new_value().set());
  // A restart does not bring the settings back.
  state.reset();
  auto restarted = Make(dir);
  EXPECT_THAT(restarted->GetGateConfig("j").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(restarted->GetJob("j").status(), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace spgate::server
