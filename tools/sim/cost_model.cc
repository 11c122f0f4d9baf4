// The cost model of docs/sim.md, term by term.
#include "tools/sim/cost_model.h"

#include <limits>
#include <tuple>
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "policy/telemetry.h"
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

// The causal attention cost of each sequence shard of the packed batch, divided by the
// mean over shards: a token at position p of its sequence attends to p + 1 keys, so a
// shard's cost is Σ (p + 1) over its tokens (1 everywhere when attention is balanced).
// Used for the share of attention that runs on the shard (shard_work_fraction).
std::vector<double> ShardCausalWeights(std::span<const int64_t> lengths, int t,
                                       int64_t padded) {
  std::vector<double> w(t, 0.0);
  const int64_t shard = padded / t;
  int64_t pos = 0;
  for (int64_t s : lengths) {
    int64_t done = 0;  // positions of this sequence already placed
    while (done < s) {
      const int r = static_cast<int>(std::min<int64_t>(pos / shard, t - 1));
      const int64_t room = (r + 1) * shard - pos;
      const int64_t n = std::min(s - done, std::max<int64_t>(room, 1));
      // Σ_{p = done}^{done + n - 1} (p + 1) = ((done + n)(done + n + 1) - done(done + 1)) / 2
      const double a = static_cast<double>(done), b = static_cast<double>(done + n);
      w[r] += (b * (b + 1) - a * (a + 1)) / 2;
      pos += n;
      done += n;
    }
  }
  double mean = 0;
  for (double x : w) mean += x;
  mean /= t;
  for (double& x : w) x = mean > 0 ? x / mean : 1.0;
  return w;
}

const HardwarePreset* DefaultPreset() {
  absl::StatusOr<const HardwarePreset*> p = FindHardwarePreset(kDefaultHardware);
  return p.ok() ? *p : nullptr;
}

absl::Status PositiveFlag(const char* flag, double v) {
  if (std::isfinite(v) && v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be a finite number > 0, got ", v));
}

}  // namespace

CostParams::CostParams() {
  if (const HardwarePreset* p = DefaultPreset()) ApplyHardwarePreset(*p, *this);
}

void ApplyHardwarePreset(const HardwarePreset& preset, CostParams& p) {
  p.hardware = preset.name;
  p.device_tflops = preset.device_tflops;
  p.mfu = preset.gemm_mfu;
  p.attention_tflops = preset.attention_tflops;
  p.hbm_gbps = preset.hbm_gbps;
  p.device_memory_gib = preset.device_memory_gib;
  p.nvls = preset.nvls;
  p.link_gbps = preset.link_gbps;
  p.collective_latency_us = preset.collective_latency_us;
}

absl::StatusOr<NormBoundary> ParseNormBoundary(const std::string& value) {
  if (value == "shard") return NormBoundary::kShard;
  if (value == "gather") return NormBoundary::kGather;
  return absl::InvalidArgumentError(
      absl::StrCat("--norm_boundary must be shard or gather, got \"", value, "\""));
}

const char* NormBoundaryName(NormBoundary b) {
  return b == NormBoundary::kGather ? "gather" : "shard";
}

