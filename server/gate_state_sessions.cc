// The live state's sessions and the launches they belong to: Register (the launch book's
// claim, then the rank's seat, in a job and group found or made here), a session's stream
// attaching and detaching, heartbeats, and forgetting (ForgetJob, the idle sweep). See
// gate_state.h for the invariants and the locks. Who owns each job id is the launch book's
// (launch_book.h); a job's live state is of its lease's launch, so every change of one here
// changes the other, under both locks.
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hardware_id.h"
#include "common/status_macros.h"
#include "server/gate_state.h"
#include "server/gate_state_internal.h"
#include "server/identity.h"

namespace spgate::server {
namespace {

using gate_state_internal::Active;
using gate_state_internal::kNoStep;
using gate_state_internal::ModeWindow;
using gate_state_internal::Rank;

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

// The increase of a worker's cumulative count since `seen` (a restarted worker process
// starts again from zero: then all of it), and the new `seen`. Negative counts are
// ignored.
int64_t CumulativeIncrease(int64_t count, int64_t& seen) {
  if (count < 0) return 0;
  const int64_t delta = count >= seen ? count - seen : count;
  seen = count;
  return delta;
}

}  // namespace

absl::Status GateState::RestoreLaunches() {
  ASSIGN_OR_RETURN(std::vector<LaunchBook::Restored> restored, launches_.Restore());
  for (const LaunchBook::Restored& l : restored) {
    absl::StatusOr<Job*> job = FindOrCreateJob(l.job_id, /*over_max_jobs=*/true);
    if (!job.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(launches_.path(), ": job ", l.job_id, ": ", job.status().message()));
    }
    (*job)->incarnation = l.incarnation;
  }
  return absl::OkStatus();
}

absl::Status GateState::CheckJobLimit(const std::string& job_id) const {
  if (static_cast<int>(jobs_.size()) < options_.max_jobs) return absl::OkStatus();
  // The count may be past the flag: a restart restores every job it persisted.
  return absl::ResourceExhaustedError(
      absl::StrFormat("job %s: the daemon already tracks %d job%s (--max_jobs=%d)", job_id,
                      jobs_.size(), jobs_.size() == 1 ? "" : "s", options_.max_jobs));
}

absl::Status GateState::AdmitJobScope(const std::string& job_id) const {
  // Not counted here: the admin service counts the store's refusal.
  ReaderMutexLock lock(&mu_);
  if (jobs_.contains(job_id)) return absl::OkStatus();
  return CheckJobLimit(job_id);
}

