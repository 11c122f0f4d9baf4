// Summarize, the JSON writer and the table.
#include "worker/runtime/summary.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "policy/types.h"

namespace spgate::runtime {

const char* StepSourceLabel(StepSource source) {
  switch (source) {
    case StepSource::kDaemon: return "daemon";
    case StepSource::kFallback: return "fallback";
    case StepSource::kLocalOnly: return "local";
    case StepSource::kMemoryOverride: return "memory_override";
    case StepSource::kFlag: return "flag";
  }
  return "unknown";
}

namespace {

std::string ModeName(uint8_t mode) { return std::string(ModeLabel(static_cast<Mode>(mode))); }

double P95(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.95 * v.size()));
  return v[std::max<size_t>(rank, 1) - 1];
}

// The median (the mean of the middle two for an even count); 0 for none.
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.9g", v);
}

template <typename Map, typename F>
std::string Object(const Map& m, F&& value) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    absl::StrAppend(&out, first ? "" : ", ", Quote(k), ": ", value(v));
    first = false;
  }
  return out + "}";
}

}  // namespace

namespace {

// One group-step as its TP ranks measured it: the slowest rank's figures.
struct GroupStep {
  double time_s = 0;
  double rs_share = 0;    // reduce-scatter wait / step time
  double norm_share = 0;  // norm-boundary stall / step time
  double all_gather_s = 0;
  double decision_s = 0;
  uint64_t allocated_bytes = 0;
  bool consistent = true;  // every rank ran the leader's mode in the leader's step
};

// Folds the ranks first_rank .. first_rank + tp - 1 of one step into a GroupStep, and
// their memory and --verify figures into the run's and the stage's maxima.
GroupStep FoldRanks(const std::vector<std::vector<StepRecord>>& records, int first_rank, int tp,
                    int64_t i, const std::string& mode, RunSummary::Stage& stage, RunSummary& s) {
  const StepRecord& lead = records[first_rank][i];
  GroupStep g;
  for (int r = 0; r < tp; ++r) {
    const StepRecord& rec = records[first_rank + r][i];
    g.consistent = g.consistent && rec.mode == lead.mode && rec.step == lead.step;
    g.time_s = std::max(g.time_s, rec.step_time_s);
    g.allocated_bytes = std::max(g.allocated_bytes, rec.device_allocated_bytes);
    if (rec.step_time_s > 0) {
      g.rs_share = std::max(g.rs_share, rec.rs_wait_s / rec.step_time_s);
      g.norm_share = std::max(g.norm_share, rec.norm_stall_s / rec.step_time_s);
    }
    g.all_gather_s = std::max(g.all_gather_s, rec.all_gather_s);
    g.decision_s = std::max(g.decision_s, rec.decision_s);
    for (const std::string& key : {mode, std::string("all")}) {
      s.peak_memory_bytes[key] = std::max(s.peak_memory_bytes[key], rec.peak_bytes);
    }
    stage.peak_memory_bytes = std::max(stage.peak_memory_bytes, rec.peak_bytes);
    stage.predicted_peak_memory_bytes =
        std::max(stage.predicted_peak_memory_bytes, rec.predicted_peak_bytes);
    s.predicted_peak_memory_bytes[mode] =
        std::max(s.predicted_peak_memory_bytes[mode], rec.predicted_peak_bytes);
    if (rec.peak_bytes > 0 && rec.predicted_peak_bytes > 0) {
      const double err = std::fabs(static_cast<double>(rec.predicted_peak_bytes) -
                                   static_cast<double>(rec.peak_bytes)) /
                         static_cast<double>(rec.peak_bytes);
      s.memory_prediction_max_rel_error = std::max(s.memory_prediction_max_rel_error, err);
    }
    if (rec.verify_diff >= 0) {
      s.verify_max_abs_diff = std::max(s.verify_max_abs_diff.value_or(0.0), rec.verify_diff);
      stage.verify_max_abs_diff =
          std::max(stage.verify_max_abs_diff.value_or(0.0), rec.verify_diff);
    }
  }
  return g;
}

// What the group-steps add up to, before they become the summary's figures. Keyed by
// mode name (and "all" where the summary has it).
struct StepSeries {
  std::map<std::string, std::vector<double>> step_times;
  std::map<std::string, double> time_sum, cv_sum;
  std::vector<double> rs_share, ag_tail, norm_ratio, decision_wait;
  // Step seconds per token, by mode: first steps after a switch, and the others.
  std::map<std::string, std::vector<double>> per_token_switch, per_token_steady;
  // Bytes the step took from the device (max over ranks), the same two ways.
  std::map<std::string, double> alloc_switch, alloc_steady;
  // The group in progress: its tokens and seconds, by mode.
  std::map<std::string, double> group_tokens, group_time;
};

// A replica's step, at its first stage: its tokens, time and decision's source.
void AddReplicaStep(const std::vector<StepRecord>& leader, int64_t i, const GroupStep& g,
                    const std::string& mode, StepSeries& acc, RunSummary& s) {
  const StepRecord& lead = leader[i];
  if (i > 0 && lead.tokens > 0) {
    const bool switched = leader[i - 1].mode != lead.mode;
    auto& bucket = switched ? acc.per_token_switch[mode] : acc.per_token_steady[mode];
    bucket.push_back(g.time_s / static_cast<double>(lead.tokens));
    (switched ? acc.alloc_switch : acc.alloc_steady)[mode] +=
        static_cast<double>(g.allocated_bytes);
  }
  s.decision_sources[StepSourceLabel(static_cast<StepSource>(lead.source))] += 1;
  if (lead.source == static_cast<uint8_t>(StepSource::kFallback) ||
      lead.source == static_cast<uint8_t>(StepSource::kLocalOnly)) {
    ++s.local_decisions;
  }
  for (const std::string& key : {mode, std::string("all")}) {
    acc.step_times[key].push_back(g.time_s);
    acc.time_sum[key] += g.time_s;
    acc.group_tokens[key] += static_cast<double>(lead.tokens);
    acc.group_time[key] += g.time_s;
    s.effective_tokens[key] += lead.tokens;
    s.padding_tokens[key] += lead.padding_tokens;
    acc.cv_sum[key] += lead.length_cv;
    s.steps_by_mode[key] += 1;
  }
  if (lead.mode == static_cast<uint8_t>(Mode::kSequenceParallel)) {
    acc.rs_share.push_back(g.rs_share);
    acc.ag_tail.push_back(g.all_gather_s);
    acc.norm_ratio.push_back(g.norm_share);
  }
  acc.decision_wait.push_back(g.decision_s);
  s.leader_decision_wait_max_s = std::max(s.leader_decision_wait_max_s, lead.decision_s);
}

// Per micro-batch decisions, from each stage's group leaders; then the run's decisions as
// the sum of its stages'.
void CountDecisions(const std::vector<std::vector<uint8_t>>& microbatch_decisions, int groups,
                    int tp, int pp, RunSummary& s) {
  for (int g = 0; g < groups && !microbatch_decisions.empty(); ++g) {
    for (uint8_t b : microbatch_decisions[g * tp]) {
      const Decision d = UnpackModeReason(b).value();  // this run's own PackModeReason bytes
      s.microbatch_decisions = true;
      s.stages[g % pp].decisions[ModeName(static_cast<uint8_t>(d.mode))]
                                [std::string(ReasonLabel(d.reason))] += 1;
    }
  }
  for (const RunSummary::Stage& st : s.stages) {
    for (const auto& [mode, reasons] : st.decisions) {
      for (const auto& [reason, n] : reasons) s.decisions[mode][reason] += n;
    }
  }
}

// The summary's figures from the series: switch costs, step-time percentiles and means.
void SummarizeSeries(StepSeries& acc, RunSummary& s) {
  for (auto& [mode, sw] : acc.per_token_switch) {
    const auto n = static_cast<int64_t>(sw.size());
    s.switch_steps[mode] = n;
    std::vector<double>& steady = acc.per_token_steady[mode];
    // A ratio needs both sides: a mode that never ran two steps in a row has none.
    const double steady_median = steady.empty() ? 0.0 : Median(steady);
    if (steady_median > 0) s.switch_cost_ratio[mode] = Median(sw) / steady_median;
    s.switch_device_alloc_bytes[mode] = acc.alloc_switch[mode] / static_cast<double>(n);
    if (!steady.empty()) {
      s.steady_device_alloc_bytes[mode] =
          acc.alloc_steady[mode] / static_cast<double>(steady.size());
    }
  }
  for (auto& [key, times] : acc.step_times) {
    s.step_time_p95_s[key] = P95(times);
    s.step_time_mean_s[key] = acc.time_sum[key] / times.size();
    s.mean_length_cv[key] = acc.cv_sum[key] / times.size();
  }
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / v.size();
  };
  s.rs_wait_share_mean = mean(acc.rs_share);
  s.all_gather_tail_p95_s = P95(acc.ag_tail);
  s.norm_stall_ratio_mean = mean(acc.norm_ratio);
  s.decision_wait_p95_s = P95(acc.decision_wait);
}

}  // namespace

