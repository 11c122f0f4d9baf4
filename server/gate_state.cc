// The daemon's state; see gate_state.h for the invariants.
#include "server/gate_state.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/time_util.h"
#include "proto/convert.h"
#include "server/persistence.h"
#include "server/status_util.h"

namespace spgate::server {
namespace {

using google::protobuf::util::TimeUtil;
constexpr int64_t kNoStep = std::numeric_limits<int64_t>::min();
constexpr int kPendingSlots = 16;
constexpr int64_t kModeWindowSteps = 512;
constexpr size_t kMaxJobIdLength = 128;

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}
absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(ts));
}

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  if (job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("job_id: at most %d characters, got %d", kMaxJobIdLength, job_id.size()));
  }
  if (job_id == "_default") {
    return absl::InvalidArgumentError("job_id: \"_default\" is reserved for the global config");
  }
  for (char c : job_id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job_id: \"%s\" may contain only letters, digits, '-', '_' and '.'", job_id));
    }
  }
  return absl::OkStatus();
}

template <typename Request>
std::optional<int> GroupOf(const Request& r) {
  return r.has_group() ? std::optional<int>(r.group()) : std::nullopt;
}

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0.0; }

struct CachedDecision {
  int64_t step = kNoStep;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  int64_t version = 0;
  double length_cv = 0;
  double rs_wait = 0;
  absl::Time time;
};

struct PendingStep {
  int64_t step = kNoStep;
  bool finalized = false;
  int reported = 0;
  Mode mode = Mode::kSequenceParallel;
  double step_time = 0, rs_share = 0, all_gather = 0, norm_share = 0;
  int64_t tokens = 0, padding = 0;
  uint64_t peak = 0;
};

struct PinState {
  Mode mode;
  absl::Time expire;
};

struct Rank {
  int global_rank = 0;
  std::string host;
  absl::Time last_seen;
  int streams = 0;
};

struct ScheduledConfig {
  int64_t from_step;
  GateConfig config;
  int64_t version;
};

struct ModeWindow {
  RollingWindow step_time{kModeWindowSteps};
  RollingWindow tokens{kModeWindowSteps};
  RollingWindow peak{kModeWindowSteps};
};

void SetDecisionProto(const std::string& job_id, int group, const CachedDecision& c,
                      v1::Decision* d) {
  d->set_job_id(job_id);
  d->set_group(group);
  d->set_step(c.step);
  d->set_mode(ToProto(c.mode));
  d->set_reason(ToProto(c.reason));
  d->set_config_version(c.version);
  d->set_length_cv(c.length_cv);
  d->set_rolling_rs_wait_share(c.rs_wait);
  *d->mutable_decide_time() = ToTimestamp(c.time);
}

}  // namespace

struct GateState::Group {
  int index = 0;
  int size = 1;
  GroupGateState gate;
  RollingWindow rs_wait{50}, all_gather{50}, norm_stall{50};
  std::vector<CachedDecision> cache;
  std::vector<ScheduledConfig> schedule;  // ascending from_step, never empty
  PendingStep pending[kPendingSlots];
  std::map<int, Rank> ranks;
  std::optional<PinState> pin;
  absl::Time last_activity;
  std::unique_ptr<GroupMetrics> metrics;

  // The config in force at `step`, without pruning (telemetry of older steps).
  const GateConfig& ConfigAt(int64_t step) const {
    size_t i = schedule.size() - 1;
    while (i > 0 && schedule[i].from_step > step) --i;
    return schedule[i].config;
  }

  const ScheduledConfig& ConfigFor(int64_t step) {
    size_t i = schedule.size() - 1;
    while (i > 0 && schedule[i].from_step > step) --i;
    // Steps only increase, so entries before the one in force are dead.
    if (i > 0) schedule.erase(schedule.begin(), schedule.begin() + static_cast<long>(i));
    return schedule.front();
  }
};

struct GateState::Job {
  std::string id;
  v1::GateConfig overrides;
  int64_t version = 0;  // of the job scope; 0 = never set
  absl::Time update_time;
  GateConfig effective;
  int64_t effective_version = 0;
  std::map<int, std::unique_ptr<Group>> groups;
  std::optional<PinState> pin;
  ModeWindow modes[kModeSlots];
  int64_t decisions[kModeSlots][kNumReasons] = {};
  int64_t local_decisions = 0;
  absl::flat_hash_map<std::string, std::weak_ptr<SessionSink>> sinks;
  uint64_t memory_budget = 0;
  absl::Time last_activity;
  std::unique_ptr<JobMetrics> metrics;

  bool has_operator_state() const { return version > 0 || pin.has_value(); }
};

