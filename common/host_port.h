// One reading of a gRPC address, "host:port", for the daemon's listen flags
// (server/listen_address.h) and the clients' controller address (worker/client/channel.h):
// its parts, without resolving anything.
#ifndef SPGATE_COMMON_HOST_PORT_H_
#define SPGATE_COMMON_HOST_PORT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace spgate {

// An address split at its last ':' — "host:port", "[v6]:port", or a bare "port" as
// civetweb takes it (no host) — into the host without its brackets and the port's text.
// A unix socket ("unix:PATH", "unix-abstract:NAME") is not split: `unix` is set.
struct AddressParts {
  std::string host;  // empty: none given (every interface)
  std::string port;  // as written; may be empty or not a number
  bool bracketed = false;  // the host was written in brackets (IPv6)
  bool has_colon = false;  // "host:port" or "[v6]:port", not a bare port
  bool unix = false;
};
AddressParts SplitAddress(absl::string_view address);

// The port as a number in [0, 65535], or -1.
int PortNumber(const AddressParts& parts);

}  // namespace spgate

#endif  // SPGATE_COMMON_HOST_PORT_H_
