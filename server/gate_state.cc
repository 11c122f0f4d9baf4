// The daemon's live state: the worker path, sessions and launches, operator changes,
// housekeeping. See gate_state.h for the invariants; the admin views are in
// gate_state_views.cc.
#include "server/gate_state.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/config_schedule.h"
#include "policy/group_state.h"
#include "server/gate_state_internal.h"
#include "server/identity.h"
#include "server/operator_store.h"

namespace spgate::server {
namespace {

using gate_state_internal::Active;
using gate_state_internal::AsDirective;
using gate_state_internal::kNoStep;
using gate_state_internal::kPendingSlots;
using gate_state_internal::ModeWindow;
using gate_state_internal::PendingStep;
using gate_state_internal::Rank;

constexpr size_t kRetiredIncarnationsKept = 16;

// A token longer than any NewSessionId makes is refused before a lookup (and before an
// error message would echo it).
absl::Status CheckSessionIdLength(const std::string& session_id) {
  if (session_id.size() <= kMaxSessionIdLength) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "session_id: at most %d characters, got %d; not a session token", kMaxSessionIdLength,
      session_id.size()));
}

// a + b for counts that are never negative, at INT64_MAX instead of past it.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max()
                                                     : a + b;
}

}  // namespace

GateState::GateState(StateOptions options, Metrics& metrics, const OperatorStore* store)
    : options_(std::move(options)), metrics_(metrics), store_(store) {}

GateState::~GateState() = default;

absl::StatusOr<std::unique_ptr<GateState>> GateState::Create(StateOptions options,
                                                             Metrics& metrics,
                                                             const OperatorStore* store) {
  if (!options.clock) options.clock = [] { return absl::Now(); };
  if (options.decision_cache_steps < 1) options.decision_cache_steps = 1;
  std::unique_ptr<GateState> state(new GateState(std::move(options), metrics, store));
  metrics.SetGlobalThresholds(store->GlobalEffective(), store->GlobalVersion());
  MutexLock lock(&state->mu_);
  for (const std::string& job_id : store->JobsWithOperatorState()) {
    RETURN_IF_ERROR(state->FindOrCreateJob(job_id).status());
  }
  return state;
}

absl::StatusOr<GateState::Job*> GateState::FindOrCreateJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) return it->second.get();
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
    CountLimit(Limit::kJobs);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job %s: the daemon already tracks %d jobs (--max_jobs)", job_id, options_.max_jobs));
  }
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->op = store_->ViewForJob(job_id);
  job->last_activity = Now();
  job->metrics = std::make_unique<JobMetrics>(metrics_, job_id);
  job->metrics->SetThresholds(job->op.effective, job->op.effective_version);
  Job* raw = job.get();
  jobs_.emplace(job_id, std::move(job));
  return raw;
}

absl::StatusOr<GateState::Group*> GateState::FindOrCreateGroup(Job& job, int group) {
  auto it = job.groups.find(group);
  if (it != job.groups.end()) return it->second.get();
  if (group < 0 || group >= options_.max_groups_per_job) {
    if (group >= options_.max_groups_per_job) CountLimit(Limit::kGroupsPerJob);
    return absl::InvalidArgumentError(absl::StrFormat(
        "group: must be in [0, %d), got %d", options_.max_groups_per_job, group));
  }
  auto g = std::make_unique<Group>();
  g->index = group;
  g->schedule = ConfigSchedule(job.op.effective, job.op.effective_version);
  g->all_gather.Resize(job.op.effective.window_steps);
  g->norm_stall.Resize(job.op.effective.window_steps);
  g->last_activity = Now();
  g->metrics = std::make_unique<GroupMetrics>(metrics_, job.id, group);
  Group* raw = g.get();
  job.groups.emplace(group, std::move(g));
  return raw;
}

absl::StatusOr<const GateState::Job*> GateState::FindJob(const std::string& job_id,
                                                         std::optional<int> group) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  if (group.has_value() && !it->second->groups.contains(*group)) {
    return absl::NotFoundError(absl::StrFormat("group: job %s has no group %d", job_id, *group));
  }
  return it->second.get();
}

