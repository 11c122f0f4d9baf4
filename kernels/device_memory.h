// Device memory and CUDA error handling for spgate::kernels_cuda users: a
// move-only RAII buffer of device memory, and the macros that turn a CUDA
// runtime error into an absl::Status carrying file:line of the failing call.
// The invariant that matters: library code never exits or aborts on a CUDA
// error; every failure is returned up the stack as a Status, and a buffer
// frees its memory exactly once, whatever path leaves the scope.
//
//   ASSIGN_OR_RETURN(auto x, DeviceBuffer<float>::FromHost(host_x, stream));
//   ASSIGN_OR_RETURN(auto y, DeviceBuffer<float>::Allocate(host_x.size()));
//   SPGATE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(y.data(), 0, y.bytes(), stream));
//   RETURN_IF_ERROR(y.CopyToHost(absl::MakeSpan(host_y), stream));  // waits
//
// Unlike the kernel headers, this one includes the CUDA runtime API header.
#ifndef SPGATE_KERNELS_DEVICE_MEMORY_H_
#define SPGATE_KERNELS_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace spgate::kernels {

// Maps a CUDA runtime error to a Status: out of memory -> RESOURCE_EXHAUSTED,
// no device / driver -> FAILED_PRECONDITION, bad argument -> INVALID_ARGUMENT,
// anything else -> INTERNAL. The message is "file:line: expr: cudaErrorX: text".
// It clears the runtime's last-error slot, so the next launch check starts clean.
absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file,
                               int line);

#define SPGATE_CUDA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                            \
    const cudaError_t spgate_cuda_error_ = (expr);                                \
    if (spgate_cuda_error_ != cudaSuccess) {                                      \
      return ::spgate::kernels::CudaErrorToStatus(spgate_cuda_error_, #expr,      \
                                                  __FILE__, __LINE__);            \
    }                                                                             \
  } while (0)

// Number of CUDA devices visible to this process; 0 (not an error) when there is
// no device or no driver, so tests can skip with the reason from `reason`.
int CudaDeviceCount(std::string* reason = nullptr);

// Untyped device allocation; DeviceBuffer<T> is the typed face of it.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  static absl::StatusOr<DeviceAllocation> Allocate(size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(DeviceAllocation&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // Enqueue on `stream`, then wait for the stream: the host buffer may be reused
  // as soon as these return.
  absl::Status CopyFromHost(const void* host, size_t bytes, cudaStream_t stream);
  absl::Status CopyToHost(void* host, size_t bytes, cudaStream_t stream) const;
  // Enqueued only (asynchronous).
  absl::Status SetZero(cudaStream_t stream);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : alloc_(std::move(other.alloc_)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    alloc_ = std::move(other.alloc_);
    count_ = std::exchange(other.count_, 0);
    return *this;
  }

  static absl::StatusOr<DeviceBuffer<T>> Allocate(size_t count) {
    ASSIGN_OR_RETURN(DeviceAllocation a, DeviceAllocation::Allocate(count * sizeof(T)));
    return DeviceBuffer<T>(std::move(a), count);
  }

  static absl::StatusOr<DeviceBuffer<T>> FromHost(absl::Span<const T> host,
                                                  cudaStream_t stream = nullptr) {
    ASSIGN_OR_RETURN(DeviceBuffer<T> b, Allocate(host.size()));
    RETURN_IF_ERROR(b.CopyFromHost(host, stream));
    return b;
  }

  T* data() const { return static_cast<T*>(alloc_.data()); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  absl::Status CopyFromHost(absl::Span<const T> host, cudaStream_t stream = nullptr) {
    if (host.size() != count_) return SizeMismatch(host.size());
    return alloc_.CopyFromHost(host.data(), bytes(), stream);
  }
  absl::Status CopyToHost(absl::Span<T> host, cudaStream_t stream = nullptr) const {
    if (host.size() != count_) return SizeMismatch(host.size());
    return alloc_.CopyToHost(host.data(), bytes(), stream);
  }
  absl::StatusOr<std::vector<T>> ToHost(cudaStream_t stream = nullptr) const {
    std::vector<T> host(count_);
    RETURN_IF_ERROR(CopyToHost(absl::MakeSpan(host), stream));
    return host;
  }
  absl::Status SetZero(cudaStream_t stream = nullptr) { return alloc_.SetZero(stream); }

 private:
  DeviceBuffer(DeviceAllocation alloc, size_t count)
      : alloc_(std::move(alloc)), count_(count) {}
  absl::Status SizeMismatch(size_t host_count) const {
    return absl::InvalidArgumentError(
        "DeviceBuffer: host span has " + std::to_string(host_count) +
        " elements, buffer has " + std::to_string(count_));
  }

  DeviceAllocation alloc_;
  size_t count_ = 0;
};

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_DEVICE_MEMORY_H_
