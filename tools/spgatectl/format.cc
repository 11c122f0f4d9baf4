// Tables and JSON for spgatectl; see format.h.
#include "tools/spgatectl/format.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/handshake_hint.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "policy/adaptive_policy.h"
#include "proto/convert.h"
#include "tools/spgatectl/command_table.h"
#include "tools/spgatectl/flag_values.h"
#include "tools/spgatectl/yaml.h"

namespace spgate::ctl {
namespace {

using google::protobuf::FieldDescriptor;
using Align = Table::Align;

std::string TimeText(const google::protobuf::Timestamp& ts, bool millis) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "-";
  return absl::FormatTime(millis ? "%Y-%m-%dT%H:%M:%E3SZ" : "%Y-%m-%dT%H:%M:%SZ",
                          FromTimestamp(ts), absl::UTCTimeZone());
}

// "in 9m58s" / "expired": what is left until `ts`, to the second.
std::string RemainingText(const google::protobuf::Timestamp& ts, absl::Time now) {
  const absl::Duration left = absl::Trunc(FromTimestamp(ts) - now, absl::Seconds(1));
  if (left <= absl::ZeroDuration()) return "expired";
  return absl::StrCat("in ", absl::FormatDuration(left));
}

std::string Fixed(double v, int decimals) { return absl::StrFormat("%.*f", decimals, v); }

// Ratio against TP-only; the server sends 0 when TP-only has no steps to compare with.
std::string Ratio(double v) { return v == 0 ? "-" : absl::StrFormat("%.2fx", v); }

std::string GateFieldText(const v1::GateConfig& config, const FieldDescriptor* field) {
  const auto* refl = v1::GateConfig::GetReflection();
  if (!refl->HasField(config, field)) return "-";
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    return refl->GetEnum(config, field)->name();
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
    return ShortestText(refl->GetDouble(config, field));  // as the daemon's messages
  }
  return absl::StrCat(refl->GetInt64(config, field));
}

}  // namespace

std::string SetFieldsText(const v1::GateConfig& config, int per_line) {
  std::vector<std::string> parts;
  const auto* refl = v1::GateConfig::GetReflection();
  for (const FieldDescriptor* f : GateFields()) {
    if (refl->HasField(config, f)) parts.push_back(absl::StrCat(f->name(), "=", GateFieldText(config, f)));
  }
  if (parts.empty()) return "none";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::StrAppend(&out, (per_line > 0 && i % per_line == 0) ? "\n" : " ", parts[i]);
  }
  return out;
}

std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : rows) {
    absl::StrAppend(&out, k, std::string(width - k.size() + 2, ' '),
                    absl::StrJoin(absl::StrSplit(v, '\n'), absl::StrCat("\n", std::string(width + 2, ' '))),
                    "\n");
  }
  return out;
}

namespace {

std::string PinTarget(const v1::Pin& pin) {
  return pin.has_group() ? absl::StrCat("group ", pin.group()) : "all groups";
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].name.size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) out += "  ";
      const bool right = columns_[c].align == Align::kRight;
      absl::StrAppend(&out, right ? pad : "", cells[c], right ? "" : pad);
    }
    // Trailing blanks of a left-aligned last column are noise in a terminal and a diff.
    out.erase(out.find_last_not_of(' ') + 1);
    return out + "\n";
  };
  std::vector<std::string> header;
  for (const Column& c : columns_) header.push_back(c.name);
  std::string out = line(header);
  for (const auto& row : rows_) out += line(row);
  return out;
}

std::string ToJson(const google::protobuf::Message& message, bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    // Only invalid UTF-8 or out-of-range well-known types get here; say so as JSON.
    return absl::StrCat("{\"error\": \"cannot print ", message.GetTypeName(), " as JSON\"}\n");
  }
  if (out.empty() || out.back() != '\n') out += '\n';
  return out;
}