absl::StatusOr<GateState::Job*> GateState::JobOfSession(const Session& session) {
  auto it = jobs_.find(session.job_id);
  // No live launch: the job's live state was forgotten (ForgetJob, or idle), though its
  // operator settings keep it listed.
  if (it == jobs_.end() || it->second->incarnation.empty()) {
    metrics_.refused_unknown_session.Increment();
    return absl::NotFoundError(
        absl::StrCat("job ", session.job_id, " was forgotten; register again"));
  }
  if (it->second->incarnation != session.incarnation) {
    metrics_.refused_stale_incarnation.Increment();
    return absl::FailedPreconditionError(absl::StrFormat(
        "incarnation: this session belongs to launch \"%s\" of job %s, which launch \"%s\" "
        "replaced",
        session.incarnation, session.job_id, it->second->incarnation));
  }
  return it->second.get();
}

int GateState::OpenStreams(const Job& job) const {
  int open = 0;
  for (const auto& [id, group] : job.groups) {
    for (const auto& [rank_in_group, rank] : group->ranks) open += rank.streams;
  }
  return open;
}

void GateState::StartIncarnation(Job& job, const std::string& incarnation) {
  if (!job.incarnation.empty() && !incarnation.empty()) {
    job.retired.push_back(job.incarnation);
    if (job.retired.size() > kRetiredIncarnationsKept) job.retired.pop_front();
  }
  job.incarnation = incarnation;
  // Live state of the old launch: its groups (decisions, caches, windows, ranks), its
  // per-mode windows and counts, and its streams. Operator settings (job.op) stay; the
  // Prometheus counters keep counting (they are monotonic per job).
  job.groups.clear();
  for (ModeWindow& w : job.modes) w = ModeWindow{};
  for (auto& row : job.decisions) std::fill(std::begin(row), std::end(row), 0);
  job.local_decisions = 0;
  job.sinks.clear();
  ClearLearned(job);
  // Their later calls find no session or a stale one.
  EraseSessions([&](const Session& s) { return s.job_id == job.id && s.incarnation != incarnation; });
}

template <typename Pred>
int GateState::EraseSessions(Pred drop) {
  int erased = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!drop(*it->second)) {
      ++it;
      continue;
    }
    if (auto jit = jobs_.find(it->second->job_id); jit != jobs_.end()) {
      --jit->second->sessions;
    }
    sessions_.erase(it++);
    ++erased;
  }
  return erased;
}

absl::StatusOr<std::shared_ptr<Session>> GateState::FindSession(const std::string& session_id) {
  if (session_id.empty()) {
    return absl::UnauthenticatedError(
        "session_id: required; Register first and send the session it returns");
  }
  RETURN_IF_ERROR(CheckSessionIdLength(session_id));
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    metrics_.refused_unknown_session.Increment();
    return absl::NotFoundError("session_id: unknown session (register again)");
  }
  RETURN_IF_ERROR(JobOfSession(*it->second).status());
  return it->second;
}

absl::Status GateState::CheckJob(const std::string& job_id, std::optional<int> group) const {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  ReaderMutexLock lock(&mu_);
  return FindJob(job_id, group).status();
}

std::optional<PinState> GateState::ActivePin(const Job& job, int group) const {
  const absl::Time now = Now();
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
      // Operators may configure a job before it starts: list it from now on. When the
      // daemon tracks too many jobs already, the settings still apply once it registers.
      (void)FindOrCreateJob(job_id);
    }
  }
  for (auto& [sink, push] : pushes) sink->PushConfig(push);
}

// ---------------------------------------------------------------------------------------
// Worker API

