// Private: the Linear layer's three products as row-major GEMMs, with the
// argument checks the CPU path (gemm_cpu.cc) and the cuBLAS launchers (gemm.cu)
// share, so the two differ only in the GEMM they issue. Each function validates
// `a` (errors name `op`) and returns the GemmArgs to run, or std::nullopt when
// there is nothing to do (no rows, where the product is then a no-op).
#ifndef SPGATE_KERNELS_INTERNAL_LINEAR_ARGS_H_
#define SPGATE_KERNELS_INTERNAL_LINEAR_ARGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "kernels/gemm.h"

namespace spgate::kernels::internal {

// y[rows, out] = x[rows, in] W^T (the bias is the caller's). nullopt: rows == 0.
absl::StatusOr<std::optional<GemmArgs>> LinearFwdGemm(const char* op,
                                                      const LinearFwdArgs& a);
// dx[rows, in] (+)= dy[rows, out] W. nullopt: rows == 0.
absl::StatusOr<std::optional<GemmArgs>> LinearBwdDataGemm(const char* op,
                                                          const LinearBwdDataArgs& a);
// dW[out, in] (+)= dy^T x; always a GEMM (k == rows == 0 leaves beta * dW).
// dbias is neither checked nor mapped (the caller's column sum).
absl::StatusOr<GemmArgs> LinearBwdWeightGemm(const char* op, const LinearBwdWeightArgs& a);

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_LINEAR_ARGS_H_
