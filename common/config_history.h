// The config history's rules, one place for the daemon's admin API and for spgatectl
// (docs/api.md): a client refuses what the daemon would, in the same words.
//   - a config version is 0 or more: 0 is a scope with no change through the API (and, as
//     a rollback target, every override of the scope removed); each change takes the
//     daemon's next version;
//   - a ListConfigHistory page holds 1 to kMaxHistoryPageSize entries (0 asks for
//     kDefaultHistoryPageSize).
//
// Usage:
//   RETURN_IF_ERROR(spgate::ValidateConfigVersion("expected_version", r.expected_version()));
#ifndef SPGATE_COMMON_CONFIG_HISTORY_H_
#define SPGATE_COMMON_CONFIG_HISTORY_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate {

inline constexpr int kMaxHistoryPageSize = 500;
inline constexpr int kDefaultHistoryPageSize = 50;

// INVALID_ARGUMENT naming `field` for a negative version.
inline absl::Status ValidateConfigVersion(std::string_view field, int64_t version) {
  if (version >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: versions start at 0, got %d", field, version));
}

// INVALID_ARGUMENT naming `field` for a page size outside [0, kMaxHistoryPageSize].
inline absl::Status ValidateHistoryPageSize(std::string_view field, int64_t size) {
  if (size >= 0 && size <= kMaxHistoryPageSize) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s: must be in [0, %d] (0: %d), got %d",
                                                    field, kMaxHistoryPageSize,
                                                    kDefaultHistoryPageSize, size));
}

}  // namespace spgate

#endif  // SPGATE_COMMON_CONFIG_HISTORY_H_
