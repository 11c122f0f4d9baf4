// Callback services over GateState. Streams are small reactors: one read outstanding,
// one write outstanding, later messages merged into the pending one (decisions append,
// the newest ack wins; config updates are never merged with each other, since each has
// its own effective_from_step), so a burst of decisions goes out in one write and the
// queue only grows by config updates, which are rare.
#include "server/services.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_id.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "server/admin_auth.h"
#include "server/job_views.h"

namespace spgate::server {
namespace {

using Clock = std::chrono::steady_clock;

class ConnectReactor;

// What GateState holds for a stream: it outlives the reactor safely.
class ConnectSink final : public SessionSink {
 public:
  explicit ConnectSink(ConnectReactor* r) : reactor_(r) {}
  void PushConfig(const ConfigPush& push) override;
  void PushLearned(const ThroughputTable& table) override;
  void End(const absl::Status& status) override;
  void Invalidate() {
    MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  Mutex mu_;
  ConnectReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class ConnectReactor final : public RawReactor,
                             public StreamRegistry::Stream,
                             private PublishedReactor {
 public:
  // `authorize`: whether the caller's credential may act for a job (the session's).
  ConnectReactor(GateState* state, Metrics& metrics, StreamRegistry* streams,
                 std::function<absl::Status(std::string_view job_id)> authorize)
      : state_(state), metrics_(metrics), streams_(streams), authorize_(std::move(authorize)) {
    [[maybe_unused]] CallbackScope scope;
    sink_ = std::make_shared<ConnectSink>(this);
    Publish();
    streams_->Add(this);
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    if (!ok) {  // the worker closed its side, or the call is gone
      FinishWhenIdle(grpc::Status::OK);
      return;
    }
    if (!ParseMessage(&in_bytes_, &in_)) {
      FinishWhenIdle(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  UnparseableMessage(v1::WorkerMessage::descriptor()->full_name())));
      return;
    }
    // A plan is "received" once its message is parsed, as when gRPC parsed it for us:
    // spgate_decision_latency_seconds keeps its meaning.
    const auto start = Clock::now();
    if (session_ == nullptr) {
      // The credential must cover the session's job before the stream is bound to it.
      absl::StatusOr<std::shared_ptr<Session>> session = state_->FindSession(in_.session_id());
      if (session.ok()) {
        if (absl::Status s = authorize_((*session)->job_id); !s.ok()) session = s;
      }
      if (session.ok()) session = state_->AttachSession(in_.session_id(), sink_);
      if (!session.ok()) {
        FinishWhenIdle(ToGrpcStatus(session.status()));
        return;
      }
      session_ = *std::move(session);
      attached_.store(true, std::memory_order_release);
    }
    if (in_.plans_size() > kMaxItemsPerMessage || in_.telemetry_size() > kMaxItemsPerMessage) {
      // The shipped clients send at most 1024 plans and 512 records a message; more is
      // not a worker, and answering each would multiply the message's size.
      metrics_.LimitRefusals(Limit::kItemsPerMessage).Increment();
      FinishWhenIdle(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("more than ", kMaxItemsPerMessage,
                       " plans or telemetry records in one message")));
      return;
    }
    v1::DaemonMessage out;
    // A session whose launch was replaced (docs/design.md §10) gets its stream ended
    // with FAILED_PRECONDITION: the worker falls back locally, and nothing it sends counts.
    absl::Status ended;
    // Telemetry first: a plan in the same message (a client sends a step's record with the
    // next plan) is decided knowing it.
    for (const v1::StepTelemetry& t : in_.telemetry()) {
      // Counted; invalid records are not acknowledged.
      const absl::Status s = state_->RecordTelemetry(*session_, TelemetryFromProto(t));
      if (s.code() == absl::StatusCode::kFailedPrecondition) ended = s;
    }
    for (const v1::BatchPlan& plan : in_.plans()) {
      absl::StatusOr<DecisionRecord> d = state_->Decide(*session_, PlanFromProto(plan));
      if (d.ok()) ToProto(*d, out.add_decisions());
      const absl::Status s = d.status();
      if (s.code() == absl::StatusCode::kFailedPrecondition) ended = s;
      if (!s.ok()) {
        auto* rej = out.add_rejections();
        rej->set_step(plan.step());
        rej->set_code(static_cast<int>(s.code()));
        rej->set_message(std::string(s.message()));
      }
    }
    if (in_.has_heartbeat()) {
      absl::StatusOr<int64_t> acked =
          state_->Heartbeat(*session_, HeartbeatFromProto(in_.heartbeat()));
      if (acked.ok()) {
        out.mutable_ack()->set_telemetry_received(*acked);
        out.mutable_ack()->set_heartbeat_seq(in_.heartbeat().seq());
      } else {
        ended = acked.status();
      }
    } else if (in_.telemetry_size() == 0 && start - last_touch_ > std::chrono::milliseconds(250)) {
      state_->Touch(*session_);
      last_touch_ = start;
    }
    if (!ended.ok()) {
      FinishWhenIdle(ToGrpcStatus(ended));
      return;
    }
    const int decisions = out.decisions_size();
    if (decisions > 0 || out.rejections_size() > 0 || out.has_ack()) Send(std::move(out));
    if (decisions > 0) {
      const double latency = std::chrono::duration<double>(Clock::now() - start).count();
      for (int i = 0; i < decisions; ++i) metrics_.decision_latency.Observe(latency);
    }
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      // A worker that does not read its replies gets no more of its messages read
      // until the replies queued for it have gone out: the queue stays bounded, and
      // the worker, which never waits for the daemon, decides locally meanwhile.
      if (PendingDecisionsLocked() > kMaxPendingDecisions) {
        read_paused_ = true;
        return;
      }
    }
    StartRead(&in_bytes_);
  }