namespace {

// `json` as `format` asks: itself, or the same document as YAML.
std::string JsonAs(std::string json, OutputFormat format) {
  if (format != OutputFormat::kYaml) return json;
  absl::StatusOr<std::string> yaml = JsonToYaml(json);
  // ToJson's output is always well-formed; keep its fallback's shape if it were not.
  return yaml.ok() ? *yaml : json;
}

// A count an older daemon does not send (a field newer than it: proto3 has no presence, so
// it reads 0) is printed as null, not as a 0 that is not true. `mark` sets each such count
// of its copy to kUnreported, which no daemon sends (counts are not negative) and which
// protobuf's JSON writes as kUnreportedJson (a 64-bit integer is a quoted string); a
// response that holds that value anywhere already is printed as it is.
constexpr int64_t kUnreported = std::numeric_limits<int64_t>::min();
constexpr absl::string_view kUnreportedJson = "\"-9223372036854775808\"";

template <typename M, typename Mark>
std::string ToStructuredMarked(const M& message, OutputFormat format, Mark mark) {
  M marked = message;
  const bool multiline = format == OutputFormat::kJson;
  if (!mark(marked) || absl::StrContains(ToJson(message, multiline), kUnreportedJson)) {
    return ToStructured(message, format);
  }
  return JsonAs(absl::StrReplaceAll(ToJson(marked, multiline), {{kUnreportedJson, "null"}}),
                format);
}

}  // namespace

std::string ToStructured(const google::protobuf::Message& message, OutputFormat format) {
  return JsonAs(ToJson(message, format == OutputFormat::kJson), format);
}

bool GroupStepsUnreported(const v1::JobSummary& s) {
  return s.group_steps_decided() == 0 && s.steps_decided() > 0;
}

bool MicrobatchesUnreported(const v1::ModeStats& m) {
  return m.microbatches() == 0 && m.steps() > 0;
}

std::string UnreportedNote(const v1::ListJobsResponse& jobs) {
  const bool any = std::any_of(jobs.jobs().begin(), jobs.jobs().end(),
                               [](const v1::JobSummary& j) { return GroupStepsUnreported(j); });
  return any ? absl::StrCat(kGroupStepsUnreportedNote, "\n") : "";
}

std::string UnreportedNote(const v1::Job& job) {
  std::string out;
  if (GroupStepsUnreported(job.summary())) absl::StrAppend(&out, kGroupStepsUnreportedNote, "\n");
  if (std::any_of(job.mode_stats().begin(), job.mode_stats().end(),
                  [](const v1::ModeStats& m) { return MicrobatchesUnreported(m); })) {
    absl::StrAppend(&out, kMicrobatchesUnreportedNote, "\n");
  }
  return out;
}

std::string ModeName(v1::Mode mode) {
  return IsValidMode(mode) ? std::string(ModeLabel(FromProto(mode))) : "-";
}

std::string ReasonName(v1::Reason reason) {
  if (reason == v1::REASON_UNSPECIFIED) return "-";
  const std::string& name = v1::Reason_Name(reason);
  return name.empty() ? absl::StrCat("reason_", static_cast<int>(reason))
                      : absl::AsciiStrToLower(name);
}

