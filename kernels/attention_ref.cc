// CPU reference for causal attention over packed variable-length sequences:
// per sequence and head, the full L x L score matrix in double, the causal
// mask applied by skipping j > i, softmax, and the textbook backward. Slow
// (O(L^2 * head_dim) per head, no blocking) and obviously right; also home of
// the shape helpers (workspace sizes, FLOP counts) that need no BLAS.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/attention.h"
#include "kernels/internal/check.h"

namespace spgate::kernels {
namespace {

absl::Status ValidateShapeAndOffsets(const char* op, const AttentionShape& s,
                                     absl::Span<const int64_t> cu) {
  RETURN_IF_ERROR(internal::CheckPositive(op, "heads", s.heads));
  RETURN_IF_ERROR(internal::CheckPositive(op, "head_dim", s.head_dim));
  RETURN_IF_ERROR(internal::CheckPositive(op, "query_block", s.query_block));
  if (!std::isfinite(s.softmax_scale)) {
    return internal::Invalid(op, "softmax_scale must be finite");
  }
  if (cu.empty()) return internal::Invalid(op, "cu_seqlens must have num_seqs + 1 >= 1 entries");
  if (cu[0] != 0) {
    return internal::Invalid(op, absl::StrCat("cu_seqlens[0] must be 0, got ", cu[0]));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return internal::Invalid(op, absl::StrCat("cu_seqlens must be non-decreasing: cu_seqlens[",
                                                i, "] = ", cu[i], " < cu_seqlens[", i - 1,
                                                "] = ", cu[i - 1]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckWorkspace(const char* op, const void* ws, size_t have, size_t need) {
  if (have >= need && (need == 0 || ws != nullptr)) return absl::OkStatus();
  return internal::Invalid(op, absl::StrCat("workspace has ", have,
                                            " bytes, the shape needs ", need));
}

}  // namespace

int64_t MaxSeqLen(absl::Span<const int64_t> cu) {
  int64_t m = 0;
  for (size_t i = 1; i < cu.size(); ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

size_t AttentionFwdWorkspaceBytes(const AttentionShape& s, int64_t max_seqlen) {
  if (max_seqlen <= 0 || s.heads <= 0 || s.query_block <= 0) return 0;
  const int64_t qb = std::min(s.query_block, max_seqlen);
  return static_cast<size_t>(s.heads) * qb * max_seqlen * sizeof(float);
}

size_t AttentionBwdWorkspaceBytes(const AttentionShape& s, int64_t max_seqlen) {
  // P and dP/dS for one query block of every head.
  return 2 * AttentionFwdWorkspaceBytes(s, max_seqlen);
}

double AttentionFwdFlops(const AttentionShape& s, absl::Span<const int64_t> cu) {
  double flops = 0;
  for (size_t i = 1; i < cu.size(); ++i) {
    const double len = static_cast<double>(cu[i] - cu[i - 1]);
    flops += 2.0 * s.head_dim * len * (len + 1.0);  // two GEMMs over L (L + 1) / 2 pairs
  }
  return flops * s.heads;
}

double AttentionBwdFlops(const AttentionShape& s, absl::Span<const int64_t> cu) {
  return 2.0 * AttentionFwdFlops(s, cu);  // four GEMMs: dV, dP, dQ, dK
}

float ResolvedSoftmaxScale(const AttentionShape& s) {
  if (s.softmax_scale != 0.0f) return s.softmax_scale;
  return 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

absl::Status ValidateAttentionFwdArgs(const char* op, const AttentionFwdArgs& a) {
  RETURN_IF_ERROR(ValidateShapeAndOffsets(op, a.shape, a.cu_seqlens));
  if (a.cu_seqlens.back() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "tokens", a.cu_seqlens.back()));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "qkv", a.qkv));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "out", a.out));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "lse", a.lse));
  return CheckWorkspace(op, a.workspace, a.workspace_bytes,
                        AttentionFwdWorkspaceBytes(a.shape, MaxSeqLen(a.cu_seqlens)));
}

absl::Status ValidateAttentionBwdArgs(const char* op, const AttentionBwdArgs& a) {
  RETURN_IF_ERROR(ValidateShapeAndOffsets(op, a.shape, a.cu_seqlens));
  if (a.cu_seqlens.back() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckFitsInt32(op, "tokens", a.cu_seqlens.back()));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "qkv", a.qkv));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "out", a.out));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dout", a.dout));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "lse", a.lse));
  RETURN_IF_ERROR(internal::CheckNotNull(op, "dqkv", a.dqkv));
  return CheckWorkspace(op, a.workspace, a.workspace_bytes,
                        AttentionBwdWorkspaceBytes(a.shape, MaxSeqLen(a.cu_seqlens)));
}

