// The simulator's own count of a pipeline stage's peak over a step (docs/design.md §12),
// kept apart from the gate's arithmetic on purpose: the over-limit check of `replay
// --compare` measures the modes the gate let run with this, not with StagePeakBytes
// (policy/pipeline_memory.h), so an error in the gate's count shows up as steps over the
// limit or as a disagreement in tests/tools/sim/peak_replay_test.cc instead of being
// measured with itself.
//
// The invariant: the stage's ops are replayed as allocations and frees on one counter,
// in schedule order. A forward of (micro-batch, chunk) allocates its workspace and its
// activations, then frees the workspace; a backward allocates its workspace while the
// activations are still live, then frees both. The peak is the counter's largest value
// after an allocation, starting from `resident`.
//
// Usage:
//   ASSIGN_OR_RETURN(uint64_t peak, ReplayStagePeak(ops, resident, memory, modes));
//   if (peak > limit) ++over_limit_steps;
#ifndef SPGATE_TOOLS_SIM_PEAK_REPLAY_H_
#define SPGATE_TOOLS_SIM_PEAK_REPLAY_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "policy/pipeline_memory.h"
#include "policy/types.h"

namespace spgate::sim {

// `memory` and `modes` one entry per micro-batch (index = id), each chunk of a micro-batch
// costing memory[id] in modes[id]. INVALID_ARGUMENT naming the op when the ops are not a
// step (a micro-batch outside `modes`, a chunk run forward twice, a backward without its
// forward, activations left at the end) or when `memory` and `modes` differ in size.
absl::StatusOr<uint64_t> ReplayStagePeak(std::span<const PipelineOp> ops, uint64_t resident,
                                         std::span<const MicrobatchMemory> memory,
                                         std::span<const Mode> modes);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_PEAK_REPLAY_H_
