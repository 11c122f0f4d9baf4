// The daemon's live state: the decision and telemetry paths, operator changes. See
// gate_state.h for the invariants and the locks; jobs, groups, sessions, launches and
// housekeeping are in gate_state_sessions.cc, the admin views in gate_state_views.cc.
#include "server/gate_state.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>

#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/config_schedule.h"
#include "policy/group_state.h"
#include "server/gate_state_internal.h"

namespace spgate::server {
namespace {

using gate_state_internal::Active;
using gate_state_internal::AsDirective;
using gate_state_internal::kNoStep;
using gate_state_internal::kPendingSlots;
using gate_state_internal::ModeWindow;
using gate_state_internal::PendingStep;
using gate_state_internal::RollingValue;
using gate_state_internal::Rank;

// What a cached decision must match to answer a plan: its lengths, in order, and its
// memory facts. absl::Hash is seeded per process, so a digest cannot be matched by a
// plan crafted offline; a collision would need a session of the group's leader anyway.
// A step plan's: every micro-batch by id (not by the order sent) and the stage's facts.
uint64_t PlanDigest(const PlanInput& plan, std::span<const size_t> by_id) {
  uint64_t h = absl::HashOf(absl::MakeConstSpan(plan.lengths.data(), plan.lengths.size()),
                            plan.predicted_peak_bytes_sp, plan.predicted_peak_bytes_tp,
                            plan.memory_budget_bytes, plan.resident_bytes);
  for (size_t i : by_id) {
    const MicrobatchPlanInput& m = plan.microbatches[i];
    h = absl::HashOf(h, m.id, absl::MakeConstSpan(m.lengths.data(), m.lengths.size()),
                     m.memory.activation_sp, m.memory.activation_tp, m.memory.workspace_sp,
                     m.memory.workspace_tp);
  }
  return h;
}

}  // namespace

GateState::GateState(StateOptions options, Metrics& metrics, const OperatorSource* store)
    : options_(std::move(options)),
      metrics_(metrics),
      store_(store),
      launches_({.state_dir = options_.state_dir,
                 .restored_hold = options_.restored_launch_hold,
                 .stale_after = options_.stale_after,
                 .clock = options_.clock,
                 .read_only = options_.read_only_state_dir,
                 .on_write_failure = [this](absl::string_view what) { PersistFailed(what); }},
                metrics) {}

GateState::~GateState() = default;

absl::StatusOr<std::unique_ptr<GateState>> GateState::Create(StateOptions options,
                                                             Metrics& metrics,
                                                             const OperatorSource* store) {
  if (!options.clock) options.clock = [] { return absl::Now(); };
  if (options.decision_cache_steps < 1) options.decision_cache_steps = 1;
  std::unique_ptr<GateState> state(new GateState(std::move(options), metrics, store));
  metrics.SetGlobalThresholds(store->GlobalEffective(), store->GlobalVersion());
  MutexLock launch(&state->launches_.mu());
  MutexLock lock(&state->mu_);
  // Everything persisted comes back, past --max_jobs too (the flag lowered since, or
  // jobs the store admitted while others registered): a daemon that refused to start
  // over its own state would only restart until someone edited the files.
  const std::vector<std::string> scoped = store->JobsWithOperatorState();
  for (const std::string& job_id : scoped) {
    RETURN_IF_ERROR(state->FindOrCreateJob(job_id, /*over_max_jobs=*/true).status());
  }
  RETURN_IF_ERROR(state->RestoreLaunches());
  if (const int tracked = static_cast<int>(state->jobs_.size());
      tracked > state->options_.max_jobs) {
    state->LogLine(absl::StrFormat(
        "restored %d jobs, more than --max_jobs=%d: every one is kept, and a new job (a "
        "Register, a job scope of UpdateGateConfig or PinMode) is refused until fewer jobs "
        "than that are tracked (spgatectl jobs forget, or a larger --max_jobs)",
        tracked, state->options_.max_jobs));
  }
  // After the launches: a restored launch gets its tables back.
  const int tables = state->LoadLearned();
  if (!state->options_.state_dir.empty()) {
    const auto launches = std::count_if(state->jobs_.begin(), state->jobs_.end(),
                                        [](const auto& j) { return !j.second->incarnation.empty(); });
    state->restored_ = absl::StrCat("jobs with settings: ", scoped.size(), ", launches: ",
                                    launches, ", learned tables: ", tables);
  }
  return state;
}

std::optional<PinState> GateState::ActivePin(const Job& job, int group, absl::Time now) const {
  auto it = job.op.group_pins.find(group);
  if (it != job.op.group_pins.end() && it->second.expire > now) return it->second;
  if (Active(job.op.pin, now)) return job.op.pin;
  return std::nullopt;
}


void GateState::RefreshJob(Job& job,
                           std::vector<std::pair<std::shared_ptr<SessionSink>, ConfigPush>>* pushes) {
  JobOperatorView view = store_->ViewForJob(job.id);
  const bool changed = view.effective != job.op.effective ||
                       view.effective_version != job.op.effective_version;
  job.op = std::move(view);
  if (!changed) return;
  job.metrics->SetThresholds(job.op.effective, job.op.effective_version);
  for (auto& [gi, g] : job.groups) {
    const GroupGateState& gate = g->policy.gate();
    const int64_t from = gate.has_decision ? gate.last_step + options_.config_lead_steps
                                           : ConfigSchedule::kAlways;
    g->schedule.Schedule(job.op.effective, job.op.effective_version, from);
  }
  for (auto it = job.sinks.begin(); it != job.sinks.end();) {
    std::shared_ptr<SessionSink> sink = it->second.lock();
    if (!sink) {
      job.sinks.erase(it++);
      continue;
    }
    int64_t from = 0;
    if (auto sit = sessions_.find(it->first); sit != sessions_.end()) {
      auto git = job.groups.find(sit->second->group);
      if (git != job.groups.end()) {
        from = std::max<int64_t>(0, git->second->schedule.latest().effective_from_step);
      }
    }
    pushes->emplace_back(std::move(sink), ConfigPush{job.op.served, from});
    ++it;
  }
}

void GateState::OnOperatorChange(const std::string& job_id) {
  std::vector<std::pair<std::shared_ptr<SessionSink>, ConfigPush>> pushes;
  {
    MutexLock lock(&mu_);
    if (job_id.empty()) {
      metrics_.SetGlobalThresholds(store_->GlobalEffective(), store_->GlobalVersion());
      for (auto& [id, job] : jobs_) RefreshJob(*job, &pushes);
    } else if (auto it = jobs_.find(job_id); it != jobs_.end()) {
      RefreshJob(*it->second, &pushes);
    } else if (store_->HasJobScope(job_id)) {
      // Operators may configure a job before it starts: list it from now on. The store
      // admitted the scope under --max_jobs (AdmitJobScope) and wrote it; a Register that
      // took the last place meanwhile does not leave it untracked.
      (void)FindOrCreateJob(job_id, /*over_max_jobs=*/true);
    }
  }
  for (auto& [sink, push] : pushes) sink->PushConfig(push);
}

// ---------------------------------------------------------------------------------------
// Worker API

// Validate -> cache -> policy -> record (docs/design.md §8; the rules they keep: §4). The checks that need no
// state run before the lock, and so does the per-sequence work.
absl::Status GateState::CheckLayout(const Job& job, const RegisterInput& r) const {
  if (job.layout.has_value()) {
    if (!r.layout.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout: job %s's ranks registered the layout %s; this rank sent none (a client "
          "that predates pipelines cannot join a job that has one)",
          job.id, FormatJobLayout(*job.layout)));
    }
    if (std::string diff = JobLayoutMismatch(*job.layout, *r.layout); !diff.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(diff, " (job ", job.id, ")"));
    }
  } else if (r.layout.has_value() && !job.groups.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout: job %s's ranks registered without a layout; this rank sent %s", job.id,
        FormatJobLayout(*r.layout)));
  }
  std::vector<std::string> all = job.sp_required;
  for (const std::string& f : r.sp_required) {
    if (std::find(all.begin(), all.end(), f) == all.end()) all.push_back(f);
  }
  const int features = static_cast<int>(all.size());
  if (features > kMaxSpRequiredFeatures) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sp_required: job %s would have %d features, at most %d", job.id, features,
        kMaxSpRequiredFeatures));
  }
  return absl::OkStatus();
}

