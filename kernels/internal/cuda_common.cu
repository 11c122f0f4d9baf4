// Shared CUDA pieces: cuBLAS status -> absl::Status, and the second (ordered)
// stage of the two-stage column reductions used for dgamma, dbeta and dbias.
// Adding the chunk partials in ascending chunk order is what makes those
// gradients bitwise reproducible, unlike float atomics.
#include "kernels/internal/cuda_common.cuh"

namespace spgate::kernels {

// Declared in kernels/cublas_status.h, the header kernels_cuda's users share.
absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr,
                                 const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ",
                                 cublasGetStatusName(status), ": ",
                                 cublasGetStatusString(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace spgate::kernels

namespace spgate::kernels::internal {
namespace {

__global__ void ColumnPartialsFinalizeKernel(const float* __restrict__ partial,
                                             int chunks, int cols,
                                             float* __restrict__ out0,
                                             float* __restrict__ out1, bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int plane = blockIdx.y;
  const float* p = partial + static_cast<int64_t>(plane) * chunks * cols + c;
  float sum = 0.0f;
  for (int k = 0; k < chunks; ++k) sum += p[static_cast<int64_t>(k) * cols];
  float* out = plane == 0 ? out0 : out1;
  out[c] = accumulate ? out[c] + sum : sum;
}

}  // namespace

absl::Status FinalizeColumnPartials(const float* partial, int chunks, int cols,
                                    int planes, float* out0, float* out1,
                                    bool accumulate, cudaStream_t stream) {
  if (cols == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const dim3 grid(CeilDiv(cols, kThreads), planes);
  ColumnPartialsFinalizeKernel<<<grid, kThreads, 0, stream>>>(partial, chunks, cols, out0,
                                                             out1, accumulate);
  SPGATE_CUDA_CHECK_LAUNCH(ColumnPartialsFinalizeKernel);
  return absl::OkStatus();
}

}  // namespace spgate::kernels::internal
