// Who a worker is (docs/design.md §10): the rules for job ids, shared by the live state
// and the operator store (an id becomes a metric label value and a key in the state
// file), for launch incarnations, and the worker sessions' tokens.
#ifndef SPGATE_SERVER_IDENTITY_H_
#define SPGATE_SERVER_IDENTITY_H_

#include <cctype>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace spgate::server {

inline constexpr size_t kMaxJobIdLength = 128;
// RegisterRequest.host: a DNS name is at most 253 characters.
inline constexpr size_t kMaxHostLength = 255;
// A session token is 32 hex digits (NewSessionId); anything longer is not one.
inline constexpr size_t kMaxSessionIdLength = 64;

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

// 1-128 printable ASCII characters without spaces: one value per launch of the job, the
// same on every rank.
absl::Status ValidateIncarnation(std::string_view incarnation);

// A launch credential (docs/security.md, "Launch credentials"): 16-128 printable ASCII
// characters without spaces. The shipped clients send 32 hex digits (128 random bits)
// made by world rank 0, or SPGATE_LAUNCH_CREDENTIAL. UNAUTHENTICATED when empty (the
// caller presented nothing), INVALID_ARGUMENT when malformed; the message never echoes it.
absl::Status ValidateLaunchCredential(std::string_view credential);

// The SHA-256 of a credential as 64 lower-case hex digits: all the daemon keeps, in
// memory and in --state_dir, so the state never holds a secret a worker could present.
std::string LaunchCredentialDigest(std::string_view credential);

// A new session token: 128 bits from the kernel's random source (getrandom), as 32 hex
// digits. It is the session's only credential, so it must not be guessable from others.
// INTERNAL when the kernel gives no randomness (never on a working Linux).
absl::StatusOr<std::string> NewSessionId();

}  // namespace spgate::server

#endif  // SPGATE_SERVER_IDENTITY_H_
