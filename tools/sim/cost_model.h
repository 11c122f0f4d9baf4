// spgate-sim's cost model: what one step of a TP group costs in each mode, per rank —
// the telemetry a real worker would measure (docs/design.md §2) — and the activation
// memory of each mode (Korthikanti et al. 2022), from published H100 / H200 measurements
// (policy/hardware.h: collectives by kind and message size, GEMM and attention rates,
// HBM bandwidth). Documented term by term, every constant with its source, in
// docs/sim.md. The invariants that matter: under SP every rank holds the same rows, so a
// batch shards evenly unless attention runs on the sequence shard
// (--shard_work_fraction > 0: the causal cost of each shard's positions); TP-only's
// collectives are all-reduces, SP's all-gather + reduce-scatter pairs of the same bytes.
//
// Usage:
//   spgate::sim::CostModel model(spgate::sim::CostParams{});   // 13B stage, t = 8, h100-sxm
//   spgate::sim::CostParams p;
//   spgate::sim::ApplyHardwarePreset(**spgate::FindHardwarePreset("h200-sxm"), p);
//   spgate::sim::MemoryPrediction mem = model.PredictMemory(lengths);
//   spgate::sim::GroupStep step = model.Step(lengths, Mode::kSequenceParallel, rng);
//   step.ranks[r].rs_wait_s / step.step_time_s ...
//   step.step_time_s += model.SwitchSeconds(previous_mode, Mode::kSequenceParallel);
#ifndef SPGATE_TOOLS_SIM_COST_MODEL_H_
#define SPGATE_TOOLS_SIM_COST_MODEL_H_

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/hardware.h"
#include "policy/types.h"

namespace spgate::sim {

// Where LayerNorm runs under SP (spgate-worker's --norm_boundary, docs/worker.md): inside
// the sequence shard, or on the all-gathered sequence (one all-gather of its input
// forward and one backward per LayerNorm: the norm stalls).
enum class NormBoundary { kShard, kGather };
// "shard" or "gather"; INVALID_ARGUMENT names --norm_boundary.
absl::StatusOr<NormBoundary> ParseNormBoundary(const std::string& value);
const char* NormBoundaryName(NormBoundary boundary);

// The hardware preset every default below comes from (h100-sxm, policy/hardware/).
inline constexpr char kDefaultHardware[] = "h100-sxm";

struct CostParams {
  int tp = 8;
  // Layers on this rank: by default one pipeline stage (8 of a 40-layer 13B model), which
  // fits an 80 GiB device at every t from 1 to 8, so the memory gate is opt-in (a
  // smaller --device_memory_gib, more --tokens_per_batch or --layers).
  int layers = 8;
  int hidden = 5120;
  int heads = 40;
  // The hardware: its collective curves (policy/hardware/collectives.csv) and the device
  // constants below, which default to its row of presets.csv (ApplyHardwarePreset).
  std::string hardware = kDefaultHardware;
  double device_tflops = 0;        // dense bf16 peak
  double mfu = 0;                  // achieved fraction of peak on GEMMs
  double attention_tflops = 0;     // achieved attention (FlashAttention-2) rate
  double hbm_gbps = 0;             // achieved HBM bandwidth (element-wise region)
  double device_memory_gib = 0;
  bool nvls = true;                // NVLink SHARP where the curves have it (TP 8)
  // flat_link: every collective is bytes x factor / link_gbps + collective_latency_us
  // instead of the measured curves (spgate-sim's --link_gbps given explicitly). The two
  // also are what the simulated worker declares for ADAPTIVE's prior.
  bool flat_link = false;
  double link_gbps = 0;
  double collective_latency_us = 0;
  // Element-wise passes over a token's h bf16 values per layer, forward + backward,
  // counted from the layer (docs/sim.md): two fused add + LayerNorm (4 streams forward,
  // 4 backward each) and two bias-dropout (2.5 forward, 2.5 backward each).
  double norm_passes = 16;
  double dropout_passes = 10;
  NormBoundary norm_boundary = NormBoundary::kShard;
  // SP's all-gathers and reduce-scatters overlap the GEMMs (Megatron --tp-comm-overlap);
  // modelled as ideal: only what exceeds the GEMM time is exposed.
  bool tp_comm_overlap = false;
  // Fraction of attention that, under SP, runs on the rank's own sequence shard (as
  // context parallelism does) instead of on the gathered sequence split by heads
  // (Megatron SP: 0, no imbalance). Each shard's share is the causal cost of its
  // positions, Σ (position in its sequence + 1): the mechanism of docs/sim.md's
  // "Imbalance". A what-if, not a measurement.
  double shard_work_fraction = 0;
  bool flash_attention = true;    // no s×s score activations kept (Korthikanti's
                                  // selective recomputation)
  double jitter = 0.03;           // per-rank, per-step multiplicative noise (σ)
  double straggler_prob = 0.0;    // per rank and step: a slow rank (noisy neighbour)
  double straggler_slowdown = 0.5;
  // Bursts: with straggler_burst_every > 0, stragglers happen only on steps k with
  // k % straggler_burst_every < straggler_burst_steps (a neighbour's job that comes and
  // goes), at straggler_prob. Needs the step passed to Step.
  int64_t straggler_burst_every = 0;
  int64_t straggler_burst_steps = 0;
  double param_bytes_per_param = 16;  // fp16 weights + grads, fp32 master + Adam m, v
  // Pipelines only (pipeline.h; pp = microbatches = 1 reads neither): the vocabulary of
  // the first stage's embedding and the last stage's output layer, and the bandwidth of
  // one rank's stage-to-stage messages (one 400 Gb/s NIC per device).
  int vocab = 51200;
  double p2p_gbps = 50;
  // What a mode switch costs: each time a group runs a different mode from its previous
  // step (a pipeline stage: from its previous micro-batch), that step takes this many
  // seconds more (re-planned buffers, cold caches, a different communicator's first
  // call). 0: switching is free.
  double switch_cost_s = 0;

