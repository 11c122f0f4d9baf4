// GateClient: Register + one Connect stream (gRPC callback API) and the telemetry
// buffer, around the leader's decision book (decision_book.h: plans, daemon answers and
// the fail-static fallback). Messages and the channel are built in wire.h. See
// gate_client.h.
//
// Concurrency model. One mutex (mu_) guards all client state. The stream is a
// ClientBidiReactor whose reactions run on gRPC's threads; at most one write is in flight
// and its message buffer belongs to the reactor. The reactor holds a "writer hold" until
// the stream is dead and no write is in flight, so code that saw `reactor_ != nullptr &&
// !hold_released_` under mu_ may start a write or cancel it: OnDone (which deletes the
// reactor) cannot run before the hold is removed. gRPC never runs reactions inline from
// StartWrite/TryCancel (can_inline=false), so calling them under mu_ cannot deadlock;
// still, messages are serialised and written outside mu_ (ClaimWriteLocked/IssueWrite),
// because the training thread takes mu_ and must never wait behind gRPC.
#include "worker/client/gate_client.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "policy/gate_policy.h"
#include "policy/telemetry.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "worker/client/client_runtime.h"
#include "worker/client/decision_book.h"
#include "worker/client/identity.h"
#include "worker/client/wire.h"

namespace spgate::client {
namespace {

absl::Status ValidateOptions(const GateClientOptions& o) {
  auto bad = [](std::string msg) { return absl::InvalidArgumentError(std::move(msg)); };
  if (!o.controller.empty() && o.job_id.empty()) return bad("job_id must be set");
  if (!o.controller.empty() && o.incarnation.empty()) {
    return bad("incarnation must be set: one value per launch of the job, the same on every "
               "rank (IncarnationFromEnvironment(), or one made by world rank 0 and broadcast)");
  }
  if (!o.controller.empty()) {
    if (o.launch_credential.empty()) {
      return bad("launch_credential must be set: the launch's secret, the same on every rank "
                 "(SPGATE_LAUNCH_CREDENTIAL, or NewLaunchCredential() on world rank 0, "
                 "broadcast over the job's communicator)");
    }
    RETURN_IF_ERROR(CheckLaunchCredential(o.launch_credential));
  }
  if (o.group < 0) return bad(absl::StrCat("group must be >= 0, got ", o.group));
  if (o.group_size < 1) return bad(absl::StrCat("group_size must be >= 1, got ", o.group_size));
  if (o.rank_in_group < 0 || o.rank_in_group >= o.group_size) {
    return bad(absl::StrFormat("rank_in_group must be in [0, %d), got %d", o.group_size,
                               o.rank_in_group));
  }
  if (o.group_session && o.rank_in_group != 0 && !o.controller.empty()) {
    return bad(absl::StrFormat(
        "rank_in_group %d: with group_session (the default) only the group's leader talks to "
        "spgated; give this rank's telemetry to GroupDecider::ReportTelemetry and create no "
        "client here, or set group_session=false for a session per rank",
        o.rank_in_group));
  }
  if (absl::Status s = ValidateGateConfig(o.initial_config); !s.ok()) {
    return bad(absl::StrCat("initial_config: ", s.message()));
  }
  if (o.decision_deadline < absl::ZeroDuration()) return bad("decision_deadline must be >= 0");
  if (o.rpc_timeout <= absl::ZeroDuration()) return bad("rpc_timeout must be > 0");
  if (o.initial_backoff <= absl::ZeroDuration() || o.max_backoff < o.initial_backoff) {
    return bad("backoff: need 0 < initial_backoff <= max_backoff");
  }
  if (!(o.backoff_jitter >= 0.0 && o.backoff_jitter < 1.0)) {
    return bad("backoff_jitter must be in [0, 1)");
  }
  if (o.keepalive_time < absl::Seconds(1) || o.keepalive_timeout <= absl::ZeroDuration()) {
    return bad("keepalive_time must be >= 1s and keepalive_timeout > 0");
  }
  if (o.telemetry_buffer < 1 || o.max_telemetry_per_message < 1 || o.max_pending_plans < 1) {
    return bad("telemetry_buffer, max_telemetry_per_message and max_pending_plans must be >= 1");
  }
  if (o.telemetry_flush_interval < absl::ZeroDuration()) {
    return bad("telemetry_flush_interval must be >= 0");
  }
  if (o.layout.has_value()) {
    RETURN_IF_ERROR(ValidateJobLayout(*o.layout));
    if (o.layout->tp != o.group_size) {
      return bad(absl::StrFormat("layout.tp: %d, but group_size is %d", o.layout->tp,
                                 o.group_size));
    }
    RETURN_IF_ERROR(ValidateCoordinates(*o.layout, o.coordinates));
    if (const int64_t g = GroupOf(*o.layout, o.coordinates); g != o.group) {
      return bad(absl::StrFormat(
          "group: %d, but coordinates (dp_index=%d, stage=%d, cp_rank=%d) are group %d",
          o.group, o.coordinates.dp_index, o.coordinates.stage, o.coordinates.cp_rank, g));
    }
  }
  if (o.sp_required.size() > static_cast<size_t>(kMaxSpRequiredFeatures)) {
    return bad(absl::StrFormat("sp_required: at most %d features", kMaxSpRequiredFeatures));
  }
  for (const std::string& f : o.sp_required) RETURN_IF_ERROR(ValidateSpRequiredFeature(f));
  return absl::OkStatus();
}

}  // namespace

class ConnectReactor;

class GateClient::Impl : public std::enable_shared_from_this<GateClient::Impl> {
 public:
  explicit Impl(GateClientOptions options);