absl::Status GateState::CheckStepPlan(const Job& job, const PlanInput& plan) const {
  const PlanShape shape{.batch_lengths = !plan.lengths.empty() ||
                                         plan.predicted_peak_bytes_sp != 0 ||
                                         plan.predicted_peak_bytes_tp != 0,
                        .microbatches = plan.microbatches,
                        .resident_bytes = plan.resident_bytes,
                        .memory_budget_bytes = plan.memory_budget_bytes};
  return CheckPlanShape(job.layout ? &*job.layout : nullptr, shape,
                        {.kind = "job", .id = job.id}, "micro_batches");
}

std::optional<DecisionRecord> GateState::CpPeerDecided(const Job& job, const Group& g,
                                                       int64_t step) const {
  if (!job.layout.has_value() || job.layout->cp <= 1) return std::nullopt;
  const int cp = job.layout->cp;
  const int first = g.index - g.index % cp;
  for (int peer = first; peer < first + cp; ++peer) {
    if (peer == g.index) continue;
    auto it = job.groups.find(peer);
    if (it == job.groups.end()) continue;
    if (std::optional<DecisionRecord> d = it->second->Answer(job.id, step, true)) return d;
  }
  return std::nullopt;
}

absl::StatusOr<DecisionRecord> GateState::Decide(const Session& session, const PlanInput& plan) {
  RETURN_IF_ERROR(CheckPlan(session, plan));
  const bool step_plan = !plan.microbatches.empty();
  // One plan shape from here on: a plain plan is the one micro-batch of a job without a
  // layout (docs/design.md §12), its facts its lengths' statistics.
  // Inline for a plain plan's one: the decide path allocates nothing for it.
  absl::InlinedVector<MicrobatchFacts, 1> facts;
  std::vector<size_t> by_id(plan.microbatches.size());
  if (step_plan) {
    for (size_t i = 0; i < by_id.size(); ++i) by_id[i] = i;
    std::sort(by_id.begin(), by_id.end(), [&](size_t a, size_t b) {
      return plan.microbatches[a].id < plan.microbatches[b].id;
    });
    // Summarised outside the lock, in id order (the ids are checked against the job's
    // layout under it).
    for (size_t i : by_id) {
      ASSIGN_OR_RETURN(facts.emplace_back(),
                       SummarizeMicrobatch(plan.microbatches[i], "micro_batches"));
    }
  } else if (!plan.lengths.empty()) {
    ASSIGN_OR_RETURN(const LengthStats stats, ComputeLengthStats(plan.lengths));
    facts.push_back({.length_cv = stats.cv, .tokens = stats.tokens});
  }
  const uint64_t digest = PlanDigest(plan, by_id);
  DecisionRecord decision;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, JobOfSession(session));
    ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(*job, plan.group));
    const absl::Time now = Now();  // the decision's time, read once
    if (std::optional<DecisionRecord> cached =
            g->Answer(job->id, plan.step, job->layout.has_value())) {
      // A retry gets the same answer, but only for the plan it was made for: a decision
      // made for other memory facts says nothing about whether this plan fits.
      if (cached->plan_digest == digest) return *std::move(cached);
      metrics_.refused_plan_mismatch.Increment();
      return absl::AlreadyExistsError(absl::StrFormat(
          "step: %d of group %d was decided for a different plan (its lengths or memory "
          "facts differ); a decided step is final, decide this one locally",
          plan.step, plan.group));
    }
    RETURN_IF_ERROR(CheckStepPlan(*job, plan));
    if (!step_plan && plan.lengths.empty()) {
      // A plain plan needs lengths (an empty one got this far only so that a job with a
      // layout names what its plans carry instead).
      return ComputeLengthStats(plan.lengths).status();
    }
    RETURN_IF_ERROR(CheckStepWindow(*g, plan, now));
    // The CP ranks' groups of one (replica, stage) run one decision: a peer's, if one
    // decided this step, for the same plan only (docs/design.md §12).
    std::optional<DecisionRecord> peer_answer;
    if (step_plan) peer_answer = CpPeerDecided(*job, *g, plan.step);
    if (peer_answer.has_value() && peer_answer->plan_digest != digest) {
      metrics_.refused_plan_mismatch.Increment();
      return absl::AlreadyExistsError(absl::StrFormat(
          "step: %d was decided for CP peer group %d of group %d with a different plan; "
          "the CP ranks of a stage send the same micro-batches and memory facts",
          plan.step, peer_answer->group, plan.group));
    }
    decision = DecideStep(*job, *g, plan, facts, digest,
                          peer_answer.has_value() ? &*peer_answer : nullptr, now);
    if (auto rit = g->ranks.find(session.rank_in_group); rit != g->ranks.end()) {
      rit->second.last_seen = now;  // a unary-only leader holds its launch too
    }
  }
  NotifyWatchers(decision);
  return decision;
}