absl::StatusOr<AttentionFwdRefResult> AttentionFwdRef(const AttentionShape& shape,
                                                      absl::Span<const int64_t> cu,
                                                      absl::Span<const double> qkv) {
  constexpr char kOp[] = "AttentionFwdRef";
  RETURN_IF_ERROR(ValidateShapeAndOffsets(kOp, shape, cu));
  const int64_t tokens = cu.back();
  const int64_t heads = shape.heads, dim = shape.head_dim, hd = heads * dim, ld = 3 * hd;
  RETURN_IF_ERROR(internal::CheckSize(kOp, "qkv", qkv, tokens * ld));
  const double scale = ResolvedSoftmaxScale(shape);

  AttentionFwdRefResult r;
  r.out.assign(tokens * hd, 0.0);
  r.lse.assign(tokens * heads, 0.0);
  std::vector<double> p;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t t0 = cu[s], len = cu[s + 1] - cu[s];
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const double* q = &qkv[(t0 + i) * ld + h * dim];
        p.assign(i + 1, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[(t0 + j) * ld + hd + h * dim];
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += q[d] * k[d];
          p[j] = scale * dot;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        r.lse[(t0 + i) * heads + h] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          const double w = std::exp(p[j] - mx) / sum;
          const double* v = &qkv[(t0 + j) * ld + 2 * hd + h * dim];
          for (int64_t d = 0; d < dim; ++d) r.out[(t0 + i) * hd + h * dim + d] += w * v[d];
        }
      }
    }
  }
  return r;
}

absl::StatusOr<std::vector<double>> AttentionBwdRef(const AttentionShape& shape,
                                                    absl::Span<const int64_t> cu,
                                                    absl::Span<const double> qkv,
                                                    absl::Span<const double> dout) {
  constexpr char kOp[] = "AttentionBwdRef";
  RETURN_IF_ERROR(ValidateShapeAndOffsets(kOp, shape, cu));
  const int64_t tokens = cu.back();
  const int64_t heads = shape.heads, dim = shape.head_dim, hd = heads * dim, ld = 3 * hd;
  RETURN_IF_ERROR(internal::CheckSize(kOp, "qkv", qkv, tokens * ld));
  RETURN_IF_ERROR(internal::CheckSize(kOp, "dout", dout, tokens * hd));
  const double scale = ResolvedSoftmaxScale(shape);

  std::vector<double> dqkv(tokens * ld, 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t t0 = cu[s], len = cu[s + 1] - cu[s];
    auto Q = [&](int64_t i, int64_t d) { return qkv[(t0 + i) * ld + 0 * hd + d]; };
    auto K = [&](int64_t i, int64_t d) { return qkv[(t0 + i) * ld + 1 * hd + d]; };
    auto V = [&](int64_t i, int64_t d) { return qkv[(t0 + i) * ld + 2 * hd + d]; };
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t c = h * dim;
      // P (lower triangle, zeros above) and dP = dO V^T.
      std::vector<double> P(len * len, 0.0), dP(len * len, 0.0);
      for (int64_t i = 0; i < len; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += Q(i, c + d) * K(j, c + d);
          P[i * len + j] = scale * dot;
          mx = std::max(mx, P[i * len + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * len + j] - mx);
        for (int64_t j = 0; j <= i; ++j) P[i * len + j] = std::exp(P[i * len + j] - mx) / sum;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += dout[(t0 + i) * hd + c + d] * V(j, c + d);
          dP[i * len + j] = dot;
        }
      }
      for (int64_t i = 0; i < len; ++i) {
        double row = 0;
        for (int64_t j = 0; j <= i; ++j) row += P[i * len + j] * dP[i * len + j];
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = P[i * len + j] * (dP[i * len + j] - row);
          const double pij = P[i * len + j];
          for (int64_t d = 0; d < dim; ++d) {
            dqkv[(t0 + i) * ld + 0 * hd + c + d] += scale * ds * K(j, c + d);   // dQ
            dqkv[(t0 + j) * ld + 1 * hd + c + d] += scale * ds * Q(i, c + d);   // dK
            dqkv[(t0 + j) * ld + 2 * hd + c + d] += pij * dout[(t0 + i) * hd + c + d];  // dV
          }
        }
      }
    }
  }
  return dqkv;
}

}  // namespace spgate::kernels
