// GroupDecider: one decision per (TP group, step), identical on every rank (docs/design.md §4).
// The leader (rank 0 of the group) asks its GateClient — the daemon's answer or the
// fail-static local one — and broadcasts it over the group's own communicator before the
// batch's first collective; the other ranks only receive. Non-leaders never ask the
// daemon. The group's collectives are two functions — a byte broadcast and a MAX-reduce of
// doubles — so MPI, NCCL, torch.distributed or an in-memory group (in_memory_broadcast.h)
// plug in the same way.
//
// Invariant: Decide is a collective — every rank calls it for every step, in the same
// order, with the same micro-batch count — and every rank returns the same result,
// including errors (a leader that cannot decide broadcasts the failure instead of leaving
// its peers blocked in the broadcast). A plain plan and a step plan take the same path:
// one broadcast of the DecisionWire and a tail of one byte per micro-batch, empty for a
// plain plan (microbatches 0). The leader waits for the daemon at most until the deadline;
// the other ranks wait only as long as the broadcast takes, i.e. for the leader.
//
// Thread-safety: one GroupDecider per rank, used from that rank's training thread.
//
// Usage (MPI, `comm` = the TP group's communicator):
//   auto bcast = [comm](std::span<uint8_t> b, int root) -> absl::Status {
//     int rc = MPI_Bcast(b.data(), b.size(), MPI_BYTE, root, comm);
//     return rc == MPI_SUCCESS ? absl::OkStatus() : absl::InternalError("MPI_Bcast");
//   };
//   auto reduce = [comm](std::span<double> v, int root) -> absl::Status {
//     int rank; MPI_Comm_rank(comm, &rank);
//     int rc = MPI_Reduce(rank == root ? MPI_IN_PLACE : v.data(), v.data(), v.size(),
//                         MPI_DOUBLE, MPI_MAX, root, comm);
//     return rc == MPI_SUCCESS ? absl::OkStatus() : absl::InternalError("MPI_Reduce");
//   };
//   ASSIGN_OR_RETURN(auto decider, GroupDecider::Create(leader ? client.get() : nullptr,
//                                                       rank_in_group, bcast, reduce));
//   decider->SubmitPlan({.step = n + 1, .lengths = next});   // no-op on non-leaders
//   ASSIGN_OR_RETURN(GateDecision d, decider->Decide(n));     // every rank
//   ... run step n ...
//   RETURN_IF_ERROR(decider->ReportTelemetry({.step = n, .mode = d.mode, ...}));  // every rank
#ifndef SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_
#define SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/client/gate_client.h"

