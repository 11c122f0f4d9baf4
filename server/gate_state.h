// The daemon's live state: jobs -> TP groups -> ranks, each group's policy state
// (policy/group_state.h), config schedule and rolling statistics, the idempotent
// decision cache, and the workers' sessions. Who owns each job id (its launch, the
// launch's credential digest, the launches it replaced, the launches file) is the
// LaunchBook's (server/launch_book.h), which Register asks. Domain types only: the
// services translate the wire messages (services.cc, job_views.cc). What operators set
// (configs, pins) lives in the OperatorStore; this state reads it through
// JobOperatorView and is told when it changes (OnOperatorChange).
//
// Locks, in the order they are taken (docs/design.md §4, §10):
//  1. the store's persist lock: the store holds it when it tells the state of a change
//     (OnOperatorChange, OnJobForgotten);
//  2. the launch book's lock (launches_.mu()): held across a launch change — check,
//     launches file written, new launch applied — so that no two interleave; taken by
//     Create, Register, OnJobForgotten and Sweep, never on the decision path;
//  3. mu_: jobs, groups, ranks and sessions (and the Session fields marked so). Its
//     critical sections are short (a decision is a cache probe, one policy step and a
//     few counter increments) and nothing blocking runs under it: the launches file is
//     written before it is taken, pushes to streams and watchers after it is released;
//  4. the store's data lock, a leaf (the operator views are read under mu_).
// Two more leaves are only ever taken alone: watch_mu_ (the watchers, notified after mu_
// is released) and each Session's limiter_mu (its rate limits, taken before mu_). Time
// comes from an injected clock, so tests drive heartbeats and staleness.
//
// Invariants (docs/design.md §4, §10):
//  - the same (job, group, step) always gets the same decision, and only for the plan it
//    was made for (the cache answers retries of the identical plan; a different plan for
//    a decided step, or a step behind the group's last step and no longer cached, is
//    refused);
//  - a launch (job, incarnation) is joined only with its credential, and a new launch
//    takes a job only from a launch whose ranks have gone (the LaunchBook's lease,
//    docs/security.md); a job's live state is of its lease's launch (Job::incarnation);
//  - telemetry only for steps the group has decided; plans only a small lead ahead;
//  - a config change applies to a group from effective_from_step = last decided step +
//    config_lead_steps on, never to a step already decided.
#ifndef SPGATE_SERVER_GATE_STATE_H_
#define SPGATE_SERVER_GATE_STATE_H_

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/step_plan.h"
#include "policy/telemetry.h"
#include "server/defaults.h"
#include "server/launch_book.h"
#include "server/learned_store.h"
#include "server/metrics.h"
#include "server/operator_view.h"
#include "server/state_options.h"
#include "server/token_bucket.h"

namespace spgate::v1 {
class VersionedGateConfig;
}  // namespace spgate::v1

namespace spgate::server {

// A config update for one Connect stream.
struct ConfigPush {
  std::shared_ptr<const v1::VersionedGateConfig> config;
  int64_t effective_from_step = 0;
};

// Where the state pushes config updates for a Connect stream. Implementations must not
// block; they are called without the state lock held.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void PushConfig(const ConfigPush& push) = 0;
  // The job's learned table (ADAPTIVE's fallback), to group leaders only.
  virtual void PushLearned(const ThroughputTable& /*table*/) {}
  // Ends the stream with `status` (its session was replaced, or a newer stream of the
  // same session took its place).
  virtual void End(const absl::Status& /*status*/) {}
};

// One decision as made (or answered from the cache).
struct DecisionRecord {
  std::string job_id;
  int group = 0;
  int64_t step = 0;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  int64_t config_version = 0;
  double length_cv = 0;
  std::optional<double> rolling_rs_wait_share;  // none: no SP step in the group's window
  absl::Time time;
  // PINNED decisions: the pin's end (so a worker's fallback forgets it then) and force.
  std::optional<absl::Time> pin_expire;
  bool pin_forced = false;
  // ADAPTIVE's exploration decisions and held flips among them, counted in the job's
  // metrics once per group that runs them (a CP peer adopts the counts with the answer).
  int explored = 0, flips_held = 0;
  // The batch's band and tokens (docs/design.md §11): the step's telemetry is learned
  // into this band when it arrives.
  int band = -1;
  // PlanDigest of the plan this decision answers: a retry gets the cached decision only
  // for the identical plan.
  uint64_t plan_digest = 0;
  // A step plan's answer (docs/design.md §12): one decision per micro-batch, by id (mode
  // and reason above are micro-batch 0's), and the stage's predicted peak with them.
  std::vector<Decision> microbatches;
  uint64_t stage_peak_bytes = 0;
  // Each micro-batch's band (StagePlanOutcome::bands), kept for learning its telemetry.
  std::vector<int8_t> microbatch_bands;
  // The plan's tokens (Σ lengths; a step plan's: Σ over its micro-batches) and each
  // micro-batch's, by id: the most a record of the step may claim (docs/design.md §2,
  // "Range rules"); -1 where the plan gave no lengths.
  int64_t plan_tokens = -1;
  std::vector<int64_t> microbatch_tokens;
};

