// Cost of one gate decision: ComputeLengthStats over the batch's lengths plus
// EvaluateGates, against a plain summation of the same lengths measured in the same run
// (the memory-read floor: any decision must at least read every length once). Target:
// under 1 µs per decision for a 1,000-sequence batch.
//
// The decision runs the longest path (no pin; a memory budget, so the memory gate does
// its arithmetic; CV and wait share below their thresholds, so every gate is consulted)
// and carries the group state from one step to the next as the daemon does. Before any
// timing, ComputeLengthStats is checked against a two-pass reference on the benchmark's
// own batch, so a fast wrong answer cannot be reported.
//
// Build and run:
//   cmake --build build --target policy_bench
//   bench/policy/run.sh build out/bench-policy     # JSON + a table with ratios
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "policy/adaptive_policy.h"
#include "policy/exploration.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "policy/step_plan.h"
#include "policy/telemetry.h"

namespace spgate {
namespace {

// The --lengths example of docs/design.md §5: lognormal, mean 4096 tokens, sigma 0.8.
std::vector<int64_t> Lengths(int64_t n) {
  std::mt19937_64 rng(20240601 + static_cast<uint64_t>(n));
  const double sigma = 0.8;
  std::lognormal_distribution<double> dist(std::log(4096.0) - sigma * sigma / 2, sigma);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t& x : out) {
    x = std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 1, kMaxSequenceLength);
  }
  return out;
}

// False (and the benchmark is skipped) unless ComputeLengthStats matches a two-pass
// reference on this batch.
bool CheckStats(benchmark::State& state, const std::vector<int64_t>& lengths) {
  absl::StatusOr<LengthStats> got = ComputeLengthStats(lengths);
  long double sum = 0;
  for (int64_t x : lengths) sum += static_cast<long double>(x);
  const long double mean = sum / static_cast<long double>(lengths.size());
  long double ss = 0;
  for (int64_t x : lengths) ss += (x - mean) * (x - mean);
  const double cv =
      static_cast<double>(std::sqrt(ss / static_cast<long double>(lengths.size())) / mean);
  if (!got.ok() || got->tokens != static_cast<int64_t>(sum) ||
      std::abs(got->cv - cv) > 1e-12 * std::max(cv, 1e-300)) {
    state.SkipWithError("ComputeLengthStats does not match the two-pass reference");
    return false;
  }
  return true;
}

// Baseline: sum the lengths, nothing else. ClobberMemory makes every iteration read them
// again instead of reusing the previous sum.
void BM_SumLengths(benchmark::State& state) {
  const std::vector<int64_t> lengths = Lengths(state.range(0));
  for (auto _ : state) {
    int64_t sum = 0;
    for (int64_t x : lengths) sum += x;
    benchmark::DoNotOptimize(sum);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * state.range(0) *
                          static_cast<int64_t>(sizeof(int64_t)));
}

void BM_ComputeLengthStats(benchmark::State& state) {
  const std::vector<int64_t> lengths = Lengths(state.range(0));
  if (!CheckStats(state, lengths)) return;
  for (auto _ : state) {
    absl::StatusOr<LengthStats> stats = ComputeLengthStats(lengths);
    benchmark::DoNotOptimize(stats);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * state.range(0) *
                          static_cast<int64_t>(sizeof(int64_t)));
}