  void Start();
  void Shutdown();

  absl::Status SubmitPlan(const BatchPlanInput& plan);
  absl::StatusOr<GateDecision> AwaitDecision(int64_t step, absl::Time deadline);
  absl::Status ReportTelemetry(const StepTelemetryInput& t);
  void ObserveGroupRsWaitShare(int64_t step, Mode mode, double share);
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
  // training thread takes. The claimed reactor cannot go away meanwhile (writer hold).
  struct ClaimedWrite {
    ConnectReactor* reactor = nullptr;
    Outgoing out;
  };
  ClaimedWrite ClaimWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueWrite(ClaimedWrite w);
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
  // The step's own plan, while it is the last committed, bounds its tokens as it does at
  // the daemon (docs/design.md §2, "Range rules").
  if (const TelemetryBounds bounds = book_.TelemetryBoundsFor(t.step);
      bounds.plan_tokens >= 0 || !bounds.microbatch_tokens.empty()) {
    RETURN_IF_ERROR(ValidateStepTelemetry(TelemetryValues(t), bounds));
    RETURN_IF_ERROR(ValidateMicrobatchTelemetry(t.microbatches, 0, bounds));
  }
  // sessions' totals.
  int64_t session_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t session_acked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t closed_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t closed_acked_ ABSL_GUARDED_BY(mu_) = 0;
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

GateClient::Impl::Impl(GateClientOptions options)
    : opts_(std::move(options)),
      book_(opts_.initial_config, opts_.max_pending_plans,
            opts_.controller.empty() ? DecisionSource::kLocalOnly : DecisionSource::kFallback,
            BookLayout{.layout = opts_.layout,
                       .stage = opts_.coordinates.stage,
                       .sp_required = !opts_.sp_required.empty()}),
      rng_(opts_.seed != 0 ? opts_.seed : std::random_device{}()) {
  if (opts_.controller.empty()) return;
  runtime_ = internal::ClientRuntime::Get();
  channel_ = opts_.channel != nullptr ? opts_.channel : CreateGateChannel(opts_);
  stub_ = v1::GateService::NewStub(channel_);
}

void GateClient::Impl::Start() {
  if (!remote()) return;
  spgate::MutexLock lock(&mu_);
  ScheduleReconnectLocked(absl::ZeroDuration());
}

void GateClient::Impl::Shutdown() {
  if (!remote()) return;
  spgate::MutexLock lock(&mu_);
  closing_ = true;
  if (register_call_ != nullptr) register_call_->ctx.TryCancel();
  if (reactor_ != nullptr && !hold_released_) reactor_->ctx.TryCancel();
  cv_.SignalAll();
  // gRPC completes cancelled calls promptly; the bound only guards against a wedged
  // library (then the callbacks still own the Impl through their shared_ptr).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((reactor_ != nullptr || register_call_ != nullptr) && absl::Now() < deadline) {
    cv_.WaitWithDeadline(&mu_, deadline);
  }
}

// ---- Connection management -------------------------------------------------------

absl::Duration GateClient::Impl::BackoffLocked() {
  const int exp = std::min(attempt_, 30);
  absl::Duration d = std::min(opts_.initial_backoff * static_cast<double>(int64_t{1} << exp),
                              opts_.max_backoff);
  std::uniform_real_distribution<double> jitter(1.0 - opts_.backoff_jitter,
                                                1.0 + opts_.backoff_jitter);
  ++attempt_;
  return d * jitter(rng_);
}

void GateClient::Impl::ScheduleReconnectLocked(absl::Duration delay) {
  if (closing_ || reconnect_scheduled_ || session_replaced_) return;
  reconnect_scheduled_ = true;
  runtime_->RunAt(absl::Now() + delay, [w = weak_from_this()] {
    if (auto self = w.lock()) self->Reconnect();
  });
}

void GateClient::Impl::Reconnect() {
  bool need_register;
  {
    spgate::MutexLock lock(&mu_);
    reconnect_scheduled_ = false;
    if (closing_ || reactor_ != nullptr || register_call_ != nullptr) return;
    need_register = session_id_.empty();
  }
  if (need_register) {
    StartRegister();
  } else {
    StartStream();
  }
}

void GateClient::Impl::StartRegister() {
  auto call = std::make_shared<RegisterCall>();
  call->req = BuildRegisterRequest(opts_);
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + opts_.rpc_timeout));
  if (!opts_.worker_token.empty()) {
    call->ctx.AddMetadata("authorization", "Bearer " + opts_.worker_token);
  }
  {
    spgate::MutexLock lock(&mu_);
    if (closing_) return;
    register_call_ = call;
  }
  stub_->async()->Register(&call->ctx, &call->req, &call->resp,
                           [self = shared_from_this(), call](grpc::Status s) {
                             self->OnRegisterDone(call, s);
                           });
}

