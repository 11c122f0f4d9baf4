#include "server/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace spgate::server {

bool IsLoopbackListenAddress(absl::string_view address) {
  const AddressParts p = SplitAddress(address);
  // gRPC's unix sockets are reachable only from this host.
  if (p.unix) return true;
  if (!p.has_colon) return false;
  if (absl::EqualsIgnoreCase(p.host, "localhost")) return true;
  unsigned char addr[16];
  if (inet_pton(AF_INET, p.host.c_str(), addr) == 1) return addr[0] == 127;
  if (inet_pton(AF_INET6, p.host.c_str(), addr) == 1) {
    static constexpr unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                     0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr unsigned char kMapped4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::equal(addr, addr + 16, kLoopback6) ||
           (std::equal(addr, addr + 12, kMapped4) && addr[12] == 127);
  }
  return false;
}

std::string LocalHostOf(const AddressParts& parts) {
  if (parts.host == "::") return "::1";
  if (parts.host.empty() || parts.host == "0.0.0.0" || parts.host == "*") {
    return parts.bracketed ? "::1" : "127.0.0.1";
  }
  return parts.host;
}

bool NumericSocketAddress(const std::string& host, int port, sockaddr_storage* addr,
                          socklen_t* len) {
  *addr = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v4);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v6);
    return true;
  }
  return false;
}

std::string ListenAddressShapeError(absl::string_view flag, absl::string_view address) {
  const AddressParts p = SplitAddress(address);
  if (address.empty() || p.unix || (p.has_colon && PortNumber(p) >= 0)) return "";
  return absl::StrCat("--", flag, "=", address,
                      ": not an address to listen on (HOST:PORT with PORT in [0, 65535], "
                      "[IPv6]:PORT, or unix:PATH)");
}

std::string MetricsAddressShapeError(absl::string_view address) {
  if (address.empty()) return "";
  for (absl::string_view part : absl::StrSplit(address, ',')) {
    // civetweb's "+PORT": IPv4 and IPv6 on one socket; a bare PORT is SplitAddress's port.
    if (!absl::StrContains(part, ':')) absl::ConsumePrefix(&part, "+");
    const AddressParts p = SplitAddress(part);
    if (!p.unix && PortNumber(p) >= 0) continue;
    return absl::StrCat("--metrics_listen=", address, ": not an address to listen on (HOST:PORT ",
                        "with PORT in [0, 65535], [IPv6]:PORT, a bare PORT or +PORT (IPv4 and "
                        "IPv6), comma-separated; empty: off)");
  }
  return "";
}

std::string MetricsAddressFamilyError(absl::string_view address, bool civetweb_has_ipv6) {
  if (address.empty() || civetweb_has_ipv6) return "";
  for (absl::string_view part : absl::StrSplit(address, ',')) {
    absl::string_view port = part;
    const bool plus = !absl::StrContains(part, ':') && absl::ConsumePrefix(&port, "+");
    const AddressParts p = SplitAddress(part);
    in6_addr v6;
    const bool ipv6 = plus || p.bracketed || inet_pton(AF_INET6, p.host.c_str(), &v6) == 1;
    if (!ipv6) continue;
    if (!plus) port = p.port;
    return absl::StrCat("--metrics_listen=", address, ": ", part,
                        " listens on IPv6, but the civetweb library spgated serves /metrics "
                        "with was built without IPv6: give an IPv4 address instead (127.0.0.1:",
                        port, ", 0.0.0.0:", port, ", or ", port,
                        " for every IPv4 interface), or a civetweb built with USE_IPV6");
  }
  return "";
}

std::string DefaultWorkerListen(bool has_worker_credential) {
  return absl::StrCat(has_worker_credential ? "0.0.0.0" : "127.0.0.1", ":", kDefaultWorkerPort);
}