BatchFacts FactsFor(int64_t step, double cv) {
  return BatchFacts{.step = step,
                    .length_cv = cv,
                    .predicted_peak_bytes_sp = 52'000'000'000,
                    .predicted_peak_bytes_tp = 64'000'000'000,
                    .memory_budget_bytes = 80'000'000'000};
}

// The gates alone, over a precomputed CV.
void BM_EvaluateGates(benchmark::State& state) {
  const GateConfig config;
  GroupGateState group;
  const RsWaitObservation rs{0.12, 50};
  int64_t step = 0;
  for (auto _ : state) {
    GateOutcome out = EvaluateGates(config, group, FactsFor(step++, 0.11), rs, std::nullopt);
    group = out.next;
    benchmark::DoNotOptimize(group);
  }
  if (group.reason != Reason::kGatesPassed) state.SkipWithError("expected GATES_PASSED");
}

// A group that has decided before (1,000 decisions, SP chosen last): no first-choice
// exemptions, so a benchmark times the path a running job's group takes.
GroupGateState DecidedGroup() {
  GroupGateState group;
  group.has_decision = group.has_chosen_mode = true;
  group.decisions = 1000;
  return group;
}

// The facts of a batch at the first step from `from` that is not an exploration
// step (the same path on every iteration), with `cv` and `tokens`.
BatchFacts PlainFacts(const GateConfig& config, int64_t from, double cv, int64_t tokens) {
  while (MayExplore(config, from)) ++from;
  BatchFacts facts = FactsFor(from, cv);
  facts.tokens = tokens;
  return facts;
}

// ADAPTIVE's decision timed over `state`'s iterations, the group state not carried; the
// last outcome, for the set-up check.
GateOutcome TimeAdaptive(benchmark::State& state, const GateConfig& config,
                         const GroupGateState& group, BatchFacts facts,
                         const RsWaitObservation& rs, const ThroughputTable& table) {
  GateOutcome out;
  for (auto _ : state) {
    benchmark::DoNotOptimize(facts);
    out = EvaluateAdaptive(config, group, facts, rs, std::nullopt, &table);
    benchmark::DoNotOptimize(out);
  }
  return out;
}

// The trace of one ADAPTIVE decision (outside the timed loop: what a set-up check reads).
std::vector<GateCheck> Trace(const GateConfig& config, const GroupGateState& group,
                             const BatchFacts& facts, const RsWaitObservation& rs,
                             const ThroughputTable& table) {
  std::vector<GateCheck> trace;
  EvaluateAdaptive(config, group, facts, rs, std::nullopt, &table, &trace);
  return trace;
}

// The decision `out` and the trace of the same decision, for a set-up check's message.
std::string Explain(const GateConfig& config, const GroupGateState& group,
                    const BatchFacts& facts, const RsWaitObservation& rs,
                    const ThroughputTable& table, const GateOutcome& out) {
  std::string why = "; got " + std::string(ModeLabel(out.decision.mode)) + " " +
                    std::string(ReasonLabel(out.decision.reason)) +
                    (out.flip_held ? " (held):" : ":");
  for (const GateCheck& c : Trace(config, group, facts, rs, table)) {
    why += " " + c.gate + " " + c.outcome + ": " + c.detail;
  }
  return why;
}

// ADAPTIVE's decision over a learned table of 16 known bands (SP 1,000 tokens/s, TP-only
// 800: SP ahead) and a measured switch cost (50 ms, from 8 steps after a switch in other
// bands: above adaptive_margin of a step and clear of its noise, so the flip cap and the
// cost bind; docs/design.md §11 rule 4). The group runs SP, and both variants depart from
// the gates on the band's evidence. `switching` 1: the worst path — the gates choose SP,
// the batch's band prefers TP-only (1,030 tokens/s), the flip cap leaves one switch (no
// excursion), so the switch's saving over the band mix is computed as a move, and the
// mix, which prefers SP, holds the mode (switch_cost fires); 0: the gates choose TP-only
// (wait share above max_rs_wait_share), the band prefers SP, the group's mode (no switch
// to weigh). The difference is the cost of weighing a switch. The group state is not
// carried, so every iteration takes the same path.
void BM_EvaluateAdaptive(benchmark::State& state) {
  GateConfig config;
  config.policy = GatePolicyKind::kAdaptive;
  const bool switching = state.range(0) != 0;
  ThroughputTable table;
  const int band = BandOf(config, 0.11, 16384);
  for (int b = 0; b < 16; ++b) {
    const double tp = b == band && switching ? 1030 : 800;  // the other bands: SP ahead
    for (int i = 0; i < 20; ++i) {
      table.Observe(config, b, Mode::kSequenceParallel, 1000 + i, 1000, 1.0);
      table.Observe(config, b, Mode::kTensorParallelOnly, 1000 + i, tp, 1.0);
    }
  }
  // The steps after 8 switches, in bands other than the batch's (one each, so no cell's
  // change detector sees a change), each 50 ms over its cell's estimate.
  for (int k = 0, b = 0; k < 8; ++k, ++b) {
    if (b == band) ++b;
    const Mode m = k % 2 == 0 ? Mode::kTensorParallelOnly : Mode::kSequenceParallel;
    const double seconds = 1000 / table.cell(b, m).tokens_per_s() + 0.05;
    table.ObserveAfterSwitch(config, b, m, 1020, 1000, seconds);
  }
  GroupGateState group = DecidedGroup();
  group.last_switch_at = 990;  // one flip left: no excursion, a move must pay
  const RsWaitObservation rs{switching ? 0.12 : 0.25, 50};
  const BatchFacts facts = PlainFacts(config, 1021, 0.11, 16384);
  if (!(MeasuredSwitchCost(config, table, facts.step) > 0)) {
    state.SkipWithError("expected a measured switch cost");
    return;
  }
  const GateOutcome out = TimeAdaptive(state, config, group, facts, rs, table);
  const Mode gates = switching ? Mode::kSequenceParallel : Mode::kTensorParallelOnly;
  const std::vector<GateCheck> trace = Trace(config, group, facts, rs, table);
  const bool weighed = std::any_of(trace.begin(), trace.end(), [](const GateCheck& c) {
    return c.gate == "switch_cost" && c.outcome == "fire";
  });
  if (out.decision != Decision{Mode::kSequenceParallel, Reason::kAdaptive} ||
      out.static_choice != gates || out.flip_held != switching || weighed != switching) {
    const std::string why =
        std::string(switching ? "expected SP (ADAPTIVE), held: the move to the band's "
                                "TP-only does not pay the switch cost"
                              : "expected SP (ADAPTIVE) against the gates' TP-only, nothing "
                                "held") +
        Explain(config, group, facts, rs, table, out);
    state.SkipWithError(why.c_str());
  }
}

// A batch in a band with no samples, decided by the physics prior: the prior's fit over
// the 16 measured bands (TP-only 3 % slower than SP on each) and its collective sums
// (policy/cost_prior.h). The batch's CV, 0.33, is above max_length_cv, so the gates choose
// TP-only; the prior predicts SP clear of twice its error, and SP is the group's mode (no
// switch to weigh).
void BM_EvaluateAdaptivePrior(benchmark::State& state) {
  GateConfig config;
  config.policy = GatePolicyKind::kAdaptive;
  ThroughputTable table;
  table.SetPriorInputs(PriorInputs{.tp = 8, .hidden = 5120, .layers = 8});
  for (int b = 0; b < 16; ++b) {
    for (int i = 0; i < 20; ++i) {
      table.Observe(config, b, Mode::kSequenceParallel, 1000 + i, 16384, 1.0);
      table.Observe(config, b, Mode::kTensorParallelOnly, 1000 + i, 16384, 1.03);
    }
  }
  for (int i = 0; i < 40; ++i) {
    const double cv = 0.1 * (i % 5);
    table.ObserveCollectives(config, Mode::kSequenceParallel, 1000 + i, 16384, cv, 1.0 + 0.05 * cv,
                             0.05, 0.06 + 0.1 * cv);
  }
  const GroupGateState group = DecidedGroup();
  const RsWaitObservation rs{0.12, 50};
  const BatchFacts facts = PlainFacts(config, 1041, 0.33, 16384);  // cv band 6: no samples
  const GateOutcome out = TimeAdaptive(state, config, group, facts, rs, table);
  const std::vector<GateCheck> trace = Trace(config, group, facts, rs, table);
  const bool gates_tp = std::any_of(trace.begin(), trace.end(), [](const GateCheck& c) {
    return c.gate == "length_cv" && c.outcome == "fire";
  });
  if (out.decision != Decision{Mode::kSequenceParallel, Reason::kAdaptive} ||
      out.static_choice.has_value() || out.flip_held || !gates_tp) {
    const std::string why =
        "expected the prior to choose SP against the gates' TP-only (ADAPTIVE, no static "
        "choice)" + Explain(config, group, facts, rs, table, out);
    state.SkipWithError(why.c_str());
  }
}

// One decision as the daemon makes it: length statistics, then the gates.
void BM_Decision(benchmark::State& state) {
  const std::vector<int64_t> lengths = Lengths(state.range(0));
  if (!CheckStats(state, lengths)) return;
  GateConfig config;
  config.max_length_cv = 10.0;  // lognormal(0.8) has CV ~0.9: keep the CV gate passing
  GroupGateState group;
  const RsWaitObservation rs{0.12, 50};
  int64_t step = 0;
  for (auto _ : state) {
    absl::StatusOr<LengthStats> stats = ComputeLengthStats(lengths);
    GateOutcome out =
        EvaluateGates(config, group, FactsFor(step++, stats->cv), rs, std::nullopt);
    group = out.next;
    benchmark::DoNotOptimize(group);
    benchmark::ClobberMemory();
  }
  if (group.reason != Reason::kGatesPassed) state.SkipWithError("expected GATES_PASSED");
  state.SetItemsProcessed(state.iterations());  // decisions
}

// The what-if path (EvaluateGates RPC): the same, recording the reason chain.
void BM_DecisionWithTrace(benchmark::State& state) {
  const std::vector<int64_t> lengths = Lengths(state.range(0));
  if (!CheckStats(state, lengths)) return;
  GateConfig config;
  config.max_length_cv = 10.0;
  const GroupGateState group;
  const RsWaitObservation rs{0.12, 50};
  for (auto _ : state) {
    std::vector<GateCheck> trace;
    absl::StatusOr<LengthStats> stats = ComputeLengthStats(lengths);
    GateOutcome out =
        EvaluateGates(config, group, FactsFor(1, stats->cv), rs, std::nullopt, &trace);
    benchmark::DoNotOptimize(out);
    benchmark::DoNotOptimize(trace.data());
  }
  state.SetItemsProcessed(state.iterations());
}

// 1,000 sequences is the target case; the others show how the cost scales.
void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1, 64, 1000, 16384, 1 << 20}) b->Arg(n);
  b->ArgName("seqs");
}

