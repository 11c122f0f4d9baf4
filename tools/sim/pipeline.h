// spgate-sim's pipelines (docs/sim.md, "Pipelines"): what one micro-batch costs each
// stage of a pipeline-parallel job in each mode, the step time of the stages' schedule
// with a mode per (stage, micro-batch), and the oracle's modes of a stage's step — what
// `replay --compare` (compare.h) runs every cell on.
//
// The invariant that matters: a stage's per-micro-batch forward and backward times go
// through the schedule's dependencies (a forward waits for the previous stage's forward of
// the same micro-batch, a backward for the next stage's backward), so the step time is the
// timeline's critical path, not a sum — with equal times t per micro-batch on P stages a
// 1F1B step of M micro-batches takes (M + P − 1)·t, and a mode that only speeds up a stage
// off the critical path buys nothing. Memory is the daemon's own arithmetic
// (policy/pipeline_memory.h, policy/step_plan.h): the simulated STATIC and ADAPTIVE
// policies are DecideStagePlan itself.
//
// Usage:
//   PipelineCostModel model(options.cost, layout);
//   StageMicrobatchCost c = model.Cost(stage, lengths, rng, step);  // both modes, one draw
//   ASSIGN_OR_RETURN(PipelineTimeline t, SimulatePipeline(layout.pipeline(), fwd, bwd, p2p));
#ifndef SPGATE_TOOLS_SIM_PIPELINE_H_
#define SPGATE_TOOLS_SIM_PIPELINE_H_

#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "policy/types.h"
#include "tools/sim/cost_model.h"
#include "tools/sim/sim.h"

namespace spgate::sim {

// The share of a micro-batch's layer time that is its forward (the backward computes two
// GEMMs per forward one).
inline constexpr double kForwardShare = 1.0 / 3.0;

// The job layout of the options (tp = --tp, dp = --groups), checked with the daemon's
// ValidateJobLayout; INVALID_ARGUMENT naming the flag (--pp, --microbatches, --vp, ...).
absl::StatusOr<JobLayout> PipelineLayoutOf(const SimOptions& options);

// Index of a mode in the per-mode arrays below.
inline int ModeIndex(Mode mode) { return mode == Mode::kTensorParallelOnly ? 1 : 0; }

// One micro-batch on one stage, both modes from one noise draw (common random numbers).
struct StageMicrobatchCost {
  std::array<double, 2> forward_s{};   // [ModeIndex]: the stage's forward, whole stage
  std::array<double, 2> backward_s{};  // (every chunk of an interleaved stage together)
  double rs_wait_share_sp = 0;         // SP's group wait share (cost_model.h)
  double all_gather_s_sp = 0;          // SP's group all-gather seconds (its layers')
  MicrobatchMemory memory;             // per model chunk, as DecideStagePlan takes it
  int64_t tokens = 0;                  // effective tokens
  int64_t padded_tokens = 0;           // padded to a multiple of t (the sharded rows)
  std::array<double, 2> straggler_s{};  // [ModeIndex]: the layers' (GroupStep::straggler_s)
};

// A micro-batch's forward and backward on its stage in `mode`.
inline double StageSeconds(const StageMicrobatchCost& c, Mode mode) {
  const int i = ModeIndex(mode);
  return c.forward_s[i] + c.backward_s[i];
}

// Per-stage costs. The transformer layers of a stage are CostModel's (--layers per
// stage, so a pp-stage model has pp × layers); the first stage adds the vocabulary-
// parallel embedding, the last the output layer and the cross-entropy loss (--vocab),
// both in compute and in memory, with the constants docs/sim.md lists.
class PipelineCostModel {
 public:
  PipelineCostModel(const CostParams& params, const JobLayout& layout);

  // Parameters, gradients and optimizer state of `stage` (its layers, plus the embedding
  // on the first stage and the output layer on the last).
  uint64_t ResidentBytes(int stage) const;
  // What `lengths` costs `stage` in each mode, per model chunk: activations kept for the
  // backward, and the workspace of the chunk being run.
  MicrobatchMemory Memory(int stage, std::span<const int64_t> lengths) const;
  // Both modes' forward and backward times of `lengths` on `stage`. `rng` advances as one
  // CostModel::Step would (the same draws for either mode).
  StageMicrobatchCost Cost(int stage, std::span<const int64_t> lengths, std::mt19937_64& rng,
                           int64_t step) const;
  // One boundary message of a micro-batch of `padded_tokens` tokens, per rank: the
  // sequence-sharded rows spgate sends in both modes (docs/design.md §12), and the native
  // format's (SP's own shard; TP-only's every row). Bytes, fp16 hidden states.
  uint64_t ShardedBoundaryBytes(int64_t padded_tokens) const;
  uint64_t NativeBoundaryBytes(int64_t tokens, int64_t padded_tokens, Mode mode) const;
  // The time of one sharded boundary message over --p2p_gbps.
  double BoundarySeconds(int64_t padded_tokens) const;
  uint64_t budget_bytes() const { return layers_.PredictMemory({}).budget; }
  const CostModel& layers() const { return layers_; }  // one stage's transformer layers
  const JobLayout& layout() const { return layout_; }

 private:
  CostParams p_;
  JobLayout layout_;
  CostModel layers_;  // one stage's transformer layers
};

// The step of one pipeline: when every stage is done with it, and each stage's busy time.
struct PipelineTimeline {
  double step_time_s = 0;
  std::vector<double> busy_s;  // per stage: Σ of its ops' durations
  // 1 − Σ busy / (pp × step time): the idle share of the stages (bubble and p2p waits).
  double bubble_share() const;
};

// Runs every stage's ops in its StageSchedule order, each op as soon as its stage is free
// and its input has arrived: a forward of (micro-batch m, chunk c) after the forward of m
// on the virtual stage before it plus one p2p message (p2p_s[m]; none within a stage), a
// backward after the backward on the virtual stage after it (the last virtual stage's
// after its own forward). forward_s[stage][m] and backward_s[stage][m] are the whole
// stage's (split evenly over its vp chunks). INVALID_ARGUMENT for a bad layout or
// mis-sized inputs; INTERNAL if the schedule deadlocks (it must not).
absl::StatusOr<PipelineTimeline> SimulatePipeline(
    const PipelineLayout& layout, const std::vector<std::vector<double>>& forward_s,
    const std::vector<std::vector<double>>& backward_s, std::span<const double> p2p_s);

// The oracle's modes for one stage's step: TP-only for each micro-batch whose forward +
// backward is shorter TP-only, granted in order of the seconds it saves (ties by id) while
// the stage's schedule-aware memory gate (StageMemoryGate, limit 0: none) lets it. Returns
// how many such micro-batches the gate kept SP.
int64_t OracleStageModes(std::span<const PipelineOp> ops, uint64_t resident,
                         std::span<const StageMicrobatchCost> costs, uint64_t limit_bytes,
                         std::vector<Mode>& modes);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_PIPELINE_H_
