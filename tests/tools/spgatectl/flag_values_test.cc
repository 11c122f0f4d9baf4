// spgatectl flag values: every parser, table-driven, good and bad input. A refusal
// names the flag and quotes the value.
#include "tools/spgatectl/flag_values.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::ctl {
namespace {

using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(ParseDoubleFlag, AcceptsDecimalNumbers) {
  EXPECT_THAT(ParseDoubleFlag("max_length_cv", "0.2"), IsOkAndHolds(0.2));
  EXPECT_THAT(ParseDoubleFlag("max_length_cv", "1e-3"), IsOkAndHolds(1e-3));
  EXPECT_THAT(ParseDoubleFlag("max_length_cv", "-1"), IsOkAndHolds(-1.0));  // the server judges
}

TEST(ParseDoubleFlag, RefusesTextNamingTheFlag) {
  for (const char* bad : {"", "abc", "0.2x", "0,2"}) {
    EXPECT_THAT(ParseDoubleFlag("max_length_cv", bad),
                StatusIs(kInvalid, absl::StrCat("--max_length_cv: \"", bad, "\" is not a number")))
        << bad;
  }
}

TEST(ParseInt64Flag, AcceptsIntegersOnly) {
  EXPECT_THAT(ParseInt64Flag("window_steps", "50"), IsOkAndHolds(50));
  EXPECT_THAT(ParseInt64Flag("window_steps", "-3"), IsOkAndHolds(-3));
  for (const char* bad : {"", "1.5", "1e3", "ten", "99999999999999999999"}) {
    EXPECT_THAT(ParseInt64Flag("window_steps", bad),
                StatusIs(kInvalid, absl::StrCat("--window_steps: \"", bad, "\" is not an integer")))
        << bad;
  }
}

// One rule for every boolean flag (--force, --operator_settings); a bare one reads "true".
TEST(ParseBoolFlag, TrueFalseOneZero) {
  EXPECT_THAT(ParseBoolFlag("force", "true"), IsOkAndHolds(true));
  EXPECT_THAT(ParseBoolFlag("force", "1"), IsOkAndHolds(true));
  EXPECT_THAT(ParseBoolFlag("operator_settings", "false"), IsOkAndHolds(false));
  EXPECT_THAT(ParseBoolFlag("operator_settings", "0"), IsOkAndHolds(false));
  for (const char* bad : {"", "yes", "TRUE", "2"}) {
    EXPECT_THAT(ParseBoolFlag("operator_settings", bad),
                StatusIs(kInvalid, absl::StrCat("--operator_settings: \"", bad,
                                                "\" is not true or false")))
        << bad;
  }
}

TEST(ParseInt32Flag, RefusesOutOfRange) {
  EXPECT_THAT(ParseInt32Flag("group", "7"), IsOkAndHolds(7));
  EXPECT_THAT(ParseInt32Flag("group", "4294967296"),
              StatusIs(kInvalid, HasSubstr("--group: \"4294967296\"")));
}

TEST(ParseBytesFlag, Table) {
  struct Case {
    const char* in;
    uint64_t want;
  };
  const Case cases[] = {
      {"0", 0},
      {"85899345920", 85899345920},
      {"512B", 512},
      {"1KiB", 1024},
      {"80GiB", uint64_t{80} << 30},
      {"80 GiB", uint64_t{80} << 30},
      {"80gib", uint64_t{80} << 30},
      {"1.5GiB", uint64_t{3} << 29},
      {"2TiB", uint64_t{2} << 40},
      {"1MB", 1000000},
      {"80GB", 80000000000},
  };
  for (const Case& c : cases) EXPECT_THAT(ParseBytesFlag("budget", c.in), IsOkAndHolds(c.want)) << c.in;
}

TEST(ParseBytesFlag, RefusesBadUnitsAndFractionsOfAByte) {
  for (const char* bad : {"", "GiB", "80XB", "1.5", "-1", "80 G i B"}) {
    EXPECT_THAT(ParseBytesFlag("budget", bad),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("--budget: \"", bad,
                                                          "\" is not a byte count"))))
        << bad;
  }
  EXPECT_THAT(ParseBytesFlag("peak_sp", "20000000TiB"),
              StatusIs(kInvalid, "--peak_sp: \"20000000TiB\" is too large"));
}