void GateClient::Impl::ApplyConfigLocked(const v1::VersionedGateConfig& vc,
                                         int64_t effective_from_step) {
  const GateConfig config = LayerGateConfig(GateConfig{}, vc.config());
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) {
    // The daemon validates what it serves; a bad config here is a bug there. Keep
    // deciding with the last good one rather than with nonsense.
    stats_.last_error = absl::StrCat("ignored invalid config from daemon: ", s.message());
    return;
  }
  // Decisions carry the effective version (global and job scopes share one counter).
  book_.ScheduleConfig(config, vc.effective_version(), effective_from_step);
}

void GateClient::Impl::OnRegisterDone(const std::shared_ptr<RegisterCall>& call,
                                      const grpc::Status& s) {
  {
    spgate::MutexLock lock(&mu_);
    if (register_call_ == call) register_call_ = nullptr;
    cv_.SignalAll();
    if (closing_) return;
    if (!s.ok()) {
      stats_.last_error = absl::StrCat("Register: ", FromGrpcStatus(s).ToString());
      ScheduleReconnectLocked(BackoffLocked());
      return;
    }
    const v1::RegisterResponse& r = call->resp;
    session_id_ = r.session_id();
    session_sent_ = session_acked_ = 0;
    ++stats_.registrations;
    stats_.last_decided_step = r.last_decided_step();
    if (r.has_heartbeat_interval()) {
      const absl::Duration hb = absl::Seconds(r.heartbeat_interval().seconds()) +
                                absl::Nanoseconds(r.heartbeat_interval().nanos());
      heartbeat_interval_ = std::clamp(hb, absl::Milliseconds(50), absl::Seconds(60));
    }
    if (r.has_config()) ApplyConfigLocked(r.config(), r.effective_from_step());
  }
  StartStream();
}