RunSummary Summarize(const RunDescription& run,
                     const std::vector<std::vector<StepRecord>>& records,
                     const std::vector<RankCounters>& counters,
                     const std::vector<std::vector<uint8_t>>& microbatch_decisions) {
  RunSummary s;
  s.run = run;
  const int tp = std::max(run.tp, 1);
  const int pp = std::max(run.pp, 1);
  const int groups = static_cast<int>(records.size()) / tp;
  s.stages.resize(pp);
  for (int st = 0; st < pp; ++st) s.stages[st].stage = st;
  s.steps = records.empty() ? 0 : static_cast<int64_t>(records[0].size());

  StepSeries acc;
  std::map<std::string, double> rate;  // summed over groups
  for (int g = 0; g < groups; ++g) {
    acc.group_tokens.clear();
    acc.group_time.clear();
    RunSummary::Stage& stage = s.stages[g % pp];
    const std::vector<StepRecord>& leader = records[g * tp];
    for (int64_t i = 0; i < s.steps; ++i) {
      const std::string mode = ModeName(leader[i].mode);
      const GroupStep step = FoldRanks(records, g * tp, tp, i, mode, stage, s);
      if (!step.consistent) ++s.consistency_violations;
      if (microbatch_decisions.empty() || microbatch_decisions[g * tp].empty()) {
        stage.decisions[mode][std::string(ReasonLabel(static_cast<Reason>(leader[i].reason)))] +=
            1;
      }
      // A replica's tokens and time are counted once, at its first stage.
      if (g % pp == 0) AddReplicaStep(leader, i, step, mode, acc, s);
    }
    for (const auto& [key, tokens] : acc.group_tokens) {
      if (acc.group_time[key] > 0) rate[key] += tokens / acc.group_time[key];
    }
  }
  s.effective_tokens_per_s = rate;
  CountDecisions(microbatch_decisions, groups, tp, pp, s);
  SummarizeSeries(acc, s);
  for (const RankCounters& c : counters) {
    s.telemetry_sent += c.telemetry_sent;
    s.telemetry_acked += c.telemetry_acked;
    s.memory_overrides += c.memory_overrides;
    s.p2p_size_mismatches += c.p2p_size_mismatches;
    s.p2p_bytes_sent += c.p2p_bytes_sent;
  }
  s.lost_telemetry = std::max<int64_t>(0, s.telemetry_sent - s.telemetry_acked);
  return s;
}

