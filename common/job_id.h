// The job id's format, one rule for the daemon and every client (docs/design.md §10): an
// id becomes a metric label value and a key in the daemon's state file. A client must
// never accept what the daemon refuses, or its session would be refused on every retry
// while its steps fall back in silence.
//
// Usage:
//   RETURN_IF_ERROR(spgate::ValidateJobId(options.job_id));
#ifndef SPGATE_COMMON_JOB_ID_H_
#define SPGATE_COMMON_JOB_ID_H_

#include <cctype>
#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate {

inline constexpr size_t kMaxJobIdLength = 128;

// 1-128 characters from [A-Za-z0-9._-], and not "_default" (the global scope's label).
// INVALID_ARGUMENT naming job_id otherwise.
inline absl::Status ValidateJobId(std::string_view job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  if (job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("job_id: at most %d characters, got %d", kMaxJobIdLength, job_id.size()));
  }
  if (job_id == "_default") {
    return absl::InvalidArgumentError("job_id: \"_default\" is reserved for the global config");
  }
  for (char c : job_id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job_id: \"%s\" may contain only letters, digits, '-', '_' and '.'", job_id));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate

#endif  // SPGATE_COMMON_JOB_ID_H_
