// The gRPC services: thin callback services that translate proto <-> the live state
// (GateState) and the operator store (OperatorStore), and absl::Status -> grpc::Status
// (proto/grpc_status.h). No gate logic lives here; admin views are built in job_views.h.
#ifndef SPGATE_SERVER_SERVICES_H_
#define SPGATE_SERVER_SERVICES_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/admin_auth.h"
#include "server/gate_state.h"
#include "server/metrics.h"
#include "server/operator_store.h"
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
  // Ends the streams opened before `cutoff` that have sent no first message, and counts
  // them (limit="first_message"); returns how many (docs/design.md §10).
  int ExpireSilent(absl::Time cutoff, Metrics& metrics);
  int size();

 private:
  Mutex mu_;
  std::vector<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int admitted_ ABSL_GUARDED_BY(mu_) = 0;
  int admitted_watch_ ABSL_GUARDED_BY(mu_) = 0;
  int max_streams_ ABSL_GUARDED_BY(mu_) = 1 << 30;
  int max_watch_streams_ ABSL_GUARDED_BY(mu_) = 1 << 30;
};

class GateServiceImpl final : public v1::GateService::CallbackService {
 public:
  // `worker_token`: when not empty, every call must carry "authorization: Bearer <it>".
  GateServiceImpl(GateState* state, Metrics& metrics, StreamRegistry* streams,
                  std::string worker_token = "")
      : state_(state), metrics_(metrics), streams_(streams), worker_token_(std::move(worker_token)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage>* Connect(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* ctx,
                                   const v1::DecideRequest* request,
                                   v1::Decision* response) override;

 private:
  absl::Status AuthorizeWorker(grpc::CallbackServerContext* ctx) const;

  GateState* state_;
  Metrics& metrics_;
  StreamRegistry* streams_;
  std::string worker_token_;
};

class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  AdminServiceImpl(GateState* state, OperatorStore* store, Metrics& metrics,
                   StreamRegistry* streams, AdminAuthConfig auth)
      : state_(state), store_(store), metrics_(metrics), streams_(streams), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* GetGateConfig(grpc::CallbackServerContext* ctx,
                                          const v1::GetGateConfigRequest* request,
                                          v1::VersionedGateConfig* response) override;
  grpc::ServerUnaryReactor* UpdateGateConfig(grpc::CallbackServerContext* ctx,
                                             const v1::UpdateGateConfigRequest* request,
                                             v1::VersionedGateConfig* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* PinMode(grpc::CallbackServerContext* ctx,
                                    const v1::PinModeRequest* request, v1::Pin* response) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* ctx,
                                  const v1::UnpinRequest* request,
                                  v1::UnpinResponse* response) override;
  grpc::ServerWriteReactor<v1::Decision>* WatchDecisions(
      grpc::CallbackServerContext* ctx, const v1::WatchDecisionsRequest* request) override;
  grpc::ServerUnaryReactor* EvaluateGates(grpc::CallbackServerContext* ctx,
                                          const v1::EvaluateGatesRequest* request,
                                          v1::EvaluateGatesResponse* response) override;
  grpc::ServerUnaryReactor* ListConfigHistory(grpc::CallbackServerContext* ctx,
                                              const v1::ListConfigHistoryRequest* request,
                                              v1::ListConfigHistoryResponse* response) override;
  grpc::ServerUnaryReactor* RollbackGateConfig(grpc::CallbackServerContext* ctx,
                                               const v1::RollbackGateConfigRequest* request,
                                               v1::VersionedGateConfig* response) override;
  grpc::ServerUnaryReactor* ForgetJob(grpc::CallbackServerContext* ctx,
                                      const v1::ForgetJobRequest* request,
                                      v1::ForgetJobResponse* response) override;

 private:
  // The caller's credentials from the metadata and the TLS handshake, judged by
  // AuthorizeAdminCall (server/admin_auth.h) for `method`'s kind (AdminCallKind).
  absl::StatusOr<Principal> Authorize(grpc::CallbackServerContext* ctx, absl::string_view method);
  // spgate_config_updates_total by result, for UpdateGateConfig and RollbackGateConfig.
  void CountConfigUpdate(const absl::Status& status);

  GateState* state_;
  OperatorStore* store_;
  Metrics& metrics_;
  StreamRegistry* streams_;
  const AdminAuthConfig auth_;
};

// Call after every server's Shutdown has returned, before freeing what the services use.
// Shutdown returns only once every callback has returned, but it learns that through
// gRPC's uninstrumented queues, so ThreadSanitizer would see the daemon freeing its
// state (Metrics, the services) as racing with the last callbacks. Under TSan every
// handler, reactor callback and reactor constructor ends with a release on one counter,
// and this acquires it; without TSan it compiles to nothing.
void SyncWithFinishedCallbacks();

}  // namespace spgate::server

#endif  // SPGATE_SERVER_SERVICES_H_