namespace {

// A listener's socket: a unix path, or a port on a host ("" for every interface) in the
// families it binds. gRPC binds a wildcard ("", "0.0.0.0", "*", "::") and "localhost" on
// IPv4 and IPv6; civetweb binds a bare PORT or 0.0.0.0:P on IPv4 only, [::]:P on IPv6 only
// and +P on both.
struct Bound {
  bool unix = false;
  std::string host;  // unix: the whole address
  int port = 0;
  bool v4 = true;
  bool v6 = true;
};

std::vector<Bound> BoundOf(absl::string_view address, bool civetweb) {
  if (address.empty()) return {};
  const AddressParts p = SplitAddress(address);
  if (p.unix) return {Bound{true, std::string(address), 0}};
  absl::string_view port_text = p.port;
  const bool plus = !p.has_colon && absl::ConsumePrefix(&port_text, "+");
  AddressParts q = p;
  q.port = std::string(port_text);
  const int port = PortNumber(q);
  if (port <= 0) return {};  // port 0: a free port each; a bad one is refused first
  if (plus) return {Bound{false, "", port, true, true}};
  // An IPv6 literal in its one spelling ("0:0::1" and "::1" are one address; "::0" is "::").
  std::string h = p.host;
  in6_addr a6;
  const bool v6 = inet_pton(AF_INET6, h.c_str(), &a6) == 1;
  if (v6) {
    char text[INET6_ADDRSTRLEN];
    if (inet_ntop(AF_INET6, &a6, text, sizeof(text)) != nullptr) h = text;
  }
  if (h.empty() || h == "0.0.0.0" || h == "*") return {Bound{false, "", port, true, !civetweb}};
  if (h == "::") return {Bound{false, "", port, !civetweb, true}};
  if (absl::EqualsIgnoreCase(h, "localhost")) {
    return {Bound{false, "127.0.0.1", port, true, false}, Bound{false, "::1", port, false, true}};
  }
  in_addr a4;
  const bool v4 = inet_pton(AF_INET, h.c_str(), &a4) == 1;
  return {Bound{false, h, port, v4 || !v6, v6 || !v4}};  // a name: either family
}

bool Clash(const Bound& a, const Bound& b) {
  if (a.unix != b.unix) return false;
  if (a.unix) return a.host == b.host;
  return a.port == b.port && ((a.v4 && b.v4) || (a.v6 && b.v6)) &&
         (a.host == b.host || a.host.empty() || b.host.empty());
}

// Every socket of a listener: civetweb's --metrics_listen may list several.
std::vector<Bound> BoundsOf(const Listener& l) {
  std::vector<Bound> out;
  for (absl::string_view part : absl::StrSplit(l.address, ',')) {
    for (Bound& b : BoundOf(part, l.civetweb)) out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

std::string SharedListenAddressError(const std::vector<Listener>& listeners) {
  for (size_t i = 0; i < listeners.size(); ++i) {
    for (size_t j = i + 1; j < listeners.size(); ++j) {
      bool clash = false;
      for (const Bound& a : BoundsOf(listeners[i])) {
        for (const Bound& b : BoundsOf(listeners[j])) clash = clash || Clash(a, b);
      }
      if (clash) {
        return absl::StrCat("--", listeners[i].flag, "=", listeners[i].address, " and --",
                            listeners[j].flag, "=", listeners[j].address,
                            " would listen on one socket; each needs its own port");
      }
    }
  }
  return "";
}

std::string WhyCannotListen(absl::string_view address) {
  const AddressParts p = SplitAddress(address);
  const int port = PortNumber(p);
  if (p.unix || port <= 0) return "";
  std::string host = p.host.empty() ? "0.0.0.0" : p.host;
  if (absl::EqualsIgnoreCase(host, "localhost")) host = "127.0.0.1";
  sockaddr_storage addr;
  socklen_t len = 0;
  if (!NumericSocketAddress(host, port, &addr, &len)) return "";
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  // As the servers bind: a port in TIME_WAIT is not "in use".
  const int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string why;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) why = std::strerror(errno);
  close(fd);
  return why;
}

}  // namespace spgate::server
