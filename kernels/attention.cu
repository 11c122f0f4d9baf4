// CUDA causal attention over packed variable-length sequences, fp32. The host
// loops over sequences and query blocks (cu_seqlens is on the host); for each,
// cuBLAS strided-batched GEMMs cover all local heads at once (head h's Q/K/V
// slices are head_dim columns apart in qkv, its score block nq * nk floats
// apart in the workspace), and one fused kernel applies mask + softmax
// (forward) or recomputes P from lse and forms dS = P * (dP - dO.O) (backward),
// one warp per score row. Correctness first: launches scale with the number of
// sequences (3 per block forward, 6 backward), so batches of many short
// sequences are launch-bound; a grouped-GEMM or fused-tile kernel is the next
// step if profiles show it.
#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/internal/attention_plan.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cuda_common.cuh"

namespace spgate::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;

// Score rows R = h * nq + r of a [heads, nq, nk] block (rows contiguous).
// Row r belongs to query q0 + r of the sequence and may see keys 0 .. q0 + r.
__global__ void AttentionSoftmaxFwdKernel(float* __restrict__ scores, int heads, int nq,
                                          int nk, int q0, int64_t token0,
                                          float* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= static_cast<int64_t>(heads) * nq) return;
  const int h = static_cast<int>(row / nq);
  const int r = static_cast<int>(row % nq);
  const int valid = q0 + r + 1;
  float* s = scores + row * nk;

  // Online max / sum per lane, then combined across the warp.
  float m = -INFINITY, l = 0.0f;
  for (int j = lane; j < valid; j += 32) {
    const float v = s[j];
    if (v > m) {
      l = l * expf(m - v) + 1.0f;
      m = v;
    } else {
      l += expf(v - m);
    }
  }
  const float mx = internal::WarpMax(m);
  l = (m == -INFINITY) ? 0.0f : l * expf(m - mx);
  const float sum = internal::WarpSum(l);
  const float inv = 1.0f / sum;
  for (int j = lane; j < nk; j += 32) s[j] = j < valid ? expf(s[j] - mx) * inv : 0.0f;
  if (lane == 0) lse[(token0 + r) * heads + h] = mx + logf(sum);
}

// p: scaled scores in, P out; ds: dP in, dS out; same [heads, nq, nk] layout.
__global__ void AttentionSoftmaxBwdKernel(float* __restrict__ p, float* __restrict__ ds,
                                          int heads, int nq, int nk, int q0, int64_t token0,
                                          int head_dim, const float* __restrict__ lse,
                                          const float* __restrict__ out,
                                          const float* __restrict__ dout) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= static_cast<int64_t>(heads) * nq) return;
  const int h = static_cast<int>(row / nq);
  const int r = static_cast<int>(row % nq);
  const int valid = q0 + r + 1;
  const int64_t token = token0 + r;
  const int64_t hd = static_cast<int64_t>(heads) * head_dim;
  const float* o = out + token * hd + static_cast<int64_t>(h) * head_dim;
  const float* g = dout + token * hd + static_cast<int64_t>(h) * head_dim;
  float delta = 0.0f;
  for (int d = lane; d < head_dim; d += 32) delta += o[d] * g[d];
  delta = internal::WarpSum(delta);
  const float l = lse[token * heads + h];
  float* prow = p + row * nk;
  float* dsrow = ds + row * nk;
  for (int j = lane; j < nk; j += 32) {
    if (j < valid) {
      const float pj = expf(prow[j] - l);
      prow[j] = pj;
      dsrow[j] = pj * (dsrow[j] - delta);
    } else {
      prow[j] = 0.0f;
      dsrow[j] = 0.0f;
    }
  }
}

GemmArgs MakeGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  float* c, int64_t ldc) {
  GemmArgs g;
  g.trans_a = ta ? Trans::kYes : Trans::kNo;
  g.trans_b = tb ? Trans::kYes : Trans::kNo;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alpha;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.beta = beta;
  g.c = c;
  g.ldc = ldc;
  return g;
}

GemmBatch Heads(int64_t heads, int64_t sa, int64_t sb, int64_t sc) {
  GemmBatch b;
  b.count = heads;
  b.stride_a = sa;
  b.stride_b = sb;
  b.stride_c = sc;
  return b;
}

