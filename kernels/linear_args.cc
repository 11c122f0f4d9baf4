// The Linear layer's products mapped to row-major GEMMs, with their argument
// checks; shared by the CPU path and the cuBLAS launchers (see
// kernels/internal/linear_args.h).
#include "kernels/internal/linear_args.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/gemm.h"
#include "kernels/internal/check.h"

namespace spgate::kernels::internal {

absl::StatusOr<std::optional<GemmArgs>> LinearFwdGemm(const char* op,
                                                      const LinearFwdArgs& a) {
  const LinearShape& s = a.shape;
  RETURN_IF_ERROR(ValidateLinearShape(op, s));
  if (s.rows == 0) return std::nullopt;
  RETURN_IF_ERROR(CheckNotNull(op, "x", a.x));
  RETURN_IF_ERROR(CheckNotNull(op, "weight", a.weight));
  RETURN_IF_ERROR(CheckNotNull(op, "y", a.y));
  GemmArgs g;
  g.trans_b = Trans::kYes;
  g.m = s.rows;
  g.n = s.out_features;
  g.k = s.in_features;
  g.a = a.x;
  g.lda = s.in_features;
  g.b = a.weight;
  g.ldb = s.in_features;
  g.c = a.y;
  g.ldc = s.out_features;
  return g;
}

absl::StatusOr<std::optional<GemmArgs>> LinearBwdDataGemm(const char* op,
                                                          const LinearBwdDataArgs& a) {
  const LinearShape& s = a.shape;
  RETURN_IF_ERROR(ValidateLinearShape(op, s));
  if (s.rows == 0) return std::nullopt;
  RETURN_IF_ERROR(CheckNotNull(op, "dy", a.dy));
  RETURN_IF_ERROR(CheckNotNull(op, "weight", a.weight));
  RETURN_IF_ERROR(CheckNotNull(op, "dx", a.dx));
  GemmArgs g;
  g.m = s.rows;
  g.n = s.in_features;
  g.k = s.out_features;
  g.a = a.dy;
  g.lda = s.out_features;
  g.b = a.weight;
  g.ldb = s.in_features;
  g.beta = a.accumulate ? 1.0f : 0.0f;
  g.c = a.dx;
  g.ldc = s.in_features;
  return g;
}

absl::StatusOr<GemmArgs> LinearBwdWeightGemm(const char* op, const LinearBwdWeightArgs& a) {
  const LinearShape& s = a.shape;
  RETURN_IF_ERROR(ValidateLinearShape(op, s));
  RETURN_IF_ERROR(CheckNotNull(op, "dweight", a.dweight));
  if (s.rows > 0) {
    RETURN_IF_ERROR(CheckNotNull(op, "dy", a.dy));
    RETURN_IF_ERROR(CheckNotNull(op, "x", a.x));
  }
  GemmArgs g;
  g.trans_a = Trans::kYes;
  g.m = s.out_features;
  g.n = s.in_features;
  g.k = s.rows;
  g.a = a.dy;
  g.lda = s.out_features;
  g.b = a.x;
  g.ldb = s.in_features;
  g.beta = a.accumulate ? 1.0f : 0.0f;
  g.c = a.dweight;
  g.ldc = s.in_features;
  return g;
}

}  // namespace spgate::kernels::internal
