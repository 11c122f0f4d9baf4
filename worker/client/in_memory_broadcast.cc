// InMemoryBroadcast: order-matched slots; see in_memory_broadcast.h.
#include "worker/client/in_memory_broadcast.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace spgate::client {

InMemoryBroadcast::InMemoryBroadcast(int group_size, absl::Duration timeout)
    : size_(group_size), timeout_(timeout), calls_(group_size, 0), reduce_calls_(group_size, 0) {}

absl::Status InMemoryBroadcast::Broadcast(int rank, DecisionWire& wire, int root) {
  Slot slot{.wire = wire};
  RETURN_IF_ERROR(Exchange(rank, root, slot));
  if (slot.is_bytes) {
    return absl::InternalError(absl::StrFormat(
        "rank %d expected a decision broadcast, the root sent bytes", rank));
  }
  wire = slot.wire;
  return absl::OkStatus();
}

absl::Status InMemoryBroadcast::BroadcastBytes(int rank, std::span<uint8_t> bytes, int root) {
  Slot slot{.bytes = std::vector<uint8_t>(bytes.begin(), bytes.end()), .is_bytes = true};
  RETURN_IF_ERROR(Exchange(rank, root, slot));
  if (!slot.is_bytes || slot.bytes.size() != bytes.size()) {
    return absl::InternalError(absl::StrFormat(
        "rank %d expected %d broadcast bytes, the root sent %s", rank, bytes.size(),
        slot.is_bytes ? absl::StrCat(slot.bytes.size(), " bytes") : "a decision"));
  }
  std::copy(slot.bytes.begin(), slot.bytes.end(), bytes.begin());
  return absl::OkStatus();
}

absl::Status InMemoryBroadcast::Exchange(int rank, int root, Slot& io) {
  if (rank < 0 || rank >= size_ || root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d / root %d outside a group of %d", rank, root, size_));
  }
  spgate::MutexLock lock(&mu_);
  const uint64_t k = calls_[rank]++;
  if (rank == root) {
    if (size_ > 1) {
      io.root = root;
      io.remaining = size_ - 1;
      slots_[k] = io;
    }
    cv_.SignalAll();
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout_;
  auto it = slots_.find(k);
  while (it == slots_.end()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) {
      it = slots_.find(k);
      if (it != slots_.end()) break;
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d waited %s for broadcast #%d from root %d", rank,
          absl::FormatDuration(timeout_), k, root));
    }
    it = slots_.find(k);
  }
  if (it->second.root != root) {
    return absl::InternalError(absl::StrFormat(
        "broadcast #%d: rank %d expected root %d, the sender was rank %d", k, rank, root,
        it->second.root));
  }
  io = it->second;
  if (--it->second.remaining == 0) slots_.erase(it);
  return absl::OkStatus();
}

absl::Status InMemoryBroadcast::MaxReduce(int rank, TelemetryWire& wire, int root) {
  return MaxReduceVector(rank, std::span<double>(wire.v), root);
}

absl::Status InMemoryBroadcast::MaxReduceVector(int rank, std::span<double> values, int root) {
  if (rank < 0 || rank >= size_ || root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d / root %d outside a group of %d", rank, root, size_));
  }
  spgate::MutexLock lock(&mu_);
  const uint64_t k = reduce_calls_[rank]++;
  ReduceSlot& slot = reduce_slots_[k];
  if (slot.arrived == 0) {
    slot.acc.assign(values.begin(), values.end());
    slot.root = root;
  } else {
    if (slot.root != root) {
      return absl::InternalError(absl::StrFormat(
          "reduction #%d: rank %d reduces into rank %d, an earlier rank into rank %d", k, rank,
          root, slot.root));
    }
    if (slot.acc.size() != values.size()) {
      // A real collective would hang or fail here: the ranks disagree on the payload.
      return absl::InternalError(absl::StrFormat(
          "reduction #%d: rank %d reduces %d values, an earlier rank %d", k, rank,
          values.size(), slot.acc.size()));
    }
    for (size_t i = 0; i < values.size(); ++i) slot.acc[i] = std::max(slot.acc[i], values[i]);
  }
  ++slot.arrived;
  cv_.SignalAll();
  if (rank != root) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  while (reduce_slots_[k].arrived < size_) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && reduce_slots_[k].arrived < size_) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d waited %s for reduction #%d: %d of %d ranks arrived", rank,
          absl::FormatDuration(timeout_), k, reduce_slots_[k].arrived, size_));
    }
  }
  std::copy(reduce_slots_[k].acc.begin(), reduce_slots_[k].acc.end(), values.begin());
  reduce_slots_.erase(k);
  return absl::OkStatus();
}

}  // namespace spgate::client