absl::StatusOr<RegisterResult> GateState::Register(const RegisterInput& r) {
  if (draining()) return absl::UnavailableError("spgated is shutting down");
  RETURN_IF_ERROR(ValidateJobId(r.job_id));
  RETURN_IF_ERROR(ValidateIncarnation(r.incarnation));
  if (r.group_size < 1 || r.group_size > options_.max_group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size: must be in [1, %d], got %d", options_.max_group_size, r.group_size));
  }
  if (r.rank_in_group < 0 || r.rank_in_group >= r.group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank_in_group: must be in [0, group_size=%d), got %d", r.group_size, r.rank_in_group));
  }
  if (r.global_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("global_rank: must be >= 0, got %d", r.global_rank));
  }
  if (r.host.size() > kMaxHostLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host: at most %d characters, got %d", kMaxHostLength, r.host.size()));
  }
  auto session = std::make_shared<Session>();
  ASSIGN_OR_RETURN(session->id, NewSessionId());
  session->job_id = r.job_id;
  session->incarnation = r.incarnation;
  session->group = r.group;
  session->rank_in_group = r.rank_in_group;

  absl::Time now = Now();
  {
    MutexLock limiter(&session->limiter_mu);
    session->plan_tokens =
        TokenBucket(options_.max_plans_per_second, 2 * options_.max_plans_per_second, now);
    session->telemetry_tokens = TokenBucket(options_.max_telemetry_per_second,
                                            2 * options_.max_telemetry_per_second, now);
  }

  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(r.job_id));
  if (job->incarnation != r.incarnation) {
    if (std::find(job->retired.begin(), job->retired.end(), r.incarnation) != job->retired.end()) {
      metrics_.refused_stale_incarnation.Increment();
      return absl::FailedPreconditionError(absl::StrFormat(
          "incarnation: launch \"%s\" of job %s was replaced by launch \"%s\"; a rank of "
          "the old launch cannot rejoin",
          r.incarnation, r.job_id, job->incarnation));
    }
    // One launch at a time: a second launch under the same job id while the first still
    // holds streams is either a mistake or someone taking the job over, and the running
    // launch keeps it. A launch that ended (its processes exited, so its streams closed)
    // hands over at once; the new launch's ranks retry until then (docs/design.md §10).
    if (const int live = OpenStreams(*job); live > 0) {
      metrics_.refused_live_incarnation.Increment();
      return absl::FailedPreconditionError(absl::StrFormat(
          "incarnation: job %s is running as launch \"%s\" (%d open streams); launch \"%s\" "
          "is accepted once they have closed",
          r.job_id, job->incarnation, live, r.incarnation));
    }
    StartIncarnation(*job, r.incarnation);
  }
  // A rank that registers again replaces its own session, so re-registering never grows
  // the job's sessions; a new rank needs room under --max_sessions_per_job.
  std::string replaced;
  if (auto git = job->groups.find(r.group); git != job->groups.end()) {
    if (auto rit = git->second->ranks.find(r.rank_in_group); rit != git->second->ranks.end() &&
                                                            sessions_.contains(rit->second.session_id)) {
      replaced = rit->second.session_id;
    }
  }
  if (replaced.empty() && job->sessions >= options_.max_sessions_per_job) {
    CountLimit(Limit::kSessionsPerJob);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job %s already has %d worker sessions (--max_sessions_per_job)", r.job_id,
        options_.max_sessions_per_job));
  }
  ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(*job, r.group));
  now = Now();
  if (g->size != r.group_size) {
    const bool others_alive = std::any_of(g->ranks.begin(), g->ranks.end(), [&](const auto& kv) {
      return kv.first != r.rank_in_group && now - kv.second.last_seen < options_.stale_after;
    });
    if (others_alive && g->size > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "group_size: %d differs from the size %d that group %d of job %s registered with",
          r.group_size, g->size, r.group, r.job_id));
    }
    g->size = r.group_size;
  }
  Rank& rank = g->ranks[r.rank_in_group];
  rank.global_rank = r.global_rank;
  rank.host = r.host;
  rank.last_seen = now;
  if (!replaced.empty()) {
    // The old session's stream (if any) keeps running until it ends; its calls by token
    // get NOT_FOUND from now on.
    EraseSessions([&](const Session& s) { return s.id == replaced; });
  }
  rank.session_id = session->id;
  ++job->sessions;
  g->last_activity = job->last_activity = now;
  if (r.memory_budget_bytes > 0) {
    job->memory_budget = r.memory_budget_bytes;
    job->metrics->memory_budget->Set(static_cast<double>(job->memory_budget));
  }
  sessions_[session->id] = session;

  RegisterResult out;
  out.session_id = session->id;
  out.config = job->op.served;
  out.effective_from_step = std::max<int64_t>(0, g->schedule.latest().effective_from_step);
  out.heartbeat_interval = options_.heartbeat_interval;
  out.last_decided_step = g->policy.gate().has_decision ? g->policy.gate().last_step : -1;
  return out;
}

