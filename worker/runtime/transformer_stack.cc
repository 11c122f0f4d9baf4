// TransformerStack: the SP / TP-only block, forward and backward. Buffer lifetimes here
// are what memory_model.cc predicts; change one, change the other (the test
// tests/worker/runtime checks prediction against the arena's measured peak).
#include "worker/runtime/transformer_stack.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/runtime/batching.h"

namespace spgate::runtime {

namespace {
constexpr MemoryCategory kAct = MemoryCategory::kActivations;
constexpr MemoryCategory kWs = MemoryCategory::kWorkspace;
}  // namespace

BatchGeometry MakeBatchGeometry(std::span<const int64_t> lengths, Mode mode, int tp,
                                int tp_rank) {
  BatchGeometry g;
  g.cu_seqlens.reserve(lengths.size() + 2);
  g.cu_seqlens.push_back(0);
  for (int64_t len : lengths) {
    g.tokens += len;
    g.cu_seqlens.push_back(g.tokens);
  }
  if (mode == Mode::kSequenceParallel) {
    g.padded_tokens = SpPaddedTokens(g.tokens, tp);
    if (g.padded_tokens > g.tokens) g.cu_seqlens.push_back(g.padded_tokens);
    g.rows_local = g.padded_tokens / tp;
    g.row_offset = g.rows_local * tp_rank;
  } else {
    g.padded_tokens = g.tokens;
    g.rows_local = g.tokens;
    g.row_offset = 0;
  }
  return g;
}

BatchData MakeBatchData(std::span<const int64_t> lengths, uint64_t data_seed, int64_t hidden) {
  const int64_t tokens = TokenCount(lengths);
  BatchData d;
  d.input.resize(tokens * hidden);
  d.output_grad.resize(tokens * hidden);
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t c = 0; c < hidden; ++c) {
      d.input[i * hidden + c] = InputValue(data_seed, i, c);
      d.output_grad[i * hidden + c] = OutputGradValue(data_seed, i, c, tokens);
    }
  }
  return d;
}

// Activations one layer keeps from forward to backward. Under SP with the gather
// boundary, s1/s2 (the LayerNorm inputs) and their statistics are full-sequence.
struct TransformerStack::Activations {
  Buffer s1, mean1, rstd1, a;  // LN1 input (residual stream), stats, output
  Buffer qkv, o, lse;          // attention input, output, log-sum-exp
  Buffer s2, mean2, rstd2, b;  // LN2
  Buffer f, gout;              // FC1 output (GeLU input), GeLU output
};

struct TransformerStack::Step {
  BatchGeometry geo;
  bool sp = false;
  bool gather = false;  // SP with the legacy gather boundary
  int64_t r = 0;        // rows of the residual stream on this rank
  int64_t g = 0;        // rows of the GEMMs (the full padded sequence)
  int64_t off = 0;      // first local row
  float replicated_scale = 1.0f;  // 1 under SP, 1/t for full (TP-only) replicated grads
  kernels::AttentionShape attn;
  Buffer ones;  // [r] of 1.0: column sums as a GEMM
};

TransformerStack::TransformerStack(const StackOptions& options, MemoryArena* arena,
                                   Communicator* tp_comm)
    : options_(options),
      layout_(options.shape, options.tp),
      arena_(arena),
      device_(arena->device()),
      tp_comm_(tp_comm) {}

absl::StatusOr<std::unique_ptr<TransformerStack>> TransformerStack::Create(
    const StackOptions& options, MemoryArena* arena, Communicator* tp_comm) {
  RETURN_IF_ERROR(ValidateModelShape(options.shape, options.tp));
  if (tp_comm == nullptr || tp_comm->size() != options.tp ||
      tp_comm->rank() != options.tp_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransformerStack: the TP communicator must have ", options.tp,
                     " ranks with this one at ", options.tp_rank));
  }
  if (tp_comm->space() != arena->device()->space()) {
    return absl::InvalidArgumentError(
        "TransformerStack: the communicator and the device use different memory");
  }
  if (options.attention_query_block < 1) {
    return absl::InvalidArgumentError("TransformerStack: attention_query_block must be >= 1");
  }
  std::unique_ptr<TransformerStack> stack(new TransformerStack(options, arena, tp_comm));
  RETURN_IF_ERROR(stack->InitParams());
  return stack;
}

