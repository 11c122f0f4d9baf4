// replay --compare's report: the tables on stderr, the JSON under "compare" and the
// per-window series CSV, from a finished CompareResult (compare.h; docs/sim.md).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/sim/compare.h"

namespace spgate::sim {

namespace {

// The windowed regret and the decision counts, a row per policy, below the main table.
std::string RegretTable(const CompareResult& r) {
  const WindowedRegret& w = r.policies.empty() ? WindowedRegret{} : r.policies.front().regret;
  std::string out = absl::StrFormat(
      "\nRegret per window of %s against the oracle and the expected-value oracle "
      "(1 - tokens/s / oracle's; %s, "
      "sliding by one step); %s; switch cost %g s\n"
      "| policy | window regret %% median | p95 | worst | vs expected oracle: median | p95 | "
      "x best fixed, worst window | x best fixed, lowest window | oracle agreement | "
      "flips / 1000 %s | explore %% |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      CountText(w.window, "step"), CountText(w.windows, "window"),
      r.pipelined() ? "agreement, flips and exploration per (stage, micro-batch) decision"
                    : "agreement, flips and exploration per group-step",
      r.switch_cost_s, r.pipelined() ? "decisions" : "steps");
  for (const PolicyResult& p : r.policies) {
    absl::StrAppendFormat(&out,
                          "| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.4f | %.4f | %.4f | %.2f | "
                          "%.2f |\n",
                          p.name, 100 * p.regret.median, 100 * p.regret.p95,
                          100 * p.regret.worst, 100 * p.expected_regret.median,
                          100 * p.expected_regret.p95, p.regret.worst_vs_best_fixed,
                          p.regret.min_vs_best_fixed, p.oracle_agreement,
                          p.flips_per_1000_steps, 100 * p.explore_share);
  }
  return out;
}

// A policy's decisions, mode -> reason -> count: {"sp": {"probe": 12, ...}, ...}.
std::string DecisionsJson(const PolicyResult& p) {
  std::vector<std::string> modes;
  for (const auto& [mode, reasons] : p.decisions) {
    std::vector<std::string> counts;
    for (const auto& [reason, n] : reasons) {
      counts.push_back(absl::StrFormat("\"%s\": %d", reason, n));
    }
    modes.push_back(absl::StrFormat("\"%s\": {%s}", mode, absl::StrJoin(counts, ", ")));
  }
  return absl::StrCat("{", absl::StrJoin(modes, ", "), "}");
}

// A policy's windowed regret and decision counts, as JSON fields.
std::string RegretJson(const PolicyResult& p) {
  return absl::StrFormat(
      "\"regret_window_median\": %.6f, \"regret_window_p95\": %.6f, "
      "\"regret_window_worst\": %.6f, \"worst_window_vs_best_fixed\": %.6f, "
      "\"min_window_vs_best_fixed\": %.6f, \"worst_window_start\": %d, "
      "\"expected_regret_window_median\": %.6f, \"expected_regret_window_p95\": %.6f, "
      "\"oracle_agreement\": %.6f, \"flips_per_1000_steps\": %.4f, \"explore_share\": %.6f, "
      "\"explored_steps\": %d, \"changes_detected\": %d, \"decisions_by_reason\": %s",
      p.regret.median, p.regret.p95, p.regret.worst, p.regret.worst_vs_best_fixed,
      p.regret.min_vs_best_fixed, p.regret.worst_start, p.expected_regret.median,
      p.expected_regret.p95, p.oracle_agreement,
      p.flips_per_1000_steps, p.explore_share, p.explored_steps, p.changes_detected,
      DecisionsJson(p));
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
      "%s x %s, pp=%d vp=%d microbatches=%d schedule=%s, limit %.2f GiB; "
      "same micro-batches and noise for every policy\n"
      "| policy | effective tokens/s | x oracle | x best fixed | step p95 s | bubble | "
      "TP-only share per stage | peak GiB per stage | steps over limit | memory-forced SP | "
      "p2p MiB/step sharded (native) | switches | probe |\n"
      "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|---:|---:|\n",
      CountText(r.groups, "pipeline replica"), CountText(r.steps, "step"), r.pp, r.vp,
      r.microbatches, r.schedule,
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
      "%s x %s, same batches and noise for every policy\n"
      "| policy | effective tokens/s | x oracle | step p95 s | peak GiB | SP steps | "
      "TP-only steps | switches | probe steps |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      CountText(r.groups, "group"), CountText(r.steps, "step"));
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

const char kBatchCsvHeader[] =
    "group,step,stage,microbatch,sequences,tokens,max_length,length_cv,band,sp_expected_s,"
    "tp_only_expected_s,sp_s,tp_only_s\n";

std::string CompareBatchesCsvRow(const BatchRecord& b) {
  return absl::StrFormat("%d,%d,%d,%d,%d,%d,%d,%.6g,%d,%.9g,%.9g,%.9g,%.9g\n", b.group,
                         b.step, b.stage, b.microbatch, b.stats.sequences, b.stats.tokens,
                         b.stats.max_length, b.stats.cv, b.band, b.expected_s[0],
                         b.expected_s[1], b.drawn_s[0], b.drawn_s[1]);
}

}  // namespace spgate::sim