  CostParams();  // the device constants of kDefaultHardware
};

// Sets `p`'s hardware name and device constants (tflops, mfu, attention, HBM, memory,
// NVLS, link and latency) from `preset`.
void ApplyHardwarePreset(const HardwarePreset& preset, CostParams& p);

struct RankStep {
  double rs_wait_s = 0;     // inside reduce-scatter calls (transfer + waiting for peers)
  double all_gather_s = 0;  // the layers' all-gathers (not the norm boundary's)
  double norm_stall_s = 0;  // collectives that exist only because LayerNorm left the shard
  double all_reduce_s = 0;  // inside all-reduce calls (TP-only: transfer + waiting for peers)
  double busy_s = 0;        // this rank's own work
};

struct GroupStep {
  Mode mode = Mode::kSequenceParallel;
  double step_time_s = 0;   // wall time of the step (same on every rank: collectives)
  std::vector<RankStep> ranks;
  int64_t effective_tokens = 0;
  int64_t padding_tokens = 0;  // SP pads the packed batch to a multiple of t
  uint64_t peak_memory_bytes = 0;
  double group_rs_wait_share = 0;  // max over ranks of rs_wait / step time (docs/design.md §2)

  // The group record's all-gather and reduce-scatter seconds (docs/design.md §2): the
  // largest rank's, the wait as the largest share times the step time.
  double group_all_gather_s() const {
    double s = 0;
    for (const RankStep& r : ranks) s = s > r.all_gather_s ? s : r.all_gather_s;
    return s;
  }
  double group_rs_wait_s() const { return group_rs_wait_share * step_time_s; }
  // The slowest rank's busy time beyond the median rank's (StragglerSeconds).
  double straggler_s() const;
};

struct MemoryPrediction {
  uint64_t sp = 0, tp = 0;  // predicted peak bytes per rank
  uint64_t budget = 0;      // device memory
};

// INVALID_ARGUMENT naming --switch_cost_s unless it is finite and >= 0.
absl::Status ValidateSwitchCost(const CostParams& params);
// INVALID_ARGUMENT naming the flag for a device constant that is not finite and > 0
// (--mfu also <= 1), a --shard_work_fraction outside [0, 1], a --hidden not divisible by
// --heads (or, without flash attention, --heads not divisible by --tp), straggler bursts
// given by one of their two flags or as long as their period, or, without --link_gbps,
// a --hardware whose curves do not serve --tp (NOT_FOUND names it); includes
// ValidateSwitchCost.
absl::Status ValidateCostParams(const CostParams& params);

// The seconds of each layer term of one step, for docs and tests (Step adds noise,
// imbalance and stragglers on top of these).
struct StepTerms {
  double gemm_s = 0, attention_s = 0, elementwise_s = 0;
  double all_reduce_s = 0, all_gather_s = 0, reduce_scatter_s = 0;  // exposed, all layers
  double norm_gather_s = 0;  // the gather boundary's all-gathers
};

class CostModel {
 public:
  // The collective curves come from params.hardware; an unknown name or a TP degree
  // without curves (see ValidateCostParams) falls back to the flat link model.
  explicit CostModel(const CostParams& params);

  // One call of `kind` over the TP group moving `bytes` (nccl-tests' size: the whole
  // gathered / reduced buffer), seconds.
  double CollectiveSeconds(CollectiveKind kind, double bytes) const;
  // The noise-free terms of a step of `tokens` tokens (padded ones under SP) with
  // Σ s_i² = `sum_sq`.
  StepTerms Terms(double tokens, double sum_sq, Mode mode) const;

  MemoryPrediction PredictMemory(std::span<const int64_t> lengths) const;
  // `step` places the step in the straggler bursts (ignored without bursts). The number
  // of draws from `rng` is the same whatever the mode and the step, so two calls from
  // one generator state see the same noise.
  GroupStep Step(std::span<const int64_t> lengths, Mode mode, std::mt19937_64& rng,
                 int64_t step = 0) const;
  // The seconds a switch adds to a step run in `mode` after `previous` (switch_cost_s
  // when there was a previous mode and it differs; else 0).
  double SwitchSeconds(std::optional<Mode> previous, Mode mode) const {
    return previous.has_value() && *previous != mode ? p_.switch_cost_s : 0.0;
  }
  const CostParams& params() const { return p_; }

 private:
  CostParams p_;
  const CollectiveCurve* curves_[3] = {nullptr, nullptr, nullptr};  // by CollectiveKind
};

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_COST_MODEL_H_
