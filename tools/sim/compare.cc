// The decision-quality comparison, one harness for every cell: a cell is a pipeline of
// pp stages × microbatches per step, and a cell without one is the pipeline of one stage
// and one micro-batch — the same arithmetic (compare.h; docs/sim.md).
#include "tools/sim/compare.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "tools/sim/cost_model.h"
#include "tools/sim/peak_replay.h"
#include "tools/sim/pipeline.h"
#include "worker/runtime/batching.h"

namespace spgate::sim {

const PolicyResult* CompareResult::Find(const std::string& name) const {
  for (const PolicyResult& p : policies) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

namespace {

enum class Kind { kSp, kTpOnly, kStatic, kAdaptive, kOracle, kExpectedOracle };

// One policy's run over every (replica, stage) — a unit — with a learned table per stage
// pooled over the replicas, and its totals.
struct Run {
  Kind kind;
  GateConfig config;
  std::vector<GroupPolicyState> units;         // [replica × pp + stage]
  std::vector<ThroughputTable> tables;         // [stage]
  std::vector<std::deque<GroupStepSample>> pending;  // [stage]: not yet visible
  std::vector<std::optional<Mode>> last_mode;  // [unit]
  std::vector<char> last_probe;                // [unit]: its last micro-batch was a probe
  std::vector<int64_t> stage_tp, stage_decisions;
  std::vector<double> stage_busy;
  PolicyResult result;
  double tokens = 0, time_s = 0, p2p_bytes = 0, p2p_native_bytes = 0, busy = 0;
  std::vector<double> step_times;
  double window_tokens = 0, window_time = 0;
  std::vector<int64_t> window_tp, window_decisions;  // [replica]: this window's
  bool decides() const { return kind == Kind::kStatic || kind == Kind::kAdaptive; }
};

// What a cell is: its layout, each stage's schedule and resident bytes, the memory limit
// and how many steps it runs.
struct Cell {
  JobLayout layout;
  int P = 1, M = 1;
  // No pipeline: the stage's cost is the group's whole step (WholeStepCost), and the
  // daemon learns a step's CV from its telemetry; a pipeline's micro-batch is known to
  // the daemon by its band only (its samples sit at the band's CV mid-point).
  bool pipelined = false;
  int64_t steps = 0, series_window = 0;
  uint64_t budget = 0, limit = 0;
  std::vector<std::vector<PipelineOp>> ops;  // [stage]
  std::vector<uint64_t> resident;            // [stage]
};

// One replica's step, as every policy sees it: its micro-batches, each stage's cost of
// each in both modes from one noise draw, and the oracle's modes.
struct ReplicaStep {
  std::vector<LengthStats> stats;                       // [m]
  std::vector<std::vector<StageMicrobatchCost>> costs;  // [stage][m]
  std::vector<std::vector<MicrobatchMemory>> memory;    // [stage][m]
  std::vector<double> p2p;                              // [m]: one boundary message
  int64_t tokens = 0;
  double sharded_bytes = 0;  // per rank, every boundary, forward and backward
  std::vector<std::vector<Mode>> oracle_modes;  // [stage][m]
  std::vector<int64_t> oracle_kept_sp;          // [stage]
  // The expected-value oracle's: the same from the noise-free costs.
  std::vector<std::vector<Mode>> expected_modes;  // [stage][m]
  std::vector<int64_t> expected_kept_sp;          // [stage]
  std::vector<std::vector<StageMicrobatchCost>> expected_costs;  // [stage][m]
};

// The cost model's parameters without its noise: no per-rank jitter, no stragglers (the
// expected-value oracle's model; the other helpers' draws are not its).
CostParams NoiseFree(CostParams p) {
  p.jitter = 0;
  p.straggler_prob = 0;
  return p;
}

// A policy's modes and op times for one replica's step.
struct StepOps {
  std::vector<std::vector<Mode>> modes;        // [stage][m]
  std::vector<std::vector<double>> fwd, bwd;   // [stage][m], a switch's cost in fwd
  std::vector<std::vector<char>> switched;     // [stage][m]: after a switch
  std::vector<std::vector<char>> probe;        // [stage][m]: ran as a probe (reason PROBE)
  std::vector<std::vector<char>> forced;       // [stage][m]: a forced reason (IsForcedReason)
  std::vector<std::vector<char>> exploration;  // [stage][m]: a switch into or back from one
};

// The plain cells' one op: the group's step (CostModel: the transformer layers alone, no
// embedding or loss) as the forward, with no separate backward, so that a switch's cost
// adds to the step exactly; its memory is CostModel's prediction over the parameters'.
StageMicrobatchCost WholeStepCost(const CostModel& model, std::span<const int64_t> lengths,
                                  std::mt19937_64& rng, int64_t step, int tp) {
  std::mt19937_64 for_tp = rng;
  const GroupStep sp = model.Step(lengths, Mode::kSequenceParallel, rng, step);
  const GroupStep tpo = model.Step(lengths, Mode::kTensorParallelOnly, for_tp, step);
  const MemoryPrediction mem = model.PredictMemory(lengths);
  const uint64_t resident = model.PredictMemory({}).tp;
  StageMicrobatchCost c;
  c.forward_s = {sp.step_time_s, tpo.step_time_s};
  c.rs_wait_share_sp = sp.group_rs_wait_share;
  c.all_gather_s_sp = sp.group_all_gather_s();
  c.memory = {.activation_sp = mem.sp - resident, .activation_tp = mem.tp - resident};
  c.tokens = sp.effective_tokens;
  c.padded_tokens = runtime::SpPaddedTokens(c.tokens, tp);
  c.straggler_s = {sp.straggler_s(), tpo.straggler_s()};
  return c;
}

absl::StatusOr<Cell> CellOf(const SimOptions& o, const GateConfig& config,
                            const PipelineCostModel& model, int64_t series_window) {
  Cell cell;
  cell.layout = model.layout();
  cell.P = cell.layout.pp;
  cell.M = cell.layout.microbatches;
  cell.pipelined = o.pipelined();
  // As many micro-batches as plain replay would run batches, unless --steps says.
  cell.steps = o.steps;
  if (cell.steps == 0) {
    absl::StatusOr<int64_t> batches = ReplaySteps(o, config);
    if (!batches.ok()) return batches.status();
    cell.steps = std::max<int64_t>(1, (*batches + cell.M - 1) / cell.M);
  }
  cell.series_window = series_window > 0 ? series_window : std::max<int64_t>(1, cell.steps / 50);
  cell.budget = model.budget_bytes();
  // DecideStagePlan's limit, for the fixed choices and the oracle too.
  cell.limit = StageMemoryLimit(cell.budget, config);
  for (int s = 0; s < cell.P; ++s) {
    absl::StatusOr<std::vector<PipelineOp>> x = StageSchedule(cell.layout.pipeline(), s);
    if (!x.ok()) return x.status();
    cell.ops.push_back(*std::move(x));
    cell.resident.push_back(cell.pipelined ? model.ResidentBytes(s)
                                           : model.layers().PredictMemory({}).tp);
  }
  return cell;
}

std::vector<Run> MakeRuns(const SimOptions& o, const GateConfig& config, int P) {
  const std::pair<const char*, Kind> kinds[] = {{"sp", Kind::kSp},
                                                {"tp_only", Kind::kTpOnly},
                                                {"static", Kind::kStatic},
                                                {"adaptive", Kind::kAdaptive},
                                                {"oracle", Kind::kOracle},
                                                {"expected_oracle", Kind::kExpectedOracle}};
  const size_t units = static_cast<size_t>(o.groups) * P;
  std::vector<Run> runs;
  for (const auto& [name, kind] : kinds) {
    Run r;
    r.kind = kind;
    r.config = config;
    r.config.policy = kind == Kind::kAdaptive ? GatePolicyKind::kAdaptive : GatePolicyKind::kStatic;
    r.units.resize(units);
    r.window_tp.assign(o.groups, 0);
    r.window_decisions.assign(o.groups, 0);
    r.tables.resize(P);
    for (ThroughputTable& t : r.tables) {
      t.SetPriorInputs(DeclaredPriorInputs(o));
      t.MarkCollectivesTimed();  // every rank's collectives are timed here
    }
    r.pending.resize(P);
    r.last_mode.resize(units);
    r.last_probe.assign(units, 0);
    r.stage_tp.assign(P, 0);
    r.stage_decisions.assign(P, 0);
    r.stage_busy.assign(P, 0.0);
    r.result.name = name;
    r.result.stages.resize(P);
    runs.push_back(std::move(r));
  }
  return runs;
}

// Each stage's table learns the samples due at step k (ShowDueSamples), as the daemon
// learns: a sample after a switch teaches the switch's cost (ObserveGroupStep).
void ShowSamples(Run& r, int64_t k, bool adaptive_prior) {
  for (size_t s = 0; s < r.pending.size(); ++s) {
    ShowDueSamples(r.config, r.tables[s], r.pending[s], k, adaptive_prior);
  }
}

// Replica gi's step k: its micro-batches, every stage's costs in both modes, the oracle's
// modes and the expected-value oracle's (from `expected`, the noise-free model, drawing
// from a generator of its own so the others' draws stay the same; switch costs not
// counted).
absl::Status DrawReplicaStep(const Cell& cell, const PipelineCostModel& model,
                             const PipelineCostModel& expected, runtime::BatchBuilder& batches,
                             std::mt19937_64* rngs, double target_cv, int64_t k, int gi,
                             const BatchSink& sink, ReplicaStep& rs) {
  std::mt19937_64 quiet(0);  // the noise-free model draws nothing that matters
  const int boundaries = cell.P > 1 ? cell.P * cell.layout.vp - 1 : 0;
  rs.tokens = 0;
  rs.sharded_bytes = 0;
  for (int m = 0; m < cell.M; ++m) {
    const std::vector<int64_t> lengths = batches.Next(target_cv).lengths;
    absl::StatusOr<LengthStats> st = ComputeLengthStats(lengths);
    if (!st.ok()) return st.status();
    rs.stats[m] = *st;
    for (int s = 0; s < cell.P; ++s) {
      rs.costs[s][m] = cell.pipelined
                           ? model.Cost(s, lengths, rngs[s], k)
                           : WholeStepCost(model.layers(), lengths, rngs[s], k, cell.layout.tp);
      rs.expected_costs[s][m] =
          cell.pipelined ? expected.Cost(s, lengths, quiet, k)
                         : WholeStepCost(expected.layers(), lengths, quiet, k, cell.layout.tp);
      rs.memory[s][m] = rs.costs[s][m].memory;
      if (sink) {
        const StageMicrobatchCost& e = rs.expected_costs[s][m];
        const StageMicrobatchCost& d = rs.costs[s][m];
        constexpr Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
        sink({.group = gi, .step = k, .stage = s, .microbatch = m, .stats = *st,
              .expected_s = {StageSeconds(e, kSp), StageSeconds(e, kTp)},
              .drawn_s = {StageSeconds(d, kSp), StageSeconds(d, kTp)}});
      }
    }
    const int64_t padded = rs.costs[0][m].padded_tokens;
    rs.p2p[m] = model.BoundarySeconds(padded);
    rs.tokens += rs.costs[0][m].tokens;
    rs.sharded_bytes +=
        2.0 * boundaries * static_cast<double>(model.ShardedBoundaryBytes(padded));
  }
  for (int s = 0; s < cell.P; ++s) {
    rs.oracle_kept_sp[s] = OracleStageModes(cell.ops[s], cell.resident[s], rs.costs[s],
                                            cell.limit, rs.oracle_modes[s]);
    rs.expected_kept_sp[s] = OracleStageModes(cell.ops[s], cell.resident[s],
                                              rs.expected_costs[s], cell.limit,
                                              rs.expected_modes[s]);
  }
  return absl::OkStatus();
}

// The fixed choices' modes for one stage's step: SP, or TP-only where the stage's memory
// gate lets it (every micro-batch where the step fits so, else in id order:
// ApplyStageMemoryGate). Returns the micro-batches the gate made SP.
int64_t FixedStageModes(Kind kind, std::span<const PipelineOp> ops, uint64_t resident,
                        std::span<const MicrobatchMemory> memory, uint64_t limit,
                        std::vector<Mode>& modes) {
  modes.assign(memory.size(), Mode::kSequenceParallel);
  if (kind == Kind::kSp) return 0;
  StageMemoryGate gate(ops, resident, memory, limit);
  std::vector<Decision> wanted(memory.size(), {Mode::kTensorParallelOnly, Reason::kGatesPassed});
  const int64_t forced = ApplyStageMemoryGate(gate, wanted);
  modes = gate.modes();
  return forced;
}

// STATIC's or ADAPTIVE's decisions for stage s of replica gi's step k, as the daemon makes
// them: a step plan's through DecideStagePlan (the policy, then the stage's schedule-aware
// memory gate), a plain step's through the group's Decide (the memory gate first: a batch
// TP-only cannot fit is never a probe).
std::vector<Decision> PolicyDecisions(Run& r, const Cell& cell, const ReplicaStep& rs, int gi,
                                      int s, int64_t k, int64_t* explored) {
  GroupPolicyState& unit = r.units[static_cast<size_t>(gi) * cell.P + s];
  const ThroughputTable* table = r.kind == Kind::kAdaptive ? &r.tables[s] : nullptr;
  if (!cell.pipelined) {
    const MicrobatchMemory& mem = rs.memory[s][0];
    const BatchFacts facts{
        .step = k,
        .length_cv = rs.stats[0].cv,
        .tokens = rs.stats[0].tokens,
        .predicted_peak_bytes_sp = cell.resident[s] + mem.activation_sp + mem.workspace_sp,
        .predicted_peak_bytes_tp = cell.resident[s] + mem.activation_tp + mem.workspace_tp,
        .memory_budget_bytes = cell.budget};
    const GateOutcome out = unit.Decide(r.config, facts, std::nullopt, table);
    *explored += out.explored ? 1 : 0;
    return {out.decision};
  }
  std::vector<MicrobatchFacts> facts(cell.M);
  for (int m = 0; m < cell.M; ++m) {
    facts[m] = {.id = m, .length_cv = rs.stats[m].cv, .tokens = rs.stats[m].tokens,
                .memory = rs.memory[s][m]};
  }
  const StagePlanFacts plan{.step = k, .stage = s, .resident_bytes = cell.resident[s],
                            .memory_budget_bytes = cell.budget, .microbatches = facts};
  StagePlanOutcome out = DecideStagePlan(unit, r.config, cell.layout, plan, std::nullopt,
                                         table, /*sp_required=*/false);
  *explored += out.explored;
  return std::move(out.decisions);
}

// The policy's modes for stage s of replica gi's step k, which are ADAPTIVE's probes and
// which a forced reason decided (only a deciding policy's decisions have reasons).
void StageModes(Run& r, const Cell& cell, const ReplicaStep& rs, int gi, int s, int64_t k,
                std::vector<Mode>& modes, std::vector<char>& probes, std::vector<char>& forced) {
  probes.assign(cell.M, 0);
  forced.assign(cell.M, 0);
  if (r.kind == Kind::kOracle || r.kind == Kind::kExpectedOracle) {
    const bool clairvoyant = r.kind == Kind::kOracle;
    modes = clairvoyant ? rs.oracle_modes[s] : rs.expected_modes[s];
    r.result.memory_forced_sp += clairvoyant ? rs.oracle_kept_sp[s] : rs.expected_kept_sp[s];
    return;
  }
  if (!r.decides()) {
    r.result.memory_forced_sp +=
        FixedStageModes(r.kind, cell.ops[s], cell.resident[s], rs.memory[s], cell.limit, modes);
    return;
  }
  const std::vector<Decision> decisions =
      PolicyDecisions(r, cell, rs, gi, s, k, &r.result.explored_steps);
  modes.resize(cell.M);
  for (int m = 0; m < cell.M; ++m) {
    const Decision& d = decisions[m];
    modes[m] = d.mode;
    probes[m] = d.reason == Reason::kProbe;
    forced[m] = IsForcedReason(d.reason);
    if (probes[m]) ++r.result.probe_steps;
    if (d.reason == Reason::kMemoryRequiresSp || d.reason == Reason::kMemoryOverBudget) {
      ++r.result.memory_forced_sp;
    }
    ++r.result.decisions[std::string(ModeLabel(d.mode))][std::string(ReasonLabel(d.reason))];
  }
}

// Every stage's modes of replica gi's step under the policy, its op times (a switch of a
// stage's mode from its previous micro-batch, in id order — the order its forwards run —
// lengthens that micro-batch's forward), the decision counts and the stages' peaks.
void ApplyModes(Run& r, const Cell& cell, const PipelineCostModel& model, const ReplicaStep& rs,
                int gi, int64_t k, StepOps& x) {
  for (int s = 0; s < cell.P; ++s) {
    const size_t unit = static_cast<size_t>(gi) * cell.P + s;
    std::vector<Mode>& modes = x.modes[s];
    StageModes(r, cell, rs, gi, s, k, modes, x.probe[s], x.forced[s]);
    for (int m = 0; m < cell.M; ++m) {
      const int i = ModeIndex(modes[m]);
      const bool switched = r.last_mode[unit].has_value() && *r.last_mode[unit] != modes[m];
      x.fwd[s][m] = rs.costs[s][m].forward_s[i] +
                    model.layers().SwitchSeconds(r.last_mode[unit], modes[m]);
      x.bwd[s][m] = rs.costs[s][m].backward_s[i];
      x.switched[s][m] = switched;
      x.exploration[s][m] = ExplorationSwitch(switched, x.probe[s][m], r.last_probe[unit]);
      r.last_probe[unit] = x.probe[s][m];
      if (switched) ++r.result.switches;
      r.last_mode[unit] = modes[m];
      if (modes[m] == rs.oracle_modes[s][m]) ++r.result.oracle_agreed;
      (modes[m] == Mode::kSequenceParallel ? r.result.sp_steps : r.result.tp_steps)++;
      r.window_tp[gi] += modes[m] == Mode::kTensorParallelOnly ? 1 : 0;
      ++r.window_decisions[gi];
      if (modes[m] == Mode::kTensorParallelOnly) ++r.stage_tp[s];
      ++r.stage_decisions[s];
    }
    // Measured with the simulator's own count, not the gate's (peak_replay.h); the ops are
    // StageSchedule's and the sizes M, so it cannot fail here.
    const uint64_t peak =
        ReplayStagePeak(cell.ops[s], cell.resident[s], rs.memory[s], modes).value();
    StageResult& sr = r.result.stages[s];
    sr.peak_memory_bytes = std::max(sr.peak_memory_bytes, peak);
    if (peak > cell.limit) ++sr.over_limit_steps;
    r.result.peak_memory_bytes = std::max(r.result.peak_memory_bytes, peak);
  }
}

// What each stage of replica gi learns from its step: the wait share of the step (its SP
// micro-batches' waits over the stage's compute), and, under ADAPTIVE, a sample per
// micro-batch of its compute seconds on the stage (switch included, as telemetry has it).
void Learn(Run& r, const Cell& cell, const ReplicaStep& rs, const StepOps& x, int gi,
           int64_t k) {
  if (!r.decides()) return;
  for (int s = 0; s < cell.P; ++s) {
    double wait = 0, compute = 0;
    bool any_sp = false;
    for (int m = 0; m < cell.M; ++m) {
      const StageMicrobatchCost& c = rs.costs[s][m];
      const bool sp = x.modes[s][m] == Mode::kSequenceParallel;
      const double sec = x.fwd[s][m] + x.bwd[s][m];
      compute += sec;
      if (sp) {
        any_sp = true;
        wait += c.rs_wait_share_sp * sec;
      }
      if (r.kind != Kind::kAdaptive) continue;
      const int band = BandOf(r.config, rs.stats[m].cv, rs.stats[m].tokens);
      r.pending[s].push_back(
          {.band = band, .mode = x.modes[s][m], .step = k,
           .tokens = static_cast<double>(rs.stats[m].tokens), .seconds = sec,
           // as the daemon knows it (Cell::cv_from_band)
           .length_cv = cell.pipelined ? BandCvMidpoint(r.config, band) : rs.stats[m].cv,
           .all_gather_s = c.all_gather_s_sp,
           .rs_wait_s = c.rs_wait_share_sp * StageSeconds(c, Mode::kSequenceParallel),
           .probe = x.probe[s][m] != 0, .after_switch = x.switched[s][m] != 0,
           .exploration = x.exploration[s][m] != 0, .forced = x.forced[s][m] != 0,
           .straggler_s = c.straggler_s[ModeIndex(x.modes[s][m])], .timed = true});
    }
    r.units[static_cast<size_t>(gi) * cell.P + s].ObserveRsWaitShare(
        k, any_sp ? Mode::kSequenceParallel : Mode::kTensorParallelOnly,
        compute > 0 ? wait / compute : 0, r.config.window_steps);
  }
}

// Forward: each stage but the last sends in its mode's native format; backward: each but
// the first. Per rank, every chunk boundary (vp per stage pair).
double NativeBytes(const Cell& cell, const PipelineCostModel& model, const ReplicaStep& rs,
                   const StepOps& x) {
  const int P = cell.P, vp = cell.layout.vp;
  double native = 0;
  for (int m = 0; m < cell.M && P > 1; ++m) {
    for (int s = 0; s < P; ++s) {
      const double b = static_cast<double>(model.NativeBoundaryBytes(
          rs.costs[s][m].tokens, rs.costs[s][m].padded_tokens, x.modes[s][m]));
      native += b * ((s < P - 1 ? vp : vp - 1) + (s > 0 ? vp : vp - 1));
    }
  }
  return native;
}

// One policy's part of replica gi's step k: modes, the timeline, learning, the totals.
absl::Status RunReplicaStep(Run& r, const Cell& cell, const PipelineCostModel& model,
                            const ReplicaStep& rs, int gi, int64_t k, StepOps& x) {
  ApplyModes(r, cell, model, rs, gi, k, x);
  absl::StatusOr<PipelineTimeline> tl = SimulatePipeline(cell.layout.pipeline(), x.fwd, x.bwd,
                                                         rs.p2p);
  if (!tl.ok()) return tl.status();
  Learn(r, cell, rs, x, gi, k);
  const double step_s = tl->step_time_s;
  r.tokens += static_cast<double>(rs.tokens);
  r.time_s += step_s;
  r.step_times.push_back(step_s);
  r.result.step_seconds.back() += step_s;
  r.window_tokens += static_cast<double>(rs.tokens);
  r.window_time += step_s;
  r.p2p_bytes += rs.sharded_bytes;
  r.p2p_native_bytes += NativeBytes(cell, model, rs, x);
  for (int s = 0; s < cell.P; ++s) {
    r.stage_busy[s] += tl->busy_s[s];
    r.busy += tl->busy_s[s];
  }
  return absl::OkStatus();
}

// The progress line follows the adaptive policy, the one under test: what its totals grew
// by in a step (every replica's).
struct ProgressWatch {
  double tokens = 0;
  int64_t sp = 0, tp = 0;
  ProgressDelta Next(const Run& r, int groups) {
    const ProgressDelta d{.parts = groups, .tokens = r.tokens - tokens,
                          .sp = r.result.sp_steps - sp, .tp = r.result.tp_steps - tp,
                          .sim_seconds = r.result.step_seconds.back()};
    tokens = r.tokens;
    sp = r.result.sp_steps;
    tp = r.result.tp_steps;
    return d;
  }
};

CompareResult Finish(const Cell& cell, int groups, std::vector<Run>& runs) {
  CompareResult out;
  out.steps = cell.steps;
  out.groups = groups;
  out.series_window = cell.series_window;
  out.pp = cell.P;
  out.vp = cell.layout.vp;
  out.microbatches = cell.M;
  out.schedule = std::string(ScheduleName(cell.layout.schedule));
  out.memory_limit_bytes = cell.limit;
  const double group_steps = static_cast<double>(cell.steps) * groups;
  for (Run& r : runs) {
    PolicyResult& p = r.result;
    p.effective_tokens_per_s = r.time_s > 0 ? groups * r.tokens / r.time_s : 0;
    p.step_time_p95_s = Percentile(r.step_times, 0.95);
    p.step_times = std::move(r.step_times);
    p.bubble_share = r.time_s > 0 ? 1 - r.busy / (cell.P * r.time_s) : 0;
    p.p2p_bytes_per_step = r.p2p_bytes / group_steps;
    p.p2p_native_bytes_per_step = r.p2p_native_bytes / group_steps;
    p.tokens = r.tokens;
    p.time_s = r.time_s;
    for (const ThroughputTable& t : r.tables) p.changes_detected += t.changes();
    for (int s = 0; s < cell.P; ++s) {
      StageResult& sr = p.stages[s];
      sr.tp_only_share = r.stage_decisions[s] > 0 ? static_cast<double>(r.stage_tp[s]) /
                                                        static_cast<double>(r.stage_decisions[s])
                                                  : 0;
      sr.busy_share = r.time_s > 0 ? r.stage_busy[s] / r.time_s : 0;
    }
    out.policies.push_back(std::move(p));
  }
  const double oracle = out.Find("oracle")->effective_tokens_per_s;
  const double best_fixed = std::max(out.Find("sp")->effective_tokens_per_s,
                                     out.Find("tp_only")->effective_tokens_per_s);
  for (PolicyResult& p : out.policies) {
    p.ratio_to_oracle = oracle > 0 ? p.effective_tokens_per_s / oracle : 0;
    p.ratio_to_best_fixed = best_fixed > 0 ? p.effective_tokens_per_s / best_fixed : 0;
  }
  return out;
}

// Every cell: each of --groups replicas draws --microbatches batches a step, every stage
// costs each in both modes from one noise draw, and the five policies decide per (stage,
// micro-batch) on them (compare.h).
absl::StatusOr<CompareResult> CompareCell(const SimOptions& o, const GateConfig& config,
                                          int64_t series_window, const BatchSink& sink) {
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) return s;
  absl::StatusOr<JobLayout> layout = PipelineLayoutOf(o);
  if (!layout.ok()) return layout.status();
  if (o.cost.vocab < 1) return absl::InvalidArgumentError("--vocab must be >= 1");
  if (!(o.cost.p2p_gbps > 0)) return absl::InvalidArgumentError("--p2p_gbps must be > 0");
  const PipelineCostModel model(o.cost, *layout);
  const PipelineCostModel expected(NoiseFree(o.cost), *layout);  // the same, less its noise
  absl::StatusOr<Cell> cell_or = CellOf(o, config, model, series_window);
  if (!cell_or.ok()) return cell_or.status();
  const Cell& cell = *cell_or;
  const int P = cell.P, M = cell.M;
  const BatchSink banded =
      sink ? BatchSink([&](const BatchRecord& b) {
               BatchRecord with = b;
               with.band = BandOf(config, b.stats.cv, b.stats.tokens);
               sink(with);
             })
           : BatchSink();
  std::vector<std::unique_ptr<runtime::BatchBuilder>> batches;
  std::vector<std::mt19937_64> rngs;  // [replica × pp + stage]
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, gi);
    if (!b.ok()) return b.status();
    batches.push_back(*std::move(b));
    for (int s = 0; s < P; ++s) rngs.emplace_back(GroupNoiseSeed(o.seed, gi * P + s));
  }
  std::vector<Run> runs = MakeRuns(o, config, P);
  ReplicaStep rs{.stats = std::vector<LengthStats>(M),
                 .costs = std::vector(P, std::vector<StageMicrobatchCost>(M)),
                 .memory = std::vector(P, std::vector<MicrobatchMemory>(M)),
                 .p2p = std::vector<double>(M),
                 .oracle_modes = std::vector<std::vector<Mode>>(P),
                 .oracle_kept_sp = std::vector<int64_t>(P),
                 .expected_modes = std::vector<std::vector<Mode>>(P),
                 .expected_kept_sp = std::vector<int64_t>(P),
                 .expected_costs = std::vector(P, std::vector<StageMicrobatchCost>(M))};
  StepOps x{.modes = std::vector<std::vector<Mode>>(P),
            .fwd = std::vector(P, std::vector<double>(M)),
            .bwd = std::vector(P, std::vector<double>(M)),
            .switched = std::vector(P, std::vector<char>(M)),
            .probe = std::vector(P, std::vector<char>(M)),
            .forced = std::vector(P, std::vector<char>(M)),
            .exploration = std::vector(P, std::vector<char>(M))};
  const std::unique_ptr<ProgressReporter> progress =
      MakeProgress(o, "spgate-sim replay --compare (adaptive)", cell.steps, o.groups);
  ProgressWatch watch;
  const Run& watched = *std::find_if(runs.begin(), runs.end(),
                                     [](const Run& r) { return r.kind == Kind::kAdaptive; });
  for (int64_t k = 0; k < cell.steps; ++k) {
    for (Run& r : runs) {
      r.result.step_seconds.push_back(0);
      ShowSamples(r, k, o.adaptive_prior);
    }
    for (int gi = 0; gi < o.groups; ++gi) {
      if (absl::Status s = DrawReplicaStep(cell, model, expected, *batches[gi], &rngs[gi * P],
                                           config.bucket_target_cv, k, gi, banded, rs);
          !s.ok()) {
        return s;
      }
      for (Run& r : runs) {
        if (absl::Status s = RunReplicaStep(r, cell, model, rs, gi, k, x); !s.ok()) return s;
      }
    }
    if ((k + 1) % cell.series_window == 0 || k + 1 == cell.steps) {
      for (Run& r : runs) {
        r.result.series.push_back(r.window_time > 0 ? o.groups * r.window_tokens / r.window_time
                                                    : 0);
        r.window_tokens = r.window_time = 0;
        std::vector<float>& share = r.result.group_tp_share.emplace_back(o.groups, 0.0f);
        for (int gi = 0; gi < o.groups; ++gi) {
          if (r.window_decisions[gi] > 0) {
            share[gi] = static_cast<float>(r.window_tp[gi]) /
                        static_cast<float>(r.window_decisions[gi]);
          }
        }
        r.window_tp.assign(o.groups, 0);
        r.window_decisions.assign(o.groups, 0);
      }
    }
    if (progress) progress->Add(watch.Next(watched, o.groups));
  }
  if (progress) progress->Finish();
  return Finish(cell, o.groups, runs);
}

}  // namespace

