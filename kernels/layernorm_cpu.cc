// CPU production path for residual-add + LayerNorm (what the worker's CPU backend
// runs), plus the argument validation and workspace sizing shared with the CUDA
// launchers. One row at a time: the row (hidden floats) stays in L1/L2 across the
// passes, so each activation byte crosses the memory bus once; the inner loops
// are `omp simd` loops; row sums are blocked float partials added in double.
// Outputs too large to stay cached are written with non-temporal stores
// (internal/cpu_stream.h), which saves the read-for-ownership of every line.
// Rows are independent, so a sequence shard of rows gets bitwise the same
// results as the same rows inside the full batch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cpu_stream.h"
#include "kernels/internal/launch_plan.h"
#include "kernels/layernorm.h"

namespace spgate::kernels {

template <typename T>
absl::Status ValidateLayerNormFwdArgs(const char* op, const LayerNormFwdArgs<T>& a) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(op, "hidden", a.hidden));
  if (!(std::isfinite(a.eps) && a.eps >= 0.0f)) {
    return internal::Invalid(op, absl::StrCat("eps must be finite and >= 0, got ", a.eps));
  }
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(op, "x", a.x));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "gamma", a.gamma));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "beta", a.beta));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "y", a.y));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "mean", a.mean));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "rstd", a.rstd));
  if (a.residual != nullptr && a.residual_out == nullptr) {
    return internal::Invalid(op, "residual_out must be set when residual is set");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ValidateLayerNormBwdArgs(const char* op, const LayerNormBwdArgs<T>& a) {
  RETURN_IF_ERROR(internal::CheckNonNegative(op, "rows", a.rows));
  RETURN_IF_ERROR(internal::CheckPositive(op, "hidden", a.hidden));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dgamma", a.dgamma));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dbeta", a.dbeta));
  if (a.rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dy", a.dy));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "x", a.x));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "gamma", a.gamma));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "mean", a.mean));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "rstd", a.rstd));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dx", a.dx));
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

namespace {

// The row loops are compiled for AVX-512, AVX2 and the baseline, picked at load
// time (GCC function multiversioning); FMA contraction stays off (ISO mode), so
// the clones differ only in the order of the vector reductions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNELS_CPU_CLONES \
  __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define KERNELS_CPU_CLONES
#endif

// Per-row statistics and gradient sums. Both the cached and the streaming path
// call these same (not inlined) functions, so they produce the same bits.
struct RowStats {
  float mean, rstd;
};

// Row sums are blocked: vectorised float partial sums over 64 elements, added
// in double. A plain float sum of 32768 values drifts by ~1e-5 relative when
// the loop is not vectorised (e.g. sanitizer builds), and the mean's error goes
// straight into every output; full double accumulation costs ~10% here.
constexpr int64_t kSumBlock = 64;

KERNELS_CPU_CLONES __attribute__((noinline)) RowStats NormStats(const float* s, int64_t h,
                                                                float eps) {
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < h; j0 += kSumBlock) {
    const float* b = s + j0;
    const int64_t n = std::min(kSumBlock, h - j0);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t j = 0; j < n; ++j) part += b[j];
    sum += part;
  }
  const float mean = static_cast<float>(sum / static_cast<double>(h));
  // Two-pass variance: no cancellation when |mean| >> stddev.
  double sq = 0.0;
  for (int64_t j0 = 0; j0 < h; j0 += kSumBlock) {
    const float* b = s + j0;
    const int64_t n = std::min(kSumBlock, h - j0);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t j = 0; j < n; ++j) {
      const float d = b[j] - mean;
      part += d * d;
    }
    sq += part;
  }
  const float var = static_cast<float>(sq / static_cast<double>(h));
  return {mean, 1.0f / std::sqrt(var + eps)};
}

struct GradSums {
  float mean_g, mean_gx;
};