absl::Status TransformerStack::InitParams() {
  const ModelShape& shape = options_.shape;
  const int64_t h = layout_.hidden(), hl = layout_.hidden_local(), fl = layout_.ffn_local();
  const int64_t rank = options_.tp_rank;
  std::vector<float> host(layout_.total());
  const uint64_t seed = options_.param_seed;
  for (int l = 0; l < shape.layers; ++l) {
    const int layer = options_.layer_offset + l;  // its index in the whole model
    const LayerParamOffsets o = layout_.Layer(l);
    auto vec = [&](int64_t at, ParamTensor t, int64_t n, auto full_index) {
      for (int64_t i = 0; i < n; ++i) host[at + i] = ParamInitValue(seed, shape, layer, t, full_index(i), 0);
    };
    auto same = [](int64_t i) { return i; };
    vec(o.ln1_gamma, ParamTensor::kLn1Gamma, h, same);
    vec(o.ln1_beta, ParamTensor::kLn1Beta, h, same);
    vec(o.proj_bias, ParamTensor::kProjBias, h, same);
    vec(o.ln2_gamma, ParamTensor::kLn2Gamma, h, same);
    vec(o.ln2_beta, ParamTensor::kLn2Beta, h, same);
    vec(o.fc2_bias, ParamTensor::kFc2Bias, h, same);
    // QKV: local row j is block j / hl (Q, K, V) of this rank's heads.
    auto qkv_row = [&](int64_t j) { return (j / hl) * h + rank * hl + j % hl; };
    vec(o.qkv_bias, ParamTensor::kQkvBias, 3 * hl, qkv_row);
    for (int64_t j = 0; j < 3 * hl; ++j) {
      for (int64_t c = 0; c < h; ++c) {
        host[o.qkv_weight + j * h + c] =
            ParamInitValue(seed, shape, layer, ParamTensor::kQkvWeight, qkv_row(j), c);
      }
    }
    for (int64_t i = 0; i < h; ++i) {  // Wproj: this rank's block of columns
      for (int64_t c = 0; c < hl; ++c) {
        host[o.proj_weight + i * hl + c] =
            ParamInitValue(seed, shape, layer, ParamTensor::kProjWeight, i, rank * hl + c);
      }
    }
    vec(o.fc1_bias, ParamTensor::kFc1Bias, fl, [&](int64_t j) { return rank * fl + j; });
    for (int64_t j = 0; j < fl; ++j) {  // W1: this rank's block of rows
      for (int64_t c = 0; c < h; ++c) {
        host[o.fc1_weight + j * h + c] =
            ParamInitValue(seed, shape, layer, ParamTensor::kFc1Weight, rank * fl + j, c);
      }
    }
    for (int64_t i = 0; i < h; ++i) {  // W2: this rank's block of columns
      for (int64_t c = 0; c < fl; ++c) {
        host[o.fc2_weight + i * fl + c] =
            ParamInitValue(seed, shape, layer, ParamTensor::kFc2Weight, i, rank * fl + c);
      }
    }
  }
  ASSIGN_OR_RETURN(params_, arena_->Allocate(layout_.total(), MemoryCategory::kParameters));
  ASSIGN_OR_RETURN(grads_, arena_->Allocate(layout_.total(), MemoryCategory::kGradients));
  RETURN_IF_ERROR(device_->Upload(params_.data(), host.data(), layout_.total()));
  return ZeroGrads();
}

absl::Status TransformerStack::ZeroGrads() {
  return device_->Fill(grads_.data(), 0.0f, grads_.size());
}

absl::StatusOr<std::vector<float>> TransformerStack::DownloadGrads() const {
  std::vector<float> host(grads_.size());
  RETURN_IF_ERROR(device_->Download(host.data(), grads_.data(), grads_.size()));
  return host;
}

absl::StatusOr<std::vector<float>> TransformerStack::DownloadParams() const {
  std::vector<float> host(params_.size());
  RETURN_IF_ERROR(device_->Download(host.data(), params_.data(), params_.size()));
  return host;
}

