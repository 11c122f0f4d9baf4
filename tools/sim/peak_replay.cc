// A stage's peak as allocations on a counter; see peak_replay.h.
#include "tools/sim/peak_replay.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate::sim {

absl::StatusOr<uint64_t> ReplayStagePeak(std::span<const PipelineOp> ops, uint64_t resident,
                                         std::span<const MicrobatchMemory> memory,
                                         std::span<const Mode> modes) {
  if (memory.size() != modes.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory: %d micro-batches, modes: %d", memory.size(), modes.size()));
  }
  uint64_t live = resident, peak = resident;
  auto allocate = [&](uint64_t bytes) {
    live += bytes;
    peak = std::max(peak, live);
  };
  std::map<std::pair<int, int>, uint64_t> kept;  // (micro-batch, chunk) -> activation bytes
  for (size_t t = 0; t < ops.size(); ++t) {
    const PipelineOp& op = ops[t];
    if (op.microbatch < 0 || static_cast<size_t>(op.microbatch) >= modes.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ops[%d]: micro-batch %d outside [0, %d)", t, op.microbatch, modes.size()));
    }
    const MicrobatchMemory& m = memory[op.microbatch];
    const bool sp = modes[op.microbatch] == Mode::kSequenceParallel;
    const uint64_t workspace = sp ? m.workspace_sp : m.workspace_tp;
    const std::pair<int, int> unit{op.microbatch, op.chunk};
    if (op.forward) {
      const uint64_t activations = sp ? m.activation_sp : m.activation_tp;
      if (!kept.emplace(unit, activations).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "ops[%d]: micro-batch %d chunk %d runs forward twice", t, op.microbatch, op.chunk));
      }
      allocate(workspace);
      allocate(activations);
      live -= workspace;
    } else {
      const auto it = kept.find(unit);
      if (it == kept.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "ops[%d]: micro-batch %d chunk %d runs backward without its forward", t,
            op.microbatch, op.chunk));
      }
      allocate(workspace);
      live -= workspace + it->second;
      kept.erase(it);
    }
  }
  if (!kept.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ops: micro-batch %d chunk %d runs forward without its backward",
        kept.begin()->first.first, kept.begin()->first.second));
  }
  return peak;
}

}  // namespace spgate::sim
