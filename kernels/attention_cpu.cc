// CPU production path for causal packed-varlen attention: OpenBLAS sgemm per
// (sequence, query block, head) for the four products, and vectorised
// mask-softmax loops between them. For query rows q0 .. q0 + nq - 1 of a
// sequence only keys 0 .. q0 + nq - 1 are multiplied, so blocks skip the
// causal upper triangle except inside the diagonal block, whose masked scores
// are zeroed before P V. Sequences never see each other's tokens because every
// product is confined to one sequence's rows of qkv.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/internal/attention_plan.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cpu_math.h"

namespace spgate::kernels {
namespace {

// Row-major sgemm without re-validation (the callers' shapes are derived from
// validated arguments).
void Sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// In place: row[0, valid) <- softmax(row[0, valid)), row[valid, n) <- 0.
// Returns the log-sum-exp of row[0, valid). valid >= 1.
float MaskedSoftmaxRow(float* row, int64_t valid, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    const float e = internal::FastExp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
  if (n > valid) std::memset(row + valid, 0, (n - valid) * sizeof(float));
  return mx + std::log(sum);
}

}  // namespace

absl::Status AttentionFwdCpu(const AttentionFwdArgs& a) {
  RETURN_IF_ERROR(ValidateAttentionFwdArgs("AttentionFwdCpu", a));
  const internal::AttentionPlan pl = internal::MakeAttentionPlan(a.shape, a.cu_seqlens);
  const int64_t heads = pl.heads, dim = pl.dim, hd = pl.hd, ld = pl.ld;
  float* ws = static_cast<float*>(a.workspace);

  return internal::ForEachQueryBlock(pl, a.cu_seqlens, [&](const internal::AttentionBlock& b) {
    const auto [q_seq, k_seq, v_seq] = internal::SequenceQkv(pl, a.qkv, b.t0);
    const int64_t t0 = b.t0, q0 = b.q0, nq = b.nq, nk = b.nk;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = ws + h * nq * nk;
      Sgemm(false, true, nq, nk, dim, pl.scale, q_seq + q0 * ld + h * dim, ld, k_seq + h * dim,
            ld, 0.0f, p, nk);
      for (int64_t r = 0; r < nq; ++r) {
        a.lse[(t0 + q0 + r) * heads + h] = MaskedSoftmaxRow(p + r * nk, q0 + r + 1, nk);
      }
      Sgemm(false, false, nq, dim, nk, 1.0f, p, nk, v_seq + h * dim, ld, 0.0f,
            a.out + (t0 + q0) * hd + h * dim, hd);
    }
    return absl::OkStatus();
  });
}

absl::Status AttentionBwdCpu(const AttentionBwdArgs& a) {
  RETURN_IF_ERROR(ValidateAttentionBwdArgs("AttentionBwdCpu", a));
  const internal::AttentionPlan pl = internal::MakeAttentionPlan(a.shape, a.cu_seqlens);
  const int64_t heads = pl.heads, dim = pl.dim, hd = pl.hd, ld = pl.ld;
  const float scale = pl.scale;
  float* ws_p = static_cast<float*>(a.workspace);
  float* ws_ds = ws_p + pl.ScoreFloats();
  if (pl.tokens > 0) std::memset(a.dqkv, 0, pl.tokens * ld * sizeof(float));

  return internal::ForEachQueryBlock(pl, a.cu_seqlens, [&](const internal::AttentionBlock& b) {
    const auto [q_seq, k_seq, v_seq] = internal::SequenceQkv(pl, a.qkv, b.t0);
    const auto [dq_seq, dk_seq, dv_seq] = internal::SequenceQkv(pl, a.dqkv, b.t0);
    const int64_t t0 = b.t0, q0 = b.q0, nq = b.nq, nk = b.nk;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = ws_p + h * nq * nk;
      float* ds = ws_ds + h * nq * nk;
      const float* q_blk = q_seq + q0 * ld + h * dim;
      const float* do_blk = a.dout + (t0 + q0) * hd + h * dim;
      const float* o_blk = a.out + (t0 + q0) * hd + h * dim;
      // P = exp(scale Q K^T - lse), recomputed from forward's statistics.
      Sgemm(false, true, nq, nk, dim, scale, q_blk, ld, k_seq + h * dim, ld, 0.0f, p, nk);
      // dP = dO V^T
      Sgemm(false, true, nq, nk, dim, 1.0f, do_blk, hd, v_seq + h * dim, ld, 0.0f, ds, nk);
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t valid = q0 + r + 1;
        const float lse = a.lse[(t0 + q0 + r) * heads + h];
        float delta = 0.0f;  // dO_i . O_i = rowsum(P * dP)
        const float* dor = do_blk + r * hd;
        const float* orow = o_blk + r * hd;
#pragma omp simd reduction(+ : delta)
        for (int64_t d = 0; d < dim; ++d) delta += dor[d] * orow[d];
        float* prow = p + r * nk;
        float* dsrow = ds + r * nk;
#pragma omp simd
        for (int64_t j = 0; j < valid; ++j) {
          const float pj = internal::FastExp(prow[j] - lse);
          prow[j] = pj;
          dsrow[j] = pj * (dsrow[j] - delta);
        }
        if (nk > valid) {
          std::memset(prow + valid, 0, (nk - valid) * sizeof(float));
          std::memset(dsrow + valid, 0, (nk - valid) * sizeof(float));
        }
      }
      // dV[0, nk) += P^T dO;  dQ[blk] = scale dS K;  dK[0, nk) += scale dS^T Q.
      Sgemm(true, false, nk, dim, nq, 1.0f, p, nk, do_blk, hd, 1.0f, dv_seq + h * dim, ld);
      Sgemm(false, false, nq, dim, nk, scale, ds, nk, k_seq + h * dim, ld, 0.0f,
            dq_seq + q0 * ld + h * dim, ld);
      Sgemm(true, false, nk, dim, nq, scale, ds, nk, q_blk, ld, 1.0f, dk_seq + h * dim, ld);
    }
    return absl::OkStatus();
  });
}

}  // namespace spgate::kernels
