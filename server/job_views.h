// Proto <-> domain beside the services: the worker messages' conversions, and the admin
// API's answers, each of which asks the live state (gate_state.h) and the operator store
// (operator_store.h) and builds the wire message. The services stay translation only,
// and neither the state nor the store builds views. No gate logic lives here.
//
// Usage (in a handler):
//   absl::StatusOr<v1::Job> job = GetJobView(*state, *store, request.job_id());
#ifndef SPGATE_SERVER_JOB_VIEWS_H_
#define SPGATE_SERVER_JOB_VIEWS_H_

#include "absl/status/statusor.h"
#include "server/gate_state.h"
#include "server/operator_store.h"
#include "spgate/v1/admin.pb.h"
#include "spgate/v1/gate.pb.h"

namespace spgate::server {

// Worker messages. The domain values view the message (spans, string_views): keep the
// message alive while they are used.
PlanInput PlanFromProto(const v1::BatchPlan& plan);
TelemetryRecord TelemetryFromProto(const v1::StepTelemetry& telemetry);
// INVALID_ARGUMENT for a layout whose schedule is unknown, coordinates without a layout,
// more than kMaxSpRequiredFeatures features.
absl::StatusOr<RegisterInput> RegisterFromProto(const v1::RegisterRequest& request);
v1::RegisterResponse ToProto(const RegisterResult& result);
HeartbeatInput HeartbeatFromProto(const v1::Heartbeat& heartbeat);
v1::ConfigUpdate ToProto(const ConfigPush& push);
void ToProto(const DecisionRecord& d, v1::Decision* out);

absl::StatusOr<v1::VersionedGateConfig> GetGateConfigView(const GateState& state,
                                                           const OperatorStore& store,
                                                           const std::string& job_id);
v1::ListJobsResponse ListJobsView(const GateState& state);
absl::StatusOr<v1::Job> GetJobView(const GateState& state, const OperatorStore& store,
                                   const std::string& job_id);
absl::StatusOr<v1::EvaluateGatesResponse> EvaluateGatesView(const GateState& state,
                                                            const OperatorStore& store,
                                                            const v1::EvaluateGatesRequest& r);

// PinMode. The job and group need not have registered yet: the pin is kept with the
// job's operator settings and applies from the group's first decision, if it has not
// expired by then; the answer's `pending` says so. What is checked is what Register
// would refuse: the job id, a group outside [0, --max_groups_per_job), and the pin's
// own mode and duration (OperatorStore::ValidatePinRequest).
absl::StatusOr<v1::Pin> PinModeView(const GateState& state, OperatorStore& store,
                                    const v1::PinModeRequest& r, const AuditContext& audit);
// Unpin: NOT_FOUND only when the daemon holds nothing for the job (no live state and no
// operator settings); a group that has not registered may still hold a pin to remove.
absl::StatusOr<v1::UnpinResponse> UnpinView(const GateState& state, OperatorStore& store,
                                            const v1::UnpinRequest& r, const AuditContext& audit);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_JOB_VIEWS_H_
