// What the live state (gate_state.h) sees of the operator's settings, without the wire
// types: the OperatorStore (operator_store.h) is the OperatorSource that produces these
// views, and tells its listener when they change. See docs/design.md §5.
#ifndef SPGATE_SERVER_OPERATOR_VIEW_H_
#define SPGATE_SERVER_OPERATOR_VIEW_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "policy/types.h"

namespace spgate::v1 {
class VersionedGateConfig;
}  // namespace spgate::v1

namespace spgate::server {

struct PinState {
  Mode mode = Mode::kSequenceParallel;
  absl::Time expire;
  bool force = false;  // a TP-only pin that does not yield to the memory gate
};

// What the live state needs to know of one job's operator settings.
struct JobOperatorView {
  GateConfig effective;
  int64_t effective_version = 0;
  // The config as served to workers (effective values, this scope's overrides, versions).
  std::shared_ptr<const v1::VersionedGateConfig> served;
  std::optional<PinState> pin;          // the whole job
  std::map<int, PinState> group_pins;   // single groups
  bool has_overrides = false;           // the job has its own config overrides
};

// What the live state reads of the operator's settings (the store's leaf lock).
class OperatorSource {
 public:
  virtual ~OperatorSource() = default;
  virtual JobOperatorView ViewForJob(const std::string& job_id) const = 0;
  virtual GateConfig GlobalEffective() const = 0;
  virtual int64_t GlobalVersion() const = 0;
  // Whether the store holds a scope of the job's own.
  virtual bool HasJobScope(const std::string& job_id) const = 0;
  virtual std::vector<std::string> JobsWithOperatorState() const = 0;
};

// Told about changes after they are persisted and applied, with persist_mu_ held (so
// changes arrive in order). `job_id` empty: the global scope changed (every job's
// effective config may have). Must not call back into the store's mutating methods.
class OperatorListener {
 public:
  virtual ~OperatorListener() = default;
  virtual void OnOperatorChange(const std::string& job_id) = 0;
  // Whether the listener holds live state for the job, and dropping it (ForgetJob,
  // after the change is persisted); returns what was dropped, e.g. sessions ended.
  virtual bool TracksJob(const std::string& job_id) const { return false; }
  virtual int OnJobForgotten(const std::string& job_id) { return 0; }
  // Whether the scope of `job_id` may be set (a config change, rollback or pin):
  // --max_jobs bounds the jobs the listener tracks, live or listed for their settings
  // alike, so the store asks before it writes (RESOURCE_EXHAUSTED naming the flag when
  // the listener tracks that many and not this job). Called with persist_mu_ held.
  virtual absl::Status AdmitJobScope(const std::string& job_id) const {
    return absl::OkStatus();
  }
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_OPERATOR_VIEW_H_
