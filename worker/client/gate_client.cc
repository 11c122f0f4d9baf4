// GateClient: Register + one Connect stream (gRPC callback API) and the telemetry
// buffer, around the leader's decision book (decision_book.h: plans, daemon answers and
// the fail-static fallback). Messages and the channel are built in wire.h; the
// connection and the writes are in gate_client_stream.cc, the class both share in
// gate_client_impl.h. See gate_client.h.
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
#include "common/bearer_token.h"
#include "common/handshake_hint.h"
#include "common/hardware_id.h"
#include "common/job_id.h"
#include "common/mutex.h"
#include "common/registration.h"
#include "grpcpp/grpcpp.h"
#include "policy/gate_policy.h"
#include "policy/telemetry.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "worker/client/client_runtime.h"
#include "worker/client/decision_book.h"
#include "worker/client/gate_client_impl.h"
#include "worker/client/identity.h"
#include "worker/client/wire.h"

namespace spgate::client {
namespace {

absl::Status ValidateOptions(const GateClientOptions& o) {
  auto bad = [](std::string msg) { return absl::InvalidArgumentError(std::move(msg)); };
  // The daemon's own rule (common/job_id.h): an id it would refuse fails here, at once.
  if (!o.controller.empty() || !o.job_id.empty()) RETURN_IF_ERROR(ValidateJobId(o.job_id));
  RETURN_IF_ERROR(ValidateControllerAddress(o.controller));
  if (!o.controller.empty() && o.incarnation.empty()) {
    return bad("incarnation must be set: one value per launch of the job, the same on every "
               "rank: the launcher's run id (SPGATE_INCARNATION, TORCHELASTIC_RUN_ID, Slurm's "
               "job and step ids), or one world rank 0 makes and broadcasts (C++ "
               "IncarnationFromEnvironment(); Python spgate.torch.agree_on_launch)");
  }
  if (!o.controller.empty()) {
    RETURN_IF_ERROR(ValidateIncarnation(o.incarnation));  // the daemon's rule
    if (o.launch_credential.empty()) {
      return bad("launch_credential must be set: the launch's secret, the same on every rank "
                 "(SPGATE_LAUNCH_CREDENTIAL, or NewLaunchCredential() on world rank 0, "
                 "broadcast over the job's communicator)");
    }
    RETURN_IF_ERROR(CheckLaunchCredential(o.launch_credential));
  }
  // A token a header cannot carry would abort the process at the first call (gRPC's
  // check), printing it: refused here instead, without it.
  if (!o.worker_token.empty()) RETURN_IF_ERROR(CheckBearerToken(o.worker_token, "worker_token"));
  RETURN_IF_ERROR(ValidateHardwareId(o.hardware_id));  // the daemon's rule
  // Register's fields by the daemon's rules (common/registration.h), so that one it would
  // refuse fails here, naming the field. A group's upper bound is the daemon's
  // --max_groups_per_job: that refusal of Register reaches WaitUntilConnected at once.
  if (o.group < 0) return bad(absl::StrCat("group: must be >= 0, got ", o.group));
  RETURN_IF_ERROR(ValidateGroupSize(o.group_size));
  RETURN_IF_ERROR(ValidateGlobalRank(o.global_rank));
  RETURN_IF_ERROR(ValidateHost(o.host));
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
  return ValidateSpRequiredFeatures(o.sp_required);
}

}  // namespace

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
  // The one plan shape (decision_book.h), its lengths kept only for a client that sends
  // them, filled under the lock into a record the book recycles: no allocation in a steady
  // run, for a fill under it that is O(sequences) (~1 µs per 1,000, a copy and one pass:
  // this client's own network callbacks wait that long, the training thread on none).
  spgate::MutexLock lock(&mu_);
  std::shared_ptr<PlanRecord> record = book_.NewRecord();
  RETURN_IF_ERROR(MakePlanRecord(opts_.layout ? &*opts_.layout : nullptr, plan,
                                 opts_.memory_budget_bytes, record.get(), remote()));
  if (remote()) record->submitted = absl::Now();
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
  // rules, keeps "sent minus acknowledged" a count of records lost in transit. The step's
  // own plan, while it is the last committed, bounds its tokens as it does at the daemon
  // (docs/design.md §2, "Range rules").
  spgate::MutexLock lock(&mu_);
  const TelemetryBounds bounds = book_.TelemetryBoundsFor(t.step);
  RETURN_IF_ERROR(ValidateStepTelemetry(TelemetryValues(t), bounds));
  if (!t.microbatches.empty() && !opts_.layout.has_value()) {
    return absl::InvalidArgumentError(
        "telemetry.micro_batches: only a client with a layout (step plans) reports "
        "micro-batches");
  }
  RETURN_IF_ERROR(ValidateMicrobatchTelemetry(
      t.microbatches, opts_.layout.has_value() ? opts_.layout->microbatches : 0, bounds));
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

absl::Status GateClient::Impl::ObserveGroupRsWaitShare(int64_t step, Mode mode, double share) {
  // A NaN would make the window's mean NaN, and every comparison with it false: the
  // RS_WAIT gate would never close again.
  if (!(share >= 0.0 && share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("share: must be finite and in [0, 1], got %g", share));
  }
  if (mode != Mode::kSequenceParallel && mode != Mode::kTensorParallelOnly) {
    return absl::InvalidArgumentError(
        absl::StrFormat("mode: not a mode (%d)", static_cast<int>(mode)));
  }
  spgate::MutexLock lock(&mu_);
  rs_wait_explicit_ = true;
  book_.ObserveRsWaitShare(step, mode, share);
  return absl::OkStatus();
}

absl::Status GateClient::Impl::Flush(absl::Duration timeout) {
  if (!remote()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  spgate::MutexLock lock(&mu_);
  while (true) {
    if (session_replaced_) return SessionReplacedLocked("flush");
    if (refused_ != absl::StatusCode::kOk) return RefusedLocked("flush");
    if (confirmed_ && StreamOpenLocked() && telemetry_.empty() && !write_in_flight_ &&
        session_acked_ >= session_sent_) {
      return absl::OkStatus();
    }
    if (closing_) return absl::FailedPreconditionError("flush: the client is closed");
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
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

absl::Status GateClient::Impl::RefusedLocked(const char* what) const {
  const std::string message = absl::StrFormat(
      "%s: the daemon at %s refused %s (%s); %d telemetry records still buffered (the "
      "client keeps retrying)",
      what, opts_.controller,
      refused_ == absl::StatusCode::kInvalidArgument || refused_ == absl::StatusCode::kUnimplemented
          ? "this client's registration"
          : "this client's credential",
      stats_.last_error, telemetry_.size());
  return absl::Status(refused_, message);
}

absl::Status GateClient::Impl::WaitUntilConnected(absl::Duration timeout) {
  if (!remote()) return absl::FailedPreconditionError("no controller configured");
  const absl::Time deadline = absl::Now() + timeout;
  spgate::MutexLock lock(&mu_);
  while (!(confirmed_ && StreamOpenLocked())) {
    if (closing_) return absl::FailedPreconditionError("not connected: the client is closed");
    if (session_replaced_) return SessionReplacedLocked("not connected");
    if (refused_ != absl::StatusCode::kOk) return RefusedLocked("not connected");
    if (cv_.WaitWithDeadline(&mu_, deadline)) {
      if (confirmed_ && StreamOpenLocked()) break;
      if (closing_) continue;  // said above
      // A TLS port refusing this client (plaintext, no or another CA's certificate)
      // reads as a closed socket: say so, naming the C API's and Python's options (the
      // credentials do not say whether they are TLS: both causes are named).
      const std::string hint = TlsRefusalHint(stats_.last_error, std::nullopt, "");
      // To the millisecond: a timeout computed from a deadline or a float (1.99999988s)
      // reads as the round number it stands for.
      const absl::Duration waited =
          absl::Floor(timeout + absl::Microseconds(500), absl::Milliseconds(1));
      return absl::DeadlineExceededError(absl::StrCat(
          "not connected to ", opts_.controller, " after ", absl::FormatDuration(waited),
          stats_.last_error.empty() ? "" : "; last error: ", stats_.last_error,
          hint.empty() ? "" : "; ", hint));
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
  // Declared at Register only: a client without a daemon detects nothing.
  if (!options.controller.empty() && options.hardware_id.empty()) {
    options.hardware_id = DefaultHardwareId();
    // A detected id is made valid; one from the environment is named as such.
    RETURN_IF_ERROR(ValidateHardwareId(options.hardware_id, "SPGATE_HARDWARE_ID"));
  }
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
absl::Status GateClient::ObserveGroupRsWaitShare(int64_t step, Mode mode, double share) {
  return impl_->ObserveGroupRsWaitShare(step, mode, share);
}
void GateClient::Close() { impl_->Shutdown(); }
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
