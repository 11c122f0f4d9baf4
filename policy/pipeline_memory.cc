// Pipeline schedules and a stage's peak under them; see pipeline_memory.h.
#include "policy/pipeline_memory.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace spgate {

absl::Status ValidatePipelineLayout(const PipelineLayout& l) {
  if (l.pp < 1 || l.pp > kMaxPipelineStages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pp: must be in [1, %d], got %d", kMaxPipelineStages, l.pp));
  }
  if (l.microbatches < 1 || l.microbatches > kMaxMicrobatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "microbatches: must be in [1, %d], got %d", kMaxMicrobatches, l.microbatches));
  }
  if (l.vp < 1 || l.vp > kMaxVirtualStages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("vp: must be in [1, %d], got %d", kMaxVirtualStages, l.vp));
  }
  if (l.schedule == PipelineSchedule::k1F1B && l.vp != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "vp: the 1F1B schedule runs one model chunk per stage, got vp=%d (use the "
        "interleaved schedule)",
        l.vp));
  }
  if (l.schedule == PipelineSchedule::kInterleaved1F1B) {
    if (l.vp < 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "vp: the interleaved schedule needs at least 2 model chunks per stage, got %d", l.vp));
    }
    if (l.microbatches % l.pp != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "microbatches: the interleaved schedule runs micro-batches in groups of pp=%d; "
          "%d is not a multiple",
          l.pp, l.microbatches));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PipelineOp>> StageSchedule(const PipelineLayout& l, int stage) {
  if (absl::Status s = ValidatePipelineLayout(l); !s.ok()) return s;
  if (stage < 0 || stage >= l.pp) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stage: must be in [0, pp=%d), got %d", l.pp, stage));
  }
  const int total = l.microbatches * l.vp;  // (micro-batch, chunk) units
  int warmup;
  // The k-th forward (or backward) unit's micro-batch and chunk.
  auto unit = [&](int k, bool forward) {
    PipelineOp op;
    op.forward = forward;
    if (l.vp == 1) {
      op.microbatch = k;
      return op;
    }
    // Interleaved: micro-batches go in groups of pp through chunk 0, then the same group
    // through chunk 1, ...; backwards walk the chunks in reverse.
    const int in_round = k % (l.pp * l.vp);
    const int chunk = in_round / l.pp;
    op.chunk = forward ? chunk : l.vp - 1 - chunk;
    op.microbatch = (k / (l.pp * l.vp)) * l.pp + k % l.pp;
    return op;
  };
  if (l.vp == 1) {
    warmup = std::min(l.pp - stage - 1, total);
  } else if (l.microbatches == l.pp) {
    warmup = total;  // one group of micro-batches: every forward runs before a backward
  } else {
    warmup = std::min((l.pp - stage - 1) * 2 + (l.vp - 1) * l.pp, total);
  }
  std::vector<PipelineOp> ops;
  ops.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) ops.push_back(unit(k, true));
  const int steady = total - warmup;
  for (int i = 0; i < steady; ++i) {
    ops.push_back(unit(warmup + i, true));
    ops.push_back(unit(i, false));
  }
  for (int i = steady; i < total; ++i) ops.push_back(unit(i, false));
  return ops;
}

