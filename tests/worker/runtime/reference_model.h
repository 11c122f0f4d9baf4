// The single-rank reference for the worker's transformer stack: the whole model (all
// heads, full weights from ParamInitValue) forward and backward in double precision,
// composed from the kernels' …Ref functions, which are independent of the CPU and GPU
// production paths the stack runs. Also maps its full gradients onto a TP rank's shard
// in the stack's parameter layout, so a rank's gradients compare element by element.
#ifndef SPGATE_TESTS_WORKER_RUNTIME_REFERENCE_MODEL_H_
#define SPGATE_TESTS_WORKER_RUNTIME_REFERENCE_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/runtime/model.h"

namespace spgate::runtime::reference {

struct ReferenceResult {
  std::vector<double> output;      // [tokens, hidden]
  std::vector<double> input_grad;  // [tokens, hidden]
  // Full-tensor gradients per layer, indexed by ParamTensor.
  std::vector<std::vector<std::vector<double>>> grads;  // [layer][tensor][...]
};

absl::StatusOr<ReferenceResult> RunReference(const ModelShape& shape, uint64_t param_seed,
                                             const std::vector<int64_t>& lengths,
                                             uint64_t data_seed);

// `grads` (full, per layer and tensor) as TP rank `rank` of `tp` holds them in its
// gradient buffer (ParamLayout order).
std::vector<double> ShardGrads(const ModelShape& shape, int tp, int rank,
                               const std::vector<std::vector<std::vector<double>>>& grads);

// Element-wise a += scale * b over matching nested vectors.
void AddScaled(std::vector<std::vector<std::vector<double>>>& a,
               const std::vector<std::vector<std::vector<double>>>& b, double scale);

}  // namespace spgate::runtime::reference

#endif  // SPGATE_TESTS_WORKER_RUNTIME_REFERENCE_MODEL_H_