absl::Status ValidateCostParams(const CostParams& p) {
  // The model's shape, in spgate-worker's bounds: a 0 or a negative one wrapped the memory
  // prediction to 2^64, a huge one overflows it.
  const std::tuple<const char*, int, int> shape[] = {
      {"layers", p.layers, 1024}, {"hidden", p.hidden, 1 << 20}, {"heads", p.heads, 1 << 20}};
  for (const auto& [flag, v, most] : shape) {
    if (v < 1 || v > most) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be in [1, ", most, "], got ", v));
    }
  }
  if (p.heads > p.hidden) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heads must be at most --hidden (", p.hidden, "), got ", p.heads));
  }
  // A model whose heads do not split its hidden size evenly does not exist; one whose
  // heads do not split over the TP ranks cannot run Megatron's TP (spgate-worker refuses
  // both). Without flash attention the score term counts heads / t per rank, so that is
  // refused here; with it no term reads the head count, and spgate-sim says so instead
  // (WarnHeadsNotSplit): the benchmarks' TP 16 cells run the 40-head default.
  if (p.hidden % p.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden=", p.hidden,
                                                   " is not divisible by --heads=", p.heads,
                                                   " (every head has hidden / heads values)"));
  }
  if (!p.flash_attention && p.heads % p.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heads=", p.heads, " is not divisible by --tp=", p.tp,
        " (each TP rank runs whole heads; --flash_attention=false counts heads / tp score "
        "activations per rank)"));
  }
  const std::pair<const char*, double> positive[] = {
      {"device_tflops", p.device_tflops},   {"mfu", p.mfu},
      {"attention_tflops", p.attention_tflops}, {"hbm_gbps", p.hbm_gbps},
      {"device_memory_gib", p.device_memory_gib}, {"link_gbps", p.link_gbps},
      {"norm_passes", p.norm_passes},       {"dropout_passes", p.dropout_passes}};
  for (const auto& [flag, v] : positive) {
    if (absl::Status s = PositiveFlag(flag, v); !s.ok()) return s;
  }
  if (p.mfu > 1) return absl::InvalidArgumentError(absl::StrCat("--mfu must be <= 1, got ", p.mfu));
  if (!std::isfinite(p.collective_latency_us) || p.collective_latency_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collective_latency_us must be a finite number >= 0, got ", p.collective_latency_us));
  }
  if (!std::isfinite(p.jitter) || p.jitter < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--jitter must be a finite number >= 0, got ", p.jitter));
  }
  if (!(p.straggler_prob >= 0 && p.straggler_prob <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--straggler_prob must be in [0, 1], got ", p.straggler_prob));
  }
  if (!std::isfinite(p.straggler_slowdown) || p.straggler_slowdown < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler_slowdown must be a finite number >= 0, got ", p.straggler_slowdown));
  }
  if (p.straggler_burst_every < 0 || p.straggler_burst_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler_burst_every and --straggler_burst_steps must be >= 0, got ",
        p.straggler_burst_every, " and ", p.straggler_burst_steps));
  }
  // A burst is straggler_burst_steps steps out of every straggler_burst_every: one flag
  // without the other, or a burst as long as its period, would be the same as no bursts.
  if (p.straggler_burst_steps > 0 && p.straggler_burst_every == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler_burst_steps=", p.straggler_burst_steps,
        " needs --straggler_burst_every (a burst starts every that many steps)"));
  }
  if (p.straggler_burst_every > 0 && p.straggler_burst_steps == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler_burst_every=", p.straggler_burst_every,
        " needs --straggler_burst_steps >= 1 (the length of each burst; 0 would mean no "
        "stragglers at all)"));
  }
  if (p.straggler_burst_every > 0 && p.straggler_burst_steps >= p.straggler_burst_every) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler_burst_steps=", p.straggler_burst_steps,
        " must be less than --straggler_burst_every=", p.straggler_burst_every,
        " (a burst as long as its period is stragglers on every step: leave both out)"));
  }
  if (!(p.shard_work_fraction >= 0 && p.shard_work_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_work_fraction must be in [0, 1], got ", p.shard_work_fraction));
  }
  if (!p.flat_link && p.tp > 1) {
    absl::StatusOr<const HardwarePreset*> hw = FindHardwarePreset(p.hardware);
    if (!hw.ok()) return absl::InvalidArgumentError(absl::StrCat("--hardware: ", hw.status().message()));
    for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                             CollectiveKind::kReduceScatter}) {
      if ((*hw)->Curve(k, p.tp, p.nvls) == nullptr) {
        return absl::NotFoundError(absl::StrCat("--hardware=", p.hardware, " has no ",
                                                CollectiveKindName(k), " curve for --tp=", p.tp,
                                                " (give --link_gbps for a flat link)"));
      }
    }
  }
  return ValidateSwitchCost(p);
}

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
  // The gather boundary keeps both LayerNorms' inputs (2·T·h bytes each) whole again.
  const double norm_whole =
      p_.norm_boundary == NormBoundary::kGather ? 4.0 * b.tokens * h * (1.0 - 1.0 / t) : 0.0;
  const double act_sp = L * (static_cast<double>(b.padded) * h * 34.0 / t + norm_whole + scores);
  // Byte counts past 2^64 (shapes at the flags' bounds, a sequence without flash
  // attention) saturate rather than wrap: a cast past the range is undefined.
  auto bytes = [](double v) {
    return v >= 0x1p64 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(v);
  };
  MemoryPrediction m;
  m.tp = bytes(states + act_tp);
  m.sp = bytes(states + act_sp);
  m.budget = bytes(p_.device_memory_gib * static_cast<double>(1ull << 30));
  return m;
}

CostModel::CostModel(const CostParams& params) : p_(params) {
  if (p_.flat_link) return;
  absl::StatusOr<const HardwarePreset*> hw = FindHardwarePreset(p_.hardware);
  if (!hw.ok()) return;
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                           CollectiveKind::kReduceScatter}) {
    curves_[static_cast<int>(k)] = (*hw)->Curve(k, p_.tp, p_.nvls);
  }
}

double CostModel::CollectiveSeconds(CollectiveKind kind, double bytes) const {
  if (p_.tp <= 1 || !(bytes > 0)) return 0;
  if (const CollectiveCurve* c = curves_[static_cast<int>(kind)]) {
    return c->Seconds(kind, p_.tp, bytes);
  }
  return bytes * BusBandwidthFactor(kind, p_.tp) / (p_.link_gbps * 1e9) +
         p_.collective_latency_us * 1e-6;
}