namespace spgate::client {

// The broadcast payload: a 24-byte POD, the same bytes on every rank.
struct DecisionWire {
  int64_t step = 0;
  int64_t config_version = 0;
  uint8_t mode = 0;           // spgate::Mode; 0 when the leader failed
  uint8_t reason = 0;         // spgate::Reason as run
  uint8_t policy_reason = 0;  // the gate that decided
  uint8_t source = 0;         // DecisionSource
  int32_t status_code = 0;    // absl::StatusCode of the leader's failure; 0: ok
};
static_assert(std::is_trivially_copyable_v<DecisionWire> && sizeof(DecisionWire) == 24);

DecisionWire ToWire(const GateDecision& d);
// INVALID_ARGUMENT for a payload that is not a decision (corrupt broadcast).
absl::StatusOr<GateDecision> FromWire(const DecisionWire& w);
// What a receiving rank raises for a leader's failure on `step` (the wire carries only its
// code): that code, saying the leader's own error has the reason.
absl::Status LeaderFailure(int32_t status_code, int64_t step);

// Broadcasts `bytes` (the same length on every rank) from rank `root` of the group: on the
// root they are the input, on the other ranks they are overwritten with the root's. A
// decision travels in it as the DecisionWire's 24 bytes and then one byte per micro-batch
// of a step plan, mode << 4 | reason (docs/design.md §12); none for a plain plan.
using BroadcastFn = std::function<absl::Status(std::span<uint8_t> bytes, int root)>;

// The in-group telemetry payload (docs/design.md §2): 16 doubles, 128 bytes. Every rank
// packs its own record and the group takes the element-wise maximum, which yields each
// value's largest over the ranks, with the rank of the highest peak memory and the slowest
// rank (the most time outside collective waits, BusySeconds) carried in the low bits of
// those two values, and the largest and smallest step, mode and reason (so a group whose
// ranks disagree is caught).
struct TelemetryWire {
  static constexpr int kSlots = 16;
  double v[kSlots] = {};
};
static_assert(std::is_trivially_copyable_v<TelemetryWire> && sizeof(TelemetryWire) == 128);
// The largest group the payload's rank bits can name.
inline constexpr int kMaxTelemetryWireRanks = 4096;

// Rank `rank_in_group`'s record as a payload; `valid` false marks it as refused (the
// group's record is then not sent: the refused rank and the leader return the error).
TelemetryWire ToTelemetryWire(const StepTelemetryInput& t, int rank_in_group, bool valid = true);
// The group's record from the reduced payload of `group_size` ranks: ranks = group_size,
// each value the largest, rs_wait_s and norm_stall_s the largest share times step_time_s.
// INVALID_ARGUMENT when a rank's record was refused; INTERNAL when the ranks reported
// different steps, modes or reasons (the ranks are out of step, or ran different modes).
absl::StatusOr<StepTelemetryInput> GroupTelemetryFromWire(const TelemetryWire& reduced,
                                                          int group_size);

// Reduces `values` (the same length on every rank) with an element-wise maximum into rank
// `root`'s (MPI_Reduce with MPI_MAX over values.size() doubles, or an all-reduce: the other
// ranks' may be left as they were). A step's telemetry travels in it: the TelemetryWire's
// slots, then kMicrobatchTelemetrySlots per micro-batch of a step plan (docs/design.md
// §12), none for a plain plan, then the ranks' busy times (StragglerSlots), in one
// collective.
using MaxReduceFn = std::function<absl::Status(std::span<double> values, int root)>;
inline constexpr int kMicrobatchTelemetrySlots = 8;

// After the micro-batch records, each rank's busy time (BusySeconds) in its own slot, the
// others 0, so that the maximum is every rank's: `group_size` slots for the step, then as
// many per micro-batch while micro-batches × ranks is within kMaxStragglerBusyValues. The
// leader takes the group's straggler delays (StragglerSeconds) from them.
size_t StragglerSlots(int group_size, int microbatches);
void PackStragglerSlots(const StepTelemetryInput& t, int rank_in_group, int group_size,
                        std::span<double> slots);
// Sets `group`'s straggler_s, and its micro-batches' where their slots were sent.
void StragglersFromReduced(std::span<double> slots, int group_size, StepTelemetryInput& group);

// A rank's micro-batch records (valid: ids in [0, slots.size() / kMicrobatchTelemetrySlots))
// as reduction slots, at slot id × kMicrobatchTelemetrySlots.
void PackMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                             std::span<double> slots);
// The group's micro-batch records (one per id, each value the largest over the ranks)
// from the reduced slots; INTERNAL naming the micro-batch when the ranks ran it in
// different modes.
absl::StatusOr<std::vector<MicrobatchTelemetryValues>> MicrobatchesFromReduced(
    std::span<const double> slots, int microbatches, int64_t step);

