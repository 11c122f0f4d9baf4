// Callback services over GateState. Streams are small reactors: one read outstanding,
// one write outstanding, later messages merged into the pending one (decisions append,
// the newest ack wins; config updates are never merged with each other, since each has
// its own effective_from_step), so a burst of decisions goes out in one write and the
// queue only grows by config updates, which are rare.
#include "server/services.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "server/admin_auth.h"
#include "server/job_views.h"

namespace spgate::server {
namespace {

using Clock = std::chrono::steady_clock;

// See SyncWithFinishedCallbacks (services.h). Declared first thing in a callback, so its
// release comes after everything the callback did.
#if defined(__SANITIZE_THREAD__)
std::atomic<uint64_t> callbacks_finished{0};
class CallbackScope {
 public:
  ~CallbackScope() { callbacks_finished.fetch_add(1, std::memory_order_release); }
};
#else
class CallbackScope {};
#endif

template <typename T>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, absl::StatusOr<T> result,
                                T* response) {
  [[maybe_unused]] CallbackScope scope;
  auto* reactor = ctx->DefaultReactor();
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

// Ends a unary call with `s`, an error or OK (the response already filled in).
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  [[maybe_unused]] CallbackScope scope;
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

class ConnectReactor;

// gRPC hands a reactor from the thread that built it to the threads that run its
// callbacks through its own queues, which ThreadSanitizer cannot see (Debian's gRPC is
// not instrumented). This release/acquire pair makes the hand-off visible; it costs one
// uncontended atomic load per callback.
class PublishedReactor {
 protected:
  void Publish() { published_.store(true, std::memory_order_release); }
  void Acquire() const { (void)published_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> published_{false};
};

// What GateState holds for a stream: it outlives the reactor safely.
class ConnectSink final : public SessionSink {
 public:
  explicit ConnectSink(ConnectReactor* r) : reactor_(r) {}
  void PushConfig(const ConfigPush& push) override;
  void PushLearned(const ThroughputTable& table) override;
  void Invalidate() {
    MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  Mutex mu_;
  ConnectReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class ConnectReactor final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage>,
                             public StreamRegistry::Stream,
                             private PublishedReactor {
 public:
  ConnectReactor(GateState* state, Metrics& metrics, StreamRegistry* streams)
      : state_(state), metrics_(metrics), streams_(streams) {
    [[maybe_unused]] CallbackScope scope;
    sink_ = std::make_shared<ConnectSink>(this);
    Publish();
    streams_->Add(this);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    if (!ok) {  // the worker closed its side, or the call is gone
      FinishWhenIdle(grpc::Status::OK);
      return;
    }
    const auto start = Clock::now();
    if (session_ == nullptr) {
      auto session = state_->AttachSession(in_.session_id(), sink_);
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
    for (const v1::StepTelemetry& t : in_.telemetry()) {
      // Counted; invalid records are not acknowledged.
      const absl::Status s = state_->RecordTelemetry(*session_, TelemetryFromProto(t));
      if (s.code() == absl::StatusCode::kFailedPrecondition) ended = s;
    }
    if (in_.has_heartbeat()) {
      absl::StatusOr<int64_t> acked =
          state_->Heartbeat(*session_, LocalDecisionsFromProto(in_.heartbeat()));
      if (acked.ok()) {
        out.mutable_ack()->set_telemetry_received(*acked);
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
    StartRead(&in_);
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
    StartWrite(&current_);
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
    if (write) StartWrite(&current_);
    if (read) StartRead(&in_);
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
  std::shared_ptr<ConnectSink> sink_;
  std::shared_ptr<Session> session_;  // set by the first message; reactor thread only
  std::atomic<bool> attached_{false};  // session_ is set (read by the sweeper)
  const absl::Time opened_ = absl::Now();
  v1::WorkerMessage in_;
  Clock::time_point last_touch_{};

  Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::DaemonMessage current_;  // owned by the write in flight
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

// WatchDecisions: a bounded queue per subscriber; when full, the oldest decisions are
// dropped (and counted) rather than slowing the decision path.
class WatchReactor final : public grpc::ServerWriteReactor<v1::Decision>,
                           public StreamRegistry::Stream,
                           private PublishedReactor {
 public:
  static constexpr size_t kMaxQueued = 4096;

  class Watcher final : public DecisionWatcher {
   public:
    Watcher(std::string job, WatchReactor* r) : DecisionWatcher(std::move(job)), reactor_(r) {}
    void OnDecision(const DecisionRecord& d) override {
      v1::Decision out;
      ToProto(d, &out);
      reactor_->Enqueue(out);
    }

   private:
    WatchReactor* reactor_;
  };

  WatchReactor(GateState* state, Metrics& metrics, StreamRegistry* streams, std::string job)
      : state_(state), metrics_(metrics), streams_(streams) {
    [[maybe_unused]] CallbackScope scope;
    watcher_ = std::make_shared<Watcher>(std::move(job), this);
    Publish();
    streams_->Add(this);
    state_->AddWatcher(watcher_);
    StartSendInitialMetadata();
  }

  void Enqueue(const v1::Decision& d) {
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      if (writing_) {
        if (queue_.size() >= kMaxQueued) {
          queue_.pop_front();
          metrics_.watch_dropped.Increment();
        }
        queue_.push_back(d);
        return;
      }
      writing_ = true;
      current_ = d;
    }
    StartWrite(&current_);
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
    if (write) StartWrite(&current_);
    if (finish) Finish(ok ? status_ : grpc::Status::CANCELLED);
  }

  void OnCancel() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    RequestFinish(grpc::Status::CANCELLED);
  }
  void Drain() override {
    RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "spgated is shutting down"));
  }
  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    state_->RemoveWatcher(watcher_.get());
    streams_->Remove(this, StreamRegistry::Kind::kWatch);
    delete this;
  }

 private:
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

  GateState* const state_;
  Metrics& metrics_;
  StreamRegistry* const streams_;
  std::shared_ptr<Watcher> watcher_;
  Mutex mu_;
  std::deque<v1::Decision> queue_ ABSL_GUARDED_BY(mu_);
  v1::Decision current_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_;
};

// A WatchDecisions call refused before it started (authorization): ends at once.
class RefusedWatch final : public grpc::ServerWriteReactor<v1::Decision>,
                           private PublishedReactor {
 public:
  explicit RefusedWatch(const grpc::Status& status) {
    [[maybe_unused]] CallbackScope scope;
    Publish();
    Finish(status);
  }
  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    delete this;
  }
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
  int expired = 0;
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

// A Connect call refused before it starts (a missing or wrong worker token).
class RefusedStream final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage> {
 public:
  explicit RefusedStream(const absl::Status& s) {
    [[maybe_unused]] CallbackScope scope;
    Finish(ToGrpcStatus(s));
  }
  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    delete this;
  }
};

// "authorization: Bearer <token>" against `want`; the error says which, never the token.
absl::Status CheckBearer(grpc::CallbackServerContext* ctx, absl::string_view want,
                         const std::string& what) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this call needs the ", what, ": send metadata 'authorization: Bearer <token>'"));
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, "Bearer ") || !ConstantTimeEquals(value.substr(7), want)) {
    return absl::PermissionDeniedError(absl::StrCat("the ", what, " does not match"));
  }
  return absl::OkStatus();
}

// --- GateService -------------------------------------------------------------------

absl::Status GateServiceImpl::AuthorizeWorker(grpc::CallbackServerContext* ctx) const {
  if (worker_token_.empty()) return absl::OkStatus();
  return CheckBearer(ctx, worker_token_, "worker token (--worker_token_file)");
}

grpc::ServerUnaryReactor* GateServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                    const v1::RegisterRequest* request,
                                                    v1::RegisterResponse* response) {
  if (absl::Status s = AuthorizeWorker(ctx); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<RegisterResult> result = state_->Register(RegisterFromProto(*request));
  if (!result.ok()) return Finish(ctx, result.status());
  return Reply(ctx, absl::StatusOr<v1::RegisterResponse>(ToProto(*result)), response);
}

grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage>* GateServiceImpl::Connect(
    grpc::CallbackServerContext* ctx) {
  if (absl::Status s = AuthorizeWorker(ctx); !s.ok()) return new RefusedStream(s);
  if (std::optional<Limit> full = streams_->Admit(StreamRegistry::Kind::kConnect)) {
    metrics_.LimitRefusals(*full).Increment();
    return new RefusedStream(absl::ResourceExhaustedError(
        "spgated has as many streams open as --max_streams allows; decide locally and "
        "retry later"));
  }
  return new ConnectReactor(state_, metrics_, streams_);
}

grpc::ServerUnaryReactor* GateServiceImpl::Decide(grpc::CallbackServerContext* ctx,
                                                  const v1::DecideRequest* request,
                                                  v1::Decision* response) {
  if (state_->draining()) return Finish(ctx, absl::UnavailableError("spgated is shutting down"));
  if (absl::Status s = AuthorizeWorker(ctx); !s.ok()) return Finish(ctx, s);
  if (!request->has_plan()) {
    return Finish(ctx, absl::InvalidArgumentError("plan: required (the batch plan to decide)"));
  }
  const auto start = Clock::now();
  absl::StatusOr<std::shared_ptr<Session>> session = state_->FindSession(request->session_id());
  if (!session.ok()) return Finish(ctx, session.status());
  absl::StatusOr<DecisionRecord> d = state_->Decide(**session, PlanFromProto(request->plan()));
  if (d.ok()) ToProto(*d, response);
  const absl::Status s = d.status();
  if (s.ok()) {
    metrics_.decision_latency.Observe(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  return Finish(ctx, s);
}

// --- AdminService ------------------------------------------------------------------

absl::StatusOr<Principal> AdminServiceImpl::Authorize(grpc::CallbackServerContext* ctx,
                                                     absl::string_view method) {
  const std::optional<CallKind> kind = AdminCallKind(method);
  if (!kind.has_value()) {
    return absl::InternalError(absl::StrCat(method, " has no entry in AdminCallKind"));
  }
  CallerCredentials caller;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    caller.authorization = std::string(it->second.data(), it->second.size());
  }
  const std::shared_ptr<const grpc::AuthContext> auth_context = ctx->auth_context();
  if (auth_context != nullptr && auth_context->IsPeerAuthenticated()) {
    for (const char* property : {GRPC_X509_SUBJECT_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME,
                                 GRPC_PEER_DNS_PROPERTY_NAME}) {
      for (const grpc::string_ref& v : auth_context->FindPropertyValues(property)) {
        caller.peer_identities.emplace_back(v.data(), v.size());
      }
    }
  }
  return AuthorizeAdminCall(auth_, caller, *kind);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetGateConfig(grpc::CallbackServerContext* ctx,
                                                          const v1::GetGateConfigRequest* request,
                                                          v1::VersionedGateConfig* response) {
  if (auto who = Authorize(ctx, "GetGateConfig"); !who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, GetGateConfigView(*state_, *store_, request->job_id()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::UpdateGateConfig(
    grpc::CallbackServerContext* ctx, const v1::UpdateGateConfigRequest* request,
    v1::VersionedGateConfig* response) {
  absl::StatusOr<Principal> who = Authorize(ctx, "UpdateGateConfig");
  if (!who.ok()) {
    metrics_.config_updates_denied.Increment();
    return Finish(ctx, who.status());
  }
  absl::StatusOr<v1::VersionedGateConfig> result =
      store_->UpdateGateConfig(*request, AuditContext{who->name});
  CountConfigUpdate(result.status());
  return Reply(ctx, std::move(result), response);
}

void AdminServiceImpl::CountConfigUpdate(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: metrics_.config_updates_ok.Increment(); break;
    case absl::StatusCode::kInvalidArgument: metrics_.config_updates_invalid.Increment(); break;
    case absl::StatusCode::kAborted: metrics_.config_updates_conflict.Increment(); break;
    // A new job scope past --max_jobs.
    case absl::StatusCode::kResourceExhausted:
      metrics_.LimitRefusals(Limit::kJobs).Increment();
      break;
    default: break;
  }
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                     const v1::ListJobsRequest* request,
                                                     v1::ListJobsResponse* response) {
  if (auto who = Authorize(ctx, "ListJobs"); !who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, absl::StatusOr<v1::ListJobsResponse>(ListJobsView(*state_)), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                   const v1::GetJobRequest* request,
                                                   v1::Job* response) {
  if (auto who = Authorize(ctx, "GetJob"); !who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, GetJobView(*state_, *store_, request->job_id()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::PinMode(grpc::CallbackServerContext* ctx,
                                                    const v1::PinModeRequest* request,
                                                    v1::Pin* response) {
  absl::StatusOr<Principal> who = Authorize(ctx, "PinMode");
  if (!who.ok()) return Finish(ctx, who.status());
  if (absl::Status s = OperatorStore::ValidatePinRequest(*request); !s.ok()) return Finish(ctx, s);
  const std::optional<int> group =
      request->has_group() ? std::optional<int>(request->group()) : std::nullopt;
  if (absl::Status s = state_->CheckJob(request->job_id(), group); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<v1::Pin> pinned = store_->PinMode(*request, AuditContext{who->name});
  if (pinned.status().code() == absl::StatusCode::kResourceExhausted) {
    metrics_.LimitRefusals(Limit::kJobs).Increment();  // a new job scope past --max_jobs
  }
  return Reply(ctx, std::move(pinned), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::Unpin(grpc::CallbackServerContext* ctx,
                                                  const v1::UnpinRequest* request,
                                                  v1::UnpinResponse* response) {
  absl::StatusOr<Principal> who = Authorize(ctx, "Unpin");
  if (!who.ok()) return Finish(ctx, who.status());
  if (absl::Status s = OperatorStore::ValidateUnpinRequest(*request); !s.ok()) {
    return Finish(ctx, s);
  }
  const std::optional<int> group =
      request->has_group() ? std::optional<int>(request->group()) : std::nullopt;
  if (absl::Status s = state_->CheckJob(request->job_id(), group); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<int> removed = store_->Unpin(*request, AuditContext{who->name});
  if (!removed.ok()) return Finish(ctx, removed.status());
  v1::UnpinResponse resp;
  resp.set_removed(*removed);
  return Reply(ctx, absl::StatusOr<v1::UnpinResponse>(std::move(resp)), response);
}

grpc::ServerWriteReactor<v1::Decision>* AdminServiceImpl::WatchDecisions(
    grpc::CallbackServerContext* ctx, const v1::WatchDecisionsRequest* request) {
  if (auto who = Authorize(ctx, "WatchDecisions"); !who.ok()) {
    return new RefusedWatch(ToGrpcStatus(who.status()));
  }
  if (std::optional<Limit> full = streams_->Admit(StreamRegistry::Kind::kWatch)) {
    metrics_.LimitRefusals(*full).Increment();
    return new RefusedWatch(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "spgated has as many WatchDecisions streams open as --max_watch_streams (or "
        "streams as --max_streams) allows"));
  }
  return new WatchReactor(state_, metrics_, streams_, request->job_id());
}

grpc::ServerUnaryReactor* AdminServiceImpl::EvaluateGates(grpc::CallbackServerContext* ctx,
                                                          const v1::EvaluateGatesRequest* request,
                                                          v1::EvaluateGatesResponse* response) {
  if (auto who = Authorize(ctx, "EvaluateGates"); !who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, EvaluateGatesView(*state_, *store_, *request), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListConfigHistory(
    grpc::CallbackServerContext* ctx, const v1::ListConfigHistoryRequest* request,
    v1::ListConfigHistoryResponse* response) {
  if (auto who = Authorize(ctx, "ListConfigHistory"); !who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, store_->ListConfigHistory(*request), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::RollbackGateConfig(
    grpc::CallbackServerContext* ctx, const v1::RollbackGateConfigRequest* request,
    v1::VersionedGateConfig* response) {
  absl::StatusOr<Principal> who = Authorize(ctx, "RollbackGateConfig");
  if (!who.ok()) {
    metrics_.config_updates_denied.Increment();
    return Finish(ctx, who.status());
  }
  absl::StatusOr<v1::VersionedGateConfig> result =
      store_->RollbackGateConfig(*request, AuditContext{who->name});
  CountConfigUpdate(result.status());
  return Reply(ctx, std::move(result), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ForgetJob(grpc::CallbackServerContext* ctx,
                                                      const v1::ForgetJobRequest* request,
                                                      v1::ForgetJobResponse* response) {
  absl::StatusOr<Principal> who = Authorize(ctx, "ForgetJob");
  if (!who.ok()) return Finish(ctx, who.status());
  return Reply(ctx, store_->ForgetJob(*request, AuditContext{who->name}), response);
}

void SyncWithFinishedCallbacks() {
#if defined(__SANITIZE_THREAD__)
  (void)callbacks_finished.load(std::memory_order_acquire);
#endif
}

}  // namespace spgate::server
