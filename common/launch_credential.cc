// The launch credential's format; see launch_credential.h.
#include "common/launch_credential.h"

#include "absl/strings/str_format.h"

namespace spgate {

absl::Status CheckLaunchCredential(std::string_view credential, std::string_view name) {
  if (credential.size() < kMinLaunchCredentialLength ||
      credential.size() > kMaxLaunchCredentialLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: must be %d to %d characters, got %d", name, kMinLaunchCredentialLength,
        kMaxLaunchCredentialLength, credential.size()));
  }
  for (size_t i = 0; i < credential.size(); ++i) {
    const char c = credential[i];
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: printable ASCII without spaces only (character %d is not)", name, i + 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate
