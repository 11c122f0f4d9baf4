// The daemon's state: jobs -> TP groups -> ranks, per-group gate state and rolling
// statistics, the idempotent decision cache, the layered gate config with versions and
// effective_from_step scheduling, pins, and sessions. One mutex guards it all; the
// critical sections are short (a decision is a cache probe, one EvaluateGates call and a
// few counter increments) and nothing blocking runs under it: persistence has its own
// lock, and pushes to streams and watchers happen after the state lock is released.
// Time comes from an injected clock, so tests drive heartbeats and staleness.
//
// Invariants:
//  - the same (job, group, step) always gets the same decision (the cache answers
//    retries; a step older than the cache or behind the group's last step is refused);
//  - a config change applies to a group from effective_from_step = last decided step + 2
//    on, never to a step already decided;
//  - API changes are persisted before they take effect; a failed write changes nothing.
#ifndef SPGATE_SERVER_GATE_STATE_H_
#define SPGATE_SERVER_GATE_STATE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "absl/time/time.h"
#include "policy/gate_policy.h"
#include "policy/rolling_window.h"
#include "server/metrics.h"
#include "spgate/v1/admin.pb.h"
#include "spgate/v1/gate.pb.h"

namespace spgate::server {

struct StateOptions {
  std::function<absl::Time()> clock;  // required
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration stale_after = absl::Seconds(5);
  absl::Duration forget_after = absl::Minutes(30);  // stale ranks and idle jobs dropped
  int64_t decision_cache_steps = 256;
  int max_jobs = 1024;
  int max_groups_per_job = 4096;
  int max_group_size = 1024;
  int64_t config_lead_steps = 2;
  std::string state_dir;  // empty: not persisted
};

// Where the state pushes config updates for a Connect stream. Implementations must not
// block; they are called without the state lock held.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void PushConfig(const v1::ConfigUpdate& update) = 0;
};

// A WatchDecisions subscriber; OnDecision must not block.
class DecisionWatcher {
 public:
  virtual ~DecisionWatcher() = default;
  virtual void OnDecision(const v1::Decision& decision) = 0;
  const std::string& job_filter() const { return job_filter_; }

 protected:
  explicit DecisionWatcher(std::string job_filter) : job_filter_(std::move(job_filter)) {}

 private:
  std::string job_filter_;
};

// A registered rank's session, shared with its Connect stream.
struct Session {
  std::string id;
  std::string job_id;
  int group = 0;
  int rank_in_group = 0;
  std::atomic<int64_t> telemetry_received{0};
  // Last cumulative local-decision counts seen, by reason (guarded by GateState's lock).
  int64_t local_seen[kNumReasons] = {};
};

class GateState {
 public:
  // `file_layer` is the parsed --config (empty message when none). Loads the state dir.
  static absl::StatusOr<std::unique_ptr<GateState>> Create(StateOptions options, Metrics* metrics,
                                                           v1::GateConfig file_layer);
  ~GateState();

  // --- worker API ---
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Binds a Connect stream to a registered session (NOT_FOUND for an unknown id).
  absl::StatusOr<std::shared_ptr<Session>> AttachSession(const std::string& session_id,
                                                         std::weak_ptr<SessionSink> sink);
  void DetachSession(const Session& session, const SessionSink* sink);
  // Decides (or returns the cached decision for) the plan's (job, group, step).
  absl::Status Decide(const v1::BatchPlan& plan, v1::Decision* decision);
  absl::Status RecordTelemetry(Session& session, const v1::StepTelemetry& telemetry);
  // Returns the telemetry records accepted on the session so far.
  int64_t Heartbeat(Session& session, const v1::Heartbeat& heartbeat);
  void Touch(const Session& session);

  // --- admin API ---
  absl::StatusOr<v1::VersionedGateConfig> GetGateConfig(const std::string& job_id);
  absl::StatusOr<v1::VersionedGateConfig> UpdateGateConfig(const v1::UpdateGateConfigRequest& r);
  absl::Status ReloadConfigFile(const v1::GateConfig& file_layer);
  v1::ListJobsResponse ListJobs();
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::Pin> PinMode(const v1::PinModeRequest& request);
  absl::StatusOr<v1::UnpinResponse> Unpin(const v1::UnpinRequest& request);
  absl::StatusOr<v1::EvaluateGatesResponse> EvaluateGates(const v1::EvaluateGatesRequest& r);

  void AddWatcher(std::shared_ptr<DecisionWatcher> watcher);
  void RemoveWatcher(const DecisionWatcher* watcher);

  // Staleness, pin expiry, forgetting idle jobs, worker gauges.
  void Sweep();
  // Refuses new sessions and streams with UNAVAILABLE (graceful shutdown).
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // Writes the state file if anything changed since the last write.
  absl::Status Flush();

  absl::Time Now() const { return options_.clock(); }
  const StateOptions& options() const { return options_; }

  struct Job;
  struct Group;

 private:
  GateState(StateOptions options, Metrics* metrics);

  absl::StatusOr<Job*> FindOrCreateJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Group*> FindOrCreateGroup(Job& job, int group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GateConfig EffectiveConfig(const Job* job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t EffectiveVersion(const Job* job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  v1::VersionedGateConfig Versioned(const Job* job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // NOT_FOUND naming the job (or the group, when given) if it is not tracked.
  absl::StatusOr<Job*> FindJob(const std::string& job_id, std::optional<int> group = std::nullopt) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::optional<Mode> ActivePin(const Job& job, int group) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Recomputes jobs' effective configs, schedules them on every group and collects the
  // pushes for their sessions. `only` restricts the change to one job.
  void ScheduleConfig(const Job* only, std::vector<std::pair<std::shared_ptr<SessionSink>,
                                                             v1::ConfigUpdate>>* pushes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateAllJobs(const v1::GateConfig& global_layer) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  v1::PersistedState Snapshot() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Persists `next` (under persist_mu_); on failure counts it and returns the error.
  absl::Status Persist(const v1::PersistedState& next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  void FinalizeStep(Job& job, Group& group, int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillGroupStatus(const Job& job, const Group& group, v1::GroupStatus* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Deliver(std::vector<std::pair<std::shared_ptr<SessionSink>, v1::ConfigUpdate>>& pushes);

  const StateOptions options_;
  Metrics* const metrics_;  // may be null in tests
  std::atomic<bool> draining_{false};

  // Serialises admin mutations with their state-file writes.
  Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool dirty_ ABSL_GUARDED_BY(persist_mu_) = false;

  mutable Mutex mu_;
  v1::GateConfig file_layer_ ABSL_GUARDED_BY(mu_);
  v1::GateConfig global_overrides_ ABSL_GUARDED_BY(mu_);
  int64_t version_counter_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t global_version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time global_update_time_ ABSL_GUARDED_BY(mu_);
  GateConfig global_effective_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);

  Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::shared_ptr<DecisionWatcher>> watchers_ ABSL_GUARDED_BY(watch_mu_);
  std::atomic<int> watcher_count_{0};
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_GATE_STATE_H_
