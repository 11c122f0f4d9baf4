// The daemon's two halves, the operator store and the live state, wired as the daemon
// wires them, behind the wire-typed calls the services make (server/job_views.h does the
// converting). Tests drive a real state with a fake clock through the same conversions
// the gRPC handlers use, without a server.
//
// Usage:
//   auto h = StateHarness::Create(options, store_options, &metrics, file_layer);
//   (metrics null: the harness makes its own)
//   v1::Decision d;
//   ASSERT_THAT((*h)->Decide(plan, &d), IsOk());
#ifndef SPGATE_TESTS_SERVER_STATE_HARNESS_H_
#define SPGATE_TESTS_SERVER_STATE_HARNESS_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status_macros.h"
#include "server/gate_state.h"
#include "server/job_views.h"
#include "server/operator_store.h"

namespace spgate::server {

class StateHarness {
 public:
  static absl::StatusOr<std::unique_ptr<StateHarness>> Create(StateOptions options,
                                                              StoreOptions store_options,
                                                              Metrics* metrics,
                                                              v1::GateConfig file_layer = {}) {
    auto h = std::unique_ptr<StateHarness>(new StateHarness());
    if (metrics == nullptr) {  // the test reads no metric: the state still keeps real ones
      h->own_metrics_ = std::make_unique<Metrics>();
      metrics = h->own_metrics_.get();
    }
    if (!store_options.clock) store_options.clock = options.clock;
    if (!store_options.on_persist_failure) {
      store_options.on_persist_failure = [metrics](absl::string_view) {
        metrics->state_persist_failures.Increment();
      };
    }
    ASSIGN_OR_RETURN(h->store, OperatorStore::Create(std::move(store_options), std::move(file_layer)));
    ASSIGN_OR_RETURN(h->state, GateState::Create(std::move(options), *metrics, h->store.get()));
    h->store->SetListener(h->state.get());
    return h;
  }

  // The incarnation and launch credential Register uses when a request names none, and
  // Decide's own sessions.
  static constexpr char kIncarnation[] = "launch-1";
  static constexpr char kLaunchCredential[] = "test-launch-credential-0001";

  // --- worker API ---
  absl::StatusOr<v1::RegisterResponse> Register(v1::RegisterRequest r) {
    if (r.incarnation().empty()) r.set_incarnation(kIncarnation);
    if (r.launch_credential().empty()) r.set_launch_credential(kLaunchCredential);
    ASSIGN_OR_RETURN(const RegisterInput input, RegisterFromProto(r));
    ASSIGN_OR_RETURN(RegisterResult result, state->Register(input));
    if (r.rank_in_group() == 0) leaders_[{r.job_id(), r.group()}] = result.session_id;
    return ToProto(result);
  }
  absl::StatusOr<std::shared_ptr<Session>> AttachSession(const std::string& id,
                                                         std::weak_ptr<SessionSink> sink) {
    return state->AttachSession(id, std::move(sink));
  }
  // As the group's leader: the session of the last rank 0 registered through this harness
  // for (job, group), or a new one-rank group's when there is none.
  absl::Status Decide(const v1::BatchPlan& plan, v1::Decision* out) {
    auto it = leaders_.find({plan.job_id(), plan.group()});
    if (it == leaders_.end()) {
      v1::RegisterRequest r;
      r.set_job_id(plan.job_id());
      r.set_group(plan.group());
      r.set_group_size(1);
      RETURN_IF_ERROR(Register(r).status());
      it = leaders_.find({plan.job_id(), plan.group()});
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session, state->FindSession(it->second));
    ASSIGN_OR_RETURN(DecisionRecord d, state->Decide(*session, PlanFromProto(plan)));
    ToProto(d, out);
    return absl::OkStatus();
  }
  // The session id of the last rank 0 registered through this harness for (job, group).
  std::string LeaderSession(const std::string& job_id, int group) const {
    auto it = leaders_.find({job_id, group});
    return it == leaders_.end() ? std::string() : it->second;
  }
  absl::Status RecordTelemetry(Session& session, const v1::StepTelemetry& t) {
    return state->RecordTelemetry(session, TelemetryFromProto(t));
  }
  absl::StatusOr<int64_t> Heartbeat(Session& session, const v1::Heartbeat& hb) {
    return state->Heartbeat(session, HeartbeatFromProto(hb));
  }

  // --- admin API ---
  absl::StatusOr<v1::VersionedGateConfig> GetGateConfig(const std::string& job_id) {
    return GetGateConfigView(*state, *store, job_id);
  }
  absl::StatusOr<v1::VersionedGateConfig> UpdateGateConfig(const v1::UpdateGateConfigRequest& r,
                                                           const AuditContext& audit = {"test"}) {
    return store->UpdateGateConfig(r, audit);
  }
  absl::StatusOr<v1::VersionedGateConfig> RollbackGateConfig(
      const v1::RollbackGateConfigRequest& r, const AuditContext& audit = {"test"}) {
    return store->RollbackGateConfig(r, audit);
  }
  absl::StatusOr<v1::ListConfigHistoryResponse> ListConfigHistory(
      const v1::ListConfigHistoryRequest& r) {
    return store->ListConfigHistory(r);
  }
  absl::Status ReloadConfigFile(const v1::GateConfig& file_layer) {
    return store->ReloadConfigFile(file_layer);
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) {
    return GetJobView(*state, *store, job_id);
  }
  v1::ListJobsResponse ListJobs() { return ListJobsView(*state); }
  absl::StatusOr<v1::Pin> PinMode(const v1::PinModeRequest& r,
                                  const AuditContext& audit = {"test"}) {
    return PinModeView(*state, *store, r, audit);
  }
  absl::StatusOr<v1::UnpinResponse> Unpin(const v1::UnpinRequest& r,
                                          const AuditContext& audit = {"test"}) {
    return UnpinView(*state, *store, r, audit);
  }
  absl::StatusOr<v1::EvaluateGatesResponse> EvaluateGates(const v1::EvaluateGatesRequest& r) {
    return EvaluateGatesView(*state, *store, r);
  }
  void Sweep() { state->Sweep(); }
  absl::Status Flush() { return store->Flush(); }

 private:
  std::unique_ptr<Metrics> own_metrics_;  // before the state: destroyed after it

 public:
  std::unique_ptr<OperatorStore> store;
  std::unique_ptr<GateState> state;

 private:
  StateHarness() = default;
  std::map<std::pair<std::string, int>, std::string> leaders_;  // (job, group) -> session
};

// One Metrics for a process that builds many harnesses (the fuzzers build one per input):
// a job's series go with its state, so nothing piles up across harnesses.
inline Metrics& SharedMetrics() {
  static Metrics* const metrics = new Metrics();
  return *metrics;
}

// Records the config pushes a stream would send, as the wire messages.
class RecordingSink : public SessionSink {
 public:
  void PushConfig(const ConfigPush& push) override { updates.push_back(ToProto(push)); }
  void PushLearned(const ThroughputTable& table) override { learned.push_back(table); }
  void End(const absl::Status& status) override { ended.push_back(status); }
  std::vector<v1::ConfigUpdate> updates;
  std::vector<ThroughputTable> learned;
  std::vector<absl::Status> ended;  // what the stream would have been finished with
};

}  // namespace spgate::server

#endif  // SPGATE_TESTS_SERVER_STATE_HARNESS_H_