absl::StatusOr<CompareResult> Compare(const SimOptions& o, const GateConfig& config,
                                      int64_t series_window, int64_t regret_window,
                                      const BatchSink& batches) {
  if (regret_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--regret_window must be >= 1 step, got ", regret_window));
  }
  if (absl::Status s = ValidateSwitchCost(o.cost); !s.ok()) return s;
  absl::StatusOr<CompareResult> r = CompareCell(o, config, series_window, batches);
  if (!r.ok()) return r.status();
  r->switch_cost_s = o.cost.switch_cost_s;
  if (absl::Status s = FinishCompare(*r, regret_window); !s.ok()) return s;
  return r;
}

absl::Status FinishCompare(CompareResult& r, int64_t regret_window) {
  const PolicyResult* oracle = r.Find("oracle");
  const PolicyResult* sp = r.Find("sp");
  const PolicyResult* tp = r.Find("tp_only");
  if (oracle == nullptr || sp == nullptr || tp == nullptr) {
    return absl::InvalidArgumentError("FinishCompare: want the sp, tp_only and oracle runs");
  }
  // The best fixed choice is one of the two over the whole run (the choice one would have
  // made for the job), compared window by window.
  const std::vector<double>& oracle_s = oracle->step_seconds;
  const std::vector<double>& fixed_s = sp->effective_tokens_per_s >= tp->effective_tokens_per_s
                                           ? sp->step_seconds
                                           : tp->step_seconds;
  r.regret_window = regret_window;
  const PolicyResult* expected = r.Find("expected_oracle");
  for (PolicyResult& p : r.policies) {  // writes no step_seconds: the references hold
    absl::StatusOr<WindowedRegret> w =
        WindowedRegretOf(p.step_seconds, oracle_s, fixed_s, regret_window);
    if (!w.ok()) return w.status();
    p.regret = *w;
    if (expected != nullptr) {
      w = WindowedRegretOf(p.step_seconds, expected->step_seconds, fixed_s, regret_window);
      if (!w.ok()) return w.status();
      p.expected_regret = *w;
    }
    const double decisions = static_cast<double>(p.sp_steps + p.tp_steps);
    p.oracle_agreement = decisions > 0 ? static_cast<double>(p.oracle_agreed) / decisions : 0;
    p.flips_per_1000_steps =
        decisions > 0 ? 1000.0 * static_cast<double>(p.switches) / decisions : 0;
    p.explore_share = decisions > 0 ? static_cast<double>(p.explored_steps) / decisions : 0;
  }
  return absl::OkStatus();
}

}  // namespace spgate::sim
