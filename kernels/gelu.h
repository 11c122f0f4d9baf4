// Bias + GeLU (tanh approximation), fused, forward and backward: the CPU
// reference (`…Ref`, double), the CPU production path (`…Cpu`) and the CUDA
// launchers (spgate::kernels_cuda, fp32 or bf16 storage) side by side. This is
// the MLP's activation after its first (column-parallel) GEMM, which is run
// without bias:
//   u = pre + bias[col],  y = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))
// Backward recomputes u from the saved pre-activation (nothing else is saved):
//   dpre = dy * gelu'(u),  dbias (+)= sum over rows of dpre.
// The invariant that matters: the op is elementwise except dbias, so any shard
// of rows computes exactly its rows; dbias of the shards adds up to the full one.
//
// Layouts: pre, y, dy, dpre row-major [rows = tokens, cols]; bias, dbias [cols],
// fp32. y may alias pre and dpre may alias dy (elementwise, same index).
//
// Usage (CPU; the GPU path takes the same args plus a stream, and backward a
// device workspace of GeluBwdWorkspaceBytes(rows, cols) bytes):
//   GeluFwdArgs<float> f{.rows = tokens, .cols = ffn, .pre = h, .bias = b1, .y = act};
//   RETURN_IF_ERROR(GeluFwdCpu(f));
//   GeluBwdArgs<float> g{.rows = tokens, .cols = ffn, .dy = dact, .pre = h,
//                        .bias = b1, .dpre = dh, .dbias = db1};
//   RETURN_IF_ERROR(GeluBwdCpu(g));
#ifndef SPGATE_KERNELS_GELU_H_
#define SPGATE_KERNELS_GELU_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/common.h"

namespace spgate::kernels {

// The tanh form's constants, sqrt(2/pi) and the cubic term's coefficient: the CPU
// reference uses them as they are, the CPU path and the CUDA kernels as floats.
inline constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluCubic = 0.044715;

template <typename T>
struct GeluFwdArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  const T* pre = nullptr;       // [rows, cols] pre-activation (GEMM output, no bias)
  const float* bias = nullptr;  // [cols], or null for a plain GeLU
  T* y = nullptr;               // [rows, cols]
};

template <typename T>
struct GeluBwdArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  const T* dy = nullptr;        // [rows, cols]
  const T* pre = nullptr;       // [rows, cols], as given to forward
  const float* bias = nullptr;  // [cols], or null
  T* dpre = nullptr;            // [rows, cols]
  float* dbias = nullptr;       // [cols], or null to skip the bias gradient
  bool accumulate_bias_grad = false;  // dbias += instead of dbias =
};

// ---------------------------------------------------------------- reference
double GeluTanhRef(double u);
double GeluTanhGradRef(double u);  // d gelu / du
// An empty bias means none.
absl::StatusOr<std::vector<double>> GeluFwdRef(int64_t rows, int64_t cols,
                                               absl::Span<const double> pre,
                                               absl::Span<const double> bias);
struct GeluBwdRefResult {
  std::vector<double> dpre, dbias;
};
absl::StatusOr<GeluBwdRefResult> GeluBwdRef(int64_t rows, int64_t cols,
                                            absl::Span<const double> dy,
                                            absl::Span<const double> pre,
                                            absl::Span<const double> bias);

// ---------------------------------------------------------------- CPU path
absl::Status GeluFwdCpu(const GeluFwdArgs<float>& args);
absl::Status GeluBwdCpu(const GeluBwdArgs<float>& args);

// ---------------------------------------------------------------- CUDA
absl::Status GeluFwd(const GeluFwdArgs<float>& args, cudaStream_t stream);
absl::Status GeluFwd(const GeluFwdArgs<Bfloat16>& args, cudaStream_t stream);
// workspace: GeluBwdWorkspaceBytes(rows, cols) device bytes (may be null when
// dbias is null).
absl::Status GeluBwd(const GeluBwdArgs<float>& args, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);
absl::Status GeluBwd(const GeluBwdArgs<Bfloat16>& args, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);

size_t GeluBwdWorkspaceBytes(int64_t rows, int64_t cols);

template <typename T>
absl::Status ValidateGeluFwdArgs(const char* op, const GeluFwdArgs<T>& a);
template <typename T>
absl::Status ValidateGeluBwdArgs(const char* op, const GeluBwdArgs<T>& a);

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_GELU_H_
