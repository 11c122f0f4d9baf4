// The gRPC services: thin callback services that translate proto <-> the live state
// (GateState) and the operator store (OperatorStore), and absl::Status -> grpc::Status
// (proto/grpc_status.h). No gate logic lives here; admin views are built in job_views.h.
// Every method parses its own requests (raw_service.h), so a request that does not parse
// is INVALID_ARGUMENT naming its message and a call that never sends one is ended.
#ifndef SPGATE_SERVER_SERVICES_H_
#define SPGATE_SERVER_SERVICES_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/admin_auth.h"
#include "server/gate_state.h"
#include "server/metrics.h"
#include "server/operator_store.h"
#include "server/raw_service.h"
#include "server/worker_auth.h"
#include "spgate/v1/admin.grpc.pb.h"
#include "spgate/v1/gate.grpc.pb.h"

namespace spgate::server {

// Tracks live streams so a graceful shutdown can end them with UNAVAILABLE, and admits
// new ones under the stream limits (docs/design.md §10): Connect and WatchDecisions
// streams together at most `max_streams`, WatchDecisions at most `max_watch_streams`.
class StreamRegistry {
 public:
  class Stream {
   public:
    virtual ~Stream() = default;
    virtual void Drain() = 0;  // finish with UNAVAILABLE soon; must not block
    // Ends the stream (soon; must not block) when it was opened before `cutoff` and has
    // not yet named its session; true when it did.
    virtual bool ExpireIfSilentSince(absl::Time cutoff) { return false; }
  };
  enum class Kind { kConnect, kWatch };

  void SetLimits(int max_streams, int max_watch_streams);
  // Reserves a slot for a new stream: nullopt, or the limit that is reached (nothing
  // reserved). Every admitted stream gives its slot back with Remove.
  std::optional<Limit> Admit(Kind kind);
  void Add(Stream* s);
  void Remove(Stream* s, Kind kind);
  void DrainAll();
  // Ends the streams opened before `cutoff` that have sent no first message, and the
  // calls that have sent no request, and counts them (limit="first_message"); returns
  // how many (docs/design.md §10).
  int ExpireSilent(absl::Time cutoff, Metrics& metrics);
  int size();
  // Unary calls (and WatchDecisions) waiting for their request.
  PendingCalls& pending_calls() { return pending_; }

 private:
  PendingCalls pending_;
  Mutex mu_;
  std::vector<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int admitted_ ABSL_GUARDED_BY(mu_) = 0;
  int admitted_watch_ ABSL_GUARDED_BY(mu_) = 0;
  int max_streams_ ABSL_GUARDED_BY(mu_) = 1 << 30;
  int max_watch_streams_ ABSL_GUARDED_BY(mu_) = 1 << 30;
};

// GateService: Register, Connect, Decide, each parsing its own requests (raw_service.h).
class GateServiceImpl final : public RawService {
 public:
  // `worker_auth`: who may act for which job (server/worker_auth.h); empty: anyone.
  GateServiceImpl(GateState* state, Metrics& metrics, StreamRegistry* streams,
                  WorkerAuthConfig worker_auth = {});

 private:
  absl::StatusOr<v1::RegisterResponse> Register(grpc::CallbackServerContext* ctx,
                                                const v1::RegisterRequest& request);
  RawReactor* Connect(grpc::CallbackServerContext* ctx);
  absl::StatusOr<v1::Decision> Decide(grpc::CallbackServerContext* ctx,
                                      const v1::DecideRequest& request);
  // The caller's credentials (CallerCredentialsOf) judged by AuthorizeWorkerCall for
  // `job_id`, the job the call acts for.
  absl::Status AuthorizeWorker(grpc::CallbackServerContext* ctx, std::string_view job_id,
                               JobNamedBy named_by = JobNamedBy::kCaller) const;
  // Only who the caller is (AuthenticateWorker), where the job is not known yet.
  absl::Status AuthenticateWorker(grpc::CallbackServerContext* ctx) const;
  // `s`, counted in spgate_worker_refusals_total{reason="worker_credential"} if a refusal.
  absl::Status CountRefused(absl::Status s) const;

  GateState* state_;
  Metrics& metrics_;
  StreamRegistry* streams_;
  const WorkerAuthConfig worker_auth_;
};

// AdminService, each method parsing its own requests (raw_service.h).
class AdminServiceImpl final : public RawService {
 public:
  AdminServiceImpl(GateState* state, OperatorStore* store, Metrics& metrics,
                   StreamRegistry* streams, AdminAuthConfig auth);

 private:
  // The caller's credentials from the metadata and the TLS handshake, judged by
  // AuthorizeAdminCall (server/admin_auth.h) for `method`'s kind (AdminCallKind).
  absl::StatusOr<Principal> Authorize(grpc::CallbackServerContext* ctx, absl::string_view method);
  // UpdateGateConfig and RollbackGateConfig: authorize `method` (a refusal counts as
  // result="denied"), run `change` as the principal, count its result.
  absl::StatusOr<v1::VersionedGateConfig> ChangeConfig(
      grpc::CallbackServerContext* ctx, absl::string_view method,
      const std::function<absl::StatusOr<v1::VersionedGateConfig>(const AuditContext&)>& change);
  absl::StatusOr<v1::Pin> PinMode(grpc::CallbackServerContext* ctx, const v1::PinModeRequest& r);
  absl::StatusOr<v1::UnpinResponse> Unpin(grpc::CallbackServerContext* ctx,
                                          const v1::UnpinRequest& r);
  // spgate_config_updates_total by result, for UpdateGateConfig and RollbackGateConfig.
  void CountConfigUpdate(const absl::Status& status);

  GateState* state_;
  OperatorStore* store_;
  Metrics& metrics_;
  StreamRegistry* streams_;
  const AdminAuthConfig auth_;
  // WatchDecisions' authorization and admission, run once its request has arrived.
  std::function<absl::Status(grpc::CallbackServerContext*, const v1::WatchDecisionsRequest&)>
      watch_start_;
};

// SyncWithFinishedCallbacks (call it after every server's Shutdown): raw_service.h.

}  // namespace spgate::server

#endif  // SPGATE_SERVER_SERVICES_H_