absl::Status GateState::CheckSequences(size_t sequences) const {
  if (static_cast<int64_t>(sequences) <= options_.max_sequences_per_plan) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "lengths: %d sequences in one plan, more than %d (--max_sequences_per_plan)", sequences,
      options_.max_sequences_per_plan));
}

absl::Status GateState::CheckPlan(const Session& session, const PlanInput& plan) {
  if (plan.job_id != session.job_id || plan.group != session.group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan: job_id/group (%s, %d) do not match the session's (%s, %d)", plan.job_id,
        plan.group, session.job_id, session.group));
  }
  if (session.rank_in_group != 0) {
    metrics_.refused_not_leader.Increment();
    return absl::PermissionDeniedError(absl::StrFormat(
        "plan: only group %d's leader (rank 0) sends plans; this session is rank %d",
        session.group, session.rank_in_group));
  }
  if (plan.step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("step: must be >= 0, got %d", plan.step));
  }
  if (plan.microbatches.size() > static_cast<size_t>(kMaxMicrobatches)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "micro_batches: more than %d in one plan", kMaxMicrobatches));
  }
  size_t sequences = plan.lengths.size();
  for (const MicrobatchPlanInput& m : plan.microbatches) sequences += m.lengths.size();
  if (absl::Status s = CheckSequences(sequences); !s.ok()) {
    CountLimit(Limit::kSequencesPerPlan);
    return s;
  }
  MutexLock limiter(&session.limiter_mu);
  if (!session.plan_tokens.TryTake(Now())) {
    CountLimit(Limit::kPlanRate);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "plan: this session sends more than %g plans a second "
        "(--max_plans_per_second); decide this step locally",
        options_.max_plans_per_second));
  }
  return absl::OkStatus();
}