// Row sums of g = dy * gamma and g * xhat (blocked, as above); adds the row's
// dgamma/dbeta terms. When next_dy/next_x are set, the next row's lines are
// prefetched block by block (the streaming path), which keeps the memory system
// busy during this compute-only pass without changing any arithmetic.
KERNELS_CPU_CLONES __attribute__((noinline)) GradSums RowGradSums(
    const float* dy, const float* x, const float* gamma, float mean, float rstd, int64_t h,
    float* dgamma, float* dbeta, const float* next_dy, const float* next_x) {
  double sum_g = 0.0, sum_gx = 0.0;
  for (int64_t j0 = 0; j0 < h; j0 += kSumBlock) {
    const int64_t n = std::min(kSumBlock, h - j0);
    if (next_dy != nullptr) {
      for (int64_t l = 0; l < kSumBlock; l += 16) {  // 16 floats = one 64-byte line
        __builtin_prefetch(next_dy + j0 + l);
        __builtin_prefetch(next_x + j0 + l);
      }
    }
    const float* dyb = dy + j0;
    const float* xb = x + j0;
    const float* gb = gamma + j0;
    float* dgb = dgamma + j0;
    float* dbb = dbeta + j0;
    float pg = 0.0f, pgx = 0.0f;
#pragma omp simd reduction(+ : pg, pgx)
    for (int64_t j = 0; j < n; ++j) {
      const float xhat = (xb[j] - mean) * rstd;
      const float g = dyb[j] * gb[j];
      pg += g;
      pgx += g * xhat;
      dgb[j] += dyb[j] * xhat;
      dbb[j] += dyb[j];
    }
    sum_g += pg;
    sum_gx += pgx;
  }
  return {static_cast<float>(sum_g / static_cast<double>(h)),
          static_cast<float>(sum_gx / static_cast<double>(h))};
}

// ------------------------------------------------------------- cached path
KERNELS_CPU_CLONES void LayerNormFwdRows(const LayerNormFwdArgs<float>& a) {
  const int64_t h = a.hidden;
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
    const RowStats st = NormStats(s, h, a.eps);
    float* y = a.y + row * h;
    const float mean = st.mean, rstd = st.rstd;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) y[j] = (s[j] - mean) * rstd * a.gamma[j] + a.beta[j];
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

KERNELS_CPU_CLONES void LayerNormBwdRows(const LayerNormBwdArgs<float>& a) {
  const int64_t h = a.hidden;
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* dy = a.dy + row * h;
    const float* x = a.x + row * h;
    const float mean = a.mean[row], rstd = a.rstd[row];
    const GradSums gs =
        RowGradSums(dy, x, a.gamma, mean, rstd, h, a.dgamma, a.dbeta, nullptr, nullptr);
    const float mean_g = gs.mean_g, mean_gx = gs.mean_gx;
    float* dx = a.dx + row * h;
    const float* gamma = a.gamma;
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
}

#if KERNELS_HAVE_STREAMING_STORES
// ---------------------------------------------------------- streaming path
// For outputs too large to stay cached. Software-pipelined over rows: while row
// i's outputs are written with non-temporal stores, row i + 1's inputs are
// copied into an L1-resident scratch row, so reads and writes overlap on the
// memory bus the way a memcpy's do (a plain row-at-a-time loop alternates read
// phases and write phases). The arithmetic is the cached path's, operation for
// operation (SSE, no FMA), so both paths give the same bits.

// scratch = x (+ r), 4 floats at a time.
inline void LoadRow4(const float* x, const float* r, float* scratch, int64_t j) {
  __m128 v = _mm_loadu_ps(x + j);
  if (r != nullptr) v = _mm_add_ps(v, _mm_loadu_ps(r + j));
  _mm_store_ps(scratch + j, v);
}