absl::StatusOr<GateState::Job*> GateState::FindOrCreateJob(const std::string& job_id,
                                                           bool over_max_jobs) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) return it->second.get();
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (absl::Status limit = over_max_jobs ? absl::OkStatus() : CheckJobLimit(job_id);
      !limit.ok()) {
    CountLimit(Limit::kJobs);
    return limit;
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

absl::Status GateState::CheckGroupIndex(int group) const {
  if (group >= options_.max_groups_per_job) CountLimit(Limit::kGroupsPerJob);
  return ValidateGroupIndex(group, options_.max_groups_per_job);
}

absl::StatusOr<GateState::Group*> GateState::FindOrCreateGroup(Job& job, int group) {
  auto it = job.groups.find(group);
  if (it != job.groups.end()) return it->second.get();
  RETURN_IF_ERROR(CheckGroupIndex(group));
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

absl::Status GateState::CheckJob(const std::string& job_id, std::optional<int> group) const {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  ReaderMutexLock lock(&mu_);
  return FindJob(job_id, group).status();
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
    // Names only what the caller sent: never the launch that replaced it.
    return absl::FailedPreconditionError(absl::StrFormat(
        "incarnation: launch \"%s\" of job %s was replaced by a newer launch; this session "
        "has ended",
        session.incarnation, session.job_id));
  }
  return it->second.get();
}

bool GateState::RanksHeardFrom(const Job& job) const {
  const absl::Time now = Now();
  for (const auto& [id, group] : job.groups) {
    for (const auto& [rank_in_group, rank] : group->ranks) {
      // A crashed launch's streams close with its processes: it lets go at once. A
      // stream alone does not hold a job: its rank must also be heard from.
      if (now - rank.last_seen < options_.stale_after && (rank.streams > 0 || !rank.streamed)) {
        return true;
      }
    }
  }
  return false;
}

void GateState::StartIncarnation(Job& job, const std::string& incarnation) {
  StashLearned(job);  // the old launch's tables: the job's next launch may start from them
  job.incarnation = incarnation;
  // Live state of the old launch: its groups (decisions, caches, windows, ranks), its
  // per-mode windows and counts, and its streams. Operator settings (job.op) stay; the
  // Prometheus counters keep counting (they are monotonic per job).
  job.groups.clear();
  for (ModeWindow& w : job.modes) w = ModeWindow{};
  for (auto& row : job.decisions) std::fill(std::begin(row), std::end(row), 0);
  job.group_steps_decided = 0;
  job.local_decisions = 0;
  job.memory_overrides = 0;
  job.hardware_mismatch_logged = false;
  job.sinks.clear();
  job.layout.reset();
  job.sp_required.clear();
  job.stage_learned.clear();
  job.stage_learned_told.clear();
  job.metrics->RemoveStages();
  ClearLearned(job);
  job.learned.SetPriorInputs({});  // the new launch declares its own shape
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

absl::StatusOr<RegisterResult> GateState::Register(const RegisterInput& r) {
  if (draining()) return absl::UnavailableError("spgated is shutting down");
  RETURN_IF_ERROR(ValidateJobId(r.job_id));
  RETURN_IF_ERROR(ValidateIncarnation(r.incarnation));
  RETURN_IF_ERROR(ValidateLaunchCredential(r.launch_credential));
  RETURN_IF_ERROR(ValidateHardwareId(r.hardware_id));
  RETURN_IF_ERROR(ValidateGroupSize(r.group_size, options_.max_group_size));
  if (r.rank_in_group < 0 || r.rank_in_group >= r.group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank_in_group: must be in [0, group_size=%d), got %d", r.group_size, r.rank_in_group));
  }
  RETURN_IF_ERROR(ValidateGlobalRank(r.global_rank));
  if (r.group_session && r.rank_in_group != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_session: only the group's leader (rank_in_group 0) speaks for the group, got "
        "rank_in_group %d",
        r.rank_in_group));
  }
  RETURN_IF_ERROR(ValidateHost(r.host));
  if (r.layout.has_value()) {
    RETURN_IF_ERROR(ValidateJobLayout(*r.layout));
    if (r.layout->groups() > options_.max_groups_per_job) {
      // Its groups past the limit could never decide a step (docs/design.md §10,
      // "Limits"); refused before the launch book is asked, so nothing changes.
      CountLimit(Limit::kGroupsPerJob);
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout: %s has dp x pp x cp = %d TP groups, more than %d (--max_groups_per_job)",
          FormatJobLayout(*r.layout), r.layout->groups(), options_.max_groups_per_job));
    }
    if (r.layout->tp != r.group_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layout.tp: %d, but group_size is %d (a TP group is tp ranks)", r.layout->tp,
          r.group_size));
    }
    RETURN_IF_ERROR(ValidateCoordinates(*r.layout, r.coordinates));
    if (const int64_t g = GroupOf(*r.layout, r.coordinates); g != r.group) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "group: %d, but coordinates (dp_index=%d, stage=%d, cp_rank=%d) are group %d "
          "((dp_index x pp + stage) x cp + cp_rank)",
          r.group, r.coordinates.dp_index, r.coordinates.stage, r.coordinates.cp_rank, g));
    }
  }
  RETURN_IF_ERROR(ValidateSpRequiredFeatures(r.sp_required));
  // Before the launch book is asked: a new launch's seat can fail for nothing else (its
  // job starts empty; the sp_required count is checked just above), so a refused rank
  // neither creates the job nor claims the launch.
  RETURN_IF_ERROR(CheckGroupIndex(r.group));
  const std::string digest = LaunchCredentialDigest(r.launch_credential);
  auto session = std::make_shared<Session>();
  ASSIGN_OR_RETURN(session->id, NewSessionId());
  session->job_id = r.job_id;
  session->incarnation = r.incarnation;
  session->group = r.group;
  session->rank_in_group = r.rank_in_group;
  session->group_session = r.group_session;
  {
    const absl::Time now = Now();
    MutexLock limiter(&session->limiter_mu);
    session->plan_tokens =
        TokenBucket(options_.max_plans_per_second, 2 * options_.max_plans_per_second, now);
    session->telemetry_tokens = TokenBucket(options_.max_telemetry_per_second,
                                            2 * options_.max_telemetry_per_second, now);
  }

  std::vector<std::shared_ptr<SessionSink>> ended;
  auto end_replaced = [&ended, &r] {
    // Outside the lock: a sink only asks its stream to finish.
    for (const auto& sink : ended) {
      sink->End(absl::AbortedError(absl::StrFormat(
          "session replaced: rank %d of group %d of this launch registered again; this "
          "stream's session has ended",
          r.rank_in_group, r.group)));
    }
  };
  // Under the launch book's lock, so that no launch change interleaves: a rank joining
  // its job's live launch is seated at once; a new launch is persisted (without mu_, so
  // decisions do not wait for the disk) and granted by the book, then applied.
  MutexLock launch(&launches_.mu());
  std::optional<absl::StatusOr<RegisterResult>> joined;
  bool created = false;  // the job is this call's: a refused launch takes it away again
  {
    MutexLock lock(&mu_);
    created = !jobs_.contains(r.job_id);
    ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(r.job_id));
    ASSIGN_OR_RETURN(LaunchBook::Claim claim,
                     launches_.Check(r.job_id, r.incarnation, digest,
                                     [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                       return RanksHeardFrom(*job);
                                     }));
    if (claim == LaunchBook::Claim::kJoin) joined = Seat(*job, r, session, &ended);
  }
  if (!joined.has_value()) {
    if (absl::Status taken = launches_.Take(r.job_id, r.incarnation, digest); !taken.ok()) {
      // Not written, so not granted: a job this call made must not stay listed (jobs
      // list, GetJob) as if a launch had started. Nothing else can have joined it: every
      // launch change holds the book's lock.
      MutexLock lock(&mu_);
      if (auto it = jobs_.find(r.job_id); created && it != jobs_.end() &&
                                          it->second->incarnation.empty() &&
                                          it->second->groups.empty() &&
                                          !store_->HasJobScope(r.job_id)) {
        jobs_.erase(it);
      }
      return taken;
    }
    MutexLock lock(&mu_);
    // Jobs are dropped only under the book's lock (ForgetJob, the idle sweep), so the
    // job is still there; looked up again all the same.
    ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(r.job_id));
    if (job->incarnation != r.incarnation) StartIncarnation(*job, r.incarnation);
    joined = Seat(*job, r, session, &ended);
  }
  end_replaced();
  return *std::move(joined);
}

