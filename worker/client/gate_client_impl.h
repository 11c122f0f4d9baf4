// GateClient's insides, shared by its two files: GateClient::Impl (one mutex, mu_, over
// the decision book, the telemetry buffer and the connection state) and ConnectReactor
// (the Connect stream's reactions, on gRPC's threads). gate_client.cc holds the training
// thread's calls and the public handle, gate_client_stream.cc the connection (Register,
// the stream, reconnects, heartbeats) and the writes. Internal: only those two include it.
//
// Invariant: every member marked ABSL_GUARDED_BY(mu_) is read and written under mu_; what
// a write sends is gathered under it and serialised outside it (ClaimWriteLocked,
// IssueWrite), so the training thread never waits behind gRPC.
#ifndef SPGATE_WORKER_CLIENT_GATE_CLIENT_IMPL_H_
#define SPGATE_WORKER_CLIENT_GATE_CLIENT_IMPL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "worker/client/client_runtime.h"
#include "worker/client/decision_book.h"
#include "worker/client/gate_client.h"
#include "worker/client/wire.h"

namespace spgate::client {

class ConnectReactor;

class GateClient::Impl : public std::enable_shared_from_this<GateClient::Impl> {
 public:
  explicit Impl(GateClientOptions options);

  void Start();
  void Shutdown();

  absl::Status SubmitPlan(const BatchPlanInput& plan);
  absl::StatusOr<GateDecision> AwaitDecision(int64_t step, absl::Time deadline);
  absl::Status ReportTelemetry(const StepTelemetryInput& t);
  absl::Status ObserveGroupRsWaitShare(int64_t step, Mode mode, double share);
  absl::Status Flush(absl::Duration timeout);
  absl::Status WaitUntilConnected(absl::Duration timeout);
  GateClientStats stats() const;
  std::vector<GateClient::DecisionLatency> TakeDecisionLatencies() {
    spgate::MutexLock lock(&mu_);
    return std::exchange(latencies_, {});
  }
  ScheduledConfig ConfigFor(int64_t step) const {
    spgate::MutexLock lock(&mu_);
    return book_.ConfigFor(step);
  }
  const GateClientOptions& options() const { return opts_; }

  // Reactor callbacks (gRPC threads).
  void OnDaemonMessage(ConnectReactor* r, const v1::DaemonMessage& msg);
  void OnStreamBroken(ConnectReactor* r);
  void OnWriteDone(ConnectReactor* r, bool ok);
  void OnStreamDone(ConnectReactor* r, const grpc::Status& status);

 private:
  struct RegisterCall {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    v1::RegisterResponse resp;
  };