void GateClient::Impl::StartStream() {
  spgate::MutexLock lock(&mu_);
  if (closing_ || reactor_ != nullptr || session_id_.empty()) return;
  auto* r = new ConnectReactor(shared_from_this());
  reactor_ = r;
  ++stream_id_;
  ++stats_.streams_opened;
  stream_dead_ = false;
  confirmed_ = false;
  hold_released_ = false;
  first_write_ = true;
  heartbeat_due_ = true;  // the first message reports local decisions and asks for an ack
  if (!opts_.worker_token.empty()) {
    r->ctx.AddMetadata("authorization", "Bearer " + opts_.worker_token);
  }
  stub_->async()->Connect(&r->ctx, r);
  r->AddHold();
  r->StartRead(&r->in);
  IssueWrite(ClaimWriteLocked());  // once per stream: fine under the lock
  r->StartCall();
  runtime_->RunAt(absl::Now() + heartbeat_interval_, [w = weak_from_this(), id = stream_id_] {
    if (auto self = w.lock()) self->HeartbeatTick(id);
  });
}

void GateClient::Impl::HeartbeatTick(uint64_t stream_id) {
  ClaimedWrite w;
  {
    spgate::MutexLock lock(&mu_);
    if (closing_ || stream_id != stream_id_ || !StreamOpenLocked()) return;
    // A heartbeat of its own only after 1.5 intervals without one: a client whose writes
    // come once an interval (a step a second) carries every heartbeat on them, whichever
    // of its timer and its writes comes first in a given interval.
    const absl::Time now = absl::Now();
    const absl::Duration quiet = heartbeat_interval_ * 1.5;
    absl::Time next = last_heartbeat_ + quiet;
    if (now >= next) {
      heartbeat_due_ = true;
      w = ClaimWriteLocked();
      next = now + quiet;
    }
    runtime_->RunAt(next, [w = weak_from_this(), id = stream_id] {
      if (auto self = w.lock()) self->HeartbeatTick(id);
    });
  }
  IssueWrite(std::move(w));
}

void GateClient::Impl::EndSessionLocked() {
  closed_sent_ += session_sent_;
  closed_acked_ += session_acked_;
  session_sent_ = session_acked_ = 0;
  session_id_.clear();
}

void GateClient::Impl::OnDaemonMessage(ConnectReactor* r, const v1::DaemonMessage& msg) {
  spgate::MutexLock lock(&mu_);
  if (r != reactor_) return;
  if (!confirmed_ && !telemetry_.empty()) KickLocked();  // what waited for the answer
  confirmed_ = true;
  attempt_ = 0;
  not_found_streak_ = 0;
  for (const v1::Decision& wire : msg.decisions()) {
    const std::optional<GateDecision> d = DecisionFromProto(wire);
    if (!d.has_value()) continue;
    const PlanRecord* p = book_.OnDaemonDecision(*d);
    if (p != nullptr && latencies_.size() < 65536) {
      const double queued = absl::ToDoubleSeconds(p->taken - p->submitted);
      latencies_.push_back({.total_s = absl::ToDoubleSeconds(absl::Now() - p->submitted),
                            .queued_s = std::max(0.0, queued)});
    }
  }
  for (const v1::PlanRejection& rej : msg.rejections()) {
    // The daemon refused the plan (it names the field): no answer will come, so the
    // leader decides this step locally without waiting out the deadline.
    if (!book_.OnRejection(rej.step())) continue;
    stats_.last_error = absl::StrFormat("plan for step %d rejected: %s", rej.step(), rej.message());
  }
  if (msg.has_config_update()) {
    ApplyConfigLocked(msg.config_update().config(), msg.config_update().effective_from_step());
    ++stats_.config_updates;
  }
  if (msg.has_learned()) {
    // The ADAPTIVE fallback's table (docs/design.md §11); replaced whole.
    book_.SetLearnedTable(FromProto(msg.learned()));
    ++stats_.learned_tables;
  }
  if (msg.has_ack()) {
    session_acked_ = std::max(session_acked_, msg.ack().telemetry_received());
  }
  cv_.SignalAll();
}