std::string SummaryJson(const RunSummary& s) {
  auto i64 = [](int64_t v) { return absl::StrCat(v); };
  auto u64 = [](uint64_t v) { return absl::StrCat(v); };
  auto dbl = [](double v) { return Num(v); };
  const RunDescription& r = s.run;
  std::string out = "{\n";
  auto field = [&](const std::string& key, const std::string& value) {
    absl::StrAppend(&out, "  ", Quote(key), ": ", value, ",\n");
  };
  field("steps", i64(s.steps));
  field("decisions", Object(s.decisions, [&](const auto& reasons) { return Object(reasons, i64); }));
  field("decision_sources", Object(s.decision_sources, i64));
  field("local_decisions", i64(s.local_decisions));
  field("memory_overrides", i64(s.memory_overrides));
  field("consistency_violations", i64(s.consistency_violations));
  field("lost_telemetry", i64(s.lost_telemetry));
  field("telemetry_sent", i64(s.telemetry_sent));
  field("telemetry_acked", i64(s.telemetry_acked));
  // The job's tokens/s (summed over the groups), under its labelled name too.
  field("effective_tokens_per_s", Object(s.effective_tokens_per_s, dbl));
  field("job_effective_tokens_per_s", Object(s.effective_tokens_per_s, dbl));
  field("decision_unit", Quote(s.microbatch_decisions ? "microbatches" : "group_steps"));
  field("step_time_p95_s", Object(s.step_time_p95_s, dbl));
  field("step_time_mean_s", Object(s.step_time_mean_s, dbl));
  field("switch_cost_ratio", Object(s.switch_cost_ratio, dbl));
  field("switch_steps", Object(s.switch_steps, i64));
  field("switch_device_alloc_bytes", Object(s.switch_device_alloc_bytes, dbl));
  field("steady_device_alloc_bytes", Object(s.steady_device_alloc_bytes, dbl));
  field("peak_memory_bytes", Object(s.peak_memory_bytes, u64));
  field("predicted_peak_memory_bytes", Object(s.predicted_peak_memory_bytes, u64));
  field("memory_prediction_max_rel_error", dbl(s.memory_prediction_max_rel_error));
  // Group-steps, under their labelled name too.
  field("steps_by_mode", Object(s.steps_by_mode, i64));
  field("group_steps_by_mode", Object(s.steps_by_mode, i64));
  field("effective_tokens", Object(s.effective_tokens, i64));
  field("padding_tokens", Object(s.padding_tokens, i64));
  field("mean_length_cv", Object(s.mean_length_cv, dbl));
  field("rs_wait_share_mean", dbl(s.rs_wait_share_mean));
  field("all_gather_tail_p95_s", dbl(s.all_gather_tail_p95_s));
  field("norm_stall_ratio_mean", dbl(s.norm_stall_ratio_mean));
  field("decision_wait_p95_s", dbl(s.decision_wait_p95_s));
  field("leader_decision_wait_max_s", dbl(s.leader_decision_wait_max_s));
  if (s.verify_max_abs_diff) field("verify_max_abs_diff", dbl(*s.verify_max_abs_diff));
  field("layout", absl::StrCat("{\"tp\": ", r.tp, ", \"pp\": ", r.pp, ", \"dp\": ", r.dp,
                               ", \"microbatches\": ", r.microbatches,
                               ", \"schedule\": \"1f1b\", \"stage_boundary\": ",
                               Quote(r.stage_boundary),
                               ", \"recompute\": ", r.recompute ? "true" : "false", "}"));
  std::string stages = "[";
  for (const RunSummary::Stage& st : s.stages) {
    absl::StrAppend(&stages, stages.size() > 1 ? ", " : "", "{\"stage\": ", st.stage,
                    ", \"decisions\": ",
                    Object(st.decisions, [&](const auto& reasons) { return Object(reasons, i64); }),
                    ", \"peak_memory_bytes\": ", st.peak_memory_bytes,
                    ", \"predicted_peak_memory_bytes\": ", st.predicted_peak_memory_bytes,
                    st.verify_max_abs_diff
                        ? absl::StrCat(", \"verify_max_abs_diff\": ", dbl(*st.verify_max_abs_diff))
                        : "",
                    "}");
  }
  field("stages", stages + "]");
  field("p2p_size_mismatches", i64(s.p2p_size_mismatches));
  field("p2p_bytes_sent", i64(s.p2p_bytes_sent));
  absl::StrAppend(
      &out, "  \"run\": {\"world_size\": ", r.world_size, ", \"tp\": ", r.tp, ", \"dp\": ", r.dp,
      ", \"backend\": ", Quote(r.backend), ", \"job_id\": ", Quote(r.job_id),
      ", \"controller\": ", Quote(r.controller), ", \"layers\": ", r.layers,
      ", \"hidden\": ", r.hidden, ", \"heads\": ", r.heads, ", \"ffn_hidden\": ", r.ffn_hidden,
      ", \"lengths\": ", Quote(r.lengths), ", \"tokens_per_batch\": ", r.tokens_per_batch,
      ", \"bucketing\": ", r.bucketing ? "true" : "false", ", \"mode\": ", Quote(r.mode),
      ", \"norm_boundary\": ", Quote(r.norm_boundary),
      ", \"verify\": ", r.verify ? "true" : "false", "}\n}\n");
  return out;
}

