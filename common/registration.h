// The fixed rules for a Register's fields, one for the daemon and every client
// (docs/api.md, "Register"): the incarnation's format, the TP group's size, the world rank
// and the host name. A client checks them when it is created, so a field the daemon would
// refuse fails there, naming the field, instead of as a Register refused on every retry
// while the client waits out its deadline. The job id (common/job_id.h), the launch
// credential (common/launch_credential.h) and the hardware id (common/hardware_id.h) have
// their own headers; a TP group index's bound is the daemon's --max_groups_per_job, which
// only the daemon knows (its refusal reaches the client's waits at once, docs/client.md).
//
// Usage:
//   RETURN_IF_ERROR(spgate::ValidateIncarnation(options.incarnation));
//   RETURN_IF_ERROR(spgate::ValidateGroupSize(options.group_size));
#ifndef SPGATE_COMMON_REGISTRATION_H_
#define SPGATE_COMMON_REGISTRATION_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate {

inline constexpr size_t kMaxIncarnationLength = 128;
// The most ranks in one TP group (spgated's StateOptions::max_group_size by default).
inline constexpr int kMaxGroupSize = 1024;
// RegisterRequest.host: a DNS name is at most 253 characters.
inline constexpr size_t kMaxHostLength = 255;

// 1-128 printable ASCII characters without spaces: one value per launch of the job, the
// same on every rank. INVALID_ARGUMENT naming incarnation otherwise.
inline absl::Status ValidateIncarnation(std::string_view incarnation) {
  if (incarnation.empty()) {
    return absl::InvalidArgumentError(
        "incarnation: required (one value per launch of the job, the same on every rank)");
  }
  if (incarnation.size() > kMaxIncarnationLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "incarnation: at most %d characters, got %d", kMaxIncarnationLength, incarnation.size()));
  }
  for (char c : incarnation) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("incarnation: printable ASCII without spaces only");
    }
  }
  return absl::OkStatus();
}

// In [1, max_group_size]. INVALID_ARGUMENT naming group_size otherwise.
inline absl::Status ValidateGroupSize(int group_size, int max_group_size = kMaxGroupSize) {
  if (group_size < 1 || group_size > max_group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size: must be in [1, %d], got %d", max_group_size, group_size));
  }
  return absl::OkStatus();
}

// A TP group's index: in [0, max_groups), the daemon's --max_groups_per_job.
// INVALID_ARGUMENT naming group otherwise.
inline absl::Status ValidateGroupIndex(int group, int max_groups) {
  if (group < 0 || group >= max_groups) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group: must be in [0, %d) (--max_groups_per_job), got %d", max_groups, group));
  }
  return absl::OkStatus();
}

// A world rank: >= 0. INVALID_ARGUMENT naming global_rank otherwise.
inline absl::Status ValidateGlobalRank(int global_rank) {
  if (global_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("global_rank: must be >= 0, got %d", global_rank));
  }
  return absl::OkStatus();
}

// At most 255 characters (empty: the client fills in its host name). INVALID_ARGUMENT
// naming host otherwise.
inline absl::Status ValidateHost(std::string_view host) {
  if (host.size() > kMaxHostLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host: at most %d characters, got %d", kMaxHostLength, host.size()));
  }
  return absl::OkStatus();
}

}  // namespace spgate

#endif  // SPGATE_COMMON_REGISTRATION_H_