absl::StatusOr<std::shared_ptr<Session>> GateState::AttachSession(const std::string& session_id,
                                                                  std::weak_ptr<SessionSink> sink) {
  if (draining()) return absl::UnavailableError("spgated is shutting down");
  RETURN_IF_ERROR(CheckSessionIdLength(session_id));
  std::shared_ptr<Session> session;
  std::vector<std::shared_ptr<SessionSink>> learned_sinks;
  ThroughputTable learned;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "session_id: unknown session \"", session_id, "\" (register again)"));
    }
    session = it->second;
    ASSIGN_OR_RETURN(Job * found, JobOfSession(*session));
    Job& job = *found;
    job.sinks[session_id] = std::move(sink);
    auto git = job.groups.find(session->group);
    if (git != job.groups.end()) {
      Rank& rank = git->second->ranks[session->rank_in_group];
      ++rank.streams;
      rank.last_seen = Now();
    }
    // A leader that (re)connects gets the learned table at once, for its fallback.
    if (!job.learned.empty()) {
      CollectLearnedPushes(job, /*force=*/true, &session_id, &learned_sinks, &learned);
    }
  }
  for (const auto& s : learned_sinks) s->PushLearned(learned);
  return session;
}

void GateState::DetachSession(const Session& session, const SessionSink* sink) {
  MutexLock lock(&mu_);
  auto jit = jobs_.find(session.job_id);
  // A stream of a replaced launch: the live state it counted in is gone.
  if (jit == jobs_.end() || jit->second->incarnation != session.incarnation) return;
  Job& job = *jit->second;
  auto sit = job.sinks.find(session.id);
  if (sit != job.sinks.end()) {
    auto locked = sit->second.lock();
    if (!locked || locked.get() == sink) job.sinks.erase(sit);
  }
  auto git = job.groups.find(session.group);
  if (git != job.groups.end()) {
    auto rit = git->second->ranks.find(session.rank_in_group);
    if (rit != git->second->ranks.end() && rit->second.streams > 0) --rit->second.streams;
  }
}

void GateState::Touch(const Session& session) {
  MutexLock lock(&mu_);
  auto jit = jobs_.find(session.job_id);
  if (jit == jobs_.end() || jit->second->incarnation != session.incarnation) return;
  auto git = jit->second->groups.find(session.group);
  if (git == jit->second->groups.end()) return;
  auto rit = git->second->ranks.find(session.rank_in_group);
  if (rit != git->second->ranks.end()) rit->second.last_seen = Now();
}

// Validate -> cache -> policy -> record (docs/design.md §8; the rules they keep: §4). The checks that need no
// state run before the lock, and so does the per-sequence work.
absl::StatusOr<DecisionRecord> GateState::Decide(const Session& session, const PlanInput& plan) {
  RETURN_IF_ERROR(CheckPlan(session, plan));
  ASSIGN_OR_RETURN(const LengthStats stats, ComputeLengthStats(plan.lengths));
  DecisionRecord decision;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, JobOfSession(session));
    ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(*job, plan.group));
    if (const DecisionRecord* cached = g->Cached(plan.step)) return *cached;  // a retry
    RETURN_IF_ERROR(CheckStepWindow(*g, plan));
    decision = DecideStep(*job, *g, plan, stats);
  }
  NotifyWatchers(decision);
  return decision;
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
  if (static_cast<int64_t>(plan.lengths.size()) > options_.max_sequences_per_plan) {
    CountLimit(Limit::kSequencesPerPlan);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "lengths: %d sequences in one plan, more than %d (--max_sequences_per_plan)",
        plan.lengths.size(), options_.max_sequences_per_plan));
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