  void Send(v1::DaemonMessage msg) {
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      if (writing_) {
        // Merge behind the write in flight (decisions append, the newest ack wins), but
        // never merge two config updates: each carries its own effective_from_step.
        if (!pending_.empty() &&
            !(pending_.back().has_config_update() && msg.has_config_update())) {
          pending_.back().MergeFrom(msg);
        } else {
          pending_.push_back(std::move(msg));
        }
        return;
      }
      writing_ = true;
      current_ = std::move(msg);
    }
    WriteCurrent();
  }

  // The message the write in flight owns, as bytes (outside mu_: serialising a burst of
  // decisions does not hold up the training-side callers of the state's sinks).
  void WriteCurrent() {
    SerializeMessage(current_, &current_bytes_);
    StartWrite(&current_bytes_);
  }

  void OnWriteDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    std::optional<grpc::Status> finish;
    bool write = false, read = false;
    {
      MutexLock lock(&mu_);
      if (ok && read_paused_ && !finish_requested_ &&
          PendingDecisionsLocked() <= kMaxPendingDecisions) {
        read_paused_ = false;
        read = true;
      }
      if (ok && !pending_.empty() && !finish_requested_) {
        current_ = std::move(pending_.front());
        pending_.pop_front();
        write = true;
      } else {
        writing_ = false;
        if (!ok && !finish_requested_) {
          finish_requested_ = true;
          finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
        }
        if (finish_requested_ && !finished_) {
          finished_ = true;
          finish = finish_status_;
        }
      }
    }
    if (write) WriteCurrent();
    if (read) StartRead(&in_bytes_);
    if (finish) Finish(*finish);
  }

  void OnCancel() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    FinishWhenIdle(grpc::Status::CANCELLED);
  }

  void Drain() override {
    FinishWhenIdle(grpc::Status(grpc::StatusCode::UNAVAILABLE, "spgated is shutting down"));
  }

  // A stream holds one of --max_streams from its start; one that never names its session
  // would hold it until its connection closes (docs/design.md §10).
  bool ExpireIfSilentSince(absl::Time cutoff) override {
    if (attached_.load(std::memory_order_acquire) || opened_ >= cutoff) return false;
    return FinishWhenIdle(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        "no first message (the session id) within --first_message_timeout"));
  }

  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    sink_->Invalidate();
    if (session_ != nullptr) state_->DetachSession(*session_, sink_.get());
    streams_->Remove(this, StreamRegistry::Kind::kConnect);
    delete this;
  }

  void PushConfig(const ConfigPush& push) {
    v1::DaemonMessage msg;
    *msg.mutable_config_update() = ToProto(push);
    Send(std::move(msg));
  }

  void PushLearned(const ThroughputTable& table) {
    v1::DaemonMessage msg;
    *msg.mutable_learned() = spgate::ToProto(table);
    Send(std::move(msg));
  }

  void End(const absl::Status& status) { FinishWhenIdle(ToGrpcStatus(status)); }

 private:
  // Decisions queued behind the write in flight before reading stops.
  static constexpr int kMaxPendingDecisions = 4096;
  // Plans, and telemetry records, one message may carry.
  static constexpr int kMaxItemsPerMessage = 4096;

  int PendingDecisionsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const v1::DaemonMessage& m : pending_) n += m.decisions_size() + m.rejections_size();
    return n;
  }

  // False when a finish was already requested.
  bool FinishWhenIdle(grpc::Status status) {
    bool now = false;
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return false;
      finish_requested_ = true;
      finish_status_ = std::move(status);
      if (!writing_) {
        finished_ = true;
        now = true;
      }
    }
    if (now) Finish(finish_status_);
    return true;
  }

  GateState* const state_;
  Metrics& metrics_;
  StreamRegistry* const streams_;
  const std::function<absl::Status(std::string_view)> authorize_;
  std::shared_ptr<ConnectSink> sink_;
  std::shared_ptr<Session> session_;  // set by the first message; reactor thread only
  std::atomic<bool> attached_{false};  // session_ is set (read by the sweeper)
  const absl::Time opened_ = absl::Now();
  grpc::ByteBuffer in_bytes_;
  v1::WorkerMessage in_;
  Clock::time_point last_touch_{};

  Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::DaemonMessage current_;  // owned by the write in flight
  grpc::ByteBuffer current_bytes_;
  std::deque<v1::DaemonMessage> pending_ ABSL_GUARDED_BY(mu_);
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_;
};

