// Summary accumulation and JSON; see summary.h.
#include "tools/sim/summary.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace spgate::sim {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];  // nearest rank, like RollingWindow
}

std::string CountText(int64_t n, const std::string& noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

void ModeTotals::Add(const GroupStep& s) {
  ++steps;
  tokens += static_cast<double>(s.effective_tokens);
  time_s += s.step_time_s;
  step_times.push_back(s.step_time_s);
  peak_memory = std::max(peak_memory, s.peak_memory_bytes);
}

void ModeTotals::Merge(const ModeTotals& o) {
  steps += o.steps;
  tokens += o.tokens;
  time_s += o.time_s;
  step_times.insert(step_times.end(), o.step_times.begin(), o.step_times.end());
  peak_memory = std::max(peak_memory, o.peak_memory);
}

void Summary::AddStep(const GroupStep& step, const client::GateDecision& d) {
  ++decisions[std::string(ModeLabel(d.mode))][std::string(ReasonLabel(d.reason))];
  ++sources[std::string(client::DecisionSourceLabel(d.source))];
  if (d.source == client::DecisionSource::kMemoryOverride) {
    ++memory_overrides;  // the daemon answered; its answer did not fit
  } else if (d.source != client::DecisionSource::kDaemon) {
    ++local_decisions;
    ++local_by_reason[std::string(ReasonLabel(d.policy_reason))];
  }
  (step.mode == Mode::kSequenceParallel ? sp : tp_only).Add(step);
  all.Add(step);
}

void Summary::Merge(const Summary& o) {
  for (const auto& [m, reasons] : o.decisions) {
    for (const auto& [r, n] : reasons) decisions[m][r] += n;
  }
  for (const auto& [s, n] : o.sources) sources[s] += n;
  for (const auto& [r, n] : o.local_by_reason) local_by_reason[r] += n;
  local_decisions += o.local_decisions;
  memory_overrides += o.memory_overrides;
  consistency_violations += o.consistency_violations;
  decide_errors += o.decide_errors;
  telemetry_errors += o.telemetry_errors;
  sessions += o.sessions;
  if (first_error.empty()) first_error = o.first_error;
  telemetry_reported += o.telemetry_reported;
  telemetry_sent += o.telemetry_sent;
  telemetry_acked += o.telemetry_acked;
  telemetry_dropped += o.telemetry_dropped;
  decision_latency_s.insert(decision_latency_s.end(), o.decision_latency_s.begin(),
                            o.decision_latency_s.end());
  plan_queued_s.insert(plan_queued_s.end(), o.plan_queued_s.begin(), o.plan_queued_s.end());
  from_write_s.insert(from_write_s.end(), o.from_write_s.begin(), o.from_write_s.end());
  decide_wait_s.insert(decide_wait_s.end(), o.decide_wait_s.begin(), o.decide_wait_s.end());
  sp.Merge(o.sp);
  tp_only.Merge(o.tp_only);
  all.Merge(o.all);
  late_steps += o.late_steps;
}

std::string GateConfigJson(const GateConfig& c, int64_t version) {
  std::string out = absl::StrFormat("{\"version\": %d", version);
  for (const GateField& f : kGateFields) {
    if (f.is_choice()) {
      absl::StrAppendFormat(&out, ", \"%s\": \"%s\"", f.name, GateFieldText(c, f));
    } else if (f.is_count()) {
      absl::StrAppendFormat(&out, ", \"%s\": %d", f.name, c.*f.count);
    } else {
      absl::StrAppendFormat(&out, ", \"%s\": %g", f.name, c.*f.real);
    }
  }
  out += "}";
  return out;
}

namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += absl::StrFormat("\\u%04x", ch);
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

std::string CountsJson(const std::map<std::string, int64_t>& m) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : m) parts.push_back(absl::StrCat(Quote(k), ": ", v));
  return "{" + absl::StrJoin(parts, ", ") + "}";
}