absl::StatusOr<RegisterResult> GateState::Seat(Job& job, const RegisterInput& r,
                                               std::shared_ptr<Session> session,
                                               std::vector<std::shared_ptr<SessionSink>>* ended) {
  // A rank that registers again replaces its own session, so re-registering never grows
  // the job's sessions; a new rank needs room under --max_sessions_per_job.
  std::string replaced;
  if (auto git = job.groups.find(r.group); git != job.groups.end()) {
    if (auto rit = git->second->ranks.find(r.rank_in_group); rit != git->second->ranks.end() &&
                                                            sessions_.contains(rit->second.session_id)) {
      replaced = rit->second.session_id;
    }
  }
  RETURN_IF_ERROR(CheckLayout(job, r));
  if (replaced.empty() && job.sessions >= options_.max_sessions_per_job) {
    CountLimit(Limit::kSessionsPerJob);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job %s already has %d worker sessions (--max_sessions_per_job)", r.job_id,
        options_.max_sessions_per_job));
  }
  ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(job, r.group));
  const absl::Time now = Now();
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
  rank.last_telemetry_step = kNoStep;  // a restarted process may report from an older step
  rank.covers = r.group_session ? r.group_size : 1;
  if (r.rank_in_group == 0) g->group_session = r.group_session;
  if (!replaced.empty()) {
    // The old session's stream is ended (ABORTED, after the lock) and its calls by token
    // get NOT_FOUND: a seat has one holder.
    if (auto sit = job.sinks.find(replaced); sit != job.sinks.end()) {
      if (std::shared_ptr<SessionSink> sink = sit->second.lock()) ended->push_back(std::move(sink));
      job.sinks.erase(sit);
    }
    EraseSessions([&](const Session& s) { return s.id == replaced; });
  }
  rank.session_id = session->id;
  ++job.sessions;
  if (r.layout.has_value() && !job.layout.has_value()) {
    job.layout = r.layout;
    job.stage_learned.assign(static_cast<size_t>(r.layout->pp), ThroughputTable{});
    for (ThroughputTable& t : job.stage_learned) t.SetPriorInputs(job.learned.prior_inputs());
    job.stage_learned_told.assign(static_cast<size_t>(r.layout->pp),
                                  gate_state_internal::LearnedTold{});
  }
  if (!DeclaresPrior(job.learned.prior_inputs()) && DeclaresPrior(r.prior_inputs)) {
    job.learned.SetPriorInputs(r.prior_inputs);
    for (ThroughputTable& t : job.stage_learned) t.SetPriorInputs(r.prior_inputs);
  }
  for (const std::string& f : r.sp_required) {
    if (std::find(job.sp_required.begin(), job.sp_required.end(), f) == job.sp_required.end()) {
      job.sp_required.push_back(f);
    }
  }
  if (!job.learned_key.has_value()) {
    AdoptLearned(job, r);  // the launch's first rank: its hardware id keys the launch's table
  } else if (const std::string& first = job.learned_key->hardware_id;
             !first.empty() && !r.hardware_id.empty() && r.hardware_id != first) {
    // Logged, not refused: the id only keys the learned table, and it differs by accident
    // (MIG slices, ECC changing the GiB, SKU names, a rank without a visible GPU).
    job.metrics->hardware_id_mismatches->Increment();
    if (!job.hardware_mismatch_logged) {
      job.hardware_mismatch_logged = true;
      LogLine(absl::StrFormat(
          "job %s launch %s: group %d rank %d declared hardware_id \"%s\", the launch's first "
          "rank \"%s\"; the rank joins, the learned table stays keyed by the first",
          job.id, job.incarnation, r.group, r.rank_in_group, r.hardware_id, first));
    }
  }
  if (r.rank_in_group == 0) g->resume_allowed = true;  // a (re)started leader may resume
  g->last_activity = job.last_activity = now;
  if (r.memory_budget_bytes > 0) {
    job.memory_budget = r.memory_budget_bytes;
    job.metrics->memory_budget->Set(static_cast<double>(job.memory_budget));
  }
  sessions_[session->id] = session;

  RegisterResult out;
  out.session_id = session->id;
  out.config = job.op.served;
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
  std::vector<LearnedPush> learned_pushes;
  std::shared_ptr<SessionSink> superseded;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError("session_id: unknown session (register again)");
    }
    session = it->second;
    ASSIGN_OR_RETURN(Job * found, JobOfSession(*session));
    Job& job = *found;
    // One stream per session: a newer one (a client reconnecting before the daemon saw
    // its old connection die) takes over, and the older is ended.
    std::weak_ptr<SessionSink>& slot = job.sinks[session_id];
    superseded = slot.lock();
    slot = std::move(sink);
    auto git = job.groups.find(session->group);
    if (git != job.groups.end()) {
      Rank& rank = git->second->ranks[session->rank_in_group];
      ++rank.streams;
      rank.streamed = true;
      rank.last_seen = Now();
      if (session->rank_in_group == 0) git->second->resume_allowed = true;
    }
    // A leader that (re)connects gets the learned table at once, for its fallback.
    if (!LearnedTableOf(job, session->group).empty()) {
      CollectLearnedPushes(job, /*force=*/true, &session_id, &learned_pushes, Now());
    }
  }
  for (const LearnedPush& p : learned_pushes) p.sink->PushLearned(*p.table);
  if (superseded != nullptr) {
    superseded->End(absl::AbortedError(
        "session replaced: a newer Connect stream of this session took its place (a "
        "session has one stream)"));
  }
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

