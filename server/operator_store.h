// Everything an operator owns, and the only place it changes: the --config file layer,
// the global and per-job overrides made through the API, their versions, and the pins.
// It is persisted in --state_dir and restored before the daemon serves (docs/design.md
// §5). The live state (gate_state.h) reads it through JobOperatorView and is told when
// it changes (OperatorListener); it never writes here.
//
// Invariants:
//  - persist before apply: a change is appended to the audit log and written to the
//    state file first, and applied to memory only once both succeeded; a failure
//    changes nothing, leaves no audit line and fails the call (UNAVAILABLE naming the
//    file);
//  - one lock order: persist_mu_ (held across a whole change, the write and the listener
//    call) before the live state's lock, before data_mu_ (a leaf: readers take only it);
//  - versions come from one counter, so a job's effective version is the larger of the
//    global and the job scope's versions; an update that changes nothing keeps them.
//
// Usage:
//   ASSIGN_OR_RETURN(auto store, OperatorStore::Create(options, file_layer));
//   store->SetListener(&live_state);
//   ASSIGN_OR_RETURN(v1::VersionedGateConfig v,
//                    store->UpdateGateConfig(request, AuditContext{"alice"}));
//   JobOperatorView view = store->ViewForJob("llama-13b");   // effective config, pins
#ifndef SPGATE_SERVER_OPERATOR_STORE_H_
#define SPGATE_SERVER_OPERATOR_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config_history.h"
#include "common/mutex.h"
#include "policy/types.h"
#include "spgate/v1/admin.pb.h"
#include "spgate/v1/gate.pb.h"
#include "server/operator_view.h"

namespace spgate::server {

struct StoreOptions {
  std::string state_dir;                // empty: changes are not persisted
  std::function<absl::Time()> clock;    // required
  // Jobs with their own scope, for a store without a listener; with one, the listener's
  // AdmitJobScope decides (the daemon's --max_jobs counts live and settings-only jobs
  // as one pool).
  int max_job_scopes = 1024;
  // A write to --state_dir failed (the state file or the audit log): what failed, naming
  // the file. E.g. a metric and a log line; may be empty.
  std::function<void(absl::string_view what)> on_persist_failure;
  // The state_dir is loaded and never written (--allow_read_only_state_dir over one that
  // is not writable): every change is refused with UNAVAILABLE before any write, which is
  // no persist failure; a reloaded --config applies in memory.
  bool read_only = false;
};

// Who asks for a change, for the audit log: a credential's name or a certificate
// identity (server/admin_auth.h), never a secret.
struct AuditContext {
  std::string principal;
};

class OperatorStore final : public OperatorSource {
 public:
  // Loads the state dir (a corrupt file is an error naming it) and checks that the
  // --config layer and the persisted overrides make valid configs together.
  static absl::StatusOr<std::unique_ptr<OperatorStore>> Create(StoreOptions options,
                                                               v1::GateConfig file_layer);

  void SetListener(OperatorListener* listener);

  // --- admin API (each mutation: validate, persist, apply, tell the listener) ---
  v1::VersionedGateConfig GetGateConfig(const std::string& job_id) const;
  absl::StatusOr<v1::VersionedGateConfig> UpdateGateConfig(const v1::UpdateGateConfigRequest& r,
                                                           const AuditContext& audit);
  // Restores the scope's overrides as they were right after r.to_version(), found in the
  // audit log, as a new version. NOT_FOUND: no such audited version; INVALID_ARGUMENT:
  // the version belongs to another scope; FAILED_PRECONDITION: no --state_dir. Version 0
  // is the scope with no API overrides (the --config file as last loaded over the defaults;
  // a job: the global config) and needs no audit log.
  absl::StatusOr<v1::VersionedGateConfig> RollbackGateConfig(
      const v1::RollbackGateConfigRequest& r, const AuditContext& audit);
  // The audit log, newest first, one bounded page.
  absl::StatusOr<v1::ListConfigHistoryResponse> ListConfigHistory(
      const v1::ListConfigHistoryRequest& r);
  // A new --config layer (SIGHUP). Invalid with the API's overrides on top: error, and
  // the running config stays.
  absl::Status ReloadConfigFile(const v1::GateConfig& file_layer);
  absl::StatusOr<v1::Pin> PinMode(const v1::PinModeRequest& r, const AuditContext& audit);
  // PinMode's argument checks alone (job id, mode, duration), for callers that look the
  // job up in between.
  static absl::Status ValidatePinRequest(const v1::PinModeRequest& r);
  // The job id and group of an Unpin (the service checks them before the live state's
  // NOT_FOUND).
  static absl::Status ValidateUnpinRequest(const v1::UnpinRequest& r);
  // Removes the matching pins; returns how many of them were still in force.
  absl::StatusOr<int> Unpin(const v1::UnpinRequest& r, const AuditContext& audit);
  // Forgets a job: its live state (through the listener, after the change is persisted
  // and audited) and, with r.forget_operator_settings(), its overrides and pins.
  // NOT_FOUND when neither the listener nor this store holds anything for the job.
  absl::StatusOr<v1::ForgetJobResponse> ForgetJob(const v1::ForgetJobRequest& r,
                                                  const AuditContext& audit);
  // Writes the state file (drops expired pins from it).
  absl::Status Flush();

