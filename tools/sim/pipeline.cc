// Pipelines in the simulator: per-stage costs, the schedule's timeline and the PP cells
// of --compare; see pipeline.h and docs/sim.md.
#include "tools/sim/pipeline.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
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
  const double t = p_.tp, h = p_.hidden, V = p_.vocab;
  const double flops = p_.device_tflops * 1e12 * p_.mfu;
  const double hbm = p_.hbm_gbps * 1e9, link = p_.link_gbps * 1e9;
  const double lat = p_.collective_latency_us * 1e-6;
  const int P = layout_.pp, vp = layout_.vp;
  const bool first = stage == 0, last = stage == P - 1;
  for (const Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const bool sp = mode == Mode::kSequenceParallel;
    const int i = ModeIndex(mode);
    const double T = sp ? static_cast<double>(c.padded_tokens) : static_cast<double>(c.tokens);
    const double per_call = t > 1 ? T * h * 2.0 * (t - 1) / t / link + lat : 0.0;
    double fwd = kForwardShare * layer_step[i].step_time_s;
    double bwd = (1 - kForwardShare) * layer_step[i].step_time_s;
    if (first) {
      const double lookup = 2 * T * h * 2 / hbm;
      const double dropout = 2 * T * h * 2 / hbm / (sp ? t : 1);
      fwd += lookup + dropout + (sp ? 1 : 2) * per_call;
      bwd += lookup + dropout + (sp ? 1 : 0) * per_call;
    }
    if (last) {
      const double gemm = 2 * T * h * V / (t * flops);
      const double xent = 2 * T * V / t * 4 / hbm;
      const double norm = p_.elementwise_bytes_per_token * h * 2 * T / hbm / (sp ? t : 1);
      fwd += gemm + xent + kForwardShare * norm + (sp ? 1 : 0) * per_call;
      bwd += 2 * gemm + xent + (1 - kForwardShare) * norm + (sp ? 1 : 2) * per_call;
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

// ---- The PP cells of --compare ----

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
    const double s = costs[m].forward_s[0] + costs[m].backward_s[0] - costs[m].forward_s[1] -
                     costs[m].backward_s[1];
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

namespace {

// One policy's run over every (replica, stage).
struct PipeRun {
  enum class Kind { kSp, kTpOnly, kStatic, kAdaptive, kOracle };
  struct Sample {
    int64_t step;
    int band;
    Mode mode;
    double tokens, seconds;
    double all_gather_s, rs_wait_s;  // for the prior (ObserveCollectives)
  };
  Kind kind;
  GateConfig config;
  std::vector<GroupPolicyState> groups;      // [replica × pp + stage]
  std::vector<ThroughputTable> tables;       // [stage], pooled over replicas
  std::vector<std::deque<Sample>> pending;   // [stage]: not yet visible
  std::vector<std::optional<Mode>> last_mode;  // [replica × pp + stage]
  std::vector<int64_t> stage_tp, stage_decisions;
  std::vector<double> stage_busy;
  PolicyResult result;
  double tokens = 0, time_s = 0, p2p_bytes = 0, p2p_native_bytes = 0, busy = 0;
  std::vector<double> step_times;
  double window_tokens = 0, window_time = 0;
};

// The fixed choices' modes for one stage's step (the oracle's: OracleStageModes). Returns
// the micro-batches the memory gate made SP.
int64_t FixedStageModes(PipeRun::Kind kind, std::span<const PipelineOp> ops, uint64_t resident,
                        std::span<const MicrobatchMemory> memory, uint64_t limit,
                        std::vector<Mode>& modes) {
  modes.assign(memory.size(), Mode::kSequenceParallel);
  if (kind == PipeRun::Kind::kSp) return 0;
  StageMemoryGate gate(ops, resident, memory, limit);
  std::vector<Decision> wanted(memory.size(), {Mode::kTensorParallelOnly, Reason::kGatesPassed});
  const int64_t forced = ApplyStageMemoryGate(gate, wanted);
  modes = gate.modes();
  return forced;
}

}  // namespace

absl::StatusOr<CompareResult> ComparePipeline(const SimOptions& o, const GateConfig& config,
                                              int64_t series_window) {
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) return s;
  absl::StatusOr<JobLayout> layout_or = PipelineLayoutOf(o);
  if (!layout_or.ok()) return layout_or.status();
  const JobLayout layout = *layout_or;
  if (o.cost.vocab < 1) return absl::InvalidArgumentError("--vocab must be >= 1");
  if (!(o.cost.p2p_gbps > 0)) return absl::InvalidArgumentError("--p2p_gbps must be > 0");
  const int P = layout.pp, M = layout.microbatches;
  // As many micro-batches as plain replay would run batches, unless --steps says.
  int64_t steps = o.steps;
  if (steps == 0) {
    absl::StatusOr<int64_t> batches = ReplaySteps(o, config);
    if (!batches.ok()) return batches.status();
    steps = std::max<int64_t>(1, (*batches + M - 1) / M);
  }
  if (series_window <= 0) series_window = std::max<int64_t>(1, steps / 50);
  const PipelineCostModel model(o.cost, layout);
  const uint64_t budget = model.budget_bytes();
  // DecideStagePlan's limit, for the fixed choices and the oracle too.
  const uint64_t limit = StageMemoryLimit(budget, config);

  std::vector<std::vector<PipelineOp>> ops(P);
  std::vector<uint64_t> resident(P);
  for (int s = 0; s < P; ++s) {
    absl::StatusOr<std::vector<PipelineOp>> x = StageSchedule(layout.pipeline(), s);
    if (!x.ok()) return x.status();
    ops[s] = *std::move(x);
    resident[s] = model.ResidentBytes(s);
  }
  std::vector<std::unique_ptr<runtime::BatchBuilder>> batches;
  std::vector<std::mt19937_64> rngs;  // [replica × pp + stage]
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, gi);
    if (!b.ok()) return b.status();
    batches.push_back(*std::move(b));
    for (int s = 0; s < P; ++s) rngs.emplace_back(GroupNoiseSeed(o.seed, gi * P + s));
  }

  GateConfig static_config = config;
  static_config.policy = GatePolicyKind::kStatic;
  GateConfig adaptive_config = config;
  adaptive_config.policy = GatePolicyKind::kAdaptive;
  const std::pair<const char*, PipeRun::Kind> kinds[] = {
      {"sp", PipeRun::Kind::kSp},         {"tp_only", PipeRun::Kind::kTpOnly},
      {"static", PipeRun::Kind::kStatic}, {"adaptive", PipeRun::Kind::kAdaptive},
      {"oracle", PipeRun::Kind::kOracle}};
  const size_t units = static_cast<size_t>(o.groups) * P;
  std::vector<PipeRun> runs;
  for (const auto& [name, kind] : kinds) {
    PipeRun r;
    r.kind = kind;
    r.config = kind == PipeRun::Kind::kAdaptive ? adaptive_config : static_config;
    r.groups.resize(units);
    r.tables.resize(P);
    for (ThroughputTable& t : r.tables) t.SetPriorInputs(DeclaredPriorInputs(o));
    r.pending.resize(P);
    r.last_mode.resize(units);
    r.stage_tp.assign(P, 0);
    r.stage_decisions.assign(P, 0);
    r.stage_busy.assign(P, 0.0);
    r.result.name = name;
    r.result.stages.resize(P);
    runs.push_back(std::move(r));
  }

  std::vector<std::vector<int64_t>> lengths(M);
  std::vector<LengthStats> stats(M);
  std::vector<std::vector<StageMicrobatchCost>> costs(P, std::vector<StageMicrobatchCost>(M));
  std::vector<std::vector<MicrobatchMemory>> memory(P, std::vector<MicrobatchMemory>(M));
  std::vector<double> p2p(M);
  std::vector<std::vector<Mode>> modes(P);
  std::vector<std::vector<double>> fwd(P, std::vector<double>(M)), bwd(P, std::vector<double>(M));
  std::vector<MicrobatchFacts> facts(M);
  std::vector<std::vector<Mode>> oracle_modes(P);
  std::vector<int64_t> oracle_kept_sp(P);
  for (int64_t k = 0; k < steps; ++k) {
    for (PipeRun& r : runs) r.result.step_seconds.push_back(0);
    // Samples of steps k − lag and before become visible to ADAPTIVE's tables.
    for (PipeRun& r : runs) {
      for (int s = 0; s < P; ++s) {
        while (!r.pending[s].empty() && r.pending[s].front().step + kReplayLearnLagSteps <= k) {
          const PipeRun::Sample& x = r.pending[s].front();
          r.tables[s].Observe(r.config, x.band, x.mode, x.step, x.tokens, x.seconds);
          // As the daemon: at the micro-batch's CV band's mid-point (the top band: none).
          if (const double cv = BandCvMidpoint(r.config, x.band); o.adaptive_prior && cv >= 0) {
            r.tables[s].ObserveCollectives(r.config, x.mode, x.step, x.tokens, cv, x.seconds,
                                           x.all_gather_s, x.rs_wait_s);
          }
          r.pending[s].pop_front();
        }
      }
    }
    for (int gi = 0; gi < o.groups; ++gi) {
      int64_t step_tokens = 0;
      double sharded_bytes = 0;
      const int boundaries = P > 1 ? P * layout.vp - 1 : 0;
      for (int m = 0; m < M; ++m) {
        lengths[m] = batches[gi]->Next(config.bucket_target_cv).lengths;
        absl::StatusOr<LengthStats> st = ComputeLengthStats(lengths[m]);
        if (!st.ok()) return st.status();
        stats[m] = *st;
        for (int s = 0; s < P; ++s) {
          costs[s][m] = model.Cost(s, lengths[m], rngs[static_cast<size_t>(gi) * P + s], k);
          memory[s][m] = costs[s][m].memory;
        }
        const int64_t padded = costs[0][m].padded_tokens;
        p2p[m] = model.BoundarySeconds(padded);
        step_tokens += costs[0][m].tokens;
        // Forward activations and backward gradients over every boundary, per rank.
        sharded_bytes += 2.0 * boundaries * static_cast<double>(model.ShardedBoundaryBytes(padded));
      }
      // The oracle's modes (switch costs not counted), for the oracle and for agreement.
      for (int s = 0; s < P; ++s) {
        oracle_kept_sp[s] = OracleStageModes(ops[s], resident[s], costs[s], limit, oracle_modes[s]);
      }
      for (PipeRun& r : runs) {
        for (int s = 0; s < P; ++s) {
          const size_t unit = static_cast<size_t>(gi) * P + s;
          if (r.kind == PipeRun::Kind::kStatic || r.kind == PipeRun::Kind::kAdaptive) {
            for (int m = 0; m < M; ++m) {
              facts[m] = {.id = m, .length_cv = stats[m].cv, .tokens = stats[m].tokens,
                          .memory = memory[s][m]};
            }
            const StagePlanFacts plan{.step = k, .stage = s, .resident_bytes = resident[s],
                                      .memory_budget_bytes = budget, .microbatches = facts};
            const StagePlanOutcome out = DecideStagePlan(
                r.groups[unit], r.config, layout, plan, std::nullopt,
                r.kind == PipeRun::Kind::kAdaptive ? &r.tables[s] : nullptr,
                /*sp_required=*/false);
            modes[s].resize(M);
            for (int m = 0; m < M; ++m) {
              const Decision& d = out.decisions[m];
              modes[s][m] = d.mode;
              if (d.reason == Reason::kProbe) ++r.result.probe_steps;
              if (d.reason == Reason::kMemoryRequiresSp || d.reason == Reason::kMemoryOverBudget) {
                ++r.result.memory_forced_sp;
              }
              ++r.result
                    .decisions[std::string(ModeLabel(d.mode))][std::string(ReasonLabel(d.reason))];
            }
          } else if (r.kind == PipeRun::Kind::kOracle) {
            modes[s] = oracle_modes[s];
            r.result.memory_forced_sp += oracle_kept_sp[s];
          } else {
            r.result.memory_forced_sp +=
                FixedStageModes(r.kind, ops[s], resident[s], memory[s], limit, modes[s]);
          }
          for (int m = 0; m < M; ++m) {
            const int i = ModeIndex(modes[s][m]);
            // A switch of the stage's mode (from its previous micro-batch, in id order,
            // the order its forwards run) lengthens that micro-batch's forward.
            fwd[s][m] = costs[s][m].forward_s[i] +
                        model.layers().SwitchSeconds(r.last_mode[unit], modes[s][m]);
            bwd[s][m] = costs[s][m].backward_s[i];
            if (r.last_mode[unit].has_value() && *r.last_mode[unit] != modes[s][m]) {
              ++r.result.switches;
            }
            r.last_mode[unit] = modes[s][m];
            if (modes[s][m] == oracle_modes[s][m]) ++r.result.oracle_agreed;
            (modes[s][m] == Mode::kSequenceParallel ? r.result.sp_steps : r.result.tp_steps)++;
            if (modes[s][m] == Mode::kTensorParallelOnly) ++r.stage_tp[s];
            ++r.stage_decisions[s];
          }
          const uint64_t peak = StagePeakBytes(ops[s], resident[s], memory[s], modes[s]);
          StageResult& sr = r.result.stages[s];
          sr.peak_memory_bytes = std::max(sr.peak_memory_bytes, peak);
          if (peak > limit) ++sr.over_limit_steps;
          r.result.peak_memory_bytes = std::max(r.result.peak_memory_bytes, peak);
        }
        absl::StatusOr<PipelineTimeline> tl = SimulatePipeline(layout.pipeline(), fwd, bwd, p2p);
        if (!tl.ok()) return tl.status();
        // What the stage learns from its step: the wait share of the step (its SP
        // micro-batches' waits over the stage's compute), and, under ADAPTIVE, a sample
        // per micro-batch of its compute seconds on the stage.
        for (int s = 0; s < P; ++s) {
          if (r.kind != PipeRun::Kind::kStatic && r.kind != PipeRun::Kind::kAdaptive) break;
          double wait = 0, compute = 0;
          bool any_sp = false;
          for (int m = 0; m < M; ++m) {
            const bool sp = modes[s][m] == Mode::kSequenceParallel;
            const double sec = fwd[s][m] + bwd[s][m];
            compute += sec;
            if (sp) {
              any_sp = true;
              wait += costs[s][m].rs_wait_share_sp * sec;
            }
            if (r.kind == PipeRun::Kind::kAdaptive) {
              r.pending[s].push_back({k, BandOf(r.config, stats[m].cv, stats[m].tokens),
                                      modes[s][m], static_cast<double>(stats[m].tokens), sec,
                                      costs[s][m].all_gather_s_sp,
                                      costs[s][m].rs_wait_share_sp * sec});
            }
          }
          r.groups[static_cast<size_t>(gi) * P + s].ObserveRsWaitShare(
              k, any_sp ? Mode::kSequenceParallel : Mode::kTensorParallelOnly,
              compute > 0 ? wait / compute : 0, r.config.window_steps);
        }
        double native = 0;
        for (int m = 0; m < M && P > 1; ++m) {
          // Forward: each stage but the last sends in its mode's native format; backward:
          // each but the first. Per rank, every chunk boundary (vp per stage pair).
          for (int s = 0; s < P; ++s) {
            const double b = static_cast<double>(model.NativeBoundaryBytes(
                costs[s][m].tokens, costs[s][m].padded_tokens, modes[s][m]));
            native += b * ((s < P - 1 ? layout.vp : layout.vp - 1) +
                           (s > 0 ? layout.vp : layout.vp - 1));
          }
        }
        r.tokens += static_cast<double>(step_tokens);
        r.time_s += tl->step_time_s;
        r.step_times.push_back(tl->step_time_s);
        r.result.step_seconds.back() += tl->step_time_s;
        r.window_tokens += static_cast<double>(step_tokens);
        r.window_time += tl->step_time_s;
        r.p2p_bytes += sharded_bytes;
        r.p2p_native_bytes += native;
        for (int s = 0; s < P; ++s) {
          r.stage_busy[s] += tl->busy_s[s];
          r.busy += tl->busy_s[s];
        }
      }
    }
    if ((k + 1) % series_window == 0 || k + 1 == steps) {
      for (PipeRun& r : runs) {
        r.result.series.push_back(r.window_time > 0 ? o.groups * r.window_tokens / r.window_time
                                                    : 0);
        r.window_tokens = r.window_time = 0;
      }
    }
  }

  CompareResult out;
  out.steps = steps;
  out.groups = o.groups;
  out.series_window = series_window;
  out.pp = P;
  out.vp = layout.vp;
  out.microbatches = M;
  out.schedule = std::string(ScheduleName(layout.schedule));
  out.memory_limit_bytes = limit;
  const double group_steps = static_cast<double>(steps) * o.groups;
  for (PipeRun& r : runs) {
    PolicyResult& p = r.result;
    p.effective_tokens_per_s = r.time_s > 0 ? o.groups * r.tokens / r.time_s : 0;
    p.step_time_p95_s = Percentile(r.step_times, 0.95);
    p.step_times = std::move(r.step_times);
    p.bubble_share = r.time_s > 0 ? 1 - r.busy / (P * r.time_s) : 0;
    p.p2p_bytes_per_step = r.p2p_bytes / group_steps;
    p.p2p_native_bytes_per_step = r.p2p_native_bytes / group_steps;
    p.tokens = r.tokens;
    p.time_s = r.time_s;
    for (int s = 0; s < P; ++s) {
      StageResult& sr = p.stages[s];
      sr.tp_only_share = r.stage_decisions[s] > 0 ? static_cast<double>(r.stage_tp[s]) /
                                                        static_cast<double>(r.stage_decisions[s])
                                                  : 0;
      sr.busy_share = r.time_s > 0 ? r.stage_busy[s] / r.time_s : 0;
    }
    out.policies.push_back(std::move(p));
  }
  const double oracle = out.policies.back().effective_tokens_per_s;
  const double best_fixed = std::max(out.Find("sp")->effective_tokens_per_s,
                                     out.Find("tp_only")->effective_tokens_per_s);
  for (PolicyResult& p : out.policies) {
    p.ratio_to_oracle = oracle > 0 ? p.effective_tokens_per_s / oracle : 0;
    p.ratio_to_best_fixed = best_fixed > 0 ? p.effective_tokens_per_s / best_fixed : 0;
  }
  return out;
}

}  // namespace spgate::sim
