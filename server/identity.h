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
#include "common/job_id.h"
#include "common/registration.h"

namespace spgate::server {

using ::spgate::kMaxJobIdLength;  // the job id rule: common/job_id.h
using ::spgate::ValidateJobId;
// Register's fixed field rules, the clients' too: common/registration.h.
using ::spgate::kMaxHostLength;
using ::spgate::ValidateGlobalRank;
using ::spgate::ValidateGroupIndex;
using ::spgate::ValidateGroupSize;
using ::spgate::ValidateHost;
using ::spgate::ValidateIncarnation;
// A session token is 32 hex digits (NewSessionId); anything longer is not one.
inline constexpr size_t kMaxSessionIdLength = 64;


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
