// cuBLAS GEMM wrappers with row-major semantics, the Linear layer's products,
// bias add and the deterministic bias-gradient column sum. cuBLAS is
// column-major; a row-major matrix X with leading dimension ld is, to cuBLAS,
// X^T with the same ld. So row-major C = op(A) op(B) is issued as column-major
// C^T = op(B)^T op(A)^T: operands swapped, m and n swapped, transposes kept.
// Every cuBLAS status becomes an absl::Status with file:line of the call.
#include <cublas_v2.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gemm.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cuda_common.cuh"
#include "kernels/internal/launch_plan.h"
#include "kernels/internal/linear_args.h"

namespace spgate::kernels {
namespace {

cublasOperation_t ToCublas(Trans t) { return t == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// y[r, c] += bias[c]
__global__ void BiasAddKernel(int64_t rows, int64_t cols, const float* __restrict__ bias,
                              float* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

// First stage of a column sum: partial[chunk][c] = sum of x[r, c] over the
// chunk's rows, one column per thread (coalesced across the warp).
__global__ void ColumnSumPartialKernel(int64_t rows, int64_t cols, int64_t chunk_rows,
                                       const float* __restrict__ x,
                                       float* __restrict__ partial) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += x[r * cols + c];
  partial[blockIdx.y * cols + c] = acc;
}

absl::Status GemmUnchecked(const GemmArgs& g, const GemmBatch* batch, cublasHandle_t blas,
                           cudaStream_t stream) {
  if (g.m == 0 || g.n == 0 || (batch != nullptr && batch->count == 0)) return absl::OkStatus();
  SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas, stream));
  // k == 0 is fine for cuBLAS: C = beta * C.
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  if (batch == nullptr) {
    SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(blas, ToCublas(g.trans_b), ToCublas(g.trans_a),
                                              n, m, k, &g.alpha, g.b, static_cast<int>(g.ldb),
                                              g.a, static_cast<int>(g.lda), &g.beta, g.c,
                                              static_cast<int>(g.ldc)));
  } else {
    SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSgemmStridedBatched(
        blas, ToCublas(g.trans_b), ToCublas(g.trans_a), n, m, k, &g.alpha, g.b,
        static_cast<int>(g.ldb), batch->stride_b, g.a, static_cast<int>(g.lda),
        batch->stride_a, &g.beta, g.c, static_cast<int>(g.ldc), batch->stride_c,
        static_cast<int>(batch->count)));
  }
  return absl::OkStatus();
}

absl::Status CheckHandle(const char* op, cublasHandle_t blas) {
  return internal::CheckNotNull(op, "cublas handle", blas);
}

}  // namespace

absl::StatusOr<CublasHandle> CublasHandle::Create(bool allow_tf32) {
  CublasHandle h;
  SPGATE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h.handle_));
  // Pointer mode host (alpha/beta on the host) is the default; keep it explicit.
  SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSetPointerMode(h.handle_, CUBLAS_POINTER_MODE_HOST));
  SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      h.handle_, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return h;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

absl::Status Gemm(const GemmArgs& args, cublasHandle_t blas, cudaStream_t stream) {
  constexpr char kOp[] = "Gemm";
  RETURN_IF_ERROR(CheckHandle(kOp, blas));
  RETURN_IF_ERROR(ValidateGemmArgs(kOp, args));
  return GemmUnchecked(args, nullptr, blas, stream);
}

absl::Status GemmStridedBatched(const GemmArgs& args, const GemmBatch& batch,
                                cublasHandle_t blas, cudaStream_t stream) {
  constexpr char kOp[] = "GemmStridedBatched";
  RETURN_IF_ERROR(CheckHandle(kOp, blas));
  RETURN_IF_ERROR(ValidateGemmArgs(kOp, args));
  RETURN_IF_ERROR(ValidateGemmBatch(kOp, batch));
  return GemmUnchecked(args, &batch, blas, stream);
}