void GateClient::Impl::ReleaseHoldIfIdleLocked() {
  if (reactor_ != nullptr && stream_dead_ && !write_in_flight_ && !hold_released_) {
    hold_released_ = true;
    reactor_->RemoveHold();
  }
}

void GateClient::Impl::OnStreamBroken(ConnectReactor* r) {
  spgate::MutexLock lock(&mu_);
  if (r != reactor_) return;
  stream_dead_ = true;
  confirmed_ = false;
  cv_.SignalAll();  // waiters fall back at once
  ReleaseHoldIfIdleLocked();
}

void GateClient::Impl::OnWriteDone(ConnectReactor* r, bool ok) {
  ClaimedWrite w;
  {
    spgate::MutexLock lock(&mu_);
    if (r != reactor_) return;
    write_in_flight_ = false;
    if (!ok) {
      stream_dead_ = true;
      confirmed_ = false;
      cv_.SignalAll();
    }
    if (stream_dead_) {
      ReleaseHoldIfIdleLocked();
      return;
    }
    w = ClaimWriteLocked();
  }
  IssueWrite(std::move(w));
}

void GateClient::Impl::OnStreamDone(ConnectReactor* r, const grpc::Status& status) {
  spgate::MutexLock lock(&mu_);
  if (r != reactor_) return;
  reactor_ = nullptr;
  stream_dead_ = true;
  confirmed_ = false;
  write_in_flight_ = false;
  ++stats_.stream_failures;
  stats_.last_error = absl::StrCat("Connect: ", FromGrpcStatus(status).ToString());
  cv_.SignalAll();
  if (closing_) return;
  if (status.error_code() == grpc::StatusCode::ABORTED) {
    // The daemon replaced this session: another process registered as this rank of the
    // launch (it had the launch's credential) or opened a second stream on the session.
    // That process holds the seat now. Registering again would take it back, and the
    // other would do the same, forever; so this client leaves the daemon to it and
    // decides every later step locally (docs/design.md §10).
    session_replaced_ = true;
    stats_.session_replaced = true;
    stats_.telemetry_dropped += static_cast<int64_t>(telemetry_.size());  // never to go out
    telemetry_.clear();
    EndSessionLocked();
    stats_.last_error = absl::StrFormat(
        "Connect: %s: another process now holds rank %d of group %d in this launch; not "
        "reconnecting, every later step is decided locally",
        FromGrpcStatus(status).ToString(), opts_.rank_in_group, opts_.group);
    return;
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    // The daemon does not know the session (it restarted): register again, at once the
    // first time (the daemon is evidently up), with backoff if it keeps happening.
    EndSessionLocked();
    ScheduleReconnectLocked(++not_found_streak_ == 1 ? absl::ZeroDuration() : BackoffLocked());
    return;
  }
  ScheduleReconnectLocked(BackoffLocked());
}

// ---- Writes ----------------------------------------------------------------------

bool GateClient::Impl::HasOutgoingLocked() const {
  if (heartbeat_due_ || first_write_ || (confirmed_ && !telemetry_.empty())) return true;
  for (const auto& [step, plan] : book_.plans()) {
    if (plan->sent_on_stream != stream_id_) return true;
  }
  return false;
}