GateState::GateState(StateOptions options, Metrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {}

GateState::~GateState() = default;

absl::StatusOr<std::unique_ptr<GateState>> GateState::Create(StateOptions options,
                                                             Metrics* metrics,
                                                             v1::GateConfig file_layer) {
  if (!options.clock) options.clock = [] { return absl::Now(); };
  if (options.decision_cache_steps < 1) options.decision_cache_steps = 1;
  std::optional<v1::PersistedState> persisted;
  if (!options.state_dir.empty()) {
    if (::mkdir(options.state_dir.c_str(), 0750) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir ", options.state_dir, ": cannot create: ", std::strerror(errno)));
    }
    ASSIGN_OR_RETURN(persisted, LoadPersistedState(options.state_dir));
  }
  std::unique_ptr<GateState> state(new GateState(std::move(options), metrics));
  GateState& s = *state;
  MutexLock lock(&s.mu_);
  const absl::Time now = s.Now();
  s.file_layer_ = std::move(file_layer);
  if (persisted.has_value()) {
    s.version_counter_ = persisted->version_counter();
    s.global_overrides_ = persisted->global_overrides();
    s.global_version_ = persisted->global_version();
  }
  s.global_update_time_ = persisted.has_value() && persisted->has_global_update_time()
                              ? FromTimestamp(persisted->global_update_time())
                              : now;
  v1::GateConfig global_layer = s.file_layer_;
  global_layer.MergeFrom(s.global_overrides_);
  if (absl::Status v = ValidateGateConfig(LayerGateConfig(GateConfig{}, global_layer)); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the --config file combined with the persisted global overrides is invalid: ",
        v.message()));
  }
  const bool file_changed =
      persisted.has_value()
          ? persisted->file_layer().SerializeAsString() != s.file_layer_.SerializeAsString()
          : s.file_layer_.ByteSizeLong() > 0;
  if (file_changed) s.global_version_ = ++s.version_counter_;
  s.global_effective_ = LayerGateConfig(GateConfig{}, global_layer);
  if (file_changed) s.global_update_time_ = now;
  if (persisted.has_value()) {
    for (const auto& j : persisted->jobs()) {
      ASSIGN_OR_RETURN(Job * job, s.FindOrCreateJob(j.job_id()));
      job->overrides = j.overrides();
      job->version = j.version();
      job->update_time = j.has_update_time() ? FromTimestamp(j.update_time()) : now;
    }
    for (const auto& p : persisted->pins()) {
      const absl::Time expire = FromTimestamp(p.expire_time());
      if (expire <= now || !IsValidMode(p.mode())) continue;
      ASSIGN_OR_RETURN(Job * job, s.FindOrCreateJob(p.job_id()));
      if (p.has_group()) {
        ASSIGN_OR_RETURN(Group * g, s.FindOrCreateGroup(*job, p.group()));
        g->pin = PinState{FromProto(p.mode()), expire};
      } else {
        job->pin = PinState{FromProto(p.mode()), expire};
      }
    }
    if (absl::Status v = s.ValidateAllJobs(global_layer); !v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "persisted job overrides are invalid under the current --config: ", v.message()));
    }
  }
  if (s.metrics_ != nullptr) s.metrics_->SetGlobalThresholds(s.global_effective_, s.global_version_);
  std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>> none;
  s.ScheduleConfig(nullptr, &none);
  return state;
}

absl::StatusOr<GateState::Job*> GateState::FindOrCreateJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) return it->second.get();
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job %s: the daemon already tracks %d jobs (--max_jobs)", job_id, options_.max_jobs));
  }
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->effective = global_effective_;
  job->effective_version = global_version_;
  job->last_activity = Now();
  if (metrics_ != nullptr) {
    job->metrics = std::make_unique<JobMetrics>(*metrics_, job_id);
    job->metrics->SetThresholds(job->effective, job->effective_version);
  }
  Job* raw = job.get();
  jobs_.emplace(job_id, std::move(job));
  return raw;
}

absl::StatusOr<GateState::Group*> GateState::FindOrCreateGroup(Job& job, int group) {
  auto it = job.groups.find(group);
  if (it != job.groups.end()) return it->second.get();
  if (group < 0 || group >= options_.max_groups_per_job) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group: must be in [0, %d), got %d", options_.max_groups_per_job, group));
  }
  auto g = std::make_unique<Group>();
  g->index = group;
  g->cache.resize(static_cast<size_t>(options_.decision_cache_steps));
  g->schedule.push_back({kNoStep, job.effective, job.effective_version});
  const int64_t window = job.effective.window_steps;
  g->rs_wait.Resize(window);
  g->all_gather.Resize(window);
  g->norm_stall.Resize(window);
  g->last_activity = Now();
  if (metrics_ != nullptr) g->metrics = std::make_unique<GroupMetrics>(*metrics_, job.id, group);
  Group* raw = g.get();
  job.groups.emplace(group, std::move(g));
  return raw;
}

GateConfig GateState::EffectiveConfig(const Job* job) const {
  return job == nullptr ? global_effective_ : job->effective;
}

int64_t GateState::EffectiveVersion(const Job* job) const {
  return job == nullptr ? global_version_ : std::max(global_version_, job->version);
}

v1::VersionedGateConfig GateState::Versioned(const Job* job) const {
  v1::VersionedGateConfig out;
  if (job != nullptr) out.set_job_id(job->id);
  *out.mutable_config() = ToProto(EffectiveConfig(job));
  *out.mutable_overrides() = job == nullptr ? global_overrides_ : job->overrides;
  out.set_version(job == nullptr ? global_version_ : job->version);
  out.set_effective_version(EffectiveVersion(job));
  *out.mutable_update_time() =
      ToTimestamp(job == nullptr || job->version == 0 ? global_update_time_ : job->update_time);
  return out;
}

std::optional<Mode> GateState::ActivePin(const Job& job, int group) const {
  const absl::Time now = Now();
  auto it = job.groups.find(group);
  if (it != job.groups.end() && it->second->pin && it->second->pin->expire > now) {
    return it->second->pin->mode;
  }
  if (job.pin && job.pin->expire > now) return job.pin->mode;
  return std::nullopt;
}

absl::StatusOr<GateState::Job*> GateState::FindJob(const std::string& job_id,
                                                   std::optional<int> group) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  if (group.has_value() && !it->second->groups.contains(*group)) {
    return absl::NotFoundError(absl::StrFormat("group: job %s has no group %d", job_id, *group));
  }
  return it->second.get();
}

