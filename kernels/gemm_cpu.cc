// CPU GEMM wrappers over OpenBLAS's row-major cblas_sgemm, the Linear layer's
// three products, and the validation shared with the cuBLAS launchers. All
// shape and leading-dimension checks happen here, before BLAS sees the call:
// OpenBLAS reports bad arguments through xerbla (a message on stderr, nothing
// returned), so an unchecked call could neither fail cleanly nor be diagnosed.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gemm.h"
#include "kernels/internal/check.h"
#include "kernels/internal/launch_plan.h"
#include "kernels/internal/linear_args.h"

namespace spgate::kernels {
namespace {

CBLAS_TRANSPOSE ToCblas(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }

absl::Status CheckLd(const char* op, const char* field, int64_t ld, int64_t min_cols) {
  if (ld >= std::max<int64_t>(1, min_cols)) return absl::OkStatus();
  return internal::Invalid(op, absl::StrCat(field, " = ", ld, " is less than the ",
                                            min_cols, " columns of the row-major operand"));
}

// C = beta * C for a [m, n] block (the k == 0 case; BLAS quick-return rules
// differ between implementations, so it is done here).
void ScaleC(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* row = g.c + i * g.ldc;
    if (g.beta == 0.0f) {
      std::memset(row, 0, g.n * sizeof(float));
    } else {
      for (int64_t j = 0; j < g.n; ++j) row[j] *= g.beta;
    }
  }
}

void GemmUnchecked(const GemmArgs& g, const float* a, const float* b, float* c) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    GemmArgs scaled = g;
    scaled.c = c;
    ScaleC(scaled);
    return;
  }
  cblas_sgemm(CblasRowMajor, ToCblas(g.trans_a), ToCblas(g.trans_b), static_cast<int>(g.m),
              static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a, static_cast<int>(g.lda),
              b, static_cast<int>(g.ldb), g.beta, c, static_cast<int>(g.ldc));
}

}  // namespace

absl::Status ValidateGemmArgs(const char* op, const GemmArgs& g) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "m", g.m));
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "n", g.n));
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "k", g.k));
  for (auto [name, v] : {std::pair<const char*, int64_t>{"m", g.m}, {"n", g.n}, {"k", g.k},
                         {"lda", g.lda}, {"ldb", g.ldb}, {"ldc", g.ldc}}) {
    RETURN_IF_ERROR(internal::CheckFitsInt32(op, name, v));
  }
  const bool ta = g.trans_a == Trans::kYes;
  const bool tb = g.trans_b == Trans::kYes;
  RETURN_IF_ERROR(CheckLd(op, "lda", g.lda, ta ? g.m : g.k));
  RETURN_IF_ERROR(CheckLd(op, "ldb", g.ldb, tb ? g.k : g.n));
  RETURN_IF_ERROR(CheckLd(op, "ldc", g.ldc, g.n));
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(op, "c", g.c));
  if (g.k > 0) {
    RETURN_IF_ERROR(internal::CheckNotNull(op, "a", g.a));
    RETURN_IF_ERROR(internal::CheckNotNull(op, "b", g.b));
  }
  return absl::OkStatus();
}

absl::Status ValidateGemmBatch(const char* op, const GemmBatch& b) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "batch.count", b.count));
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "batch.count", b.count));
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "batch.stride_a", b.stride_a));
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "batch.stride_b", b.stride_b));
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "batch.stride_c", b.stride_c));
  return absl::OkStatus();
}

absl::Status ValidateLinearShape(const char* op, const LinearShape& s) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", s.rows));
  RETURN_IF_ERROR(internal::CheckPositive(op, "in_features", s.in_features));
  RETURN_IF_ERROR(internal::CheckPositive(op, "out_features", s.out_features));
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "rows", s.rows));
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "in_features", s.in_features));
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "out_features", s.out_features));
  return absl::OkStatus();
}

size_t LinearBwdWeightWorkspaceBytes(const LinearShape& shape) {
  return internal::ColumnReduceWorkspaceBytes(shape.rows, shape.out_features);
}

size_t BiasGradWorkspaceBytes(int64_t rows, int64_t cols) {
  return internal::ColumnReduceWorkspaceBytes(rows, cols);
}

void SetCpuBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }
int CpuBlasThreads() { return openblas_get_num_threads(); }

absl::Status GemmCpu(const GemmArgs& g) {
  RETURN_IF_ERROR(ValidateGemmArgs("GemmCpu", g));
  GemmUnchecked(g, g.a, g.b, g.c);
  return absl::OkStatus();
}

absl::Status GemmStridedBatchedCpu(const GemmArgs& g, const GemmBatch& batch) {
  RETURN_IF_ERROR(ValidateGemmArgs("GemmStridedBatchedCpu", g));
  RETURN_IF_ERROR(ValidateGemmBatch("GemmStridedBatchedCpu", batch));
  for (int64_t i = 0; i < batch.count; ++i) {
    GemmUnchecked(g, g.a + i * batch.stride_a, g.b + i * batch.stride_b,
                  g.c + i * batch.stride_c);
  }
  return absl::OkStatus();
}

absl::Status BiasAddCpu(const BiasAddArgs& a) {
  constexpr char kOp[] = "BiasAddCpu";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", a.cols));
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "bias", a.bias));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "y", a.y));
  for (int64_t r = 0; r < a.rows; ++r) {
    float* y = a.y + r * a.cols;
    const float* b = a.bias;
#pragma omp simd
    for (int64_t c = 0; c < a.cols; ++c) y[c] += b[c];
  }
  return absl::OkStatus();
}

absl::Status BiasGradCpu(const BiasGradArgs& a) {
  constexpr char kOp[] = "BiasGradCpu";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", a.cols));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "dbias", a.dbias));
  if (a.rows > 0) RETURN_IF_ERROR(internal::CheckNotNull(kOp, "dy", a.dy));
  float* db = a.dbias;
  if (!a.accumulate) std::memset(db, 0, a.cols * sizeof(float));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* dy = a.dy + r * a.cols;
#pragma omp simd
    for (int64_t c = 0; c < a.cols; ++c) db[c] += dy[c];
  }
  return absl::OkStatus();
}

absl::Status LinearFwdCpu(const LinearFwdArgs& a) {
  ASSIGN_OR_RETURN(const std::optional<GemmArgs> g,
                           internal::LinearFwdGemm("LinearFwdCpu", a));
  if (!g.has_value()) return absl::OkStatus();
  GemmUnchecked(*g, g->a, g->b, g->c);
  if (a.bias != nullptr) {
    BiasAddArgs b{a.shape.rows, a.shape.out_features, a.bias, a.y};
    return BiasAddCpu(b);
  }
  return absl::OkStatus();
}

absl::Status LinearBwdDataCpu(const LinearBwdDataArgs& a) {
  ASSIGN_OR_RETURN(const std::optional<GemmArgs> g,
                           internal::LinearBwdDataGemm("LinearBwdDataCpu", a));
  if (!g.has_value()) return absl::OkStatus();
  GemmUnchecked(*g, g->a, g->b, g->c);
  return absl::OkStatus();
}

absl::Status LinearBwdWeightCpu(const LinearBwdWeightArgs& a) {
  ASSIGN_OR_RETURN(const GemmArgs g,
                           internal::LinearBwdWeightGemm("LinearBwdWeightCpu", a));
  GemmUnchecked(g, g.a, g.b, g.c);  // k == rows == 0 leaves beta * dW
  if (a.dbias == nullptr) return absl::OkStatus();
  return BiasGradCpu({a.shape.rows, a.shape.out_features, a.dy, a.dbias, a.accumulate});
}

}  // namespace spgate::kernels