// ADAPTIVE's decision where the batch's band cannot tell the modes apart alone (SP 3 %
// faster within ±20 % noise, 16 samples a mode) and 16 other bands measured the same gap
// with 200 samples each: the bands' pool (PoolBands, a pass over the 32 bands) decides,
// departing from the gates' TP-only to SP.
void BM_EvaluateAdaptivePooled(benchmark::State& state) {
  GateConfig config;
  config.policy = GatePolicyKind::kAdaptive;
  ThroughputTable table;
  const auto noisy = [&](int band, int n) {
    for (int i = n - 1; i >= 0; --i) {
      const double f = i % 2 == 0 ? 1.2 : 0.8;
      table.Observe(config, band, Mode::kSequenceParallel, 1000 - i, 1030 * f, 1.0);
      table.Observe(config, band, Mode::kTensorParallelOnly, 1000 - i, 1000 * (2 - f), 1.0);
    }
  };
  const int band = BandOf(config, 0.33, 16384);
  for (int b = 0; b < 16; ++b) noisy(b == band ? 16 : b, 200);
  noisy(band, 16);
  const GroupGateState group = DecidedGroup();
  const RsWaitObservation rs{0.12, 50};
  const BatchFacts facts = PlainFacts(config, 1001, 0.33, 16384);  // the gates: TP-only
  const GateOutcome out = TimeAdaptive(state, config, group, facts, rs, table);
  const BandEstimate e = EstimateBand(config, &table, band, facts.step);
  const Evidence own = DepartureEvidence(config, e, facts.tokens, Mode::kTensorParallelOnly,
                                         Mode::kSequenceParallel,
                                         TableNoiseOf(config, table).relative_variance);
  if (out.decision != Decision{Mode::kSequenceParallel, Reason::kAdaptive} || !e.known ||
      own.bound_s > 0) {
    const std::string why = "expected the pool to depart where the band alone cannot" +
                            Explain(config, group, facts, rs, table, out);
    state.SkipWithError(why.c_str());
  }
}

