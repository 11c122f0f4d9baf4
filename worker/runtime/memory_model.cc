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

}  // namespace

MemoryPrediction PredictPeak(const MemoryModelInput& in, std::span<const int64_t> lengths) {
  const ParamLayout layout(in.shape, in.tp);
  const BatchGeometry geo = MakeBatchGeometry(lengths, in.mode, in.tp, 0);
  const bool sp = in.mode == Mode::kSequenceParallel;
  const bool gather = sp && in.norm_boundary == NormBoundary::kGather;
  const int64_t h = layout.hidden(), hl = layout.hidden_local(), fl = layout.ffn_local();
  const int64_t heads = layout.heads_local();
  const int64_t r = geo.rows_local, g = geo.padded_tokens;
  const int64_t rh = r * h, gh = g * h;
  const kernels::AttentionShape attn{.heads = heads, .head_dim = layout.head_dim(),
                                     .query_block = in.attention_query_block};
  const int64_t max_len = kernels::MaxSeqLen(geo.cu_seqlens);
  const int64_t attn_fwd_ws = Floats(kernels::AttentionFwdWorkspaceBytes(attn, max_len));
  const int64_t attn_bwd_ws = Floats(kernels::AttentionBwdWorkspaceBytes(attn, max_len));
  const int64_t ln_rows = gather ? g : r;
  const int64_t ln_scratch = Floats(LayerNormBwdScratchBytes(in.space, ln_rows, h));
  const int64_t gelu_scratch = Floats(GeluBwdScratchBytes(in.space, g, fl));
  const int64_t qkv_scratch =
      Floats(LinearBwdWeightScratchBytes(in.space, {g, h, 3 * hl}));
  // LayerNorm inputs (the residual stream) and statistics: full-sequence under gather.
  const int64_t s_size = gather ? gh : rh;
  const int64_t stat_size = gather ? g : r;

  Ledger m;
  m.Alloc(2 * layout.total());  // parameters + gradients
  const int64_t resident = m.live();

  // LayerNormForward: x (rh) is live on entry and consumed.
  auto ln_forward = [&](bool has_residual) {
    if (!gather) {
      m.Alloc(r);
      m.Alloc(r);
      m.Alloc(rh);                  // y
      if (has_residual) m.Alloc(rh);  // s (else s is x)
      if (has_residual) m.Free(rh);   // x
      return;
    }
    m.Alloc(gh);  // s
    m.Free(rh);   // x
    m.Alloc(g);
    m.Alloc(g);
    m.Alloc(gh);  // y_full
    m.Alloc(rh);  // y
    m.Free(gh);   // y_full
  };
  // ReduceOut: `partial` (gh) is live on entry; the result (rh) is live on exit.
  auto reduce_out = [&] {
    if (!sp) return;
    m.Alloc(rh);
    m.Free(gh);
  };

  // The layers' forward: z (rh) live on entry, the last block's output (rh) on exit.
  auto layers_forward = [&] {
    for (int l = 0; l < in.shape.layers; ++l) {
      ln_forward(/*has_residual=*/l > 0);
      if (sp) m.Alloc(gh);   // a_full
      m.Alloc(g * 3 * hl);   // qkv
      if (sp) m.Free(gh);
      m.Alloc(g * hl);       // o
      m.Alloc(g * heads);    // lse
      m.Alloc(attn_fwd_ws);
      m.Free(attn_fwd_ws);
      m.Alloc(gh);           // proj partial
      reduce_out();
      ln_forward(/*has_residual=*/true);  // consumes proj
      if (sp) m.Alloc(gh);   // b_full
      m.Alloc(g * fl);       // f
      if (sp) m.Free(gh);
      m.Alloc(g * fl);       // gout
      m.Alloc(gh);           // fc2 partial
      reduce_out();          // z (rh) live
    }
  };

  // ForwardBackward: the input (and under recompute its saved copy).
  m.Alloc(rh);
  if (in.recompute) m.Alloc(rh);
  layers_forward();
  const int64_t activations = m.live() - resident - rh - (in.recompute ? rh : 0);
  m.Alloc(rh);  // out
  m.Free(rh);   // z
  if (in.recompute) m.Free(activations);
  m.Free(rh);   // out
  if (in.recompute) {
    // Backward: z from the saved input (freed), the layers again, their output dropped.
    m.Alloc(rh);
    m.Free(rh);
    layers_forward();
    m.Free(rh);
  }
  m.Alloc(rh);  // g
  m.Alloc(r);   // ones

  // LayerNormBackward: dx (rh) is live on exit; temporaries are freed.
  auto ln_backward = [&] {
    const bool direct = (sp && !gather) || in.tp == 1;
    m.Alloc(rh);  // dx
    int64_t temps = 0;
    if (!direct) {
      m.Alloc(2 * h);
      temps += 2 * h;
    }
    if (gather) {
      m.Alloc(gh);  // dy_full
      m.Alloc(gh);  // dx_full
      temps += 2 * gh;
    }
    m.Alloc(ln_scratch);
    m.Free(ln_scratch);
    m.Free(temps);
  };

  for (int l = in.shape.layers - 1; l >= 0; --l) {
    // FC2.
    if (sp) m.Alloc(gh);  // g_full
    m.Alloc(g * fl);      // dact
    if (sp) m.Free(gh);
    m.Free(g * fl);       // gout
    m.Alloc(gelu_scratch);
    m.Free(gelu_scratch);
    // FC1.
    if (sp) m.Alloc(gh);  // b_full
    if (sp) m.Free(gh);
    m.Free(rh);           // b
    m.Alloc(gh);          // partial
    m.Free(g * fl);       // dact
    m.Free(g * fl);       // f
    reduce_out();         // db (rh)
    ln_backward();        // ds2
    m.Free(rh);           // db
    m.Free(rh);           // g
    m.Free(s_size);       // s2
    m.Free(2 * stat_size);
    // Output projection.
    if (sp) m.Alloc(gh);  // dp_full
    m.Alloc(g * hl);      // d_o
    if (sp) m.Free(gh);
    // Attention.
    m.Alloc(g * 3 * hl);  // dqkv
    m.Alloc(attn_bwd_ws);
    m.Free(attn_bwd_ws);
    m.Free(g * hl);       // d_o
    m.Free(g * hl);       // o
    m.Free(g * heads);    // lse
    // QKV.
    if (sp) m.Alloc(gh);  // a_full
    m.Alloc(qkv_scratch);
    m.Free(qkv_scratch);
    if (sp) m.Free(gh);
    m.Free(rh);           // a
    m.Alloc(gh);          // partial
    m.Free(g * 3 * hl);   // dqkv
    m.Free(g * 3 * hl);   // qkv
    reduce_out();         // da (rh)
    ln_backward();        // ds1
    m.Free(rh);           // da
    m.Free(rh);           // ds2
    m.Free(s_size);       // s1
    m.Free(2 * stat_size);
    // ds1 becomes g.
  }

  MemoryPrediction p;
  p.peak_bytes = static_cast<uint64_t>(m.peak()) * sizeof(float);
  p.resident_bytes = static_cast<uint64_t>(resident) * sizeof(float);
  p.activation_bytes = static_cast<uint64_t>(in.recompute ? rh : activations) * sizeof(float);
  return p;
}

}  // namespace spgate::runtime
