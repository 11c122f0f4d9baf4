// The memory model: TransformerStack's buffer schedule replayed on a counter. Each block
// below names the code it mirrors (transformer_stack.cc); sizes are in floats.
#include "worker/runtime/memory_model.h"

#include <algorithm>

#include "kernels/attention.h"
#include "worker/runtime/transformer_stack.h"

namespace spgate::runtime {
namespace {

class Ledger {
 public:
  void Alloc(int64_t floats) {
    live_ += floats;
    peak_ = std::max(peak_, live_);
  }
  void Free(int64_t floats) { live_ -= floats; }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

int64_t Floats(size_t bytes) { return static_cast<int64_t>((bytes + 3) / 4); }

// One replay of ForwardBackward for one batch: the sizes it needs, derived once from the
// input, and the ledger they are counted on. Each method mirrors the stack function it is
// named after and keeps its allocation order, so the ledger's peak is the arena's.
class Replay {
 public:
  Replay(const MemoryModelInput& in, std::span<const int64_t> lengths)
      : in_(in), layout_(in.shape, in.tp), geo_(MakeBatchGeometry(lengths, in.mode, in.tp, 0)) {
    sp_ = in.mode == Mode::kSequenceParallel;
    gather_ = sp_ && in.norm_boundary == NormBoundary::kGather;
    h_ = layout_.hidden();
    hl_ = layout_.hidden_local();
    fl_ = layout_.ffn_local();
    heads_ = layout_.heads_local();
    r_ = geo_.rows_local;
    g_ = geo_.padded_tokens;
    rh_ = r_ * h_;
    gh_ = g_ * h_;
    const kernels::AttentionShape attn{.heads = heads_, .head_dim = layout_.head_dim(),
                                       .query_block = in.attention_query_block};
    const int64_t max_len = kernels::MaxSeqLen(geo_.cu_seqlens);
    attn_fwd_ws_ = Floats(kernels::AttentionFwdWorkspaceBytes(attn, max_len));
    attn_bwd_ws_ = Floats(kernels::AttentionBwdWorkspaceBytes(attn, max_len));
    ln_scratch_ = Floats(LayerNormBwdScratchBytes(in.space, gather_ ? g_ : r_, h_));
    gelu_scratch_ = Floats(GeluBwdScratchBytes(in.space, g_, fl_));
    qkv_scratch_ = Floats(LinearBwdWeightScratchBytes(in.space, {g_, h_, 3 * hl_}));
    // LayerNorm inputs (the residual stream) and statistics: full-sequence under gather.
    s_size_ = gather_ ? gh_ : rh_;
    stat_size_ = gather_ ? g_ : r_;
  }

  MemoryPrediction Run() {
    m_.Alloc(2 * layout_.total());  // parameters + gradients
    const int64_t resident = m_.live();
    const int64_t activations = Forward(resident);
    m_.Alloc(rh_);  // g
    m_.Alloc(r_);   // ones
    for (int l = in_.shape.layers - 1; l >= 0; --l) {
      MlpBackward();
      AttentionBackward();
      // ds1 becomes g.
    }
    MemoryPrediction p;
    p.peak_bytes = static_cast<uint64_t>(m_.peak()) * sizeof(float);
    p.resident_bytes = static_cast<uint64_t>(resident) * sizeof(float);
    p.activation_bytes =
        static_cast<uint64_t>(in_.recompute ? rh_ : activations) * sizeof(float);
    return p;
  }

 private:
  // ForwardBackward up to the backward loop: the input (and under recompute its saved
  // copy), the layers, the output; under recompute the layers again from the saved input.
  // Returns the floats the layers kept for backward.
  int64_t Forward(int64_t resident) {
    m_.Alloc(rh_);
    if (in_.recompute) m_.Alloc(rh_);
    LayersForward();
    const int64_t activations = m_.live() - resident - rh_ - (in_.recompute ? rh_ : 0);
    m_.Alloc(rh_);  // out
    m_.Free(rh_);   // z
    if (in_.recompute) m_.Free(activations);
    m_.Free(rh_);   // out
    if (in_.recompute) {
      // Backward: z from the saved input (freed), the layers again, their output dropped.
      m_.Alloc(rh_);
      m_.Free(rh_);
      LayersForward();
      m_.Free(rh_);
    }
    return activations;
  }

  // The layers' forward: z (rh) live on entry, the last block's output (rh) on exit.
  void LayersForward() {
    for (int l = 0; l < in_.shape.layers; ++l) {
      LayerNormForward(/*has_residual=*/l > 0);
      if (sp_) m_.Alloc(gh_);   // a_full
      m_.Alloc(g_ * 3 * hl_);   // qkv
      if (sp_) m_.Free(gh_);
      m_.Alloc(g_ * hl_);       // o
      m_.Alloc(g_ * heads_);    // lse
      m_.Alloc(attn_fwd_ws_);
      m_.Free(attn_fwd_ws_);
      m_.Alloc(gh_);            // proj partial
      ReduceOut();
      LayerNormForward(/*has_residual=*/true);  // consumes proj
      if (sp_) m_.Alloc(gh_);   // b_full
      m_.Alloc(g_ * fl_);       // f
      if (sp_) m_.Free(gh_);
      m_.Alloc(g_ * fl_);       // gout
      m_.Alloc(gh_);            // fc2 partial
      ReduceOut();              // z (rh) live
    }
  }

