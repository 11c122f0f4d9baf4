// CPU production path for residual-add + LayerNorm (what the worker's CPU backend
// runs), plus the argument validation and workspace sizing shared with the CUDA
// launchers. One row at a time: the row (hidden floats) stays in L1/L2 across the
// passes, so each activation byte crosses the memory bus once; the inner loops
// are `omp simd` reductions in float (the statistics of one row need no more).
// Rows are independent, so a sequence shard of rows gets bitwise the same
// results as the same rows inside the full batch.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/internal/check.h"
#include "kernels/internal/launch_plan.h"
#include "kernels/layernorm.h"

namespace spgate::kernels {

template <typename T>
absl::Status ValidateLayerNormFwdArgs(const char* op, const LayerNormFwdArgs<T>& a) {
  KERNELS_RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  KERNELS_RETURN_IF_ERROR(internal::CheckPositive(op, "hidden", a.hidden));
  if (!(std::isfinite(a.eps) && a.eps >= 0.0f)) {
    return internal::Invalid(op, absl::StrCat("eps must be finite and >= 0, got ", a.eps));
  }
  if (a.rows == 0) return absl::OkStatus();
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "x", a.x));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "gamma", a.gamma));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "beta", a.beta));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "y", a.y));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "mean", a.mean));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "rstd", a.rstd));
  if (a.residual != nullptr && a.residual_out == nullptr) {
    return internal::Invalid(op, "residual_out must be set when residual is set");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ValidateLayerNormBwdArgs(const char* op, const LayerNormBwdArgs<T>& a) {
  KERNELS_RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  KERNELS_RETURN_IF_ERROR(internal::CheckPositive(op, "hidden", a.hidden));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "dgamma", a.dgamma));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "dbeta", a.dbeta));
  if (a.rows == 0) return absl::OkStatus();
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "dy", a.dy));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "x", a.x));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "gamma", a.gamma));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "mean", a.mean));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "rstd", a.rstd));
  KERNELS_RETURN_IF_ERROR(internal::CheckNotNull(op, "dx", a.dx));
  return absl::OkStatus();
}

template absl::Status ValidateLayerNormFwdArgs(const char*, const LayerNormFwdArgs<float>&);
template absl::Status ValidateLayerNormFwdArgs(const char*,
                                               const LayerNormFwdArgs<Bfloat16>&);
template absl::Status ValidateLayerNormBwdArgs(const char*, const LayerNormBwdArgs<float>&);
template absl::Status ValidateLayerNormBwdArgs(const char*,
                                               const LayerNormBwdArgs<Bfloat16>&);

size_t LayerNormBwdWorkspaceBytes(int64_t rows, int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return 0;
  // Two planes (dgamma, dbeta) of [blocks, hidden] fp32 partial sums.
  return 2 * static_cast<size_t>(internal::LayerNormBwdBlocks(rows)) *
         static_cast<size_t>(hidden) * sizeof(float);
}

absl::Status LayerNormFwdCpu(const LayerNormFwdArgs<float>& a) {
  KERNELS_RETURN_IF_ERROR(ValidateLayerNormFwdArgs("LayerNormFwdCpu", a));
  const int64_t h = a.hidden;
  const float inv_h = 1.0f / static_cast<float>(h);
  const float* gamma = a.gamma;
  const float* beta = a.beta;
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* s = a.x + row * h;
    if (a.residual != nullptr) {
      const float* x = a.x + row * h;
      const float* r = a.residual + row * h;
      float* out = a.residual_out + row * h;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) out[j] = x[j] + r[j];
      s = out;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < h; ++j) sum += s[j];
    const float mean = sum * inv_h;
    // Two-pass variance: no cancellation when |mean| >> stddev.
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < h; ++j) {
      const float d = s[j] - mean;
      sq += d * d;
    }
    const float rstd = 1.0f / std::sqrt(sq * inv_h + a.eps);
    float* y = a.y + row * h;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) y[j] = (s[j] - mean) * rstd * gamma[j] + beta[j];
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
  return absl::OkStatus();
}

absl::Status LayerNormBwdCpu(const LayerNormBwdArgs<float>& a) {
  KERNELS_RETURN_IF_ERROR(ValidateLayerNormBwdArgs("LayerNormBwdCpu", a));
  const int64_t h = a.hidden;
  const float inv_h = 1.0f / static_cast<float>(h);
  float* dgamma = a.dgamma;
  float* dbeta = a.dbeta;
  const float* gamma = a.gamma;
  if (!a.accumulate_param_grads) {
    std::memset(dgamma, 0, h * sizeof(float));
    std::memset(dbeta, 0, h * sizeof(float));
  }
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* dy = a.dy + row * h;
    const float* x = a.x + row * h;
    const float mean = a.mean[row];
    const float rstd = a.rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t j = 0; j < h; ++j) {
      const float xhat = (x[j] - mean) * rstd;
      const float g = dy[j] * gamma[j];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[j] += dy[j] * xhat;
      dbeta[j] += dy[j];
    }
    const float mean_g = sum_g * inv_h;
    const float mean_gx = sum_gx * inv_h;
    float* dx = a.dx + row * h;
    if (a.dresidual != nullptr) {
      const float* dr = a.dresidual + row * h;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) {
        const float xhat = (x[j] - mean) * rstd;
        dx[j] = rstd * (dy[j] * gamma[j] - mean_g - xhat * mean_gx) + dr[j];
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) {
        const float xhat = (x[j] - mean) * rstd;
        dx[j] = rstd * (dy[j] * gamma[j] - mean_g - xhat * mean_gx);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate::kernels
