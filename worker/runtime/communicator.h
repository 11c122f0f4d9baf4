// Communicator: the collectives a tensor-parallel group needs, behind one interface so
// the transformer layer is written once for MPI on host buffers (mpi_communicator.h)
// and NCCL on device buffers (nccl_communicator.h). Sequence-parallel collectives work
// along the sequence dimension of row-major [tokens, hidden] activations, so a rank's
// shard is a contiguous block of rows and all-gather / reduce-scatter are plain
// block collectives. Every call is timed (launch to completion, i.e. including the wait
// for the slowest peer, docs/design.md §2) and filed under its operation and purpose,
// which is how the worker measures rs_wait, all-gather time and norm stalls.
//
// Collectives are blocking from the caller's point of view on host backends; on a
// device backend they are enqueued on the device's stream and their times land in
// stats() at the next Synchronize(). All ranks of the communicator must make the same
// calls in the same order (docs/design.md §4).
//
// Usage:
//   comm->AllGather(shard, full, shard_rows * hidden, CollectivePurpose::kLayer);
//   comm->ReduceScatter(partial, shard, shard_rows * hidden, CollectivePurpose::kLayer);
//   RETURN_IF_ERROR(comm->Synchronize());
//   double rs = comm->stats().Seconds(CollectiveOp::kReduceScatter);
#ifndef SPGATE_WORKER_RUNTIME_COMMUNICATOR_H_
#define SPGATE_WORKER_RUNTIME_COMMUNICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "worker/runtime/device.h"

namespace spgate::runtime {

enum class CollectiveOp : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast };
inline constexpr int kNumCollectiveOps = 4;
std::string_view CollectiveOpName(CollectiveOp op);

// Why a collective ran: the telemetry splits time by this.
enum class CollectivePurpose : uint8_t {
  kLayer,         // the SP / TP-only layer's own collectives, on the hot path
  kNormBoundary,  // exist only because LayerNorm crossed the shard boundary (gather)
  kGradSync,      // gradient reductions at the end of an accumulation window
  kControl,       // decisions, batch lengths, statistics
  kStageBoundary,  // a TP-only pipeline stage gathering its sequence-sharded input
};
inline constexpr int kNumCollectivePurposes = 5;

struct CollectiveStats {
  std::array<std::array<double, kNumCollectivePurposes>, kNumCollectiveOps> seconds{};
  std::array<std::array<int64_t, kNumCollectivePurposes>, kNumCollectiveOps> calls{};
  std::array<std::array<uint64_t, kNumCollectivePurposes>, kNumCollectiveOps> bytes{};

  double Seconds(CollectiveOp op, CollectivePurpose purpose) const {
    return seconds[static_cast<int>(op)][static_cast<int>(purpose)];
  }
  double Seconds(CollectiveOp op) const;             // all purposes
  double Seconds(CollectivePurpose purpose) const;   // all operations
  int64_t Calls(CollectiveOp op, CollectivePurpose purpose) const {
    return calls[static_cast<int>(op)][static_cast<int>(purpose)];
  }
  void Add(CollectiveOp op, CollectivePurpose purpose, double s, uint64_t b);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the float buffers of the collectives live.
  virtual MemorySpace space() const = 0;
  virtual std::string name() const = 0;

  // recv[size * count] = the ranks' send[count] blocks in rank order. In place when
  // send == recv + rank * count.
  virtual absl::Status AllGather(const float* send, float* recv, int64_t count,
                                 CollectivePurpose purpose) = 0;
  // recv[count] = sum over ranks of their send[rank * count .. (rank + 1) * count).
  virtual absl::Status ReduceScatter(const float* send, float* recv, int64_t count,
                                     CollectivePurpose purpose) = 0;
  // data[count] = sum over ranks, in place.
  virtual absl::Status AllReduce(float* data, int64_t count, CollectivePurpose purpose) = 0;
  // Control messages in host memory (decisions, batch lengths): `bytes` from `root` to
  // every rank; on return every rank holds the root's bytes.
  virtual absl::Status BroadcastHost(void* data, size_t bytes, int root) = 0;
  // data[count] = element-wise max over ranks, host memory, in place.
  virtual absl::Status AllReduceMaxHost(double* data, int count) = 0;

  // Waits for every collective issued so far; afterwards stats() includes their times.
  virtual absl::Status Synchronize() = 0;

  const CollectiveStats& stats() const { return stats_; }
  void ResetStats() { stats_ = CollectiveStats{}; }

 protected:
  CollectiveStats stats_;
};

// A group of one (tp = 1 or dp = 1): collectives are copies on `device`.
std::unique_ptr<Communicator> CreateLocalCommunicator(Device* device);

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_COMMUNICATOR_H_
