// The /metrics endpoint alone (server/metrics_endpoint.h): where its stop connects, that
// the stop does not wait out civetweb's poll, a port it cannot take, and an IPv6 address
// a civetweb without IPv6 cannot serve. Built into daemon_test (one binary linking the
// daemon's library).
#include "server/metrics_endpoint.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MetricsEndpointTest, TheStopConnectsToTheBoundAddressOrItsFamilysLoopback) {
  const std::pair<std::string, std::string> cases[] = {
      {"0.0.0.0:9461", "127.0.0.1"}, {"127.0.0.1:0", "127.0.0.1"}, {"10.1.2.3:9461", "10.1.2.3"},
      {"9461", "127.0.0.1"},         {"[::]:9461", "::1"},         {"[::1]:0", "::1"},
      {"[fd00::7]:9461", "fd00::7"}, {"[]:9461", "::1"},
      {"127.0.0.1:9461,[::1]:9462", "127.0.0.1"}, {"9461,10.0.0.5:9462", "127.0.0.1"},
      {"[::1]:9461,127.0.0.1:9462", "::1"}};
  for (const auto& [listen, want] : cases) {
    EXPECT_EQ(LocalAddressOf(listen), want) << listen;
  }
}

// civetweb looks at its stop flag between two-second polls: without the wake-up a stop
// took up to 2 s whether or not anything had been scraped.
TEST(MetricsEndpointTest, ServesTheRegistryAndStopsWithoutWaitingForThePoll) {
  for (const bool scrape : {false, true}) {
    auto registry = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter().Name("spgate_endpoint_test_total").Help("t").Register(*registry)
        .Add({})
        .Increment();
    auto endpoint = MetricsEndpoint::Listen("127.0.0.1:0", registry);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    ASSERT_GT((*endpoint)->port(), 0);
    if (scrape) {
      EXPECT_THAT(testing::ScrapeMetrics((*endpoint)->port()),
                  HasSubstr("spgate_endpoint_test_total 1"));
    }
    const absl::Time start = absl::Now();
    endpoint->reset();
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(1000)) << "scraped: " << scrape;
  }
}

TEST(MetricsEndpointTest, APortInUseIsRefusedNamingTheFlag) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsEndpoint::Listen("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_THAT(MetricsEndpoint::Listen(taken, registry).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("--metrics_listen=" + taken +
                                 ": cannot listen there: Address already in use")));
}

// Where civetweb was built without IPv6 (Debian 12's), an IPv6 address is refused before
// civetweb tries it, naming the flag and the cause; it failed with civetweb's "null
// context when constructing CivetServer. Possible problem binding to port."
TEST(MetricsEndpointTest, AnIpv6AddressCivetwebCannotServeIsRefusedNamingTheCause) {
  if (MetricsEndpointHasIpv6()) GTEST_SKIP() << "this civetweb was built with IPv6";
  auto registry = std::make_shared<prometheus::Registry>();
  for (const std::string listen : {"[::1]:0", "+0"}) {
    EXPECT_THAT(MetricsEndpoint::Listen(listen, registry).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("--metrics_listen=", listen, ": ", listen,
                                                " listens on IPv6, but the civetweb library"))));
  }
}

}  // namespace
}  // namespace spgate::server