Outgoing GateClient::Impl::GatherLocked() {
  Outgoing out;
  if (first_write_) {
    out.session_id = session_id_;
    first_write_ = false;
  }
  for (auto& [step, plan] : book_.plans()) {
    if (plan->sent_on_stream == stream_id_) continue;
    plan->sent_on_stream = stream_id_;
    plan->taken = absl::Now();  // the writer's thread, not the training thread
    out.plans.push_back(plan);  // handed over: the writer serialises it outside the lock
  }
  stats_.plans_sent += static_cast<int64_t>(out.plans.size());
  // Telemetry leaves the buffer only on a stream the daemon has answered: a stream
  // opened while the daemon is down fails its first write, and what that write carried
  // would be lost. Until the answer, records wait here (plans are simply sent again on
  // the next stream).
  const size_t n =
      confirmed_ ? std::min<size_t>(telemetry_.size(), opts_.max_telemetry_per_message) : 0;
  out.telemetry.assign(telemetry_.begin(), telemetry_.begin() + n);
  telemetry_.erase(telemetry_.begin(), telemetry_.begin() + n);
  session_sent_ += static_cast<int64_t>(n);
  const absl::Time now = absl::Now();
  if (!heartbeat_due_ && (n > 0 || !out.plans.empty()) &&
      now - last_heartbeat_ >= heartbeat_interval_ / 2) {
    heartbeat_due_ = true;  // rides on this write instead of a write of its own
  }
  if (heartbeat_due_) {
    last_heartbeat_ = now;
    out.heartbeat = true;
    heartbeat_due_ = false;
    out.local_decisions = book_.counters().local_decisions_by_reason;
    out.memory_overrides = book_.counters().memory_overrides;
    out.telemetry_sent = session_sent_;
  }
  return out;
}

GateClient::Impl::ClaimedWrite GateClient::Impl::ClaimWriteLocked() {
  ClaimedWrite w;
  if (!StreamOpenLocked() || write_in_flight_ || !HasOutgoingLocked()) return w;
  w.out = GatherLocked();
  if (w.out.empty()) return w;
  write_in_flight_ = true;
  w.reactor = reactor_;
  return w;
}

void GateClient::Impl::IssueWrite(ClaimedWrite w) {
  if (w.reactor == nullptr) return;
  BuildWorkerMessage(opts_, w.out, &w.reactor->out);
  w.reactor->StartWrite(&w.reactor->out);
}

void GateClient::Impl::KickLocked() {
  if (!StreamOpenLocked() || write_in_flight_ || kick_posted_) return;
  kick_posted_ = true;
  // Deferred, not posted: the caller is usually the training thread, which must not pay
  // for waking another thread; the runtime picks this up within its poll interval.
  runtime_->Defer([w = weak_from_this()] {
    if (auto self = w.lock()) self->Pump();
  });
}

void GateClient::Impl::Pump() {
  ClaimedWrite w;
  {
    spgate::MutexLock lock(&mu_);
    kick_posted_ = false;
    if (closing_) return;
    w = ClaimWriteLocked();
  }
  IssueWrite(std::move(w));
}

// ---- Training-thread API ---------------------------------------------------------

absl::Status GateClient::Impl::SubmitPlan(const BatchPlanInput& plan) {
  if (opts_.rank_in_group != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "SubmitPlan on rank %d of group %d: only the group leader (rank 0) asks for "
        "decisions",
        opts_.rank_in_group, opts_.group));
  }
  if (plan.step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("step: must be >= 0, got %d", plan.step));
  }
  PlanRecord rec;
  rec.step = plan.step;
  rec.budget = plan.memory_budget_bytes != 0 ? plan.memory_budget_bytes : opts_.memory_budget_bytes;
  RETURN_IF_ERROR(StepPlanRecord(opts_.layout ? &*opts_.layout : nullptr, plan, &rec));
  if (!opts_.layout.has_value()) {
    absl::StatusOr<LengthStats> stats = ComputeLengthStats(plan.lengths);
    if (!stats.ok()) return stats.status();
    rec.lengths.assign(plan.lengths.begin(), plan.lengths.end());
    rec.length_cv = stats->cv;
    rec.tokens = stats->tokens;
    rec.peak_sp = plan.predicted_peak_bytes_sp;
    rec.peak_tp = plan.predicted_peak_bytes_tp;
  }
  rec.submitted = absl::Now();
  auto record = std::make_shared<PlanRecord>(std::move(rec));  // allocated outside the lock

  spgate::MutexLock lock(&mu_);
  RETURN_IF_ERROR(book_.AddPlan(std::move(record)));
  if (remote()) KickLocked();
  return absl::OkStatus();
}