// A WatchDecisions subscriber; OnDecision must not block.
class DecisionWatcher {
 public:
  virtual ~DecisionWatcher() = default;
  virtual void OnDecision(const DecisionRecord& decision) = 0;
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
  std::string incarnation;
  int group = 0;
  int rank_in_group = 0;
  bool group_session = false;  // the leader's session speaks for its group
  std::atomic<int64_t> telemetry_received{0};
  // Last cumulative local-decision and memory-override counts seen (guarded by
  // GateState's lock).
  int64_t local_seen[kNumReasons] = {};
  int64_t memory_overrides_seen = 0;
  // Rate limits (docs/design.md §10). Their own small lock, so that a refused plan is
  // refused before its lengths are read and without the state's lock; mutable because
  // taking a token is not a change to the session a caller sees.
  mutable Mutex limiter_mu;
  mutable TokenBucket plan_tokens ABSL_GUARDED_BY(limiter_mu);
  mutable TokenBucket telemetry_tokens ABSL_GUARDED_BY(limiter_mu);
};

struct RegisterInput {
  std::string job_id;
  std::string incarnation;
  int group = 0;
  int rank_in_group = 0;
  int group_size = 1;
  int global_rank = 0;
  std::string host;
  uint64_t memory_budget_bytes = 0;
  std::string launch_credential;  // never stored: only its digest is
  bool group_session = false;     // the leader speaks for the group (docs/design.md §2)
  // Pipelined jobs (docs/design.md §12): the job's layout (none: pp = 1, plain plans),
  // where this rank's group sits, and the features that need SP throughout.
  std::optional<JobLayout> layout;
  StageCoordinates coordinates;
  std::vector<std::string> sp_required;
  // ADAPTIVE's prior and the learned tables' relaunch key (docs/design.md §11): group_size
  // and the model's hidden and layers; the first rank of a launch that declares any sets
  // the job's.
  PriorInputs prior_inputs;
  // The rest of the relaunch key: the kind of hardware (common/hardware_id.h; empty: none
  // declared). The launch's first rank sets the launch's; another is logged, not refused.
  std::string hardware_id;
};

struct RegisterResult {
  std::string session_id;
  std::shared_ptr<const v1::VersionedGateConfig> config;
  int64_t effective_from_step = 0;
  absl::Duration heartbeat_interval;
  int64_t last_decided_step = -1;
};

using spgate::MicrobatchPlanInput;  // one micro-batch of a step plan (policy/step_plan.h)

struct PlanInput {
  std::string_view job_id;
  int group = 0;
  int64_t step = 0;
  std::span<const int64_t> lengths;
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;
  // A step plan (a job with a layout): every micro-batch of the step, and the stage's
  // resident bytes; lengths and the predicted peaks above are then empty.
  std::vector<MicrobatchPlanInput> microbatches;
  uint64_t resident_bytes = 0;
};

// A heartbeat's cumulative counts (the daemon adds their increase).
struct HeartbeatInput {
  std::array<int64_t, kNumReasons> local_decisions{};  // by reason, index = Reason value
  int64_t memory_overrides = 0;
};

struct TelemetryRecord {
  std::string_view job_id;
  int group = 0;
  int rank_in_group = 0;
  StepTelemetryValues values;
  uint64_t peak_memory_bytes = 0;
  // 0 or 1: the rank's own record; the group's size: the leader's record for the group,
  // each value the largest over its ranks (docs/design.md §2).
  int ranks = 0;
  int slowest_rank = 0;       // group records: the slowest rank (BusySeconds)
  int peak_memory_rank = 0;   // group records: the rank with the highest peak memory
  // The step ran the worker's own fallback decision (reason CONTROLLER_UNAVAILABLE), not
  // the daemon's.
  bool fallback = false;
  // A step plan's step: one record per micro-batch id (docs/design.md §12).
  std::vector<MicrobatchTelemetryValues> microbatches;
};