void ConnectSink::PushConfig(const ConfigPush& push) {
  MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->PushConfig(push);
}

void ConnectSink::PushLearned(const ThroughputTable& table) {
  MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->PushLearned(table);
}

void ConnectSink::End(const absl::Status& status) {
  MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->End(status);
}

// WatchDecisions: reads its request (within --first_message_timeout), is authorized and
// admitted, then streams decisions. A bounded queue per subscriber; when full, the
// oldest decisions are dropped (and counted) rather than slowing the decision path.
class WatchReactor final : public RawReactor,
                           public StreamRegistry::Stream,
                           public PendingCalls::Call,
                           private PublishedReactor {
 public:
  static constexpr size_t kMaxQueued = 4096;
  // Authorizes the request and reserves a stream slot (StreamRegistry::Admit), or says
  // why not.
  using Start = std::function<absl::Status(grpc::CallbackServerContext*,
                                           const v1::WatchDecisionsRequest&)>;

  class Watcher final : public DecisionWatcher {
   public:
    Watcher(std::string job, WatchReactor* r) : DecisionWatcher(std::move(job)), reactor_(r) {}
    void OnDecision(const DecisionRecord& d) override {
      v1::Decision out;
      ToProto(d, &out);
      reactor_->Enqueue(std::move(out));
    }

   private:
    WatchReactor* reactor_;
  };

  WatchReactor(grpc::CallbackServerContext* ctx, GateState* state, Metrics& metrics,
               StreamRegistry* streams, const Start* start)
      : ctx_(ctx), state_(state), metrics_(metrics), streams_(streams), start_(start) {
    [[maybe_unused]] CallbackScope scope;
    Publish();
    streams_->pending_calls().Add(this);
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    if (request_claimed_.exchange(true)) return;  // expired meanwhile
    streams_->pending_calls().Remove(this);
    v1::WatchDecisionsRequest request;
    if (!ok) {
      RequestFinish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "spgate.v1.WatchDecisionsRequest: the call ended without its "
                                 "request message"));
      return;
    }
    if (!ParseMessage(&in_bytes_, &request)) {
      RequestFinish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          UnparseableMessage(v1::WatchDecisionsRequest::descriptor()->full_name())));
      return;
    }
    if (absl::Status s = (*start_)(ctx_, request); !s.ok()) {
      RequestFinish(ToGrpcStatus(s));
      return;
    }
    // Initial metadata first: once the watcher is registered a decision on another thread
    // may start a write, which sends the metadata itself, and a second send aborts the
    // process (gRPC asserts !sent_initial_metadata_; seen once under ASan).
    StartSendInitialMetadata();
    watcher_ = std::make_shared<Watcher>(request.job_id(), this);
    watching_.store(true, std::memory_order_release);
    streams_->Add(this);
    state_->AddWatcher(watcher_);
  }

  bool ExpireIfSilentSince(absl::Time cutoff) override {
    Acquire();
    if (opened_ >= cutoff || request_claimed_.exchange(true)) return false;
    RequestFinish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "no spgate.v1.WatchDecisionsRequest arrived within "
                               "--first_message_timeout of the call's start"));
    return true;
  }

  void Enqueue(v1::Decision d) {
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      if (writing_) {
        if (queue_.size() >= kMaxQueued) {
          queue_.pop_front();
          metrics_.watch_dropped.Increment();
        }
        queue_.push_back(std::move(d));
        return;
      }
      writing_ = true;
      current_ = std::move(d);
    }
    WriteCurrent();
  }

  void OnWriteDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    bool finish = false, write = false;
    {
      MutexLock lock(&mu_);
      if (ok && !finish_requested_ && !queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        write = true;
      } else {
        writing_ = false;
        if (!ok) finish_requested_ = true;
        if (finish_requested_ && !finished_) finished_ = finish = true;
      }
    }
    if (write) WriteCurrent();
    if (finish) Finish(ok ? status_ : grpc::Status::CANCELLED);
  }

  void OnCancel() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    request_claimed_.store(true);
    RequestFinish(grpc::Status::CANCELLED);
  }
  void Drain() override {
    RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "spgated is shutting down"));
  }
  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    streams_->pending_calls().Remove(this);
    if (watching_.load(std::memory_order_acquire)) {
      state_->RemoveWatcher(watcher_.get());
      streams_->Remove(this, StreamRegistry::Kind::kWatch);
    }
    delete this;
  }

 private:
  void WriteCurrent() {
    SerializeMessage(current_, &current_bytes_);
    StartWrite(&current_bytes_);
  }

  void RequestFinish(grpc::Status status) {
    bool now = false;
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      status_ = std::move(status);
      if (!writing_) now = finished_ = true;
    }
    if (now) Finish(status_);
  }

  grpc::CallbackServerContext* const ctx_;
  GateState* const state_;
  Metrics& metrics_;
  StreamRegistry* const streams_;
  const Start* const start_;
  const absl::Time opened_ = absl::Now();
  std::atomic<bool> request_claimed_{false};  // by its read, its expiry or a cancel
  std::atomic<bool> watching_{false};         // admitted: a watcher and a stream slot
  grpc::ByteBuffer in_bytes_;
  std::shared_ptr<Watcher> watcher_;
  Mutex mu_;
  std::deque<v1::Decision> queue_ ABSL_GUARDED_BY(mu_);
  v1::Decision current_;  // owned by the write in flight
  grpc::ByteBuffer current_bytes_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_;
};

}  // namespace

