// InMemoryBroadcast: order-matched slots; see in_memory_broadcast.h.
#include "worker/client/in_memory_broadcast.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace spgate::client {

InMemoryBroadcast::InMemoryBroadcast(int group_size, absl::Duration timeout)
    : size_(group_size), timeout_(timeout), calls_(group_size, 0), reduce_calls_(group_size, 0) {}

absl::Status InMemoryBroadcast::CheckRanks(int rank, int root) const {
  if (rank < 0 || rank >= size_ || root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d / root %d outside a group of %d", rank, root, size_));
  }
  return absl::OkStatus();
}

absl::Status InMemoryBroadcast::Broadcast(int rank, std::span<uint8_t> bytes, int root) {
  RETURN_IF_ERROR(CheckRanks(rank, root));
  spgate::MutexLock lock(&mu_);
  const uint64_t k = calls_[rank]++;
  if (rank == root) {
    if (size_ == 1) return absl::OkStatus();
    auto [it, inserted] = slots_.try_emplace(k);
    if (!inserted) {
      return absl::InternalError(absl::StrFormat(
          "broadcast #%d: rank %d sends as root, but rank %d already did", k, rank,
          it->second.root));
    }
    it->second = Slot{.bytes = std::vector<uint8_t>(bytes.begin(), bytes.end()),
                      .root = root,
                      .remaining = size_ - 1};
    cv_.SignalAll();
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout_;
  auto it = slots_.find(k);
  while (it == slots_.end()) {
    const bool timed_out = cv_.WaitWithDeadline(&mu_, deadline);
    it = slots_.find(k);
    if (it == slots_.end() && timed_out) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d waited %s for broadcast #%d from root %d", rank,
          absl::FormatDuration(timeout_), k, root));
    }
  }
  Slot& slot = it->second;
  absl::Status s = absl::OkStatus();
  if (slot.root != root) {
    s = absl::InternalError(absl::StrFormat(
        "broadcast #%d: rank %d expected root %d, the sender was rank %d", k, rank, root,
        slot.root));
  } else if (slot.bytes.size() != bytes.size()) {
    s = absl::InternalError(absl::StrFormat("rank %d expected %d broadcast bytes, the root sent %d",
                                            rank, bytes.size(), slot.bytes.size()));
  } else {
    std::copy(slot.bytes.begin(), slot.bytes.end(), bytes.begin());
  }
  if (--slot.remaining == 0) slots_.erase(it);
  return s;
}

absl::Status InMemoryBroadcast::MaxReduce(int rank, std::span<double> values, int root) {
  RETURN_IF_ERROR(CheckRanks(rank, root));
  spgate::MutexLock lock(&mu_);
  const uint64_t k = reduce_calls_[rank]++;
  ReduceSlot& slot = reduce_slots_[k];  // std::map: the reference outlives other inserts
  if (slot.arrived > 0 && slot.error.empty()) {
    // A real collective would hang or fail here: the ranks disagree on the call.
    if (slot.root != root) {
      slot.error = absl::StrFormat(
          "reduction #%d: rank %d reduces into rank %d, an earlier rank into rank %d", k, rank,
          root, slot.root);
    } else if (slot.acc.size() != values.size()) {
      slot.error = absl::StrFormat("reduction #%d: rank %d reduces %d values, an earlier rank %d",
                                   k, rank, values.size(), slot.acc.size());
    }
  }
  ++slot.arrived;
  cv_.SignalAll();
  // A disagreeing call fails every rank in it (a waiting root wakes to it); its slot is
  // kept, so that the ranks still to arrive fail too.
  if (!slot.error.empty()) return absl::InternalError(slot.error);
  if (slot.arrived == 1) {
    slot.acc.assign(values.begin(), values.end());
    slot.root = root;
  } else {
    for (size_t i = 0; i < values.size(); ++i) slot.acc[i] = std::max(slot.acc[i], values[i]);
  }
  if (rank != root) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  while (slot.arrived < size_ && slot.error.empty()) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && slot.arrived < size_ && slot.error.empty()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d waited %s for reduction #%d: %d of %d ranks arrived", rank,
          absl::FormatDuration(timeout_), k, slot.arrived, size_));
    }
  }
  if (!slot.error.empty()) return absl::InternalError(slot.error);
  std::copy(slot.acc.begin(), slot.acc.end(), values.begin());
  reduce_slots_.erase(k);
  return absl::OkStatus();
}

}  // namespace spgate::client