absl::StatusOr<int64_t> GateState::Heartbeat(Session& session, const HeartbeatInput& hb) {
  MutexLock lock(&mu_);
  {
    ASSIGN_OR_RETURN(Job * found, JobOfSession(session));
    Job& job = *found;
    for (int r = 1; r < kNumReasons; ++r) {
      const int64_t delta = CumulativeIncrease(hb.local_decisions[r], session.local_seen[r]);
      if (delta > 0) {
        job.local_decisions = SaturatingAdd(job.local_decisions, delta);
        job.metrics->LocalDecisions(static_cast<Reason>(r)).Increment(static_cast<double>(delta));
      }
    }
    if (const int64_t delta =
            CumulativeIncrease(hb.memory_overrides, session.memory_overrides_seen);
        delta > 0) {
      job.memory_overrides = SaturatingAdd(job.memory_overrides, delta);
      job.metrics->memory_overrides->Increment(static_cast<double>(delta));
    }
    auto git = job.groups.find(session.group);
    if (git != job.groups.end()) {
      auto rit = git->second->ranks.find(session.rank_in_group);
      if (rit != git->second->ranks.end()) rit->second.last_seen = Now();
    }
  }
  return session.telemetry_received.load(std::memory_order_relaxed);
}

bool GateState::TracksJob(const std::string& job_id) const {
  ReaderMutexLock lock(&mu_);
  if (kept_learned_.contains(job_id)) return true;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return false;
  // A job listed only for its operator settings (configured or pinned before it starts,
  // or kept after a forget) holds no live state: nothing registered, decided or learned.
  const Job& job = *it->second;
  return !job.incarnation.empty() || job.sessions > 0 || !job.groups.empty() ||
         job.group_steps_decided > 0 || !job.learned.empty() ||
         std::any_of(job.stage_learned.begin(), job.stage_learned.end(),
                     [](const ThroughputTable& t) { return !t.empty(); });
}