void StreamRegistry::Add(Stream* s) {
  bool drain;
  {
    MutexLock lock(&mu_);
    streams_.push_back(s);
    drain = draining_;
  }
  if (drain) s->Drain();
}

void StreamRegistry::SetLimits(int max_streams, int max_watch_streams) {
  MutexLock lock(&mu_);
  max_streams_ = max_streams;
  max_watch_streams_ = max_watch_streams;
}

std::optional<Limit> StreamRegistry::Admit(Kind kind) {
  MutexLock lock(&mu_);
  if (admitted_ >= max_streams_) return Limit::kStreams;
  if (kind == Kind::kWatch) {
    if (admitted_watch_ >= max_watch_streams_) return Limit::kWatchStreams;
    ++admitted_watch_;
  }
  ++admitted_;
  return std::nullopt;
}

void StreamRegistry::Remove(Stream* s, Kind kind) {
  MutexLock lock(&mu_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
  --admitted_;
  if (kind == Kind::kWatch) --admitted_watch_;
}

void StreamRegistry::DrainAll() {
  MutexLock lock(&mu_);
  draining_ = true;
  // Drain only requests a Finish; OnDone (which calls Remove) runs later on another
  // thread, so holding the lock here cannot deadlock.
  for (Stream* s : streams_) s->Drain();
}

int StreamRegistry::ExpireSilent(absl::Time cutoff, Metrics& metrics) {
  int expired = pending_.ExpireSilent(cutoff);
  {
    MutexLock lock(&mu_);
    // As in DrainAll: expiring only requests a Finish, so the lock cannot deadlock.
    for (Stream* s : streams_) expired += s->ExpireIfSilentSince(cutoff) ? 1 : 0;
  }
  if (expired > 0) metrics.LimitRefusals(Limit::kFirstMessage).Increment(expired);
  return expired;
}

int StreamRegistry::size() {
  MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

// A call refused as it starts (a missing or wrong credential, a stream limit).
class RefusedCall final : public RawReactor, private PublishedReactor {
 public:
  explicit RefusedCall(const absl::Status& s) {
    [[maybe_unused]] CallbackScope scope;
    Publish();
    Finish(ToGrpcStatus(s));
  }
  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    delete this;
  }
};

// --- GateService -------------------------------------------------------------------

GateServiceImpl::GateServiceImpl(GateState* state, Metrics& metrics, StreamRegistry* streams,
                                 WorkerAuthConfig worker_auth)
    : RawService(v1::GateService::service_full_name(), &streams->pending_calls()),
      state_(state),
      metrics_(metrics),
      streams_(streams),
      worker_auth_(std::move(worker_auth)) {
  AddUnary<v1::RegisterRequest, v1::RegisterResponse>(
      "Register", [this](grpc::CallbackServerContext* ctx, const v1::RegisterRequest& r) {
        return Register(ctx, r);
      });
  AddStream("Connect", [this](grpc::CallbackServerContext* ctx) { return Connect(ctx); });
  AddUnary<v1::DecideRequest, v1::Decision>(
      "Decide", [this](grpc::CallbackServerContext* ctx, const v1::DecideRequest& r) {
        return Decide(ctx, r);
      });
}

// A worker call refused for its credential (none, an unknown one, or one whose job
// patterns do not cover the job) is counted: such a job decides locally on every step, and
// nothing else on the daemon's side would show it.
absl::Status GateServiceImpl::CountRefused(absl::Status s) const {
  if (!s.ok()) metrics_.refused_worker_credential.Increment();
  return s;
}

absl::Status GateServiceImpl::AuthorizeWorker(grpc::CallbackServerContext* ctx,
                                              std::string_view job_id,
                                              JobNamedBy named_by) const {
  return CountRefused(
      AuthorizeWorkerCall(worker_auth_, CallerCredentialsOf(*ctx), job_id, named_by));
}

absl::Status GateServiceImpl::AuthenticateWorker(grpc::CallbackServerContext* ctx) const {
  return CountRefused(server::AuthenticateWorker(worker_auth_, CallerCredentialsOf(*ctx)).status());
}

absl::StatusOr<v1::RegisterResponse> GateServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                               const v1::RegisterRequest& r) {
  RETURN_IF_ERROR(AuthorizeWorker(ctx, r.job_id()));
  ASSIGN_OR_RETURN(const RegisterInput input, RegisterFromProto(r));
  ASSIGN_OR_RETURN(RegisterResult result, state_->Register(input));
  return ToProto(result);
}

