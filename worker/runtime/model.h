// The reference model's shape and parameters: L pre-LN GPT blocks
//   s1 = x + residual; a = LN1(s1); qkv = a Wqkv^T + bqkv (column-parallel);
//   o = causal varlen attention(qkv) on the local heads; p = o Wproj^T (row-parallel) + bproj;
//   s2 = p + s1; b = LN2(s2); g = GeLU(b W1^T + b1) (column-parallel);
//   z = g W2^T (row-parallel) + b2;  the next block gets (x = z, residual = s2);
//   output = z + s2 of the last block.
// Parameters are a deterministic function of (seed, layer, tensor, index in the full,
// unsharded tensor), so every TP rank initialises exactly its own shard and a
// single-rank reference can build the full tensors - no weight broadcast needed.
//
// Per-rank parameter memory is laid out as one buffer: first the replicated parameters
// of every layer (LN gammas and betas, the row-parallel output biases; docs/design.md §4's
// "replicated parameters that act on sequence-sharded activations"), then each layer's
// sharded ones. One SUM all-reduce over the replicated prefix finishes a TP group's
// gradients.
//
// Usage:
//   ModelShape shape{.layers = 2, .hidden = 128, .heads = 4, .ffn_hidden = 512};
//   RETURN_IF_ERROR(ValidateModelShape(shape, /*tp=*/2));
//   ParamLayout layout(shape, /*tp=*/2);
//   float w = ParamInitValue(seed, shape, /*layer=*/0, ParamTensor::kQkvWeight, row, col);
#ifndef SPGATE_WORKER_RUNTIME_MODEL_H_
#define SPGATE_WORKER_RUNTIME_MODEL_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace spgate::runtime {

struct ModelShape {
  int layers = 2;
  int hidden = 128;
  int heads = 4;
  int ffn_hidden = 512;
};

// INVALID_ARGUMENT naming the flag (--layers, --hidden, --heads, --ffn_hidden, --tp) when
// a size is out of range or the shape cannot be split over tp ranks.
absl::Status ValidateModelShape(const ModelShape& shape, int tp);

// Where LayerNorm runs under SP: inside the shard (exact, no communication) or, the
// legacy path kept to measure norm stalls, on the all-gathered full sequence.
enum class NormBoundary : uint8_t { kShard, kGather };
std::string_view NormBoundaryName(NormBoundary boundary);  // "shard" / "gather"

enum class ParamTensor : uint8_t {
  kLn1Gamma, kLn1Beta, kQkvWeight, kQkvBias, kProjWeight, kProjBias,
  kLn2Gamma, kLn2Beta, kFc1Weight, kFc1Bias, kFc2Weight, kFc2Bias,
};

// Full (unsharded) shapes: Wqkv [3H, H] (rows: Q heads, then K, then V), bqkv [3H],
// Wproj [H, H], bproj [H], W1 [F, H], b1 [F], W2 [H, F], b2 [H], LN vectors [H].
// Vectors use col = 0.
float ParamInitValue(uint64_t seed, const ModelShape& shape, int layer, ParamTensor tensor,
                     int64_t row, int64_t col);

// The layer input ("embedding output") of token `token` of a batch and the gradient of
// the loss with respect to the model output (a mean over the batch's real tokens, so
// gradients stay O(1) whatever the batch size).
float InputValue(uint64_t seed, int64_t token, int64_t col);
float OutputGradValue(uint64_t seed, int64_t token, int64_t col, int64_t real_tokens);

// Offsets (in floats) of one rank's parameters in its parameter buffer.
struct LayerParamOffsets {
  int64_t ln1_gamma, ln1_beta, proj_bias, ln2_gamma, ln2_beta, fc2_bias;  // replicated
  int64_t qkv_weight, qkv_bias, proj_weight, fc1_weight, fc1_bias, fc2_weight;  // sharded
};

class ParamLayout {
 public:
  ParamLayout(const ModelShape& shape, int tp);

  int64_t hidden() const { return hidden_; }
  int64_t heads_local() const { return heads_local_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t hidden_local() const { return hidden_local_; }  // heads_local * head_dim
  int64_t ffn_local() const { return ffn_local_; }
  int64_t replicated_per_layer() const { return 6 * hidden_; }
  int64_t sharded_per_layer() const;
  int64_t replicated_total() const { return layers_ * replicated_per_layer(); }
  int64_t total() const { return layers_ * (replicated_per_layer() + sharded_per_layer()); }
  LayerParamOffsets Layer(int layer) const;

 private:
  int64_t layers_, hidden_, heads_local_, head_dim_, hidden_local_, ffn_local_;
};

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_MODEL_H_