// The range rules a step's record passes at the client (ReportTelemetry) and again at the
// daemon, per report: the step's values and `microbatches` micro-batch records (a step
// plan's; 0: a plain plan's), each bounded by its plan's tokens. The record is valid, as
// almost every record is: the cost of a pass, not of an error.
void BM_ValidateTelemetry(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<MicrobatchTelemetryValues> mbs;
  for (int id = 0; id < n; ++id) {
    mbs.push_back({.id = id, .mode = Mode::kSequenceParallel, .forward_s = 0.01,
                   .backward_s = 0.02, .rs_wait_s = 0.001, .all_gather_s = 0.001,
                   .effective_tokens = 4096});
  }
  const std::vector<int64_t> planned(static_cast<size_t>(n), 4096);
  const TelemetryBounds bounds{.plan_tokens = 4096 * std::max(n, 1),
                               .microbatch_tokens = planned};
  StepTelemetryValues step{};
  step.step = 7;
  step.mode = 1;
  step.step_time_s = 0.1;
  step.rs_wait_s = 0.004;
  step.all_gather_s = 0.003;
  step.effective_tokens = bounds.plan_tokens;
  for (auto _ : state) {
    absl::Status s = ValidateStepTelemetry(step, bounds);
    if (s.ok()) s = ValidateMicrobatchTelemetry(mbs, n, bounds);
    if (!s.ok()) {
      state.SkipWithError(("a valid record was refused: " + s.ToString()).c_str());
      break;
    }
    benchmark::DoNotOptimize(s);
  }
}