StepTerms CostModel::Terms(double T, double sum_sq, Mode mode) const {
  const double t = p_.tp, h = p_.hidden, L = p_.layers;
  const bool sp = mode == Mode::kSequenceParallel;
  const bool gather = sp && p_.norm_boundary == NormBoundary::kGather;
  const double gemm_rate = p_.device_tflops * 1e12 * p_.mfu;
  StepTerms x;
  // Forward + backward FLOPs split over the t ranks: GEMMs 72·h²·T per layer, causal
  // attention 6·h·Σs² per layer (on the gathered sequence, heads split, in both modes).
  x.gemm_s = L * 72.0 * h * h * T / (t * gemm_rate);
  x.attention_s = L * 6.0 * h * sum_sq / (t * p_.attention_tflops * 1e12);
  // The element-wise region: every rank streams all T tokens under TP-only, its shard's
  // T/t under SP; the gather boundary runs LayerNorm on the whole sequence again.
  const double norm_tokens = sp && !gather ? T / t : T;
  const double other_tokens = sp ? T / t : T;
  x.elementwise_s = L * h * 2.0 * (p_.norm_passes * norm_tokens + p_.dropout_passes * other_tokens) /
                    (p_.hbm_gbps * 1e9);
  // Collectives of the activation, T·h bf16 values. TP-only: 2 all-reduces forward, 2
  // backward per layer. SP: 2 all-gathers and 2 reduce-scatters forward, 2 of each backward,
  // plus the re-gather of the 2 column-parallel inputs for the weight gradients, which
  // overlaps the input-gradient GEMM (Korthikanti et al. §4.2.2).
  const double bytes = T * h * 2.0;
  if (!sp) {
    x.all_reduce_s = 4 * L * CollectiveSeconds(CollectiveKind::kAllReduce, bytes);
    return x;
  }
  const double ag = CollectiveSeconds(CollectiveKind::kAllGather, bytes);
  const double rs = CollectiveSeconds(CollectiveKind::kReduceScatter, bytes);
  // The input-gradient GEMMs of QKV (3h²) and FC1 (4h²): 2·T·7h²/t FLOPs a layer.
  const double dgrad_s = 2.0 * T * 7.0 * h * h / (t * gemm_rate);
  x.all_gather_s = L * (4 * ag + std::max(0.0, 2 * ag - dgrad_s));
  x.reduce_scatter_s = 4 * L * rs;
  if (p_.tp_comm_overlap) {
    // Ideal overlap with the GEMMs: only what exceeds them is exposed.
    const double comm = x.all_gather_s + x.reduce_scatter_s;
    const double exposed = comm > 0 ? std::max(0.0, comm - x.gemm_s) / comm : 0.0;
    x.all_gather_s *= exposed;
    x.reduce_scatter_s *= exposed;
  }
  // The gather boundary: one all-gather of each LayerNorm's input forward, one backward.
  if (gather) x.norm_gather_s = 4 * L * ag;
  return x;
}

double GroupStep::straggler_s() const {
  absl::InlinedVector<double, 16> busy;
  for (const RankStep& r : ranks) busy.push_back(r.busy_s);
  return StragglerSeconds(std::span<double>(busy.data(), busy.size()));
}

GroupStep CostModel::Step(std::span<const int64_t> lengths, Mode mode, std::mt19937_64& rng,
                          int64_t step) const {
  const int t = p_.tp;
  const BatchShape b = Shape(lengths, t);
  const bool sp = mode == Mode::kSequenceParallel;
  const StepTerms x = Terms(sp ? static_cast<double>(b.padded) : b.tokens, b.sum_sq, mode);

  // Per-rank work: the same rows on every rank; under SP the share of attention that runs
  // on the sequence shard is weighted by the shard's causal cost (1 when balanced). Jitter
  // and stragglers multiply a rank's whole busy time.
  const double f = sp ? p_.shard_work_fraction : 0.0;
  const std::vector<double> weights =
      f > 0 ? ShardCausalWeights(lengths, t, b.padded) : std::vector<double>(t, 1.0);
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
    const double attention = x.attention_s * ((1.0 - f) + f * weights[r]);
    out.ranks[r].busy_s = (x.gemm_s + attention + x.elementwise_s) * factor;
    slowest = std::max(slowest, out.ranks[r].busy_s);
  }
  // Collectives synchronise the group: every rank finishes with the slowest, and under SP
  // the time it waits for it is spent inside reduce-scatter (the region's exit).
  out.step_time_s =
      slowest + x.all_reduce_s + x.all_gather_s + x.reduce_scatter_s + x.norm_gather_s;
  for (RankStep& r : out.ranks) {
    if (sp) {
      r.rs_wait_s = x.reduce_scatter_s + (slowest - r.busy_s);
      r.all_gather_s = x.all_gather_s;
      r.norm_stall_s = x.norm_gather_s;
    } else {
      r.all_reduce_s = x.all_reduce_s + (slowest - r.busy_s);
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