std::string SummaryTable(const RunSummary& s) {
  const RunDescription& r = s.run;
  std::string out = absl::StrFormat(
      "spgate-worker: %d ranks (tp=%d, dp=%d), %s backend, %d layers, hidden %d, heads %d, "
      "ffn %d\n  lengths %s, %d tokens/batch, bucketing %s, mode %s, norm boundary %s\n",
      r.world_size, r.tp, r.dp, r.backend, r.layers, r.hidden, r.heads, r.ffn_hidden, r.lengths,
      r.tokens_per_batch, r.bucketing ? "on" : "off", r.mode, r.norm_boundary);
  // Group-steps (a pipeline's: each replica's first stage's, by its step's mode: SP when
  // any micro-batch ran SP) and the job's tokens/s, summed over the groups.
  absl::StrAppend(
      &out, s.run.pp > 1 ? "\n  per mode: group-steps of each replica's first stage; tokens/s "
                           "of the job (summed over the replicas)\n"
                         : "\n  per mode: group-steps; tokens/s of the job (summed over the "
                           "TP groups)\n");
  absl::StrAppend(&out, absl::StrFormat("  %-8s %11s %14s %12s %12s %14s %10s\n", "mode",
                                        "group-steps", "job tokens/s", "step p95 ms",
                                        "step mean ms", "peak memory", "mean CV"));
  for (const std::string mode : {"sp", "tp_only", "all"}) {
    auto it = s.steps_by_mode.find(mode);
    if (it == s.steps_by_mode.end()) continue;
    absl::StrAppend(
        &out, absl::StrFormat("  %-8s %11d %14.0f %12.2f %12.2f %11.2f MiB %10.3f\n", mode,
                              it->second, s.effective_tokens_per_s.at(mode),
                              1e3 * s.step_time_p95_s.at(mode), 1e3 * s.step_time_mean_s.at(mode),
                              s.peak_memory_bytes.at(mode) / 1048576.0,
                              s.mean_length_cv.at(mode)));
  }
  absl::StrAppend(&out, "\n  decisions (mode / reason: ",
                  s.microbatch_decisions ? "micro-batches" : "group-steps", "):\n");
  for (const auto& [mode, reasons] : s.decisions) {
    for (const auto& [reason, n] : reasons) {
      absl::StrAppend(&out, absl::StrFormat("    %-8s %-24s %d\n", mode, reason, n));
    }
  }
  std::string sources;
  for (const auto& [src, n] : s.decision_sources) {
    absl::StrAppend(&sources, sources.empty() ? "" : ", ", src, " ", n);
  }
  absl::StrAppend(
      &out, absl::StrFormat("  group-steps by source: %s; local decisions %d; memory "
                            "overrides %d; consistency violations %d; lost telemetry %d "
                            "records\n",
                            sources, s.local_decisions, s.memory_overrides,
                            s.consistency_violations, s.lost_telemetry));
  absl::StrAppend(
      &out, absl::StrFormat("  SP group-steps: rs_wait_share mean %.3f, all-gather tail p95 %.2f ms, "
                            "norm_stall_ratio mean %.3f; memory prediction max error %.2f%%\n",
                            s.rs_wait_share_mean, 1e3 * s.all_gather_tail_p95_s,
                            s.norm_stall_ratio_mean, 100 * s.memory_prediction_max_rel_error));
  if (s.verify_max_abs_diff) {
    absl::StrAppend(&out, absl::StrFormat("  verify: max |SP - TP-only| over outputs and "
                                          "gradients = %.3g\n",
                                          *s.verify_max_abs_diff));
  }
  return out;
}

}  // namespace spgate::runtime