absl::Status GateState::CheckStepWindow(const Group& g, const PlanInput& plan, absl::Time now) {
  const GroupGateState& gate = g.policy.gate();
  if (!gate.has_decision) return absl::OkStatus();
  if (plan.step <= gate.last_step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step: %d is not after group %d's last decided step %d and is no longer cached; "
        "steps must increase",
        plan.step, plan.group, gate.last_step));
  }
  // A group resumes further ahead only as its leader (re)attaches or after a silence
  // (it ran on its fallback meanwhile); otherwise one plan far ahead would make every
  // real plan before it "not after the last decided step" (docs/design.md §10).
  const bool resuming = g.resume_allowed || now - g.last_plan_time >= options_.stale_after;
  if (plan.step - gate.last_step > options_.max_plan_lead_steps && !resuming) {
    metrics_.refused_step_too_far.Increment();
    return absl::InvalidArgumentError(absl::StrFormat(
        "step: %d is more than %d steps after group %d's last decided step %d "
        "(--max_plan_lead_steps); nothing was decided",
        plan.step, options_.max_plan_lead_steps, plan.group, gate.last_step));
  }
  return absl::OkStatus();
}

void GateState::RecordStep(Job& job, Group& g, const DecisionRecord& decision, absl::Time now) {
  // `now`, not decision.time: a CP peer's answer carries the peer's decision time.
  g.schedule.Prune(decision.step);
  g.cache.push_back(gate_state_internal::CachedDecision::Of(decision));
  if (static_cast<int64_t>(g.cache.size()) > options_.decision_cache_steps) g.cache.pop_front();
  if (!decision.microbatches.empty()) {
    g.step_plans.push_back(gate_state_internal::CachedStepPlan::Of(decision));
    g.step_plan_bytes += g.step_plans.back().bytes();
    while (!g.step_plans.empty() &&
           (g.step_plans.front().step < g.cache.front().step ||
            (g.step_plans.size() > 2 &&
             g.step_plan_bytes > gate_state_internal::kMaxStepPlanCacheBytes))) {
      g.step_plan_bytes -= g.step_plans.front().bytes();
      g.step_plans.pop_front();
    }
  }
  g.last_activity = job.last_activity = g.last_plan_time = now;
  g.resume_allowed = false;
}

// The policy's answer for one step, the one place the layouts differ: a plain plan's
// one decision by the group's gates over the whole step (pin and memory first,
// docs/design.md §3), with the gain ledger's entry; a step plan's per micro-batch
// (DecideStagePlan: the stage's schedule-aware memory gate over the policy's modes, §12),
// from the stage's learned table.
StagePlanOutcome GateState::PolicyStep(Job& job, Group& g, const GateConfig& config,
                                       const PlanInput& plan,
                                       std::span<const MicrobatchFacts> facts,
                                       const std::optional<PinState>& pin,
                                       std::optional<double>* adaptive_gain) {
  // Tables adopted from the job's previous launch: at the step this launch counts from.
  if (job.learned_restamp) RestampLearnedAt(job, config, plan.step);
  if (job.layout.has_value()) {
    const int stage = CoordinatesOf(*job.layout, g.index).stage;
    const StagePlanFacts stage_facts{.step = plan.step,
                                     .stage = stage,
                                     .resident_bytes = plan.resident_bytes,
                                     .memory_budget_bytes = plan.memory_budget_bytes,
                                     .microbatches = facts};
    // ADAPTIVE reads the stage's table, learned from each micro-batch's compute on the
    // stage (a step's time mixes the modes of its micro-batches, so it is not learned
    // from). With cp > 1 the decision is the plan's alone, as the CP groups' fallbacks
    // make it without talking (docs/design.md §12).
    return DecideStagePlan(g.policy, config, *job.layout, stage_facts, AsDirective(pin),
                           &job.stage_learned[static_cast<size_t>(stage)],
                           !job.sp_required.empty(), {.plan_only = job.layout->cp > 1});
  }
  const MicrobatchFacts& f = facts.front();
  const BatchFacts batch{.step = plan.step,
                         .length_cv = f.length_cv,
                         .tokens = f.tokens,
                         .predicted_peak_bytes_sp = plan.predicted_peak_bytes_sp,
                         .predicted_peak_bytes_tp = plan.predicted_peak_bytes_tp,
                         .memory_budget_bytes = plan.memory_budget_bytes};
  // A feature of the job that needs SP throughout outranks a pin (docs/design.md §12).
  const GateOutcome outcome = g.policy.Decide(
      config, batch, JobDirective(!job.sp_required.empty(), AsDirective(pin)), &job.learned);
  if (job.gain.Add(config, job.learned, outcome, plan.step, f.tokens)) {
    *adaptive_gain = job.gain.ratio();
  }
  return StagePlanOutcome{
      .decisions = {outcome.decision},
      .bands = {static_cast<int8_t>(outcome.band >= 0 ? outcome.band  // ADAPTIVE computed it
                                                      : BandOf(config, f.length_cv, f.tokens))},
      .explored = outcome.explored ? 1 : 0,
      .flips_held = outcome.flip_held ? 1 : 0};
}