// A what-if: the gates for a hypothetical batch, against a job's live group or none.
struct WhatIfInput {
  std::string job_id;  // empty: no job (global config, fresh group state)
  std::optional<int> group;
  GateConfig config;   // the config to evaluate under (already layered by the caller)
  int64_t config_version = 0;
  std::span<const int64_t> lengths;
  std::optional<double> rs_wait_share;
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;
};

struct WhatIfResult {
  DecisionRecord decision;
  std::vector<GateCheck> checks;
  // The same batch under each policy (the config's other fields as given).
  std::vector<std::pair<GatePolicyKind, Decision>> by_policy;
};

// Admin views, in domain types (job_views.h turns them into the wire's).
struct PinView {
  std::string job_id;
  std::optional<int> group;
  Mode mode = Mode::kSequenceParallel;
  absl::Time expire;
  bool force = false;
};

struct GroupView {
  int group = 0;
  int group_size = 1;
  int ranks_active = 0;
  int ranks_stale = 0;
  bool has_decision = false;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  int64_t last_step = -1;
  std::optional<double> rolling_rs_wait_share;  // none: no SP step in the window
  double all_gather_tail_s = 0;
  double norm_stall_ratio = 0;
  bool rs_wait_fallback = false;
  int64_t mode_switches = 0;
  std::optional<PinView> pin;
  // The last complete step's slowest rank (and its time) and peak-memory rank; -1: none.
  int slowest_rank = -1;
  double slowest_step_time_s = 0;
  int peak_memory_rank = -1;
  bool group_session = false;
  // A job with a layout: where the group sits, its last step plan's predicted stage peak
  // and how many of that step's micro-batches ran TP-only.
  std::optional<StageCoordinates> coordinates;
  uint64_t stage_peak_bytes = 0;
  int last_step_tp_microbatches = 0;
};

struct JobSummaryView {
  std::string job_id;
  std::string incarnation;
  int groups = 0;
  int ranks_active = 0;
  int ranks_stale = 0;
  int64_t steps_decided = 0;        // decisions: one per micro-batch (see JobSummary)
  int64_t group_steps_decided = 0;  // one per (group, step)
  int64_t sp_groups = 0;
  int64_t tp_groups = 0;
  int64_t config_version = 0;
  std::string hardware_id;  // the live launch's (RegisterInput::hardware_id); empty: none
};

// One mode's MODES row (docs/design.md §12; the fields of v1::ModeStats).
struct ModeStatsView {
  Mode mode = Mode::kSequenceParallel;
  int64_t microbatches = 0;  // samples: micro-batches (a plain plan's group-steps)
  int64_t steps = 0;         // the group-steps they came from
  double effective_tokens_per_s = 0;
  double step_time_p95_s = 0;
  uint64_t peak_memory_bytes = 0;
  bool compared_to_tp = false;  // both this mode and TP-only have samples in the window
  double peak_memory_vs_tp = 0;
  double tokens_per_s_vs_tp = 0;
  double step_time_p95_vs_tp = 0;
};

struct DecisionCountView {
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  int64_t count = 0;
};

// The job's learned table (docs/design.md §11) and what ADAPTIVE made of it.
struct LearnedView {
  GateConfig config;          // the job's effective config (band edges, thresholds)
  ThroughputTable table;
  int64_t at_step = -1;       // the table's newest step; weights are decayed to it
  double gain_ratio = 0;      // ADAPTIVE's learned throughput / STATIC's; 0: none yet
  int64_t exploration_steps = 0;
};

struct JobView {
  LearnedView learned;
  std::vector<ThroughputTable> stage_learned;  // a job with a layout: per stage
  JobSummaryView summary;
  std::vector<GroupView> groups;
  std::vector<ModeStatsView> mode_stats;
  std::vector<DecisionCountView> decisions;
  std::vector<PinView> pins;
  int64_t local_decisions = 0;
  int64_t memory_overrides = 0;
  std::optional<JobLayout> layout;
  std::vector<std::string> sp_required;
};

namespace gate_state_internal {
struct LearnedTold;
}  // namespace gate_state_internal