void GateState::ScheduleConfig(
    const Job* only, std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>>* pushes) {
  for (auto& [id, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (only != nullptr && &job != only) continue;
    const GateConfig effective = LayerGateConfig(global_effective_, job.overrides);
    const int64_t version = EffectiveVersion(&job);
    if (effective == job.effective && version == job.effective_version) continue;
    job.effective = effective;
    job.effective_version = version;
    if (job.metrics) job.metrics->SetThresholds(effective, version);
    v1::ConfigUpdate update;
    *update.mutable_config() = Versioned(&job);
    for (auto& [gi, g] : job.groups) {
      const int64_t from =
          g->gate.has_decision ? g->gate.last_step + options_.config_lead_steps : kNoStep;
      if (g->schedule.back().from_step >= from) {
        g->schedule.back() = {from, effective, version};
      } else {
        g->schedule.push_back({from, effective, version});
      }
    }
    for (auto it = job.sinks.begin(); it != job.sinks.end();) {
      std::shared_ptr<SessionSink> sink = it->second.lock();
      if (!sink) {
        job.sinks.erase(it++);
        continue;
      }
      auto sit = sessions_.find(it->first);
      int64_t from = 0;
      if (sit != sessions_.end()) {
        auto git = job.groups.find(sit->second->group);
        if (git != job.groups.end()) from = std::max<int64_t>(0, git->second->schedule.back().from_step);
      }
      update.set_effective_from_step(from);
      pushes->emplace_back(std::move(sink), update);
      ++it;
    }
  }
}

absl::Status GateState::ValidateAllJobs(const v1::GateConfig& global_layer) const {
  const GateConfig global = LayerGateConfig(GateConfig{}, global_layer);
  for (const auto& [id, job] : jobs_) {
    if (job->overrides.ByteSizeLong() == 0) continue;
    absl::Status s = ValidateGateConfig(LayerGateConfig(global, job->overrides));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.message(), " (effective config of job ", id, ")"));
    }
  }
  return absl::OkStatus();
}

void GateState::Deliver(
    std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>>& pushes) {
  for (auto& [sink, update] : pushes) sink->PushConfig(update);
}

// ---------------------------------------------------------------------------------------
// Worker API

absl::StatusOr<v1::RegisterResponse> GateState::Register(const v1::RegisterRequest& r) {
  if (draining()) return absl::UnavailableError("spgated is shutting down");
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  if (r.group_size() < 1 || r.group_size() > options_.max_group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size: must be in [1, %d], got %d", options_.max_group_size, r.group_size()));
  }
  if (r.rank_in_group() < 0 || r.rank_in_group() >= r.group_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank_in_group: must be in [0, group_size=%d), got %d", r.group_size(), r.rank_in_group()));
  }
  if (r.global_rank() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("global_rank: must be >= 0, got %d", r.global_rank()));
  }
  absl::BitGen gen;
  auto session = std::make_shared<Session>();
  session->id = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                                absl::Uniform<uint64_t>(gen));
  session->job_id = r.job_id();
  session->group = r.group();
  session->rank_in_group = r.rank_in_group();

  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(r.job_id()));
  ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(*job, r.group()));
  if (g->size != r.group_size()) {
    const bool others_alive = std::any_of(g->ranks.begin(), g->ranks.end(), [&](const auto& kv) {
      return kv.first != r.rank_in_group() && Now() - kv.second.last_seen < options_.stale_after;
    });
    if (others_alive && g->size > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "group_size: %d differs from the size %d that group %d of job %s registered with",
          r.group_size(), g->size, r.group(), r.job_id()));
    }
    g->size = r.group_size();
  }
  const absl::Time now = Now();
  Rank& rank = g->ranks[r.rank_in_group()];
  rank.global_rank = r.global_rank();
  rank.host = r.host();
  rank.last_seen = now;
  g->last_activity = job->last_activity = now;
  if (r.memory_budget_bytes() > 0) {
    job->memory_budget = r.memory_budget_bytes();
    if (job->metrics) job->metrics->memory_budget->Set(static_cast<double>(job->memory_budget));
  }
  sessions_[session->id] = session;

  v1::RegisterResponse resp;
  resp.set_session_id(session->id);
  *resp.mutable_config() = Versioned(job);
  resp.set_effective_from_step(std::max<int64_t>(0, g->schedule.back().from_step));
  resp.mutable_heartbeat_interval()->set_seconds(
      absl::ToInt64Seconds(options_.heartbeat_interval));
  resp.mutable_heartbeat_interval()->set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(options_.heartbeat_interval) % 1'000'000'000));
  resp.set_last_decided_step(g->gate.has_decision ? g->gate.last_step : -1);
  return resp;
}

absl::StatusOr<std::shared_ptr<Session>> GateState::AttachSession(const std::string& session_id,
                                                                  std::weak_ptr<SessionSink> sink) {
  if (draining()) return absl::UnavailableError("spgated is shutting down");
  MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "session_id: unknown session \"", session_id, "\" (register again)"));
  }
  std::shared_ptr<Session> session = it->second;
  auto jit = jobs_.find(session->job_id);
  if (jit == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", session->job_id, " was forgotten; register again"));
  }
  Job& job = *jit->second;
  job.sinks[session_id] = std::move(sink);
  auto git = job.groups.find(session->group);
  if (git != job.groups.end()) {
    Rank& rank = git->second->ranks[session->rank_in_group];
    ++rank.streams;
    rank.last_seen = Now();
  }
  return session;
}

void GateState::DetachSession(const Session& session, const SessionSink* sink) {
  MutexLock lock(&mu_);
  auto jit = jobs_.find(session.job_id);
  if (jit == jobs_.end()) return;
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
  if (jit == jobs_.end()) return;
  auto git = jit->second->groups.find(session.group);
  if (git == jit->second->groups.end()) return;
  auto rit = git->second->ranks.find(session.rank_in_group);
  if (rit != git->second->ranks.end()) rit->second.last_seen = Now();
}