  bool remote() const { return stub_ != nullptr; }
  bool StreamOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reactor_ != nullptr && !stream_dead_;
  }
  bool HasOutgoingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Outgoing GatherLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes are claimed under mu_ (write_in_flight_, the gathered content) and issued
  // outside it: serialisation and gRPC's StartWrite never run under the lock the
  // training thread takes (but a stream's first write, IssueWriteLocked); the plans are
  // let go of under it. The claimed reactor cannot go away meanwhile (writer hold).
  struct ClaimedWrite {
    ConnectReactor* reactor = nullptr;
    Outgoing out;
  };
  ClaimedWrite ClaimWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serialises `w` outside mu_, lets go of its plans under mu_ (the book recycles records
  // whose last reference it holds) and starts the write.
  void IssueWrite(ClaimedWrite w) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, under mu_ (a stream's first write).
  void IssueWriteLocked(ClaimedWrite w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseHoldIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the runtime thread to write what is pending, unless a write will pick it up.
  void KickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pump();
  void Reconnect();
  void StartRegister();
  void OnRegisterDone(const std::shared_ptr<RegisterCall>& call, const grpc::Status& s);
  void StartStream();
  void HeartbeatTick(uint64_t stream_id);
  void EndSessionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleReconnectLocked(absl::Duration delay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration BackoffLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyConfigLocked(const v1::VersionedGateConfig& vc, int64_t effective_from_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SessionReplacedLocked(const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this rank's session was replaced (", stats_.last_error, ")"));
  }
  // Records whether `s` refused this client: its credential (a Register's or a stream's
  // end), or its registration's fields (a Register's INVALID_ARGUMENT, `register_call`).
  void NoteRefusalLocked(const grpc::Status& s, bool register_call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Flush and WaitUntilConnected return while refused: the daemon's own code.
  absl::Status RefusedLocked(const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GateClientOptions opts_;
  std::shared_ptr<internal::ClientRuntime> runtime_;  // null without a controller
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GateService::Stub> stub_;

  mutable spgate::Mutex mu_;
  spgate::CondVar cv_;  // decisions, stream state changes, acks

  DecisionBook book_ ABSL_GUARDED_BY(mu_);
  bool rs_wait_explicit_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<StepTelemetryInput> telemetry_ ABSL_GUARDED_BY(mu_);
  std::vector<GateClient::DecisionLatency> latencies_ ABSL_GUARDED_BY(mu_);

  // Connection.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Another process holds this rank's seat (OnStreamDone): no stream, no Register, ever.
  bool session_replaced_ ABSL_GUARDED_BY(mu_) = false;
  // PERMISSION_DENIED or UNAUTHENTICATED while the daemon's latest answer (a Register's,
  // a stream's end) refused this client's credential — the worker token, the client
  // certificate, the launch credential; INVALID_ARGUMENT while its latest Register refused
  // a field (a group past --max_groups_per_job, a layout the job's differs from);
  // UNIMPLEMENTED while the controller answered Register without a worker API; else OK.
  // The client still retries with backoff; any other answer clears it. Flush and
  // WaitUntilConnected return at once while it is set: nothing is delivered meanwhile.
  absl::StatusCode refused_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RegisterCall> register_call_ ABSL_GUARDED_BY(mu_);
  ConnectReactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_dead_ ABSL_GUARDED_BY(mu_) = true;
  bool confirmed_ ABSL_GUARDED_BY(mu_) = false;  // the daemon answered on this stream
  bool first_write_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = true;
  bool kick_posted_ ABSL_GUARDED_BY(mu_) = false;
  bool flush_timer_set_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_due_ ABSL_GUARDED_BY(mu_) = false;
  bool reconnect_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  int attempt_ ABSL_GUARDED_BY(mu_) = 0;
  int not_found_streak_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  // When the last heartbeat went out. A write with plans or telemetry carries one once
  // half an interval has passed, and the timer sends one of its own only after 1.5
  // intervals without, so a client that writes anyway adds no message for heartbeats.
  absl::Time last_heartbeat_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);

  // Telemetry accounting: per session (the daemon's ack counts per session) and closed
  // sessions' totals.
  int64_t session_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t session_acked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t closed_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t closed_acked_ ABSL_GUARDED_BY(mu_) = 0;
  // Local decisions and memory overrides a daemon has counted. A heartbeat reports the
  // book's counts less `reported_base_`, what the daemon of an earlier session
  // acknowledged, so that a new session (a daemon restarted, or one that forgot the
  // session) counts only what it has not: the daemon adds each session's increase from 0.
  // Each heartbeat written on the stream leaves its counts in `unacked_heartbeats_`
  // under its seq; an ack names the newest heartbeat it answers (acks queued behind a
  // daemon's write are merged), which moves that one's counts to `acked_counts_` and
  // drops it and every one before it.
  struct SentHeartbeat {
    int64_t seq = 0;
    HeartbeatCounts counts;
  };
  HeartbeatCounts reported_base_ ABSL_GUARDED_BY(mu_);
  HeartbeatCounts acked_counts_ ABSL_GUARDED_BY(mu_);
  std::deque<SentHeartbeat> unacked_heartbeats_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeat_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the stream's heartbeats so far
  GateClientStats stats_ ABSL_GUARDED_BY(mu_);
};

class ConnectReactor final
    : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::DaemonMessage> {
 public:
  explicit ConnectReactor(std::shared_ptr<GateClient::Impl> owner) : owner_(std::move(owner)) {}

  void OnReadDone(bool ok) override {
    if (!ok) {
      owner_->OnStreamBroken(this);
      return;
    }
    owner_->OnDaemonMessage(this, in);
    in.Clear();
    StartRead(&in);
  }
  void OnWriteDone(bool ok) override { owner_->OnWriteDone(this, ok); }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<GateClient::Impl> owner = std::move(owner_);
    owner->OnStreamDone(this, status);
    delete this;
  }

  grpc::ClientContext ctx;
  v1::WorkerMessage out;  // the one write in flight
  v1::DaemonMessage in;

 private:
  std::shared_ptr<GateClient::Impl> owner_;
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_GATE_CLIENT_IMPL_H_