RawReactor* GateServiceImpl::Connect(grpc::CallbackServerContext* ctx) {
  if (absl::Status s = AuthenticateWorker(ctx); !s.ok()) return new RefusedCall(s);
  if (std::optional<Limit> full = streams_->Admit(StreamRegistry::Kind::kConnect)) {
    metrics_.LimitRefusals(*full).Increment();
    return new RefusedCall(absl::ResourceExhaustedError(
        "spgated has as many streams open as --max_streams allows; decide locally and "
        "retry later"));
  }
  // The caller's credential, judged again for the session's job once it is named.
  return new ConnectReactor(
      state_, metrics_, streams_,
      [this, caller = CallerCredentialsOf(*ctx)](std::string_view job_id) {
        return CountRefused(
            AuthorizeWorkerCall(worker_auth_, caller, job_id, JobNamedBy::kSession));
      });
}

absl::StatusOr<v1::Decision> GateServiceImpl::Decide(grpc::CallbackServerContext* ctx,
                                                     const v1::DecideRequest& r) {
  if (state_->draining()) return absl::UnavailableError("spgated is shutting down");
  RETURN_IF_ERROR(AuthenticateWorker(ctx));
  if (!r.has_plan()) return absl::InvalidArgumentError("plan: required (the batch plan to decide)");
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, state_->FindSession(r.session_id()));
  RETURN_IF_ERROR(AuthorizeWorker(ctx, session->job_id, JobNamedBy::kSession));
  ASSIGN_OR_RETURN(DecisionRecord d, state_->Decide(*session, PlanFromProto(r.plan())));
  v1::Decision out;
  ToProto(d, &out);
  metrics_.decision_latency.Observe(std::chrono::duration<double>(Clock::now() - start).count());
  return out;
}

