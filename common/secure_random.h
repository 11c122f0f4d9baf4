// Secrets made from the kernel's CSPRNG (getrandom): the daemon's session tokens and the
// clients' launch credentials (docs/security.md). Not absl::BitGen: its seed and state
// are not meant to resist someone guessing the output, and these values are credentials.
//
// Usage:
//   ASSIGN_OR_RETURN(std::string token, spgate::RandomHex128("session id"));
#ifndef SPGATE_COMMON_SECURE_RANDOM_H_
#define SPGATE_COMMON_SECURE_RANDOM_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace spgate {

// 128 bits from getrandom as 32 lower-case hex digits. INTERNAL naming `what` when the
// kernel gives no randomness (never on a working Linux).
absl::StatusOr<std::string> RandomHex128(std::string_view what);

}  // namespace spgate

#endif  // SPGATE_COMMON_SECURE_RANDOM_H_
