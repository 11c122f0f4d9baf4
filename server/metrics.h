// The daemon's Prometheus metrics (docs/design.md §7). Every family is built once here; callers
// keep the references that Add() returns (an increment is an atomic add, an Add() is a
// map lookup under the family's lock), so the decision path never calls Add().
// Label values are bounded: job ids (bounded by --max_jobs), group indices, modes,
// reasons and gate names. Never a rank, a step or a request id.
#ifndef SPGATE_SERVER_METRICS_H_
#define SPGATE_SERVER_METRICS_H_

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "policy/adaptive_policy.h"
#include "policy/types.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace spgate::server {

class Metrics;

// The limits a client can run into (docs/design.md §10), the `limit` label of
// spgate_limit_refusals_total; every value is created at 0.
enum class Limit {
  kJobs,
  kSessionsPerJob,
  kGroupsPerJob,
  kSequencesPerPlan,
  kPlanRate,
  kTelemetryRate,
  kStreams,
  kWatchStreams,
  kItemsPerMessage,
  kFirstMessage,
};
inline constexpr int kNumLimits = 10;
std::string_view LimitLabel(Limit limit);

class GroupMetrics;

// What one decision of the daemon changes in its job's and its group's series.
struct DecisionSample {
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  double length_cv = 0;
  std::optional<double> adaptive_gain;    // the job's gain ratio, when it changed
  std::optional<uint64_t> memory_budget;  // the job's memory budget, when it changed
  std::optional<Mode> previous_mode;      // the group's mode before; none: its first
};

// One job's series, created when the job first appears and removed with it.
class JobMetrics {
 public:
  JobMetrics(Metrics& m, const std::string& job_id);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  prometheus::Counter& Decisions(Mode mode, Reason reason);  // created on first use
  prometheus::Counter& LocalDecisions(Reason reason);
  // Every series one decision touches: the decision and length-CV counts, gain and
  // budget, and the group's current mode and switches (a step's exploration and held
  // flips are counted once per step, by the caller).
  void RecordDecision(const DecisionSample& decision, GroupMetrics& group);
  void SetThresholds(const GateConfig& config, int64_t version);
  // The ADAPTIVE policy's learned table (docs/design.md §11): one estimate and one
  // sample weight per (band, mode) that has data, created on first use.
  void SetLearned(int band, Mode mode, double tokens_per_s, double samples);
  void RemoveLearned();  // the table was reset (new launch, new band edges)
  // A pipelined job's stage (docs/design.md §12): the largest predicted peak of its
  // groups' last step plans and the share of their micro-batches that ran TP-only.
  // Created on first use; RemoveStages drops them (a new launch may have another layout).
  void SetStage(int stage, uint64_t predicted_peak_bytes, double tp_only_share);
  void RemoveStages();
  // Drops the stages not in `present` (their groups are gone).
  void RetainStages(const std::vector<int>& present);
  // A pipelined job's stage's learned table (docs/design.md §12): one estimate per
  // (stage, band, mode) with data, created on first use; dropped with the stages and when
  // the tables are reset.
  void SetStageLearned(int stage, int band, Mode mode, double tokens_per_s);

  prometheus::Histogram* length_cv;
  std::array<prometheus::Histogram*, kModeSlots> step_duration{};
  std::array<prometheus::Counter*, kModeSlots> effective_tokens{};
  std::array<prometheus::Counter*, kModeSlots> padding_tokens{};
  std::array<prometheus::Gauge*, kModeSlots> peak_memory{};
  prometheus::Gauge* memory_budget;
  prometheus::Gauge* workers_active;
  prometheus::Gauge* workers_stale;
  prometheus::Counter* exploration_steps;
  prometheus::Gauge* adaptive_gain;
  prometheus::Counter* flips_held;
  prometheus::Counter* adaptive_changes;
  prometheus::Counter* adaptive_straggler_steps;
  prometheus::Gauge* adaptive_switch_cost;
  // Daemon answers the job's workers did not run: their own memory gate forbade TP-only
  // for the plan answered (docs/security.md, "Memory is checked on both sides").
  prometheus::Counter* memory_overrides;
  // Ranks that registered with another hardware id than their launch's first rank.
  prometheus::Counter* hardware_id_mismatches;