TEST(ParseDurationFlag, Table) {
  EXPECT_THAT(ParseDurationFlag("for", "10m"), IsOkAndHolds(absl::Minutes(10)));
  EXPECT_THAT(ParseDurationFlag("for", "1h30m"), IsOkAndHolds(absl::Minutes(90)));
  EXPECT_THAT(ParseDurationFlag("for", "250ms"), IsOkAndHolds(absl::Milliseconds(250)));
  EXPECT_THAT(ParseDurationFlag("for", "2d"), IsOkAndHolds(absl::Hours(48)));
  EXPECT_THAT(ParseDurationFlag("for", "-5s"), IsOkAndHolds(absl::Seconds(-5)));  // the server judges
  for (const char* bad : {"", "10", "10 minutes", "xd", "1d2h", "5parsecs"}) {
    EXPECT_THAT(ParseDurationFlag("for", bad),
                StatusIs(kInvalid, absl::StrCat("--for: \"", bad,
                                                "\" is not a duration (e.g. 30s, 10m, 1h30m, 2d)")))
        << bad;
  }
  EXPECT_THAT(ParseDurationFlag("for", "inf"),
              StatusIs(kInvalid, "--for: \"inf\" is not a finite duration"));
}

TEST(ParseModeFlag, Table) {
  EXPECT_THAT(ParseModeFlag("mode", "sp"), IsOkAndHolds(v1::SEQUENCE_PARALLEL));
  EXPECT_THAT(ParseModeFlag("mode", "SP"), IsOkAndHolds(v1::SEQUENCE_PARALLEL));
  EXPECT_THAT(ParseModeFlag("mode", "tp"), IsOkAndHolds(v1::TENSOR_PARALLEL_ONLY));
  EXPECT_THAT(ParseModeFlag("mode", "tp_only"), IsOkAndHolds(v1::TENSOR_PARALLEL_ONLY));
  EXPECT_THAT(ParseModeFlag("mode", "fast"),
              StatusIs(kInvalid, "--mode: \"fast\" is not a mode (want sp or tp)"));
}

TEST(ParseInt64ListFlag, ParsesAndNamesTheBadItem) {
  EXPECT_THAT(ParseInt64ListFlag("lengths", "512,4096, 16384"),
              IsOkAndHolds(ElementsAre(512, 4096, 16384)));
  EXPECT_THAT(ParseInt64ListFlag("lengths", "7"), IsOkAndHolds(ElementsAre(7)));
  EXPECT_THAT(ParseInt64ListFlag("lengths", ""), StatusIs(kInvalid, "--lengths: empty list"));
  EXPECT_THAT(ParseInt64ListFlag("lengths", "512,4k"),
              StatusIs(kInvalid, "--lengths: item 2 \"4k\" is not an integer"));
  EXPECT_THAT(ParseInt64ListFlag("lengths", "512,,8"),
              StatusIs(kInvalid, "--lengths: item 2 is empty"));
}

TEST(ParseGateFieldListFlag, KnowsTheGateConfigFields) {
  EXPECT_THAT(ParseGateFieldListFlag("clear", "max_length_cv,window_steps"),
              IsOkAndHolds(ElementsAre("max_length_cv", "window_steps")));
  EXPECT_THAT(ParseGateFieldListFlag("clear", "max_length_cv,speed"),
              StatusIs(kInvalid, HasSubstr("--clear: \"speed\" is not a GateConfig field (one of "
                                           "max_length_cv, max_rs_wait_share,")));
}

TEST(FormatBytes, Table) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{80} << 30), "80.0 GiB");
}

TEST(TokenFromFileText, BareOrNamedFirstCredential) {
  EXPECT_THAT(TokenFromFileText("/t", "s3cret\n"), IsOkAndHolds(std::string("s3cret")));
  EXPECT_THAT(TokenFromFileText("/t", "# ops\n\nalice:s3cret\nbob:other\n"),
              IsOkAndHolds(std::string("s3cret")));
  EXPECT_THAT(TokenFromFileText("/t", "  \n# nothing\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--token_file: \"/t\" holds no token"));
  EXPECT_THAT(TokenFromFileText("/t", "alice:\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--token_file: \"/t\" holds no token"));
  // A passphrase keeps its spaces (a header carries them).
  EXPECT_THAT(TokenFromFileText("/t", "alice:correct horse\n"),
              IsOkAndHolds(std::string("correct horse")));
  // A byte order mark an editor wrote is not text: the name is still taken off.
  EXPECT_THAT(TokenFromFileText("/t", "\xef\xbb\xbf" "alice:s3cret\n"),
              IsOkAndHolds(std::string("s3cret")));
  // A byte a header cannot carry is refused before any call (gRPC aborted the process on
  // it, printing the header), and the message does not show the token.
  for (const char* text : {"alice:LEAK\x01ME\n", "LEAK\xc3\xa9ME\n"}) {
    const absl::StatusOr<std::string> got = TokenFromFileText("/t", text);
    EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument,
                              HasSubstr("--token_file: \"/t\": the token's character")))
        << text;
    EXPECT_THAT(got.status().message(), Not(HasSubstr("LEAK"))) << text;
  }
}

}  // namespace
}  // namespace spgate::ctl
