// CPU reference for residual-add + LayerNorm: the textbook formulas in double,
// one row at a time, written for obviousness rather than speed. Every other
// implementation (CPU path, CUDA kernels) is tested against these. Backward
// uses the closed form dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with
// g = dy * gamma, which tests also check against central finite differences.
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/internal/check.h"
#include "kernels/layernorm.h"

namespace spgate::kernels {
absl::StatusOr<LayerNormFwdRefResult> LayerNormFwdRef(
    int64_t rows, int64_t hidden, double eps, absl::Span<const double> x,
    absl::Span<const double> residual, absl::Span<const double> gamma,
    absl::Span<const double> beta) {
  constexpr char kOp[] = "LayerNormFwdRef";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "hidden", hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "x", x, rows * hidden));
  if (!residual.empty()) {
    RETURN_IF_ERROR(internal::CheckSize(kOp, "residual", residual, rows * hidden));
  }
  RETURN_IF_ERROR(internal::CheckSize(kOp, "gamma", gamma, hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "beta", beta, hidden));

  LayerNormFwdRefResult r;
  r.residual_out.assign(x.begin(), x.end());
  if (!residual.empty()) {
    for (int64_t i = 0; i < rows * hidden; ++i) r.residual_out[i] += residual[i];
  }
  r.y.resize(rows * hidden);
  r.mean.resize(rows);
  r.rstd.resize(rows);
  for (int64_t row = 0; row < rows; ++row) {
    const double* s = r.residual_out.data() + row * hidden;
    double sum = 0;
    for (int64_t j = 0; j < hidden; ++j) sum += s[j];
    const double mean = sum / hidden;
    double sq = 0;
    for (int64_t j = 0; j < hidden; ++j) sq += (s[j] - mean) * (s[j] - mean);
    const double rstd = 1.0 / std::sqrt(sq / hidden + eps);
    for (int64_t j = 0; j < hidden; ++j) {
      r.y[row * hidden + j] = (s[j] - mean) * rstd * gamma[j] + beta[j];
    }
    r.mean[row] = mean;
    r.rstd[row] = rstd;
  }
  return r;
}

absl::StatusOr<LayerNormBwdRefResult> LayerNormBwdRef(
    int64_t rows, int64_t hidden, absl::Span<const double> dy,
    absl::Span<const double> x, absl::Span<const double> gamma,
    absl::Span<const double> mean, absl::Span<const double> rstd,
    absl::Span<const double> dresidual) {
  constexpr char kOp[] = "LayerNormBwdRef";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "rows", rows));
  RETURN_IF_ERROR(internal::CheckPositive(kOp, "hidden", hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "dy", dy, rows * hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "x", x, rows * hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "gamma", gamma, hidden));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "mean", mean, rows));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "rstd", rstd, rows));
  if (!dresidual.empty()) {
    RETURN_IF_ERROR(internal::CheckSize(kOp, "dresidual", dresidual, rows * hidden));
  }

  LayerNormBwdRefResult r;
  r.dx.resize(rows * hidden);
  r.dgamma.assign(hidden, 0.0);
  r.dbeta.assign(hidden, 0.0);
  std::vector<double> xhat(hidden), g(hidden);
  for (int64_t row = 0; row < rows; ++row) {
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const int64_t i = row * hidden + j;
      xhat[j] = (x[i] - mean[row]) * rstd[row];
      g[j] = dy[i] * gamma[j];
      mean_g += g[j];
      mean_gx += g[j] * xhat[j];
      r.dgamma[j] += dy[i] * xhat[j];
      r.dbeta[j] += dy[i];
    }
    mean_g /= hidden;
    mean_gx /= hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      const int64_t i = row * hidden + j;
      r.dx[i] = rstd[row] * (g[j] - mean_g - xhat[j] * mean_gx);
      if (!dresidual.empty()) r.dx[i] += dresidual[i];
    }
  }
  return r;
}

}  // namespace spgate::kernels