absl::Status GateState::Decide(const v1::BatchPlan& plan, v1::Decision* out) {
  RETURN_IF_ERROR(ValidateJobId(plan.job_id()));
  if (plan.step() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("step: must be >= 0, got %d", plan.step()));
  }
  // The per-sequence work happens before the lock.
  absl::StatusOr<LengthStats> stats = ComputeLengthStats(
      std::span<const int64_t>(plan.lengths().data(), static_cast<size_t>(plan.lengths_size())));
  if (!stats.ok()) return stats.status();

  CachedDecision decision;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(plan.job_id()));
    ASSIGN_OR_RETURN(Group * g, FindOrCreateGroup(*job, plan.group()));
    CachedDecision& slot =
        g->cache[static_cast<size_t>(plan.step() % options_.decision_cache_steps)];
    if (slot.step == plan.step()) {
      SetDecisionProto(plan.job_id(), plan.group(), slot, out);  // a retry: same answer
      return absl::OkStatus();
    }
    if (g->gate.has_decision && plan.step() <= g->gate.last_step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "step: %d is not after group %d's last decided step %d and is no longer cached; "
          "steps must increase",
          plan.step(), plan.group(), g->gate.last_step));
    }
    const ScheduledConfig& config = g->ConfigFor(plan.step());
    const BatchFacts facts{.step = plan.step(),
                           .length_cv = stats->cv,
                           .predicted_peak_bytes_sp = plan.predicted_peak_bytes_sp(),
                           .predicted_peak_bytes_tp = plan.predicted_peak_bytes_tp(),
                           .memory_budget_bytes = plan.memory_budget_bytes()};
    const RsWaitObservation rs{g->rs_wait.Mean(), g->rs_wait.size()};
    const Mode previous = g->gate.mode;
    const bool had_decision = g->gate.has_decision;
    const GateOutcome outcome =
        spgate::EvaluateGates(config.config, g->gate, facts, rs, ActivePin(*job, plan.group()));
    g->gate = outcome.next;
    if (outcome.reset_rs_wait_window) g->rs_wait.Clear();
    decision = CachedDecision{plan.step(),          outcome.decision.mode,
                              outcome.decision.reason, config.version,
                              stats->cv,            rs.mean,
                              Now()};
    slot = decision;
    g->last_activity = job->last_activity = decision.time;
    ++job->decisions[static_cast<int>(decision.mode)][static_cast<int>(decision.reason)];
    if (plan.memory_budget_bytes() > 0 && plan.memory_budget_bytes() != job->memory_budget) {
      job->memory_budget = plan.memory_budget_bytes();
      if (job->metrics) job->metrics->memory_budget->Set(static_cast<double>(job->memory_budget));
    }
    if (job->metrics) {
      job->metrics->Decisions(decision.mode, decision.reason).Increment();
      job->metrics->length_cv->Observe(stats->cv);
    }
    if (g->metrics && (!had_decision || previous != decision.mode)) {
      g->metrics->SetMode(decision.mode);
      if (had_decision) g->metrics->mode_switches->Increment();
    }
  }
  SetDecisionProto(plan.job_id(), plan.group(), decision, out);
  if (watcher_count_.load(std::memory_order_relaxed) > 0) {
    MutexLock lock(&watch_mu_);
    for (const auto& w : watchers_) {
      if (w->job_filter().empty() || w->job_filter() == plan.job_id()) w->OnDecision(*out);
    }
  }
  return absl::OkStatus();
}

absl::Status GateState::RecordTelemetry(Session& session, const v1::StepTelemetry& t) {
  auto reject = [&](absl::Status s) {
    if (metrics_ != nullptr) metrics_->telemetry_rejected.Increment();
    return s;
  };
  if (t.job_id() != session.job_id || t.group() != session.group ||
      t.rank_in_group() != session.rank_in_group) {
    return reject(absl::InvalidArgumentError(absl::StrFormat(
        "telemetry: (job_id=%s, group=%d, rank_in_group=%d) does not match the session's "
        "(%s, %d, %d)",
        t.job_id(), t.group(), t.rank_in_group(), session.job_id, session.group,
        session.rank_in_group)));
  }
  if (t.step() < 0) return reject(absl::InvalidArgumentError("telemetry.step: must be >= 0"));
  if (!IsValidMode(t.mode())) {
    return reject(absl::InvalidArgumentError("telemetry.mode: must be SEQUENCE_PARALLEL or "
                                             "TENSOR_PARALLEL_ONLY"));
  }
  if (!std::isfinite(t.step_time_s()) || t.step_time_s() <= 0) {
    return reject(absl::InvalidArgumentError(
        absl::StrFormat("telemetry.step_time_s: must be finite and > 0, got %g", t.step_time_s())));
  }
  for (auto [name, v] : {std::pair{"rs_wait_s", t.rs_wait_s()},
                         std::pair{"all_gather_s", t.all_gather_s()},
                         std::pair{"norm_stall_s", t.norm_stall_s()}}) {
    if (!FiniteNonNegative(v)) {
      return reject(absl::InvalidArgumentError(
          absl::StrFormat("telemetry.%s: must be finite and >= 0, got %g", name, v)));
    }
  }
  if (t.effective_tokens() < 0 || t.padding_tokens() < 0) {
    return reject(absl::InvalidArgumentError("telemetry: token counts must be >= 0"));
  }
  session.telemetry_received.fetch_add(1, std::memory_order_relaxed);
  if (metrics_ != nullptr) metrics_->telemetry_received.Increment();

  MutexLock lock(&mu_);
  auto jit = jobs_.find(session.job_id);
  if (jit == jobs_.end()) return absl::OkStatus();
  Job& job = *jit->second;
  auto git = job.groups.find(session.group);
  if (git == job.groups.end()) return absl::OkStatus();
  Group& g = *git->second;
  auto rit = g.ranks.find(session.rank_in_group);
  if (rit != g.ranks.end()) rit->second.last_seen = Now();

  const int slot = static_cast<int>(t.step() % kPendingSlots);
  PendingStep& p = g.pending[slot];
  if (p.step != t.step()) {
    if (p.step > t.step()) return absl::OkStatus();  // older than the aggregation window
    if (p.step != kNoStep && !p.finalized) FinalizeStep(job, g, slot);
    p = PendingStep{};
    p.step = t.step();
  } else if (p.finalized) {
    return absl::OkStatus();  // every rank already reported; a duplicate
  }
  const double step_time = t.step_time_s();
  ++p.reported;
  p.mode = FromProto(t.mode());
  p.step_time = std::max(p.step_time, step_time);
  p.rs_share = std::max(p.rs_share, std::min(1.0, t.rs_wait_s() / step_time));
  p.all_gather = std::max(p.all_gather, t.all_gather_s());
  p.norm_share = std::max(p.norm_share, std::min(1.0, t.norm_stall_s() / step_time));
  p.tokens = std::max(p.tokens, t.effective_tokens());
  p.padding = std::max(p.padding, t.padding_tokens());
  p.peak = std::max(p.peak, t.peak_memory_bytes());
  if (p.reported >= g.size) FinalizeStep(job, g, slot);
  return absl::OkStatus();
}