 private:
  Metrics& m_;
  std::string job_id_;
  std::array<std::array<prometheus::Counter*, kNumReasons>, kModeSlots> decisions_{};
  std::array<prometheus::Counter*, kNumReasons> local_{};
  std::array<prometheus::Gauge*, kNumGateFields> thresholds_{};  // null for the policy
  std::array<prometheus::Gauge*, 3> policy_{};  // by GatePolicyKind
  prometheus::Gauge* config_version_;
  std::array<std::array<prometheus::Gauge*, kModeSlots>, kBands> learned_rate_{};
  std::array<std::array<prometheus::Gauge*, kModeSlots>, kBands> learned_samples_{};
  std::map<int, std::pair<prometheus::Gauge*, prometheus::Gauge*>> stages_;  // peak, share
  // By (stage × kBands + band) × kModeSlots + mode.
  std::map<int64_t, prometheus::Gauge*> stage_learned_;
  void RemoveStageLearned(const std::vector<int>* keep_stages);
};

class GroupMetrics {
 public:
  GroupMetrics(Metrics& m, const std::string& job_id, int group);
  ~GroupMetrics();
  GroupMetrics(const GroupMetrics&) = delete;
  GroupMetrics& operator=(const GroupMetrics&) = delete;

  void SetMode(Mode mode);

  prometheus::Gauge* rs_wait_share;
  prometheus::Gauge* all_gather_tail;
  prometheus::Gauge* norm_stall_ratio;
  prometheus::Gauge* slowest_rank;  // -1 until a step is complete
  prometheus::Counter* mode_switches;

 private:
  Metrics& m_;
  std::array<prometheus::Gauge*, kModeSlots> current_mode_{};
};

class Metrics {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Global (job_id="_default") thresholds and version.
  void SetGlobalThresholds(const GateConfig& config, int64_t version);

  prometheus::Counter& LimitRefusals(Limit limit) {
    return *limit_refusals_[static_cast<int>(limit)];
  }

 private:
  // Declared first: every reference below is initialised from it.
  std::shared_ptr<prometheus::Registry> registry_;

 public:
  prometheus::Family<prometheus::Counter>& decisions_f;
  prometheus::Family<prometheus::Counter>& local_decisions_f;
  prometheus::Family<prometheus::Counter>& memory_overrides_f;
  prometheus::Family<prometheus::Counter>& hardware_id_mismatches_f;
  prometheus::Family<prometheus::Histogram>& length_cv_f;
  prometheus::Family<prometheus::Gauge>& rs_wait_f;
  prometheus::Family<prometheus::Gauge>& all_gather_f;
  prometheus::Family<prometheus::Gauge>& slowest_rank_f;
  prometheus::Family<prometheus::Gauge>& stage_peak_f;
  prometheus::Family<prometheus::Gauge>& stage_tp_only_f;
  prometheus::Family<prometheus::Gauge>& stage_adaptive_rate_f;
  prometheus::Family<prometheus::Gauge>& norm_stall_f;
  prometheus::Family<prometheus::Histogram>& step_duration_f;
  prometheus::Family<prometheus::Counter>& effective_tokens_f;
  prometheus::Family<prometheus::Counter>& padding_tokens_f;
  prometheus::Family<prometheus::Gauge>& peak_memory_f;
  prometheus::Family<prometheus::Gauge>& memory_budget_f;
  prometheus::Family<prometheus::Gauge>& current_mode_f;
  prometheus::Family<prometheus::Counter>& mode_switches_f;
  prometheus::Family<prometheus::Gauge>& gate_threshold_f;
  prometheus::Family<prometheus::Gauge>& config_version_f;
  prometheus::Family<prometheus::Counter>& config_updates_f;
  prometheus::Family<prometheus::Gauge>& workers_f;
  prometheus::Family<prometheus::Histogram>& decision_latency_f;
  prometheus::Family<prometheus::Counter>& persist_failures_f;
  prometheus::Family<prometheus::Gauge>& reload_ok_f;
  prometheus::Family<prometheus::Gauge>& build_info_f;
  prometheus::Family<prometheus::Counter>& telemetry_f;
  prometheus::Family<prometheus::Counter>& watch_dropped_f;
  prometheus::Family<prometheus::Counter>& worker_refusals_f;
  prometheus::Family<prometheus::Counter>& admin_refusals_f;
  prometheus::Family<prometheus::Gauge>& gate_policy_f;
  prometheus::Family<prometheus::Gauge>& adaptive_rate_f;
  prometheus::Family<prometheus::Gauge>& adaptive_samples_f;
  prometheus::Family<prometheus::Counter>& exploration_f;
  prometheus::Family<prometheus::Gauge>& adaptive_gain_f;
  prometheus::Family<prometheus::Counter>& flips_held_f;
  prometheus::Family<prometheus::Counter>& adaptive_changes_f;
  prometheus::Family<prometheus::Counter>& adaptive_straggler_steps_f;
  prometheus::Family<prometheus::Gauge>& switch_cost_f;
  prometheus::Family<prometheus::Counter>& limit_refusals_f;

