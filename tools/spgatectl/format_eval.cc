// `spgatectl eval`'s table (EvaluateGates): the decision, the reason chain and the same
// batch under each policy; see format.h.
#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/spgatectl/flag_values.h"
#include "tools/spgatectl/format.h"

namespace spgate::ctl {
namespace {

using Align = Table::Align;

// The threshold the head compares `gate`'s value with: the one its row of the chain
// shows, else (a gate the chain did not reach) the config's; else the value itself, which
// leaves four digits.
double HeadThreshold(const v1::EvaluateGatesResponse& r, absl::string_view gate,
                     bool has_config, double config, double value) {
  for (const v1::GateCheck& c : r.checks()) {
    if (c.gate() == gate && c.has_threshold()) return c.threshold();
  }
  return has_config ? config : value;
}

// "off: no --budget, ...": the memory gate as the head reports it. Without a budget it
// cannot run: say so where the decision is read, not only in its row of the table below;
// a pin that decides first leaves it unconsulted.
std::string MemoryGateText(const v1::EvaluateGatesResponse& r) {
  const auto memory = std::find_if(r.checks().begin(), r.checks().end(),
                                   [](const v1::GateCheck& c) { return c.gate() == "memory"; });
  if (memory == r.checks().end()) return "not consulted: the pin decided first";
  if (memory->outcome() == "skip") {
    return "off: no --budget, so TP-only was not checked against device memory";
  }
  return "on";
}

// One row of the chain. Bytes: the memory gate's and a yielding TP-only pin's (a pin
// compares nothing else), exact when their rounding ties; other values ComparedText.
void AddCheckRow(const v1::GateCheck& c, Table* t) {
  const bool memory = c.gate() == "memory" || c.gate() == "pin";
  auto bytes = [](double v) { return FormatBytes(static_cast<uint64_t>(std::max(v, 0.0))); };
  const bool exact_bytes = memory && c.observed() != c.threshold() &&
                           bytes(c.observed()) == bytes(c.threshold());
  // A value the gate did not compare (a pin, a gate without its input) is absent.
  auto value = [&](bool has, double v, bool other_has, double other) -> std::string {
    if (!has) return "-";
    if (exact_bytes) return absl::StrCat(static_cast<uint64_t>(std::max(v, 0.0)), " B");
    if (memory) return bytes(v);
    return ComparedText(v, other_has ? other : v);
  };
  t->AddRow({c.gate(), c.outcome(),
             value(c.has_observed(), c.observed(), c.has_threshold(), c.threshold()),
             value(c.has_threshold(), c.threshold(), c.has_observed(), c.observed()),
             c.detail()});
}

}  // namespace

std::string ComparedText(double value, double other) {
  int digits = 4;
  auto text = [&digits](double v) { return absl::StrFormat("%.*g", digits, v); };
  while (value != other && digits < 17 && text(value) == text(other)) ++digits;
  return text(value);
}

std::string FormatEvaluation(const v1::EvaluateGatesResponse& r, OutputFormat format) {
  if (format != OutputFormat::kTable) return ToStructured(r, format);
  const v1::Decision& d = r.decision();
  const v1::GateConfig& used = r.config_used();
  // The head's values read as the chain's rows do (ComparedText against the same
  // threshold), so "0.2200001" is not "0.2200" above a row that says 0.2200001.
  const double cv_threshold = HeadThreshold(r, "length_cv", used.has_max_length_cv(),
                                            used.max_length_cv(), d.length_cv());
  std::string share = "- (no SP step in the window)";
  if (d.has_rolling_rs_wait_share()) {
    const double v = d.rolling_rs_wait_share();
    const double threshold =
        HeadThreshold(r, "rs_wait", used.has_max_rs_wait_share(), used.max_rs_wait_share(), v);
    share = absl::StrCat(ComparedText(v, threshold), " (rolling)");
  }
  std::string out = KeyValues({
      {"decision", absl::StrCat(ModeName(d.mode()), " (", ReasonName(d.reason()), ")")},
      {"memory gate", MemoryGateText(r)},
      {"length_cv", ComparedText(d.length_cv(), cv_threshold)},
      {"rs_wait_share", share},
      {"config", absl::StrCat("version ", d.config_version(), "\n",
                              SetFieldsText(used, /*per_line=*/4))},
  });
  Table t({{"GATE"}, {"OUTCOME"}, {"OBSERVED", Align::kRight}, {"THRESHOLD", Align::kRight},
           {"DETAIL"}});
  for (const v1::GateCheck& c : r.checks()) AddCheckRow(c, &t);
  absl::StrAppend(&out, "\n", t.Render());
  if (r.by_policy_size() > 0) {
    absl::StrAppend(&out, "\nPOLICIES (the same batch under each)\n");
    Table p({{"POLICY"}, {"MODE"}, {"REASON"}});
    for (const v1::PolicyDecision& pd : r.by_policy()) {
      p.AddRow({v1::GateConfig::Policy_Name(pd.policy()), ModeName(pd.mode()),
                ReasonName(pd.reason())});
    }
    absl::StrAppend(&out, p.Render());
  }
  return out;
}

}  // namespace spgate::ctl
