// GateClient's connection and writes (see gate_client_impl.h for the split and
// gate_client.cc for the concurrency model): Register with backoff, the Connect stream and
// its reactions, heartbeats, the daemon's messages into the decision book, and the one
// write in flight - gathered under mu_ (GatherLocked hands the plan records over),
// serialised outside it, the records let go of under it again (the book recycles them).
//
// Invariant: a reactor is deleted only after its writer hold is released (OnDone), so code
// that saw the hold under mu_ may start or cancel a write on it.
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "worker/client/gate_client_impl.h"
#include "worker/client/wire.h"

namespace spgate::client {

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

void GateClient::Impl::NoteRefusalLocked(const grpc::Status& s, bool register_call) {
  const grpc::StatusCode code = s.error_code();
  // A server without the worker API (UNIMPLEMENTED: the admin port, another service)
  // will not grow one on a retry: refused, as a field the daemon refuses.
  refused_ = code == grpc::StatusCode::PERMISSION_DENIED ? absl::StatusCode::kPermissionDenied
             : code == grpc::StatusCode::UNAUTHENTICATED ? absl::StatusCode::kUnauthenticated
             : code == grpc::StatusCode::INVALID_ARGUMENT && register_call
                 ? absl::StatusCode::kInvalidArgument
             : code == grpc::StatusCode::UNIMPLEMENTED && register_call
                 ? absl::StatusCode::kUnimplemented
                 : absl::StatusCode::kOk;
}

void GateClient::Impl::OnRegisterDone(const std::shared_ptr<RegisterCall>& call,
                                      const grpc::Status& s) {
  {
    spgate::MutexLock lock(&mu_);
    if (register_call_ == call) register_call_ = nullptr;
    NoteRefusalLocked(s, /*register_call=*/true);
    cv_.SignalAll();
    if (closing_) return;
    if (!s.ok()) {
      stats_.last_error =
          s.error_code() == grpc::StatusCode::UNIMPLEMENTED
              ? absl::StrCat("Register: UNIMPLEMENTED: ", opts_.controller,
                             " does not serve spgated's worker API (spgate.v1.GateService): "
                             "the admin or health port (--admin_listen, --health_listen), or another "
                             "server?")
              : absl::StrCat("Register: ", FromGrpcStatus(s).ToString());
      ScheduleReconnectLocked(BackoffLocked());
      return;
    }
    const v1::RegisterResponse& r = call->resp;
    session_id_ = r.session_id();
    session_sent_ = session_acked_ = 0;
    reported_base_ = acked_counts_;  // the new session counts from what a daemon has
    unacked_heartbeats_.clear();
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
  // The heartbeats a broken stream left unanswered may or may not have been counted: the
  // next session starts from the last one answered (what they added may be counted
  // again, never lost).
  unacked_heartbeats_.clear();
  heartbeat_seq_ = 0;
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
  IssueWriteLocked(ClaimWriteLocked());  // once per stream: fine under the lock
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
  refused_ = absl::StatusCode::kOk;  // the daemon answered this stream
  attempt_ = 0;
  not_found_streak_ = 0;
  for (const v1::Decision& wire : msg.decisions()) {
    std::optional<GateDecision> d = DecisionFromProto(wire);
    if (!d.has_value()) continue;
    const PlanRecord* p = book_.OnDaemonDecision(*std::move(d));
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
    // The heartbeats it answers are counted: up to the seq it names (a daemon before
    // Heartbeat.seq names none: then the oldest, one ack a heartbeat).
    const int64_t answered = msg.ack().heartbeat_seq() > 0 ? msg.ack().heartbeat_seq()
                             : unacked_heartbeats_.empty() ? 0
                                                           : unacked_heartbeats_.front().seq;
    while (!unacked_heartbeats_.empty() && unacked_heartbeats_.front().seq <= answered) {
      acked_counts_ = unacked_heartbeats_.front().counts;
      unacked_heartbeats_.pop_front();
    }
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
  NoteRefusalLocked(status, /*register_call=*/false);
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
    const HeartbeatCounts now_counts{book_.counters().local_decisions_by_reason,
                                     book_.counters().memory_overrides};
    for (int r = 0; r < kNumReasons; ++r) {
      out.counts.local_decisions[r] =
          std::max<int64_t>(0, now_counts.local_decisions[r] - reported_base_.local_decisions[r]);
    }
    out.counts.memory_overrides =
        std::max<int64_t>(0, now_counts.memory_overrides - reported_base_.memory_overrides);
    out.heartbeat_seq = ++heartbeat_seq_;
    unacked_heartbeats_.push_back({out.heartbeat_seq, now_counts});
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
  if (!w.out.plans.empty()) {
    // The plans are let go of under the lock: the book recycles a record when its count,
    // read under that lock, is one (DecisionBook::NewRecord), which then orders this
    // thread's reads of it before the record's next fill.
    spgate::MutexLock lock(&mu_);
    w.out.plans.clear();
  }
  w.reactor->StartWrite(&w.reactor->out);
}

void GateClient::Impl::IssueWriteLocked(ClaimedWrite w) {
  if (w.reactor == nullptr) return;
  BuildWorkerMessage(opts_, w.out, &w.reactor->out);
  w.out.plans.clear();  // under mu_, as IssueWrite's
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

}  // namespace spgate::client
