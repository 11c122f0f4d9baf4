#include "server/metrics_endpoint.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "civetweb.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/listen_address.h"

namespace spgate::server {
namespace {

// One TCP connection to [host]:port, closed at once; errors are ignored (a missed wake
// costs only the rest of civetweb's quantum).
void Knock(const std::string& host, int port) {
  sockaddr_storage addr;
  socklen_t len = 0;
  if (!NumericSocketAddress(host, port, &addr, &len)) return;
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  // A full accept queue drops the SYN: give up on this knock, the next one retries.
  const timeval limit{0, 50'000};
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  close(fd);
}

}  // namespace

bool MetricsEndpointHasIpv6() {
  constexpr unsigned kIpv6 = 8;  // civetweb.h, mg_check_feature: "support IPv6"
  return mg_check_feature(kIpv6) != 0;
}

std::string LocalAddressOf(const std::string& listen_ports) {
  // civetweb takes a comma-separated list; the port reported (and knocked on) is the
  // first entry's.
  return LocalHostOf(SplitAddress(listen_ports.substr(0, listen_ports.find(','))));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Listen(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  if (std::string error = MetricsAddressFamilyError(listen, MetricsEndpointHasIpv6());
      !error.empty()) {
    return absl::InvalidArgumentError(error);
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& ex) {
    // civetweb's own text ("null context when constructing CivetServer. Possible problem
    // binding to port.") only when the operating system's reason cannot be found.
    const std::string why = WhyCannotListen(listen.substr(0, listen.find(',')));
    return absl::UnavailableError(absl::StrCat("--metrics_listen=", listen,
                                               ": cannot listen there: ",
                                               why.empty() ? ex.what() : why));
  }
  e->exposer_->RegisterCollectable(registry);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  e->wake_host_ = LocalAddressOf(listen);
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (exposer_ == nullptr) return;
  if (port_ == 0) {
    exposer_.reset();
    return;
  }
  // civetweb sets its stop flag inside the Exposer's destructor, so the knocks repeat
  // (every 10 ms, for at most the quantum) until it returns; a knock before the flag is
  // set is an ordinary connection, accepted and closed.
  std::atomic<bool> stopped{false};
  std::thread waker;
  try {
    waker = std::thread([this, &stopped] {
      const absl::Time give_up = absl::Now() + absl::Seconds(3);
      while (!stopped.load(std::memory_order_acquire) && absl::Now() < give_up) {
        Knock(wake_host_, port_);
        absl::SleepFor(absl::Milliseconds(10));
      }
    });
  } catch (const std::system_error&) {
    // No thread to spare: the stop waits the poll out, as without the knocks.
  }
  exposer_.reset();
  stopped.store(true, std::memory_order_release);
  if (waker.joinable()) waker.join();
}

}  // namespace spgate::server