absl::Status GateState::CheckStepWindow(const Group& g, const PlanInput& plan) {
  const GroupGateState& gate = g.policy.gate();
  if (!gate.has_decision) return absl::OkStatus();
  if (plan.step <= gate.last_step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step: %d is not after group %d's last decided step %d and is no longer cached; "
        "steps must increase",
        plan.step, plan.group, gate.last_step));
  }
  if (plan.step - gate.last_step > options_.max_plan_lead_steps) {
    metrics_.refused_step_too_far.Increment();
    return absl::InvalidArgumentError(absl::StrFormat(
        "step: %d is more than %d steps after group %d's last decided step %d "
        "(--max_plan_lead_steps); nothing was decided",
        plan.step, options_.max_plan_lead_steps, plan.group, gate.last_step));
  }
  return absl::OkStatus();
}

DecisionRecord GateState::DecideStep(Job& job, Group& g, const PlanInput& plan,
                                     const LengthStats& stats) {
  const ScheduledConfig& config = g.schedule.At(plan.step);
  KeepBandsOf(job, config.config);
  const BatchFacts facts{.step = plan.step,
                         .length_cv = stats.cv,
                         .tokens = stats.tokens,
                         .predicted_peak_bytes_sp = plan.predicted_peak_bytes_sp,
                         .predicted_peak_bytes_tp = plan.predicted_peak_bytes_tp,
                         .memory_budget_bytes = plan.memory_budget_bytes};
  DecisionSample sample{.length_cv = stats.cv};
  if (g.policy.gate().has_decision) sample.previous_mode = g.policy.gate().mode;
  const double rs_mean = g.policy.rs_wait().mean;
  const std::optional<PinState> pin = ActivePin(job, plan.group);
  const GateOutcome outcome = g.policy.Decide(config.config, facts, AsDirective(pin), &job.learned);

  const DecisionRecord decision{
      .job_id = job.id,
      .group = plan.group,
      .step = plan.step,
      .mode = outcome.decision.mode,
      .reason = outcome.decision.reason,
      .config_version = config.version,
      .length_cv = stats.cv,
      .rolling_rs_wait_share = rs_mean,
      .time = Now(),
      .pin_expire = outcome.decision.reason == Reason::kPinned
                        ? std::optional<absl::Time>(pin->expire) : std::nullopt,
      .pin_forced = outcome.decision.reason == Reason::kPinned && pin->force,
      .band = outcome.band >= 0 ? outcome.band  // ADAPTIVE computed it
                                : BandOf(config.config, stats.cv, stats.tokens)};
  g.schedule.Prune(plan.step);
  g.cache.push_back(decision);
  if (static_cast<int64_t>(g.cache.size()) > options_.decision_cache_steps) g.cache.pop_front();
  g.last_activity = job.last_activity = decision.time;
  ++job.decisions[static_cast<int>(decision.mode)][static_cast<int>(decision.reason)];
  if (outcome.explored) ++job.exploration_steps;
  if (job.gain.Add(config.config, job.learned, outcome, plan.step, stats.tokens)) {
    sample.adaptive_gain = job.gain.ratio();
  }
  if (plan.memory_budget_bytes > 0 && plan.memory_budget_bytes != job.memory_budget) {
    job.memory_budget = plan.memory_budget_bytes;
    sample.memory_budget = job.memory_budget;
  }
  sample.mode = decision.mode;
  sample.reason = decision.reason;
  sample.explored = outcome.explored;
  job.metrics->RecordDecision(sample, *g.metrics);
  return decision;
}