// One decide path for every layout: the policy's answer (PolicyStep, or a CP peer's), the
// record (a plain plan's carries its one decision as the step's mode, without a micro-batch
// list, as the wire has always had it), the cache, and the counts and metrics per decision.
DecisionRecord GateState::DecideStep(Job& job, Group& g, const PlanInput& plan,
                                     std::span<const MicrobatchFacts> facts,
                                     uint64_t plan_digest, const DecisionRecord* peer,
                                     absl::Time now) {
  const ScheduledConfig& config = g.schedule.At(plan.step);
  KeepBandsOf(job, config.config);
  const bool staged = job.layout.has_value();
  std::optional<Mode> previous;
  if (g.policy.gate().has_decision) previous = g.policy.gate().mode;
  DecisionRecord decision;
  std::vector<Decision> plain;  // a plain plan's one decision (the record lists none)
  int explored = 0, flips_held = 0;
  std::optional<double> adaptive_gain;
  if (peer != nullptr) {
    // A CP peer's answer: this group runs it and its state advances as if it had decided.
    decision = *peer;
    decision.group = g.index;
    explored = decision.explored;
    flips_held = decision.flips_held;
    for (const Decision& d : decision.microbatches) g.policy.Adopt(plan.step, d, config.config);
  } else {
    const std::optional<double> rs_mean = RollingValue(g.policy.rs_wait());
    // With cp > 1 a stage's CP groups run one decision, so one pin: the unit's first
    // group's (cp_rank 0), whichever peer asks first (docs/design.md §12).
    const int cp = staged ? job.layout->cp : 1;
    const std::optional<PinState> pin = ActivePin(job, plan.group - plan.group % cp, now);
    StagePlanOutcome out = PolicyStep(job, g, config.config, plan, facts, pin, &adaptive_gain);
    explored = out.explored;
    flips_held = out.flips_held;
    const bool pinned = std::any_of(out.decisions.begin(), out.decisions.end(),
                                    [](const Decision& d) { return d.reason == Reason::kPinned; });
    decision = DecisionRecord{
        .job_id = job.id,
        .group = plan.group,
        .step = plan.step,
        .mode = out.decisions.front().mode,
        .reason = out.decisions.front().reason,
        .config_version = config.version,
        .length_cv = facts.front().length_cv,
        .rolling_rs_wait_share = rs_mean,
        .time = now,
        .pin_expire = pinned ? std::optional<absl::Time>(pin->expire) : std::nullopt,
        .pin_forced = pinned && pin->force,
        .explored = explored,
        .flips_held = flips_held,
        .band = staged ? -1 : out.bands.front(),
        .plan_digest = plan_digest,
        .stage_peak_bytes = out.peak_bytes};
    if (staged) {
      decision.microbatches = std::move(out.decisions);
      decision.microbatch_bands = std::move(out.bands);
    } else {
      plain = std::move(out.decisions);
    }
  }
  // The bounds on the step's telemetry, from this group's plan (a CP peer's is the same).
  decision.plan_tokens = 0;
  decision.microbatch_tokens.clear();
  for (const MicrobatchFacts& f : facts) {
    if (staged) decision.microbatch_tokens.push_back(f.lengths_known ? f.tokens : -1);
    decision.plan_tokens = f.lengths_known && decision.plan_tokens >= 0
                               ? decision.plan_tokens + f.tokens
                               : -1;
  }
  RecordStep(job, g, decision, now);
  ++job.group_steps_decided;
  const std::vector<Decision>& decisions = staged ? decision.microbatches : plain;
  if (staged) {
    g.stage_peak = decision.stage_peak_bytes;
    g.last_tp_microbatches = static_cast<int>(
        std::count_if(decisions.begin(), decisions.end(),
                      [](const Decision& d) { return d.mode == Mode::kTensorParallelOnly; }));
  }
  for (size_t i = 0; i < decisions.size(); ++i) {
    const Decision& d = decisions[i];
    ++job.decisions[static_cast<int>(d.mode)][static_cast<int>(d.reason)];
    DecisionSample sample{.mode = d.mode, .reason = d.reason, .length_cv = facts[i].length_cv,
                          .previous_mode = previous};
    if (i == 0) {
      sample.adaptive_gain = adaptive_gain;
      if (plan.memory_budget_bytes > 0 && plan.memory_budget_bytes != job.memory_budget) {
        job.memory_budget = plan.memory_budget_bytes;
        sample.memory_budget = job.memory_budget;
      }
    }
    job.metrics->RecordDecision(sample, *g.metrics);
    previous = d.mode;
  }
  job.exploration_steps += explored;
  // Counters only when there is something to count (most steps): each is an atomic update.
  if (explored > 0) job.metrics->exploration_steps->Increment(explored);
  if (flips_held > 0) job.metrics->flips_held->Increment(flips_held);
  return decision;
}

