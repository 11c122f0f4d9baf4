// The NCCL backend: one NCCL communicator per group, bootstrapped over MPI (rank 0 of the
// group's MPI communicator creates the ncclUniqueId and broadcasts it), collectives on
// device buffers enqueued on the device's stream - the same stream the layer's kernels
// use, so no extra ordering is needed - and each call bracketed by CUDA events. The
// times are folded into stats() at Synchronize(), after the stream has drained.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device_memory.h"
#include "worker/runtime/mpi_communicator.h"
#include "common/status_macros.h"

namespace spgate::runtime {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", call, ": ", ncclGetErrorString(r)));
}
#define NCCL_RETURN_IF_ERROR(call) RETURN_IF_ERROR(NcclStatus((call), #call, __FILE__, __LINE__))

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(MPI_Comm comm, Device* device) {
    if (device->space() != MemorySpace::kCuda) {
      return absl::InvalidArgumentError("the NCCL backend needs a CUDA device");
    }
    int rank = 0, size = 1;
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
    ncclUniqueId id;
    if (rank == 0) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(rank, size, device));
    NCCL_RETURN_IF_ERROR(ncclCommInitRank(&c->comm_, size, id, rank));
    SPGATE_CUDA_RETURN_IF_ERROR(cudaMalloc(&c->staging_, kStagingBytes));
    return std::unique_ptr<Communicator>(std::move(c));
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    for (auto& [a, b] : events_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    if (staging_ != nullptr) cudaFree(staging_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace space() const override { return MemorySpace::kCuda; }
  std::string name() const override { return "nccl"; }

  absl::Status AllGather(const float* send, float* recv, int64_t count,
                         CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kAllGather, purpose, count * size_, [&] {
      return ncclAllGather(send, recv, count, ncclFloat, comm_, stream_);
    });
  }
  absl::Status ReduceScatter(const float* send, float* recv, int64_t count,
                             CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kReduceScatter, purpose, count * size_, [&] {
      return ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm_, stream_);
    });
  }
  absl::Status AllReduce(float* data, int64_t count, CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kAllReduce, purpose, count, [&] {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_);
    });
  }
  absl::Status BroadcastHost(void* data, size_t bytes, int root) override {
    if (bytes > kStagingBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("BroadcastHost: ", bytes, " bytes exceed the staging buffer"));
    }
    if (rank_ == root) {
      SPGATE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, stream_));
    }
    RETURN_IF_ERROR(Timed(CollectiveOp::kBroadcast, CollectivePurpose::kControl, 0, [&] {
      return ncclBroadcast(staging_, staging_, bytes, ncclInt8, root, comm_, stream_);
    }));
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, stream_));
    return Synchronize();
  }
  absl::Status AllReduceMaxHost(double* data, int count) override {
    const size_t bytes = count * sizeof(double);
    if (bytes > kStagingBytes) return absl::InvalidArgumentError("AllReduceMaxHost: too many");
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, stream_));
    RETURN_IF_ERROR(Timed(CollectiveOp::kAllReduce, CollectivePurpose::kControl, 0, [&] {
      return ncclAllReduce(staging_, staging_, count, ncclDouble, ncclMax, comm_, stream_);
    }));
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, stream_));
    return Synchronize();
  }

  absl::Status Synchronize() override {
    SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < pending_.size(); ++i) {
      float ms = 0;
      SPGATE_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
      stats_.Add(pending_[i].op, pending_[i].purpose, ms * 1e-3, pending_[i].bytes);
    }
    pending_.clear();
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kStagingBytes = 1 << 20;
  struct Pending {
    CollectiveOp op;
    CollectivePurpose purpose;
    uint64_t bytes;
  };

  NcclCommunicator(int rank, int size, Device* device)
      : rank_(rank), size_(size), stream_(device->stream()) {}

  template <typename F>
  absl::Status Timed(CollectiveOp op, CollectivePurpose purpose, int64_t floats, F&& f) {
    if (pending_.size() == events_.size()) {
      cudaEvent_t a, b;
      SPGATE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
      SPGATE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
      events_.emplace_back(a, b);
    }
    auto& [start, stop] = events_[pending_.size()];
    SPGATE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream_));
    NCCL_RETURN_IF_ERROR(f());
    SPGATE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream_));
    pending_.push_back({op, purpose, static_cast<uint64_t>(floats) * sizeof(float)});
    return absl::OkStatus();
  }

  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  void* staging_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;  // reused, one pair per pending
  std::vector<Pending> pending_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(MPI_Comm comm,
                                                                     Device* device) {
  return NcclCommunicator::Create(comm, device);
}
bool HaveNccl() { return true; }

}  // namespace spgate::runtime