absl::StatusOr<GateDecision> GateClient::Impl::AwaitDecision(int64_t step, absl::Time deadline) {
  if (opts_.rank_in_group != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "AwaitDecision on rank %d of group %d: non-leaders receive the decision from the "
        "group broadcast (GroupDecider)",
        opts_.rank_in_group, opts_.group));
  }
  spgate::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::optional<GateDecision> committed, book_.Lookup(step));
  if (committed.has_value()) return *committed;  // committed: same answer
  if (remote()) {
    while (!book_.Answered(step) && StreamOpenLocked() && !closing_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
    }
  }
  return book_.Commit(step, absl::Now());
}

absl::Status GateClient::Impl::ReportTelemetry(const StepTelemetryInput& t) {
  // The daemon does not acknowledge invalid records; refusing them here, by the same
  // rules, keeps "sent minus acknowledged" a count of records lost in transit.
  RETURN_IF_ERROR(ValidateStepTelemetry(TelemetryValues(t)));
  if (!t.microbatches.empty() && !opts_.layout.has_value()) {
    return absl::InvalidArgumentError(
        "telemetry.micro_batches: only a client with a layout (step plans) reports "
        "micro-batches");
  }
  RETURN_IF_ERROR(ValidateMicrobatchTelemetry(
      t.microbatches, opts_.layout.has_value() ? opts_.layout->microbatches : 0));
  RETURN_IF_ERROR(
      ValidateGroupRecord(t.ranks, t.slowest_rank, t.peak_memory_rank, opts_.group_size));
  if (t.ranks <= 1 && opts_.group_session && opts_.group_size > 1 && remote()) {
    // The daemon would count it as one rank of the group's and never see the others.
    return absl::FailedPreconditionError(
        "telemetry: this client's session speaks for its group (group_session): report each "
        "rank's record through GroupDecider::ReportTelemetry, which sends the group's");
  }
  if (t.ranks > 1 && (opts_.rank_in_group != 0 || !opts_.group_session)) {
    return absl::FailedPreconditionError(
        "telemetry: a group record comes only from the leader's group session "
        "(rank_in_group 0, group_session)");
  }
  spgate::MutexLock lock(&mu_);
  ++stats_.telemetry_reported;
  if (opts_.rank_in_group == 0 && opts_.rs_wait_from_own_telemetry && !rs_wait_explicit_ &&
      t.step_time_s > 0) {
    book_.ObserveRsWaitShare(t.step, t.mode, t.rs_wait_s / t.step_time_s);
  }
  if (!remote() || session_replaced_) return absl::OkStatus();
  telemetry_.push_back(t);
  if (static_cast<int>(telemetry_.size()) > opts_.telemetry_buffer) {
    telemetry_.pop_front();
    ++stats_.telemetry_dropped;
  }
  if (!StreamOpenLocked() || write_in_flight_ || kick_posted_) return absl::OkStatus();
  if (static_cast<int>(telemetry_.size()) >= opts_.max_telemetry_per_message ||
      opts_.telemetry_flush_interval == absl::ZeroDuration()) {
    KickLocked();
  } else if (!flush_timer_set_) {
    flush_timer_set_ = true;
    runtime_->RunAt(absl::Now() + opts_.telemetry_flush_interval, [w = weak_from_this()] {
      if (auto self = w.lock()) {
        {
          spgate::MutexLock lock(&self->mu_);
          self->flush_timer_set_ = false;
        }
        self->Pump();
      }
    });
  }
  return absl::OkStatus();
}

void GateClient::Impl::ObserveGroupRsWaitShare(int64_t step, Mode mode, double share) {
  spgate::MutexLock lock(&mu_);
  rs_wait_explicit_ = true;
  book_.ObserveRsWaitShare(step, mode, share);
}

absl::Status GateClient::Impl::Flush(absl::Duration timeout) {
  if (!remote()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  spgate::MutexLock lock(&mu_);
  while (true) {
    if (session_replaced_) return SessionReplacedLocked("flush");
    if (confirmed_ && StreamOpenLocked() && telemetry_.empty() && !write_in_flight_ &&
        session_acked_ >= session_sent_) {
      return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline || closing_) break;
    // Ask for an ack of everything written so far; re-ask periodically in case the
    // last ack answered a heartbeat that preceded the last telemetry.
    heartbeat_due_ = true;
    KickLocked();
    cv_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(20)));
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "flush: %d telemetry records sent, %d acknowledged, %d still buffered, stream %s",
      closed_sent_ + session_sent_, closed_acked_ + session_acked_, telemetry_.size(),
      StreamOpenLocked() ? "open" : "down"));
}

