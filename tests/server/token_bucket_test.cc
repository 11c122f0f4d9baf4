// The per-session rate limiter (server/token_bucket.h, docs/design.md §10): refills at
// its rate up to its burst, never from a clock that goes backwards, and rate 0 is off.
#include "server/token_bucket.h"

#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace spgate::server {
namespace {

TEST(TokenBucketTest, RefillsAtTheRateUpToTheBurst) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  struct Case {
    const char* name;
    double rate, burst;
    std::vector<std::pair<absl::Duration, bool>> takes;  // (time since t0, expected)
  };
  const Case cases[] = {
      {"a full burst, then empty", 10, 3,
       {{absl::ZeroDuration(), true}, {absl::ZeroDuration(), true},
        {absl::ZeroDuration(), true}, {absl::ZeroDuration(), false}}},
      {"one token per 1/rate", 10, 1,
       {{absl::ZeroDuration(), true}, {absl::Milliseconds(50), false},
        {absl::Milliseconds(100), true}, {absl::Milliseconds(150), false}}},
      {"a long pause refills only to the burst", 100, 2,
       {{absl::ZeroDuration(), true}, {absl::ZeroDuration(), true},
        {absl::Hours(1), true}, {absl::Hours(1), true}, {absl::Hours(1), false}}},
      {"a clock going backwards adds nothing", 10, 1,
       {{absl::Seconds(5), true}, {absl::Seconds(1), false}, {absl::Seconds(5), false}}},
      {"rate 0 is no limit", 0, 1,
       {{absl::ZeroDuration(), true}, {absl::ZeroDuration(), true},
        {absl::ZeroDuration(), true}}},
  };
  for (const Case& c : cases) {
    TokenBucket bucket(c.rate, c.burst, t0);
    for (size_t i = 0; i < c.takes.size(); ++i) {
      EXPECT_EQ(bucket.TryTake(t0 + c.takes[i].first), c.takes[i].second)
          << c.name << ", take " << i;
    }
  }
}

}  // namespace
}  // namespace spgate::server
