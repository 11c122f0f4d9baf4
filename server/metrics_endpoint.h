// The Prometheus /metrics endpoint (--metrics_listen): prometheus-cpp's Exposer, which
// serves with civetweb, and a stop that does not wait out civetweb's accept loop.
//
// civetweb's listening thread polls its sockets in quanta of two seconds and looks at its
// stop flag only between them, so destroying an Exposer took up to two seconds: every
// spgated stop and restart, every test daemon. A connection to the listening socket ends
// the poll early; MetricsEndpoint's destructor makes such connections (on the loopback
// address of the bound family when the address is a wildcard) until the Exposer is gone.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace spgate::server {

class MetricsEndpoint {
 public:
  // Serves `registry` on `listen` ("host:port", "[v6]:port" or "port"; port 0 picks one).
  // UNAVAILABLE naming the address when it cannot listen there; INVALID_ARGUMENT for an
  // IPv6 entry civetweb was built without (MetricsAddressFamilyError).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Listen(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string wake_host_;  // where the destructor connects to end civetweb's poll
  int port_ = 0;
};

// Whether the civetweb library /metrics is served with can listen on IPv6 (built with
// USE_IPV6; Debian 12's is not), for MetricsAddressFamilyError before anything binds.
bool MetricsEndpointHasIpv6();

// The address a connection to a server listening on `listen` goes to: its host, or the
// loopback address of its family for a wildcard ("0.0.0.0", "::", none given). A host
// name is returned as it is and not resolved by the stop, which then waits the poll out.
// Of a comma-separated list, the first entry's.
std::string LocalAddressOf(const std::string& listen_ports);

}  // namespace spgate::server