  // LayerNormForward: x (rh) is live on entry and consumed.
  void LayerNormForward(bool has_residual) {
    if (!gather_) {
      m_.Alloc(r_);
      m_.Alloc(r_);
      m_.Alloc(rh_);                    // y
      if (has_residual) m_.Alloc(rh_);  // s (else s is x)
      if (has_residual) m_.Free(rh_);   // x
      return;
    }
    m_.Alloc(gh_);  // s
    m_.Free(rh_);   // x
    m_.Alloc(g_);
    m_.Alloc(g_);
    m_.Alloc(gh_);  // y_full
    m_.Alloc(rh_);  // y
    m_.Free(gh_);   // y_full
  }

  // ReduceOut: `partial` (gh) is live on entry; the result (rh) is live on exit.
  void ReduceOut() {
    if (!sp_) return;
    m_.Alloc(rh_);
    m_.Free(gh_);
  }

  // LayerBackward's MLP half: FC2, FC1 and the second LayerNorm; ds2 (rh) live on exit.
  void MlpBackward() {
    // FC2.
    if (sp_) m_.Alloc(gh_);  // g_full
    m_.Alloc(g_ * fl_);      // dact
    if (sp_) m_.Free(gh_);
    m_.Free(g_ * fl_);       // gout
    m_.Alloc(gelu_scratch_);
    m_.Free(gelu_scratch_);
    // FC1.
    if (sp_) m_.Alloc(gh_);  // b_full
    if (sp_) m_.Free(gh_);
    m_.Free(rh_);            // b
    m_.Alloc(gh_);           // partial
    m_.Free(g_ * fl_);       // dact
    m_.Free(g_ * fl_);       // f
    ReduceOut();             // db (rh)
    LayerNormBackward();     // ds2
    m_.Free(rh_);            // db
    m_.Free(rh_);            // g
    m_.Free(s_size_);        // s2
    m_.Free(2 * stat_size_);
  }

  // LayerBackward's attention half: the output projection, attention, QKV and the first
  // LayerNorm; ds1 (rh) live on exit.
  void AttentionBackward() {
    // Output projection.
    if (sp_) m_.Alloc(gh_);  // dp_full
    m_.Alloc(g_ * hl_);      // d_o
    if (sp_) m_.Free(gh_);
    // Attention.
    m_.Alloc(g_ * 3 * hl_);  // dqkv
    m_.Alloc(attn_bwd_ws_);
    m_.Free(attn_bwd_ws_);
    m_.Free(g_ * hl_);       // d_o
    m_.Free(g_ * hl_);       // o
    m_.Free(g_ * heads_);    // lse
    // QKV.
    if (sp_) m_.Alloc(gh_);  // a_full
    m_.Alloc(qkv_scratch_);
    m_.Free(qkv_scratch_);
    if (sp_) m_.Free(gh_);
    m_.Free(rh_);            // a
    m_.Alloc(gh_);           // partial
    m_.Free(g_ * 3 * hl_);   // dqkv
    m_.Free(g_ * 3 * hl_);   // qkv
    ReduceOut();             // da (rh)
    LayerNormBackward();     // ds1
    m_.Free(rh_);            // da
    m_.Free(rh_);            // ds2
    m_.Free(s_size_);        // s1
    m_.Free(2 * stat_size_);
  }

  // LayerNormBackward: dx (rh) is live on exit; temporaries are freed.
  void LayerNormBackward() {
    const bool direct = (sp_ && !gather_) || in_.tp == 1;
    m_.Alloc(rh_);  // dx
    int64_t temps = 0;
    if (!direct) {
      m_.Alloc(2 * h_);
      temps += 2 * h_;
    }
    if (gather_) {
      m_.Alloc(gh_);  // dy_full
      m_.Alloc(gh_);  // dx_full
      temps += 2 * gh_;
    }
    m_.Alloc(ln_scratch_);
    m_.Free(ln_scratch_);
    m_.Free(temps);
  }

  const MemoryModelInput& in_;
  const ParamLayout layout_;
  const BatchGeometry geo_;
  bool sp_ = false, gather_ = false;
  // Floats: hidden, its and the FFN's local width, local heads; rows local and padded
  // tokens (the full sequence), and their [rows, hidden] products.
  int64_t h_ = 0, hl_ = 0, fl_ = 0, heads_ = 0;
  int64_t r_ = 0, g_ = 0, rh_ = 0, gh_ = 0;
  int64_t attn_fwd_ws_ = 0, attn_bwd_ws_ = 0, ln_scratch_ = 0, gelu_scratch_ = 0,
          qkv_scratch_ = 0;
  int64_t s_size_ = 0, stat_size_ = 0;
  Ledger m_;
};

}  // namespace

MemoryPrediction PredictPeak(const MemoryModelInput& in, std::span<const int64_t> lengths) {
  return Replay(in, lengths).Run();
}

}  // namespace spgate::runtime
