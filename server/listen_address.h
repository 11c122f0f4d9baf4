// What the daemon knows about an address it is asked to listen on, before and after it
// tries: whether only this host can reach it, and why a listen failed. The gRPC servers
// and the metrics endpoint report a failed listen without the operating system's reason
// (gRPC logs it on a line of its own; civetweb says "possible problem binding to port").
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace spgate::server {

// Whether a listen address reaches only this host: 127.0.0.0/8, ::1, localhost, or a
// unix socket.
bool IsLoopbackListenAddress(absl::string_view address);

// Why a TCP socket cannot be bound to `address` ("host:port", "[v6]:port", or a bare
// "port" for every IPv4 interface; the host numeric or "localhost"), as the operating
// system says it ("Address already in use", "Permission denied", "Cannot assign
// requested address"); empty when the bind succeeds here, or for an address it cannot
// try (a unix socket, a host name, port 0). Call after a listen failed: a free port may
// have been taken since.
std::string WhyCannotListen(absl::string_view address);

}  // namespace spgate::server
