// The launch credential's one format rule (common/launch_credential.h), table-driven:
// what the daemon and every client accept alike.
#include "common/launch_credential.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(LaunchCredentialTest, FormatTable) {
  struct Case {
    std::string value;
    bool ok;
    std::string message;
  };
  const Case cases[] = {
      {"0123456789abcdef0123456789abcdef", true, ""},  // what the clients make
      {std::string(16, 'x'), true, ""},
      {std::string(128, '~'), true, ""},
      {"", false, "must be 16 to 128 characters, got 0"},
      {std::string(15, 'x'), false, "got 15"},
      {std::string(129, 'x'), false, "got 129"},
      {"0123456789abcdef 0123456789abcdef", false, "character 17 is not"},
      {std::string("0123456789abcdef\x7f", 17), false, "printable ASCII"},
      {std::string("0123456789abcde\xc3\xa9", 17), false, "printable ASCII"},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckLaunchCredential(c.value, "SPGATE_LAUNCH_CREDENTIAL");
    if (c.ok) {
      EXPECT_THAT(s, IsOk()) << c.value;
    } else {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                              AllOf(HasSubstr("SPGATE_LAUNCH_CREDENTIAL"), HasSubstr(c.message))))
          << c.value;
      if (!c.value.empty()) {
        EXPECT_THAT(std::string(s.message()), Not(HasSubstr(c.value))) << "never echoed";
      }
    }
  }
}

}  // namespace
}  // namespace spgate
