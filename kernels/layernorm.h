// Residual-add + LayerNorm, forward and backward: the CPU reference (`…Ref`,
// double precision, for tests), the CPU production path (`…Cpu`, what the CPU
// backend runs) and the CUDA launchers (no suffix; defined in
// spgate::kernels_cuda) side by side. Forward computes s = x + residual, writes s
// (the new residual stream) and y = (s - mean(s)) * rstd(s) * gamma + beta per
// row, saving mean and rstd = 1/sqrt(var + eps) for backward. The invariant that
// matters: LayerNorm is per token (per row), so a rank that holds a sequence
// shard of the rows computes exactly the rows the full LayerNorm would - no
// communication. Only dgamma/dbeta are sums over rows; under sequence parallelism
// each rank's are partial and the group sums them (docs/design.md §4).
//
// Layouts: activations row-major [rows = tokens, hidden]; gamma, beta, dgamma,
// dbeta [hidden] in fp32; mean, rstd [rows] in fp32. The GPU launchers take fp32
// or bf16 activations (bf16 storage, fp32 arithmetic).
//
// Usage (CPU; the GPU path takes the same args plus a stream):
//   LayerNormFwdArgs<float> f;
//   f.rows = tokens; f.hidden = hidden; f.eps = 1e-5f;
//   f.x = attn_out; f.residual = resid; f.gamma = g; f.beta = b;
//   f.residual_out = resid;            // in-place update of the residual stream
//   f.y = ln_out; f.mean = mean; f.rstd = rstd;
//   RETURN_IF_ERROR(LayerNormFwdCpu(f));
//   ...
//   LayerNormBwdArgs<float> b;
//   b.rows = tokens; b.hidden = hidden;
//   b.dy = d_ln_out; b.x = resid;      // the LayerNorm input = forward's residual_out
//   b.gamma = g; b.mean = mean; b.rstd = rstd;
//   b.dresidual = d_resid;             // gradient reaching s through the skip path
//   b.dx = d_attn_out;                 // = d(x) = d(residual): both addends of s
//   b.dgamma = dg; b.dbeta = db; b.accumulate_param_grads = true;
//   RETURN_IF_ERROR(LayerNormBwdCpu(b));
// On the GPU, backward also takes a workspace of LayerNormBwdWorkspaceBytes(rows,
// hidden) device bytes, so that dgamma/dbeta are reduced in a fixed order
// (bitwise deterministic run to run).
#ifndef SPGATE_KERNELS_LAYERNORM_H_
#define SPGATE_KERNELS_LAYERNORM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/common.h"

namespace spgate::kernels {

// Largest hidden size the GPU kernels hold in registers (one block per row).
inline constexpr int64_t kLayerNormMaxHiddenGpu = 32768;

template <typename T>
struct LayerNormFwdArgs {
  int64_t rows = 0;    // tokens; 0 is a valid no-op
  int64_t hidden = 0;  // > 0
  float eps = 1e-5f;
  const T* x = nullptr;          // [rows, hidden]
  const T* residual = nullptr;   // [rows, hidden], or null for a plain LayerNorm
  const float* gamma = nullptr;  // [hidden]
  const float* beta = nullptr;   // [hidden]
  // [rows, hidden] = x + residual, rounded to T; required when residual is set,
  // ignored otherwise. May alias x or residual (in-place residual stream).
  T* residual_out = nullptr;
  T* y = nullptr;       // [rows, hidden]; must not alias the inputs
  float* mean = nullptr;  // [rows]
  float* rstd = nullptr;  // [rows]
};

template <typename T>
struct LayerNormBwdArgs {
  int64_t rows = 0;
  int64_t hidden = 0;
  const T* dy = nullptr;  // [rows, hidden] gradient of y
  // [rows, hidden] the LayerNorm input: forward's residual_out when a residual
  // was fused, else forward's x.
  const T* x = nullptr;
  const float* gamma = nullptr;  // [hidden]
  const float* mean = nullptr;   // [rows], from forward
  const float* rstd = nullptr;   // [rows], from forward
  // [rows, hidden] gradient arriving at residual_out from the residual stream,
  // or null (plain LayerNorm, or the stream ends here).
  const T* dresidual = nullptr;
  // [rows, hidden] gradient of the LayerNorm input plus dresidual; with a fused
  // residual it is the gradient of both x and residual. Must not alias inputs.
  T* dx = nullptr;
  float* dgamma = nullptr;  // [hidden]
  float* dbeta = nullptr;   // [hidden]
  // false: dgamma/dbeta are overwritten; true: added to (gradient accumulation,
  // or summing a rank's micro-batches before the group all-reduce).
  bool accumulate_param_grads = false;
};

// ---------------------------------------------------------------- reference
// Straight loops in double: the oracle for tests, not for production. An empty
// `residual` / `dresidual` means none. residual_out is x when there is no
// residual.
struct LayerNormFwdRefResult {
  std::vector<double> residual_out, y, mean, rstd;
};
absl::StatusOr<LayerNormFwdRefResult> LayerNormFwdRef(
    int64_t rows, int64_t hidden, double eps, absl::Span<const double> x,
    absl::Span<const double> residual, absl::Span<const double> gamma,
    absl::Span<const double> beta);

struct LayerNormBwdRefResult {
  std::vector<double> dx, dgamma, dbeta;
};
absl::StatusOr<LayerNormBwdRefResult> LayerNormBwdRef(
    int64_t rows, int64_t hidden, absl::Span<const double> dy,
    absl::Span<const double> x, absl::Span<const double> gamma,
    absl::Span<const double> mean, absl::Span<const double> rstd,
    absl::Span<const double> dresidual);

// ---------------------------------------------------------------- CPU path
// Single-threaded, vectorised per row (the worker runs one rank per core).
absl::Status LayerNormFwdCpu(const LayerNormFwdArgs<float>& args);
absl::Status LayerNormBwdCpu(const LayerNormBwdArgs<float>& args);

// ---------------------------------------------------------------- CUDA
// Launchers (spgate::kernels_cuda). All pointers are device pointers; the work
// is enqueued on `stream` and errors name file:line of the failing CUDA call.
// hidden > kLayerNormMaxHiddenGpu answers UNIMPLEMENTED.
absl::Status LayerNormFwd(const LayerNormFwdArgs<float>& args, cudaStream_t stream);
absl::Status LayerNormFwd(const LayerNormFwdArgs<Bfloat16>& args, cudaStream_t stream);
absl::Status LayerNormBwd(const LayerNormBwdArgs<float>& args, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);
absl::Status LayerNormBwd(const LayerNormBwdArgs<Bfloat16>& args, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

// Device workspace LayerNormBwd needs (per-block partial dgamma/dbeta, fp32).
// A pure function of the shape, defined in spgate::kernels_ref so that memory
// accounting works without CUDA.
size_t LayerNormBwdWorkspaceBytes(int64_t rows, int64_t hidden);

// Shared validation (used by the CPU path and the launchers).
template <typename T>
absl::Status ValidateLayerNormFwdArgs(const char* op, const LayerNormFwdArgs<T>& a);
template <typename T>
absl::Status ValidateLayerNormBwdArgs(const char* op, const LayerNormBwdArgs<T>& a);

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_LAYERNORM_H_
