// The rule for job ids, shared by the live state and the operator store: they become a
// metric label value and a key in the state file (docs/design.md §7, §10).
#ifndef SPGATE_SERVER_JOB_ID_H_
#define SPGATE_SERVER_JOB_ID_H_

#include <cctype>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate::server {

inline constexpr size_t kMaxJobIdLength = 128;

// 1-128 characters from [A-Za-z0-9._-], and not "_default" (the global scope's label).
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

}  // namespace spgate::server

#endif  // SPGATE_SERVER_JOB_ID_H_
