// ParseTextFormat: a good file parses; each kind of mistake is refused naming the message
// type and the line and column of the first one.
#include "proto/text_format.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spgate/v1/gate.pb.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ParseTextFormatTest, AGoodFileParsesAndSaysWhereEachFieldWas) {
  v1::GateConfig c;
  c.set_max_length_cv(0.9);  // cleared first
  google::protobuf::TextFormat::ParseInfoTree where;
  ASSERT_THAT(ParseTextFormat("# gates\nmax_rs_wait_share: 0.3\n", &c, &where), IsOk());
  EXPECT_FALSE(c.has_max_length_cv());
  EXPECT_DOUBLE_EQ(c.max_rs_wait_share(), 0.3);
  EXPECT_EQ(where.GetLocation(v1::GateConfig::descriptor()->FindFieldByName("max_rs_wait_share"),
                              -1).line,
            1);
}

TEST(ParseTextFormatTest, EachMistakeIsNamedWithItsPlace) {
  struct Case {
    std::string text, want;
  };
  const Case cases[] = {
      {"max_length_cv: 0.2\nmax_cv: 0.3\n",
       "line 2 column 7: Message type \"spgate.v1.GateConfig\" has no field named \"max_cv\""},
      {"max_length_cv: high\n", "line 1 column"},
      {"max_length_cv 0.2 {\n", "line 1 column"},
      {"max_length_cv: 0.2\nmax_length_cv: 0.3\n", "line 2 column"},  // set twice
      // An unknown enum value is named where it stands, not where the next token does
      // (the tokenizer has read past it: the next line, or its next field).
      {"max_length_cv: 0.2\npolicy: BOGUS\nmax_length_cv: 0.3\n",
       "line 2 column 9: Unknown enumeration value of \"BOGUS\" for field \"policy\""},
      {"policy: BOGUS\n\n\n", "line 1 column 9: Unknown enumeration value"},
      {"policy: BOGUS", "line 1 column 9: Unknown enumeration value"},
      {"policy: BOGUS max_length_cv: 0.3", "line 1 column 9: Unknown enumeration value"},
      {"\tpolicy:\tBOGUS\n", "line 1 column 17: Unknown enumeration value"},
      // The value spelt as the next field's name: the value's place, not the field's.
      {"policy: max_length_cv\nmax_length_cv: 0.3\n", "line 1 column 9: Unknown enumeration"},
      // A comment that mentions the value is not the value.
      {"policy: BOGUS\n# BOGUS was the old value\nmax_length_cv: 0.3\n",
       "line 1 column 9: Unknown enumeration"},
      {"policy: BOGUS  # not BOGUS\nmax_length_cv: 0.3\n", "line 1 column 9: Unknown enumeration"},
  };
  for (const Case& c : cases) {
    v1::GateConfig out;
    EXPECT_THAT(ParseTextFormat(c.text, &out),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("not a valid spgate.v1.GateConfig in text format: "),
                               HasSubstr(c.want))))
        << c.text;
  }
}

}  // namespace
}  // namespace spgate
