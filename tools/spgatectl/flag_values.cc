// Flag value parsers for spgatectl; see flag_values.h.
#include "tools/spgatectl/flag_values.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/bearer_token.h"
#include "common/config_history.h"
#include "common/status_macros.h"

namespace spgate::ctl {
namespace {

// "max_length_cv, max_rs_wait_share, ..." in proto field order.
std::string GateFieldNames() {
  std::vector<std::string> names;
  const auto* desc = v1::GateConfig::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) names.push_back(desc->field(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::Status Bad(absl::string_view flag, absl::string_view value, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", value, "\" ", what));
}

}  // namespace

absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view value) {
  double v = 0;
  if (value.empty() || !absl::SimpleAtod(value, &v)) return Bad(flag, value, "is not a number");
  return v;
}

absl::StatusOr<int64_t> ParseInt64Flag(absl::string_view flag, absl::string_view value) {
  int64_t v = 0;
  if (value.empty() || !absl::SimpleAtoi(value, &v)) {
    return Bad(flag, value, "is not an integer");
  }
  return v;
}

absl::StatusOr<bool> ParseBoolFlag(absl::string_view flag, absl::string_view value) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return Bad(flag, value, "is not true or false");
}

absl::StatusOr<int64_t> ParseVersionFlag(absl::string_view flag, absl::string_view value) {
  absl::StatusOr<int64_t> v = ParseInt64Flag(flag, value);
  if (!v.ok()) return v.status();
  RETURN_IF_ERROR(ValidateConfigVersion(absl::StrCat("--", flag), *v));
  return v;
}

absl::StatusOr<int32_t> ParseInt32Flag(absl::string_view flag, absl::string_view value) {
  int32_t v = 0;
  if (value.empty() || !absl::SimpleAtoi(value, &v)) {
    return Bad(flag, value, "is not a 32-bit integer");
  }
  return v;
}

absl::StatusOr<uint64_t> ParseBytesFlag(absl::string_view flag, absl::string_view value) {
  constexpr absl::string_view kHint = "is not a byte count (e.g. 85899345920, 80GiB, 512MiB)";
  const size_t unit_at = value.find_first_not_of("0123456789.");
  absl::string_view number = value.substr(0, unit_at);
  absl::string_view unit = unit_at == absl::string_view::npos ? absl::string_view()
                                                            : value.substr(unit_at);
  unit = absl::StripAsciiWhitespace(unit);
  if (number.empty()) return Bad(flag, value, kHint);

  uint64_t scale = 0;
  struct Unit {
    absl::string_view name;
    uint64_t scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"kib", uint64_t{1} << 10},
      {"mib", uint64_t{1} << 20},
      {"gib", uint64_t{1} << 30},
      {"tib", uint64_t{1} << 40},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", 1000 * 1000 * 1000},
      {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
  };
  const std::string lower = absl::AsciiStrToLower(unit);
  for (const Unit& u : kUnits) {
    if (lower == u.name) scale = u.scale;
  }
  if (scale == 0) return Bad(flag, value, kHint);

  uint64_t whole = 0;
  if (absl::SimpleAtoi(number, &whole)) {
    if (whole > std::numeric_limits<uint64_t>::max() / scale) {
      return Bad(flag, value, "is too large");
    }
    return whole * scale;
  }
  // A fraction only makes sense with a unit ("1.5GiB"); plain bytes are whole.
  double fractional = 0;
  if (scale == 1 || !absl::SimpleAtod(number, &fractional)) return Bad(flag, value, kHint);
  const double bytes = std::round(fractional * static_cast<double>(scale));
  if (!(bytes < 18446744073709551616.0)) return Bad(flag, value, "is too large");
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, absl::string_view value) {
  constexpr absl::string_view kHint = "is not a duration (e.g. 30s, 10m, 1h30m, 2d)";
  absl::Duration d;
  absl::string_view days = value;
  if (absl::ConsumeSuffix(&days, "d")) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(days, &n)) return Bad(flag, value, kHint);
    d = absl::Hours(24) * n;
  } else if (!absl::ParseDuration(value, &d)) {
    return Bad(flag, value, kHint);
  }
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) {
    return Bad(flag, value, "is not a finite duration");
  }
  return d;
}

absl::StatusOr<v1::Mode> ParseModeFlag(absl::string_view flag, absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "sp" || v == "sequence_parallel") return v1::SEQUENCE_PARALLEL;
  if (v == "tp" || v == "tp_only" || v == "tensor_parallel_only") {
    return v1::TENSOR_PARALLEL_ONLY;
  }
  return Bad(flag, value, "is not a mode (want sp or tp)");
}

absl::StatusOr<std::vector<int64_t>> ParseInt64ListFlag(absl::string_view flag,
                                                       absl::string_view value) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  }
  std::vector<int64_t> out;
  int index = 0;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    ++index;
    item = absl::StripAsciiWhitespace(item);
    int64_t v = 0;
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": item ", index, " is empty"));
    }
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": item ", index, " \"", item, "\" is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseGateFieldListFlag(absl::string_view flag,
                                                               absl::string_view value) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  }
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (v1::GateConfig::descriptor()->FindFieldByName(std::string(item)) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", item, "\" is not a GateConfig field (one of ",
                       GateFieldNames(), ")"));
    }
    out.emplace_back(item);
  }
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr absl::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit].data());
  return buf;
}

absl::StatusOr<std::string> TokenFromFileText(absl::string_view path, absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(text), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (const size_t colon = line.find(':'); colon != absl::string_view::npos && colon > 0) {
      const absl::string_view name = line.substr(0, colon);
      const bool is_name = std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '@' || c == '-';
      });
      if (is_name) line = absl::StripAsciiWhitespace(line.substr(colon + 1));
    }
    if (line.empty()) break;
    // A byte a header cannot carry (a control character, UTF-8) would abort the call in
    // gRPC, printing the token: refused here, without it.
    RETURN_IF_ERROR(CheckBearerToken(line, absl::StrCat("--token_file: \"", path, "\"")));
    return std::string(line);
  }
  return absl::InvalidArgumentError(absl::StrCat("--token_file: \"", path, "\" holds no token"));
}

}  // namespace spgate::ctl
