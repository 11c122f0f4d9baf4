// The gate field table's helpers and validation; see gate_config.h.
#include "policy/gate_config.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spgate {

std::string ShortestText(double v) {
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : absl::StrFormat("%.17g", v);
}

const GateField* FindGateField(std::string_view name) {
  for (const GateField& f : kGateFields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string_view GatePolicyName(GatePolicyKind kind) {
  switch (kind) {
    case GatePolicyKind::kStatic: return "STATIC";
    case GatePolicyKind::kAdaptive: return "ADAPTIVE";
  }
  return "POLICY_UNSPECIFIED";
}

absl::StatusOr<GatePolicyKind> ParseGatePolicy(std::string_view field, std::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::string_view(text.data(), text.size()));
  if (lower == "static") return GatePolicyKind::kStatic;
  if (lower == "adaptive") return GatePolicyKind::kAdaptive;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: \"%s\" is not a policy (STATIC or ADAPTIVE)", std::string(field), std::string(text)));
}

double GateFieldValue(const GateConfig& config, const GateField& field) {
  if (field.is_choice()) return static_cast<double>(config.*field.choice);
  return field.is_count() ? static_cast<double>(config.*field.count) : config.*field.real;
}

std::string GateFieldText(const GateConfig& config, const GateField& field) {
  if (field.is_choice()) return std::string(GatePolicyName(config.*field.choice));
  if (field.is_count()) return absl::StrCat(config.*field.count);
  return ShortestText(config.*field.real);  // reads back to the same value
}

absl::Status SetGateFieldFromText(GateConfig& config, const GateField& field,
                                  std::string_view text) {
  const absl::string_view t(text.data(), text.size());
  if (field.is_choice()) {
    absl::StatusOr<GatePolicyKind> kind = ParseGatePolicy(field.name, text);
    if (!kind.ok()) return kind.status();
    config.*field.choice = *kind;
    return absl::OkStatus();
  }
  if (field.is_count()) {
    int64_t v;
    if (!absl::SimpleAtoi(t, &v)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: not an integer: \"%s\"", std::string(field.name), std::string(t)));
    }
    config.*field.count = v;
    return absl::OkStatus();
  }
  double v;
  if (!absl::SimpleAtod(t, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not a finite number: \"%s\"", std::string(field.name), std::string(t)));
  }
  config.*field.real = v;
  return absl::OkStatus();
}

double GateFieldValue(const GateConfig& config, std::string_view name) {
  const GateField* f = FindGateField(name);
  return f == nullptr ? std::numeric_limits<double>::quiet_NaN() : GateFieldValue(config, *f);
}

std::string_view GateFieldRangeText(GateFieldRange range) {
  switch (range) {
    case GateFieldRange::kShare: return "(0, 1]";
    case GateFieldRange::kCv: return "(0, 10]";
    case GateFieldRange::kCount: return "[1, 1000000]";
    case GateFieldRange::kPolicy: return "STATIC|ADAPTIVE";
  }
  return "?";
}

absl::Status CheckGateField(const GateConfig& config, const GateField& field) {
  if (field.is_choice()) {
    const GatePolicyKind v = config.*field.choice;
    if (v != GatePolicyKind::kStatic && v != GatePolicyKind::kAdaptive) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s must be STATIC or ADAPTIVE, got %d", field.name, static_cast<int>(v)));
    }
    return absl::OkStatus();
  }
  if (field.is_count()) {
    const int64_t v = config.*field.count;
    if (v < 1 || v > 1'000'000) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s must be in [1, 1000000], got %d", field.name, v));
    }
    return absl::OkStatus();
  }
  const double v = config.*field.real;
  const double upper = field.range == GateFieldRange::kCv ? 10.0 : 1.0;
  if (!std::isfinite(v) || v <= 0.0 || v > upper) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s must be finite and in (0, %g], got %s", field.name, upper, ShortestText(v)));
  }
  return absl::OkStatus();
}

absl::Status ValidateGateConfig(const GateConfig& c) {
  for (const GateField& f : kGateFields) {
    if (absl::Status s = CheckGateField(c, f); !s.ok()) return s;
  }
  // With a margin as large as the threshold the re-enable level is <= 0, so a group in
  // the RS_WAIT fallback could never return to SP.
  if (c.rs_wait_reenable_margin >= c.max_rs_wait_share) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rs_wait_reenable_margin (%s) must be less than max_rs_wait_share (%s)",
        ShortestText(c.rs_wait_reenable_margin), ShortestText(c.max_rs_wait_share)));
  }
  return absl::OkStatus();
}

}  // namespace spgate