void GateState::NotifyWatchers(const DecisionRecord& decision) {
  if (watcher_count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(&watch_mu_);
  for (const auto& w : watchers_) {
    if (w->job_filter().empty() || w->job_filter() == decision.job_id) w->OnDecision(decision);
  }
}

absl::Status GateState::CheckTelemetry(const Session& session, const TelemetryRecord& t) {
  if (t.job_id != session.job_id || t.group != session.group ||
      t.rank_in_group != session.rank_in_group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry: (job_id=%s, group=%d, rank_in_group=%d) does not match the session's "
        "(%s, %d, %d)",
        t.job_id, t.group, t.rank_in_group, session.job_id, session.group,
        session.rank_in_group));
  }
  // The plan's bounds and the layout's ids are checked under the lock.
  RETURN_IF_ERROR(ValidateStepTelemetry(t.values));
  RETURN_IF_ERROR(ValidateMicrobatchTelemetry(t.microbatches, 0));
  if (t.ranks > 1 && !session.group_session) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry: a group record (ranks=%d) comes only from a group session "
        "(RegisterRequest.group_session)",
        t.ranks));
  }
  if (t.ranks > 1 && session.rank_in_group != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry: a group record (ranks=%d) comes only from the group's leader, not "
        "rank_in_group %d",
        t.ranks, session.rank_in_group));
  }
  return absl::OkStatus();
}

absl::Status GateState::CheckTelemetryOfStep(const Job& job, const Group& g,
                                             const Session& session,
                                             const TelemetryRecord& t) const {
  RETURN_IF_ERROR(ValidateGroupRecord(t.ranks, t.slowest_rank, t.peak_memory_rank, g.size));
  if (t.ranks <= 1 && session.group_session && g.size > 1) {
    // One rank's record from a group session would stand for one rank of many: the
    // step would wait for ranks that never report.
    return absl::InvalidArgumentError(
        "telemetry: a group session sends the group's records (ranks = the group's size, "
        "reduced in the group)");
  }
  if (!t.microbatches.empty() && !job.layout.has_value()) {
    return absl::InvalidArgumentError(
        "telemetry.micro_batches: only a job with a layout (step plans) reports "
        "micro-batches; a plain plan's step is learned from step_time_s");
  }
  // What the step's plan held, while its decision is cached (docs/design.md §2).
  TelemetryBounds bounds;
  if (const gate_state_internal::CachedDecision* d = g.Cached(t.values.step)) {
    bounds.plan_tokens = d->plan_tokens;
  }
  if (const gate_state_internal::CachedStepPlan* p = g.CachedPlan(t.values.step)) {
    bounds.microbatch_tokens = p->tokens;
  }
  RETURN_IF_ERROR(ValidateStepTelemetry(t.values, bounds));
  // A stage's micro-batches, one per id of the job's layout: what its ADAPTIVE learns.
  return t.microbatches.empty()
             ? absl::OkStatus()
             : ValidateMicrobatchTelemetry(t.microbatches, job.layout->microbatches, bounds);
}

