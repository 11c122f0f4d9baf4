// The invariant behind fail-static (docs/design.md §4): for the same config, group state
// and batch, the worker's local fallback reaches the daemon's decision. A property test
// over 12,000 randomized steps: random batch lengths (around the CV gate), memory
// predictions (around the memory gate), per-rank wait shares that drift in and out of
// the RS_WAIT gate, telemetry that sometimes arrives a step late (pipelining), operator
// config updates at random scopes with their future effective_from_step, and pins.
//
// The daemon (the real operator store + live state) decides every step. The leader's
// real DecisionBook is fed exactly what a worker gets: the config pushes, the group's
// wait share per step, and the daemon's answers. Before each step, a copy of the book
// decides the step locally — as it would if the daemon's answer were late — and that
// decision must equal the daemon's: mode, the gate that decided, and config version.
// The real book then either adopts the daemon's answer or commits its own (a step run on
// the fallback), at random.
//
// Pins come and go (job or group scope, TP-only ones forced or not, each with a short
// expiry): a worker's fallback learns a pin, its end and its force from the PINNED
// decisions it adopts, honours it until it ends, and — unforced — lets it yield to the
// memory gate as the daemon does. What a fallback cannot know is not papered over: it
// learns of a new pin (or an unpin) only from a daemon decision made under it, so after a
// pin change the steps up to that decision are adopted rather than compared (counted).
#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/server/state_harness.h"
#include "tests/testing/status_matchers.h"
#include "worker/client/decision_book.h"
#include "worker/client/wire.h"

