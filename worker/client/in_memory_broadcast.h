// An in-process "communicator" for GroupDecider: the ranks of one group are threads (or
// state machines driven by one thread) of the same process. Like a real collective,
// calls match by order: every rank's k-th Broadcast gets the root's k-th payload, and
// every rank's k-th MaxReduce goes into the root's k-th. The sender side never waits: a
// broadcast's root and a reduction's contributors; the other side waits (bounded by
// `timeout`) for them.
// Used by spgate-sim and the tests; thread-safe.
//
// Usage:
//   spgate::client::InMemoryBroadcast group(/*group_size=*/8);
//   auto decider = GroupDecider::Create(client, rank, group.ForRank(rank),
//                                       group.ReduceForRank(rank));
#ifndef SPGATE_WORKER_CLIENT_IN_MEMORY_BROADCAST_H_
#define SPGATE_WORKER_CLIENT_IN_MEMORY_BROADCAST_H_

#include <cstdint>
#include <map>
#include <vector>

#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "absl/time/time.h"
#include "worker/client/group_decider.h"

namespace spgate::client {

class InMemoryBroadcast {
 public:
  explicit InMemoryBroadcast(int group_size, absl::Duration timeout = absl::Seconds(60));

  absl::Status Broadcast(int rank, DecisionWire& wire, int root);
  BroadcastFn ForRank(int rank) {
    return [this, rank](DecisionWire& w, int root) { return Broadcast(rank, w, root); };
  }
  // Bytes of the same length on every rank, matched by call order with Broadcast (one
  // sequence of broadcasts, as on a real communicator).
  absl::Status BroadcastBytes(int rank, std::span<uint8_t> bytes, int root);
  BytesBroadcastFn BytesForRank(int rank) {
    return [this, rank](std::span<uint8_t> b, int root) { return BroadcastBytes(rank, b, root); };
  }

  // Element-wise max into the root's `wire`, matched by call order like Broadcast. A
  // non-root contributes and returns at once; the root waits (bounded by `timeout`) for
  // the others, so one thread may drive every rank, the root last.
  absl::Status MaxReduce(int rank, TelemetryWire& wire, int root);
  MaxReduceFn ReduceForRank(int rank) {
    return [this, rank](TelemetryWire& w, int root) { return MaxReduce(rank, w, root); };
  }
  // The same over any number of doubles (a step plan's telemetry), in the same sequence
  // of reductions as MaxReduce; ranks that reduce different lengths get INTERNAL.
  absl::Status MaxReduceVector(int rank, std::span<double> values, int root);
  VectorMaxReduceFn VectorReduceForRank(int rank) {
    return [this, rank](std::span<double> v, int root) { return MaxReduceVector(rank, v, root); };
  }

 private:
  struct Slot {
    DecisionWire wire;
    std::vector<uint8_t> bytes;  // BroadcastBytes
    bool is_bytes = false;
    int root = 0;
    int remaining = 0;  // receivers that have not taken it yet
  };
  // The root puts `sent` in this rank's next slot; another rank waits for it and gets it.
  absl::Status Exchange(int rank, int root, Slot& sent_or_received);
  const int size_;
  const absl::Duration timeout_;
  spgate::Mutex mu_;
  spgate::CondVar cv_;
  std::vector<uint64_t> calls_ ABSL_GUARDED_BY(mu_);  // per rank
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  struct ReduceSlot {
    std::vector<double> acc;
    int root = 0;
    int arrived = 0;
  };
  std::vector<uint64_t> reduce_calls_ ABSL_GUARDED_BY(mu_);  // per rank
  std::map<uint64_t, ReduceSlot> reduce_slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_IN_MEMORY_BROADCAST_H_