absl::Status BiasAdd(const BiasAddArgs& a, cudaStream_t stream) {
  constexpr char kOp[] = "BiasAdd";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", a.cols));
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "bias", a.bias));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "y", a.y));
  constexpr int kThreads = 256;
  const int grid = static_cast<int>(
      std::min<int64_t>((a.rows * a.cols + kThreads - 1) / kThreads, 65536));
  BiasAddKernel<<<grid, kThreads, 0, stream>>>(a.rows, a.cols, a.bias, a.y);
  SPGATE_CUDA_CHECK_LAUNCH(BiasAddKernel);
  return absl::OkStatus();
}

absl::Status LinearFwd(const LinearFwdArgs& a, cublasHandle_t blas, cudaStream_t stream) {
  constexpr char kOp[] = "LinearFwd";
  RETURN_IF_ERROR(CheckHandle(kOp, blas));
  ASSIGN_OR_RETURN(const std::optional<GemmArgs> g, internal::LinearFwdGemm(kOp, a));
  if (!g.has_value()) return absl::OkStatus();
  RETURN_IF_ERROR(GemmUnchecked(*g, nullptr, blas, stream));
  if (a.bias == nullptr) return absl::OkStatus();
  return BiasAdd(BiasAddArgs{a.shape.rows, a.shape.out_features, a.bias, a.y}, stream);
}

absl::Status LinearBwdData(const LinearBwdDataArgs& a, cublasHandle_t blas,
                           cudaStream_t stream) {
  constexpr char kOp[] = "LinearBwdData";
  RETURN_IF_ERROR(CheckHandle(kOp, blas));
  ASSIGN_OR_RETURN(const std::optional<GemmArgs> g,
                           internal::LinearBwdDataGemm(kOp, a));
  if (!g.has_value()) return absl::OkStatus();
  return GemmUnchecked(*g, nullptr, blas, stream);
}

absl::Status LinearBwdWeight(const LinearBwdWeightArgs& a, void* workspace,
                             size_t workspace_bytes, cublasHandle_t blas,
                             cudaStream_t stream) {
  constexpr char kOp[] = "LinearBwdWeight";
  const LinearShape& s = a.shape;
  RETURN_IF_ERROR(CheckHandle(kOp, blas));
  ASSIGN_OR_RETURN(const GemmArgs g, internal::LinearBwdWeightGemm(kOp, a));
  const size_t need = a.dbias != nullptr ? LinearBwdWeightWorkspaceBytes(s) : 0;
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return internal::Invalid(kOp, absl::StrCat("workspace has ", workspace_bytes,
                                               " bytes, LinearBwdWeightWorkspaceBytes = ",
                                               need));
  }
  RETURN_IF_ERROR(GemmUnchecked(g, nullptr, blas, stream));
  if (a.dbias == nullptr) return absl::OkStatus();
  return BiasGrad({s.rows, s.out_features, a.dy, a.dbias, a.accumulate}, workspace,
                  workspace_bytes, stream);
}

absl::Status BiasGrad(const BiasGradArgs& a, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  constexpr char kOp[] = "BiasGrad";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", a.cols));
  RETURN_IF_ERROR(internal::CheckFitsInt32(kOp, "cols", a.cols));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "dbias", a.dbias));
  if (a.rows > 0) RETURN_IF_ERROR(internal::CheckNotNull(kOp, "dy", a.dy));
  const size_t need = BiasGradWorkspaceBytes(a.rows, a.cols);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return internal::Invalid(kOp, absl::StrCat("workspace has ", workspace_bytes,
                                               " bytes, BiasGradWorkspaceBytes = ", need));
  }
  float* partial = static_cast<float*>(workspace);
  const int64_t chunks = internal::ColumnReduceChunks(a.rows);
  if (a.rows > 0) {
    constexpr int kThreads = 256;
    const int64_t chunk_rows = internal::ColumnChunkRows(a.rows);
    const dim3 grid(internal::CeilDiv(a.cols, kThreads), static_cast<unsigned>(chunks));
    ColumnSumPartialKernel<<<grid, kThreads, 0, stream>>>(a.rows, a.cols, chunk_rows, a.dy,
                                                          partial);
    SPGATE_CUDA_CHECK_LAUNCH(ColumnSumPartialKernel);
  }
  return internal::FinalizeColumnPartials(partial, static_cast<int>(chunks),
                                          static_cast<int>(a.cols), 1, a.dbias, nullptr,
                                          a.accumulate, stream);
}

}  // namespace spgate::kernels