// One stage's step plan under ADAPTIVE (DecideStagePlan, as the daemon and the worker's
// fallback run it): stage 0 of pp 4, `microbatches` micro-batches whose CVs cycle through
// four learned bands, every band's TP-only ahead. `tight` 1: a budget that holds TP-only
// for about half of them, so the gate refuses some and the plan is decided a second time
// with the micro-batches expected to gain most admitted first; 0: a budget that holds
// them all (one pass). Checked before timing: with `tight`, both modes run; the peak is
// within the budget.
void BM_DecideStagePlan(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const bool tight = state.range(1) != 0;
  GateConfig config;
  config.policy = GatePolicyKind::kAdaptive;
  config.memory_headroom = 1.0;
  const double cvs[] = {0.12, 0.22, 0.32, 0.42};
  ThroughputTable table;
  for (int i = 0; i < 4; ++i) {
    const int band = BandOf(config, cvs[i], 16384);
    for (int k = 0; k < 20; ++k) {
      table.Observe(config, band, Mode::kSequenceParallel, 1000 + k, 1000, 1.0);
      table.Observe(config, band, Mode::kTensorParallelOnly, 1000 + k, 1100 + 100 * i, 1.0);
    }
  }
  const JobLayout layout{.tp = 8, .pp = 4, .microbatches = m};
  std::vector<MicrobatchFacts> mbs(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) {
    mbs[i] = {.id = i, .length_cv = cvs[(i * 7) % 4], .tokens = 16384,
              .memory = {.activation_sp = 10, .activation_tp = 20}};
  }
  // Stage 0 holds 4 micro-batches (pp 4): all SP is 140, all TP-only 180.
  const uint64_t budget = tight ? 160 : 180;
  const StagePlanFacts plan{.step = 1021, .stage = 0, .resident_bytes = 100,
                      .memory_budget_bytes = budget, .microbatches = mbs};
  GroupPolicyState group;
  {
    GroupPolicyState check = group;
    const StagePlanOutcome out = DecideStagePlan(check, config, layout, plan, {}, &table, false);
    const auto tp =
        std::count_if(out.decisions.begin(), out.decisions.end(),
                      [](const Decision& d) { return d.mode == Mode::kTensorParallelOnly; });
    if (tp == 0 || (tight ? tp == m : tp != m) || out.peak_bytes > budget) {
      state.SkipWithError(tight ? "expected some micro-batches TP-only, some refused, within "
                                  "the budget"
                                : "expected every micro-batch TP-only, within the budget");
      return;
    }
  }
  // The same decision every iteration: the group as it was, at the same step (the table's
  // estimates do not age between iterations). The copy is timed in both variants.
  for (auto _ : state) {
    GroupPolicyState g = group;
    StagePlanOutcome out = DecideStagePlan(g, config, layout, plan, {}, &table, false);
    benchmark::DoNotOptimize(out.decisions.data());
  }
  state.SetItemsProcessed(state.iterations() * m);
}

BENCHMARK(BM_SumLengths)->Apply(Sizes);
BENCHMARK(BM_ComputeLengthStats)->Apply(Sizes);
BENCHMARK(BM_EvaluateGates);
BENCHMARK(BM_EvaluateAdaptive)->Arg(0)->Arg(1)->ArgName("switching");
BENCHMARK(BM_EvaluateAdaptivePrior);
BENCHMARK(BM_EvaluateAdaptivePooled);
BENCHMARK(BM_Decision)->Apply(Sizes);
BENCHMARK(BM_DecisionWithTrace)->Arg(1000)->ArgName("seqs");
BENCHMARK(BM_DecideStagePlan)->ArgsProduct({{8, 64}, {0, 1}})->ArgNames({"microbatches", "tight"});
BENCHMARK(BM_ValidateTelemetry)->Arg(0)->Arg(8)->Arg(64)->ArgName("microbatches");

}  // namespace
}  // namespace spgate

BENCHMARK_MAIN();
