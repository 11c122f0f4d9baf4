// The double-precision single-rank reference model.
#include "tests/worker/runtime/reference_model.h"

#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "common/status_macros.h"

namespace spgate::runtime::reference {
namespace {

constexpr int kTensors = 12;
int T(ParamTensor t) { return static_cast<int>(t); }

std::vector<double> Full(const ModelShape& s, uint64_t seed, int layer, ParamTensor t,
                         int64_t rows, int64_t cols) {
  std::vector<double> v(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      v[i * cols + c] = ParamInitValue(seed, s, layer, t, i, cols == 1 ? 0 : c);
    }
  }
  return v;
}

struct LayerParams {
  std::vector<double> ln1_g, ln1_b, wqkv, bqkv, wproj, bproj, ln2_g, ln2_b, w1, b1, w2, b2;
};

struct LayerActs {
  std::vector<double> s1, mean1, rstd1, a, qkv, o, s2, mean2, rstd2, b, f, g;
};

}  // namespace

absl::StatusOr<ReferenceResult> RunReference(const ModelShape& s, uint64_t seed,
                                             const std::vector<int64_t>& lengths,
                                             uint64_t data_seed) {
  const int64_t h = s.hidden, ffn = s.ffn_hidden;
  std::vector<int64_t> cu = {0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  const int64_t tokens = cu.back();
  const kernels::AttentionShape attn{.heads = s.heads, .head_dim = h / s.heads};

  std::vector<LayerParams> p(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    p[l].ln1_g = Full(s, seed, l, ParamTensor::kLn1Gamma, h, 1);
    p[l].ln1_b = Full(s, seed, l, ParamTensor::kLn1Beta, h, 1);
    p[l].wqkv = Full(s, seed, l, ParamTensor::kQkvWeight, 3 * h, h);
    p[l].bqkv = Full(s, seed, l, ParamTensor::kQkvBias, 3 * h, 1);
    p[l].wproj = Full(s, seed, l, ParamTensor::kProjWeight, h, h);
    p[l].bproj = Full(s, seed, l, ParamTensor::kProjBias, h, 1);
    p[l].ln2_g = Full(s, seed, l, ParamTensor::kLn2Gamma, h, 1);
    p[l].ln2_b = Full(s, seed, l, ParamTensor::kLn2Beta, h, 1);
    p[l].w1 = Full(s, seed, l, ParamTensor::kFc1Weight, ffn, h);
    p[l].b1 = Full(s, seed, l, ParamTensor::kFc1Bias, ffn, 1);
    p[l].w2 = Full(s, seed, l, ParamTensor::kFc2Weight, h, ffn);
    p[l].b2 = Full(s, seed, l, ParamTensor::kFc2Bias, h, 1);
  }
  std::vector<double> x(tokens * h);
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t c = 0; c < h; ++c) x[i * h + c] = InputValue(data_seed, i, c);
  }

  std::vector<LayerActs> acts(s.layers);
  std::vector<double> residual;  // empty for the first block
  for (int l = 0; l < s.layers; ++l) {
    LayerActs& A = acts[l];
    ASSIGN_OR_RETURN(auto ln1, kernels::LayerNormFwdRef(tokens, h, 1e-5, x, residual,
                                                        p[l].ln1_g, p[l].ln1_b));
    A.s1 = ln1.residual_out;
    A.mean1 = ln1.mean;
    A.rstd1 = ln1.rstd;
    A.a = ln1.y;
    ASSIGN_OR_RETURN(A.qkv, kernels::LinearFwdRef({tokens, h, 3 * h}, A.a, p[l].wqkv, p[l].bqkv));
    ASSIGN_OR_RETURN(auto at, kernels::AttentionFwdRef(attn, cu, A.qkv));
    A.o = at.out;
    ASSIGN_OR_RETURN(auto proj, kernels::LinearFwdRef({tokens, h, h}, A.o, p[l].wproj, p[l].bproj));
    ASSIGN_OR_RETURN(auto ln2, kernels::LayerNormFwdRef(tokens, h, 1e-5, proj, A.s1,
                                                        p[l].ln2_g, p[l].ln2_b));
    A.s2 = ln2.residual_out;
    A.mean2 = ln2.mean;
    A.rstd2 = ln2.rstd;
    A.b = ln2.y;
    ASSIGN_OR_RETURN(A.f, kernels::LinearFwdRef({tokens, h, ffn}, A.b, p[l].w1, {}));
    ASSIGN_OR_RETURN(A.g, kernels::GeluFwdRef(tokens, ffn, A.f, p[l].b1));
    ASSIGN_OR_RETURN(x, kernels::LinearFwdRef({tokens, ffn, h}, A.g, p[l].w2, p[l].b2));
    residual = A.s2;
  }
  ReferenceResult r;
  r.output.resize(tokens * h);
  for (int64_t i = 0; i < tokens * h; ++i) r.output[i] = x[i] + residual[i];

  std::vector<double> gz(tokens * h);
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t c = 0; c < h; ++c) gz[i * h + c] = OutputGradValue(data_seed, i, c, tokens);
  }
  r.grads.assign(s.layers, std::vector<std::vector<double>>(kTensors));
  for (int l = s.layers - 1; l >= 0; --l) {
    LayerActs& A = acts[l];
    auto& G = r.grads[l];
    ASSIGN_OR_RETURN(auto fc2, kernels::LinearBwdRef({tokens, ffn, h}, gz, A.g, p[l].w2));
    G[T(ParamTensor::kFc2Weight)] = fc2.dweight;
    G[T(ParamTensor::kFc2Bias)] = fc2.dbias;
    ASSIGN_OR_RETURN(auto gelu, kernels::GeluBwdRef(tokens, ffn, fc2.dx, A.f, p[l].b1));
    G[T(ParamTensor::kFc1Bias)] = gelu.dbias;
    ASSIGN_OR_RETURN(auto fc1, kernels::LinearBwdRef({tokens, h, ffn}, gelu.dpre, A.b, p[l].w1));
    G[T(ParamTensor::kFc1Weight)] = fc1.dweight;
    ASSIGN_OR_RETURN(auto ln2, kernels::LayerNormBwdRef(tokens, h, fc1.dx, A.s2, p[l].ln2_g,
                                                        A.mean2, A.rstd2, gz));
    G[T(ParamTensor::kLn2Gamma)] = ln2.dgamma;
    G[T(ParamTensor::kLn2Beta)] = ln2.dbeta;
    ASSIGN_OR_RETURN(auto proj, kernels::LinearBwdRef({tokens, h, h}, ln2.dx, A.o, p[l].wproj));
    G[T(ParamTensor::kProjWeight)] = proj.dweight;
    G[T(ParamTensor::kProjBias)] = proj.dbias;
    ASSIGN_OR_RETURN(auto dqkv, kernels::AttentionBwdRef(attn, cu, A.qkv, proj.dx));
    ASSIGN_OR_RETURN(auto qkv, kernels::LinearBwdRef({tokens, h, 3 * h}, dqkv, A.a, p[l].wqkv));
    G[T(ParamTensor::kQkvWeight)] = qkv.dweight;
    G[T(ParamTensor::kQkvBias)] = qkv.dbias;
    ASSIGN_OR_RETURN(auto ln1, kernels::LayerNormBwdRef(tokens, h, qkv.dx, A.s1, p[l].ln1_g,
                                                        A.mean1, A.rstd1, ln2.dx));
    G[T(ParamTensor::kLn1Gamma)] = ln1.dgamma;
    G[T(ParamTensor::kLn1Beta)] = ln1.dbeta;
    gz = ln1.dx;
  }
  r.input_grad = gz;
  return r;
}

