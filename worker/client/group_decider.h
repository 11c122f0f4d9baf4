// GroupDecider: one decision per (TP group, step), identical on every rank (docs/design.md §4).
// The leader (rank 0 of the group) asks its GateClient — the daemon's answer or the
// fail-static local one — and broadcasts it over the group's own communicator before the
// batch's first collective; the other ranks only receive. Non-leaders never ask the
// daemon. The broadcast is a function, so MPI, NCCL, torch.distributed or an in-memory
// group (in_memory_broadcast.h) plug in the same way.
//
// Invariant: Decide is a collective — every rank calls it for every step, in the same
// order — and every rank returns the same result, including errors (a leader that
// cannot decide broadcasts the failure instead of leaving its peers blocked in the
// broadcast). The leader waits for the daemon at most until the deadline; the other
// ranks wait only as long as the broadcast takes, i.e. for the leader.
//
// Thread-safety: one GroupDecider per rank, used from that rank's training thread.
//
// Usage (MPI, `comm` = the TP group's communicator):
//   auto bcast = [comm](spgate::client::DecisionWire& w, int root) -> absl::Status {
//     int rc = MPI_Bcast(&w, sizeof(w), MPI_BYTE, root, comm);
//     return rc == MPI_SUCCESS ? absl::OkStatus() : absl::InternalError("MPI_Bcast");
//   };
//   ASSIGN_OR_RETURN(auto decider, GroupDecider::Create(leader ? client.get() : nullptr,
//                                                       rank_in_group, bcast));
//   decider->SubmitPlan({.step = n + 1, .lengths = next});   // no-op on non-leaders
//   ASSIGN_OR_RETURN(GateDecision d, decider->Decide(n));     // every rank
#ifndef SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_
#define SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

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

// Broadcasts `wire` from rank `root` of the group: on the root it is the input, on the
// other ranks it is overwritten with the root's bytes.
using BroadcastFn = std::function<absl::Status(DecisionWire& wire, int root)>;

class GroupDecider {
 public:
  // `client` is required on the leader (rank_in_group 0; it may be a local-only client)
  // and ignored elsewhere.
  static absl::StatusOr<std::unique_ptr<GroupDecider>> Create(GateClient* client,
                                                              int rank_in_group,
                                                              BroadcastFn broadcast);

  bool is_leader() const { return rank_in_group_ == 0; }

  // Leader: GateClient::SubmitPlan. Others: OK, nothing to do.
  absl::Status SubmitPlan(const BatchPlanInput& plan);

  // Collective. The leader waits for the daemon until `deadline` (default: now + the
  // client's decision_deadline).
  absl::StatusOr<GateDecision> Decide(int64_t step);
  absl::StatusOr<GateDecision> Decide(int64_t step, absl::Time deadline);

 private:
  GroupDecider(GateClient* client, int rank_in_group, BroadcastFn broadcast)
      : client_(client), rank_in_group_(rank_in_group), broadcast_(std::move(broadcast)) {}

  GateClient* client_;
  int rank_in_group_;
  BroadcastFn broadcast_;
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_GROUP_DECIDER_H_
