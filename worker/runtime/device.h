// Device: where the worker's tensors live and its kernels run. CpuDevice runs the
// kernels' CPU paths (kernels/*_cpu.cc, OpenBLAS) on host memory; the CUDA device
// (CreateCudaDevice) runs the CUDA launchers on one stream with one cuBLAS handle. The
// transformer layer is written once against this interface, so the CPU (MPI) and GPU
// (NCCL) workers run the same code path. The invariant that matters: every operation is
// ordered on the device's one stream (the CPU runs them in call order), so a
// communicator that enqueues on the same stream (NCCL) needs no extra synchronisation.
//
// Counts are in floats; all pointers are in the device's memory space unless named host.
//
// Usage:
//   auto cpu = spgate::runtime::CreateCpuDevice();
//   RETURN_IF_ERROR(cpu->LinearFwd({.shape = {rows, in, out}, .x = x, .weight = w, .y = y}));
//   ASSIGN_OR_RETURN(auto gpu, spgate::runtime::CreateCudaDevice(/*ordinal=*/0));
#ifndef SPGATE_WORKER_RUNTIME_DEVICE_H_
#define SPGATE_WORKER_RUNTIME_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"

namespace spgate::runtime {

enum class MemorySpace : uint8_t { kHost, kCuda };

// Scratch the kernels need beyond their inputs and outputs, in bytes, for a memory
// space: the GPU's deterministic reductions need workspaces the CPU path does not.
// Pure functions of the shape, so memory prediction needs no device.
size_t LayerNormBwdScratchBytes(MemorySpace space, int64_t rows, int64_t hidden);
size_t GeluBwdScratchBytes(MemorySpace space, int64_t rows, int64_t cols);
size_t LinearBwdWeightScratchBytes(MemorySpace space, const kernels::LinearShape& shape);

class Device {
 public:
  virtual ~Device() = default;

  virtual MemorySpace space() const = 0;
  virtual std::string name() const = 0;
  // The memory this device has in all: a CUDA device's total memory, the host's physical
  // memory for the CPU device. The worker's default memory budget comes from it.
  virtual absl::StatusOr<uint64_t> TotalMemoryBytes() const = 0;
  // What kind of hardware this is, for the learned tables' relaunch key
  // (client::GpuHardwareId for a CUDA device); empty: the client detects the host's CPU.
  virtual std::string hardware_id() const { return ""; }
  // The CUDA stream every operation is enqueued on (null on the CPU).
  virtual cudaStream_t stream() const { return nullptr; }

  // Raw memory; MemoryArena is the accounting (and caching) front end.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;

  // Upload and Download return when the copy is complete.
  virtual absl::Status Upload(float* dst, const float* host_src, int64_t n) = 0;
  virtual absl::Status Download(float* host_dst, const float* src, int64_t n) = 0;
  virtual absl::Status Copy(float* dst, const float* src, int64_t n) = 0;
  virtual absl::Status Fill(float* dst, float value, int64_t n) = 0;
  // y += alpha * x.
  virtual absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) = 0;
  // x *= alpha.
  virtual absl::Status Scale(float alpha, float* x, int64_t n) = 0;
  // Waits for everything enqueued so far.
  virtual absl::Status Synchronize() = 0;

  virtual absl::Status LayerNormFwd(const kernels::LayerNormFwdArgs<float>& args) = 0;
  virtual absl::Status LayerNormBwd(const kernels::LayerNormBwdArgs<float>& args,
                                    void* scratch, size_t scratch_bytes) = 0;
  virtual absl::Status GeluFwd(const kernels::GeluFwdArgs<float>& args) = 0;
  virtual absl::Status GeluBwd(const kernels::GeluBwdArgs<float>& args, void* scratch,
                               size_t scratch_bytes) = 0;
  virtual absl::Status Gemm(const kernels::GemmArgs& args) = 0;
  virtual absl::Status LinearFwd(const kernels::LinearFwdArgs& args) = 0;
  virtual absl::Status LinearBwdData(const kernels::LinearBwdDataArgs& args) = 0;
  virtual absl::Status LinearBwdWeight(const kernels::LinearBwdWeightArgs& args,
                                       void* scratch, size_t scratch_bytes) = 0;
  virtual absl::Status BiasAdd(const kernels::BiasAddArgs& args) = 0;
  virtual absl::Status AttentionFwd(const kernels::AttentionFwdArgs& args) = 0;
  virtual absl::Status AttentionBwd(const kernels::AttentionBwdArgs& args) = 0;
};

// The CPU path; OpenBLAS is limited to `blas_threads` threads (1: one rank per core).
std::unique_ptr<Device> CreateCpuDevice(int blas_threads = 1);

// The CUDA path on device `ordinal` (cudaSetDevice), with its own stream and cuBLAS
// handle. FAILED_PRECONDITION without a device; UNIMPLEMENTED in a build without CUDA.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);
// Devices visible to this process (0 without CUDA, a driver or a device).
int CudaDevices();

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_DEVICE_H_
