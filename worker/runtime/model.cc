// Model shape validation, the parameter layout and the deterministic initialisation.
#include "worker/runtime/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/split_mix.h"

namespace spgate::runtime {
namespace {

// Uniform in [-1, 1), a pure function of its arguments.
float Uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed ^ (a << 40)) ^ b) + c);
  return static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

constexpr int kMaxDim = 1 << 20;

}  // namespace

absl::Status ValidateModelShape(const ModelShape& s, int tp) {
  auto range = [](const char* flag, int v, int lo, int hi) -> absl::Status {
    if (v >= lo && v <= hi) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", v, " is out of range [", lo, ", ", hi, "]"));
  };
  if (absl::Status st = range("tp", tp, 1, 4096); !st.ok()) return st;
  if (absl::Status st = range("layers", s.layers, 1, 1024); !st.ok()) return st;
  if (absl::Status st = range("hidden", s.hidden, 1, kMaxDim); !st.ok()) return st;
  if (absl::Status st = range("heads", s.heads, 1, kMaxDim); !st.ok()) return st;
  if (absl::Status st = range("ffn_hidden", s.ffn_hidden, 1, kMaxDim); !st.ok()) return st;
  if (s.hidden % s.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden=", s.hidden,
                                                   " is not divisible by --heads=", s.heads));
  }
  if (s.heads % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heads=", s.heads, " is not divisible by --tp=", tp,
                     " (each TP rank runs whole heads)"));
  }
  if (s.ffn_hidden % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ffn_hidden=", s.ffn_hidden, " is not divisible by --tp=", tp));
  }
  return absl::OkStatus();
}

std::string_view NormBoundaryName(NormBoundary boundary) {
  return boundary == NormBoundary::kShard ? "shard" : "gather";
}

float ParamInitValue(uint64_t seed, const ModelShape& shape, int layer, ParamTensor tensor,
                     int64_t row, int64_t col) {
  const uint64_t key = (static_cast<uint64_t>(layer) << 8) | static_cast<uint64_t>(tensor);
  const float u = Uniform(seed, key, static_cast<uint64_t>(row), static_cast<uint64_t>(col));
  switch (tensor) {
    case ParamTensor::kLn1Gamma:
    case ParamTensor::kLn2Gamma:
      return 1.0f + 0.1f * u;
    case ParamTensor::kLn1Beta:
    case ParamTensor::kLn2Beta:
    case ParamTensor::kQkvBias:
    case ParamTensor::kProjBias:
    case ParamTensor::kFc1Bias:
    case ParamTensor::kFc2Bias:
      return 0.1f * u;
    case ParamTensor::kQkvWeight:
    case ParamTensor::kProjWeight:
    case ParamTensor::kFc1Weight:
      return u * static_cast<float>(std::sqrt(3.0 / shape.hidden));
    case ParamTensor::kFc2Weight:
      return u * static_cast<float>(std::sqrt(3.0 / shape.ffn_hidden));
  }
  return 0.0f;
}

float InputValue(uint64_t seed, int64_t token, int64_t col) {
  return Uniform(seed, 0xfeed, static_cast<uint64_t>(token), static_cast<uint64_t>(col));
}

float OutputGradValue(uint64_t seed, int64_t token, int64_t col, int64_t real_tokens) {
  return Uniform(seed, 0xbeef, static_cast<uint64_t>(token), static_cast<uint64_t>(col)) /
         static_cast<float>(real_tokens);
}

ParamLayout::ParamLayout(const ModelShape& s, int tp)
    : layers_(s.layers),
      hidden_(s.hidden),
      heads_local_(s.heads / tp),
      head_dim_(s.hidden / s.heads),
      hidden_local_(s.hidden / s.heads * (s.heads / tp)),
      ffn_local_(s.ffn_hidden / tp) {}

int64_t ParamLayout::sharded_per_layer() const {
  const int64_t h = hidden_, hl = hidden_local_, fl = ffn_local_;
  return 3 * hl * h + 3 * hl + h * hl + fl * h + fl + h * fl;
}

LayerParamOffsets ParamLayout::Layer(int layer) const {
  LayerParamOffsets o;
  const int64_t h = hidden_;
  int64_t r = layer * replicated_per_layer();
  o.ln1_gamma = r;
  o.ln1_beta = r + h;
  o.proj_bias = r + 2 * h;
  o.ln2_gamma = r + 3 * h;
  o.ln2_beta = r + 4 * h;
  o.fc2_bias = r + 5 * h;
  int64_t s = replicated_total() + layer * sharded_per_layer();
  o.qkv_weight = s;
  s += 3 * hidden_local_ * h;
  o.qkv_bias = s;
  s += 3 * hidden_local_;
  o.proj_weight = s;
  s += h * hidden_local_;
  o.fc1_weight = s;
  s += ffn_local_ * h;
  o.fc1_bias = s;
  s += ffn_local_;
  o.fc2_weight = s;
  return o;
}

}  // namespace spgate::runtime