absl::Status TransformerStack::FinishGradients(Communicator* dp_comm) {
  if (options_.tp > 1) {
    RETURN_IF_ERROR(tp_comm_->AllReduce(grads_.data(), layout_.replicated_total(),
                                        CollectivePurpose::kGradSync));
  }
  if (dp_comm != nullptr && dp_comm->size() > 1) {
    RETURN_IF_ERROR(dp_comm->AllReduce(grads_.data(), grads_.size(), CollectivePurpose::kGradSync));
    RETURN_IF_ERROR(device_->Scale(1.0f / dp_comm->size(), grads_.data(), grads_.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> TransformerStack::Gather(Step& st, const float* shard, int64_t cols,
                                                CollectivePurpose purpose) {
  ASSIGN_OR_RETURN(Buffer full, arena_->Allocate(st.g * cols, kWs));
  RETURN_IF_ERROR(tp_comm_->AllGather(shard, full.data(), st.r * cols, purpose));
  return full;
}

absl::StatusOr<Buffer> TransformerStack::ReduceOut(Step& st, Buffer partial, int64_t cols) {
  if (!st.sp) {
    if (options_.tp > 1) {
      RETURN_IF_ERROR(tp_comm_->AllReduce(partial.data(), st.g * cols, CollectivePurpose::kLayer));
    }
    return partial;
  }
  ASSIGN_OR_RETURN(Buffer shard, arena_->Allocate(st.r * cols, kWs));
  RETURN_IF_ERROR(tp_comm_->ReduceScatter(partial.data(), shard.data(), st.r * cols,
                                          CollectivePurpose::kLayer));
  return shard;
}

absl::Status TransformerStack::ColumnSum(Step& st, const float* x, int64_t rows, float alpha,
                                         float* acc) {
  const int64_t h = layout_.hidden();
  kernels::GemmArgs g;
  g.m = 1;
  g.n = h;
  g.k = rows;
  g.alpha = alpha;
  g.a = st.ones.data();
  g.lda = rows;
  g.b = x;
  g.ldb = h;
  g.beta = 1.0f;
  g.c = acc;
  g.ldc = h;
  return device_->Gemm(g);
}

// LN forward. Takes ownership of `x` (the sublayer output, or the stack input) and frees
// it; `residual` is this rank's rows of the stream (null for the first LayerNorm).
// Shard / TP-only: s = x + residual on the local rows. Gather: s is built on the local
// rows, all-gathered (the norm-boundary collective), normalised in full, and this
// rank's rows of y kept.
absl::Status TransformerStack::LayerNormForward(Step& st, const float* gamma,
                                                const float* beta, Buffer& x,
                                                const float* residual, Buffer& s, Buffer& mean,
                                                Buffer& rstd, Buffer& y) {
  const int64_t h = layout_.hidden();
  kernels::LayerNormFwdArgs<float> f;
  f.hidden = h;
  f.gamma = gamma;
  f.beta = beta;
  if (!st.gather) {
    f.rows = st.r;
    ASSIGN_OR_RETURN(mean, arena_->Allocate(st.r, kAct));
    ASSIGN_OR_RETURN(rstd, arena_->Allocate(st.r, kAct));
    ASSIGN_OR_RETURN(y, arena_->Allocate(st.r * h, kAct));
    if (residual == nullptr) {
      s = std::move(x);  // the stream starts here: the LN input is the stack input
      f.x = s.data();
    } else {
      ASSIGN_OR_RETURN(s, arena_->Allocate(st.r * h, kAct));
      f.x = x.data();
      f.residual = residual;
      f.residual_out = s.data();
    }
    f.y = y.data();
    f.mean = mean.data();
    f.rstd = rstd.data();
    RETURN_IF_ERROR(device_->LayerNormFwd(f));
    x.Reset();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(s, arena_->Allocate(st.g * h, kAct));
  float* slot = s.data() + st.off * h;
  RETURN_IF_ERROR(device_->Copy(slot, x.data(), st.r * h));
  if (residual != nullptr) RETURN_IF_ERROR(device_->Axpy(1.0f, residual, slot, st.r * h));
  x.Reset();
  RETURN_IF_ERROR(tp_comm_->AllGather(slot, s.data(), st.r * h, CollectivePurpose::kNormBoundary));
  ASSIGN_OR_RETURN(mean, arena_->Allocate(st.g, kAct));
  ASSIGN_OR_RETURN(rstd, arena_->Allocate(st.g, kAct));
  ASSIGN_OR_RETURN(Buffer y_full, arena_->Allocate(st.g * h, kWs));
  f.rows = st.g;
  f.x = s.data();
  f.y = y_full.data();
  f.mean = mean.data();
  f.rstd = rstd.data();
  RETURN_IF_ERROR(device_->LayerNormFwd(f));
  ASSIGN_OR_RETURN(y, arena_->Allocate(st.r * h, kAct));
  RETURN_IF_ERROR(device_->Copy(y.data(), y_full.data() + st.off * h, st.r * h));
  return absl::OkStatus();
}

// LN backward into `dx` (allocated here, this rank's rows): the gradient of s, i.e. of
// both the sublayer output and the incoming residual. Param grads: partial (SP shard)
// accumulate directly; full ones (TP-only, gather) are scaled by 1/t first
// (docs/design.md §4).
absl::Status TransformerStack::LayerNormBackward(Step& st, const float* gamma, float* dgamma,
                                                 float* dbeta, const Buffer& dy,
                                                 const Buffer& s, const Buffer& mean,
                                                 const Buffer& rstd, const float* dresidual,
                                                 Buffer& dx) {
  const int64_t h = layout_.hidden();
  const int t = options_.tp;
  const bool partial = st.sp && !st.gather;
  const bool direct = partial || t == 1;  // accumulate straight into the gradients
  ASSIGN_OR_RETURN(dx, arena_->Allocate(st.r * h, kWs));
  Buffer tmp, dy_full, dx_full;
  if (!direct) {
    ASSIGN_OR_RETURN(tmp, arena_->Allocate(2 * h, kWs));
  }
  kernels::LayerNormBwdArgs<float> b;
  b.hidden = h;
  b.gamma = gamma;
  b.x = s.data();
  b.mean = mean.data();
  b.rstd = rstd.data();
  b.dgamma = direct ? dgamma : tmp.data();
  b.dbeta = direct ? dbeta : tmp.data() + h;
  b.accumulate_param_grads = direct;
  if (!st.gather) {
    b.rows = st.r;
    b.dy = dy.data();
    b.dresidual = dresidual;
    b.dx = dx.data();
  } else {
    ASSIGN_OR_RETURN(dy_full, Gather(st, dy.data(), h, CollectivePurpose::kNormBoundary));
    ASSIGN_OR_RETURN(dx_full, arena_->Allocate(st.g * h, kWs));
    b.rows = st.g;
    b.dy = dy_full.data();
    b.dx = dx_full.data();
  }
  const size_t scratch_bytes = LayerNormBwdScratchBytes(device_->space(), b.rows, h);
  ASSIGN_OR_RETURN(Buffer scratch, arena_->Allocate((scratch_bytes + 3) / 4, kWs));
  RETURN_IF_ERROR(device_->LayerNormBwd(b, scratch.data(), scratch.bytes()));
  scratch.Reset();
  if (!direct) {
    RETURN_IF_ERROR(device_->Axpy(1.0f / t, tmp.data(), dgamma, h));
    RETURN_IF_ERROR(device_->Axpy(1.0f / t, tmp.data() + h, dbeta, h));
  }
  if (st.gather) {
    RETURN_IF_ERROR(device_->Copy(dx.data(), dx_full.data() + st.off * h, st.r * h));
    RETURN_IF_ERROR(device_->Axpy(1.0f, dresidual, dx.data(), st.r * h));
  }
  return absl::OkStatus();
}

absl::Status TransformerStack::LayerForward(Step& st, int layer, Buffer& z,
                                            const float* residual, Activations& act) {
  const int64_t h = layout_.hidden(), hl = layout_.hidden_local(), fl = layout_.ffn_local();
  const LayerParamOffsets o = layout_.Layer(layer);
  const float* p = params_.data();

  // residual + LN1 (z is consumed).
  RETURN_IF_ERROR(LayerNormForward(st, p + o.ln1_gamma, p + o.ln1_beta, z, residual, act.s1,
                                   act.mean1, act.rstd1, act.a));
  // QKV, column-parallel: SP gathers the normalised shards first.
  {
    Buffer a_full;
    const float* a_in = act.a.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(a_full, Gather(st, act.a.data(), h, CollectivePurpose::kLayer));
      a_in = a_full.data();
    }
    ASSIGN_OR_RETURN(act.qkv, arena_->Allocate(st.g * 3 * hl, kAct));
    RETURN_IF_ERROR(device_->LinearFwd({.shape = {st.g, h, 3 * hl}, .x = a_in,
                                        .weight = p + o.qkv_weight, .bias = p + o.qkv_bias,
                                        .y = act.qkv.data()}));
  }
  // Attention on the local heads over the full (padded) sequence.
  {
    ASSIGN_OR_RETURN(act.o, arena_->Allocate(st.g * hl, kAct));
    ASSIGN_OR_RETURN(act.lse, arena_->Allocate(st.g * st.attn.heads, kAct));
    const size_t ws_bytes =
        kernels::AttentionFwdWorkspaceBytes(st.attn, kernels::MaxSeqLen(st.geo.cu_seqlens));
    ASSIGN_OR_RETURN(Buffer ws, arena_->Allocate(ws_bytes / sizeof(float), kWs));
    RETURN_IF_ERROR(device_->AttentionFwd({.shape = st.attn, .cu_seqlens = st.geo.cu_seqlens,
                                           .qkv = act.qkv.data(), .out = act.o.data(),
                                           .lse = act.lse.data(), .workspace = ws.data(),
                                           .workspace_bytes = ws.bytes()}));
  }
  // Output projection, row-parallel; its bias after the reduction.
  Buffer proj;
  {
    ASSIGN_OR_RETURN(Buffer partial, arena_->Allocate(st.g * h, kWs));
    RETURN_IF_ERROR(device_->LinearFwd({.shape = {st.g, hl, h}, .x = act.o.data(),
                                        .weight = p + o.proj_weight, .y = partial.data()}));
    ASSIGN_OR_RETURN(proj, ReduceOut(st, std::move(partial), h));
    RETURN_IF_ERROR(device_->BiasAdd({.rows = st.r, .cols = h, .bias = p + o.proj_bias,
                                      .y = proj.data()}));
  }
  // residual + LN2 (proj is consumed).
  const float* s1_local = act.s1.data() + (st.gather ? st.off * h : 0);
  RETURN_IF_ERROR(LayerNormForward(st, p + o.ln2_gamma, p + o.ln2_beta, proj, s1_local,
                                   act.s2, act.mean2, act.rstd2, act.b));
  // FC1, column-parallel, then bias + GeLU.
  {
    Buffer b_full;
    const float* b_in = act.b.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(b_full, Gather(st, act.b.data(), h, CollectivePurpose::kLayer));
      b_in = b_full.data();
    }
    ASSIGN_OR_RETURN(act.f, arena_->Allocate(st.g * fl, kAct));
    RETURN_IF_ERROR(device_->LinearFwd({.shape = {st.g, h, fl}, .x = b_in,
                                        .weight = p + o.fc1_weight, .y = act.f.data()}));
  }
  ASSIGN_OR_RETURN(act.gout, arena_->Allocate(st.g * fl, kAct));
  RETURN_IF_ERROR(device_->GeluFwd({.rows = st.g, .cols = fl, .pre = act.f.data(),
                                    .bias = p + o.fc1_bias, .y = act.gout.data()}));
  // FC2, row-parallel; its bias after the reduction.
  {
    ASSIGN_OR_RETURN(Buffer partial, arena_->Allocate(st.g * h, kWs));
    RETURN_IF_ERROR(device_->LinearFwd({.shape = {st.g, fl, h}, .x = act.gout.data(),
                                        .weight = p + o.fc2_weight, .y = partial.data()}));
    ASSIGN_OR_RETURN(z, ReduceOut(st, std::move(partial), h));
    RETURN_IF_ERROR(device_->BiasAdd({.rows = st.r, .cols = h, .bias = p + o.fc2_bias,
                                      .y = z.data()}));
  }
  return absl::OkStatus();
}

// `g` holds the gradient of this layer's output z and of its s2 (the same tensor: the
// next block adds them); on return it holds the gradient of this layer's s1.
absl::Status TransformerStack::LayerBackward(Step& st, int layer, Buffer& g, Activations& act) {
  Buffer ds2;
  RETURN_IF_ERROR(MlpBackward(st, layer, g, act, ds2));
  Buffer ds1;
  RETURN_IF_ERROR(AttentionBackward(st, layer, ds2, act, ds1));
  g = std::move(ds1);
  return absl::OkStatus();
}

// The MLP half: FC2, GeLU, FC1 and LN2. Frees `g` and the half's activations; `ds2` is the
// gradient of s2's inputs (the attention output and s1).
absl::Status TransformerStack::MlpBackward(Step& st, int layer, Buffer& g, Activations& act,
                                           Buffer& ds2) {
  const int64_t h = layout_.hidden(), fl = layout_.ffn_local();
  const LayerParamOffsets o = layout_.Layer(layer);
  const float* p = params_.data();
  float* d = grads_.data();

  // FC2 (row-parallel): its bias sees this rank's rows.
  RETURN_IF_ERROR(ColumnSum(st, g.data(), st.r, st.replicated_scale, d + o.fc2_bias));
  Buffer dact;
  {
    Buffer g_full;
    const float* g_in = g.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(g_full, Gather(st, g.data(), h, CollectivePurpose::kLayer));
      g_in = g_full.data();
    }
    RETURN_IF_ERROR(device_->LinearBwdWeight({.shape = {st.g, fl, h}, .dy = g_in,
                                              .x = act.gout.data(), .dweight = d + o.fc2_weight,
                                              .accumulate = true},
                                             nullptr, 0));
    ASSIGN_OR_RETURN(dact, arena_->Allocate(st.g * fl, kWs));
    RETURN_IF_ERROR(device_->LinearBwdData({.shape = {st.g, fl, h}, .dy = g_in,
                                            .weight = p + o.fc2_weight, .dx = dact.data()}));
  }
  act.gout.Reset();
  // GeLU backward in place (dact becomes the FC1 output gradient) with FC1's bias.
  {
    const size_t bytes = GeluBwdScratchBytes(device_->space(), st.g, fl);
    ASSIGN_OR_RETURN(Buffer scratch, arena_->Allocate((bytes + 3) / 4, kWs));
    RETURN_IF_ERROR(device_->GeluBwd({.rows = st.g, .cols = fl, .dy = dact.data(),
                                      .pre = act.f.data(), .bias = p + o.fc1_bias,
                                      .dpre = dact.data(), .dbias = d + o.fc1_bias,
                                      .accumulate_bias_grad = true},
                                     scratch.data(), scratch.bytes()));
  }
  // FC1 (column-parallel): weight gradient from the re-gathered LN2 output; the input
  // gradient is partial over the ranks' columns.
  {
    Buffer b_full;
    const float* b_in = act.b.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(b_full, Gather(st, act.b.data(), h, CollectivePurpose::kLayer));
      b_in = b_full.data();
    }
    RETURN_IF_ERROR(device_->LinearBwdWeight({.shape = {st.g, h, fl}, .dy = dact.data(),
                                              .x = b_in, .dweight = d + o.fc1_weight,
                                              .accumulate = true},
                                             nullptr, 0));
  }
  act.b.Reset();
  Buffer db;
  {
    ASSIGN_OR_RETURN(Buffer partial, arena_->Allocate(st.g * h, kWs));
    RETURN_IF_ERROR(device_->LinearBwdData({.shape = {st.g, h, fl}, .dy = dact.data(),
                                            .weight = p + o.fc1_weight, .dx = partial.data()}));
    dact.Reset();
    act.f.Reset();
    ASSIGN_OR_RETURN(db, ReduceOut(st, std::move(partial), h));
  }
  // LN2: s2 also flows on through the residual stream, whose gradient is g.
  RETURN_IF_ERROR(LayerNormBackward(st, p + o.ln2_gamma, d + o.ln2_gamma, d + o.ln2_beta, db,
                                    act.s2, act.mean2, act.rstd2, g.data(), ds2));
  db.Reset();
  g.Reset();
  act.s2.Reset();
  act.mean2.Reset();
  act.rstd2.Reset();
  return absl::OkStatus();
}

// The attention half: the output projection, attention, QKV and LN1. Frees `ds2` and the
// half's activations; `ds1` is the gradient of s1.
absl::Status TransformerStack::AttentionBackward(Step& st, int layer, Buffer& ds2,
                                                 Activations& act, Buffer& ds1) {
  const int64_t h = layout_.hidden(), hl = layout_.hidden_local();
  const LayerParamOffsets o = layout_.Layer(layer);
  const float* p = params_.data();
  float* d = grads_.data();

  // Output projection (row-parallel).
  RETURN_IF_ERROR(ColumnSum(st, ds2.data(), st.r, st.replicated_scale, d + o.proj_bias));
  Buffer d_o;
  {
    Buffer dp_full;
    const float* dp_in = ds2.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(dp_full, Gather(st, ds2.data(), h, CollectivePurpose::kLayer));
      dp_in = dp_full.data();
    }
    RETURN_IF_ERROR(device_->LinearBwdWeight({.shape = {st.g, hl, h}, .dy = dp_in,
                                              .x = act.o.data(), .dweight = d + o.proj_weight,
                                              .accumulate = true},
                                             nullptr, 0));
    ASSIGN_OR_RETURN(d_o, arena_->Allocate(st.g * hl, kWs));
    RETURN_IF_ERROR(device_->LinearBwdData({.shape = {st.g, hl, h}, .dy = dp_in,
                                            .weight = p + o.proj_weight, .dx = d_o.data()}));
  }
  // Attention.
  Buffer dqkv;
  {
    ASSIGN_OR_RETURN(dqkv, arena_->Allocate(st.g * 3 * hl, kWs));
    const size_t ws_bytes =
        kernels::AttentionBwdWorkspaceBytes(st.attn, kernels::MaxSeqLen(st.geo.cu_seqlens));
    ASSIGN_OR_RETURN(Buffer ws, arena_->Allocate(ws_bytes / sizeof(float), kWs));
    RETURN_IF_ERROR(device_->AttentionBwd({.shape = st.attn, .cu_seqlens = st.geo.cu_seqlens,
                                           .qkv = act.qkv.data(), .out = act.o.data(),
                                           .dout = d_o.data(), .lse = act.lse.data(),
                                           .dqkv = dqkv.data(), .workspace = ws.data(),
                                           .workspace_bytes = ws.bytes()}));
  }
  d_o.Reset();
  act.o.Reset();
  act.lse.Reset();
  // QKV (column-parallel) with its (sharded) bias.
  {
    Buffer a_full;
    const float* a_in = act.a.data();
    if (st.sp) {
      ASSIGN_OR_RETURN(a_full, Gather(st, act.a.data(), h, CollectivePurpose::kLayer));
      a_in = a_full.data();
    }
    const kernels::LinearShape shape{st.g, h, 3 * hl};
    const size_t bytes = LinearBwdWeightScratchBytes(device_->space(), shape);
    ASSIGN_OR_RETURN(Buffer scratch, arena_->Allocate((bytes + 3) / 4, kWs));
    RETURN_IF_ERROR(device_->LinearBwdWeight({.shape = shape, .dy = dqkv.data(), .x = a_in,
                                              .dweight = d + o.qkv_weight,
                                              .dbias = d + o.qkv_bias, .accumulate = true},
                                             scratch.data(), scratch.bytes()));
  }
  act.a.Reset();
  Buffer da;
  {
    ASSIGN_OR_RETURN(Buffer partial, arena_->Allocate(st.g * h, kWs));
    RETURN_IF_ERROR(device_->LinearBwdData({.shape = {st.g, h, 3 * hl}, .dy = dqkv.data(),
                                            .weight = p + o.qkv_weight, .dx = partial.data()}));
    dqkv.Reset();
    act.qkv.Reset();
    ASSIGN_OR_RETURN(da, ReduceOut(st, std::move(partial), h));
  }
  // LN1: s1 flowed into s2 through the residual stream, whose gradient is ds2.
  RETURN_IF_ERROR(LayerNormBackward(st, p + o.ln1_gamma, d + o.ln1_gamma, d + o.ln1_beta, da,
                                    act.s1, act.mean1, act.rstd1, ds2.data(), ds1));
  da.Reset();
  ds2.Reset();
  act.s1.Reset();
  act.mean1.Reset();
  act.rstd1.Reset();
  return absl::OkStatus();
}

