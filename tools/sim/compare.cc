// The decision-quality comparison; see compare.h and docs/sim.md.
#include "tools/sim/compare.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "tools/sim/cost_model.h"
#include "tools/sim/pipeline.h"

namespace spgate::sim {
namespace {

// One policy's run over every group: its per-group state, its pooled learned table (with
// the lag), and its totals.
struct Run {
  enum class Kind { kSp, kTpOnly, kStatic, kAdaptive, kOracle };
  struct Sample {
    int64_t step;
    int band;
    Mode mode;
    double tokens, seconds;
    bool after_switch;  // the group's previous step ran the other mode
    double length_cv, all_gather_s, rs_wait_s;  // for the prior (ObserveCollectives)
  };

  Kind kind;
  GateConfig config;
  std::vector<GroupPolicyState> groups;
  std::vector<std::optional<Mode>> last_mode;
  ThroughputTable table;
  std::deque<Sample> pending;  // not yet visible to the policy
  PolicyResult result;
  double tokens = 0, time_s = 0;
  std::vector<double> step_times;
  double window_tokens = 0, window_time = 0;  // summed over groups for the current window
};

}  // namespace

const PolicyResult* CompareResult::Find(const std::string& name) const {
  for (const PolicyResult& p : policies) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

namespace {

// One batch a step per group (no pipeline).
absl::StatusOr<CompareResult> CompareGroups(const SimOptions& o, const GateConfig& config,
                                            int64_t series_window) {
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) return s;
  absl::StatusOr<int64_t> replay_steps = ReplaySteps(o, config);
  if (!replay_steps.ok()) return replay_steps.status();
  const int64_t steps = *replay_steps;
  if (series_window <= 0) series_window = std::max<int64_t>(1, steps / 50);
  const CostModel model(o.cost);

  std::vector<std::unique_ptr<runtime::BatchBuilder>> batches;
  std::vector<std::mt19937_64> rngs;
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, gi);
    if (!b.ok()) return b.status();
    batches.push_back(*std::move(b));
    rngs.emplace_back(GroupNoiseSeed(o.seed, gi));
  }

  GateConfig static_config = config;
  static_config.policy = GatePolicyKind::kStatic;
  GateConfig adaptive_config = config;
  adaptive_config.policy = GatePolicyKind::kAdaptive;
  const std::pair<const char*, Run::Kind> kinds[] = {
      {"sp", Run::Kind::kSp},           {"tp_only", Run::Kind::kTpOnly},
      {"static", Run::Kind::kStatic},   {"adaptive", Run::Kind::kAdaptive},
      {"oracle", Run::Kind::kOracle}};
  std::vector<Run> runs;
  for (const auto& [name, kind] : kinds) {
    Run r;
    r.kind = kind;
    r.config = kind == Run::Kind::kAdaptive ? adaptive_config : static_config;
    r.groups.resize(o.groups);
    r.last_mode.resize(o.groups);
    r.result.name = name;
    r.table.SetPriorInputs(DeclaredPriorInputs(o));
    runs.push_back(std::move(r));
  }

