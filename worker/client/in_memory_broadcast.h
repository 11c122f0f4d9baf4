// An in-process "communicator" for GroupDecider: the ranks of one group are threads (or
// state machines driven by one thread) of the same process. Like a real collective,
// calls match by order: every rank's k-th Broadcast gets the root's k-th payload, and
// every rank's k-th MaxReduce goes into the root's k-th. The sender side never waits: a
// broadcast's root and a reduction's contributors; the other side waits (bounded by
// `timeout`) for them. Ranks that disagree on a call's root or length fail at once, on
// every rank that is or will be waiting in that call, rather than at the timeout.
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
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "worker/client/group_decider.h"

namespace spgate::client {

class InMemoryBroadcast {
 public:
  explicit InMemoryBroadcast(int group_size, absl::Duration timeout = absl::Seconds(60));

  // `bytes` (the same length on every rank) from `root`; INTERNAL when a receiver expected
  // another length or another root.
  absl::Status Broadcast(int rank, std::span<uint8_t> bytes, int root);
  BroadcastFn ForRank(int rank) {
    return [this, rank](std::span<uint8_t> b, int root) { return Broadcast(rank, b, root); };
  }

  // Element-wise max into the root's `values`, matched by call order like Broadcast. A
  // non-root contributes and returns at once; the root waits (bounded by `timeout`) for
  // the others, so one thread may drive every rank, the root last. Ranks that reduce
  // different lengths or into different roots get INTERNAL, the waiting root too.
  absl::Status MaxReduce(int rank, std::span<double> values, int root);
  MaxReduceFn ReduceForRank(int rank) {
    return [this, rank](std::span<double> v, int root) { return MaxReduce(rank, v, root); };
  }

 private:
  struct Slot {
    std::vector<uint8_t> bytes;
    int root = 0;
    int remaining = 0;  // receivers that have not taken it yet
  };
  struct ReduceSlot {
    std::vector<double> acc;
    int root = 0;
    int arrived = 0;
    std::string error;  // the ranks disagreed: every rank in the call fails with this
  };
  absl::Status CheckRanks(int rank, int root) const;

  const int size_;
  const absl::Duration timeout_;
  spgate::Mutex mu_;
  spgate::CondVar cv_;
  std::vector<uint64_t> calls_ ABSL_GUARDED_BY(mu_);  // per rank
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> reduce_calls_ ABSL_GUARDED_BY(mu_);  // per rank
  std::map<uint64_t, ReduceSlot> reduce_slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_IN_MEMORY_BROADCAST_H_
