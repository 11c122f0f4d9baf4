// CPU production path for bias + GeLU (tanh form), plus the validation and
// workspace sizing shared with the CUDA launchers. Row by row, the inner loop
// over columns vectorises (FastTanh instead of the scalar libm call); dbias is
// accumulated into the output row by row in float.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "kernels/gelu.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cpu_math.h"
#include "kernels/internal/launch_plan.h"

namespace spgate::kernels {
namespace {

constexpr float kSqrt2OverPi = static_cast<float>(kGeluSqrt2OverPi);
constexpr float kCubic = static_cast<float>(kGeluCubic);

// The bias branch is a template parameter so the loops have no control flow
// and vectorise.
template <bool kBias>
void GeluFwdRow(const float* pre, const float* bias, float* y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    float u = pre[c];
    if constexpr (kBias) u += bias[c];
    const float t = internal::FastTanh(kSqrt2OverPi * (u + kCubic * u * u * u));
    y[c] = 0.5f * u * (1.0f + t);
  }
}

template <bool kBias>
void GeluBwdRow(const float* dy, const float* pre, const float* bias, float* dpre, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    float u = pre[c];
    if constexpr (kBias) u += bias[c];
    const float t = internal::FastTanh(kSqrt2OverPi * (u + kCubic * u * u * u));
    const float da = kSqrt2OverPi * (1.0f + 3.0f * kCubic * u * u);
    dpre[c] = dy[c] * (0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * da);
  }
}

}  // namespace

template <typename T>
absl::Status ValidateGeluFwdArgs(const char* op, const GeluFwdArgs<T>& a) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(op, "cols", a.cols));
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(op, "pre", a.pre));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "y", a.y));
  return absl::OkStatus();
}

template <typename T>
absl::Status ValidateGeluBwdArgs(const char* op, const GeluBwdArgs<T>& a) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(op, "cols", a.cols));
  if (a.dbias != nullptr && a.bias == nullptr) {
    return internal::Invalid(op, "dbias is set but bias is null");
  }
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dy", a.dy));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "pre", a.pre));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dpre", a.dpre));
  return absl::OkStatus();
}

template absl::Status ValidateGeluFwdArgs(const char*, const GeluFwdArgs<float>&);
template absl::Status ValidateGeluFwdArgs(const char*, const GeluFwdArgs<Bfloat16>&);
template absl::Status ValidateGeluBwdArgs(const char*, const GeluBwdArgs<float>&);
template absl::Status ValidateGeluBwdArgs(const char*, const GeluBwdArgs<Bfloat16>&);

size_t GeluBwdWorkspaceBytes(int64_t rows, int64_t cols) {
  return internal::ColumnReduceWorkspaceBytes(rows, cols);
}

absl::Status GeluFwdCpu(const GeluFwdArgs<float>& a) {
  RETURN_IF_ERROR(ValidateGeluFwdArgs("GeluFwdCpu", a));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* pre = a.pre + r * a.cols;
    float* y = a.y + r * a.cols;
    if (a.bias != nullptr) {
      GeluFwdRow<true>(pre, a.bias, y, a.cols);
    } else {
      GeluFwdRow<false>(pre, nullptr, y, a.cols);
    }
  }
  return absl::OkStatus();
}

absl::Status GeluBwdCpu(const GeluBwdArgs<float>& a) {
  RETURN_IF_ERROR(ValidateGeluBwdArgs("GeluBwdCpu", a));
  const int64_t n = a.cols;
  float* dbias = a.dbias;
  if (dbias != nullptr && !a.accumulate_bias_grad) std::memset(dbias, 0, n * sizeof(float));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* pre = a.pre + r * n;
    const float* dy = a.dy + r * n;
    float* dpre = a.dpre + r * n;
    if (a.bias != nullptr) {
      GeluBwdRow<true>(dy, pre, a.bias, dpre, n);
    } else {
      GeluBwdRow<false>(dy, pre, nullptr, dpre, n);
    }
    if (dbias != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) dbias[c] += dpre[c];
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate::kernels