// --- AdminService ------------------------------------------------------------------

AdminServiceImpl::AdminServiceImpl(GateState* state, OperatorStore* store, Metrics& metrics,
                                   StreamRegistry* streams, AdminAuthConfig auth)
    : RawService(v1::AdminService::service_full_name(), &streams->pending_calls()),
      state_(state),
      store_(store),
      metrics_(metrics),
      streams_(streams),
      auth_(std::move(auth)) {
  using Ctx = grpc::CallbackServerContext;
  AddUnary<v1::GetGateConfigRequest, v1::VersionedGateConfig>(
      "GetGateConfig", [this](Ctx* ctx, const v1::GetGateConfigRequest& r)
                           -> absl::StatusOr<v1::VersionedGateConfig> {
        RETURN_IF_ERROR(Authorize(ctx, "GetGateConfig").status());
        return GetGateConfigView(*state_, *store_, r.job_id());
      });
  AddUnary<v1::UpdateGateConfigRequest, v1::VersionedGateConfig>(
      "UpdateGateConfig", [this](Ctx* ctx, const v1::UpdateGateConfigRequest& r) {
        return ChangeConfig(ctx, "UpdateGateConfig", [&](const AuditContext& audit) {
          return store_->UpdateGateConfig(r, audit);
        });
      });
  AddUnary<v1::ListJobsRequest, v1::ListJobsResponse>(
      "ListJobs",
      [this](Ctx* ctx, const v1::ListJobsRequest&) -> absl::StatusOr<v1::ListJobsResponse> {
        RETURN_IF_ERROR(Authorize(ctx, "ListJobs").status());
        return ListJobsView(*state_);
      });
  AddUnary<v1::GetJobRequest, v1::Job>(
      "GetJob", [this](Ctx* ctx, const v1::GetJobRequest& r) -> absl::StatusOr<v1::Job> {
        RETURN_IF_ERROR(Authorize(ctx, "GetJob").status());
        return GetJobView(*state_, *store_, r.job_id());
      });
  AddUnary<v1::PinModeRequest, v1::Pin>(
      "PinMode", [this](Ctx* ctx, const v1::PinModeRequest& r) { return PinMode(ctx, r); });
  AddUnary<v1::UnpinRequest, v1::UnpinResponse>(
      "Unpin", [this](Ctx* ctx, const v1::UnpinRequest& r) { return Unpin(ctx, r); });
  watch_start_ = [this](Ctx* ctx, const v1::WatchDecisionsRequest& r) -> absl::Status {
    RETURN_IF_ERROR(Authorize(ctx, "WatchDecisions").status());
    // A job id no job can have would wait forever; an unknown one may be about to start.
    if (!r.job_id().empty()) RETURN_IF_ERROR(ValidateJobId(r.job_id()));
    if (std::optional<Limit> full = streams_->Admit(StreamRegistry::Kind::kWatch)) {
      metrics_.LimitRefusals(*full).Increment();
      return absl::ResourceExhaustedError(
          "spgated has as many WatchDecisions streams open as --max_watch_streams (or "
          "streams as --max_streams) allows");
    }
    return absl::OkStatus();
  };
  AddStream("WatchDecisions", [this](Ctx* ctx) -> RawReactor* {
    return new WatchReactor(ctx, state_, metrics_, streams_, &watch_start_);
  });
  AddUnary<v1::EvaluateGatesRequest, v1::EvaluateGatesResponse>(
      "EvaluateGates", [this](Ctx* ctx, const v1::EvaluateGatesRequest& r)
                           -> absl::StatusOr<v1::EvaluateGatesResponse> {
        RETURN_IF_ERROR(Authorize(ctx, "EvaluateGates").status());
        return EvaluateGatesView(*state_, *store_, r);
      });
  AddUnary<v1::ListConfigHistoryRequest, v1::ListConfigHistoryResponse>(
      "ListConfigHistory", [this](Ctx* ctx, const v1::ListConfigHistoryRequest& r)
                               -> absl::StatusOr<v1::ListConfigHistoryResponse> {
        RETURN_IF_ERROR(Authorize(ctx, "ListConfigHistory").status());
        return store_->ListConfigHistory(r);
      });
  AddUnary<v1::RollbackGateConfigRequest, v1::VersionedGateConfig>(
      "RollbackGateConfig", [this](Ctx* ctx, const v1::RollbackGateConfigRequest& r) {
        return ChangeConfig(ctx, "RollbackGateConfig", [&](const AuditContext& audit) {
          return store_->RollbackGateConfig(r, audit);
        });
      });
  AddUnary<v1::ForgetJobRequest, v1::ForgetJobResponse>(
      "ForgetJob", [this](Ctx* ctx, const v1::ForgetJobRequest& r)
                       -> absl::StatusOr<v1::ForgetJobResponse> {
        ASSIGN_OR_RETURN(Principal who, Authorize(ctx, "ForgetJob"));
        return store_->ForgetJob(r, AuditContext{who.name});
      });
}

