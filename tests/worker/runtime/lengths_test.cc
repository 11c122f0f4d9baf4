// Length sources (worker/runtime/lengths.h): seeded distributions, files, shifts,
// the maximum length and the errors that name the flag.
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/lengths.h"

namespace spgate::runtime {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(LengthSourceTest, SameSeedSameStreamAndDifferentSeedDifferentStream) {
  for (const char* spec : {"lognormal:mean=4096,sigma=0.8",
                           "bimodal:short=512,long=16384,p_long=0.2",
                           "uniform:min=128,max=8192"}) {
    ASSERT_OK_AND_ASSIGN(auto a, ParseLengthSource(spec, 7, 1 << 20));
    ASSERT_OK_AND_ASSIGN(auto b, ParseLengthSource(spec, 7, 1 << 20));
    ASSERT_OK_AND_ASSIGN(auto c, ParseLengthSource(spec, 8, 1 << 20));
    const auto va = Draw(*a, 200);
    EXPECT_EQ(va, Draw(*b, 200)) << spec;
    EXPECT_NE(va, Draw(*c, 200)) << spec;
  }
}

TEST(LengthSourceTest, DistributionsHaveTheirParameters) {
  ASSERT_OK_AND_ASSIGN(auto ln, ParseLengthSource("lognormal:mean=4096,sigma=0.5", 1, 1 << 24));
  double sum = 0;
  const auto v = Draw(*ln, 20000);
  for (int64_t x : v) sum += x;
  EXPECT_NEAR(sum / v.size(), 4096, 4096 * 0.03);  // the arithmetic mean is the parameter

  ASSERT_OK_AND_ASSIGN(auto bi, ParseLengthSource("bimodal:short=100,long=1000,p_long=0.25,jitter=0",
                                                  1, 1 << 24));
  int longs = 0;
  for (int64_t x : Draw(*bi, 8000)) {
    ASSERT_TRUE(x == 100 || x == 1000) << x;
    longs += x == 1000;
  }
  EXPECT_NEAR(longs / 8000.0, 0.25, 0.02);

  ASSERT_OK_AND_ASSIGN(auto un, ParseLengthSource("uniform:min=3,max=5", 1, 1 << 24));
  for (int64_t x : Draw(*un, 300)) EXPECT_TRUE(x >= 3 && x <= 5) << x;
}

TEST(LengthSourceTest, ClampsToTheMaximumLength) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("uniform:min=50,max=500", 3, 100));
  for (int64_t x : Draw(*s, 200)) EXPECT_LE(x, 100);
}

TEST(LengthSourceTest, DistributionsHaveNoCycle) {
  for (const char* spec : {"lognormal:mean=4096,sigma=0.8",
                           "bimodal:short=512,long=16384,p_long=0.2", "uniform:min=1,max=9"}) {
    ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource(spec, 1, 1 << 20));
    EXPECT_EQ(s->cycle_length(), 0) << spec;
  }
}

TEST(LengthSourceTest, FileIsReplayedInOrderAndCycled) {
  const std::string path = ::testing::TempDir() + "/lengths.txt";
  {
    std::ofstream f(path);
    f << "# a trace\n7\n\n300\n 12 \n";
  }
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("file:" + path, 99, 1000));
  EXPECT_EQ(Draw(*s, 7), (std::vector<int64_t>{7, 300, 12, 7, 300, 12, 7}));
  EXPECT_EQ(s->cycle_length(), 3);
  {
    std::ofstream f(path);
    f << "7\nseven\n";
  }
  EXPECT_THAT(ParseLengthSource("file:" + path, 1, 1000).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(ParseLengthSource("file:/nonexistent/x", 1, 1000).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--lengths")));
}

// shift: the first N lengths from one source, the rest from the other; bad specs named.
TEST(LengthSourceTest, ShiftSwitchesSourcesAfterN) {
  ASSERT_OK_AND_ASSIGN(auto s, ParseLengthSource("shift:after=5|uniform:min=3,max=3|uniform:min=9,max=9",
                                                 1, 1000));
  EXPECT_EQ(Draw(*s, 8), (std::vector<int64_t>{3, 3, 3, 3, 3, 9, 9, 9}));
  EXPECT_EQ(s->cycle_length(), 0);
  EXPECT_EQ(s->Describe(), "shift:after=5|uniform:min=3,max=3|uniform:min=9,max=9");
  for (const char* bad : {"shift:after=5|uniform:min=3,max=3", "shift:after=-1|uniform:min=3,max=3|"
                          "uniform:min=9,max=9", "shift:5|uniform:min=3,max=3|uniform:min=9,max=9",
                          "shift:after=5|uniform:min=3,max=3|gamma:k=1",
                          "shift:after=5|shift:after=1|a|b|uniform:min=9,max=9"}) {
    EXPECT_THAT(ParseLengthSource(bad, 1, 1000).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")))
        << bad;
  }
}

TEST(LengthSourceTest, BadSpecsNameTheFlagAndTheProblem) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"gaussian:mean=3", "unknown distribution"},
      {"lognormal:mean=4096", "missing sigma"},
      {"lognormal:mean=4096,sigma=0.8,skew=1", "unknown parameter skew"},
      {"lognormal:mean=4096,sigma=0.8,sigma=2", "sigma= is given twice"},
      {"lognormal:mean=abc,sigma=1", "not NAME=NUMBER"},
      {"bimodal:short=512,long=100,p_long=0.2", "short <= long"},
      {"bimodal:short=512,long=1000,p_long=1.5", "p_long"},
      {"uniform:min=10,max=5", "min <= max"},
      {"4096", "KIND:PARAMS"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseLengthSource(c.spec, 1, 1 << 20).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("--lengths="), HasSubstr(c.message))))
        << c.spec;
  }
}

}  // namespace
}  // namespace spgate::runtime
