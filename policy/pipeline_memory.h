// Pipeline schedules and what a stage holds under them: the schedule-aware memory gate's
// arithmetic (docs/design.md §12). Under pipeline parallelism a stage keeps the
// activations of every micro-batch it has run forward and not yet backward, each in the
// mode that micro-batch was decided in: under 1F1B stage s of p holds up to p − s of them,
// under interleaved 1F1B more (and in chunks). A gate that checks one micro-batch's peak
// lets the first stage run TP-only into an OOM, which is where SP's saving matters most.
//
// StageSchedule replays the order in which a stage runs its forwards and backwards (the
// order Megatron-Core's 1F1B and interleaved 1F1B schedules use, without their p2p
// overlap, which does not change what is held); StagePeakBytes walks it with each
// micro-batch's bytes in its mode; StageMemoryGate lets a micro-batch run TP-only only
// while the stage's peak over the whole step stays under the limit. Pure functions:
// the daemon, the worker's fallback and the simulator call the same code.
//
// Usage:
//   PipelineLayout layout{.pp = 4, .microbatches = 8};
//   ASSIGN_OR_RETURN(std::vector<PipelineOp> ops, StageSchedule(layout, stage));
//   StageMemoryGate gate(ops, resident, per_microbatch, StageMemoryLimit(budget, config));
//   ApplyStageMemoryGate(gate, decisions);  // a TP-only decision that does not fit runs SP
#ifndef SPGATE_POLICY_PIPELINE_MEMORY_H_
#define SPGATE_POLICY_PIPELINE_MEMORY_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/types.h"

