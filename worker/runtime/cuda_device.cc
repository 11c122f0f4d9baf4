// The CUDA device: kernels_cuda's launchers, cuBLAS for Axpy/Scale, one stream and one
// cuBLAS handle per device object. Compiled only when the build has CUDA.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cublas_status.h"
#include "kernels/device_memory.h"
#include "worker/client/identity.h"
#include "worker/runtime/device.h"
#include "common/status_macros.h"

namespace spgate::runtime {
namespace {

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(int ordinal) {
    SPGATE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    std::unique_ptr<CudaDevice> d(new CudaDevice(ordinal));
    SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking));
    ASSIGN_OR_RETURN(d->blas_, kernels::CublasHandle::Create(/*allow_tf32=*/false));
    SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(d->blas_.get(), d->stream_));
    return std::unique_ptr<Device>(std::move(d));
  }
  ~CudaDevice() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  MemorySpace space() const override { return MemorySpace::kCuda; }
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  absl::StatusOr<uint64_t> TotalMemoryBytes() const override {
    size_t free = 0, total = 0;
    SPGATE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<uint64_t>(total);
  }
  std::string hardware_id() const override {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, ordinal_) != cudaSuccess) return "";  // the client's CPU id
    return client::GpuHardwareId(p.name, p.major, p.minor, p.totalGlobalMem);
  }
  cudaStream_t stream() const override { return stream_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    SPGATE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes == 0 ? 256 : bytes));
    return p;
  }
  void Free(void* ptr, size_t) override {
    cudaStreamSynchronize(stream_);  // blocks may still be in use by enqueued work
    cudaFree(ptr);
  }

  absl::Status Upload(float* dst, const float* src, int64_t n) override {
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::Status Download(float* dst, const float* src, int64_t n) override {
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::Status Copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0 || dst == src) return absl::OkStatus();
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  absl::Status Fill(float* dst, float value, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    if (value == 0.0f) {
      SPGATE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, n * sizeof(float), stream_));
      return absl::OkStatus();
    }
    // Rare (the column-sum vector of ones): stage through the host.
    std::vector<float> host(n, value);
    return Upload(dst, host.data(), n);
  }
  absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    SPGATE_CUBLAS_RETURN_IF_ERROR(
        cublasSaxpy(blas_.get(), static_cast<int>(n), &alpha, x, 1, y, 1));
    return absl::OkStatus();
  }
  absl::Status Scale(float alpha, float* x, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSscal(blas_.get(), static_cast<int>(n), &alpha, x, 1));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    SPGATE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status LayerNormFwd(const kernels::LayerNormFwdArgs<float>& a) override {
    return kernels::LayerNormFwd(a, stream_);
  }
  absl::Status LayerNormBwd(const kernels::LayerNormBwdArgs<float>& a, void* ws,
                            size_t bytes) override {
    return kernels::LayerNormBwd(a, ws, bytes, stream_);
  }
  absl::Status GeluFwd(const kernels::GeluFwdArgs<float>& a) override {
    return kernels::GeluFwd(a, stream_);
  }
  absl::Status GeluBwd(const kernels::GeluBwdArgs<float>& a, void* ws, size_t bytes) override {
    return kernels::GeluBwd(a, ws, bytes, stream_);
  }
  absl::Status Gemm(const kernels::GemmArgs& a) override {
    return kernels::Gemm(a, blas_.get(), stream_);
  }
  absl::Status LinearFwd(const kernels::LinearFwdArgs& a) override {
    return kernels::LinearFwd(a, blas_.get(), stream_);
  }
  absl::Status LinearBwdData(const kernels::LinearBwdDataArgs& a) override {
    return kernels::LinearBwdData(a, blas_.get(), stream_);
  }
  absl::Status LinearBwdWeight(const kernels::LinearBwdWeightArgs& a, void* ws,
                               size_t bytes) override {
    return kernels::LinearBwdWeight(a, ws, bytes, blas_.get(), stream_);
  }
  absl::Status BiasAdd(const kernels::BiasAddArgs& a) override {
    return kernels::BiasAdd(a, stream_);
  }
  absl::Status AttentionFwd(const kernels::AttentionFwdArgs& a) override {
    return kernels::AttentionFwd(a, blas_.get(), stream_);
  }
  absl::Status AttentionBwd(const kernels::AttentionBwdArgs& a) override {
    return kernels::AttentionBwd(a, blas_.get(), stream_);
  }

 private:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  int ordinal_;
  cudaStream_t stream_ = nullptr;
  kernels::CublasHandle blas_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  std::string reason;
  const int n = kernels::CudaDeviceCount(&reason);
  if (n == 0) return absl::FailedPreconditionError("no CUDA device: " + reason);
  if (ordinal < 0 || ordinal >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", n, " visible)"));
  }
  return CudaDevice::Create(ordinal);
}

int CudaDevices() { return kernels::CudaDeviceCount(); }

}  // namespace spgate::runtime