  // --- reads for the live state (OperatorSource; leaf lock) ---
  JobOperatorView ViewForJob(const std::string& job_id) const override;
  GateConfig GlobalEffective() const override;
  int64_t GlobalVersion() const override;
  bool HasJobScope(const std::string& job_id) const override;
  std::vector<std::string> JobsWithOperatorState() const override;

 private:
  struct JobScope {
    v1::GateConfig overrides;
    int64_t version = 0;  // 0: no overrides ever set
    absl::Time update_time;
    std::optional<PinState> pin;
    std::map<int, PinState> group_pins;
    bool empty() const { return version == 0 && !pin && group_pins.empty(); }
  };
  struct Layers {
    v1::GateConfig file_layer;
    v1::GateConfig global_overrides;
    int64_t version_counter = 0;
    int64_t global_version = 0;
    absl::Time global_update_time;
    GateConfig global_effective;
    std::map<std::string, JobScope> jobs;
  };

  explicit OperatorStore(StoreOptions options) : options_(std::move(options)) {}
  absl::Time Now() const { return options_.clock(); }

  // The global scope's effective config: the defaults, the file, then the API's global
  // overrides (docs/design.md §5).
  static GateConfig GlobalEffective(const v1::GateConfig& file_layer,
                                    const v1::GateConfig& global_overrides);
  // A job's effective config and version: the global effective config, then the job's
  // overrides; `job` null (no scope): the global's.
  static GateConfig JobEffective(const GateConfig& global, const JobScope* job);
  static int64_t JobEffectiveVersion(const Layers& layers, const JobScope* job);
  // Every job override still valid over `global`; the error names the job.
  static absl::Status ValidateJobs(const Layers& layers, const GateConfig& global);
  v1::VersionedGateConfig Versioned(const Layers& layers, const std::string& job_id) const;
  v1::PersistedState Snapshot(const Layers& layers) const;
  static absl::StatusOr<Layers> FromPersisted(const v1::PersistedState& persisted,
                                              absl::Time now);
  // Sets the overrides of one scope (empty job_id: global) in `next` as a new version,
  // validating the layered result; fills the audit entry's scope, changes and version.
  absl::Status SetScopeOverrides(Layers& next, const std::string& job_id,
                                 v1::GateConfig overrides, v1::AuditEntry* entry) const;
  // A write that failed: told to on_persist_failure (counted, logged), and returned as
  // UNAVAILABLE with `what` (which names the file).
  absl::Status PersistFailed(std::string what) const;
  // Append `entry` to the audit log and persist `next`, then make it current and tell
  // the listener. Requires persist_mu_.
  absl::Status Commit(Layers next, const std::string& changed_job, v1::AuditEntry entry,
                      const AuditContext& audit, bool notify_listener = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  Layers Copy() const;
  absl::StatusOr<v1::VersionedGateConfig> RollbackToStart(const v1::RollbackGateConfigRequest& r,
                                                          const AuditContext& audit);
  // A change to the scope of `job_id` ("" = global) is allowed: the job-scope cap, and the
  // caller's expected version (ABORTED on a mismatch).
  absl::Status CheckScopeWritable(const Layers& next, const std::string& job_id,
                                  std::optional<int64_t> expected_version) const;
  // A change to the scope of job `job_id` may add a job (RESOURCE_EXHAUSTED naming
  // --max_jobs): the listener's AdmitJobScope, or, without a listener, max_job_scopes
  // for a scope `next` does not hold yet.
  absl::Status AdmitJobScope(const Layers& next, const std::string& job_id) const;

  const StoreOptions options_;
  OperatorListener* listener_ = nullptr;

  Mutex persist_mu_;
  mutable Mutex data_mu_ ABSL_ACQUIRED_AFTER(persist_mu_);
  Layers layers_ ABSL_GUARDED_BY(data_mu_);
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_OPERATOR_STORE_H_
