// Causal self-attention over packed variable-length sequences, forward and
// backward, for the local subset of heads (a TP rank's heads): the CPU
// reference (`…Ref`, double), the CPU production path (`…Cpu`, OpenBLAS) and
// the CUDA launchers (spgate::kernels_cuda, cuBLAS + a fused scale-mask-softmax
// kernel) side by side. Sequences are packed back to back without padding and
// delimited by cumulative offsets cu_seqlens = {0, L0, L0 + L1, ...}. The
// invariant that matters: token t of sequence s attends only to tokens
// cu_seqlens[s] .. t (its own sequence, causally), so a packed batch gives each
// sequence exactly the output it would get alone, and padding costs nothing.
//
// Algorithm ("correct first"): per sequence and per block of `query_block`
// query rows, S = scale * Q K^T is materialised for the block (keys 0 .. last
// query of the block, so the causal upper triangle is skipped except inside the
// diagonal block), softmaxed in place with the mask, then O = P V. Forward saves
// only lse = log-sum-exp of each scaled, masked score row; backward recomputes P
// from Q, K and lse and uses delta_i = dO_i . O_i (so P is never stored across
// passes). Scratch is O(heads * query_block * max_seqlen) floats - quadratic in
// the sequence length up to query_block - and is passed in by the caller, sized
// by Attention{Fwd,Bwd}WorkspaceBytes, so the worker can account for it.
//
// Layouts (fp32):
//   qkv  [tokens, 3 * heads * head_dim]: columns [0, HD) are Q, [HD, 2HD) K,
//        [2HD, 3HD) V (HD = heads * head_dim); head h's slice of each block is
//        columns h * head_dim .. (h + 1) * head_dim - 1. This is the output of
//        the column-parallel QKV Linear when its weight rows are ordered so.
//   out  [tokens, heads * head_dim], head h at columns h * head_dim (the input
//        of the row-parallel output projection).
//   lse  [tokens, heads].
//   dqkv like qkv (overwritten), dout like out.
// cu_seqlens lives in host memory for the CPU and the GPU path alike (the GPU
// launcher loops over sequences on the host); empty sequences are allowed.
//
// Usage:
//   std::vector<int64_t> cu = {0, 512, 515, 4096};        // 3 sequences
//   AttentionShape shape{.heads = 8, .head_dim = 128};
//   std::vector<float> ws(AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu)) / 4);
//   AttentionFwdArgs f{.shape = shape, .cu_seqlens = cu, .qkv = qkv, .out = out,
//                      .lse = lse, .workspace = ws.data(),
//                      .workspace_bytes = ws.size() * 4};
//   RETURN_IF_ERROR(AttentionFwdCpu(f));
//   AttentionBwdArgs b{.shape = shape, .cu_seqlens = cu, .qkv = qkv, .out = out,
//                      .dout = dout, .lse = lse, .dqkv = dqkv, .workspace = ws.data(),
//                      .workspace_bytes = ws.size() * 4};
//   RETURN_IF_ERROR(AttentionBwdCpu(b));
//   // GPU: same args with device pointers (cu stays on the host), plus a
//   // cuBLAS handle and a stream: AttentionFwd(f, blas.get(), stream).
#ifndef SPGATE_KERNELS_ATTENTION_H_
#define SPGATE_KERNELS_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/common.h"

namespace spgate::kernels {

struct AttentionShape {
  int64_t heads = 0;     // local heads, > 0
  int64_t head_dim = 0;  // > 0
  // Multiplies Q K^T; 0 means 1 / sqrt(head_dim).
  float softmax_scale = 0.0f;
  // Query rows whose scores are materialised at once; bounds the scratch to
  // heads * query_block * max_seqlen floats. > 0.
  int64_t query_block = 1024;
};

struct AttentionFwdArgs {
  AttentionShape shape;
  absl::Span<const int64_t> cu_seqlens;  // host; num_seqs + 1 entries
  const float* qkv = nullptr;  // [tokens, 3 * heads * head_dim]
  float* out = nullptr;        // [tokens, heads * head_dim]
  float* lse = nullptr;        // [tokens, heads]
  void* workspace = nullptr;   // AttentionFwdWorkspaceBytes
  size_t workspace_bytes = 0;
};

struct AttentionBwdArgs {
  AttentionShape shape;
  absl::Span<const int64_t> cu_seqlens;  // host
  const float* qkv = nullptr;   // as given to forward
  const float* out = nullptr;   // forward's out
  const float* dout = nullptr;  // [tokens, heads * head_dim]
  const float* lse = nullptr;   // forward's lse
  float* dqkv = nullptr;        // [tokens, 3 * heads * head_dim], overwritten
  void* workspace = nullptr;    // AttentionBwdWorkspaceBytes
  size_t workspace_bytes = 0;
};

// Longest sequence in cu_seqlens (0 for none); the workspace functions take it.
int64_t MaxSeqLen(absl::Span<const int64_t> cu_seqlens);
size_t AttentionFwdWorkspaceBytes(const AttentionShape& shape, int64_t max_seqlen);
size_t AttentionBwdWorkspaceBytes(const AttentionShape& shape, int64_t max_seqlen);
// Useful FLOPs of the causal products (forward: Q K^T and P V over the lower
// triangle, 2 * head_dim * L (L + 1) per head and sequence; backward 2x that),
// the numerator of the benchmarks' FLOP/s.
double AttentionFwdFlops(const AttentionShape& shape, absl::Span<const int64_t> cu_seqlens);
double AttentionBwdFlops(const AttentionShape& shape, absl::Span<const int64_t> cu_seqlens);
float ResolvedSoftmaxScale(const AttentionShape& shape);

// ---------------------------------------------------------------- reference
// Full score matrices per sequence and head, in double; backward uses the
// textbook dS = P * (dP - rowsum(P * dP)), independent of the production
// paths' delta = dO . O shortcut.
struct AttentionFwdRefResult {
  std::vector<double> out, lse;
};
absl::StatusOr<AttentionFwdRefResult> AttentionFwdRef(const AttentionShape& shape,
                                                      absl::Span<const int64_t> cu_seqlens,
                                                      absl::Span<const double> qkv);
absl::StatusOr<std::vector<double>> AttentionBwdRef(const AttentionShape& shape,
                                                    absl::Span<const int64_t> cu_seqlens,
                                                    absl::Span<const double> qkv,
                                                    absl::Span<const double> dout);

// ---------------------------------------------------------------- CPU path
absl::Status AttentionFwdCpu(const AttentionFwdArgs& args);
absl::Status AttentionBwdCpu(const AttentionBwdArgs& args);

// ---------------------------------------------------------------- CUDA
// Device pointers except cu_seqlens; cuBLAS strided-batched GEMMs over heads,
// one (S, softmax, PV) triple per sequence and query block.
absl::Status AttentionFwd(const AttentionFwdArgs& args, cublasHandle_t blas,
                          cudaStream_t stream);
absl::Status AttentionBwd(const AttentionBwdArgs& args, cublasHandle_t blas,
                          cudaStream_t stream);

// Shared validation: shape, offsets (start at 0, non-decreasing), pointers and
// workspace size.
absl::Status ValidateAttentionFwdArgs(const char* op, const AttentionFwdArgs& a);
absl::Status ValidateAttentionBwdArgs(const char* op, const AttentionBwdArgs& a);

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_ATTENTION_H_