namespace spgate::server {
namespace {

using ::spgate::client::DecisionBook;
using ::spgate::client::DecisionSource;
using ::spgate::client::GateDecision;
using ::spgate::client::PlanRecord;
using ::spgate::testing::IsOk;

constexpr char kJob[] = "prop";
constexpr int kGroupSize = 2;

struct PendingTelemetry {
  int64_t step;
  Mode mode;
  double rank_share[kGroupSize];
  double step_time;
};

class FallbackEquivalenceTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

v1::GateConfig RandomOverrides(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  v1::GateConfig c;
  // A random subset of fields, each within its valid range (and the margin below the
  // share, which the validation requires of the effective config).
  if (u(rng) < 0.6) c.set_max_length_cv(0.05 + 0.55 * u(rng));
  const double share = 0.12 + 0.4 * u(rng);
  if (u(rng) < 0.6) {
    c.set_max_rs_wait_share(share);
    c.set_rs_wait_reenable_margin(std::min(0.1, share * 0.5) * u(rng) + 0.001);
  }
  if (u(rng) < 0.5) c.set_probe_interval_steps(1 + static_cast<int64_t>(u(rng) * 30));
  if (u(rng) < 0.5) c.set_min_dwell_steps(1 + static_cast<int64_t>(u(rng) * 10));
  if (u(rng) < 0.5) c.set_window_steps(1 + static_cast<int64_t>(u(rng) * 20));
  if (u(rng) < 0.4) c.set_memory_headroom(0.5 + 0.5 * u(rng));
  return c;
}

TEST_P(FallbackEquivalenceTest, LocalDecisionsEqualTheDaemonsStepByStep) {
  std::mt19937_64 rng(GetParam());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  StateOptions options;
  options.clock = [this] { return now_; };
  auto harness = StateHarness::Create(options, StoreOptions{}, /*metrics=*/nullptr);
  ASSERT_THAT(harness.status(), IsOk());
  StateHarness& h = **harness;

  // Start with thresholds the random walk crosses often.
  v1::UpdateGateConfigRequest start;
  start.set_job_id(kJob);
  start.mutable_config()->set_max_rs_wait_share(0.25);
  start.mutable_config()->set_probe_interval_steps(7);
  start.mutable_config()->set_min_dwell_steps(3);
  start.mutable_config()->set_window_steps(5);
  ASSERT_THAT(h.UpdateGateConfig(start).status(), IsOk());

  std::vector<std::shared_ptr<Session>> sessions;
  auto sink = std::make_shared<RecordingSink>();
  v1::RegisterResponse leader;
  for (int r = 0; r < kGroupSize; ++r) {
    v1::RegisterRequest reg;
    reg.set_job_id(kJob);
    reg.set_group(0);
    reg.set_rank_in_group(r);
    reg.set_group_size(kGroupSize);
    reg.set_global_rank(r);
    auto resp = h.Register(reg);
    ASSERT_THAT(resp.status(), IsOk());
    if (r == 0) leader = *resp;
    auto s = h.AttachSession(resp->session_id(), r == 0 ? sink : std::shared_ptr<RecordingSink>());
    ASSERT_THAT(s.status(), IsOk());
    sessions.push_back(*s);
  }
  DecisionBook book(GateConfig{}, /*max_pending_plans=*/64, DecisionSource::kFallback);
  auto apply_pushes = [&] {
    for (const v1::ConfigUpdate& up : sink->updates) {
      book.ScheduleConfig(LayerGateConfig(GateConfig{}, up.config().config()),
                          up.config().effective_version(), up.effective_from_step());
    }
    sink->updates.clear();
  };
  book.ScheduleConfig(LayerGateConfig(GateConfig{}, leader.config().config()),
                      leader.config().effective_version(), leader.effective_from_step());

  std::vector<PendingTelemetry> late;  // delivered after the next step's decision
  auto deliver = [&](const PendingTelemetry& t) {
    double group_share = 0;
    for (int r = 0; r < kGroupSize; ++r) {
      v1::StepTelemetry tel;
      tel.set_job_id(kJob);
      tel.set_group(0);
      tel.set_rank_in_group(r);
      tel.set_step(t.step);
      tel.set_mode(ToProto(t.mode));
      tel.set_step_time_s(t.step_time);
      tel.set_rs_wait_s(t.rank_share[r] * t.step_time);
      tel.set_effective_tokens(512);  // within every plan below (one sequence of at least 819)
      ASSERT_THAT(h.RecordTelemetry(*sessions[static_cast<size_t>(r)], tel), IsOk());
      group_share = std::max(group_share, std::min(1.0, tel.rs_wait_s() / t.step_time));
    }
    book.ObserveRsWaitShare(t.step, t.mode, group_share);  // the trainer's group max
  };

  constexpr int64_t kSteps = 12'000;
  int64_t compared = 0, adopted_for_pin = 0, local_commits = 0, config_changes = 0;
  std::map<std::pair<int, int>, int64_t> seen;  // (mode, reason) -> count
  // After a pin change: the worker must first adopt a decision that shows it.
  enum class PinNews { kNone, kPinned, kUnpinned } pin_news = PinNews::kNone;
  std::optional<absl::Time> known_pin_expire;  // of the last PINNED decision adopted
  double drift = 0.1;  // the group's wait share wanders across the threshold
  for (int64_t step = 0; step < kSteps; ++step) {
    now_ += absl::Milliseconds(50);
    // Operator actions between steps.
    if (u(rng) < 0.01) {
      v1::UpdateGateConfigRequest up;
      if (u(rng) < 0.5) up.set_job_id(kJob);
      *up.mutable_config() = RandomOverrides(rng);
      if (h.UpdateGateConfig(up).ok()) ++config_changes;  // some combinations are invalid
    }
    if (u(rng) < 0.004) {
      v1::PinModeRequest pin;
      pin.set_job_id(kJob);
      if (u(rng) < 0.5) pin.set_group(0);
      pin.set_mode(u(rng) < 0.5 ? v1::SEQUENCE_PARALLEL : v1::TENSOR_PARALLEL_ONLY);
      pin.set_force(u(rng) < 0.5);
      pin.mutable_duration()->set_seconds(1 + static_cast<int64_t>(u(rng) * 20));
      ASSERT_THAT(h.PinMode(pin).status(), IsOk());
      pin_news = PinNews::kPinned;
    } else if (u(rng) < 0.006) {
      v1::UnpinRequest unpin;
      unpin.set_job_id(kJob);
      ASSERT_THAT(h.Unpin(unpin).status(), IsOk());
      pin_news = PinNews::kUnpinned;
    }
    apply_pushes();

    // The batch: lengths around the CV gate, memory around the budget now and then.
    const int n = 1 + static_cast<int>(u(rng) * 8);
    const double spread = u(rng) < 0.5 ? 0.05 : 0.6;
    v1::BatchPlan plan;
    plan.set_job_id(kJob);
    plan.set_group(0);
    plan.set_step(step);
    for (int i = 0; i < n; ++i) {
      plan.add_lengths(std::max<int64_t>(1, static_cast<int64_t>(2048 * (1 + spread * (u(rng) - 0.5) * 2))));
    }
    if (u(rng) < 0.2) {
      plan.set_memory_budget_bytes(1000);
      plan.set_predicted_peak_bytes_sp(static_cast<uint64_t>(600 + 500 * u(rng)));
      plan.set_predicted_peak_bytes_tp(static_cast<uint64_t>(700 + 500 * u(rng)));
    }
    const std::vector<int64_t> lengths(plan.lengths().begin(), plan.lengths().end());
    PlanRecord rec;
    ASSERT_THAT(client::MakePlanRecord(nullptr,
                                       {.step = step,
                                        .lengths = lengths,
                                        .predicted_peak_bytes_sp = plan.predicted_peak_bytes_sp(),
                                        .predicted_peak_bytes_tp = plan.predicted_peak_bytes_tp(),
                                        .memory_budget_bytes = plan.memory_budget_bytes()},
                                       /*default_budget=*/0, &rec),
                IsOk());
    ASSERT_THAT(book.AddPlan(std::move(rec)), IsOk());

    v1::Decision daemon;
    ASSERT_THAT(h.Decide(plan, &daemon), IsOk()) << "step " << step;
    ++seen[{daemon.mode(), daemon.reason()}];

    GateDecision ran;
    // A pin the worker has not seen: a new one, or a job pin that takes over when a
    // group pin ends first (the worker learns each pin from a decision made under it).
    const std::optional<GateDecision> wire = client::DecisionFromProto(daemon);
    ASSERT_TRUE(wire.has_value());
    if (daemon.reason() == v1::PINNED && wire->pin_expire != known_pin_expire) {
      pin_news = PinNews::kPinned;
    }
    if (pin_news != PinNews::kNone) {
      // The worker hears of the pin change only through the daemon's decisions.
      ++adopted_for_pin;
      const bool pinned = daemon.reason() == v1::PINNED;
      const bool memory = daemon.reason() == v1::MEMORY_REQUIRES_SP ||
                          daemon.reason() == v1::MEMORY_OVER_BUDGET;
      if ((pin_news == PinNews::kPinned && pinned) ||
          (pin_news == PinNews::kUnpinned && !pinned && !memory)) {
        pin_news = PinNews::kNone;
      }
      book.OnDaemonDecision(*client::DecisionFromProto(daemon));
      ran = book.Commit(step, now_);
    } else {
      DecisionBook shadow = book;
      const GateDecision local = shadow.Commit(step, now_);
      ASSERT_EQ(local.source, DecisionSource::kFallback);
      ASSERT_EQ(ToProto(local.mode), daemon.mode()) << "step " << step;
      ASSERT_EQ(ToProto(local.policy_reason), daemon.reason()) << "step " << step;
      ASSERT_EQ(local.config_version, daemon.config_version()) << "step " << step;
      ++compared;
      if (u(rng) < 0.3) {
        ran = book.Commit(step, now_);  // the daemon was late: the group ran the local decision
        ++local_commits;
      } else {
        book.OnDaemonDecision(*client::DecisionFromProto(daemon));
        ran = book.Commit(step, now_);
      }
    }
    ASSERT_EQ(ToProto(ran.mode), daemon.mode());
    if (ran.source == DecisionSource::kDaemon && ran.reason == Reason::kPinned) {
      known_pin_expire = ran.pin_expire;
    }

    // Telemetry of earlier steps that was late arrives now; this step's may be late too.
    for (const PendingTelemetry& t : late) deliver(t);
    late.clear();
    drift = std::clamp(drift + 0.04 * (u(rng) - 0.5), 0.0, 0.6);
    PendingTelemetry t{step, ran.mode, {}, 0.1 + 0.2 * u(rng)};
    for (int r = 0; r < kGroupSize; ++r) t.rank_share[r] = std::clamp(drift + 0.05 * u(rng), 0.0, 1.0);
    if (u(rng) < 0.25) {
      late.push_back(t);
    } else {
      deliver(t);
    }
  }
  EXPECT_GE(compared, 10'000);
  EXPECT_GE(local_commits, 2'000);
  EXPECT_GE(config_changes, 50);
  // The walk must have exercised every gate, or equality would prove little.
  for (auto [mode, reason] : {std::pair{v1::SEQUENCE_PARALLEL, v1::GATES_PASSED},
                              std::pair{v1::TENSOR_PARALLEL_ONLY, v1::LENGTH_CV},
                              std::pair{v1::TENSOR_PARALLEL_ONLY, v1::RS_WAIT},
                              std::pair{v1::SEQUENCE_PARALLEL, v1::PROBE},
                              std::pair{v1::SEQUENCE_PARALLEL, v1::MEMORY_REQUIRES_SP},
                              std::pair{v1::SEQUENCE_PARALLEL, v1::MEMORY_OVER_BUDGET}}) {
    EXPECT_GT((seen[{mode, reason}]), 0) << v1::Mode_Name(mode) << "/" << v1::Reason_Name(reason);
  }
  EXPECT_GT((seen[{v1::SEQUENCE_PARALLEL, v1::PINNED}] + seen[{v1::TENSOR_PARALLEL_ONLY, v1::PINNED}]),
            0);
  RecordProperty("compared_steps", static_cast<int>(compared));
  RecordProperty("adopted_after_pin_change", static_cast<int>(adopted_for_pin));
}

INSTANTIATE_TEST_SUITE_P(Seeds, FallbackEquivalenceTest, ::testing::Values(1, 2, 3));

// The same invariant for step plans (docs/design.md §12): a pipelined job's stage decides
// every micro-batch of a step alike on both sides, under the schedule-aware memory gate,
// with the group's wait share, config changes and unknown lengths. Each seed takes a
// different stage of four (the first holds four micro-batches at once, the last one).
class StepPlanEquivalenceTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST_P(StepPlanEquivalenceTest, LocalStepPlansEqualTheDaemonsMicrobatchByMicrobatch) {
  std::mt19937_64 rng(GetParam());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  StateOptions options;
  options.clock = [this] { return now_; };
  auto harness = StateHarness::Create(options, StoreOptions{}, /*metrics=*/nullptr);
  ASSERT_THAT(harness.status(), IsOk());
  StateHarness& h = **harness;
  v1::UpdateGateConfigRequest start;
  start.set_job_id(kJob);
  start.mutable_config()->set_max_rs_wait_share(0.25);
  start.mutable_config()->set_probe_interval_steps(7);
  start.mutable_config()->set_min_dwell_steps(3);
  start.mutable_config()->set_window_steps(5);
  ASSERT_THAT(h.UpdateGateConfig(start).status(), IsOk());

  const JobLayout layout{.tp = kGroupSize, .pp = 4, .microbatches = 4};
  const int stage = static_cast<int>(GetParam() % 4);
  v1::RegisterRequest reg;
  reg.set_job_id(kJob);
  reg.set_group(stage);
  reg.set_group_size(kGroupSize);
  reg.set_group_session(true);
  ToProto(layout, reg.mutable_layout());
  reg.mutable_coordinates()->set_stage(stage);
  auto resp = h.Register(reg);
  ASSERT_THAT(resp.status(), IsOk());
  auto sink = std::make_shared<RecordingSink>();
  auto session = h.AttachSession(resp->session_id(), sink);
  ASSERT_THAT(session.status(), IsOk());
  DecisionBook book(GateConfig{}, 64, DecisionSource::kFallback,
                    client::BookLayout{.layout = layout, .stage = stage});
  book.ScheduleConfig(LayerGateConfig(GateConfig{}, resp->config().config()),
                      resp->config().effective_version(), resp->effective_from_step());

  constexpr int64_t kSteps = 1'500;
  int64_t compared = 0;
  std::map<std::pair<int, int>, int64_t> seen;
  double drift = 0.1;
  for (int64_t step = 0; step < kSteps; ++step) {
    now_ += absl::Milliseconds(50);
    if (u(rng) < 0.01) {
      v1::UpdateGateConfigRequest up;
      up.set_job_id(kJob);
      *up.mutable_config() = RandomOverrides(rng);
      (void)h.UpdateGateConfig(up);  // some combinations are invalid
    }
    for (const v1::ConfigUpdate& up : sink->updates) {
      book.ScheduleConfig(LayerGateConfig(GateConfig{}, up.config().config()),
                          up.config().effective_version(), up.effective_from_step());
    }
    sink->updates.clear();

    v1::BatchPlan plan;
    plan.set_job_id(kJob);
    plan.set_group(stage);
    plan.set_step(step);
    plan.set_resident_bytes(1000);
    if (u(rng) < 0.5) plan.set_memory_budget_bytes(1000 + static_cast<uint64_t>(u(rng) * 600));
    std::vector<std::vector<int64_t>> lengths(4);
    std::vector<client::MicrobatchPlanInput> mbs(4);
    for (int id = 0; id < 4; ++id) {
      const double spread = u(rng) < 0.5 ? 0.05 : 0.6;
      if (u(rng) > 0.05) {  // now and then this stage has not learned a micro-batch's lengths
        for (int i = 0, n = 1 + static_cast<int>(u(rng) * 6); i < n; ++i) {
          lengths[id].push_back(
              std::max<int64_t>(1, static_cast<int64_t>(2048 * (1 + spread * (u(rng) - 0.5) * 2))));
        }
      }
      mbs[id] = {.id = id,
                 .lengths = lengths[id],
                 .memory = {.activation_sp = 50 + static_cast<uint64_t>(u(rng) * 50),
                            .activation_tp = 100 + static_cast<uint64_t>(u(rng) * 100),
                            .workspace_sp = static_cast<uint64_t>(u(rng) * 30),
                            .workspace_tp = static_cast<uint64_t>(u(rng) * 60)}};
    }
    std::shuffle(mbs.begin(), mbs.end(), rng);  // keyed by id, never by order
    for (const auto& m : mbs) {
      v1::MicroBatchPlan* p = plan.add_micro_batches();
      p->set_id(m.id);
      p->mutable_lengths()->Add(m.lengths.begin(), m.lengths.end());
      p->set_activation_bytes_sp(m.memory.activation_sp);
      p->set_activation_bytes_tp(m.memory.activation_tp);
      p->set_workspace_bytes_sp(m.memory.workspace_sp);
      p->set_workspace_bytes_tp(m.memory.workspace_tp);
    }
    PlanRecord rec;
    ASSERT_THAT(client::MakePlanRecord(&layout,
                                       {.step = step,
                                        .memory_budget_bytes = plan.memory_budget_bytes(),
                                        .microbatches = mbs,
                                        .resident_bytes = plan.resident_bytes()},
                                       /*default_budget=*/0, &rec),
                IsOk());
    ASSERT_THAT(book.AddPlan(std::move(rec)), IsOk());

    v1::Decision daemon;
    ASSERT_THAT(h.Decide(plan, &daemon), IsOk()) << "step " << step;
    ASSERT_EQ(daemon.micro_batches_size(), 4);
    DecisionBook shadow = book;
    const GateDecision local = shadow.Commit(step, now_);
    ASSERT_EQ(local.microbatches.size(), 4u);
    for (int id = 0; id < 4; ++id) {
      ASSERT_EQ(ToProto(local.microbatches[id].mode), daemon.micro_batches(id).mode())
          << "step " << step << " micro-batch " << id;
      ASSERT_EQ(ToProto(local.microbatches[id].reason), daemon.micro_batches(id).reason())
          << "step " << step << " micro-batch " << id;
      ++seen[{daemon.micro_batches(id).mode(), daemon.micro_batches(id).reason()}];
    }
    ASSERT_EQ(local.config_version, daemon.config_version()) << "step " << step;
    ASSERT_EQ(local.stage_peak_bytes, daemon.predicted_stage_peak_bytes()) << "step " << step;
    ++compared;
    GateDecision ran;
    if (u(rng) < 0.3) {
      ran = book.Commit(step, now_);
    } else {
      book.OnDaemonDecision(*client::DecisionFromProto(daemon));
      ran = book.Commit(step, now_);
    }
    // The group's record: SP if any micro-batch ran SP (their reduce-scatters waited).
    Mode mode = Mode::kTensorParallelOnly;
    for (const Decision& d : ran.microbatches) {
      if (d.mode == Mode::kSequenceParallel) mode = Mode::kSequenceParallel;
    }
    drift = std::clamp(drift + 0.04 * (u(rng) - 0.5), 0.0, 0.6);
    const double share = std::clamp(drift + 0.05 * u(rng), 0.0, 1.0);
    v1::StepTelemetry tel;
    tel.set_job_id(kJob);
    tel.set_group(stage);
    tel.set_step(step);
    tel.set_mode(ToProto(mode));
    tel.set_step_time_s(0.2);
    tel.set_rs_wait_s(share * 0.2);
    tel.set_effective_tokens(512);  // within every step plan below (at least 4 x 819 tokens)
    tel.set_ranks(kGroupSize);
    ASSERT_THAT(h.RecordTelemetry(**session, tel), IsOk());
    book.ObserveRsWaitShare(step, mode, share);
  }
  EXPECT_EQ(compared, kSteps);
  for (auto [mode, reason] : {std::pair{v1::SEQUENCE_PARALLEL, v1::GATES_PASSED},
                              std::pair{v1::TENSOR_PARALLEL_ONLY, v1::LENGTH_CV},
                              std::pair{v1::TENSOR_PARALLEL_ONLY, v1::RS_WAIT},
                              std::pair{v1::SEQUENCE_PARALLEL, v1::LENGTHS_UNKNOWN},
                              std::pair{v1::SEQUENCE_PARALLEL, v1::MEMORY_REQUIRES_SP}}) {
    EXPECT_GT((seen[{mode, reason}]), 0) << v1::Mode_Name(mode) << "/" << v1::Reason_Name(reason);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StepPlanEquivalenceTest, ::testing::Values(4, 5, 6, 7));

}  // namespace
}  // namespace spgate::server
