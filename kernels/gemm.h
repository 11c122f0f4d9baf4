// GEMM wrappers with the row-major layouts a transformer layer needs, over
// OpenBLAS on the CPU (`…Cpu`) and cuBLAS on the GPU (no suffix,
// spgate::kernels_cuda), with double-precision references (`…Ref`) for tests.
// Everything is row-major, as the activations are: a matrix X[r, c] with leading
// dimension ld has element (i, j) at X[i * ld + j]. The invariant that matters:
// Linear layers keep Megatron's weight layout W[out_features, in_features], so
// a column-parallel layer's rank holds a block of W's rows and a row-parallel
// layer's rank a block of its columns, and the three products are
//   forward       Y[rows, out]  = X[rows, in] W^T (+ b)
//   backward data dX[rows, in]  = dY W              (accumulate: dX +=)
//   backward wt.  dW[out, in]  (+)= dY^T X,  db[out] (+)= column sums of dY.
// fp32 storage and accumulation on both paths (cuBLAS may use TF32 only when
// the handle is created with allow_tf32).
//
// Usage:
//   LinearFwdArgs f{.shape = {tokens, hidden, 3 * hidden_local}, .x = ln_out,
//                   .weight = w_qkv, .bias = b_qkv, .y = qkv};
//   RETURN_IF_ERROR(LinearFwdCpu(f));
//   ASSIGN_OR_RETURN(CublasHandle blas, CublasHandle::Create());   // GPU
//   RETURN_IF_ERROR(LinearFwd(f_device, blas.get(), stream));
//   GemmArgs g{.trans_b = Trans::kYes, .m = m, .n = n, .k = k,
//              .a = a, .lda = k, .b = b, .ldb = k, .c = c, .ldc = n};
//   RETURN_IF_ERROR(GemmCpu(g));                                    // C = A B^T
#ifndef SPGATE_KERNELS_GEMM_H_
#define SPGATE_KERNELS_GEMM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/common.h"