int64_t BoundaryRows(std::span<const int64_t> lengths, int tp) {
  int64_t tokens = 0;
  for (int64_t len : lengths) tokens += len;
  return SpPaddedTokens(tokens, tp) / tp;
}

int64_t BoundaryFloats(const StackOptions& options, std::span<const int64_t> lengths, Mode mode) {
  if (options.native_stage_boundary && mode == Mode::kTensorParallelOnly) {
    int64_t tokens = 0;
    for (int64_t len : lengths) tokens += len;
    return tokens * options.shape.hidden;
  }
  return BoundaryRows(lengths, options.tp) * options.shape.hidden;
}

struct TransformerStack::InFlight::State {
  std::vector<int64_t> lengths;
  uint64_t data_seed = 0;
  const BatchData* data = nullptr;
  Step st;
  std::vector<Activations> acts;
  int64_t boundary_rows = 0;
  Buffer saved_input;  // recompute: the stage's input rows, until the backward
};
TransformerStack::InFlight::InFlight() : state_(std::make_unique<State>()) {}
TransformerStack::InFlight::~InFlight() = default;

namespace {

// This rank's rows (the step's geometry) of the batch's input (kind 0) or of the loss's
// gradient with respect to the output (kind 1); padding rows are zero.
void FillRows(const BatchGeometry& geo, int64_t rows, int64_t offset, int64_t h,
              const BatchData* data, uint64_t data_seed, int kind, std::vector<float>& host) {
  host.assign(static_cast<size_t>(rows * h), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t token = offset + i;
    if (token >= geo.tokens) continue;
    for (int64_t c = 0; c < h; ++c) {
      host[i * h + c] = data != nullptr
                            ? (kind == 0 ? data->input : data->output_grad)[token * h + c]
                            : (kind == 0 ? InputValue(data_seed, token, c)
                                         : OutputGradValue(data_seed, token, c, geo.tokens));
    }
  }
}

}  // namespace