void LayerNormFwdRowsStreaming(const LayerNormFwdArgs<float>& a) {
  const int64_t h = a.hidden;
  const bool has_res = a.residual != nullptr;
  // Two scratch rows (current, next); 64-byte aligned.
  std::vector<float> buf(2 * h + 16);
  float* rows[2] = {buf.data() + ((16 - (reinterpret_cast<uintptr_t>(buf.data()) & 63) / 4) & 15),
                    nullptr};
  rows[1] = rows[0] + h;
  for (int64_t j = 0; j < h; j += 4) LoadRow4(a.x, has_res ? a.residual : nullptr, rows[0], j);
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* s = rows[row & 1];
    float* next = rows[(row + 1) & 1];
    const RowStats st = NormStats(s, h, a.eps);
    const __m128 m = _mm_set1_ps(st.mean), rs = _mm_set1_ps(st.rstd);
    float* y = a.y + row * h;
    float* s_out = has_res ? a.residual_out + row * h : nullptr;
    const bool more = row + 1 < a.rows;
    const float* nx = a.x + (row + 1) * h;
    const float* nr = has_res ? a.residual + (row + 1) * h : nullptr;
    for (int64_t j = 0; j < h; j += 4) {
      const __m128 v = _mm_load_ps(s + j);
      if (s_out != nullptr) _mm_stream_ps(s_out + j, v);
      const __m128 n = _mm_mul_ps(_mm_mul_ps(_mm_sub_ps(v, m), rs), _mm_loadu_ps(a.gamma + j));
      _mm_stream_ps(y + j, _mm_add_ps(n, _mm_loadu_ps(a.beta + j)));
      if (more) LoadRow4(nx, nr, next, j);
    }
    a.mean[row] = st.mean;
    a.rstd[row] = st.rstd;
  }
  _mm_sfence();
}

void LayerNormBwdRowsStreaming(const LayerNormBwdArgs<float>& a) {
  const int64_t h = a.hidden;
  // Backward reads its rows twice (sums, then dx), so instead of a scratch copy
  // the next row's dy and x are prefetched during this row's sums pass.
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* dy = a.dy + row * h;
    const float* x = a.x + row * h;
    const float mean = a.mean[row], rstd = a.rstd[row];
    const bool more = row + 1 < a.rows;
    const GradSums gs = RowGradSums(dy, x, a.gamma, mean, rstd, h, a.dgamma, a.dbeta,
                                    more ? dy + h : nullptr, more ? x + h : nullptr);
    const __m128 m = _mm_set1_ps(mean), r = _mm_set1_ps(rstd), mg = _mm_set1_ps(gs.mean_g),
                 mgx = _mm_set1_ps(gs.mean_gx);
    const float* dr = a.dresidual != nullptr ? a.dresidual + row * h : nullptr;
    float* dx = a.dx + row * h;
    for (int64_t j = 0; j < h; j += 4) {
      const __m128 xhat = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + j), m), r);
      const __m128 g = _mm_mul_ps(_mm_loadu_ps(dy + j), _mm_loadu_ps(a.gamma + j));
      __m128 v = _mm_mul_ps(r, _mm_sub_ps(_mm_sub_ps(g, mg), _mm_mul_ps(xhat, mgx)));
      if (dr != nullptr) v = _mm_add_ps(v, _mm_loadu_ps(dr + j));
      _mm_stream_ps(dx + j, v);
    }
  }
  _mm_sfence();
}
#endif  // KERNELS_HAVE_STREAMING_STORES

}  // namespace

absl::Status LayerNormFwdCpu(const LayerNormFwdArgs<float>& a) {
  RETURN_IF_ERROR(ValidateLayerNormFwdArgs("LayerNormFwdCpu", a));
  if (a.rows == 0) return absl::OkStatus();
#if KERNELS_HAVE_STREAMING_STORES
  if (internal::CanStream(a.rows * a.hidden * static_cast<int64_t>(sizeof(float)), a.hidden,
                          {a.y, a.residual != nullptr ? a.residual_out : nullptr})) {
    LayerNormFwdRowsStreaming(a);
    return absl::OkStatus();
  }
#endif
  LayerNormFwdRows(a);
  return absl::OkStatus();
}

absl::Status LayerNormBwdCpu(const LayerNormBwdArgs<float>& a) {
  RETURN_IF_ERROR(ValidateLayerNormBwdArgs("LayerNormBwdCpu", a));
  if (!a.accumulate_param_grads) {
    std::memset(a.dgamma, 0, a.hidden * sizeof(float));
    std::memset(a.dbeta, 0, a.hidden * sizeof(float));
  }
  if (a.rows == 0) return absl::OkStatus();
#if KERNELS_HAVE_STREAMING_STORES
  if (internal::CanStream(a.rows * a.hidden * static_cast<int64_t>(sizeof(float)), a.hidden,
                          {a.dx})) {
    LayerNormBwdRowsStreaming(a);
    return absl::OkStatus();
  }
#endif
  LayerNormBwdRows(a);
  return absl::OkStatus();
}

}  // namespace spgate::kernels
