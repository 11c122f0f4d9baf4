// GateClient: one training rank's connection to spgated (docs/design.md §4, §6). The leader of a TP
// group submits each batch's plan ahead of time and picks up the decision when the step
// starts; every rank reports its step telemetry. The invariant that matters: the calling
// (training) thread never waits on the daemon longer than the deadline it passes —
// SubmitPlan and ReportTelemetry only queue, and AwaitDecision falls back to the same
// policy the daemon runs (policy/gate_policy.h) under the last config in force for that
// step, reason CONTROLLER_UNAVAILABLE, when the daemon's answer is late or the daemon is
// unreachable. Whoever answered, the group never runs TP-only for a plan whose TP-only
// peak the worker's own memory gate says does not fit (decision_book.h).
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
//   opts.incarnation = run_id;            // this launch, the same on every rank
//   opts.launch_credential = credential;  // world rank 0's, broadcast (identity.h)
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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/types.h"
#include "worker/client/channel.h"  // CreateGateChannel, for callers sharing one
#include "worker/client/client_options.h"
#include "worker/client/client_types.h"
#include "worker/client/local_policy.h"

namespace spgate::client {

// GateClientOptions (client_options.h, the one table of the options), BatchPlanInput,
// GateDecision, DecisionSource and StepTelemetryInput (client_types.h) are the facade's
// value types.

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
  int64_t memory_overrides = 0;    // daemon TP-only answers the memory gate forbade (SP ran)
  // By policy reason, per decision: a step plan's local commit counts each micro-batch.
  std::array<int64_t, kNumReasons> local_decisions_by_reason{};
  int64_t config_updates = 0;
  int64_t learned_tables = 0;      // ADAPTIVE learned tables received (the fallback's)
  int64_t telemetry_reported = 0;  // ReportTelemetry calls accepted
  int64_t telemetry_sent = 0;      // written to a stream (all sessions)
  int64_t telemetry_acked = 0;     // acknowledged by the daemon (all sessions)
  int64_t telemetry_dropped = 0;   // buffer overflow, or buffered when the session was replaced
  int64_t last_decided_step = -1;  // from the last Register (-1: none)
  // The daemon ended this client's stream with ABORTED: its session was replaced, so
  // another process now holds this rank's seat in the launch. The client stops
  // reconnecting (two processes would otherwise take the seat from each other forever),
  // decides every later step locally and sends nothing more; last_error says so.
  bool session_replaced = false;
  std::string last_error;          // last RPC / stream failure, for logs
};

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
  // the fallback's rolling window. INVALID_ARGUMENT naming share unless it is in [0, 1]
  // (a NaN would keep the RS_WAIT gate open for good), or naming mode.
  absl::Status ObserveGroupRsWaitShare(int64_t step, Mode mode, double share);

  // Sends everything queued with a heartbeat and waits until the daemon has
  // acknowledged every telemetry record sent. DEADLINE_EXCEEDED (with the counts) if
  // that does not happen in `timeout`; OK at once without a controller;
  // FAILED_PRECONDITION at once once the session was replaced (nothing more is sent) or
  // the client is closed; PERMISSION_DENIED or UNAUTHENTICATED at once while the daemon's
  // latest answer refused this client's credential, INVALID_ARGUMENT while its latest
  // Register refused a field, UNIMPLEMENTED while the controller has no worker API
  // (docs/client.md).
  absl::Status Flush(absl::Duration timeout);

  // Waits until a stream is open and answered (tests, start-up logs). DEADLINE_EXCEEDED;
  // FAILED_PRECONDITION at once without a controller, once the session was replaced or
  // once the client is closed; PERMISSION_DENIED or UNAUTHENTICATED at once while the
  // credential is refused, INVALID_ARGUMENT while Register is refused (the daemon's
  // message, naming the field, is in the error), UNIMPLEMENTED while the controller has
  // no worker API (its admin or health port).
  absl::Status WaitUntilConnected(absl::Duration timeout);

  // Ends the connection (as the destructor does) and wakes every wait in progress on
  // other threads: WaitUntilConnected and Flush return FAILED_PRECONDITION, AwaitDecision
  // decides locally. The object stays valid until it is destroyed (every later call is
  // answered locally); destroy it only once no other thread is inside a call. Idempotent.
  void Close();

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