  for (int64_t k = 0; k < steps; ++k) {
    for (Run& r : runs) r.result.step_seconds.push_back(0);
    for (int gi = 0; gi < o.groups; ++gi) {
      const std::vector<int64_t> lengths = batches[gi]->Next(config.bucket_target_cv).lengths;
      absl::StatusOr<LengthStats> stats = ComputeLengthStats(lengths);
      if (!stats.ok()) return stats.status();
      const MemoryPrediction mem = model.PredictMemory(lengths);
      // Both modes' costs from one generator state: every policy sees the same noise.
      std::mt19937_64 for_tp = rngs[gi];
      const GroupStep sp_step = model.Step(lengths, Mode::kSequenceParallel, rngs[gi], k);
      const GroupStep tp_step = model.Step(lengths, Mode::kTensorParallelOnly, for_tp, k);
      const BatchFacts facts{.step = k,
                             .length_cv = stats->cv,
                             .tokens = stats->tokens,
                             .predicted_peak_bytes_sp = mem.sp,
                             .predicted_peak_bytes_tp = mem.tp,
                             .memory_budget_bytes = mem.budget};
      const bool tp_over = TpOnlyOverBudget(config, facts);
      // The batch's faster mode (switch costs not counted), subject to the memory gate.
      const Mode oracle_mode = !tp_over && tp_step.step_time_s < sp_step.step_time_s
                                   ? Mode::kTensorParallelOnly
                                   : Mode::kSequenceParallel;
      for (Run& r : runs) {
        Decision d;
        int band = -1;
        switch (r.kind) {
          case Run::Kind::kSp:
            d = {Mode::kSequenceParallel, Reason::kPinned};
            break;
          case Run::Kind::kTpOnly:
            d = tp_over ? Decision{Mode::kSequenceParallel, Reason::kMemoryRequiresSp}
                        : Decision{Mode::kTensorParallelOnly, Reason::kPinned};
            break;
          case Run::Kind::kOracle:
            d = {oracle_mode, Reason::kAdaptive};
            break;
          case Run::Kind::kStatic:
          case Run::Kind::kAdaptive: {
            while (!r.pending.empty() && r.pending.front().step + kReplayLearnLagSteps <= k) {
              const Run::Sample& s = r.pending.front();
              if (s.after_switch) {
                r.table.ObserveAfterSwitch(r.config, s.band, s.mode, s.step, s.tokens, s.seconds);
              } else {
                r.table.Observe(r.config, s.band, s.mode, s.step, s.tokens, s.seconds);
              }
              if (o.adaptive_prior) {
                r.table.ObserveCollectives(r.config, s.mode, s.step, s.tokens, s.length_cv,
                                           s.seconds, s.all_gather_s, s.rs_wait_s, s.after_switch);
              }
              r.pending.pop_front();
            }
            const GateOutcome out = r.groups[gi].Decide(r.config, facts, std::nullopt, &r.table);
            d = out.decision;
            band = out.band;
            break;
          }
        }
        const GroupStep& step = d.mode == Mode::kSequenceParallel ? sp_step : tp_step;
        // A switch makes the step longer; the telemetry (hence ADAPTIVE's sample) has it.
        const double step_s = step.step_time_s + model.SwitchSeconds(r.last_mode[gi], d.mode);
        if (r.kind == Run::Kind::kStatic || r.kind == Run::Kind::kAdaptive) {
          r.groups[gi].ObserveRsWaitShare(k, d.mode, step.group_rs_wait_share,
                                          r.config.window_steps);
        }
        if (band >= 0) {
          r.pending.push_back({k, band, d.mode, static_cast<double>(step.effective_tokens),
                               step_s, r.last_mode[gi].has_value() && *r.last_mode[gi] != d.mode,
                               stats->cv, step.group_all_gather_s(), step.group_rs_wait_s()});
        }
        if (r.last_mode[gi].has_value() && *r.last_mode[gi] != d.mode) ++r.result.switches;
        r.last_mode[gi] = d.mode;
        if (d.reason == Reason::kProbe) ++r.result.probe_steps;
        if (d.mode == oracle_mode) ++r.result.oracle_agreed;
        (d.mode == Mode::kSequenceParallel ? r.result.sp_steps : r.result.tp_steps)++;
        r.tokens += static_cast<double>(step.effective_tokens);
        r.time_s += step_s;
        r.step_times.push_back(step_s);
        r.result.step_seconds.back() += step_s;
        r.result.peak_memory_bytes = std::max(r.result.peak_memory_bytes, step.peak_memory_bytes);
        r.window_tokens += static_cast<double>(step.effective_tokens);
        r.window_time += step_s;
      }
    }
    if ((k + 1) % series_window == 0 || k + 1 == steps) {
      for (Run& r : runs) {
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
  for (Run& r : runs) {
    r.result.effective_tokens_per_s = r.time_s > 0 ? o.groups * r.tokens / r.time_s : 0;
    r.result.step_time_p95_s = Percentile(std::move(r.step_times), 0.95);
    out.policies.push_back(std::move(r.result));
  }
  const double oracle = out.policies.back().effective_tokens_per_s;
  for (PolicyResult& p : out.policies) {
    p.ratio_to_oracle = oracle > 0 ? p.effective_tokens_per_s / oracle : 0;
  }
  return out;
}

}  // namespace

absl::StatusOr<CompareResult> Compare(const SimOptions& o, const GateConfig& config,
                                      int64_t series_window, int64_t regret_window) {
  if (regret_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--regret_window must be >= 1 step, got ", regret_window));
  }
  if (absl::Status s = ValidateSwitchCost(o.cost); !s.ok()) return s;
  absl::StatusOr<CompareResult> r = o.pipelined() ? ComparePipeline(o, config, series_window)
                                                  : CompareGroups(o, config, series_window);
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
  for (PolicyResult& p : r.policies) {  // writes no step_seconds: the references hold
    absl::StatusOr<WindowedRegret> w =
        WindowedRegretOf(p.step_seconds, oracle_s, fixed_s, regret_window);
    if (!w.ok()) return w.status();
    p.regret = *w;
    const double decisions = static_cast<double>(p.sp_steps + p.tp_steps);
    p.oracle_agreement = decisions > 0 ? static_cast<double>(p.oracle_agreed) / decisions : 0;
    p.flips_per_1000_steps =
        decisions > 0 ? 1000.0 * static_cast<double>(p.switches) / decisions : 0;
    p.explore_share = decisions > 0 ? static_cast<double>(p.probe_steps) / decisions : 0;
  }
  return absl::OkStatus();
}

namespace {

// The windowed regret and the decision counts, a row per policy, below the main table.
std::string RegretTable(const CompareResult& r) {
  const WindowedRegret& w = r.policies.empty() ? WindowedRegret{} : r.policies.front().regret;
  std::string out = absl::StrFormat(
      "\nRegret per window of %d steps against the oracle (1 - tokens/s / oracle's; %d windows, "
      "sliding by one step); %s; switch cost %g s\n"
      "| policy | window regret %% median | p95 | worst | x best fixed, worst window | "
      "x best fixed, lowest window | oracle agreement | flips / 1000 %s | explore %% |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      w.window, w.windows,
      r.pipelined() ? "agreement, flips and exploration per (stage, micro-batch) decision"
                    : "agreement, flips and exploration per group-step",
      r.switch_cost_s, r.pipelined() ? "decisions" : "steps");
  for (const PolicyResult& p : r.policies) {
    absl::StrAppendFormat(&out, "| %s | %.2f | %.2f | %.2f | %.4f | %.4f | %.4f | %.2f | %.2f |\n",
                          p.name, 100 * p.regret.median, 100 * p.regret.p95,
                          100 * p.regret.worst, p.regret.worst_vs_best_fixed,
                          p.regret.min_vs_best_fixed, p.oracle_agreement,
                          p.flips_per_1000_steps, 100 * p.explore_share);
  }
  return out;
}

// A policy's windowed regret and decision counts, as JSON fields.
std::string RegretJson(const PolicyResult& p) {
  return absl::StrFormat(
      "\"regret_window_median\": %.6f, \"regret_window_p95\": %.6f, "
      "\"regret_window_worst\": %.6f, \"worst_window_vs_best_fixed\": %.6f, "
      "\"min_window_vs_best_fixed\": %.6f, \"worst_window_start\": %d, "
      "\"oracle_agreement\": %.6f, \"flips_per_1000_steps\": %.4f, \"explore_share\": %.6f",
      p.regret.median, p.regret.p95, p.regret.worst, p.regret.worst_vs_best_fixed,
      p.regret.min_vs_best_fixed, p.regret.worst_start, p.oracle_agreement,
      p.flips_per_1000_steps, p.explore_share);
}

// The windows and the switch cost: "regret": {...}.
std::string RegretMetaJson(const CompareResult& r) {
  const WindowedRegret& w = r.policies.empty() ? WindowedRegret{} : r.policies.front().regret;
  return absl::StrFormat(
      "\"regret\": {\"regret_window\": %d, \"window_steps\": %d, \"windows\": %d, "
      "\"switch_cost_s\": %.6f}",
      r.regret_window, w.window, w.windows, r.switch_cost_s);
}

// Per stage, "0.00 / 0.38 / 1.00 / 1.00".
template <typename F>
std::string PerStage(const PolicyResult& p, F f) {
  std::vector<std::string> parts;
  for (const StageResult& s : p.stages) parts.push_back(f(s));
  return absl::StrJoin(parts, " / ");
}

std::string PipelineTable(const CompareResult& r) {
  std::string out = absl::StrFormat(
      "%d pipeline replicas x %d steps, pp=%d vp=%d microbatches=%d schedule=%s, limit %.2f GiB; "
      "same micro-batches and noise for every policy\n"
      "| policy | effective tokens/s | x oracle | x best fixed | step p95 s | bubble | "
      "TP-only share per stage | peak GiB per stage | steps over limit | memory-forced SP | "
      "p2p MiB/step sharded (native) | switches | probe |\n"
      "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|---:|---:|\n",
      r.groups, r.steps, r.pp, r.vp, r.microbatches, r.schedule,
      static_cast<double>(r.memory_limit_bytes) / (1ull << 30));
  for (const PolicyResult& p : r.policies) {
    int64_t over = 0;
    for (const StageResult& s : p.stages) over += s.over_limit_steps;
    absl::StrAppendFormat(
        &out,
        "| %s | %.0f | %.4f | %.4f | %.4f | %.3f | %s | %s | %d | %d | %.1f (%.1f) | %d | %d |\n",
        p.name, p.effective_tokens_per_s, p.ratio_to_oracle, p.ratio_to_best_fixed,
        p.step_time_p95_s, p.bubble_share,
        PerStage(p, [](const StageResult& s) { return absl::StrFormat("%.2f", s.tp_only_share); }),
        PerStage(p,
                 [](const StageResult& s) {
                   return absl::StrFormat("%.1f",
                                          static_cast<double>(s.peak_memory_bytes) / (1ull << 30));
                 }),
        over, p.memory_forced_sp, p.p2p_bytes_per_step / (1 << 20),
        p.p2p_native_bytes_per_step / (1 << 20), p.switches, p.probe_steps);
  }
  return out + RegretTable(r);
}

std::string PipelineJson(const CompareResult& r) {
  std::vector<std::string> rows;
  for (const PolicyResult& p : r.policies) {
    std::vector<std::string> stages;
    for (size_t i = 0; i < p.stages.size(); ++i) {
      const StageResult& s = p.stages[i];
      stages.push_back(absl::StrFormat(
          "{\"stage\": %d, \"tp_only_share\": %.6f, \"peak_memory_bytes\": %d, "
          "\"over_limit_steps\": %d, \"busy_share\": %.6f}",
          i, s.tp_only_share, s.peak_memory_bytes, s.over_limit_steps, s.busy_share));
    }
    rows.push_back(absl::StrFormat(
        "\"%s\": {\"effective_tokens_per_s\": %.3f, \"step_time_p95_s\": %.6f, "
        "\"peak_memory_bytes\": %d, \"ratio_to_oracle\": %.6f, \"ratio_to_best_fixed\": %.6f, "
        "\"switches\": %d, \"probe_steps\": %d, \"sp_steps\": %d, \"tp_only_steps\": %d, "
        "\"memory_forced_sp\": %d, \"bubble_share\": %.6f, \"p2p_bytes_per_step\": %.1f, "
        "\"p2p_native_bytes_per_step\": %.1f, %s,\n      \"stages\": [%s]}",
        p.name, p.effective_tokens_per_s, p.step_time_p95_s, p.peak_memory_bytes,
        p.ratio_to_oracle, p.ratio_to_best_fixed, p.switches, p.probe_steps, p.sp_steps,
        p.tp_steps, p.memory_forced_sp, p.bubble_share, p.p2p_bytes_per_step,
        p.p2p_native_bytes_per_step, RegretJson(p), absl::StrJoin(stages, ", ")));
  }
  rows.push_back(RegretMetaJson(r));
  rows.push_back(absl::StrFormat(
      "\"pipeline\": {\"pp\": %d, \"vp\": %d, \"microbatches\": %d, \"schedule\": \"%s\", "
      "\"memory_limit_bytes\": %d, \"steps\": %d, \"replicas\": %d}",
      r.pp, r.vp, r.microbatches, r.schedule, r.memory_limit_bytes, r.steps, r.groups));
  return "{\n    " + absl::StrJoin(rows, ",\n    ") + "\n  }";
}

}  // namespace

std::string CompareTable(const CompareResult& r) {
  if (r.pipelined()) return PipelineTable(r);
  std::string out = absl::StrFormat(
      "%d groups x %d steps, same batches and noise for every policy\n"
      "| policy | effective tokens/s | x oracle | step p95 s | peak GiB | SP steps | "
      "TP-only steps | switches | probe steps |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      r.groups, r.steps);
  for (const PolicyResult& p : r.policies) {
    absl::StrAppendFormat(&out, "| %s | %.0f | %.4f | %.4f | %.2f | %d | %d | %d | %d |\n", p.name,
                          p.effective_tokens_per_s, p.ratio_to_oracle, p.step_time_p95_s,
                          static_cast<double>(p.peak_memory_bytes) / (1ull << 30), p.sp_steps,
                          p.tp_steps, p.switches, p.probe_steps);
  }
  return out + RegretTable(r);
}

std::string CompareJson(const CompareResult& r) {
  if (r.pipelined()) return PipelineJson(r);
  std::vector<std::string> rows;
  for (const PolicyResult& p : r.policies) {
    rows.push_back(absl::StrFormat(
        "\"%s\": {\"effective_tokens_per_s\": %.3f, \"step_time_p95_s\": %.6f, "
        "\"peak_memory_bytes\": %d, \"ratio_to_oracle\": %.6f, \"switches\": %d, "
        "\"probe_steps\": %d, \"sp_steps\": %d, \"tp_only_steps\": %d, %s}",
        p.name, p.effective_tokens_per_s, p.step_time_p95_s, p.peak_memory_bytes,
        p.ratio_to_oracle, p.switches, p.probe_steps, p.sp_steps, p.tp_steps, RegretJson(p)));
  }
  rows.push_back(RegretMetaJson(r));
  return "{\n    " + absl::StrJoin(rows, ",\n    ") + "\n  }";
}

std::string CompareSeriesCsv(const CompareResult& r) {
  std::string out = "step";
  for (const PolicyResult& p : r.policies) absl::StrAppend(&out, ",", p.name);
  out += "\n";
  const size_t n = r.policies.empty() ? 0 : r.policies.front().series.size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t step = std::min<int64_t>(r.steps, static_cast<int64_t>(i + 1) * r.series_window);
    absl::StrAppend(&out, step);
    for (const PolicyResult& p : r.policies) absl::StrAppendFormat(&out, ",%.1f", p.series[i]);
    out += "\n";
  }
  return out;
}

}  // namespace spgate::sim