int MaxInFlight(std::span<const PipelineOp> ops) {
  int held = 0, most = 0;
  for (const PipelineOp& op : ops) {
    held += op.forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

namespace {

// The bytes a stage holds while it runs each op: resident + held activations + the op's
// workspace (a forward counts its own activations, a backward still holds them).
std::vector<uint64_t> Levels(std::span<const PipelineOp> ops, uint64_t resident,
                             std::span<const MicrobatchMemory> memory, std::span<const Mode> modes) {
  std::vector<uint64_t> level(ops.size());
  uint64_t held = 0;
  for (size_t t = 0; t < ops.size(); ++t) {
    const PipelineOp& op = ops[t];
    const MicrobatchMemory& m = memory[op.microbatch];
    const bool sp = modes[op.microbatch] == Mode::kSequenceParallel;
    const uint64_t act = sp ? m.activation_sp : m.activation_tp;
    if (op.forward) held += act;
    level[t] = resident + held + (sp ? m.workspace_sp : m.workspace_tp);
    if (!op.forward) held -= act;
  }
  return level;
}

uint64_t Peak(const std::vector<uint64_t>& level, uint64_t resident) {
  uint64_t peak = resident;
  for (uint64_t x : level) peak = std::max(peak, x);
  return peak;
}

}  // namespace

uint64_t StagePeakBytes(std::span<const PipelineOp> ops, uint64_t resident,
                        std::span<const MicrobatchMemory> memory, std::span<const Mode> modes) {
  return Peak(Levels(ops, resident, memory, modes), resident);
}

StageMemoryGate::StageMemoryGate(std::span<const PipelineOp> ops, uint64_t resident,
                                 std::span<const MicrobatchMemory> memory, uint64_t limit_bytes)
    : memory_(memory), resident_(resident), limit_(limit_bytes) {
  modes_.assign(memory.size(), Mode::kSequenceParallel);
  level_ = Levels(ops, resident, memory, modes_);
  all_sp_level_ = level_;
  all_sp_peak_ = Peak(level_, resident);
  // Where each micro-batch's chunks run forward and backward, so that trying TP-only for
  // one touches only the ops between its first forward and its last backward: the gate
  // costs O(micro-batches x the ops one is in flight for), not a replay per micro-batch.
  spans_.resize(memory.size());
  std::vector<std::vector<size_t>> open(memory.size());
  for (size_t t = 0; t < ops.size(); ++t) {
    const PipelineOp& op = ops[t];
    auto& o = open[op.microbatch];
    if (op.forward) {
      if (o.size() <= static_cast<size_t>(op.chunk)) o.resize(op.chunk + 1);
      o[op.chunk] = t;
    } else {
      spans_[op.microbatch].emplace_back(o[op.chunk], t);
    }
  }
}

uint64_t StageMemoryLimit(uint64_t budget_bytes, const GateConfig& config) {
  if (budget_bytes == 0) return 0;
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(static_cast<double>(budget_bytes) * config.memory_headroom));
}

bool StageMemoryGate::all_sp_fits() const { return limit_ == 0 || all_sp_peak_ <= limit_; }

uint64_t StageMemoryGate::peak_bytes() const { return Peak(level_, resident_); }

void StageMemoryGate::Reset() {
  std::fill(modes_.begin(), modes_.end(), Mode::kSequenceParallel);
  std::copy(all_sp_level_.begin(), all_sp_level_.end(), level_.begin());
}

bool StageMemoryGate::TryTpOnly(int microbatch, bool force) {
  const size_t i = static_cast<size_t>(microbatch);
  if (modes_[i] == Mode::kTensorParallelOnly) return true;
  if (!force && !all_sp_fits()) return false;
  const MicrobatchMemory& m = memory_[i];
  const int64_t dact = static_cast<int64_t>(m.activation_tp) - static_cast<int64_t>(m.activation_sp);
  const int64_t dws = static_cast<int64_t>(m.workspace_tp) - static_cast<int64_t>(m.workspace_sp);
  if (spans_[i].empty()) {  // not run on this stage's schedule: costs nothing here
    modes_[i] = Mode::kTensorParallelOnly;
    return true;
  }
  size_t lo = level_.size(), hi = 0;
  for (const auto& [f, b] : spans_[i]) {
    lo = std::min(lo, f);
    hi = std::max(hi, b);
  }
  delta_.assign(hi - lo + 1, 0);
  for (const auto& [f, b] : spans_[i]) {
    for (size_t t = f; t <= b; ++t) delta_[t - lo] += dact;  // its activations, held
    delta_[f - lo] += dws;                                   // its workspaces, running
    delta_[b - lo] += dws;
  }
  if (!force && limit_ != 0) {
    for (size_t t = lo; t <= hi; ++t) {
      if (static_cast<int64_t>(level_[t]) + delta_[t - lo] > static_cast<int64_t>(limit_)) {
        return false;
      }
    }
  }
  modes_[i] = Mode::kTensorParallelOnly;
  for (size_t t = lo; t <= hi; ++t) {
    level_[t] = static_cast<uint64_t>(static_cast<int64_t>(level_[t]) + delta_[t - lo]);
  }
  return true;
}

Decision StageMemoryGate::Admit(int microbatch, Decision wanted, bool pin_forced) {
  if (wanted.mode != Mode::kTensorParallelOnly) return wanted;
  if (TryTpOnly(microbatch, pin_forced && wanted.reason == Reason::kPinned)) return wanted;
  return {Mode::kSequenceParallel,
          all_sp_fits() ? Reason::kMemoryRequiresSp : Reason::kMemoryOverBudget};
}

int ApplyStageMemoryGate(StageMemoryGate& gate, std::span<Decision> decisions, bool pin_forced) {
  if (gate.all_sp_fits()) {
    for (size_t i = 0; i < decisions.size(); ++i) {
      if (decisions[i].mode == Mode::kTensorParallelOnly) gate.TryTpOnly(static_cast<int>(i), true);
    }
    if (gate.fits()) return 0;
    gate.Reset();
  }
  int overridden = 0;
  for (size_t i = 0; i < decisions.size(); ++i) {
    const Decision d = gate.Admit(static_cast<int>(i), decisions[i], pin_forced);
    overridden += d != decisions[i];
    decisions[i] = d;
  }
  return overridden;
}

}  // namespace spgate
