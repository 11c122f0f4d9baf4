// What the daemon knows about an address it is asked to listen on, before and after it
// tries: its parts, whether only this host can reach it, where to dial it, and why a
// listen failed, for the gRPC ports and the metrics port; an address's parts are
// common/host_port.h's, the one reading of "host:port" the clients use too. (The
// gRPC servers and civetweb report a failed listen without the operating system's
// reason: gRPC logs it on a line of its own; civetweb says "possible problem binding to
// port".)
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/host_port.h"

namespace spgate::server {

// Whether a listen address reaches only this host: 127.0.0.0/8, ::1, localhost, or a
// unix socket.
bool IsLoopbackListenAddress(absl::string_view address);

// The host a client on this machine reaches a listen address at, without brackets: the
// loopback address of the family for a wildcard ("", "0.0.0.0", "*", "::"), else the host
// as written (a name is not resolved).
std::string LocalHostOf(const AddressParts& parts);

// A numeric host ("127.0.0.1", "::1", no brackets) and a port as a socket address; false
// for anything else (a name is not resolved).
bool NumericSocketAddress(const std::string& host, int port, sockaddr_storage* addr,
                          socklen_t* len);

// Empty when `address` has the shape of a gRPC listen address (HOST:PORT with PORT in
// [0, 65535], [IPv6]:PORT, unix:PATH, unix-abstract:NAME); else what is wrong, naming
// `flag` ("listen": "--listen=ADDRESS: ...").
std::string ListenAddressShapeError(absl::string_view flag, absl::string_view address);

// The same for --metrics_listen, which civetweb reads: comma-separated HOST:PORT,
// [IPv6]:PORT, a bare PORT (every IPv4 interface) or +PORT (IPv4 and IPv6), no unix
// sockets; empty is off.
std::string MetricsAddressShapeError(absl::string_view address);

// Empty when civetweb can bind every entry of --metrics_listen (of a good shape); else
// the usage error for the first entry that needs IPv6 ([IPv6]:PORT, +PORT) while the
// civetweb the daemon links was built without it (`civetweb_has_ipv6`,
// MetricsEndpointHasIpv6; Debian 12's lacks it), which would otherwise fail at bind time
// with civetweb's "null context when constructing CivetServer".
std::string MetricsAddressFamilyError(absl::string_view address, bool civetweb_has_ipv6);

// The worker API's address when --listen is empty: every interface with a worker
// credential, loopback without one; port kDefaultWorkerPort either way (docs/security.md,
// "Worker credentials").
inline constexpr int kDefaultWorkerPort = 50061;
std::string DefaultWorkerListen(bool has_worker_credential);

// Empty when no two of the (flag, address) listeners would bind one socket; else the usage
// error naming both flags. Two TCP addresses clash on the same port in a family both bind
// when their hosts are the same or either is a wildcard: gRPC binds a wildcard and
// "localhost" on IPv4 and IPv6, civetweb (--metrics_listen, every comma-separated entry) a
// bare PORT or 0.0.0.0:P on IPv4, [::]:P on IPv6, +PORT on both. Port 0 (a free port each)
// and empty addresses never clash; unix sockets clash on the same path.
struct Listener {
  absl::string_view flag;  // "listen", "admin_listen", ...
  absl::string_view address;
  bool civetweb = false;  // --metrics_listen: civetweb's address families
};
std::string SharedListenAddressError(const std::vector<Listener>& listeners);

// Why a TCP socket cannot be bound to `address` (a numeric host or "localhost"; a bare
// port is every IPv4 interface), as the operating system says it ("Address already in
// use", "Permission denied"); empty when the bind succeeds here, or for an address it
// cannot try (a unix socket, a host name, port 0). Call after a listen failed: a free
// port may have been taken since.
std::string WhyCannotListen(absl::string_view address);

}  // namespace spgate::server