  prometheus::Counter& config_updates_ok;
  prometheus::Counter& config_updates_invalid;
  prometheus::Counter& config_updates_conflict;
  prometheus::Counter& config_updates_denied;
  prometheus::Counter& config_updates_unavailable;  // the change could not be persisted
  prometheus::Histogram& decision_latency;
  prometheus::Counter& state_persist_failures;
  prometheus::Gauge& config_last_reload_successful;
  // Beyond docs/design.md §7's table: lost-telemetry accounting and watch back-pressure.
  prometheus::Counter& telemetry_received;
  prometheus::Counter& telemetry_rejected;
  prometheus::Counter& watch_dropped;
  // Worker requests refused for who sent them (docs/design.md §10), by reason.
  prometheus::Counter& refused_stale_incarnation;
  prometheus::Counter& refused_live_incarnation;
  prometheus::Counter& refused_not_leader;
  prometheus::Counter& refused_step_too_far;
  prometheus::Counter& refused_unknown_session;
  prometheus::Counter& refused_launch_credential;  // a wrong credential for a live launch
  prometheus::Counter& refused_plan_mismatch;      // another plan for a decided step
  prometheus::Counter& refused_undecided_step;     // telemetry for a step not decided
  prometheus::Counter& refused_worker_credential;  // no, an unknown or an out-of-scope one
  // Admin calls refused for who sent them: without a credential (UNAUTHENTICATED), or with
  // one that matches nothing, or whose role is too low for the call (PERMISSION_DENIED).
  prometheus::Counter& admin_unauthenticated;
  prometheus::Counter& admin_denied;
  // Counts an admin call's refusal by its code (UNAUTHENTICATED, PERMISSION_DENIED; others
  // are not refusals for who sent it), as the workers' are counted: a guessed token or a
  // reader probing changes is otherwise seen nowhere (the audit log records only changes).
  void CountAdminRefusal(absl::StatusCode code) {
    if (code == absl::StatusCode::kUnauthenticated) admin_unauthenticated.Increment();
    if (code == absl::StatusCode::kPermissionDenied) admin_denied.Increment();
  }

 private:
  std::array<prometheus::Gauge*, kNumGateFields> global_thresholds_{};
  std::array<prometheus::Gauge*, 3> global_policy_{};
  std::array<prometheus::Counter*, kNumLimits> limit_refusals_{};
  prometheus::Gauge* global_version_ = nullptr;
};

std::string_view SpgateVersion();

}  // namespace spgate::server

#endif  // SPGATE_SERVER_METRICS_H_