void GateState::FinalizeStep(Job& job, Group& g, int slot) {
  PendingStep& p = g.pending[slot];
  p.finalized = true;
  const int m = static_cast<int>(p.mode);
  if (p.mode == Mode::kSequenceParallel) {
    const int64_t window = g.ConfigAt(p.step).window_steps;
    g.rs_wait.Resize(window);
    g.all_gather.Resize(window);
    g.norm_stall.Resize(window);
    // Plans are pipelined, so a step decided before the RS_WAIT fallback began can
    // report after the window was cleared; its sample belongs to the past, not to the
    // probes that decide when SP resumes.
    if (!(g.gate.rs_wait_fallback && p.step < g.gate.rs_wait_changed_step)) {
      g.rs_wait.Push(p.rs_share);
    }
    g.all_gather.Push(p.all_gather);
    g.norm_stall.Push(p.norm_share);
    if (g.metrics) {
      g.metrics->rs_wait_share->Set(g.rs_wait.Mean());
      g.metrics->all_gather_tail->Set(g.all_gather.Quantile(0.95));
      g.metrics->norm_stall_ratio->Set(g.norm_stall.Mean());
    }
  }
  ModeWindow& w = job.modes[m];
  w.step_time.Push(p.step_time);
  w.tokens.Push(static_cast<double>(p.tokens));
  w.peak.Push(static_cast<double>(p.peak));
  if (job.metrics) {
    job.metrics->step_duration[m]->Observe(p.step_time);
    job.metrics->effective_tokens[m]->Increment(static_cast<double>(p.tokens));
    job.metrics->padding_tokens[m]->Increment(static_cast<double>(p.padding));
    job.metrics->peak_memory[m]->Set(w.peak.Max());
  }
}

