// A bearer token's one text rule (common/bearer_token.h), table-driven: what the daemon's
// token files and every client accept alike, and the byte order mark a file may start with.
#include "common/bearer_token.h"

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

TEST(BearerTokenTest, VisibleAsciiOnlyAndTheTokenIsNeverShown) {
  struct Case {
    std::string token;
    std::string message;  // "": accepted
  };
  const Case cases[] = {
      {"c39c65e9621dfb92cac62f36443cc7ae", ""},
      {"!~token.with-punctuation_@:/=+", ""},
      {"", "where: empty token"},
      {std::string("LEAK\x01MEsecret", 13), "character 5 is byte 0x01, not printable ASCII"},
      {"correct horse battery staple", ""},  // a passphrase: a header carries spaces
      {"tab\tbed", "character 4 is byte 0x09"},
      {"del\x7f", "character 4 is byte 0x7f"},
      {"\xef\xbb\xbfSECRET", "character 1 is byte 0xef"},  // a mark inside a line is a byte
      {"caf\xc3\xa9", "character 4 is byte 0xc3"},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckBearerToken(c.token, "where");
    if (c.message.empty()) {
      EXPECT_THAT(s, IsOk()) << c.token;
      continue;
    }
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr(c.message), HasSubstr("where: "))))
        << c.token;
    if (c.token.size() > 4) {
      EXPECT_THAT(s.message(), Not(HasSubstr(c.token.substr(c.token.size() - 4)))) << c.token;
    }
  }
}

TEST(BearerTokenTest, ALeadingByteOrderMarkIsNotText) {
  EXPECT_EQ(WithoutByteOrderMark("\xef\xbb\xbf" "alice:T"), "alice:T");
  EXPECT_EQ(WithoutByteOrderMark("alice:T"), "alice:T");
  EXPECT_EQ(WithoutByteOrderMark("\xef\xbb"), "\xef\xbb");  // not a whole mark
  EXPECT_EQ(WithoutByteOrderMark(""), "");
  EXPECT_EQ(WithoutByteOrderMark("a\xef\xbb\xbf"), "a\xef\xbb\xbf");  // only at the start
}

}  // namespace
}  // namespace spgate