absl::StatusOr<Buffer> TransformerStack::FromBoundary(Step& st, std::span<const float> in,
                                                      int64_t boundary_rows) {
  const int64_t h = layout_.hidden();
  const bool native_full = options_.native_stage_boundary && !st.sp;
  const int64_t expect = native_full ? st.r * h : boundary_rows * h;
  if (static_cast<int64_t>(in.size()) != expect) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stage boundary: %d floats, expected %d", in.size(), expect));
  }
  ASSIGN_OR_RETURN(Buffer rows, arena_->Allocate(st.r * h, kAct));
  if (st.sp || native_full) {  // the message is this rank's rows already
    RETURN_IF_ERROR(device_->Upload(rows.data(), in.data(), st.r * h));
    return rows;
  }
  // TP-only: every rank needs the whole sequence; the padding rows are dropped.
  ASSIGN_OR_RETURN(Buffer shard, arena_->Allocate(boundary_rows * h, kWs));
  RETURN_IF_ERROR(device_->Upload(shard.data(), in.data(), boundary_rows * h));
  ASSIGN_OR_RETURN(Buffer full, arena_->Allocate(boundary_rows * options_.tp * h, kWs));
  RETURN_IF_ERROR(tp_comm_->AllGather(shard.data(), full.data(), boundary_rows * h,
                                      CollectivePurpose::kStageBoundary));
  RETURN_IF_ERROR(device_->Copy(rows.data(), full.data(), st.r * h));
  return rows;
}