int64_t GateState::Heartbeat(Session& session, const v1::Heartbeat& hb) {
  MutexLock lock(&mu_);
  auto jit = jobs_.find(session.job_id);
  if (jit != jobs_.end()) {
    Job& job = *jit->second;
    for (const auto& c : hb.local_decisions()) {
      if (!IsValidReason(c.reason()) || c.count() < 0) continue;
      int64_t& seen = session.local_seen[c.reason()];
      // A restarted worker process starts again from zero: count it all.
      const int64_t delta = c.count() >= seen ? c.count() - seen : c.count();
      seen = c.count();
      if (delta > 0) {
        job.local_decisions += delta;
        if (job.metrics) {
          job.metrics->LocalDecisions(FromProto(c.reason())).Increment(static_cast<double>(delta));
        }
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

// ---------------------------------------------------------------------------------------
// Admin API

absl::StatusOr<v1::VersionedGateConfig> GateState::GetGateConfig(const std::string& job_id) {
  ReaderMutexLock lock(&mu_);
  if (job_id.empty()) return Versioned(nullptr);
  ASSIGN_OR_RETURN(const Job* job, FindJob(job_id));
  return Versioned(job);
}

v1::PersistedState GateState::Snapshot() const {
  v1::PersistedState s;
  s.set_version_counter(version_counter_);
  *s.mutable_global_overrides() = global_overrides_;
  s.set_global_version(global_version_);
  *s.mutable_file_layer() = file_layer_;
  *s.mutable_global_update_time() = ToTimestamp(global_update_time_);
  std::vector<const Job*> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  std::sort(jobs.begin(), jobs.end(), [](const Job* a, const Job* b) { return a->id < b->id; });
  const absl::Time now = Now();
  for (const Job* job : jobs) {
    if (job->version > 0) {
      auto* j = s.add_jobs();
      j->set_job_id(job->id);
      *j->mutable_overrides() = job->overrides;
      j->set_version(job->version);
      *j->mutable_update_time() = ToTimestamp(job->update_time);
    }
    auto add_pin = [&](const PinState& p, std::optional<int> group) {
      if (p.expire <= now) return;
      auto* pin = s.add_pins();
      pin->set_job_id(job->id);
      if (group) pin->set_group(*group);
      pin->set_mode(ToProto(p.mode));
      *pin->mutable_expire_time() = ToTimestamp(p.expire);
    };
    if (job->pin) add_pin(*job->pin, std::nullopt);
    for (const auto& [gi, g] : job->groups) {
      if (g->pin) add_pin(*g->pin, gi);
    }
  }
  return s;
}

absl::Status GateState::Persist(const v1::PersistedState& next) {
  if (options_.state_dir.empty()) return absl::OkStatus();
  absl::Status s = SavePersistedState(options_.state_dir, next);
  if (!s.ok()) {
    if (metrics_ != nullptr) metrics_->state_persist_failures.Increment();
    return absl::UnavailableError(absl::StrCat(
        "could not persist the change to ", StateFilePath(options_.state_dir), ": ",
        s.message(), "; nothing was changed"));
  }
  return absl::OkStatus();
}

absl::Status GateState::Flush() {
  MutexLock plock(&persist_mu_);
  v1::PersistedState snapshot;
  {
    ReaderMutexLock lock(&mu_);
    snapshot = Snapshot();
  }
  return Persist(snapshot);
}

absl::StatusOr<v1::VersionedGateConfig> GateState::UpdateGateConfig(
    const v1::UpdateGateConfigRequest& r) {
  auto invalid = [&](absl::Status s) {
    if (metrics_ != nullptr) metrics_->config_updates_invalid.Increment();
    return s;
  };
  if (!r.job_id().empty()) {
    if (absl::Status s = ValidateJobId(r.job_id()); !s.ok()) return invalid(s);
  }
  MutexLock plock(&persist_mu_);
  v1::PersistedState next;
  v1::GateConfig new_overrides;
  int64_t new_version = 0;
  absl::Time update_time;
  {
    ReaderMutexLock lock(&mu_);
    const Job* job = nullptr;
    if (!r.job_id().empty()) {
      auto it = jobs_.find(r.job_id());
      if (it != jobs_.end()) job = it->second.get();
      else if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
        return absl::ResourceExhaustedError("too many jobs (--max_jobs)");
      }
    }
    const int64_t scope_version = r.job_id().empty() ? global_version_ : (job ? job->version : 0);
    if (r.has_expected_version() && r.expected_version() != scope_version) {
      if (metrics_ != nullptr) metrics_->config_updates_conflict.Increment();
      return absl::AbortedError(absl::StrFormat(
          "version conflict: expected_version %d, but the %s config is at version %d; "
          "read it again and retry",
          r.expected_version(), r.job_id().empty() ? "global" : "job " + r.job_id(),
          scope_version));
    }
    new_overrides = r.job_id().empty() ? global_overrides_
                                       : (job ? job->overrides : v1::GateConfig());
    if (absl::Status s = ApplyFieldMask(r.config(), r.update_mask(), &new_overrides); !s.ok()) {
      return invalid(s);
    }
    if (r.job_id().empty()) {
      v1::GateConfig layer = file_layer_;
      layer.MergeFrom(new_overrides);
      if (absl::Status s = ValidateGateConfig(LayerGateConfig(GateConfig{}, layer)); !s.ok()) {
        return invalid(s);
      }
      if (absl::Status s = ValidateAllJobs(layer); !s.ok()) return invalid(s);
    } else {
      if (absl::Status s = ValidateGateConfig(LayerGateConfig(global_effective_, new_overrides));
          !s.ok()) {
        return invalid(s);
      }
    }
    new_version = version_counter_ + 1;
    update_time = Now();
    next = Snapshot();
    next.set_version_counter(new_version);
    if (r.job_id().empty()) {
      *next.mutable_global_overrides() = new_overrides;
      next.set_global_version(new_version);
      *next.mutable_global_update_time() = ToTimestamp(update_time);
    } else {
      bool found = false;
      for (auto& j : *next.mutable_jobs()) {
        if (j.job_id() == r.job_id()) {
          *j.mutable_overrides() = new_overrides;
          j.set_version(new_version);
          *j.mutable_update_time() = ToTimestamp(update_time);
          found = true;
        }
      }
      if (!found) {
        auto* j = next.add_jobs();
        j->set_job_id(r.job_id());
        *j->mutable_overrides() = new_overrides;
        j->set_version(new_version);
        *j->mutable_update_time() = ToTimestamp(update_time);
      }
    }
  }
  RETURN_IF_ERROR(Persist(next));

  std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>> pushes;
  v1::VersionedGateConfig result;
  {
    MutexLock lock(&mu_);
    version_counter_ = new_version;
    if (r.job_id().empty()) {
      global_overrides_ = new_overrides;
      global_version_ = new_version;
      global_update_time_ = update_time;
      v1::GateConfig layer = file_layer_;
      layer.MergeFrom(global_overrides_);
      global_effective_ = LayerGateConfig(GateConfig{}, layer);
      if (metrics_ != nullptr) metrics_->SetGlobalThresholds(global_effective_, global_version_);
      ScheduleConfig(nullptr, &pushes);
      result = Versioned(nullptr);
    } else {
      ASSIGN_OR_RETURN(Job * job, FindOrCreateJob(r.job_id()));
      job->overrides = new_overrides;
      job->version = new_version;
      job->update_time = update_time;
      ScheduleConfig(job, &pushes);
      result = Versioned(job);
    }
  }
  if (metrics_ != nullptr) metrics_->config_updates_ok.Increment();
  Deliver(pushes);
  return result;
}

absl::Status GateState::ReloadConfigFile(const v1::GateConfig& file_layer) {
  MutexLock plock(&persist_mu_);
  std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>> pushes;
  v1::PersistedState next;
  {
    MutexLock lock(&mu_);
    v1::GateConfig layer = file_layer;
    layer.MergeFrom(global_overrides_);
    const GateConfig effective = LayerGateConfig(GateConfig{}, layer);
    if (absl::Status s = ValidateGateConfig(effective); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("with the API's global overrides on top: ", s.message()));
    }
    RETURN_IF_ERROR(ValidateAllJobs(layer));
    file_layer_ = file_layer;
    if (effective == global_effective_) return absl::OkStatus();
    global_effective_ = effective;
    global_version_ = ++version_counter_;
    global_update_time_ = Now();
    if (metrics_ != nullptr) metrics_->SetGlobalThresholds(global_effective_, global_version_);
    ScheduleConfig(nullptr, &pushes);
    next = Snapshot();
  }
  // Keeps the persisted version counter ahead of every version served.
  (void)Persist(next);
  Deliver(pushes);
  return absl::OkStatus();
}

void GateState::FillGroupStatus(const Job& job, const Group& g, v1::GroupStatus* out) const {
  const absl::Time now = Now();
  out->set_group(g.index);
  out->set_group_size(g.size);
  int active = 0, stale = 0;
  for (const auto& [r, rank] : g.ranks) {
    (now - rank.last_seen > options_.stale_after ? stale : active)++;
  }
  out->set_ranks_active(active);
  out->set_ranks_stale(stale);
  if (g.gate.has_decision) {
    out->set_mode(ToProto(g.gate.mode));
    out->set_reason(ToProto(g.gate.reason));
    out->set_last_step(g.gate.last_step);
  } else {
    out->set_last_step(-1);
  }
  out->set_rolling_rs_wait_share(g.rs_wait.Mean());
  out->set_all_gather_tail_s(g.all_gather.Quantile(0.95));
  out->set_norm_stall_ratio(g.norm_stall.Mean());
  out->set_rs_wait_fallback(g.gate.rs_wait_fallback);
  out->set_mode_switches(g.gate.mode_switches);
  if (g.pin && g.pin->expire > now) {
    auto* pin = out->mutable_pin();
    pin->set_job_id(job.id);
    pin->set_group(g.index);
    pin->set_mode(ToProto(g.pin->mode));
    *pin->mutable_expire_time() = ToTimestamp(g.pin->expire);
  }
}

v1::ListJobsResponse GateState::ListJobs() {
  ReaderMutexLock lock(&mu_);
  std::vector<const Job*> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  std::sort(jobs.begin(), jobs.end(), [](const Job* a, const Job* b) { return a->id < b->id; });
  v1::ListJobsResponse resp;
  for (const Job* job : jobs) {
    auto* s = resp.add_jobs();
    s->set_job_id(job->id);
    s->set_groups(static_cast<int32_t>(job->groups.size()));
    int64_t decided = 0;
    for (int m = 1; m < kModeSlots; ++m) {
      for (int r = 0; r < kNumReasons; ++r) decided += job->decisions[m][r];
    }
    s->set_steps_decided(decided);
    for (const auto& [gi, g] : job->groups) {
      v1::GroupStatus st;
      FillGroupStatus(*job, *g, &st);
      s->set_ranks_active(s->ranks_active() + st.ranks_active());
      s->set_ranks_stale(s->ranks_stale() + st.ranks_stale());
      if (g->gate.has_decision) {
        if (g->gate.mode == Mode::kSequenceParallel) s->set_sp_groups(s->sp_groups() + 1);
        else s->set_tp_groups(s->tp_groups() + 1);
      }
    }
    s->set_config_version(EffectiveVersion(job));
  }
  return resp;
}

absl::StatusOr<v1::Job> GateState::GetJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  v1::ListJobsResponse all = ListJobs();
  ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* found, FindJob(job_id));
  const Job& job = *found;
  v1::Job out;
  for (const auto& s : all.jobs()) {
    if (s.job_id() == job_id) *out.mutable_summary() = s;
  }
  for (const auto& [gi, g] : job.groups) FillGroupStatus(job, *g, out.add_groups());
  const ModeWindow& tp = job.modes[static_cast<int>(Mode::kTensorParallelOnly)];
  const double tp_tps = tp.step_time.Sum() > 0 ? tp.tokens.Sum() / tp.step_time.Sum() : 0;
  const double tp_p95 = tp.step_time.Quantile(0.95);
  const double tp_peak = tp.peak.Max();
  for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const ModeWindow& w = job.modes[static_cast<int>(mode)];
    auto* ms = out.add_mode_stats();
    ms->set_mode(ToProto(mode));
    ms->set_steps(w.step_time.size());
    const double tps = w.step_time.Sum() > 0 ? w.tokens.Sum() / w.step_time.Sum() : 0;
    ms->set_effective_tokens_per_s(tps);
    ms->set_step_time_p95_s(w.step_time.Quantile(0.95));
    ms->set_peak_memory_bytes(static_cast<uint64_t>(w.peak.Max()));
    if (!tp.step_time.empty() && !w.step_time.empty()) {
      ms->set_tokens_per_s_vs_tp(tp_tps > 0 ? tps / tp_tps : 0);
      ms->set_step_time_p95_vs_tp(tp_p95 > 0 ? ms->step_time_p95_s() / tp_p95 : 0);
      ms->set_peak_memory_vs_tp(tp_peak > 0 ? w.peak.Max() / tp_peak : 0);
    }
  }
  for (int m = 1; m < kModeSlots; ++m) {
    for (int r = 1; r < kNumReasons; ++r) {
      if (job.decisions[m][r] == 0) continue;
      auto* d = out.add_decisions();
      d->set_mode(static_cast<v1::Mode>(m));
      d->set_reason(static_cast<v1::Reason>(r));
      d->set_count(job.decisions[m][r]);
    }
  }
  *out.mutable_config() = Versioned(&job);
  const absl::Time now = Now();
  if (job.pin && job.pin->expire > now) {
    auto* p = out.add_pins();
    p->set_job_id(job.id);
    p->set_mode(ToProto(job.pin->mode));
    *p->mutable_expire_time() = ToTimestamp(job.pin->expire);
  }
  for (const auto& g : out.groups()) {
    if (g.has_pin()) *out.add_pins() = g.pin();
  }
  out.set_local_decisions(job.local_decisions);
  return out;
}

