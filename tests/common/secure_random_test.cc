// RandomHex128 (common/secure_random.h): the shape every token and credential relies on,
// and no two alike.
#include "common/secure_random.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::testing::MatchesRegex;

TEST(SecureRandomTest, ThirtyTwoHexDigitsNeverRepeated) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> v = RandomHex128("test");
    ASSERT_THAT(v.status(), IsOk());
    EXPECT_THAT(*v, MatchesRegex("[0-9a-f]{32}"));
    seen.insert(*v);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace spgate