void GateState::NotifyWatchers(const DecisionRecord& decision) {
  if (watcher_count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(&watch_mu_);
  for (const auto& w : watchers_) {
    if (w->job_filter().empty() || w->job_filter() == decision.job_id) w->OnDecision(decision);
  }
}

absl::Status GateState::RecordTelemetry(Session& session, const TelemetryRecord& t) {
  auto reject = [&](absl::Status s) {
    metrics_.telemetry_rejected.Increment();
    return s;
  };
  if (t.job_id != session.job_id || t.group != session.group ||
      t.rank_in_group != session.rank_in_group) {
    return reject(absl::InvalidArgumentError(absl::StrFormat(
        "telemetry: (job_id=%s, group=%d, rank_in_group=%d) does not match the session's "
        "(%s, %d, %d)",
        t.job_id, t.group, t.rank_in_group, session.job_id, session.group,
        session.rank_in_group)));
  }
  if (absl::Status s = ValidateStepTelemetry(t.values); !s.ok()) return reject(s);
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

  std::vector<std::shared_ptr<SessionSink>> learned_sinks;
  ThroughputTable learned;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<Job*> found = JobOfSession(session);
    if (!found.ok()) return reject(found.status());
    session.telemetry_received.fetch_add(1, std::memory_order_relaxed);
    metrics_.telemetry_received.Increment();
    Job& job = **found;
    auto git = job.groups.find(session.group);
    if (git == job.groups.end()) return absl::OkStatus();
    Group& g = *git->second;
    auto rit = g.ranks.find(session.rank_in_group);
    if (rit != g.ranks.end()) rit->second.last_seen = Now();

    const StepTelemetryValues& v = t.values;
    const int slot = static_cast<int>(v.step % kPendingSlots);
    PendingStep& p = g.pending[slot];
    if (p.step != v.step) {
      if (p.step > v.step) return absl::OkStatus();  // older than the aggregation window
      if (p.step != kNoStep && !p.finalized) FinalizeStep(job, g, slot);
      p = PendingStep{};
      p.step = v.step;
    } else if (p.finalized) {
      return absl::OkStatus();  // every rank already reported; a duplicate
    }
    ++p.reported;
    p.mode = static_cast<Mode>(v.mode);
    p.step_time = std::max(p.step_time, v.step_time_s);
    p.rs_share = std::max(p.rs_share, std::min(1.0, v.rs_wait_s / v.step_time_s));
    p.all_gather = std::max(p.all_gather, v.all_gather_s);
    p.norm_share = std::max(p.norm_share, std::min(1.0, v.norm_stall_s / v.step_time_s));
    p.tokens = std::max(p.tokens, v.effective_tokens);
    p.padding = std::max(p.padding, v.padding_tokens);
    p.peak = std::max(p.peak, t.peak_memory_bytes);
    if (p.reported >= g.size) FinalizeStep(job, g, slot);
    CollectLearnedPushes(job, /*force=*/false, nullptr, &learned_sinks, &learned);
  }
  // Outside the lock: a sink only queues the message.
  for (const auto& sink : learned_sinks) sink->PushLearned(learned);
  return absl::OkStatus();
}

void GateState::FinalizeStep(Job& job, Group& g, int slot) {
  PendingStep& p = g.pending[slot];
  p.finalized = true;
  const int m = static_cast<int>(p.mode);
  if (p.mode == Mode::kSequenceParallel) {
    const int64_t window = g.schedule.At(p.step).config.window_steps;
    g.policy.ObserveRsWaitShare(p.step, p.mode, p.rs_share, window);
    g.all_gather.Resize(window);
    g.norm_stall.Resize(window);
    g.all_gather.Push(p.all_gather);
    g.norm_stall.Push(p.norm_share);
    g.metrics->rs_wait_share->Set(g.policy.rs_wait().mean);
    g.metrics->all_gather_tail->Set(g.all_gather.Quantile(0.95));
    g.metrics->norm_stall_ratio->Set(g.norm_stall.Mean());
  }
  LearnFromStep(job, g, slot);
  ModeWindow& w = job.modes[m];
  w.step_time.Push(p.step_time);
  w.tokens.Push(static_cast<double>(p.tokens));
  w.peak.Push(static_cast<double>(p.peak));
  job.metrics->step_duration[m]->Observe(p.step_time);
  job.metrics->effective_tokens[m]->Increment(static_cast<double>(p.tokens));
  job.metrics->padding_tokens[m]->Increment(static_cast<double>(p.padding));
  job.metrics->peak_memory[m]->Set(w.peak.Max());
}

