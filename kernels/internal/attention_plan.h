// Private: the per-call and per-sequence setup the CPU attention path
// (attention_cpu.cc) and the CUDA launchers (attention.cu) share - the derived
// sizes, the query-block loop over packed sequences and each sequence's Q/K/V
// slices of qkv - so the two differ only in the products and softmax they run
// per block. Header-only: compiled as C++20 on the CPU side and as CUDA C++17.
#ifndef SPGATE_KERNELS_INTERNAL_ATTENTION_PLAN_H_
#define SPGATE_KERNELS_INTERNAL_ATTENTION_PLAN_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/attention.h"
#include "kernels/internal/check.h"

namespace spgate::kernels::internal {

// Sizes derived from validated arguments.
struct AttentionPlan {
  int64_t tokens = 0;   // cu_seqlens.back()
  int64_t heads = 0, dim = 0;
  int64_t hd = 0;       // heads * head_dim: columns of out / dout
  int64_t ld = 0;       // 3 * hd: columns of qkv / dqkv
  int64_t max_len = 0;  // MaxSeqLen(cu_seqlens)
  int64_t qb = 1;       // query rows per block, in [1, max(1, max_len)]
  float scale = 0.0f;   // ResolvedSoftmaxScale
  // Floats of one per-head score block set (heads * qb * max_len): the
  // workspace holds one (forward: P) or two (backward: P, then dS).
  int64_t ScoreFloats() const { return heads * qb * max_len; }
};

inline AttentionPlan MakeAttentionPlan(const AttentionShape& shape,
                                       absl::Span<const int64_t> cu) {
  AttentionPlan p;
  p.tokens = cu.empty() ? 0 : cu.back();
  p.heads = shape.heads;
  p.dim = shape.head_dim;
  p.hd = p.heads * p.dim;
  p.ld = 3 * p.hd;
  p.max_len = MaxSeqLen(cu);
  p.qb = std::max<int64_t>(1, std::min(shape.query_block, p.max_len));
  p.scale = ResolvedSoftmaxScale(shape);
  return p;
}

// One query block: rows q0 .. q0 + nq - 1 of the sequence starting at token
// t0, attending to keys 0 .. nk - 1 (nk = q0 + nq) of that sequence.
struct AttentionBlock {
  int64_t t0 = 0, q0 = 0, nq = 0, nk = 0;
};

// Sequence-local Q, K and V (or dQ, dK, dV) of a packed [tokens, ld] buffer
// whose sequence starts at token t0; head h is at column h * dim of each.
template <typename T>
struct QkvSlices {
  T* q;
  T* k;
  T* v;
};
template <typename T>
QkvSlices<T> SequenceQkv(const AttentionPlan& p, T* qkv, int64_t t0) {
  T* q = qkv + t0 * p.ld;
  return {q, q + p.hd, q + 2 * p.hd};
}

// Calls fn(const AttentionBlock&) -> absl::Status for every query block of
// every sequence in order, stopping at the first error.
template <typename Fn>
absl::Status ForEachQueryBlock(const AttentionPlan& p, absl::Span<const int64_t> cu, Fn&& fn) {
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t t0 = cu[s], len = cu[s + 1] - cu[s];
    for (int64_t q0 = 0; q0 < len; q0 += p.qb) {
      const int64_t nq = std::min(p.qb, len - q0);
      RETURN_IF_ERROR(fn(AttentionBlock{t0, q0, nq, q0 + nq}));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_ATTENTION_PLAN_H_
