// Listen addresses (server/listen_address.h): which reach only this host, and why a
// listen failed. Built into daemon_test.
#include "server/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spgate::server {
namespace {

TEST(IsLoopbackListenAddressTest, Table) {
  const struct {
    const char* address;
    bool loopback;
  } cases[] = {
      {"127.0.0.1:50061", true},  {"127.9.9.9:1", true},      {"localhost:50061", true},
      {"LOCALHOST:1", true},      {"[::1]:50061", true},      {"[::ffff:127.0.0.1]:1", true},
      {"unix:/run/spgated.sock", true},
      {"0.0.0.0:50061", false},   {"[::]:50061", false},      {":50061", false},
      {"10.0.3.7:50061", false},  {"128.0.0.1:1", false},     {"spgated:50061", false},
      {"localhost.evil.example:1", false},                    {"127.0.0.1.nip.io:1", false},
      {"[::2]:1", false},         {"50061", false},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(IsLoopbackListenAddress(c.address), c.loopback) << c.address;
  }
}

TEST(ListenAddressTest, ShapeAndTheHostALocalClientDials) {
  const struct {
    const char* address;
    bool good;          // a gRPC listen address's shape
    const char* local;  // LocalHostOf; null: not a TCP address
  } cases[] = {
      {"127.0.0.1:50061", true, "127.0.0.1"}, {"0.0.0.0:0", true, "127.0.0.1"},
      {":50061", true, "127.0.0.1"},          {"*:1", true, "127.0.0.1"},
      {"[::]:50061", true, "::1"},            {"[::1]:65535", true, "::1"},
      {"spgated:50061", true, "spgated"},     {"unix:/run/s.sock", true, nullptr},
      {"127.0.0.1:notaport", false, "127.0.0.1"}, {"127.0.0.1", false, "127.0.0.1"},
      {"127.0.0.1:70000", false, "127.0.0.1"},    {"127.0.0.1:", false, "127.0.0.1"},
      {"127.0.0.1:-1", false, "127.0.0.1"},       {"9461", false, "127.0.0.1"},
  };
  for (const auto& c : cases) {
    const std::string error = ListenAddressShapeError("listen", c.address);
    EXPECT_EQ(error.empty(), c.good) << c.address << ": " << error;
    if (!c.good) {
      EXPECT_THAT(error, ::testing::StartsWith(absl::StrCat("--listen=", c.address,
                                                            ": not an address to listen on")));
    }
    if (c.local != nullptr) {
      EXPECT_EQ(LocalHostOf(SplitAddress(c.address)), c.local) << c.address;
    }
  }
  EXPECT_EQ(ListenAddressShapeError("admin_listen", ""), "") << "empty: the flag's default";
}

// Listeners that would bind one socket are refused before any binds, naming both flags;
// port 0, different hosts on one port and different families are fine: a gRPC wildcard
// or "localhost" binds IPv4 and IPv6, civetweb's bare or 0.0.0.0 port IPv4, [::] IPv6,
// +PORT both.
TEST(ListenAddressTest, SharedListenAddress) {
  const struct {
    const char* grpc;     // --listen
    const char* metrics;  // --metrics_listen (civetweb)
    bool clash;
  } cases[] = {
      {"127.0.0.1:50061", "127.0.0.1:50061", true},  {"127.0.0.1:0", "127.0.0.1:0", false},
      {"localhost:9461", "127.0.0.1:9461", true},    {"localhost:9461", "[::1]:9461", true},
      {":9461", "9461", true},                       {"[::1]:9461", "+9461", true},
      {"0.0.0.0:50062", "10.0.0.5:50062", true},     {"[::]:50062", "127.0.0.1:50062", true},
      {"[::1]:9461", "9461", false},                 {"127.0.0.1:9461", "[::]:9461", false},
      {"[::1]:9461", "0.0.0.0:9461", false},         {"10.0.0.4:50062", "10.0.0.5:50062", false},
      {"127.0.0.1:50061", "127.0.0.1:50062", false}, {"", "", false},
      {"spgated:9461", "9461", true},                {"spgated:9461", "[::]:9461", true},
      {"unix:/run/a.sock", "unix:/run/a.sock", true}, {"unix:/run/a.sock", "unix:/run/b.sock", false},
      {"127.0.0.1:9461", "[::1]:9462,0.0.0.0:9461", true},
      {"127.0.0.1:50062", "127.0.0.1:9461,127.0.0.1:50062", true},
      // An IPv6 address however spelt: one address, and "::0" the wildcard.
      {"[0:0:0:0:0:0:0:1]:9461", "[::1]:9461", true}, {"[::0001]:9461", "[::1]:9461", true},
      {"[0::0]:9461", "127.0.0.1:9461", true},        {"[FE80::1]:9461", "[fe80::1]:9461", true},
      {"[0:0:0:0:0:0:0:1]:9461", "[::2]:9461", false},
  };
  for (const auto& c : cases) {
    const std::string error =
        SharedListenAddressError({{"listen", c.grpc}, {"metrics_listen", c.metrics, true}});
    EXPECT_EQ(!error.empty(), c.clash) << c.grpc << " / " << c.metrics << ": " << error;
    if (c.clash) {
      EXPECT_EQ(error, absl::StrCat("--listen=", c.grpc, " and --metrics_listen=", c.metrics,
                                    " would listen on one socket; each needs its own port"));
    }
  }
  // Two gRPC listeners: a wildcard binds both families.
  EXPECT_NE(SharedListenAddressError({{"listen", "0.0.0.0:50061"}, {"admin_listen", "[::1]:50061"}}),
            "");
  EXPECT_EQ(DefaultWorkerListen(false), "127.0.0.1:50061");
  EXPECT_EQ(DefaultWorkerListen(true), "0.0.0.0:50061");
}

// --metrics_listen is civetweb's: a bare port and a comma-separated list are fine, a unix
// socket or a malformed entry is a usage error (it failed at bind time, exit 1, with
// civetweb's "null context when constructing CivetServer").
TEST(ListenAddressTest, MetricsAddressShape) {
  for (const char* good : {"", "0.0.0.0:9461", "9461", "+9461", "127.0.0.1:0", "[::1]:9461",
                           "127.0.0.1:9461,[::1]:9461"}) {
    EXPECT_EQ(MetricsAddressShapeError(good), "") << good;
  }
  for (const char* bad : {"foo", "127.0.0.1:notaport", "127.0.0.1:99999", "99999", "+",
                          "unix:/run/m.sock", "127.0.0.1:9461,", "127.0.0.1"}) {
    EXPECT_THAT(MetricsAddressShapeError(bad),
                ::testing::StartsWith(absl::StrCat("--metrics_listen=", bad,
                                                   ": not an address to listen on")));
  }
}

// An IPv6 entry where civetweb was built without IPv6 (Debian 12's; mg_check_feature(8)
// is 0) is a usage error naming the flag, the entry, the cause and the IPv4 forms to use
// instead; it failed at bind time with "null context when constructing CivetServer".
TEST(ListenAddressTest, MetricsAddressNeedingIpv6WhereCivetwebHasNone) {
  for (const char* v4 : {"", "0.0.0.0:9461", "9461", "127.0.0.1:0", "metrics.local:9461"}) {
    EXPECT_EQ(MetricsAddressFamilyError(v4, /*civetweb_has_ipv6=*/false), "") << v4;
  }
  const struct {
    const char* address;
    const char* entry;
    const char* port;
  } v6[] = {{"[::1]:9461", "[::1]:9461", "9461"},
            {"+9461", "+9461", "9461"},
            {"[::]:0", "[::]:0", "0"},
            {"127.0.0.1:9461,[fd00::7]:9462", "[fd00::7]:9462", "9462"}};
  for (const auto& c : v6) {
    EXPECT_EQ(MetricsAddressFamilyError(c.address, /*civetweb_has_ipv6=*/true), "") << c.address;
    EXPECT_EQ(MetricsAddressFamilyError(c.address, /*civetweb_has_ipv6=*/false),
              absl::StrCat("--metrics_listen=", c.address, ": ", c.entry,
                           " listens on IPv6, but the civetweb library spgated serves /metrics "
                           "with was built without IPv6: give an IPv4 address instead "
                           "(127.0.0.1:", c.port, ", 0.0.0.0:", c.port, ", or ", c.port,
                           " for every IPv4 interface), or a civetweb built with USE_IPV6"));
  }
}

// A port held here (listening) is "in use" on its own address, on the wildcard and in the
// bare-port form; a free one binds; what cannot be tried says nothing.
TEST(WhyCannotListenTest, NamesTheOperatingSystemsReason) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  for (const std::string& held : {absl::StrCat("127.0.0.1:", port), absl::StrCat("0.0.0.0:", port),
                                  absl::StrCat("localhost:", port), absl::StrCat(port),
                                  absl::StrCat(":", port)}) {
    EXPECT_EQ(WhyCannotListen(held), "Address already in use") << held;
  }
  close(fd);
  EXPECT_EQ(WhyCannotListen(absl::StrCat("127.0.0.1:", port)), "") << "free again";
  for (const char* untried : {"127.0.0.1:0", "unix:/run/x.sock", "spgated:50061", "127.0.0.1:x"}) {
    EXPECT_EQ(WhyCannotListen(untried), "") << untried;
  }
}

}  // namespace
}  // namespace spgate::server