absl::Status GateState::RecordTelemetry(Session& session, const TelemetryRecord& t) {
  auto reject = [&](absl::Status s) {
    metrics_.telemetry_rejected.Increment();
    return s;
  };
  if (absl::Status s = CheckTelemetry(session, t); !s.ok()) return reject(std::move(s));
  {
    MutexLock limiter(&session.limiter_mu);
    if (!session.telemetry_tokens.TryTake(Now())) {
      CountLimit(Limit::kTelemetryRate);
      return reject(absl::ResourceExhaustedError(absl::StrFormat(
          "telemetry: this session sends more than %g records a second "
          "(--max_telemetry_per_second)",
          options_.max_telemetry_per_second)));
    }
  }

  std::vector<LearnedPush> learned_pushes;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<Job*> found = JobOfSession(session);
    if (!found.ok()) return reject(found.status());
    Job& job = **found;
    const StepTelemetryValues& v = t.values;
    // Only steps the group has decided: a record for a step it has not reached would be
    // learned from (and could force RS_WAIT on steps that have not run).
    auto git = job.groups.find(session.group);
    const GroupGateState* gate = git == job.groups.end() ? nullptr : &git->second->policy.gate();
    // Acknowledged from here on, taken or not: it did reach the daemon, so "sent minus
    // acknowledged" stays the count lost in transit (after a daemon restart the ranks'
    // buffered records for steps before its first decision land here, and the clients'
    // Flush waits for acknowledgements).
    session.telemetry_received.fetch_add(1, std::memory_order_relaxed);
    if (gate == nullptr || !gate->has_decision || v.step > gate->last_step) {
      metrics_.refused_undecided_step.Increment();
      return reject(absl::InvalidArgumentError(
          gate == nullptr || !gate->has_decision
              ? absl::StrFormat("telemetry: step %d of group %d: the group has no decided step "
                                "yet; only decided steps are reported",
                                v.step, session.group)
              : absl::StrFormat("telemetry: step %d of group %d is after its last decided step "
                                "%d; only decided steps are reported",
                                v.step, session.group, gate->last_step)));
    }
    Group& g = *git->second;
    // Refused here, nothing changed: the learned table never sees the record.
    if (absl::Status s = CheckTelemetryOfStep(job, g, session, t); !s.ok()) {
      return reject(std::move(s));
    }
    metrics_.telemetry_received.Increment();
    const absl::Time now = Now();  // read once for the fold, the learning and the pushes
    FoldTelemetry(job, g, session, t, now);
    CollectLearnedPushes(job, /*force=*/false, nullptr, &learned_pushes, now);
  }
  // Outside the lock: a sink only queues the message.
  for (const LearnedPush& push : learned_pushes) push.sink->PushLearned(*push.table);
  return absl::OkStatus();
}

void GateState::FoldTelemetry(Job& job, Group& g, const Session& session,
                              const TelemetryRecord& t, absl::Time now) {
  const StepTelemetryValues& v = t.values;
  const bool group_record = t.ranks > 1;
  auto rit = g.ranks.find(session.rank_in_group);
  if (rit != g.ranks.end()) {
    rit->second.last_seen = now;
    // A rank's records arrive in step order on its one stream: one for a step it has
    // already reported is a duplicate, acknowledged and counted once.
    if (v.step <= rit->second.last_telemetry_step) return;
    rit->second.last_telemetry_step = v.step;
  }

  const int slot = static_cast<int>(v.step % kPendingSlots);
  PendingStep& p = g.pending[slot];
  if (p.step != v.step) {
    if (p.step > v.step) return;  // older than the aggregation window
    if (p.step != kNoStep && !p.finalized) FinalizeStep(job, g, slot, now);
    // Made afresh in place: a move-assigned PendingStep{} moves its InlinedVector, which
    // GCC 12 reports as a read of uninitialised storage (-Wmaybe-uninitialized).
    static_assert(std::is_nothrow_default_constructible_v<PendingStep>,
                  "a throw between destroy_at and construct_at would leave no object");
    std::destroy_at(&p);
    std::construct_at(&p);
    p.step = v.step;
  } else if (p.finalized) {
    return;  // every rank already reported; a duplicate
  }
  // A group record is every rank's at once (each value already the largest of its ranks).
  p.reported += group_record ? g.size : 1;
  p.mode = static_cast<Mode>(v.mode);
  p.fallback = p.fallback || t.fallback;
  // The slowest rank: the one with the most time outside its collective waits, whom the
  // others waited for (BusySeconds); a group record names its own.
  const double busy = BusySeconds(v.step_time_s, v.rs_wait_s, v.all_gather_s, v.norm_stall_s,
                                  v.all_reduce_s);
  if (group_record) p.straggler = v.straggler_s;
  if (!group_record) p.busy.push_back(busy);  // the delay's (StragglerSeconds)
  p.all_reduce = std::max(p.all_reduce, v.all_reduce_s);
  if (p.slowest_rank < 0 || busy > p.slowest_busy) {
    p.slowest_rank = group_record ? t.slowest_rank : session.rank_in_group;
    p.slowest_busy = busy;
  }
  if (p.peak_rank < 0 || t.peak_memory_bytes > p.peak) {
    p.peak_rank = group_record ? t.peak_memory_rank : session.rank_in_group;
  }
  p.step_time = std::max(p.step_time, v.step_time_s);
  p.rs_share = std::max(p.rs_share, std::min(1.0, v.rs_wait_s / v.step_time_s));
  p.all_gather = std::max(p.all_gather, v.all_gather_s);
  p.norm_share = std::max(p.norm_share, std::min(1.0, v.norm_stall_s / v.step_time_s));
  p.tokens = std::max(p.tokens, v.effective_tokens);
  p.padding = std::max(p.padding, v.padding_tokens);
  p.peak = std::max(p.peak, t.peak_memory_bytes);
  if (!t.microbatches.empty()) {
    p.FoldMicrobatches(t.microbatches, group_record, static_cast<size_t>(g.size));
  }
  if (p.reported >= g.size) FinalizeStep(job, g, slot, now);
}