class GroupDecider {
 public:
  // Collective: every rank of the group calls it, and either every rank gets a decider or
  // every rank fails. `client` is required on the leader (rank_in_group 0; it may be a
  // local-only client). Elsewhere it is only for per-rank sessions (group_session=false),
  // whose ranks report through their own clients. `reduce` gathers the group's telemetry for
  // the leader's group session: required when the leader's client speaks for a group of more
  // than one rank with a daemon, and then given on every rank. `refused`: an error the
  // caller found in this rank's own arguments (the C API's null output), which this rank
  // takes into the agreement as its own.
  //
  // Each rank checks its own arguments, then the leader broadcasts its outcome (one
  // broadcast of kCreateVerdictBytes): when the leader refused, every rank returns the
  // leader's error (the code, and its message on the others, named as the leader's); a
  // follower also checks its rank against the leader's group size and that it was given a
  // max-reduce exactly when the leader was. A follower's own refusal is its alone: the
  // broadcast carries nothing to the leader (a rank that refuses ends the job there,
  // MPI_Abort, rather than let its peers enter Decide). Without `broadcast` this rank cannot
  // take part and fails alone.
  static absl::StatusOr<std::unique_ptr<GroupDecider>> Create(
      GateClient* client, int rank_in_group, BroadcastFn broadcast, MaxReduceFn reduce = {},
      absl::Status refused = absl::OkStatus());
  // This rank's checks alone, without the collective: for a caller that agrees on every
  // rank's outcome with a collective of its own (spgate.torch.GroupDecider all-reduces
  // every rank's refusal before its followers make theirs).
  // `group_size`: the group's ranks, which a rank with `reduce` must know (its telemetry
  // gathers every rank's busy time); 0 takes the client's group_size.
  static absl::StatusOr<std::unique_ptr<GroupDecider>> CreateLocal(GateClient* client,
                                                                   int rank_in_group,
                                                                   BroadcastFn broadcast,
                                                                   MaxReduceFn reduce = {},
                                                                   int group_size = 0);
  static constexpr size_t kCreateVerdictBytes = 256;

  bool is_leader() const { return rank_in_group_ == 0; }

  // Leader: GateClient::SubmitPlan. Others: OK, nothing to do.
  absl::Status SubmitPlan(const BatchPlanInput& plan);

  // Collective: step `step`'s decision, and for a step plan (a job with a layout,
  // docs/design.md §12) the decision of each of its `microbatches` micro-batches (the
  // layout's, passed by every rank; 0: a plain plan; at most kMaxMicrobatches),
  // in one broadcast. Every rank returns the same step, mode, reasons, source and
  // micro-batch decisions (the leader's also has the stage's predicted peak and the pin's
  // details), or an error. The leader waits for the daemon until `deadline` (default: now
  // + the client's decision_deadline).
  absl::StatusOr<GateDecision> Decide(int64_t step, int microbatches = 0);
  absl::StatusOr<GateDecision> Decide(int64_t step, int microbatches, absl::Time deadline);
  absl::StatusOr<GateDecision> Decide(int64_t step, absl::Time deadline) {
    return Decide(step, 0, deadline);
  }

  // This rank's measurements of a step it ran. With `reduce`, a collective: every rank
  // calls it for every step it reports, in the same order; the values are reduced into the
  // leader, which queues one record for the group and feeds the group's reduce-scatter
  // wait share to its fallback. A rank whose record is refused still takes part, so no
  // rank is left waiting: it returns its error, and the leader sends nothing for the step
  // (INVALID_ARGUMENT); a group whose ranks reported different steps or modes is INTERNAL
  // on the leader. Without `reduce`, the rank's own client queues the record
  // (FAILED_PRECONDITION without one).
  //
  // After a step plan's Decide (microbatches > 0), every rank gives one micro-batch record
  // per id, reduced in the same collective (each value the largest over the ranks; a
  // micro-batch the ranks ran in different modes is INTERNAL on the leader); a rank
  // without them is refused, as above. After a plain plan's, micro-batch records are
  // refused.
  absl::Status ReportTelemetry(const StepTelemetryInput& telemetry);

 private:
  GroupDecider(GateClient* client, int rank_in_group, int group_size, BroadcastFn broadcast,
               MaxReduceFn reduce)
      : client_(client),
        rank_in_group_(rank_in_group),
        group_size_(group_size),
        broadcast_(std::move(broadcast)),
        reduce_(std::move(reduce)) {}

  // The leader: the group's record to its fallback's wait window and to the daemon.
  absl::Status SendGroupRecord(StepTelemetryInput group);

  GateClient* client_;
  int rank_in_group_;
  // The group's ranks: each has a slot in the reduction for its busy times, from which
  // the leader takes the group's straggler delays (StragglerSeconds).
  int group_size_;
  BroadcastFn broadcast_;
  MaxReduceFn reduce_;
  // The micro-batches per step the last Decide was called with (every rank passes the
  // layout's); 0: a plain plan.
  int microbatches_ = 0;
  std::vector<uint8_t> decision_buffer_;  // reused: no allocation per step
  std::vector<double> reduce_buffer_;
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_