// Throughput of the whole job: each group's tokens / its simulated time, summed over
// groups (they run concurrently) — i.e. groups × Σ tokens / Σ time.
double TokensPerS(const ModeTotals& m, int groups) {
  return m.time_s > 0 ? groups * m.tokens / m.time_s : 0.0;
}

}  // namespace

std::string Summary::ToJson() const {
  std::vector<std::string> dec;
  for (const auto& [m, reasons] : decisions) dec.push_back(Quote(m) + ": " + CountsJson(reasons));
  std::string j = "{\n";
  auto field = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&j, "  ", Quote(k), ": ", v, ",\n");
  };
  field("command", Quote(command));
  field("steps", absl::StrCat(steps));
  field("groups", absl::StrCat(groups));
  field("tp", absl::StrCat(tp));
  field("ranks", absl::StrCat(groups * tp));
  field("decisions", "{" + absl::StrJoin(dec, ", ") + "}");
  field("decision_sources", CountsJson(sources));
  field("local_decisions", absl::StrCat(local_decisions));
  field("local_decisions_by_reason", CountsJson(local_by_reason));
  field("memory_overrides", absl::StrCat(memory_overrides));
  field("consistency_violations", absl::StrCat(consistency_violations));
  field("lost_telemetry", absl::StrCat(telemetry_reported - telemetry_acked));
  field("telemetry", absl::StrFormat(
                         "{\"reported\": %d, \"sent\": %d, \"acknowledged\": %d, \"dropped\": %d, "
                         "\"unacknowledged\": %d}",
                         telemetry_reported, telemetry_sent, telemetry_acked, telemetry_dropped,
                         telemetry_sent - telemetry_acked));
  // The job's tokens/s (every group's, summed), also under its labelled name.
  const std::string job_rate =
      absl::StrFormat("{\"sp\": %.1f, \"tp_only\": %.1f, \"all\": %.1f}", TokensPerS(sp, groups),
                      TokensPerS(tp_only, groups), TokensPerS(all, groups));
  field("effective_tokens_per_s", job_rate);
  field("job_effective_tokens_per_s", job_rate);
  field("step_time_p95_s",
        absl::StrFormat("{\"sp\": %.6f, \"tp_only\": %.6f, \"all\": %.6f}",
                        Percentile(sp.step_times, 0.95), Percentile(tp_only.step_times, 0.95),
                        Percentile(all.step_times, 0.95)));
  field("peak_memory_bytes", absl::StrFormat("{\"sp\": %d, \"tp_only\": %d}", sp.peak_memory,
                                             tp_only.peak_memory));
  // Group-steps (a group's step, counted per group), also under their labelled name.
  const std::string group_steps =
      absl::StrFormat("{\"sp\": %d, \"tp_only\": %d}", sp.steps, tp_only.steps);
  field("steps_by_mode", group_steps);
  field("group_steps_by_mode", group_steps);
  auto latency = [](const std::vector<double>& v) {
    return absl::StrFormat("{\"samples\": %d, \"p50\": %.6f, \"p99\": %.6f, \"max\": %.6f}",
                           v.size(), Percentile(v, 0.5), Percentile(v, 0.99), Percentile(v, 1.0));
  };
  field("decision_latency_s", latency(decision_latency_s));
  field("plan_queued_s", latency(plan_queued_s));
  field("decision_latency_from_write_s", latency(from_write_s));
  field("decide_wait_s", latency(decide_wait_s));
  field("decide_errors", absl::StrCat(decide_errors));
  field("telemetry_errors", absl::StrCat(telemetry_errors));
  field("sessions", absl::StrCat(sessions));
  if (!first_error.empty()) field("first_error", Quote(first_error));
  field("late_steps", absl::StrCat(late_steps));
  field("threads", absl::StrCat(threads));
  if (!group_phase.empty()) field("group_phase", Quote(group_phase));
  if (!config_json.empty()) field("config", config_json);
  for (const auto& [key, value] : extra_json) field(key.c_str(), value);
  absl::StrAppend(&j, "  \"wall_s\": ", absl::StrFormat("%.3f", wall_s), "\n}\n");
  return j;
}

}  // namespace spgate::sim