namespace spgate::kernels {

enum class Trans { kNo, kYes };

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major.
// op(A) = A ([m, k], lda >= k) or A^T (A is [k, m], lda >= m); likewise B.
// beta == 0 overwrites C (NaNs in C do not propagate).
struct GemmArgs {
  Trans trans_a = Trans::kNo;
  Trans trans_b = Trans::kNo;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
};

// `count` GEMMs whose operands are `stride_*` elements apart (stride 0 reuses
// the operand); used by attention for all local heads at once.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

struct LinearShape {
  int64_t rows = 0;          // tokens
  int64_t in_features = 0;   // > 0
  int64_t out_features = 0;  // > 0
};

struct LinearFwdArgs {
  LinearShape shape;
  const float* x = nullptr;       // [rows, in]
  const float* weight = nullptr;  // [out, in]
  const float* bias = nullptr;    // [out], or null
  float* y = nullptr;             // [rows, out]
};

struct LinearBwdDataArgs {
  LinearShape shape;
  const float* dy = nullptr;      // [rows, out]
  const float* weight = nullptr;  // [out, in]
  float* dx = nullptr;            // [rows, in]
  bool accumulate = false;        // dx += (e.g. two branches reading one input)
};

struct LinearBwdWeightArgs {
  LinearShape shape;
  const float* dy = nullptr;  // [rows, out]
  const float* x = nullptr;   // [rows, in], forward's input
  float* dweight = nullptr;   // [out, in]
  float* dbias = nullptr;     // [out], or null
  bool accumulate = false;    // dweight/dbias += (gradient accumulation)
};

// y[r, c] += bias[c] for a [rows, cols] row-major y (the row-parallel layer's
// bias, added after its reduce-scatter / all-reduce).
struct BiasAddArgs {
  int64_t rows = 0, cols = 0;
  const float* bias = nullptr;
  float* y = nullptr;
};

// dbias[c] (+)= sum over rows of dy[r, c]: the gradient of a bias added with
// BiasAdd (under SP, a row-parallel layer's bias acts on the token shard, so
// this sum is the rank's partial gradient).
struct BiasGradArgs {
  int64_t rows = 0, cols = 0;
  const float* dy = nullptr;
  float* dbias = nullptr;
  bool accumulate = false;
};

// ---------------------------------------------------------------- reference
struct GemmRefArgs {
  Trans trans_a = Trans::kNo;
  Trans trans_b = Trans::kNo;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  absl::Span<const double> a;
  int64_t lda = 0;
  absl::Span<const double> b;
  int64_t ldb = 0;
  double beta = 0.0;
  absl::Span<const double> c;  // the initial C (ignored when beta == 0; may be empty then)
  int64_t ldc = 0;
};
absl::StatusOr<std::vector<double>> GemmRef(const GemmRefArgs& args);  // the new C

absl::StatusOr<std::vector<double>> LinearFwdRef(const LinearShape& shape,
                                                 absl::Span<const double> x,
                                                 absl::Span<const double> weight,
                                                 absl::Span<const double> bias);
struct LinearBwdRefResult {
  std::vector<double> dx, dweight, dbias;
};
absl::StatusOr<LinearBwdRefResult> LinearBwdRef(const LinearShape& shape,
                                                absl::Span<const double> dy,
                                                absl::Span<const double> x,
                                                absl::Span<const double> weight);

// ---------------------------------------------------------------- CPU path
// OpenBLAS sgemm (its own threads: OPENBLAS_NUM_THREADS, or SetCpuBlasThreads).
absl::Status GemmCpu(const GemmArgs& args);
absl::Status GemmStridedBatchedCpu(const GemmArgs& args, const GemmBatch& batch);
absl::Status LinearFwdCpu(const LinearFwdArgs& args);
absl::Status LinearBwdDataCpu(const LinearBwdDataArgs& args);
absl::Status LinearBwdWeightCpu(const LinearBwdWeightArgs& args);
absl::Status BiasAddCpu(const BiasAddArgs& args);
absl::Status BiasGradCpu(const BiasGradArgs& args);
// Threads OpenBLAS may use in this process (1 for one MPI rank per core).
void SetCpuBlasThreads(int threads);
int CpuBlasThreads();

// ---------------------------------------------------------------- CUDA
// Owns a cuBLAS handle (one per thread that issues GEMMs). The launchers bind it
// to their stream before each call.
class CublasHandle {
 public:
  CublasHandle() = default;
  // allow_tf32: let cuBLAS use TF32 tensor cores for fp32 GEMMs (~10-bit
  // mantissa products; several times faster on A100/H100).
  static absl::StatusOr<CublasHandle> Create(bool allow_tf32 = false);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

absl::Status Gemm(const GemmArgs& args, cublasHandle_t blas, cudaStream_t stream);
absl::Status GemmStridedBatched(const GemmArgs& args, const GemmBatch& batch,
                                cublasHandle_t blas, cudaStream_t stream);
absl::Status LinearFwd(const LinearFwdArgs& args, cublasHandle_t blas, cudaStream_t stream);
absl::Status LinearBwdData(const LinearBwdDataArgs& args, cublasHandle_t blas,
                           cudaStream_t stream);
// workspace: LinearBwdWeightWorkspaceBytes(shape) device bytes (for dbias; may
// be null when dbias is null).
absl::Status LinearBwdWeight(const LinearBwdWeightArgs& args, void* workspace,
                             size_t workspace_bytes, cublasHandle_t blas,
                             cudaStream_t stream);
absl::Status BiasAdd(const BiasAddArgs& args, cudaStream_t stream);
// workspace: BiasGradWorkspaceBytes(rows, cols) device bytes.
absl::Status BiasGrad(const BiasGradArgs& args, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

size_t LinearBwdWeightWorkspaceBytes(const LinearShape& shape);
size_t BiasGradWorkspaceBytes(int64_t rows, int64_t cols);

// Shared validation (CPU path and launchers).
absl::Status ValidateGemmArgs(const char* op, const GemmArgs& a);
absl::Status ValidateGemmBatch(const char* op, const GemmBatch& b);
absl::Status ValidateLinearShape(const char* op, const LinearShape& s);

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_GEMM_H_