absl::Status GateClient::Impl::WaitUntilConnected(absl::Duration timeout) {
  if (!remote()) return absl::FailedPreconditionError("no controller configured");
  const absl::Time deadline = absl::Now() + timeout;
  spgate::MutexLock lock(&mu_);
  while (!(confirmed_ && StreamOpenLocked())) {
    if (session_replaced_) return SessionReplacedLocked("not connected");
    if (cv_.WaitWithDeadline(&mu_, deadline)) {
      if (confirmed_ && StreamOpenLocked()) break;
      return absl::DeadlineExceededError(absl::StrCat(
          "not connected to ", opts_.controller, " after ", absl::FormatDuration(timeout),
          stats_.last_error.empty() ? "" : "; last error: ", stats_.last_error));
    }
  }
  return absl::OkStatus();
}

GateClientStats GateClient::Impl::stats() const {
  spgate::MutexLock lock(&mu_);
  GateClientStats s = stats_;
  const DecisionBookCounters& c = book_.counters();
  s.plans_submitted = c.plans_submitted;
  s.plans_dropped = c.plans_dropped;
  s.plans_rejected = c.plans_rejected;
  s.decisions_received = c.decisions_received;
  s.daemon_decisions = c.daemon_decisions;
  s.late_decisions = c.late_decisions;
  s.local_decisions = c.local_decisions;
  s.local_decisions_by_reason = c.local_decisions_by_reason;
  s.memory_overrides = c.memory_overrides;
  s.connected = confirmed_ && StreamOpenLocked();
  s.telemetry_sent = closed_sent_ + session_sent_;
  s.telemetry_acked = closed_acked_ + session_acked_;
  return s;
}

// ---- Public handle ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GateClient>> GateClient::Create(GateClientOptions options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  auto impl = std::make_shared<Impl>(std::move(options));
  impl->Start();
  return std::unique_ptr<GateClient>(new GateClient(std::move(impl)));
}

GateClient::GateClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
GateClient::~GateClient() {
  impl_->Shutdown();
  // gRPC's callback threads drop their references to the Impl just after their last
  // reaction; let them, so the channel is torn down here rather than on one of gRPC's own
  // threads (bounded: a wedged callback only delays where the Impl dies).
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (impl_.use_count() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(200));
}

absl::Status GateClient::SubmitPlan(const BatchPlanInput& plan) { return impl_->SubmitPlan(plan); }
absl::StatusOr<GateDecision> GateClient::AwaitDecision(int64_t step, absl::Time deadline) {
  return impl_->AwaitDecision(step, deadline);
}
absl::StatusOr<GateDecision> GateClient::AwaitDecision(int64_t step) {
  return impl_->AwaitDecision(step, absl::Now() + impl_->options().decision_deadline);
}
absl::Status GateClient::ReportTelemetry(const StepTelemetryInput& telemetry) {
  return impl_->ReportTelemetry(telemetry);
}
void GateClient::ObserveGroupRsWaitShare(int64_t step, Mode mode, double share) {
  impl_->ObserveGroupRsWaitShare(step, mode, share);
}
absl::Status GateClient::Flush(absl::Duration timeout) { return impl_->Flush(timeout); }
absl::Status GateClient::WaitUntilConnected(absl::Duration timeout) {
  return impl_->WaitUntilConnected(timeout);
}
GateClientStats GateClient::stats() const { return impl_->stats(); }
std::vector<GateClient::DecisionLatency> GateClient::TakeDecisionLatencies() {
  return impl_->TakeDecisionLatencies();
}
ScheduledConfig GateClient::ConfigFor(int64_t step) const { return impl_->ConfigFor(step); }
const GateClientOptions& GateClient::options() const { return impl_->options(); }

}  // namespace spgate::client
