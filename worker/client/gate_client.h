// GateClient: one training rank's connection to spgated (docs/design.md §4, §6). The leader of a TP
// group submits each batch's plan ahead of time and picks up the decision when the step
// starts; every rank reports its step telemetry. The invariant that matters: the calling
// (training) thread never waits on the daemon longer than the deadline it passes —
// SubmitPlan and ReportTelemetry only queue, and AwaitDecision falls back to the same
// policy the daemon runs (policy/gate_policy.h) under the last config in force for that
// step, reason CONTROLLER_UNAVAILABLE, when the daemon's answer is late or the daemon is
// unreachable.
//
// Decisions must reach every rank of the group identically: use GroupDecider
// (group_decider.h), which asks this client on the leader and broadcasts the answer.
//
// Thread-safety: every method may be called from any thread, concurrently. The intended
// use is one training thread calling SubmitPlan / AwaitDecision / ReportTelemetry in step
// order (steps strictly increase per client); AwaitDecision is the only call that blocks,
// and only until its deadline. All network work runs on gRPC's callback threads and one
// process-wide spgate thread shared by every client in the process (heartbeats, flushes,
// reconnect backoff), so 1,024 clients in one process do not mean 1,024 threads.
//
// Usage (leader of group 3; see docs/client.md):
//   spgate::client::GateClientOptions opts;
//   opts.controller = "127.0.0.1:50061";
//   opts.job_id = "llama-13b";
//   opts.group = 3; opts.rank_in_group = 0; opts.group_size = 8;
//   ASSIGN_OR_RETURN(auto client, spgate::client::GateClient::Create(opts));
//   client->SubmitPlan({.step = n + 1, .lengths = next_lengths});     // while step n runs
//   ...
//   auto d = client->AwaitDecision(n + 1, absl::Now() + absl::Milliseconds(20));
//   ... run step n + 1 in d->mode ...
//   client->ReportTelemetry({.step = n + 1, .mode = d->mode, .reason = d->reason, ...});
#ifndef SPGATE_WORKER_CLIENT_GATE_CLIENT_H_
#define SPGATE_WORKER_CLIENT_GATE_CLIENT_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/types.h"
#include "worker/client/local_policy.h"

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace spgate::client {

struct GateClientOptions {
  // Worker API address of spgated ("host:port"). Empty: no daemon; the leader decides
  // every step with the local policy (source kLocalOnly, reason = the gate's reason).
  std::string controller;
  std::string job_id;
  // One launch of the job (docs/design.md §10): the same on every rank, new on every
  // relaunch — IncarnationFromEnvironment() (identity.h) reads the launcher's, else world
  // rank 0 makes one (NewIncarnation()) and broadcasts it. Required with a controller.
  std::string incarnation;
  // Shared worker credential of a daemon run with --worker_token_file; empty: none.
  std::string worker_token;
  int group = 0;          // TP group index
  int rank_in_group = 0;  // 0 is the leader: only the leader submits plans
  int group_size = 1;     // t
  int global_rank = 0;
  std::string host;       // defaults to the host name
  struct Model {
    int layers = 0, hidden = 0, heads = 0, ffn_hidden = 0;
  } model;
  uint64_t memory_budget_bytes = 0;

  // Config used until the daemon's arrives (and forever without a daemon).
  GateConfig initial_config;
  // Deadline AwaitDecision(step) uses when the caller passes none (docs/design.md §4: 20 ms).
  absl::Duration decision_deadline = absl::Milliseconds(20);
  // Deadline of each Register call.
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Reconnect backoff: initial * 2^attempt, capped, times a uniform jitter in
  // [1 - jitter, 1 + jitter].
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double backoff_jitter = 0.2;
  // HTTP/2 keepalive. The daemon accepts pings every >= 5 s, also without calls; 10 s
  // detects a dead peer in ~15 s on a quiet stream (heartbeats usually notice sooner).
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(5);
  // Telemetry records buffered while the stream is busy or down; beyond this the oldest
  // are dropped and counted (telemetry_dropped).
  int telemetry_buffer = 4096;
  // 0: telemetry goes out with the next write, like plans (within the shared runtime's
  // poll interval, 0.5 ms). > 0: it waits up to this long to be batched (a timer), unless
  // a message's worth is pending. A write in flight batches whatever queues behind it.
  absl::Duration telemetry_flush_interval = absl::ZeroDuration();
  int max_telemetry_per_message = 512;
  // Plans kept for steps not yet decided (pipelining depth); older ones are dropped.
  int max_pending_plans = 1024;
  // Feed the fallback's rolling wait share with this rank's own telemetry until the
  // trainer calls ObserveGroupRsWaitShare (see local_policy.h).
  bool rs_wait_from_own_telemetry = true;
  // Seed of the backoff jitter; 0: random.
  uint64_t seed = 0;
  // Optional: a channel to use (e.g. shared by the ranks of one simulated process);
  // otherwise one is created with `credentials` (insecure when null; TlsChannelCredentials
  // in tls.h builds them from the --tls_* settings) and, when set, `tls_server_name` as
  // the name checked in the daemon's certificate instead of the host of `controller`.
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;
};

// One batch's plan (docs/design.md §3 memory gate inputs plus the sequence lengths).
struct BatchPlanInput {
  int64_t step = 0;
  std::span<const int64_t> lengths;  // tokens per sequence, each in [1, 2^24]
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;  // 0: the client's option; both 0: no memory gate
};

enum class DecisionSource : uint8_t {
  kDaemon = 1,     // the daemon's answer arrived before the deadline
  kFallback = 2,   // late or unreachable daemon: local policy, CONTROLLER_UNAVAILABLE
  kLocalOnly = 3,  // no controller configured: local policy, the gate's own reason
};
std::string_view DecisionSourceLabel(DecisionSource source);  // daemon, fallback, local

struct GateDecision {
  int64_t step = 0;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;         // as run and reported
  Reason policy_reason = Reason::kGatesPassed;  // the gate that decided (== reason
                                                // unless reason is CONTROLLER_UNAVAILABLE)
  DecisionSource source = DecisionSource::kDaemon;
  int64_t config_version = 0;
  // PINNED decisions from the daemon: when the pin ends and whether it was forced, so a
  // fallback that keeps honouring the pin while the daemon is away stops on time.
  std::optional<absl::Time> pin_expire;
  bool pin_forced = false;
  friend bool operator==(const GateDecision&, const GateDecision&) = default;
};

// One rank's measurements of one step (docs/design.md §2); the client adds job, group and rank.
struct StepTelemetryInput {
  int64_t step = 0;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  double step_time_s = 0;
  double rs_wait_s = 0;
  double all_gather_s = 0;
  double norm_stall_s = 0;
  int64_t effective_tokens = 0;
  int64_t padding_tokens = 0;
  uint64_t peak_memory_bytes = 0;
};

struct GateClientStats {
  bool connected = false;          // a stream is open and the daemon has answered on it
  int64_t registrations = 0;       // successful Register calls (sessions)
  int64_t streams_opened = 0;
  int64_t stream_failures = 0;
  int64_t plans_submitted = 0;
  int64_t plans_sent = 0;          // includes re-sends after a reconnect
  int64_t plans_dropped = 0;       // over max_pending_plans
  int64_t plans_rejected = 0;      // refused by the daemon (decided locally at once)
  int64_t decisions_received = 0;  // daemon decisions that arrived for pending plans
  int64_t daemon_decisions = 0;    // AwaitDecision answered by the daemon
  int64_t late_decisions = 0;      // daemon answers that came after a local decision
  int64_t local_decisions = 0;     // fallback + local-only decisions
  std::array<int64_t, kNumReasons> local_decisions_by_reason{};  // by policy reason
  int64_t config_updates = 0;
  int64_t learned_tables = 0;      // ADAPTIVE learned tables received (the fallback's)
  int64_t telemetry_reported = 0;  // ReportTelemetry calls accepted
  int64_t telemetry_sent = 0;      // written to a stream (all sessions)
  int64_t telemetry_acked = 0;     // acknowledged by the daemon (all sessions)
  int64_t telemetry_dropped = 0;   // buffer overflow
  int64_t last_decided_step = -1;  // from the last Register (-1: none)
  std::string last_error;          // last RPC / stream failure, for logs
};

// The channel GateClient creates (keepalive and reconnect settings of `options`), for
// callers that share one among several clients. `own_connection`: a TCP connection of its
// own instead of gRPC's process-wide one per target (spgate-sim uses one per group, like
// one per training pod).
std::shared_ptr<grpc::Channel> CreateGateChannel(const GateClientOptions& options,
                                                 bool own_connection = false);

class GateClient {
 public:
  // Validates the options and starts connecting in the background; never waits for the
  // daemon. INVALID_ARGUMENT names a bad option.
  static absl::StatusOr<std::unique_ptr<GateClient>> Create(GateClientOptions options);

  // Closes the stream (without waiting for acks; call Flush first to drain telemetry).
  ~GateClient();
  GateClient(const GateClient&) = delete;
  GateClient& operator=(const GateClient&) = delete;

  // Leader only. Queues the plan and returns; the plan goes out on the stream at once
  // (and again after a reconnect if still undecided). FAILED_PRECONDITION on a
  // non-leader or a step not above the last decided one; INVALID_ARGUMENT on bad lengths.
  absl::Status SubmitPlan(const BatchPlanInput& plan);

  // Leader only. The decision for `step` (whose plan was submitted): the daemon's when it
  // has arrived by `deadline`, otherwise the local policy's. Returns at once while no
  // stream is open. Deciding a step commits it: the state advances, and asking again for
  // the same step returns the same decision.
  absl::StatusOr<GateDecision> AwaitDecision(int64_t step, absl::Time deadline);
  absl::StatusOr<GateDecision> AwaitDecision(int64_t step);  // now + decision_deadline

  // Any rank. Queues the record (batched onto the stream); never blocks. INVALID_ARGUMENT
  // for a record the daemon would refuse (step < 0, step_time_s <= 0, negative times).
  absl::Status ReportTelemetry(const StepTelemetryInput& telemetry);

  // Leader: the group's reduce-scatter wait share for an SP step (max over ranks) when
  // the trainer has it; from the first call on, this replaces the leader's own share in
  // the fallback's rolling window.
  void ObserveGroupRsWaitShare(int64_t step, Mode mode, double share);

  // Sends everything queued with a heartbeat and waits until the daemon has
  // acknowledged every telemetry record sent. DEADLINE_EXCEEDED (with the counts) if
  // that does not happen in `timeout`; OK at once without a controller.
  absl::Status Flush(absl::Duration timeout);

  // Waits until a stream is open and answered (tests, start-up logs). DEADLINE_EXCEEDED.
  absl::Status WaitUntilConnected(absl::Duration timeout);

  // The gate config in force for `step` as this client knows it (the daemon's, once
  // received, honouring effective_from_step): e.g. bucket_target_cv for the trainer's
  // bucketing, or to log which config a step ran under.
  ScheduledConfig ConfigFor(int64_t step) const;

  GateClientStats stats() const;
  const GateClientOptions& options() const;

  // Leader: for each daemon decision that arrived since the last call (at most 65,536 are
  // kept in between), seconds from SubmitPlan to the decision arriving (`total_s`), and
  // the part of it the plan spent queued in this process before the client's writer took
  // it for the stream (`queued_s`: the runtime thread's pickup, and its queue when many
  // clients share the process, as in spgate-sim). The rest is serialisation, the network,
  // the daemon and the reply.
  struct DecisionLatency {
    double total_s = 0;
    double queued_s = 0;
  };
  std::vector<DecisionLatency> TakeDecisionLatencies();

  class Impl;

 private:
  explicit GateClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_GATE_CLIENT_H_
