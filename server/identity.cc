// Launch credentials and session tokens (docs/design.md §10); the incarnation rule is
// common/registration.h's.
#include "server/identity.h"

#include <openssl/sha.h>

#include "common/launch_credential.h"
#include "common/secure_random.h"

namespace spgate::server {

absl::Status ValidateLaunchCredential(std::string_view credential) {
  if (credential.empty()) {
    return absl::UnauthenticatedError(
        "launch_credential: required (the launch's secret, made once per launch by world "
        "rank 0 and shared by its ranks, or SPGATE_LAUNCH_CREDENTIAL)");
  }
  return CheckLaunchCredential(credential, "launch_credential");
}

std::string LaunchCredentialDigest(std::string_view credential) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), digest);
  std::string hex;
  hex.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : digest) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

absl::StatusOr<std::string> NewSessionId() { return RandomHex128("session id"); }

}  // namespace spgate::server
