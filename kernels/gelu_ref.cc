// CPU reference for bias + GeLU (tanh form): the formula and its derivative in
// double, elementwise, dbias summed row by row. The oracle for the CPU path and
// the CUDA kernels; tests check GeluTanhGradRef against finite differences.
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/gelu.h"
#include "kernels/internal/check.h"

namespace spgate::kernels {

double GeluTanhRef(double u) {
  return 0.5 * u * (1.0 + std::tanh(kGeluSqrt2OverPi * (u + kGeluCubic * u * u * u)));
}

double GeluTanhGradRef(double u) {
  const double a = kGeluSqrt2OverPi * (u + kGeluCubic * u * u * u);
  const double t = std::tanh(a);
  const double da = kGeluSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * u * u);
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * da;
}

absl::StatusOr<std::vector<double>> GeluFwdRef(int64_t rows, int64_t cols,
                                               absl::Span<const double> pre,
                                               absl::Span<const double> bias) {
  constexpr char kOp[] = "GeluFwdRef";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", cols));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "pre", pre, rows * cols));
  if (!bias.empty()) RETURN_IF_ERROR(internal::CheckSize(kOp, "bias", bias, cols));
  std::vector<double> y(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double u = pre[r * cols + c] + (bias.empty() ? 0.0 : bias[c]);
      y[r * cols + c] = GeluTanhRef(u);
    }
  }
  return y;
}

absl::StatusOr<GeluBwdRefResult> GeluBwdRef(int64_t rows, int64_t cols,
                                            absl::Span<const double> dy,
                                            absl::Span<const double> pre,
                                            absl::Span<const double> bias) {
  constexpr char kOp[] = "GeluBwdRef";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "cols", cols));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "dy", dy, rows * cols));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "pre", pre, rows * cols));
  if (!bias.empty()) RETURN_IF_ERROR(internal::CheckSize(kOp, "bias", bias, cols));
  GeluBwdRefResult r;
  r.dpre.resize(rows * cols);
  r.dbias.assign(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      const double u = pre[i * cols + c] + (bias.empty() ? 0.0 : bias[c]);
      const double d = dy[i * cols + c] * GeluTanhGradRef(u);
      r.dpre[i * cols + c] = d;
      r.dbias[c] += d;
    }
  }
  return r;
}

}  // namespace spgate::kernels
