// spgate-sim's cost model: what one step of a TP group costs in each mode, per rank —
// the telemetry a real worker would measure (docs/design.md §2) — and the activation
// memory of each mode (Korthikanti et al. 2022). Documented with its assumptions in
// docs/sim.md; the invariant that matters: a uniform-length batch shards evenly under SP,
// and the per-rank imbalance (hence the reduce-scatter wait) grows with the spread of
// lengths.
//
// Usage:
//   spgate::sim::CostModel model(spgate::sim::CostParams{});   // 13B stage, t = 8, H100-like
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
#include <vector>

#include "absl/status/status.h"
#include "policy/types.h"

namespace spgate::sim {

struct CostParams {
  int tp = 8;
  // Layers on this rank: by default one pipeline stage (8 of a 40-layer 13B model), which
  // fits an 80 GiB device at every t from 1 to 8, so the memory gate is opt-in (a
  // smaller --device_memory_gib, more --tokens_per_batch or --layers).
  int layers = 8;
  int hidden = 5120;
  int heads = 40;
  double device_tflops = 989;     // dense bf16 peak (H100 SXM)
  double mfu = 0.45;              // achieved fraction of peak on GEMMs and attention
  double hbm_gbps = 3350;         // device memory bandwidth (element-wise region)
  double link_gbps = 450;         // collective bus bandwidth within the TP group (NVLink)
  double collective_latency_us = 10;  // fixed cost per collective call
  double elementwise_bytes_per_token = 16;  // × hidden × 2 bytes, per layer, fwd+bwd
  // Fraction of a rank's compute that, under SP, runs on its sequence shard with a cost
  // per token that grows with the token's sequence length (see docs/sim.md): the
  // source of per-rank imbalance, hence of reduce-scatter wait, on mixed-length batches.
  double shard_work_fraction = 0.5;
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
  double device_memory_gib = 80;
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
};

struct RankStep {
  double rs_wait_s = 0;     // inside reduce-scatter calls (transfer + waiting for peers)
  double all_gather_s = 0;
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
};

struct MemoryPrediction {
  uint64_t sp = 0, tp = 0;  // predicted peak bytes per rank
  uint64_t budget = 0;      // device memory
};

// INVALID_ARGUMENT naming --switch_cost_s unless it is finite and >= 0.
absl::Status ValidateSwitchCost(const CostParams& params);

class CostModel {
 public:
  explicit CostModel(const CostParams& params) : p_(params) {}

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
};

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_COST_MODEL_H_
