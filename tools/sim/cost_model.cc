// The cost model of docs/sim.md, term by term.
#include "tools/sim/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/runtime/batching.h"

namespace spgate::sim {
namespace {

struct BatchShape {
  double tokens = 0;       // T = Σ s_i
  double sum_sq = 0;       // Σ s_i²
  int64_t padded = 0;      // T rounded up to a multiple of t
};

BatchShape Shape(std::span<const int64_t> lengths, int t) {
  BatchShape b;
  for (int64_t s : lengths) {
    b.tokens += static_cast<double>(s);
    b.sum_sq += static_cast<double>(s) * static_cast<double>(s);
  }
  const auto T = static_cast<int64_t>(b.tokens);
  b.padded = runtime::SpPaddedTokens(T, t);  // the worker's padding
  return b;
}

// Σ over the tokens of each sequence shard of the packed batch of that token's sequence
// length, divided by the mean over shards: how much of the length-dependent work each
// rank holds under SP (1 everywhere for equal lengths).
std::vector<double> ShardWeights(std::span<const int64_t> lengths, int t, int64_t padded) {
  std::vector<double> w(t, 0.0);
  const int64_t shard = padded / t;
  int64_t pos = 0;
  for (int64_t s : lengths) {
    int64_t left = s;
    while (left > 0) {
      const int r = static_cast<int>(std::min<int64_t>(pos / shard, t - 1));
      const int64_t room = (r + 1) * shard - pos;
      const int64_t n = std::min(left, std::max<int64_t>(room, 1));
      w[r] += static_cast<double>(n) * static_cast<double>(s);
      pos += n;
      left -= n;
    }
  }
  double mean = 0;
  for (double x : w) mean += x;
  mean /= t;
  for (double& x : w) x = mean > 0 ? x / mean : 1.0;
  return w;
}

}  // namespace

absl::Status ValidateSwitchCost(const CostParams& p) {
  if (!std::isfinite(p.switch_cost_s) || p.switch_cost_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--switch_cost_s must be a finite number of seconds >= 0, got ", p.switch_cost_s));
  }
  return absl::OkStatus();
}

MemoryPrediction CostModel::PredictMemory(std::span<const int64_t> lengths) const {
  const BatchShape b = Shape(lengths, p_.tp);
  const double t = p_.tp, h = p_.hidden, a = p_.heads, L = p_.layers;
  const double params = 12.0 * h * h * L;  // per transformer layer: 4h² attention + 8h² MLP
  const double states = params * p_.param_bytes_per_param / t;
  // Korthikanti et al. 2022, activations per layer in bytes (fp16), with s·b → T and the
  // attention-score term 5·a·s²·b → 5·a·Σ s_i² (scores are per sequence):
  //   TP only:  s·b·h·(10 + 24/t) + 5·a·Σs²/t
  //   SP:       s·b·h·34/t        + 5·a·Σs²/t
  // flash_attention drops the score term (selective recomputation, their §4.2).
  const double scores = p_.flash_attention ? 0.0 : 5.0 * a * b.sum_sq / t;
  const double act_tp = L * (b.tokens * h * (10.0 + 24.0 / t) + scores);
  const double act_sp = L * (static_cast<double>(b.padded) * h * 34.0 / t + scores);
  MemoryPrediction m;
  m.tp = static_cast<uint64_t>(states + act_tp);
  m.sp = static_cast<uint64_t>(states + act_sp);
  m.budget = static_cast<uint64_t>(p_.device_memory_gib * static_cast<double>(1ull << 30));
  return m;
}

GroupStep CostModel::Step(std::span<const int64_t> lengths, Mode mode, std::mt19937_64& rng,
                          int64_t step) const {
  const int t = p_.tp;
  const BatchShape b = Shape(lengths, t);
  const double h = p_.hidden, L = p_.layers;
  const double flops = p_.device_tflops * 1e12 * p_.mfu;
  const double hbm = p_.hbm_gbps * 1e9, link = p_.link_gbps * 1e9;
  const double lat = p_.collective_latency_us * 1e-6;
  const bool sp = mode == Mode::kSequenceParallel;
  const double T = sp ? static_cast<double>(b.padded) : b.tokens;

  // Forward + backward FLOPs, split over the t ranks: GEMMs 72·h²·T per layer, causal
  // attention 6·h·Σs² per layer.
  const double gemm = L * 72.0 * h * h * T / (t * flops);
  const double attn = L * 6.0 * h * b.sum_sq / (t * flops);
  // The element-wise region (LayerNorm, dropout, residual): memory bound; every rank
  // does all T tokens under TP-only, its shard's T/t under SP.
  const double elem = L * p_.elementwise_bytes_per_token * h * 2.0 * T / hbm / (sp ? t : 1);
  // Collectives move T·h fp16 values per call, 4 calls per layer (2 fwd, 2 bwd): TP-only
  // all-reduces (2(t-1)/t of the volume each), SP all-gathers + reduce-scatters
  // ((t-1)/t each) — the same total volume.
  const double volume = T * h * 2.0;
  const double per_call = volume * (t - 1) / t / link + lat;
  const double rs_xfer = sp ? 4 * L * per_call : 0.0;
  const double ag_xfer = sp ? 4 * L * per_call : 0.0;
  const double ar_xfer = sp ? 0.0 : 4 * L * (2 * per_call - lat);

  // Per-rank work. A fraction of the compute is length-dependent work on the sequence
  // shard under SP, weighted by the rank's shard (ShardWeights: 1 for equal lengths);
  // under TP-only every rank does 1/t of it, balanced. Jitter and stragglers multiply a
  // rank's whole busy time.
  std::vector<double> weights =
      sp ? ShardWeights(lengths, t, b.padded) : std::vector<double>(t, 1.0);
  std::normal_distribution<double> noise(0.0, p_.jitter);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  GroupStep out;
  out.mode = mode;
  out.ranks.resize(t);
  double slowest = 0;
  const bool in_burst = p_.straggler_burst_every <= 0 ||
                        step % p_.straggler_burst_every < p_.straggler_burst_steps;
  for (int r = 0; r < t; ++r) {
    double factor = std::max(0.5, 1.0 + noise(rng));
    if (p_.straggler_prob > 0 && u(rng) < p_.straggler_prob && in_burst) {
      factor += p_.straggler_slowdown;
    }
    const double compute = gemm + attn;
    const double f = p_.shard_work_fraction;
    out.ranks[r].busy_s = (compute * (1.0 - f) + compute * f * weights[r] + elem) * factor;
    slowest = std::max(slowest, out.ranks[r].busy_s);
  }
  // Collectives synchronise the group: every rank finishes with the slowest, and under SP
  // the time it waits for it is spent inside reduce-scatter (the region's exit).
  out.step_time_s = slowest + rs_xfer + ag_xfer + ar_xfer;
  for (RankStep& r : out.ranks) {
    if (sp) {
      r.rs_wait_s = rs_xfer + (slowest - r.busy_s);
      r.all_gather_s = ag_xfer;
    }
    out.group_rs_wait_share = std::max(out.group_rs_wait_share, r.rs_wait_s / out.step_time_s);
  }
  out.effective_tokens = static_cast<int64_t>(b.tokens);
  out.padding_tokens = sp ? b.padded - static_cast<int64_t>(b.tokens) : 0;
  const MemoryPrediction m = PredictMemory(lengths);
  out.peak_memory_bytes = sp ? m.sp : m.tp;
  return out;
}

}  // namespace spgate::sim