absl::StatusOr<Principal> AdminServiceImpl::Authorize(grpc::CallbackServerContext* ctx,
                                                     absl::string_view method) {
  const std::optional<CallKind> kind = AdminCallKind(method);
  if (!kind.has_value()) {
    return absl::InternalError(absl::StrCat(method, " has no entry in AdminCallKind"));
  }
  absl::StatusOr<Principal> who = AuthorizeAdminCall(auth_, CallerCredentialsOf(*ctx), *kind);
  metrics_.CountAdminRefusal(who.status().code());
  return who;
}

absl::StatusOr<v1::VersionedGateConfig> AdminServiceImpl::ChangeConfig(
    grpc::CallbackServerContext* ctx, absl::string_view method,
    const std::function<absl::StatusOr<v1::VersionedGateConfig>(const AuditContext&)>& change) {
  absl::StatusOr<Principal> who = Authorize(ctx, method);
  if (!who.ok()) {
    metrics_.config_updates_denied.Increment();
    return who.status();
  }
  absl::StatusOr<v1::VersionedGateConfig> result = change(AuditContext{who->name});
  CountConfigUpdate(result.status());
  return result;
}

void AdminServiceImpl::CountConfigUpdate(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: metrics_.config_updates_ok.Increment(); break;
    // A rollback to a version the audit log does not hold, or one without --state_dir,
    // is as invalid a request as a value out of range.
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      metrics_.config_updates_invalid.Increment();
      break;
    case absl::StatusCode::kAborted: metrics_.config_updates_conflict.Increment(); break;
    // The state or audit file could not be written (or, for a rollback, the audit log
    // read): nothing changed. spgate_state_persist_failures_total counts the writes too.
    case absl::StatusCode::kUnavailable: metrics_.config_updates_unavailable.Increment(); break;
    // A new job scope past --max_jobs.
    case absl::StatusCode::kResourceExhausted:
      metrics_.LimitRefusals(Limit::kJobs).Increment();
      break;
    default: break;
  }
}

absl::StatusOr<v1::Pin> AdminServiceImpl::PinMode(grpc::CallbackServerContext* ctx,
                                                  const v1::PinModeRequest& r) {
  ASSIGN_OR_RETURN(Principal who, Authorize(ctx, "PinMode"));
  absl::StatusOr<v1::Pin> pinned = PinModeView(*state_, *store_, r, AuditContext{who.name});
  if (pinned.status().code() == absl::StatusCode::kResourceExhausted) {
    metrics_.LimitRefusals(Limit::kJobs).Increment();  // a new job scope past --max_jobs
  }
  return pinned;
}

absl::StatusOr<v1::UnpinResponse> AdminServiceImpl::Unpin(grpc::CallbackServerContext* ctx,
                                                          const v1::UnpinRequest& r) {
  ASSIGN_OR_RETURN(Principal who, Authorize(ctx, "Unpin"));
  return UnpinView(*state_, *store_, r, AuditContext{who.name});
}

}  // namespace spgate::server