absl::Status TransformerStack::ToBoundary(const Step& st, const float* rows,
                                          int64_t boundary_rows, std::vector<float>* out) {
  const int64_t h = layout_.hidden();
  if (st.sp || options_.native_stage_boundary) {  // this rank's rows as they are
    out->assign(static_cast<size_t>(st.r * h), 0.0f);
    return device_->Download(out->data(), rows, st.r * h);
  }
  out->assign(static_cast<size_t>(boundary_rows * h), 0.0f);
  // TP-only: the rows are the whole sequence (alike on every rank): keep this rank's.
  const int64_t first = boundary_rows * options_.tp_rank;
  const int64_t n = std::clamp<int64_t>(st.geo.tokens - first, 0, boundary_rows);
  if (n == 0) return absl::OkStatus();
  return device_->Download(out->data(), rows + first * h, n * h);
}

absl::StatusOr<std::unique_ptr<TransformerStack::InFlight>> TransformerStack::Forward(
    const MicroBatch& batch, Mode mode, std::span<const float> input, std::vector<float>* output,
    StackCapture* capture) {
  if (batch.lengths.empty()) return absl::InvalidArgumentError("ForwardBackward: empty batch");
  for (int64_t len : batch.lengths) {
    if (len < 1) return absl::InvalidArgumentError("ForwardBackward: a sequence length < 1");
  }
  auto f = std::make_unique<InFlight>();
  InFlight::State& fs = *f->state_;
  fs.lengths.assign(batch.lengths.begin(), batch.lengths.end());
  fs.data_seed = batch.data_seed;
  fs.data = batch.data;
  const int64_t h = layout_.hidden();
  const int t = options_.tp;
  Step& st = fs.st;
  st.geo = MakeBatchGeometry(fs.lengths, mode, t, options_.tp_rank);
  st.sp = mode == Mode::kSequenceParallel;
  st.gather = st.sp && options_.norm_boundary == NormBoundary::kGather;
  st.r = st.geo.rows_local;
  st.g = st.geo.padded_tokens;
  st.off = st.geo.row_offset;
  st.replicated_scale = st.sp ? 1.0f : 1.0f / t;
  st.attn = {.heads = layout_.heads_local(), .head_dim = layout_.head_dim(),
             .query_block = options_.attention_query_block};
  fs.boundary_rows = BoundaryRows(fs.lengths, t);

  if (batch.data != nullptr && (batch.data->input.size() != static_cast<size_t>(st.geo.tokens * h) ||
                                batch.data->output_grad.size() != batch.data->input.size())) {
    return absl::InvalidArgumentError("ForwardBackward: batch data does not match the lengths");
  }
  fs.acts.resize(options_.shape.layers);
  Buffer z;
  if (input.empty()) {
    std::vector<float> host;
    FillRows(st.geo, st.r, st.off, h, fs.data, fs.data_seed, 0, host);
    ASSIGN_OR_RETURN(z, arena_->Allocate(st.r * h, kAct));
    RETURN_IF_ERROR(device_->Upload(z.data(), host.data(), st.r * h));
  } else {
    ASSIGN_OR_RETURN(z, FromBoundary(st, input, fs.boundary_rows));
  }
  if (options_.recompute) {
    ASSIGN_OR_RETURN(fs.saved_input, arena_->Allocate(st.r * h, kAct));
    RETURN_IF_ERROR(device_->Copy(fs.saved_input.data(), z.data(), st.r * h));
  }
  ASSIGN_OR_RETURN(const float* residual, LayersForward(st, z, fs.acts));
  // Output = z + s2 of the last block: the model's output, or the next stage's input.
  ASSIGN_OR_RETURN(Buffer out, arena_->Allocate(st.r * h, kWs));
  RETURN_IF_ERROR(device_->Copy(out.data(), z.data(), st.r * h));
  RETURN_IF_ERROR(device_->Axpy(1.0f, residual, out.data(), st.r * h));
  z.Reset();
  if (options_.recompute) {  // the backward recomputes them from saved_input
    for (Activations& a : fs.acts) a = Activations{};
  }
  if (capture != nullptr) {
    capture->geometry = st.geo;
    capture->output.resize(st.r * h);
    RETURN_IF_ERROR(device_->Download(capture->output.data(), out.data(), st.r * h));
  }
  if (output != nullptr) RETURN_IF_ERROR(ToBoundary(st, out.data(), fs.boundary_rows, output));
  return f;
}

