// What a TLS port refusing a client looks like through gRPC, said in words: spgatectl and
// the client library (the workers, the simulator, the C API and Python) both add it to a
// connection failure (docs/security.md).
#ifndef SPGATE_COMMON_HANDSHAKE_HINT_H_
#define SPGATE_COMMON_HANDSHAKE_HINT_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace spgate {

// `message` is gRPC's reason for a connection it never got an answer on. Where its last
// error is "Socket closed" the daemon ended the connection during its handshake, which is
// how a TLS port refusing a client reads (no client certificate, one from another CA,
// plaintext against TLS): the sentence saying so, naming the client's settings as
// `prefix` + name ("--" for flags, "" for the C API's and Python's options); "" for any
// other message (no daemon there: "Connection refused"). `tls`: whether the client spoke
// TLS, where the caller knows (a client handed ready-made credentials does not: both
// causes are named).
inline std::string TlsRefusalHint(std::string_view message, std::optional<bool> tls,
                                  std::string_view prefix) {
  const absl::string_view m(message.data(), message.size());
  if (!absl::StrContains(m, "failed to connect to all addresses") ||
      !absl::StrContains(m, "Socket closed")) {
    return "";
  }
  const absl::string_view p(prefix.data(), prefix.size());
  const std::string certificate =
      absl::StrCat("a client certificate missing (", p, "tls_cert, ", p,
                   "tls_key) or not signed by the daemon's --tls_client_ca");
  const std::string plaintext = absl::StrCat("this client spoke plaintext (no ", p, "tls_ca, ",
                                             p, "tls_cert) and the port speaks TLS");
  return absl::StrCat(
      "the daemon closed the connection before answering: a TLS port refusing this client "
      "reads this way — ",
      !tls.has_value() ? absl::StrCat(plaintext, ", or ", certificate)
      : *tls           ? certificate
                       : plaintext,
      " (docs/security.md)");
}

}  // namespace spgate

#endif  // SPGATE_COMMON_HANDSHAKE_HINT_H_