absl::StatusOr<int64_t> GateState::Heartbeat(
    Session& session, const std::array<int64_t, kNumReasons>& local_decisions) {
  MutexLock lock(&mu_);
  {
    ASSIGN_OR_RETURN(Job * found, JobOfSession(session));
    Job& job = *found;
    for (int r = 1; r < kNumReasons; ++r) {
      const int64_t count = local_decisions[r];
      if (count < 0) continue;
      int64_t& seen = session.local_seen[r];
      // A restarted worker process starts again from zero: count it all.
      const int64_t delta = count >= seen ? count - seen : count;
      seen = count;
      if (delta > 0) {
        job.local_decisions = SaturatingAdd(job.local_decisions, delta);
        job.metrics->LocalDecisions(static_cast<Reason>(r)).Increment(static_cast<double>(delta));
      }
    }
    auto git = job.groups.find(session.group);
    if (git != job.groups.end()) {
      auto rit = git->second->ranks.find(session.rank_in_group);
      if (rit != git->second->ranks.end()) rit->second.last_seen = Now();
    }
  }
  return session.telemetry_received.load(std::memory_order_relaxed);
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

bool GateState::TracksJob(const std::string& job_id) const {
  ReaderMutexLock lock(&mu_);
  return jobs_.contains(job_id);
}

int GateState::OnJobForgotten(const std::string& job_id) {
  MutexLock lock(&mu_);
  const int ended = EraseSessions([&](const Session& s) { return s.job_id == job_id; });
  jobs_.erase(job_id);  // its groups, caches, windows and metric series with it
  // Settings that stay keep the job listed (as for a job configured before it starts).
  if (store_->HasJobScope(job_id)) (void)FindOrCreateJob(job_id);
  return ended;
}

void GateState::Sweep() {
  MutexLock lock(&mu_);
  const absl::Time now = Now();
  for (auto jit = jobs_.begin(); jit != jobs_.end();) {
    Job& job = *jit->second;
    int active = 0, stale = 0, ranks = 0;
    for (auto git = job.groups.begin(); git != job.groups.end();) {
      Group& g = *git->second;
      for (auto rit = g.ranks.begin(); rit != g.ranks.end();) {
        const absl::Duration silent = now - rit->second.last_seen;
        if (rit->second.streams == 0 && silent > options_.forget_after) {
          rit = g.ranks.erase(rit);
          continue;
        }
        (silent > options_.stale_after ? stale : active)++;
        ++ranks;
        ++rit;
      }
      // A group whose ranks are all gone is dropped once it has been idle as long.
      if (g.ranks.empty() && now - g.last_activity > options_.forget_after) {
        git = job.groups.erase(git);
        continue;
      }
      ++git;
    }
    job.metrics->workers_active->Set(active);
    job.metrics->workers_stale->Set(stale);
    const bool idle = ranks == 0 && now - job.last_activity > options_.forget_after;
    if (!idle) {
      ++jit;
      continue;
    }
    const bool operator_state =
        job.op.has_overrides || Active(job.op.pin, now) ||
        std::any_of(job.op.group_pins.begin(), job.op.group_pins.end(),
                    [&](const auto& kv) { return kv.second.expire > now; });
    if (job.sessions > 0) {  // only then is the scan worth it (Sweep runs every second)
      const std::string id = job.id;
      EraseSessions([&](const Session& s) { return s.job_id == id; });
    }
    if (operator_state) {
      // Settings keep the job listed, but not its live state: that goes like any idle
      // job's, so a job configured once does not hold its groups forever.
      if (!job.incarnation.empty() || !job.groups.empty()) StartIncarnation(job, "");
      ++jit;
      continue;
    }
    jobs_.erase(jit++);
  }
  // Sessions whose rank was forgotten.
  EraseSessions([&](const Session& s) {
    auto jit = jobs_.find(s.job_id);
    if (jit == jobs_.end()) return true;
    auto git = jit->second->groups.find(s.group);
    return git == jit->second->groups.end() || !git->second->ranks.contains(s.rank_in_group);
  });
}

}  // namespace spgate::server