int GateState::OnJobForgotten(const std::string& job_id) {
  MutexLock launch(&launches_.mu());
  int ended = 0;
  {
    MutexLock lock(&mu_);
    ended = EraseSessions([&](const Session& s) { return s.job_id == job_id; });
    jobs_.erase(job_id);  // its groups, caches, windows and metric series with it
    // Settings that stay keep the job listed (as for a job configured before it starts).
    if (store_->HasJobScope(job_id)) (void)FindOrCreateJob(job_id, /*over_max_jobs=*/true);
    launches_.Forget(job_id);
    kept_learned_.erase(job_id);
  }
  if (!options_.state_dir.empty()) {
    MutexLock io(&learned_io_mu_);  // no write of its tables is in flight or comes after
    if (absl::Status s = RemoveLearned(options_.state_dir, job_id); !s.ok()) {
      LogLine(std::string(s.message()));
    }
  }
  // Forgotten means forgotten after a restart too. The store has already applied the
  // forget, so a failure here is counted (by the book), not returned: the job's last
  // launch would then come back after a restart, still needing its credential.
  (void)launches_.Save();
  return ended;
}

void GateState::Sweep() {
  MutexLock launch(&launches_.mu());  // idle jobs lose their launch
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
        ++ranks;
        ++rit;
      }
      const gate_state_internal::RankCounts counts =
          gate_state_internal::CountRanks(g.ranks, g.size, now, options_.stale_after);
      active += counts.active;
      stale += counts.stale;
      // A group whose ranks are all gone is dropped once it has been idle as long.
      if (g.ranks.empty() && now - g.last_activity > options_.forget_after) {
        git = job.groups.erase(git);
        continue;
      }
      ++git;
    }
    job.metrics->workers_active->Set(active);
    job.metrics->workers_stale->Set(stale);
    if (job.layout.has_value()) {
      // Per stage: its groups' last step plans (bounded: pp <= 1024 series per job).
      std::map<int, std::tuple<uint64_t, int64_t, int64_t>> stages;  // peak, tp, planned
      for (const auto& [gi, g] : job.groups) {
        if (g->step_plans.empty()) continue;
        auto& [peak, tp, planned] = stages[CoordinatesOf(*job.layout, gi).stage];
        peak = std::max(peak, g->stage_peak);
        tp += g->last_tp_microbatches;
        planned += job.layout->microbatches;
      }
      std::vector<int> present;
      for (const auto& [stage, v] : stages) {
        const auto& [peak, tp, planned] = v;
        job.metrics->SetStage(stage, peak, static_cast<double>(tp) / static_cast<double>(planned));
        present.push_back(stage);
      }
      job.metrics->RetainStages(present);
    }
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
      if (!job.incarnation.empty() || !job.groups.empty()) {
        StartIncarnation(job, "");
        launches_.Release(job.id);
      }
      ++jit;
      continue;
    }
    StashLearned(job);
    launches_.Forget(job.id);
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