int RowBlocks(int64_t rows) {
  return static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

absl::Status AttentionFwd(const AttentionFwdArgs& a, cublasHandle_t blas, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateAttentionFwdArgs("AttentionFwd", a));
  RETURN_IF_ERROR(internal::CheckNotNull("AttentionFwd", "cublas handle", blas));
  const internal::AttentionPlan pl = internal::MakeAttentionPlan(a.shape, a.cu_seqlens);
  const int64_t heads = pl.heads, dim = pl.dim, hd = pl.hd, ld = pl.ld;
  float* ws = static_cast<float*>(a.workspace);

  return internal::ForEachQueryBlock(pl, a.cu_seqlens, [&](const internal::AttentionBlock& b) {
    const internal::QkvSlices<const float> seq = internal::SequenceQkv(pl, a.qkv, b.t0);
    const int64_t t0 = b.t0, q0 = b.q0, nq = b.nq, nk = b.nk;
    RETURN_IF_ERROR(GemmStridedBatched(
        MakeGemm(false, true, nq, nk, dim, pl.scale, seq.q + q0 * ld, ld, seq.k, ld, 0.0f, ws,
                 nk),
        Heads(heads, dim, dim, nq * nk), blas, stream));
    AttentionSoftmaxFwdKernel<<<RowBlocks(heads * nq), 32 * kWarpsPerBlock, 0, stream>>>(
        ws, static_cast<int>(heads), static_cast<int>(nq), static_cast<int>(nk),
        static_cast<int>(q0), t0 + q0, a.lse);
    SPGATE_CUDA_CHECK_LAUNCH(AttentionSoftmaxFwdKernel);
    return GemmStridedBatched(
        MakeGemm(false, false, nq, dim, nk, 1.0f, ws, nk, seq.v, ld, 0.0f,
                 a.out + (t0 + q0) * hd, hd),
        Heads(heads, nq * nk, dim, dim), blas, stream);
  });
}

absl::Status AttentionBwd(const AttentionBwdArgs& a, cublasHandle_t blas, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateAttentionBwdArgs("AttentionBwd", a));
  RETURN_IF_ERROR(internal::CheckNotNull("AttentionBwd", "cublas handle", blas));
  const internal::AttentionPlan pl = internal::MakeAttentionPlan(a.shape, a.cu_seqlens);
  const int64_t heads = pl.heads, dim = pl.dim, hd = pl.hd, ld = pl.ld;
  const float scale = pl.scale;
  float* ws_p = static_cast<float*>(a.workspace);
  float* ws_ds = ws_p + pl.ScoreFloats();
  if (pl.tokens > 0) {
    SPGATE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(a.dqkv, 0, pl.tokens * ld * sizeof(float), stream));
  }

  return internal::ForEachQueryBlock(pl, a.cu_seqlens, [&](const internal::AttentionBlock& b) {
    const internal::QkvSlices<const float> seq = internal::SequenceQkv(pl, a.qkv, b.t0);
    const internal::QkvSlices<float> dseq = internal::SequenceQkv(pl, a.dqkv, b.t0);
    const int64_t t0 = b.t0, q0 = b.q0, nq = b.nq, nk = b.nk;
    const float* q_blk = seq.q + q0 * ld;
    const float* do_blk = a.dout + (t0 + q0) * hd;
    const GemmBatch per_head_scores = Heads(heads, dim, dim, nq * nk);
    const GemmBatch from_scores = Heads(heads, nq * nk, dim, dim);
    // P <- scale Q K^T (made P by the kernel); dS <- dO V^T (made dS by the kernel).
    RETURN_IF_ERROR(GemmStridedBatched(
        MakeGemm(false, true, nq, nk, dim, scale, q_blk, ld, seq.k, ld, 0.0f, ws_p, nk),
        per_head_scores, blas, stream));
    RETURN_IF_ERROR(GemmStridedBatched(
        MakeGemm(false, true, nq, nk, dim, 1.0f, do_blk, hd, seq.v, ld, 0.0f, ws_ds, nk),
        per_head_scores, blas, stream));
    AttentionSoftmaxBwdKernel<<<RowBlocks(heads * nq), 32 * kWarpsPerBlock, 0, stream>>>(
        ws_p, ws_ds, static_cast<int>(heads), static_cast<int>(nq), static_cast<int>(nk),
        static_cast<int>(q0), t0 + q0, static_cast<int>(dim), a.lse, a.out, a.dout);
    SPGATE_CUDA_CHECK_LAUNCH(AttentionSoftmaxBwdKernel);
    // dV[0, nk) += P^T dO;  dQ[blk] = scale dS K;  dK[0, nk) += scale dS^T Q.
    RETURN_IF_ERROR(GemmStridedBatched(
        MakeGemm(true, false, nk, dim, nq, 1.0f, ws_p, nk, do_blk, hd, 1.0f, dseq.v, ld),
        from_scores, blas, stream));
    RETURN_IF_ERROR(GemmStridedBatched(
        MakeGemm(false, false, nq, dim, nk, scale, ws_ds, nk, seq.k, ld, 0.0f,
                 dseq.q + q0 * ld, ld),
        from_scores, blas, stream));
    return GemmStridedBatched(
        MakeGemm(true, false, nk, dim, nq, scale, ws_ds, nk, q_blk, ld, 1.0f, dseq.k, ld),
        from_scores, blas, stream);
  });
}

}  // namespace spgate::kernels