absl::StatusOr<const float*> TransformerStack::LayersForward(Step& st, Buffer& z,
                                                             std::vector<Activations>& acts) {
  const int64_t h = layout_.hidden();
  const float* residual = nullptr;
  for (int l = 0; l < options_.shape.layers; ++l) {
    RETURN_IF_ERROR(LayerForward(st, l, z, residual, acts[l]));
    residual = acts[l].s2.data() + (st.gather ? st.off * h : 0);
  }
  return residual;
}

absl::Status TransformerStack::Backward(InFlight& f, std::span<const float> output_grad,
                                        std::vector<float>* input_grad, StackCapture* capture) {
  InFlight::State& fs = *f.state_;
  Step& st = fs.st;
  const int64_t h = layout_.hidden();
  if (options_.recompute) {
    // The layers' forward again, from the saved input: the same collectives in the same
    // order on every rank of the group, so the same activations.
    ASSIGN_OR_RETURN(Buffer z, arena_->Allocate(st.r * h, kAct));
    RETURN_IF_ERROR(device_->Copy(z.data(), fs.saved_input.data(), st.r * h));
    fs.saved_input.Reset();
    RETURN_IF_ERROR(LayersForward(st, z, fs.acts).status());
  }
  Buffer g;
  if (output_grad.empty()) {
    std::vector<float> host;
    FillRows(st.geo, st.r, st.off, h, fs.data, fs.data_seed, 1, host);
    ASSIGN_OR_RETURN(g, arena_->Allocate(st.r * h, kWs));
    RETURN_IF_ERROR(device_->Upload(g.data(), host.data(), st.r * h));
  } else {
    ASSIGN_OR_RETURN(g, FromBoundary(st, output_grad, fs.boundary_rows));
  }
  ASSIGN_OR_RETURN(st.ones, arena_->Allocate(st.r, kWs));
  RETURN_IF_ERROR(device_->Fill(st.ones.data(), 1.0f, st.r));
  for (int l = options_.shape.layers - 1; l >= 0; --l) {
    RETURN_IF_ERROR(LayerBackward(st, l, g, fs.acts[l]));
    fs.acts[l] = Activations{};  // this layer's activations are spent
  }
  st.ones.Reset();
  if (capture != nullptr) {
    capture->input_grad.resize(st.r * h);
    RETURN_IF_ERROR(device_->Download(capture->input_grad.data(), g.data(), st.r * h));
  }
  if (input_grad != nullptr) RETURN_IF_ERROR(ToBoundary(st, g.data(), fs.boundary_rows, input_grad));
  return absl::OkStatus();
}

absl::Status TransformerStack::ForwardBackward(const MicroBatch& batch, Mode mode,
                                               StackCapture* capture) {
  ASSIGN_OR_RETURN(std::unique_ptr<InFlight> f, Forward(batch, mode, {}, nullptr, capture));
  return Backward(*f, {}, nullptr, capture);
}

}  // namespace spgate::runtime
