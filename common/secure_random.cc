// Secrets from the kernel's CSPRNG; see secure_random.h.
#include "common/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace spgate {

absl::StatusOr<std::string> RandomHex128(std::string_view what) {
  uint64_t words[2];
  auto* bytes = reinterpret_cast<unsigned char*>(words);
  size_t got = 0;
  while (got < sizeof(words)) {
    const ssize_t n = getrandom(bytes + got, sizeof(words) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrFormat("%s: getrandom failed: %s", what, std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::StrFormat("%016x%016x", words[0], words[1]);
}

}  // namespace spgate
