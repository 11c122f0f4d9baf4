// `spgate-sim replay --compare`: the decision-quality benchmark (docs/sim.md). The same
// batches with the same noise (common random numbers: every step's cost under both modes
// is drawn once, from one generator state) run under six policies:
//   sp        always SP;
//   tp_only   always TP-only — except where the memory gate forces SP (a fixed TP-only
//             job would not fit those batches at all);
//   static    the gates with the given config (policy STATIC);
//   adaptive  the given config with policy ADAPTIVE, learning from the steps it ran, the
//             table pooled over the groups like the daemon's and each step's sample
//             visible kReplayLearnLagSteps steps later (telemetry arrives after later plans);
//   oracle    for each batch, the mode whose simulated step is shorter, subject to the
//             memory gate — the best any per-batch choice can do on these batches; it
//             foresees each step's noise and stragglers;
//   expected_oracle
//             for each batch, the mode whose noise-free step is shorter under the same cost
//             model (a copy of its parameters with jitter and stragglers zeroed), subject
//             to the memory gate, run on the same noisy steps as the others — what a policy
//             that sees what spgate sees (the lengths, not the noise) could at best do.
// Every cell is a pipeline (pipeline.h) and the five decide per (stage, micro-batch): a
// cell without --pp, --microbatches or --vp is the pipeline of one stage and one
// micro-batch, its one op the group's whole step (the transformer layers of CostModel), so
// one harness runs both in the same arithmetic — Megatron's pp = 1 as "warm-up 0". A
// pipelined cell's result also carries the pipeline's fields (CompareResult::pipelined).
// STATIC and ADAPTIVE are DecideStagePlan itself; ADAPTIVE learns a sample per
// micro-batch, the switch's cost from a sample after a switch (ObserveAfterSwitch).
// Every policy also gets its regret per window of `regret_window` steps against the oracle
// and against the expected-value oracle (regret.h), its agreement with the oracle's modes,
// its flips and its exploration. With
// --switch_cost_s every policy, the oracle included, pays for each switch it makes; the
// oracle still picks each batch's faster mode without counting that cost, so a policy
// that switches less can then beat it.
//
// Usage:
//   absl::StatusOr<CompareResult> r =
//       Compare(options, config, /*series_window=*/50, /*regret_window=*/1000);
//   std::cerr << CompareTable(*r);  json["compare"] = CompareJson(*r);
#ifndef SPGATE_TOOLS_SIM_COMPARE_H_
#define SPGATE_TOOLS_SIM_COMPARE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/gate_policy.h"
#include "policy/types.h"
#include "tools/sim/regret.h"
#include "tools/sim/sim.h"

namespace spgate::sim {

// One pipeline stage under one policy (PP cells only).
struct StageResult {
  double tp_only_share = 0;         // of the stage's (micro-batch) decisions
  uint64_t peak_memory_bytes = 0;   // max over steps of the stage's predicted peak
                                    // (ReplayStagePeak with the modes run)
  int64_t over_limit_steps = 0;     // replica-steps whose peak was over budget × headroom
  double busy_share = 0;            // the stage's compute over the step time
};

struct PolicyResult {
  std::string name;  // sp, tp_only, static, adaptive, oracle, expected_oracle
  double effective_tokens_per_s = 0;  // groups × Σ tokens / Σ step time
  double step_time_p95_s = 0;
  uint64_t peak_memory_bytes = 0;
  double ratio_to_oracle = 0;
  int64_t switches = 0;     // mode changes, summed over groups
  int64_t probe_steps = 0;  // group-steps with reason PROBE (the gates' wait-share probes too)
  // ADAPTIVE's own exploration: the steps it ran the mode neither the gates nor its evidence
  // chose (GateOutcome::explored; what spgated counts as exploration steps).
  int64_t explored_steps = 0;
  int64_t changes_detected = 0;  // adaptive: changes its tables marked (ThroughputTable::changes)
  int64_t sp_steps = 0, tp_steps = 0;
  std::vector<double> series;  // effective tokens/s per window of series_window steps
  // Per window of the series, each group's (replica's) share of its decisions that ran
  // TP-only: [window][group] (CompareModesCsv; spgate-sim --plot's mode panels).
  std::vector<std::vector<float>> group_tp_share;
  // PP cells only (CompareResult::pipelined()); sp_steps, tp_steps, switches,
  // probe_steps and explored_steps then count (stage, micro-batch) decisions.
  double ratio_to_best_fixed = 0;  // over the better of sp and tp_only
  std::vector<StageResult> stages;
  int64_t memory_forced_sp = 0;  // micro-batches the memory gate made SP
  double bubble_share = 0;       // 1 − Σ stage compute / (pp × Σ step time)
  // Per rank and step, summed over boundaries, forward and backward: the sequence-
  // sharded messages spgate sends, and what the native formats would (docs/design.md §12).
  double p2p_bytes_per_step = 0, p2p_native_bytes_per_step = 0;
  double tokens = 0, time_s = 0;  // Σ over replicas and steps (the summary's totals)
  std::vector<double> step_times;  // every replica-step's
  std::map<std::string, std::map<std::string, int64_t>> decisions;  // static, adaptive:
                                                                    // mode -> reason -> n
  // Per step, Σ over groups (replicas) of the step seconds, switch costs included: the
  // input of the windowed regret.
  std::vector<double> step_seconds;
  int64_t oracle_agreed = 0;  // decisions (group-steps; PP: (stage, micro-batch) ones)
                              // in the oracle's mode
  // Derived from the above (FinishCompare): regret per window against the oracle, the
  // whole-run best fixed choice (the better of sp and tp_only) in the same windows; the
  // share of decisions in the oracle's mode; switches per 1,000 decisions of a group (PP:
  // of a (replica, stage)); ADAPTIVE's exploration decisions (explored_steps) over decisions.
  WindowedRegret regret;
  // The same against the expected-value oracle (its best_fixed fields as regret's). Below 0
  // where a policy beats it: the clairvoyant oracle does, by its foresight.
  WindowedRegret expected_regret;
  double oracle_agreement = 0;
  double flips_per_1000_steps = 0;
  double explore_share = 0;
};

struct CompareResult {
  int64_t steps = 0;  // per group
  int groups = 0;
  int64_t series_window = 0;
  int64_t regret_window = kDefaultRegretWindow;  // as asked (a shorter run: one window)
  double switch_cost_s = 0;
  std::vector<PolicyResult> policies;  // in the order above
  // The pipeline (--pp, --vp, --microbatches, --schedule); groups are its replicas.
  int pp = 1, vp = 1, microbatches = 1;
  std::string schedule = "1f1b";
  uint64_t memory_limit_bytes = 0;  // budget × memory_headroom (PP cells)

  bool pipelined() const { return pp > 1 || microbatches > 1 || vp > 1; }
  const PolicyResult* Find(const std::string& name) const;
};

// One micro-batch on one stage of one replica's step (a cell without a pipeline: stage 0,
// micro-batch 0, the group's whole step): the length statistics its plan carries, its
// ADAPTIVE band and both modes' seconds, noise-free (what the expected-value oracle
// compares) and drawn (what the oracle compares and every policy runs). --compare_batches
// writes them (CompareBatchesCsvRow).
struct BatchRecord {
  int group = 0;
  int64_t step = 0;
  int stage = 0, microbatch = 0;
  LengthStats stats;
  int band = 0;                        // BandOf(the run's config, stats.cv, stats.tokens)
  std::array<double, 2> expected_s{};  // [sp, tp_only]: forward + backward on the stage
  std::array<double, 2> drawn_s{};     // [sp, tp_only]
};
using BatchSink = std::function<void(const BatchRecord&)>;

// `config` is the static policy's; the adaptive one is the same with policy ADAPTIVE.
// `series_window` steps per point of the tokens/s series (0: steps / 50, at least 1);
// `regret_window` steps per regret window (INVALID_ARGUMENT naming --regret_window below
// 1; --switch_cost_s is checked too).
// `batches`, when given, gets every record as it is drawn (in step, group, micro-batch,
// stage order), so a run of any length holds none of them.
absl::StatusOr<CompareResult> Compare(const SimOptions& options, const GateConfig& config,
                                      int64_t series_window = 0,
                                      int64_t regret_window = kDefaultRegretWindow,
                                      const BatchSink& batches = nullptr);

// The derived fields of every policy (regret, expected_regret, oracle_agreement,
// flips_per_1000_steps, explore_share) from its counts and step_seconds; the oracle is the
// policy named "oracle", the expected-value oracle "expected_oracle" (expected_regret is
// left empty without one), the best fixed choice the better of "sp" and "tp_only" over the
// run.
// INVALID_ARGUMENT if one is missing or the step series do not match. Compare calls it.
absl::Status FinishCompare(CompareResult& result, int64_t regret_window);

std::string CompareTable(const CompareResult& result);  // markdown
std::string CompareJson(const CompareResult& result);   // the value of the "compare" key
std::string CompareSeriesCsv(const CompareResult& result);  // step,sp,tp_only,...
// --compare_batches's header line and one record's line (kBatchCsvHeader's columns).
extern const char kBatchCsvHeader[];
std::string CompareBatchesCsvRow(const BatchRecord& record);
// The per-group modes (group_tp_share) and the plot: tools/sim/compare_plot.h.

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_COMPARE_H_
