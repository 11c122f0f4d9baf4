// The launch credential's format, one rule for the daemon and every client
// (docs/security.md, "Launch credentials"): 16 to 128 printable ASCII characters without
// spaces. The shipped clients make 32 hex digits (128 random bits). A client must never
// accept what the daemon refuses, or its ranks would retry Register forever.
//
// Usage:
//   RETURN_IF_ERROR(spgate::CheckLaunchCredential(value, "SPGATE_LAUNCH_CREDENTIAL"));
#ifndef SPGATE_COMMON_LAUNCH_CREDENTIAL_H_
#define SPGATE_COMMON_LAUNCH_CREDENTIAL_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace spgate {

inline constexpr size_t kMinLaunchCredentialLength = 16;
inline constexpr size_t kMaxLaunchCredentialLength = 128;

// INVALID_ARGUMENT naming `name` (the field, option or variable it came from) when
// `credential` is not 16-128 characters of 0x21-0x7e; an empty one too. The message never
// contains the value: it is a secret.
absl::Status CheckLaunchCredential(std::string_view credential,
                                   std::string_view name = "launch_credential");

}  // namespace spgate

#endif  // SPGATE_COMMON_LAUNCH_CREDENTIAL_H_