namespace spgate {

enum class PipelineSchedule : uint8_t {
  k1F1B,             // one model chunk per stage
  kInterleaved1F1B,  // vp model chunks per stage (virtual pipeline)
};

struct PipelineLayout {
  int pp = 1;            // pipeline stages
  int vp = 1;            // model chunks per stage: 1 for 1F1B, >= 2 interleaved
  int microbatches = 1;  // per optimizer step
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
};

// The largest layout the arithmetic accepts (a stage's op list is 2 * microbatches * vp).
inline constexpr int kMaxPipelineStages = 1024;
inline constexpr int kMaxVirtualStages = 64;
inline constexpr int kMaxMicrobatches = 65536;

// INVALID_ARGUMENT naming the field: pp, vp, microbatches out of range; 1F1B with vp != 1;
// interleaved with vp < 2, or with microbatches not a multiple of pp (the interleaved
// schedule runs micro-batches in groups of pp).
absl::Status ValidatePipelineLayout(const PipelineLayout& layout);

// One forward or backward of one micro-batch's model chunk on a stage.
struct PipelineOp {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;  // 0 .. vp - 1
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};

// Stage `stage`'s ops in the order it runs them: warm-up forwards, then one forward and
// one backward in turn, then the remaining backwards. Every (micro-batch, chunk) appears
// once forward and once backward, the backward after its forward. INVALID_ARGUMENT for a
// bad layout or a stage outside [0, pp).
absl::StatusOr<std::vector<PipelineOp>> StageSchedule(const PipelineLayout& layout, int stage);

// The most (micro-batch, chunk) activations the ops hold at once.
int MaxInFlight(std::span<const PipelineOp> ops);

// What one micro-batch costs a stage in each mode: the activations one model chunk keeps
// for backward, and the workspace a chunk's forward or backward needs while it runs (freed
// after it). Index [microbatch]; the chunks of a stage are taken to be alike.
struct MicrobatchMemory {
  uint64_t activation_sp = 0, activation_tp = 0;
  uint64_t workspace_sp = 0, workspace_tp = 0;
  friend bool operator==(const MicrobatchMemory&, const MicrobatchMemory&) = default;
};

// The stage's peak over the step: `resident` (parameters, gradients, optimizer state)
// plus, at every op, the activations held and the op's workspace, each micro-batch in
// modes[microbatch]. Preconditions (the callers to come must check them; not yet wired in,
// docs/design.md §12): `memory`, `modes` and the gate's `wanted` have one entry per
// micro-batch of the layout `ops` came from, and every byte count and their sum over a
// step stay below 2^62 (no overflow checks here).
uint64_t StagePeakBytes(std::span<const PipelineOp> ops, uint64_t resident,
                        std::span<const MicrobatchMemory> memory, std::span<const Mode> modes);

// The stage gate's limit for the daemon, the worker and the simulator: budget x
// memory_headroom, at least one byte; 0 (no gate) when the budget is 0 (unknown).
uint64_t StageMemoryLimit(uint64_t budget_bytes, const GateConfig& config);

// The schedule-aware memory gate, one micro-batch at a time: every micro-batch starts SP
// and TryTpOnly(i) lets micro-batch i run TP-only only if the stage's peak over the whole
// step with it (and the TP-only ones before it) stays within `limit_bytes` (0: no limit).
// A caller that decides micro-batches in order (a policy whose state advances with each
// decision) asks it as it goes (Admit); ApplyStageMemoryGate is the same over a step's
// decisions made elsewhere. Keeps spans into `memory`, which must outlive it.
// Preconditions as StagePeakBytes'.
class StageMemoryGate {
 public:
  StageMemoryGate(std::span<const PipelineOp> ops, uint64_t resident,
                  std::span<const MicrobatchMemory> memory, uint64_t limit_bytes);
  // Whether the step fits with every micro-batch SP (if not, only a forced TP-only runs).
  bool all_sp_fits() const;
  uint64_t all_sp_peak_bytes() const { return all_sp_peak_; }
  // Sets micro-batch `microbatch` TP-only and returns true if it fits (always, with
  // `force`: a forced operator pin); false leaves it SP.
  bool TryTpOnly(int microbatch, bool force = false);
  // The gate's verdict on micro-batch `microbatch` decided `wanted`: `wanted` unless it is
  // TP-only and does not fit (TryTpOnly; it always fits when an operator forced it, a
  // PINNED decision under a forced pin: `pin_forced`), then SP, reason MEMORY_REQUIRES_SP,
  // or MEMORY_OVER_BUDGET when the all-SP step does not fit either.
  Decision Admit(int microbatch, Decision wanted, bool pin_forced = false);
  const std::vector<Mode>& modes() const { return modes_; }
  uint64_t peak_bytes() const;  // with the modes set so far
  // peak_bytes() within the limit.
  bool fits() const { return limit_ == 0 || peak_bytes() <= limit_; }
  // Every micro-batch SP again, as constructed (no allocation).
  void Reset();

 private:
  std::span<const MicrobatchMemory> memory_;
  uint64_t resident_ = 0, limit_ = 0, all_sp_peak_ = 0;
  std::vector<Mode> modes_;
  std::vector<uint64_t> level_;  // per op: resident + held + workspace
  std::vector<uint64_t> all_sp_level_;  // level_ with every micro-batch SP
  std::vector<std::vector<std::pair<size_t, size_t>>> spans_;  // per micro-batch: (fwd, bwd) ops
  std::vector<int64_t> delta_;
};

// The gate over a step's decisions (index = micro-batch id) decided elsewhere (the worker's
// commit of the daemon's answer, the simulator's fixed TP-only choice), in place, on a gate
// with every micro-batch SP: the TP-only decisions as a whole where they fit together
// (a plan whose TP-only micro-batches were chosen by gain, DecideStagePlan, fits as a whole
// where a prefix of it in id order may not: a micro-batch whose TP-only workspace is below
// SP's), else Admit over them in id order. Returns how many it made SP.
int ApplyStageMemoryGate(StageMemoryGate& gate, std::span<Decision> decisions,
                         bool pin_forced = false);

}  // namespace spgate

#endif  // SPGATE_POLICY_PIPELINE_MEMORY_H_