std::vector<double> ShardGrads(const ModelShape& s, int tp, int rank,
                               const std::vector<std::vector<std::vector<double>>>& grads) {
  const ParamLayout layout(s, tp);
  const int64_t h = layout.hidden(), hl = layout.hidden_local(), fl = layout.ffn_local();
  const int64_t ffn = s.ffn_hidden;
  std::vector<double> out(layout.total());
  for (int l = 0; l < s.layers; ++l) {
    const auto& G = grads[l];
    const LayerParamOffsets o = layout.Layer(l);
    for (int64_t i = 0; i < h; ++i) {
      out[o.ln1_gamma + i] = G[T(ParamTensor::kLn1Gamma)][i];
      out[o.ln1_beta + i] = G[T(ParamTensor::kLn1Beta)][i];
      out[o.proj_bias + i] = G[T(ParamTensor::kProjBias)][i];
      out[o.ln2_gamma + i] = G[T(ParamTensor::kLn2Gamma)][i];
      out[o.ln2_beta + i] = G[T(ParamTensor::kLn2Beta)][i];
      out[o.fc2_bias + i] = G[T(ParamTensor::kFc2Bias)][i];
    }
    for (int64_t j = 0; j < 3 * hl; ++j) {
      const int64_t row = (j / hl) * h + rank * hl + j % hl;
      out[o.qkv_bias + j] = G[T(ParamTensor::kQkvBias)][row];
      for (int64_t c = 0; c < h; ++c) {
        out[o.qkv_weight + j * h + c] = G[T(ParamTensor::kQkvWeight)][row * h + c];
      }
    }
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t c = 0; c < hl; ++c) {
        out[o.proj_weight + i * hl + c] = G[T(ParamTensor::kProjWeight)][i * h + rank * hl + c];
      }
      for (int64_t c = 0; c < fl; ++c) {
        out[o.fc2_weight + i * fl + c] = G[T(ParamTensor::kFc2Weight)][i * ffn + rank * fl + c];
      }
    }
    for (int64_t j = 0; j < fl; ++j) {
      out[o.fc1_bias + j] = G[T(ParamTensor::kFc1Bias)][rank * fl + j];
      for (int64_t c = 0; c < h; ++c) {
        out[o.fc1_weight + j * h + c] = G[T(ParamTensor::kFc1Weight)][(rank * fl + j) * h + c];
      }
    }
  }
  return out;
}

void AddScaled(std::vector<std::vector<std::vector<double>>>& a,
               const std::vector<std::vector<std::vector<double>>>& b, double scale) {
  for (size_t l = 0; l < a.size(); ++l) {
    for (size_t t = 0; t < a[l].size(); ++t) {
      for (size_t i = 0; i < a[l][t].size(); ++i) a[l][t][i] += scale * b[l][t][i];
    }
  }
}

}  // namespace spgate::runtime::reference