std::string StatusCodeName(int code) {
  static constexpr absl::string_view kNames[] = {
      "OK",        "CANCELLED",         "UNKNOWN",          "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",      "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return std::string(kNames[code]);
  return absl::StrCat("CODE_", code);
}

std::string FormatRpcError(absl::string_view command, int code, absl::string_view message) {
  // UNIMPLEMENTED with no message is gRPC's answer for a service the server lacks: the
  // address is not spgated's admin API (its worker port, say).
  const absl::string_view said =
      !message.empty() ? message
      : code == static_cast<int>(absl::StatusCode::kUnimplemented)
          ? "the server has no spgated admin API (spgate.v1.AdminService): is --admin (or "
            "SPGATE_ADMIN) the daemon's worker or health port (--listen, --health_listen)?"
          : "(no message)";
  return absl::StrCat("spgatectl: ", command, ": ", StatusCodeName(code), ": ", said, "\n");
}

std::string HandshakeHint(int code, absl::string_view message, bool tls) {
  // Not a stream the daemon ended later (a watch when it restarts): a connection it
  // never answered on.
  if (code != static_cast<int>(absl::StatusCode::kUnavailable)) return "";
  const std::string hint =
      TlsRefusalHint(std::string_view(message.data(), message.size()), tls, "--");
  return hint.empty() ? "" : absl::StrCat("spgatectl: ", hint, "\n");
}

std::string FormatGateConfig(const v1::VersionedGateConfig& c, OutputFormat format) {
  if (format != OutputFormat::kTable) return ToStructured(c, format);
  std::string out = KeyValues({
      {"scope", c.job_id().empty() ? "global" : absl::StrCat("job ", c.job_id())},
      {"version", absl::StrCat(c.version(), " (effective ", c.effective_version(), ")")},
      {"updated", c.has_update_time() ? TimeText(c.update_time(), false) : "never"},
  });
  Table t({{"FIELD"}, {"VALUE", Align::kRight}, {"SOURCE"}});
  const auto* refl = v1::GateConfig::GetReflection();
  // The global scope's other values are the --config file's or the built-in defaults, as
  // the daemon says (an older one does not: "inherited").
  auto source = [&](const FieldDescriptor* f) -> const char* {
    if (refl->HasField(c.overrides(), f)) return "override";
    if (!c.job_id().empty() || !c.has_file_config()) return "inherited";
    return refl->HasField(c.file_config(), f) ? "config file" : "default";
  };
  for (const FieldDescriptor* f : GateFields()) {
    t.AddRow({f->name(), GateFieldText(c.config(), f), source(f)});
  }
  return absl::StrCat(out, "\n", t.Render());
}

std::string FormatJobList(const v1::ListJobsResponse& jobs, OutputFormat format) {
  if (format != OutputFormat::kTable) {
    return ToStructuredMarked(jobs, format, [](v1::ListJobsResponse& m) {
      bool any = false;
      for (v1::JobSummary& j : *m.mutable_jobs()) {
        if (!GroupStepsUnreported(j)) continue;
        j.set_group_steps_decided(kUnreported);
        any = true;
      }
      return any;
    });
  }
  if (jobs.jobs_size() == 0) return "no jobs\n";
  // Decided, summed over the groups: (group, step) pairs and micro-batches (a plain plan's
  // step is its one); SP_GROUPS / TP_GROUPS: the groups by their last decision's mode.
  Table t({{"JOB"},
           {"GROUPS", Align::kRight},
           {"RANKS", Align::kRight},
           {"STALE", Align::kRight},
           {"GROUP_STEPS", Align::kRight},
           {"MICROBATCHES", Align::kRight},
           {"SP_GROUPS", Align::kRight},
           {"TP_GROUPS", Align::kRight},
           {"VERSION", Align::kRight}});
  for (const v1::JobSummary& j : jobs.jobs()) {
    t.AddRow({j.job_id(), absl::StrCat(j.groups()), absl::StrCat(j.ranks_active()),
              absl::StrCat(j.ranks_stale()),
              GroupStepsUnreported(j) ? "-" : absl::StrCat(j.group_steps_decided()),
              absl::StrCat(j.steps_decided()), absl::StrCat(j.sp_groups()),
              absl::StrCat(j.tp_groups()), absl::StrCat(j.config_version())});
  }
  return absl::StrCat(t.Render(), UnreportedNote(jobs));
}

namespace {

// The ADAPTIVE policy's learned table (docs/design.md §11): one row per band with data,
// each mode's estimate and weighted samples at the table's newest step, and what the band
// prefers under the job's margin and min_samples.
// A pipelined job's tables are per stage (docs/design.md §12): a section per stage.
std::string LearnedTableText(const v1::Job& job, const GateConfig& config,
                             const ThroughputTable& table, int64_t at, const std::string& title);

std::string LearnedText(const v1::Job& job) {
  const GateConfig config = LayerGateConfig(GateConfig{}, job.config().config());
  if (job.stage_learned_size() == 0) {
    const ThroughputTable table = FromProto(job.learned());
    return LearnedTableText(job, config, table, job.learned_at_step(), "LEARNED");
  }
  std::string out;
  for (int stage = 0; stage < job.stage_learned_size(); ++stage) {
    const ThroughputTable table = FromProto(job.stage_learned(stage));
    absl::StrAppend(&out, LearnedTableText(job, config, table, table.newest_step(),
                                           absl::StrCat("LEARNED stage ", stage)));
  }
  return out;
}

// The prior's calibration (docs/design.md §11, "The prior"), or why it does not answer yet.
std::string PriorText(const GateConfig& config, const ThroughputTable& table) {
  const PriorFit p = FitPriorOf(config, &table);
  if (!p.has) return absl::StrCat("prior: not yet (", p.missing, ")");
  return absl::StrFormat(
      "prior: %.3g us/token SP over %.1f SP steps; SP's extra latency %.3g ms [%s]; wait "
      "%.3g of a step per unit CV x %.2f; element-wise saving %.3g us/token [%s]; error "
      "%.2f %%",
      1e6 * p.base_s_per_token, p.sp_steps, 1e3 * p.latency_s,
      PriorSourceLabel(p.latency_source), p.wait_per_cv, p.imbalance_share,
      1e6 * p.elementwise_s_per_token, PriorSourceLabel(p.elementwise_source), 100 * p.error);
}

std::string LearnedTableText(const v1::Job& job, const GateConfig& config,
                             const ThroughputTable& table, int64_t at, const std::string& title) {
  if (table.empty()) {
    return absl::StrFormat("\n%s (policy %s)\n(nothing learned yet)\n", title,
                           GatePolicyName(config.policy));
  }
  const std::string switch_cost =
      table.switch_cost().last_step < 0
          ? "not measured"
          : absl::StrFormat("%.3g s", table.SwitchCostSeconds());
  std::string out = absl::StrFormat(
      "\n%s (policy %s; tokens/s and weighted samples at step %d; gain vs static %s; "
      "%d exploration steps; switch cost %s)\n%s\n",
      title, GatePolicyName(config.policy), at, Ratio(job.adaptive_gain_ratio()),
      job.exploration_steps(), switch_cost, PriorText(config, table));
  Table t({{"BAND"},
           {"RANGE"},
           {"SP_TOK/S", Align::kRight},
           {"SP_N", Align::kRight},
           {"TP_TOK/S", Align::kRight},
           {"TP_N", Align::kRight},
           {"TP/SP", Align::kRight},
           {"PAIRS", Align::kRight},
           {"CHANGED", Align::kRight},
           {"PREFERRED"}});
  const PriorFit fit = FitPriorOf(config, &table);
  const TableFacts facts = TableFactsOf(config, table, at);
  for (int band = 0; band < kBands; ++band) {
    const BandEstimate e = EstimateBand(config, &table, band, at, &facts);
    const CellView& sp = e.sp;
    const CellView& tp = e.tp;
    if (sp.samples == 0 && tp.samples == 0) continue;
    std::string preferred = "static gates (too few samples)";
    if (e.known) {
      preferred = ModeLabel(e.preferred);
    } else {
      // What the prior says for the band's batches: its cells' mean tokens, its CV's
      // mid-point (the top band's lower edge).
      const ThroughputCell& c = table.cell(band, sp.samples >= tp.samples
                                                     ? Mode::kSequenceParallel
                                                     : Mode::kTensorParallelOnly);
      const double mid = BandCvMidpoint(config, band);
      const double cv = mid >= 0 ? mid : (kCvBands - 1) * config.adaptive_cv_band_width;
      const PriorChoice pc = ChoosePrior(
          config, fit,
          BatchFacts{.step = at,
                     .length_cv = cv,
                     .tokens = static_cast<int64_t>(c.weight > 0 ? c.tokens / c.weight : 0)});
      if (pc.decides) preferred = absl::StrCat("prior: ", std::string(ModeLabel(pc.mode)), " (too few samples)");
    }
    t.AddRow({BandLabel(band), BandRangeText(config, band),
              sp.samples > 0 ? Fixed(sp.tokens_per_s, 0) : "-", Fixed(sp.samples, 1),
              tp.samples > 0 ? Fixed(tp.tokens_per_s, 0) : "-", Fixed(tp.samples, 1),
              e.ratio > 0 ? absl::StrFormat("%.3f", e.ratio) : "-",
              e.pair.samples > 0 ? Fixed(e.pair.samples, 1) : "-",
              table.BandChangedStep(band) >= 0 ? absl::StrCat(table.BandChangedStep(band)) : "-",
              preferred});
  }
  return absl::StrCat(out, t.Render());
}

// The job's key/value head: its id, group and rank counts, config, layout.
std::string JobSummaryText(const v1::Job& job) {
  const v1::JobSummary& s = job.summary();
  std::vector<std::pair<std::string, std::string>> rows = {
      {"job", s.job_id()},
      // What the launch runs on, as its first rank declared it: with the layout and model
      // shape, the key its learned tables are kept under for a later launch.
      {"hardware", !s.hardware_id().empty() ? s.hardware_id()
                   : s.incarnation().empty() ? "(no live launch)"
                                             : "(not declared, or the daemon predates it)"},
      {"groups", absl::StrCat(s.groups(), " (", s.sp_groups(), " sp, ", s.tp_groups(), " tp_only)")},
      {"ranks", absl::StrCat(s.ranks_active(), " active, ", s.ranks_stale(), " stale")},
      // One per group and step: a job of 4 groups that ran 100 steps decided 400.
      {"group-steps", GroupStepsUnreported(s)
                          ? absl::StrCat("- ", kGroupStepsUnreportedNote)
                          : absl::StrCat(s.group_steps_decided(), " decided")},
      {"local decisions", absl::StrCat(job.local_decisions())},
      // Daemon answers the workers refused on memory (docs/security.md): should be 0.
      {"memory overrides", absl::StrCat(job.memory_overrides())},
      {"config", absl::StrCat("version ", job.config().effective_version(), ", overrides: ",
                              SetFieldsText(job.config().overrides()))},
  };
  if (job.has_layout()) {
    // A step plan decides each micro-batch: 4 groups, 100 steps, 8 micro-batches: 3,200.
    rows.insert(rows.begin() + 5,
                {"micro-batches", absl::StrCat(s.steps_decided(), " decided")});
    const v1::JobLayout& l = job.layout();
    rows.emplace_back(
        "layout", absl::StrFormat("tp=%d pp=%d vp=%d cp=%d dp=%d microbatches=%d %s", l.tp(),
                                  l.pp(), l.vp(), l.cp(), l.dp(), l.microbatches(),
                                  l.schedule() == v1::JobLayout::SCHEDULE_INTERLEAVED_1F1B
                                      ? "interleaved_1f1b"
                                      : "1f1b"));
  }
  if (job.sp_required_size() > 0) {
    // Why every decision of the job is SP (docs/design.md §12).
    rows.emplace_back("sp required",
                      absl::StrCat(absl::StrJoin(job.sp_required(), ","),
                                   " (needs SP throughout: every decision is SP)"));
  }
  return KeyValues(rows);
}

// GROUPS: one row per TP group, its mode, signals and pin.
std::string JobGroupsText(const v1::Job& job, absl::Time now) {
  std::string out = "\nGROUPS\n";
  if (job.groups_size() == 0) {
    absl::StrAppend(&out, "(none)\n");
  } else {
    Table t({{"GROUP", Align::kRight},
             {"SIZE", Align::kRight},
             {"ACTIVE", Align::kRight},
             {"STALE", Align::kRight},
             {"MODE"},
             {"REASON"},
             {"LAST_STEP", Align::kRight},
             {"RS_WAIT", Align::kRight},
             {"AG_TAIL_MS", Align::kRight},
             {"NORM_STALL", Align::kRight},
             {"SLOWEST"},
             {"FALLBACK"},
             {"SWITCHES", Align::kRight},
             {"PIN"}});
    for (const v1::GroupStatus& g : job.groups()) {
      t.AddRow({absl::StrCat(g.group()), absl::StrCat(g.group_size()),
                absl::StrCat(g.ranks_active()), absl::StrCat(g.ranks_stale()), ModeName(g.mode()),
                ReasonName(g.reason()), absl::StrCat(g.last_step()),
                // "-": no SP step in the window (the job's start, after a trip).
                g.has_rolling_rs_wait_share() ? Fixed(g.rolling_rs_wait_share(), 3) : "-",
                Fixed(g.all_gather_tail_s() * 1e3, 2),
                Fixed(g.norm_stall_ratio(), 3),
                // The last complete step's slowest rank and its step time (docs/design.md §2).
                // One token (scripts split on whitespace); "-" before a step or from an older
                // daemon.
                g.has_slowest_rank() && g.slowest_rank() >= 0
                    ? absl::StrCat("r", g.slowest_rank(), ":", Fixed(g.slowest_step_time_s(), 3), "s")
                    : "-",
                g.rs_wait_fallback() ? "rs_wait" : "-",
                absl::StrCat(g.mode_switches()),
                g.has_pin() ? absl::StrCat(ModeName(g.pin().mode()), " ",
                                           RemainingText(g.pin().expire_time(), now),
                                           g.pin().has_group() ? "" : " (job)")
                            : "-"});
    }
    absl::StrAppend(&out, t.Render());
  }
  return out;
}

// STAGES: per pipeline stage, its groups' last step plans (docs/design.md §12); empty
// without a layout or groups.
std::string JobStagesText(const v1::Job& job) {
  if (!job.has_layout() || job.groups_size() == 0) return "";
  const int pp = std::max(job.layout().pp(), 1);
  std::vector<int> groups(pp, 0), tp_only(pp, 0);
  std::vector<uint64_t> peak(pp, 0);
  for (const v1::GroupStatus& g : job.groups()) {
    const int st = std::clamp(g.coordinates().stage(), 0, pp - 1);
    ++groups[st];
    tp_only[st] += g.last_step_tp_only_microbatches();
    peak[st] = std::max<uint64_t>(peak[st], g.predicted_stage_peak_bytes());
  }
  Table t({{"STAGE", Align::kRight},
           {"GROUPS", Align::kRight},
           {"TP_ONLY", Align::kRight},
           {"PREDICTED_PEAK", Align::kRight}});
  const int m = std::max(job.layout().microbatches(), 1);
  for (int st = 0; st < pp; ++st) {
    if (groups[st] == 0) continue;
    t.AddRow({absl::StrCat(st), absl::StrCat(groups[st]),
              absl::StrCat(tp_only[st], "/", groups[st] * m), FormatBytes(peak[st])});
  }
  return absl::StrCat(
      "\nSTAGES (last step plan of each group; TP_ONLY: its micro-batches decided TP-only)\n",
      t.Render());
}

// MODES: the rolling window's per-mode throughput, time and memory (docs/design.md §12).
// Each sample is a micro-batch counted by the mode it ran; a plain plan's step is its one
// micro-batch, so a job without a layout counts group-steps. Tokens/s is one group's.
std::string JobModesText(const v1::Job& job) {
  const bool staged = job.has_layout();
  std::string out = absl::StrCat(
      "\nMODES (rolling window of ",
      staged ? "micro-batches, by the mode each ran; tokens/s per group over each "
               "micro-batch's compute on its stage"
             : "group-steps; tokens/s per group",
      "; ratios relative to tp_only)\n");
  if (job.mode_stats_size() == 0) {
    absl::StrAppend(&out, "(no steps observed yet)\n");
    return out;
  }
  constexpr Align kR = Align::kRight;
  std::vector<Table::Column> cols = {{"MODE"},
                                     {"GROUP_STEPS", kR},
                                     {"TOKENS/S/GROUP", kR},
                                     {"vs TP", kR},
                                     {staged ? "MB_COMPUTE_P95_S" : "STEP_P95_S", kR},
                                     {"vs TP", kR},
                                     {"PEAK_MEMORY", kR},
                                     {"vs TP", kR}};
  if (staged) cols.insert(cols.begin() + 1, {"MICROBATCHES", kR});
  Table t(std::move(cols));
  bool unreported = false;  // MICROBATCHES from an older daemon
  for (const v1::ModeStats& m : job.mode_stats()) {
    std::vector<std::string> row = {ModeName(m.mode()),
                                    absl::StrCat(m.steps()),
                                    Fixed(m.effective_tokens_per_s(), 0),
                                    Ratio(m.tokens_per_s_vs_tp()),
                                    Fixed(m.step_time_p95_s(), 4),
                                    Ratio(m.step_time_p95_vs_tp()),
                                    FormatBytes(m.peak_memory_bytes()),
                                    Ratio(m.peak_memory_vs_tp())};
    if (staged) {
      row.insert(row.begin() + 1,
                 MicrobatchesUnreported(m) ? "-" : absl::StrCat(m.microbatches()));
      unreported |= MicrobatchesUnreported(m);
    }
    t.AddRow(std::move(row));
  }
  absl::StrAppend(&out, t.Render(),
                  unreported ? absl::StrCat(kMicrobatchesUnreportedNote, "\n") : "");
  return out;
}

// DECISIONS: the count of each (mode, reason), one per micro-batch (a plain plan's step).
std::string JobDecisionsText(const v1::Job& job) {
  std::string out =
      absl::StrCat("\nDECISIONS (", job.has_layout() ? "micro-batches" : "group-steps", ")\n");
  if (job.decisions_size() == 0) {
    absl::StrAppend(&out, "(none)\n");
  } else {
    Table t({{"MODE"}, {"REASON"}, {"COUNT", Align::kRight}});
    for (const v1::DecisionCount& d : job.decisions()) {
      t.AddRow({ModeName(d.mode()), ReasonName(d.reason()), absl::StrCat(d.count())});
    }
    absl::StrAppend(&out, t.Render());
  }
  return out;
}

// PINS: the job's pins and the time each has left.
std::string JobPinsText(const v1::Job& job, absl::Time now) {
  std::string out = "\nPINS\n";
  if (job.pins_size() == 0) {
    absl::StrAppend(&out, "(none)\n");
  } else {
    Table t({{"TARGET"}, {"MODE"}, {"EXPIRES"}, {"LEFT"}});
    for (const v1::Pin& p : job.pins()) {
      t.AddRow({PinTarget(p), absl::StrCat(ModeName(p.mode()), p.force() ? " (force)" : ""),
                TimeText(p.expire_time(), false),
                RemainingText(p.expire_time(), now)});
    }
    absl::StrAppend(&out, t.Render());
  }
  return out;
}

}  // namespace

std::string FormatJob(const v1::Job& job, OutputFormat format, absl::Time now) {
  if (format != OutputFormat::kTable) {
    return ToStructuredMarked(job, format, [](v1::Job& m) {
      bool any = false;
      if (GroupStepsUnreported(m.summary())) {
        m.mutable_summary()->set_group_steps_decided(kUnreported);
        any = true;
      }
      for (v1::ModeStats& ms : *m.mutable_mode_stats()) {
        if (!MicrobatchesUnreported(ms)) continue;
        ms.set_microbatches(kUnreported);
        any = true;
      }
      return any;
    });
  }
  return absl::StrCat(JobSummaryText(job), JobGroupsText(job, now), JobStagesText(job),
                      JobModesText(job), JobDecisionsText(job), LearnedText(job),
                      JobPinsText(job, now));
}

std::string FormatPin(const v1::Pin& pin, OutputFormat format, absl::Time now) {
  if (format != OutputFormat::kTable) return ToStructured(pin, format);
  return absl::StrCat("pinned job ", pin.job_id(), " ", PinTarget(pin), " to ", ModeName(pin.mode()),
                      " until ", TimeText(pin.expire_time(), false), " (",
                      RemainingText(pin.expire_time(), now), ")",
                      pin.force() ? ", forced past the memory gate" : "", "\n",
                      pin.pending() ? absl::StrCat(pin.has_group() ? "group " : "job ",
                                                   pin.has_group() ? absl::StrCat(pin.group()) : pin.job_id(),
                                                   " is not registered yet: the pin applies from its "
                                                   "first decision\n")
                                    : "");
}

std::string FormatUnpin(const v1::UnpinRequest& request, const v1::UnpinResponse& response,
                        OutputFormat format) {
  if (format != OutputFormat::kTable) return ToStructured(response, format);
  return absl::StrCat("removed ", response.removed(), response.removed() == 1 ? " pin" : " pins",
                      " of job ", request.job_id(),
                      request.has_group() ? absl::StrCat(" group ", request.group()) : "", "\n");
}

std::string FormatForgetJob(const v1::ForgetJobRequest& request,
                            const v1::ForgetJobResponse& response, OutputFormat format) {
  if (format != OutputFormat::kTable) return ToStructured(response, format);
  return absl::StrCat("forgot job ", request.job_id(), ": ",
                      response.had_live_state() ? "live state dropped" : "no live state",
                      ", ", response.sessions_ended(), " worker sessions ended",
                      response.removed_operator_settings() ? ", overrides and pins removed" : "",
                      "\n");
}

std::string FormatDecisionLine(const v1::Decision& d, OutputFormat format) {
  if (format == OutputFormat::kJson) return ToJson(d, /*multiline=*/false);
  // A YAML stream: one document per decision.
  if (format == OutputFormat::kYaml) return absl::StrCat("---\n", ToStructured(d, format));
  return absl::StrCat(TimeText(d.decide_time(), true), "  job=", d.job_id(), " group=", d.group(),
                      " step=", d.step(), " mode=", ModeName(d.mode()),
                      " reason=", ReasonName(d.reason()), " length_cv=", Fixed(d.length_cv(), 3),
                      " rs_wait=",
                      d.has_rolling_rs_wait_share() ? Fixed(d.rolling_rs_wait_share(), 3) : "-",
                      " config_version=", d.config_version(), "\n");
}

namespace {

std::string FieldValueText(const v1::FieldValue& v) {
  if (!v.set()) return "-";
  return v.name().empty() ? ShortestText(v.value()) : v.name();
}

// "max_length_cv 0.18->0.3, window_steps -->10" ('-': no override at this scope).
std::string ChangesText(const v1::AuditEntry& e) {
  std::vector<std::string> parts;
  for (const v1::FieldChange& c : e.changes()) {
    parts.push_back(absl::StrCat(c.field(), " ", FieldValueText(c.old_value()), " -> ",
                                 FieldValueText(c.new_value())));
  }
  return parts.empty() ? "no change" : absl::StrJoin(parts, ", ");
}

// "tp until 2026-01-02 10:00:00 (force)"
std::string PinText(v1::Mode mode, const google::protobuf::Timestamp& expire, bool force) {
  return absl::StrCat(ModeName(mode), " until ", TimeText(expire, false), force ? " (force)" : "");
}

std::string AuditChangeText(const v1::AuditEntry& e) {
  const std::string group = e.has_group() ? absl::StrCat("group ", e.group(), " ") : "";
  if (e.rpc() == "PinMode") {
    const std::string now = PinText(e.mode(), e.expire_time(), e.force());
    if (!e.has_replaced_pin()) return group + now;
    const v1::Pin& old = e.replaced_pin();
    return absl::StrCat(group, PinText(old.mode(), old.expire_time(), old.force()), " -> ", now);
  }
  if (e.rpc() == "Unpin") {
    std::vector<std::string> pins;
    for (const v1::Pin& p : e.removed_pins()) {
      pins.push_back(absl::StrCat(p.has_group() ? absl::StrCat("group ", p.group(), " ") : "",
                                  PinText(p.mode(), p.expire_time(), p.force())));
    }
    return absl::StrCat(group, "removed ", e.removed(),
                        pins.empty() ? "" : absl::StrCat(": ", absl::StrJoin(pins, ", ")));
  }
  if (e.rpc() == "ForgetJob") {
    return e.forgot_operator_settings()
               ? absl::StrCat("live state and settings (", e.removed(), " pins): ", ChangesText(e))
               : "live state";
  }
  if (e.rpc() == "RollbackGateConfig") {
    return absl::StrCat("to version ", e.rolled_back_to(), ": ", ChangesText(e));
  }
  return ChangesText(e);
}

}  // namespace

std::string FormatHistory(const v1::ListConfigHistoryResponse& history, OutputFormat format) {
  if (format != OutputFormat::kTable) return ToStructured(history, format);
  if (history.entries_size() == 0) return "(no audited changes)\n";
  Table t({{"TIME"},
           {"VERSION", Align::kRight},
           {"SCOPE"},
           {"PRINCIPAL"},
           {"CALL"},
           {"CHANGE"}});
  for (const v1::AuditEntry& e : history.entries()) {
    t.AddRow({TimeText(e.time(), false), e.version() > 0 ? absl::StrCat(e.version()) : "-",
              e.job_id().empty() ? "global" : absl::StrCat("job ", e.job_id()), e.principal(),
              e.rpc(), AuditChangeText(e)});
  }
  std::string out = t.Render();
  if (!history.next_page_token().empty()) {
    absl::StrAppend(&out, "older entries: --page_token=", history.next_page_token(), "\n");
  }
  return out;
}

std::string JobPresenceNote(absl::string_view command, absl::string_view job,
                            JobPresence presence, absl::string_view then) {
  switch (presence) {
    case JobPresence::kUnknown:
      return absl::StrCat("spgatectl: ", command, ": job ", job,
                          " is not known to the daemon yet (jobs list shows the ones it knows); ",
                          then, "\n");
    case JobPresence::kNoLaunch:
      return absl::StrCat("spgatectl: ", command, ": no launch of job ", job,
                          " is running (jobs list shows it for its overrides or pins alone); ",
                          then, "\n");
    case JobPresence::kRunning:
    case JobPresence::kUnsure:
      break;
  }
  return "";
}

std::string MemoryGateNote(absl::string_view command, const v1::PinModeRequest& pin,
                           const v1::Job& job) {
  if (pin.mode() != v1::TENSOR_PARALLEL_ONLY || pin.force()) return "";
  int held = 0, pinned = 0;
  v1::Reason reason = v1::REASON_UNSPECIFIED;
  for (const v1::GroupStatus& g : job.groups()) {
    if (pin.has_group() && g.group() != pin.group()) continue;
    ++pinned;
    if (g.reason() == v1::MEMORY_REQUIRES_SP || g.reason() == v1::MEMORY_OVER_BUDGET) {
      ++held;
      reason = g.reason();
    }
  }
  if (held == 0) return "";
  const std::string which = pin.has_group() ? absl::StrCat("group ", pin.group())
                            : pinned == 1     ? std::string("its group")
                            : held == pinned  ? absl::StrCat("all ", pinned, " groups")
                                              : absl::StrCat(held, " of ", pinned, " groups");
  return absl::StrCat("spgatectl: ", command, ": job ", pin.job_id(), ": the memory gate held ",
                      which,
                      " in SP at the last decision (", ReasonName(reason),
                      "): a TP-only pin yields to it while TP-only does not fit; --force "
                      "overrides it (audited)\n");
}

}  // namespace spgate::ctl
