// The hardware id's format, one rule for the daemon and every client (docs/design.md
// §11): RegisterRequest.hardware_id names the kind of hardware a launch runs on (the
// shipped clients send e.g. "NVIDIA H200 sm_90 140GiB" or "cpu:AMD EPYC 9654 96-Core
// Processor"). It is part of the learned tables' relaunch key only — never a figure in
// the cost prior — so a relaunch on other hardware starts cold. It is written into the
// daemon's learned-tables files and shown by spgatectl, hence printable ASCII and bounded.
//
// Usage:
//   RETURN_IF_ERROR(spgate::ValidateHardwareId(request.hardware_id()));
//   std::string id = spgate::SanitizeHardwareId(raw_cpu_model_name);
#ifndef SPGATE_COMMON_HARDWARE_ID_H_
#define SPGATE_COMMON_HARDWARE_ID_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate {

inline constexpr size_t kMaxHardwareIdLength = 128;

inline bool IsPrintableAscii(char c) { return c >= 0x20 && c <= 0x7e; }

// Empty (an old client, or one that declares none), or at most 128 printable ASCII
// characters. INVALID_ARGUMENT naming `name` (the field, or the variable the value came
// from) otherwise; the message shows the offending character's position, not the value
// (it may not be printable).
inline absl::Status ValidateHardwareId(std::string_view id,
                                       std::string_view name = "hardware_id") {
  if (id.size() > kMaxHardwareIdLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: at most %d characters, got %d", name, kMaxHardwareIdLength, id.size()));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    if (!IsPrintableAscii(id[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: only printable ASCII characters, got byte 0x%02x at position %d", name,
          static_cast<unsigned char>(id[i]), i));
    }
  }
  return absl::OkStatus();
}

// `raw` made valid: non-printable bytes dropped, runs of spaces folded to one, leading
// and trailing spaces trimmed, cut to 128 characters (and trimmed again).
inline std::string SanitizeHardwareId(std::string_view raw) {
  std::string out;
  out.reserve(std::min(raw.size(), kMaxHardwareIdLength));
  for (char c : raw) {
    if (c == '\t') c = ' ';
    if (!IsPrintableAscii(c)) continue;
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out.push_back(c);
    if (out.size() == kMaxHardwareIdLength) break;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace spgate

#endif  // SPGATE_COMMON_HARDWARE_ID_H_
