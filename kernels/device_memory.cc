// Device memory helper: RAII allocation and CUDA error -> Status mapping.
// Every CUDA call's error becomes a Status naming file:line of that call; the
// destructor is the only place an error cannot be returned, and there a failed
// cudaFree (e.g. a device already lost) is deliberately ignored.
#include "kernels/device_memory.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace spgate::kernels {

absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file,
                               int line) {
  // The failed call also left its error in the runtime's per-thread last-error
  // slot, which every launcher reads after its launch: consume it here, so that
  // a caller which handles this Status (an allocation it retries smaller) does
  // not see the old error reported against its next kernel. A sticky error
  // (a lost context) stays whatever this does.
  cudaGetLastError();
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ",
                                 cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

int CudaDeviceCount(std::string* reason) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (reason != nullptr) {
      *reason = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), ": ",
                             cudaGetErrorString(err));
    }
    cudaGetLastError();  // clear the sticky-less error so later calls start clean
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "cudaGetDeviceCount reports 0 devices";
  return count;
}

absl::StatusOr<DeviceAllocation> DeviceAllocation::Allocate(size_t bytes) {
  DeviceAllocation a;
  if (bytes == 0) return a;
  void* p = nullptr;
  SPGATE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  a.ptr_ = p;
  a.bytes_ = bytes;
  return a;
}

DeviceAllocation::~DeviceAllocation() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status DeviceAllocation::CopyFromHost(const void* host, size_t bytes,
                                            cudaStream_t stream) {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceAllocation::CopyFromHost: ", bytes, " bytes into ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  SPGATE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, stream));
  SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status DeviceAllocation::CopyToHost(void* host, size_t bytes,
                                          cudaStream_t stream) const {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceAllocation::CopyToHost: ", bytes, " bytes from ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  SPGATE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host, ptr_, bytes, cudaMemcpyDeviceToHost, stream));
  SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status DeviceAllocation::SetZero(cudaStream_t stream) {
  if (bytes_ == 0) return absl::OkStatus();
  SPGATE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr_, 0, bytes_, stream));
  return absl::OkStatus();
}

}  // namespace spgate::kernels
