// Pipelines in the simulator: per-stage costs, the schedule's timeline and the oracle's
// modes of a stage's step; see pipeline.h and docs/sim.md.
#include "tools/sim/pipeline.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/runtime/batching.h"

namespace spgate::sim {

// ---- The layout ----

absl::StatusOr<JobLayout> PipelineLayoutOf(const SimOptions& o) {
  const JobLayout layout{.tp = o.cost.tp,
                         .pp = o.pp,
                         .vp = o.vp,
                         .dp = o.groups,
                         .microbatches = o.microbatches,
                         .schedule = o.schedule};
  if (absl::Status s = ValidateJobLayout(layout); !s.ok()) {
    // "layout.pp: must be in ..." -> "--pp: must be in ...": the simulator's flag names are
    // the layout's fields (dp is --groups).
    std::string msg(s.message());
    if (absl::StartsWith(msg, "layout.dp")) {
      msg = absl::StrCat("--groups", msg.substr(9));
    } else if (absl::StartsWith(msg, "layout.")) {
      msg = absl::StrCat("--", msg.substr(7));
    } else {
      msg = absl::StrCat("--tp/--pp/--groups: ", msg);
    }
    return absl::InvalidArgumentError(msg);
  }
  return layout;
}

// ---- Per-stage costs ----
//
// Beyond CostModel's layers (cost_model.h), per micro-batch of T tokens (T padded under
// SP), t ranks, hidden h, vocabulary V, F achieved FLOP/s, per_call one collective of
// T·h fp16 values ((t−1)/t of it over the TP link, + latency):
//   first stage, embedding: lookup 2·T·h·2 bytes of HBM forward and again backward in both
//     modes (vocabulary-parallel: every rank looks up every token in its shard); its
//     dropout 2·T·h·2 bytes each way, ÷ t under SP; forward all-reduce (TP-only, 2 calls'
//     worth) or reduce-scatter (SP, 1), backward nothing or all-gather (1).
//   last stage, output layer and loss: logits GEMM 2·T·h·V/(t·F) forward, twice that
//     backward; cross-entropy over the [T, V/t] fp32 logits, 2 passes each way; the final
//     LayerNorm, one layer's element-wise region (÷ t under SP); SP all-gathers the input
//     forward and reduce-scatters its gradient backward (1 + 1), TP-only all-reduces the
//     input gradient backward (2).
//   TP-only under the sequence-sharded boundary (docs/design.md §12): one all-gather of
//     its input rows per chunk it receives over p2p, and one of its output gradient rows
//     per chunk whose gradient it receives.
// Memory: resident + V·h/t parameters on the first stage (embedding) and on the last
// (its own copy of the output layer) at --param_bytes_per_param; activations + T·h bytes
// (embedding dropout mask, ÷ t under SP) on the first stage, + 4·T·V/t (fp32 logits kept
// for the loss backward) + 2·T·h (the output layer's input, ÷ t under SP) on the last.
// Workspace of a running chunk: one layer's activations, + the logits' gradient
// (4·T·V/t) on the last stage.

PipelineCostModel::PipelineCostModel(const CostParams& params, const JobLayout& layout)
    : p_(params), layout_(layout), layers_(params) {}

uint64_t PipelineCostModel::ResidentBytes(int stage) const {
  const double states = static_cast<double>(layers_.PredictMemory({}).tp);
  const double embedding =
      static_cast<double>(p_.vocab) * p_.hidden / p_.tp * p_.param_bytes_per_param;
  double extra = 0;
  if (stage == 0) extra += embedding;
  if (stage == layout_.pp - 1) extra += embedding;
  return static_cast<uint64_t>(states + extra);
}

MicrobatchMemory PipelineCostModel::Memory(int stage, std::span<const int64_t> lengths) const {
  const MemoryPrediction m = layers_.PredictMemory(lengths);
  const uint64_t states = layers_.PredictMemory({}).tp;
  int64_t tokens = 0;
  for (int64_t s : lengths) tokens += s;
  const double t = p_.tp, h = p_.hidden, V = p_.vocab, vp = layout_.vp;
  const bool first = stage == 0, last = stage == layout_.pp - 1;
  MicrobatchMemory out;
  for (const Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const bool sp = mode == Mode::kSequenceParallel;
    const double T = sp ? static_cast<double>(runtime::SpPaddedTokens(tokens, p_.tp))
                        : static_cast<double>(tokens);
    const double layers_act = static_cast<double>((sp ? m.sp : m.tp) - states);
    double act = layers_act;
    double workspace = p_.layers > 0 ? layers_act / p_.layers : 0;
    if (first) act += T * h / (sp ? t : 1);
    if (last) {
      act += 4 * T * V / t + 2 * T * h / (sp ? t : 1);
      workspace += 4 * T * V / t;
    }
    // Per model chunk: the chunks of an interleaved stage are taken to be alike.
    (sp ? out.activation_sp : out.activation_tp) = static_cast<uint64_t>(act / vp);
    (sp ? out.workspace_sp : out.workspace_tp) = static_cast<uint64_t>(workspace);
  }
  return out;
}

StageMicrobatchCost PipelineCostModel::Cost(int stage, std::span<const int64_t> lengths,
                                            std::mt19937_64& rng, int64_t step) const {
  std::mt19937_64 for_tp = rng;
  const GroupStep layer_step[2] = {layers_.Step(lengths, Mode::kSequenceParallel, rng, step),
                                   layers_.Step(lengths, Mode::kTensorParallelOnly, for_tp, step)};
  StageMicrobatchCost c;
  c.tokens = layer_step[0].effective_tokens;
  c.padded_tokens = runtime::SpPaddedTokens(c.tokens, p_.tp);
  c.rs_wait_share_sp = layer_step[0].group_rs_wait_share;
  c.all_gather_s_sp = layer_step[0].group_all_gather_s();
  c.memory = Memory(stage, lengths);
  c.straggler_s = {layer_step[0].straggler_s(), layer_step[1].straggler_s()};
  const double t = p_.tp, h = p_.hidden, V = p_.vocab;
  const double flops = p_.device_tflops * 1e12 * p_.mfu;
  const double hbm = p_.hbm_gbps * 1e9;
  const int P = layout_.pp, vp = layout_.vp;
  const bool first = stage == 0, last = stage == P - 1;
  for (const Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const bool sp = mode == Mode::kSequenceParallel;
    const int i = ModeIndex(mode);
    const double T = sp ? static_cast<double>(c.padded_tokens) : static_cast<double>(c.tokens);
    // One all-gather or reduce-scatter of the rows, one all-reduce (cost_model.h).
    const double per_call = layers_.CollectiveSeconds(CollectiveKind::kAllGather, T * h * 2.0);
    const double all_reduce = layers_.CollectiveSeconds(CollectiveKind::kAllReduce, T * h * 2.0);
    double fwd = kForwardShare * layer_step[i].step_time_s;
    double bwd = (1 - kForwardShare) * layer_step[i].step_time_s;
    if (first) {
      const double lookup = 2 * T * h * 2 / hbm;
      const double dropout = 2 * T * h * 2 / hbm / (sp ? t : 1);
      fwd += lookup + dropout + (sp ? per_call : all_reduce);
      bwd += lookup + dropout + (sp ? 1 : 0) * per_call;
    }
    if (last) {
      const double gemm = 2 * T * h * V / (t * flops);
      const double xent = 2 * T * V / t * 4 / hbm;
      const double norm = p_.norm_passes / 2 * h * 2 * T / hbm / (sp ? t : 1);  // one LN
      fwd += gemm + xent + kForwardShare * norm + (sp ? 1 : 0) * per_call;
      bwd += 2 * gemm + xent + (1 - kForwardShare) * norm + (sp ? per_call : all_reduce);
    }
    if (!sp) {
      // Chunks that receive their input (every one but the first virtual stage's) and
      // their output gradient (every one but the last's) over a stage boundary.
      fwd += (vp - (first ? 1 : 0)) * per_call;
      bwd += (vp - (last ? 1 : 0)) * per_call;
    }
    c.forward_s[i] = fwd;
    c.backward_s[i] = bwd;
  }
  return c;
}

uint64_t PipelineCostModel::ShardedBoundaryBytes(int64_t padded_tokens) const {
  return static_cast<uint64_t>(padded_tokens / p_.tp) * static_cast<uint64_t>(p_.hidden) * 2;
}

uint64_t PipelineCostModel::NativeBoundaryBytes(int64_t tokens, int64_t padded_tokens,
                                                Mode mode) const {
  return mode == Mode::kSequenceParallel
             ? ShardedBoundaryBytes(padded_tokens)
             : static_cast<uint64_t>(tokens) * static_cast<uint64_t>(p_.hidden) * 2;
}

double PipelineCostModel::BoundarySeconds(int64_t padded_tokens) const {
  return static_cast<double>(ShardedBoundaryBytes(padded_tokens)) / (p_.p2p_gbps * 1e9) +
         p_.collective_latency_us * 1e-6;
}

// ---- The timeline ----

double PipelineTimeline::bubble_share() const {
  if (busy_s.empty() || !(step_time_s > 0)) return 0;
  const double busy = std::accumulate(busy_s.begin(), busy_s.end(), 0.0);
  return 1 - busy / (static_cast<double>(busy_s.size()) * step_time_s);
}

absl::StatusOr<PipelineTimeline> SimulatePipeline(
    const PipelineLayout& layout, const std::vector<std::vector<double>>& forward_s,
    const std::vector<std::vector<double>>& backward_s, std::span<const double> p2p_s) {
  if (absl::Status s = ValidatePipelineLayout(layout); !s.ok()) return s;
  const int P = layout.pp, M = layout.microbatches, V = layout.vp;
  if (forward_s.size() != static_cast<size_t>(P) || backward_s.size() != static_cast<size_t>(P) ||
      p2p_s.size() != static_cast<size_t>(M)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SimulatePipeline: want %d stages x %d micro-batches of times and %d p2p times", P, M, M));
  }
  for (int s = 0; s < P; ++s) {
    if (forward_s[s].size() != static_cast<size_t>(M) ||
        backward_s[s].size() != static_cast<size_t>(M)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SimulatePipeline: stage %d has no time for every micro-batch", s));
    }
  }
  std::vector<std::vector<PipelineOp>> ops(P);
  size_t remaining = 0;
  for (int s = 0; s < P; ++s) {
    absl::StatusOr<std::vector<PipelineOp>> o = StageSchedule(layout, s);
    if (!o.ok()) return o.status();
    ops[s] = *std::move(o);
    remaining += ops[s].size();
  }
  // When each (virtual stage, micro-batch)'s forward and backward finished; -1: not yet.
  // Virtual stage v = chunk·P + stage: model chunk c of stage s follows chunk c of s − 1,
  // and chunk c of stage 0 follows chunk c − 1 of the last stage.
  const int last_v = P * V - 1;
  std::vector<double> fwd_done(static_cast<size_t>(P) * V * M, -1.0);
  std::vector<double> bwd_done(fwd_done.size(), -1.0);
  auto at = [M](int v, int m) { return static_cast<size_t>(v) * M + m; };
  std::vector<size_t> next(P, 0);
  PipelineTimeline out;
  out.busy_s.assign(P, 0.0);
  std::vector<double> free_at(P, 0.0);
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < P; ++s) {
      while (next[s] < ops[s].size()) {
        const PipelineOp& op = ops[s][next[s]];
        const int v = op.chunk * P + s, m = op.microbatch;
        // The op's input: the neighbouring virtual stage's finish (+ a message when it is
        // another stage), or nothing for the first forward.
        double ready = 0;
        const int from = op.forward ? v - 1 : (v == last_v ? -1 : v + 1);
        if (op.forward && v > 0) {
          const double d = fwd_done[at(from, m)];
          if (d < 0) break;
          ready = d + (from % P != s ? p2p_s[m] : 0.0);
        } else if (!op.forward && from >= 0) {
          const double d = bwd_done[at(from, m)];
          if (d < 0) break;
          ready = d + (from % P != s ? p2p_s[m] : 0.0);
        } else if (!op.forward) {
          const double d = fwd_done[at(v, m)];  // the loss: after its own forward
          if (d < 0) break;
          ready = d;
        }
        const double dur = (op.forward ? forward_s[s][m] : backward_s[s][m]) / V;
        const double start = std::max(free_at[s], ready);
        free_at[s] = start + dur;
        out.busy_s[s] += dur;
        (op.forward ? fwd_done : bwd_done)[at(v, m)] = free_at[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      return absl::InternalError(absl::StrFormat(
          "SimulatePipeline: the schedule deadlocks (pp=%d vp=%d microbatches=%d)", P, V, M));
    }
  }
  out.step_time_s = *std::max_element(free_at.begin(), free_at.end());
  return out;
}

// ---- The oracle of a stage's step ----

int64_t OracleStageModes(std::span<const PipelineOp> ops, uint64_t resident,
                         std::span<const StageMicrobatchCost> costs, uint64_t limit_bytes,
                         std::vector<Mode>& modes) {
  const int M = static_cast<int>(costs.size());
  std::vector<MicrobatchMemory> memory;
  memory.reserve(costs.size());
  for (const StageMicrobatchCost& c : costs) memory.push_back(c.memory);
  modes.assign(costs.size(), Mode::kSequenceParallel);
  StageMemoryGate gate(ops, resident, memory, limit_bytes);
  // TP-only where it is faster, the biggest savings first (ties by id) while they fit.
  std::vector<std::pair<double, int>> saving;
  for (int m = 0; m < M; ++m) {
    const double s = StageSeconds(costs[m], Mode::kSequenceParallel) -
                     StageSeconds(costs[m], Mode::kTensorParallelOnly);
    if (s > 0) saving.push_back({-s, m});
  }
  std::sort(saving.begin(), saving.end());
  int64_t kept_sp = 0;
  for (const auto& [neg, m] : saving) {
    if (gate.TryTpOnly(m)) {
      modes[m] = Mode::kTensorParallelOnly;
    } else {
      ++kept_sp;
    }
  }
  return kept_sp;
}

}  // namespace spgate::sim