absl::StatusOr<v1::Pin> GateState::PinMode(const v1::PinModeRequest& r) {
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  if (!IsValidMode(r.mode())) {
    return absl::InvalidArgumentError(
        "mode: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY");
  }
  const absl::Duration d =
      absl::Seconds(r.duration().seconds()) + absl::Nanoseconds(r.duration().nanos());
  if (d <= absl::ZeroDuration() || d > absl::Hours(24 * 7)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "duration: must be > 0 and at most 7 days, got ", absl::FormatDuration(d)));
  }
  MutexLock plock(&persist_mu_);
  v1::PersistedState next;
  v1::Pin pin;
  {
    ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(FindJob(r.job_id(), GroupOf(r)).status());
    pin.set_job_id(r.job_id());
    if (r.has_group()) pin.set_group(r.group());
    pin.set_mode(r.mode());
    *pin.mutable_expire_time() = ToTimestamp(Now() + d);
    next = Snapshot();
    for (auto pit = next.mutable_pins()->begin(); pit != next.mutable_pins()->end();) {
      if (pit->job_id() == r.job_id() && pit->has_group() == r.has_group() &&
          (!r.has_group() || pit->group() == r.group())) {
        pit = next.mutable_pins()->erase(pit);
      } else {
        ++pit;
      }
    }
    *next.add_pins() = pin;
  }
  RETURN_IF_ERROR(Persist(next));
  MutexLock lock(&mu_);
  // Sweep may have forgotten the job while the file was written; the pin is persisted,
  // so it applies again after a restart either way.
  ASSIGN_OR_RETURN(Job * job, FindJob(r.job_id(), GroupOf(r)));
  const PinState state{FromProto(r.mode()), FromTimestamp(pin.expire_time())};
  if (r.has_group()) {
    job->groups.at(r.group())->pin = state;
  } else {
    job->pin = state;
  }
  return pin;
}

