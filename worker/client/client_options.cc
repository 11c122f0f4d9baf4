// The option table's lookups and text conversions; see client_options.h.
#include "worker/client/client_options.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace spgate::client {
namespace {

// Debian's Abseil has its own string_view; the table's are std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status NotA(const ClientOption& row, std::string_view what, std::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat(CApiOptionName(row), ": not ", Av(what), ": \"", Av(text), "\""));
}

}  // namespace

const ClientOption* FindClientOption(std::string_view name) {
  for (const ClientOption& row : kClientOptions) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

std::string CApiOptionName(const ClientOption& row) {
  if (row.type == ClientOptionType::kDuration) return absl::StrCat(Av(row.name), "_", Av(row.unit));
  return std::string(row.name);
}

const ClientOption* FindCApiOption(std::string_view name) {
  for (const ClientOption& row : kClientOptions) {
    if (row.in_c_api() && CApiOptionName(row) == name) return &row;
  }
  return nullptr;
}

absl::Status SetClientOptionFromText(GateClientOptions& o, const ClientOption& row,
                                     std::string_view text) {
  const absl::string_view t(text.data(), text.size());
  switch (row.type) {
    case ClientOptionType::kText:
      ClientOptionRef<std::string>(o, row) = std::string(text);
      return absl::OkStatus();
    case ClientOptionType::kInt:
    case ClientOptionType::kUint64:
    case ClientOptionType::kDuration: {
      // Parsed as int64 and narrowed, as the C API always has.
      int64_t v;
      if (!absl::SimpleAtoi(t, &v)) return NotA(row, "an integer", text);
      // Refused here, by the C API's name, rather than wrapped (a negative byte count
      // became 2^64 - 5) or refused later by Create under the C++ name.
      if (row.type != ClientOptionType::kInt && v < 0) {
        return NotA(row, "a non-negative integer", text);
      }
      if (row.type == ClientOptionType::kInt &&
          (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())) {
        return NotA(row, "an integer in int's range", text);
      }
      if (row.type == ClientOptionType::kInt) {
        ClientOptionRef<int>(o, row) = static_cast<int>(v);
      } else if (row.type == ClientOptionType::kUint64) {
        ClientOptionRef<uint64_t>(o, row) = static_cast<uint64_t>(v);
      } else {
        ClientOptionRef<absl::Duration>(o, row) = absl::Milliseconds(v);
      }
      return absl::OkStatus();
    }
    case ClientOptionType::kReal: {
      double v;
      if (!absl::SimpleAtod(t, &v) || !std::isfinite(v)) return NotA(row, "a number", text);
      ClientOptionRef<double>(o, row) = v;
      return absl::OkStatus();
    }
    case ClientOptionType::kFlag: {
      bool v;
      if (!absl::SimpleAtob(t, &v)) return NotA(row, "true or false", text);
      ClientOptionRef<bool>(o, row) = v;
      return absl::OkStatus();
    }
  }
  return absl::InternalError(absl::StrCat(Av(row.name), ": unknown option type"));
}

std::string ClientOptionText(const GateClientOptions& o, const ClientOption& row) {
  switch (row.type) {
    case ClientOptionType::kText: return ClientOptionRef<std::string>(o, row);
    case ClientOptionType::kInt: return absl::StrCat(ClientOptionRef<int>(o, row));
    case ClientOptionType::kUint64: return absl::StrCat(ClientOptionRef<uint64_t>(o, row));
    case ClientOptionType::kReal: return absl::StrCat(ClientOptionRef<double>(o, row));
    case ClientOptionType::kFlag: return ClientOptionRef<bool>(o, row) ? "true" : "false";
    case ClientOptionType::kDuration:
      return absl::StrCat(absl::ToInt64Milliseconds(ClientOptionRef<absl::Duration>(o, row)));
  }
  return "";
}

std::string ClientOptionDefaultText(const ClientOption& row) {
  return ClientOptionText(GateClientOptions{}, row);
}

const char* ClientOptionHelp(std::string_view name) {
  const ClientOption* row = FindClientOption(name);
  return row == nullptr ? "" : row->help.data();
}

}  // namespace spgate::client