class GateState final : public OperatorListener {
 public:
  // Reads the operator settings from `store` (and creates the jobs that have any).
  static absl::StatusOr<std::unique_ptr<GateState>> Create(StateOptions options, Metrics& metrics,
                                                           const OperatorSource* store);
  ~GateState() override;

  // What Create read back from --state_dir, for the daemon's start-up line: "jobs with
  // settings: N, launches: L, learned tables: T" (empty without a state_dir).
  const std::string& RestoredSummary() const { return restored_; }

  // --- worker API ---
  // Seats a rank in its job's launch (docs/security.md, "Launch credentials"): the first
  // Register of a launch sets its credential, later ones must present it (UNAUTHENTICATED
  // without one, PERMISSION_DENIED for another); a new launch replaces the job's live one
  // only when that one's ranks are gone (FAILED_PRECONDITION otherwise) and is persisted
  // before it is applied (UNAVAILABLE if it cannot be); a rank that registers again
  // replaces its own session and the old session's stream is ended (ABORTED).
  absl::StatusOr<RegisterResult> Register(const RegisterInput& request);
  // Binds a Connect stream to a registered session (NOT_FOUND for an unknown id,
  // FAILED_PRECONDITION for a session of a replaced incarnation). A session has one
  // stream: a newer one ends the older (ABORTED).
  absl::StatusOr<std::shared_ptr<Session>> AttachSession(const std::string& session_id,
                                                         std::weak_ptr<SessionSink> sink);
  // The session behind a token, for calls without a stream (unary Decide): UNAUTHENTICATED
  // without one, NOT_FOUND for an unknown one, FAILED_PRECONDITION for a replaced launch.
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const std::string& session_id);
  void DetachSession(const Session& session, const SessionSink* sink);
  // Decides (or returns the cached decision for) the plan's (job, incarnation, group,
  // step). Only the session of the group's registered leader may send plans
  // (PERMISSION_DENIED); the plan's job and group must be the session's (INVALID_ARGUMENT),
  // and a step too far ahead of the group is refused without changing anything.
  absl::StatusOr<DecisionRecord> Decide(const Session& session, const PlanInput& plan);
  absl::Status RecordTelemetry(Session& session, const TelemetryRecord& telemetry);
  // Adds the increase of the worker's cumulative local-decision counts (by reason, index
  // = Reason value) and returns the telemetry records accepted on the session so far.
  // FAILED_PRECONDITION when the session's incarnation was replaced.
  absl::StatusOr<int64_t> Heartbeat(Session& session, const HeartbeatInput& heartbeat);
  void Touch(const Session& session);

  // --- admin views ---
  // NOT_FOUND naming the job (or the group, when given) if it is not tracked.
  absl::Status CheckJob(const std::string& job_id, std::optional<int> group = std::nullopt) const;
  std::vector<JobSummaryView> ListJobs() const;
  absl::StatusOr<JobView> GetJob(const std::string& job_id) const;
  absl::StatusOr<WhatIfResult> WhatIf(const WhatIfInput& input) const;

  void AddWatcher(std::shared_ptr<DecisionWatcher> watcher);
  void RemoveWatcher(const DecisionWatcher* watcher);

  // OperatorListener: re-reads the job's (or, for "", every job's) effective config and
  // pins, schedules the config on every group and pushes it to the job's streams.
  void OnOperatorChange(const std::string& job_id) override;

  // OperatorListener: a job the live state holds (ForgetJob looks before it audits).
  bool TracksJob(const std::string& job_id) const override;
  // OperatorListener: drops the job's live state (groups, caches, windows, counts, its
  // sessions: their next calls get NOT_FOUND and the workers register again). A job that
  // still has operator settings stays listed, with no live state. Returns the sessions
  // ended.
  int OnJobForgotten(const std::string& job_id) override;
  // OperatorListener: a new job scope is one more job tracked, so it is refused, as a
  // new job's Register is, once --max_jobs jobs are tracked and this is not one of them.
  absl::Status AdmitJobScope(const std::string& job_id) const override;

  // Staleness, pin expiry, forgetting idle ranks, groups and jobs, worker gauges.
  void Sweep();
  // With a state_dir: writes the learned tables of every job that learned since its last
  // write and last wrote at least learned_persist_interval ago (`all`: whatever its last
  // write; at shutdown), outside the state's lock (server/learned_store.h). The sweep
  // thread calls it; a failed write is logged, counted and retried on the next call.
  void PersistLearned(bool all) ABSL_LOCKS_EXCLUDED(mu_, learned_io_mu_);
  // Refuses new sessions and streams with UNAVAILABLE (graceful shutdown).
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  absl::Time Now() const { return options_.clock(); }
  const StateOptions& options() const { return options_; }

  struct Job;
  struct Group;

 private:
  GateState(StateOptions options, Metrics& metrics, const OperatorSource* store);

  // A job not tracked yet is refused past --max_jobs, unless `over_max_jobs`: a job the
  // state directory or the operator store already holds (restored at Create, or a scope
  // the store admitted and wrote), which must be tracked whatever the count.
  absl::StatusOr<Job*> FindOrCreateJob(const std::string& job_id, bool over_max_jobs = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED for a new job once --max_jobs jobs are tracked, else OK.
  absl::Status CheckJobLimit(const std::string& job_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A group index Register takes: in [0, --max_groups_per_job).
  absl::Status CheckGroupIndex(int group) const;
  absl::StatusOr<Group*> FindOrCreateGroup(Job& job, int group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Job*> FindJob(const std::string& job_id, std::optional<int> group) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The session's job if the session belongs to its current incarnation, else
  // FAILED_PRECONDITION (counted).
  absl::StatusOr<Job*> JobOfSession(const Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the job's live state afresh for the launch its lease was just granted to (an
  // empty incarnation: no launch, the live state is dropped); operator settings stay.
  void StartIncarnation(Job& job, const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(launches_.mu(), mu_);
  // Whether the job's live launch renews its lease: some rank seen within stale_after
  // that has an open stream or never used one (docs/security.md).
  bool RanksHeardFrom(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Seats the rank in its (joined or started) launch: the rest of Register, under mu_.
  // Sinks of replaced sessions go to `ended`, to be ended after the lock.
  absl::StatusOr<RegisterResult> Seat(Job& job, const RegisterInput& r,
                                      std::shared_ptr<Session> session,
                                      std::vector<std::shared_ptr<SessionSink>>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the jobs of the launches the book read back, each of its launch.
  absl::Status RestoreLaunches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(launches_.mu(), mu_);
  // Erases the sessions `drop` selects, keeping each job's session count.
  template <typename Pred>
  int EraseSessions(Pred drop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountLimit(Limit limit) const { metrics_.LimitRefusals(limit).Increment(); }
  // The pin in force for the group (its own, else the job's) at `now` (default: Now()),
  // if any.
  std::optional<PinState> ActivePin(const Job& job, int group) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return ActivePin(job, group, Now());
  }
  std::optional<PinState> ActivePin(const Job& job, int group, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the job's operator view; when its effective config changed, schedules it on
  // every group and collects the pushes for its sessions.
  void RefreshJob(Job& job, std::vector<std::pair<std::shared_ptr<SessionSink>, ConfigPush>>* pushes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decide's steps: the checks that need no state (identity, size, rate), the group's step
  // window, the policy and its record (cache, counts, metrics), the watchers' fan-out.
  // Under the lock the clock is read once (`now`) and passed down: the path runs once per
  // group-step, and an absl::Now() cost ~80 ns on the 2-core CI VM (11 reads a plain
  // step's plan and record took before, 4 now).
  absl::Status CheckPlan(const Session& session, const PlanInput& plan);
  // --max_sequences_per_plan: a plan (or an eval's batch) of `sequences` over it is
  // RESOURCE_EXHAUSTED, in one wording for both.
  absl::Status CheckSequences(size_t sequences) const;
  absl::Status CheckStepWindow(const Group& group, const PlanInput& plan, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One decide path for every layout (a plain plan is a job without a layout's one
  // micro-batch): the policy's answer (PolicyStep, where the layouts differ) or a CP
  // peer's, then the record, the cache, the counts and the metrics.
  DecisionRecord DecideStep(Job& job, Group& group, const PlanInput& plan,
                            std::span<const MicrobatchFacts> facts, uint64_t plan_digest,
                            const DecisionRecord* peer, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StagePlanOutcome PolicyStep(Job& job, Group& group, const GateConfig& config,
                              const PlanInput& plan, std::span<const MicrobatchFacts> facts,
                              const std::optional<PinState>& pin,
                              std::optional<double>* adaptive_gain)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step plans (docs/design.md §12): the layout's checks at Register (nothing changed on
  // an error), the plan's against the job's layout, a CP peer's decision for the step if
  // one made it.
  absl::Status CheckLayout(const Job& job, const RegisterInput& r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckStepPlan(const Job& job, const PlanInput& plan) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::optional<DecisionRecord> CpPeerDecided(const Job& job, const Group& group, int64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Caches `decision` as the group's answer for its step and counts it.
  void RecordStep(Job& job, Group& group, const DecisionRecord& decision, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyWatchers(const DecisionRecord& decision) ABSL_LOCKS_EXCLUDED(mu_);
  // RecordTelemetry's steps (docs/design.md §2, "Range rules"): the checks that need no
  // state (identity, values, the session's kind), the checks against the group and the
  // step's plan (its tokens, from the cached decision), both changing nothing, and the
  // fold of an accepted record, which cannot fail (the clock read once under the lock,
  // `now`, as on the decide path).
  static absl::Status CheckTelemetry(const Session& session, const TelemetryRecord& t);
  absl::Status CheckTelemetryOfStep(const Job& job, const Group& group, const Session& session,
                                    const TelemetryRecord& t) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FoldTelemetry(Job& job, Group& group, const Session& session, const TelemetryRecord& t,
                     absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinalizeStep(Job& job, Group& group, int slot, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the job's learned table afresh when the band edges in `config` differ from
  // the ones it was learned with.
  // The finalized step `slot` of `group` into the job's learned table (gate_state_learned.cc).
  void LearnFromStep(Job& job, Group& group, int slot, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepBandsOf(Job& job, const GateConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearLearned(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteLearned(Job& job, const ThroughputTable& table, const GateConfig& config,
                   gate_state_internal::LearnedTold& told, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's leaders' sinks, each with a copy of its table (a pipelined job's leader
  // gets its stage's), when a push is due (and marks it sent); `only` limits it to one
  // session. The caller pushes them after releasing the lock.
  struct LearnedPush {
    std::shared_ptr<SessionSink> sink;
    std::shared_ptr<const ThroughputTable> table;
  };
  void CollectLearnedPushes(Job& job, bool force, const std::string* only,
                            std::vector<LearnedPush>* pushes, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Learned tables across launches and restarts (gate_state_learned.cc): read back at
  // Create (a restored launch's installed, the others kept for their job's next launch);
  // a launch's tables kept when it ends or its job goes idle; a new launch's first
  // registrant adopting the kept ones when it declares the same (aged, restamped at its
  // first decided step); the record to write.
  // Returns how many learned-table files it read.
  int LoadLearned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InstallLearned(Job& job, LearnedRecord record, double age_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StashLearned(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdoptLearned(Job& job, const RegisterInput& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestampLearnedAt(Job& job, const GateConfig& config, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LearnedRecord RecordOf(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void LogLine(const std::string& line) const;
  // A failed write to state_dir, naming the file: StateOptions::on_persist_failure, else
  // counted and logged here.
  void PersistFailed(absl::string_view what) const;
  // The table a group's decisions read and its telemetry feeds: its stage's in a job
  // with a layout, else the job's.
  ThroughputTable& LearnedTableOf(Job& job, int group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GroupView ViewOfGroup(const Job& job, const Group& group) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  JobSummaryView SummaryOf(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const StateOptions options_;
  Metrics& metrics_;
  const OperatorSource* const store_;
  std::atomic<bool> draining_{false};

  // Who owns each job id; its lock comes before mu_ (the opening comment's order).
  LaunchBook launches_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);

  // Learned tables of jobs without live ones (a launch that ended, an idle job, files
  // read at Create), each with whether it is not on disk yet; at most max_jobs.
  struct KeptLearned {
    LearnedRecord record;
    bool dirty = false;
    absl::Time saved = absl::InfinitePast();  // the last write tried
  };
  absl::flat_hash_map<std::string, KeptLearned> kept_learned_ ABSL_GUARDED_BY(mu_);
  std::string restored_;  // RestoredSummary, set once by Create
  // Held across a learned-table write (PersistLearned) and a removal (OnJobForgotten), so
  // that a forgotten job's file is never written again after it was removed; taken
  // before mu_, never with the launch book's lock.
  Mutex learned_io_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::shared_ptr<DecisionWatcher>> watchers_ ABSL_GUARDED_BY(watch_mu_);
  std::atomic<int> watcher_count_{0};
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_GATE_STATE_H_