absl::StatusOr<v1::UnpinResponse> GateState::Unpin(const v1::UnpinRequest& r) {
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  MutexLock plock(&persist_mu_);
  v1::PersistedState next;
  {
    ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(FindJob(r.job_id(), GroupOf(r)).status());
    next = Snapshot();
    for (auto pit = next.mutable_pins()->begin(); pit != next.mutable_pins()->end();) {
      const bool match = pit->job_id() == r.job_id() &&
                         (!r.has_group() || (pit->has_group() && pit->group() == r.group()));
      pit = match ? next.mutable_pins()->erase(pit) : pit + 1;
    }
  }
  RETURN_IF_ERROR(Persist(next));
  MutexLock lock(&mu_);
  v1::UnpinResponse resp;
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end()) return resp;
  Job& job = *it->second;
  const absl::Time now = Now();
  auto drop = [&](std::optional<PinState>& p) {
    if (p && p->expire > now) resp.set_removed(resp.removed() + 1);
    p.reset();
  };
  if (!r.has_group()) drop(job.pin);
  for (auto& [gi, g] : job.groups) {
    if (!r.has_group() || gi == r.group()) drop(g->pin);
  }
  return resp;
}

absl::StatusOr<v1::EvaluateGatesResponse> GateState::EvaluateGates(
    const v1::EvaluateGatesRequest& r) {
  absl::StatusOr<LengthStats> stats = ComputeLengthStats(
      std::span<const int64_t>(r.lengths().data(), static_cast<size_t>(r.lengths_size())));
  if (!stats.ok()) return stats.status();
  if (r.has_rs_wait_share() &&
      (!std::isfinite(r.rs_wait_share()) || r.rs_wait_share() < 0 || r.rs_wait_share() > 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rs_wait_share: must be finite and in [0, 1], got %g", r.rs_wait_share()));
  }
  ReaderMutexLock lock(&mu_);
  const Job* job = nullptr;
  if (!r.job_id().empty()) {
    ASSIGN_OR_RETURN(job, FindJob(r.job_id(), GroupOf(r)));
  }
  const GateConfig config = LayerGateConfig(EffectiveConfig(job), r.config());
  RETURN_IF_ERROR(ValidateGateConfig(config));
  GroupGateState gate;
  RsWaitObservation rs;
  std::optional<Mode> pin;
  int64_t step = 0;
  if (r.has_group()) {
    if (job == nullptr) return absl::InvalidArgumentError("group: needs job_id");
    const Group& g = *job->groups.at(r.group());
    gate = g.gate;
    rs = {g.rs_wait.Mean(), g.rs_wait.size()};
    pin = ActivePin(*job, r.group());
    step = g.gate.has_decision ? g.gate.last_step + 1 : 0;
  }
  if (r.has_rs_wait_share()) rs = {r.rs_wait_share(), 1};
  const BatchFacts facts{.step = step,
                         .length_cv = stats->cv,
                         .predicted_peak_bytes_sp = r.predicted_peak_bytes_sp(),
                         .predicted_peak_bytes_tp = r.predicted_peak_bytes_tp(),
                         .memory_budget_bytes = r.memory_budget_bytes()};
  std::vector<GateCheck> trace;
  const GateOutcome outcome = spgate::EvaluateGates(config, gate, facts, rs, pin, &trace);
  v1::EvaluateGatesResponse resp;
  CachedDecision d{step, outcome.decision.mode, outcome.decision.reason,
                   job ? EffectiveVersion(job) : global_version_, stats->cv, rs.mean, Now()};
  SetDecisionProto(r.job_id(), r.has_group() ? r.group() : 0, d, resp.mutable_decision());
  for (const GateCheck& c : trace) {
    auto* out = resp.add_checks();
    out->set_gate(c.gate);
    out->set_outcome(c.outcome);
    out->set_observed(c.observed);
    out->set_threshold(c.threshold);
    out->set_detail(c.detail);
  }
  *resp.mutable_config_used() = ToProto(config);
  return resp;
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

void GateState::Sweep() {
  MutexLock lock(&mu_);
  const absl::Time now = Now();
  for (auto jit = jobs_.begin(); jit != jobs_.end();) {
    Job& job = *jit->second;
    int active = 0, stale = 0, ranks = 0;
    if (job.pin && job.pin->expire <= now) job.pin.reset();
    for (auto& [gi, g] : job.groups) {
      if (g->pin && g->pin->expire <= now) g->pin.reset();
      for (auto rit = g->ranks.begin(); rit != g->ranks.end();) {
        const absl::Duration silent = now - rit->second.last_seen;
        if (rit->second.streams == 0 && silent > options_.forget_after) {
          rit = g->ranks.erase(rit);
          continue;
        }
        (silent > options_.stale_after ? stale : active)++;
        ++ranks;
        ++rit;
      }
    }
    if (job.metrics) {
      job.metrics->workers_active->Set(active);
      job.metrics->workers_stale->Set(stale);
    }
    if (ranks == 0 && !job.has_operator_state() && now - job.last_activity > options_.forget_after) {
      for (auto sit = sessions_.begin(); sit != sessions_.end();) {
        if (sit->second->job_id == job.id) sessions_.erase(sit++);
        else ++sit;
      }
      jobs_.erase(jit++);
      continue;
    }
    ++jit;
  }
  // Sessions whose rank was forgotten.
  for (auto sit = sessions_.begin(); sit != sessions_.end();) {
    const Session& s = *sit->second;
    auto jit = jobs_.find(s.job_id);
    bool keep = false;
    if (jit != jobs_.end()) {
      auto git = jit->second->groups.find(s.group);
      keep = git != jit->second->groups.end() && git->second->ranks.contains(s.rank_in_group);
    }
    if (keep) ++sit;
    else sessions_.erase(sit++);
  }
}

}  // namespace spgate::server