void GateState::FinalizeStep(Job& job, Group& g, int slot, absl::Time now) {
  PendingStep& p = g.pending[slot];
  p.finalized = true;
  const int m = static_cast<int>(p.mode);
  if (p.step >= g.slowest_step) {  // a step finalized late does not overwrite a newer one
    g.slowest_step = p.step;
    g.slowest_rank = p.slowest_rank;
    g.slowest_step_time = p.step_time;
    g.peak_rank = p.peak_rank;
    g.metrics->slowest_rank->Set(p.slowest_rank);
  }
  if (p.mode == Mode::kSequenceParallel) {
    const int64_t window = g.schedule.At(p.step).config.window_steps;
    g.policy.ObserveRsWaitShare(p.step, p.mode, p.rs_share, window);
    g.all_gather.Resize(window);
    g.norm_stall.Resize(window);
    g.all_gather.Push(p.all_gather);
    g.norm_stall.Push(p.norm_share);
    // A record the window refused (the step before a trip, arriving after it) leaves the
    // gauge at the value that tripped the gate, not at an empty window's 0.
    if (const std::optional<double> rs = RollingValue(g.policy.rs_wait())) {
      g.metrics->rs_wait_share->Set(*rs);
    }
    g.metrics->all_gather_tail->Set(g.all_gather.Quantile(0.95));
    g.metrics->norm_stall_ratio->Set(g.norm_stall.Mean());
  }
  // The MODES windows (docs/design.md §12) count micro-batches by the mode each ran: a
  // step plan's from its micro-batch records (its record's mode is SP when any ran SP, so
  // its step time cannot be split between the modes), a plain plan's step as its one
  // micro-batch; a step plan's step sent without micro-batch records is left out. Before
  // LearnFromStep, which lets go of the records.
  ModeWindow& stepw = job.modes[m];
  ++stepw.group_steps;
  stepw.step_seconds += p.step_time;
  const auto peak = static_cast<double>(p.peak);
  bool ran[kModeSlots] = {};
  if (!p.microbatches.empty()) {
    size_t last[kModeSlots] = {};
    for (size_t i = 0; i < p.microbatches.size(); ++i) {
      last[static_cast<int>(p.microbatches[i].mode)] = i;
    }
    for (size_t i = 0; i < p.microbatches.size(); ++i) {
      const MicrobatchTelemetryValues& mb = p.microbatches[i];
      const int mode = static_cast<int>(mb.mode);
      job.modes[mode].Push(mb.compute_s(), static_cast<double>(mb.effective_tokens),
                           last[mode] == i, peak);
      ran[mode] = true;
    }
  } else if (!job.layout.has_value()) {
    stepw.Push(p.step_time, static_cast<double>(p.tokens), /*step_end=*/true, peak);
    ran[m] = true;
  }
  for (int mode = 1; mode < kModeSlots; ++mode) {
    if (ran[mode]) job.metrics->peak_memory[mode]->Set(job.modes[mode].peak.Max());
  }
  LearnFromStep(job, g, slot, now);
  job.metrics->step_duration[m]->Observe(p.step_time);
  job.metrics->effective_tokens[m]->Increment(static_cast<double>(p.tokens));
  job.metrics->padding_tokens[m]->Increment(static_cast<double>(p.padding));
}

void GateState::AddWatcher(std::shared_ptr<DecisionWatcher> watcher) {
  MutexLock lock(&watch_mu_);
  watchers_.push_back(std::move(watcher));
  watcher_count_.store(static_cast<int>(watchers_.size()));
}

void GateState::RemoveWatcher(const DecisionWatcher* watcher) {
  MutexLock lock(&watch_mu_);
  watchers_.erase(std::remove_if(watchers_.begin(), watchers_.end(),
                                 [&](const auto& w) { return w.get() == watcher; }),
                  watchers_.end());
  watcher_count_.store(static_cast<int>(watchers_.size()));
}

}  // namespace spgate::server
