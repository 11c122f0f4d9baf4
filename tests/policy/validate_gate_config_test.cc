// ValidateGateConfig (docs/design.md §3): every share/CV/headroom finite and in (0, upper] (upper
// is 10 for the CVs, 1 otherwise), every count in [1, 1e6], the re-enable margin below
// max_rs_wait_share; anything else is INVALID_ARGUMENT naming the field. Each field is
// swept over the same table of values, so a field added later gets every edge for free.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_policy.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct DoubleField {
  const char* name;
  double GateConfig::*member;
  double upper;
};

const DoubleField kDoubleFields[] = {
    {"max_length_cv", &GateConfig::max_length_cv, 10.0},
    {"max_rs_wait_share", &GateConfig::max_rs_wait_share, 1.0},
    {"bucket_target_cv", &GateConfig::bucket_target_cv, 10.0},
    {"rs_wait_reenable_margin", &GateConfig::rs_wait_reenable_margin, 1.0},
    {"memory_headroom", &GateConfig::memory_headroom, 1.0},
};

struct CountField {
  const char* name;
  int64_t GateConfig::*member;
};

const CountField kCountFields[] = {
    {"probe_interval_steps", &GateConfig::probe_interval_steps},
    {"min_dwell_steps", &GateConfig::min_dwell_steps},
    {"window_steps", &GateConfig::window_steps},
};

// A valid config in which `field` can take any value in its own range without tripping
// the margin rule: the margin is tiny while max_rs_wait_share is swept, and the share is
// at its maximum while the margin is swept.
GateConfig BaseFor(const std::string& field) {
  GateConfig c;
  if (field == "max_rs_wait_share") c.rs_wait_reenable_margin = 1e-12;
  if (field == "rs_wait_reenable_margin") c.max_rs_wait_share = 1.0;
  return c;
}

TEST(ValidateGateConfigTest, DefaultsAreValid) {
  EXPECT_THAT(ValidateGateConfig(GateConfig{}), IsOk());
}

TEST(ValidateGateConfigTest, DefaultsMatchSpec) {
  const GateConfig c;
  EXPECT_EQ(c.max_length_cv, 0.18);
  EXPECT_EQ(c.max_rs_wait_share, 0.22);
  EXPECT_EQ(c.bucket_target_cv, 0.15);
  EXPECT_EQ(c.rs_wait_reenable_margin, 0.03);
  EXPECT_EQ(c.probe_interval_steps, 200);
  EXPECT_EQ(c.min_dwell_steps, 20);
  EXPECT_EQ(c.window_steps, 50);
  EXPECT_EQ(c.memory_headroom, 0.90);
}

TEST(ValidateGateConfigTest, DoubleFieldsRejectNonFiniteAndNonPositive) {
  const double bad[] = {kNaN, -kNaN, kInf, -kInf, -1.0, -1e-300,
                        -std::numeric_limits<double>::denorm_min(), -0.0, 0.0,
                        std::numeric_limits<double>::lowest()};
  for (const DoubleField& f : kDoubleFields) {
    for (double v : bad) {
      GateConfig c = BaseFor(f.name);
      c.*f.member = v;
      EXPECT_THAT(ValidateGateConfig(c),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(f.name)))
          << f.name << " = " << v;
    }
  }
}

TEST(ValidateGateConfigTest, DoubleFieldsRejectJustOverUpperBound) {
  for (const DoubleField& f : kDoubleFields) {
    const double over[] = {std::nextafter(f.upper, kInf), f.upper * 1.0001, f.upper + 1.0,
                           1e300, std::numeric_limits<double>::max()};
    for (double v : over) {
      GateConfig c = BaseFor(f.name);
      c.*f.member = v;
      EXPECT_THAT(ValidateGateConfig(c),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr(f.name), HasSubstr("(0, "))))
          << f.name << " = " << v;
    }
  }
}

TEST(ValidateGateConfigTest, DoubleFieldsAcceptTheirWholeRange) {
  for (const DoubleField& f : kDoubleFields) {
    // The margin at its upper bound 1 can never be below max_rs_wait_share (also at
    // most 1), so its top is checked separately below.
    const double top = f.name == std::string("rs_wait_reenable_margin")
                           ? std::nextafter(1.0, 0.0)
                           : f.upper;
    const double good[] = {1e-9, 0.01, 0.5, std::nextafter(top, 0.0), top};
    for (double v : good) {
      GateConfig c = BaseFor(f.name);
      c.*f.member = v;
      EXPECT_THAT(ValidateGateConfig(c), IsOk()) << f.name << " = " << v;
    }
  }
}

TEST(ValidateGateConfigTest, CvFieldsGoToTen) {
  GateConfig c;
  c.max_length_cv = 10.0;
  c.bucket_target_cv = 10.0;
  EXPECT_THAT(ValidateGateConfig(c), IsOk());
  c.max_length_cv = 1.5;  // above 1 is legal for CVs only
  EXPECT_THAT(ValidateGateConfig(c), IsOk());
  c.memory_headroom = 1.5;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory_headroom")));
}

TEST(ValidateGateConfigTest, CountFieldsBounds) {
  struct Case {
    int64_t value;
    bool ok;
  };
  const Case cases[] = {
      {std::numeric_limits<int64_t>::min(), false},
      {-1'000'000, false},
      {-1, false},
      {0, false},
      {1, true},
      {2, true},
      {999'999, true},
      {1'000'000, true},
      {1'000'001, false},
      {int64_t{1} << 31, false},
      {std::numeric_limits<int64_t>::max(), false},
  };
  for (const CountField& f : kCountFields) {
    for (const Case& tc : cases) {
      GateConfig c;
      c.*f.member = tc.value;
      if (tc.ok) {
        EXPECT_THAT(ValidateGateConfig(c), IsOk()) << f.name << " = " << tc.value;
      } else {
        EXPECT_THAT(ValidateGateConfig(c),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             AllOf(HasSubstr(f.name), HasSubstr(std::to_string(tc.value)))))
            << f.name << " = " << tc.value;
      }
    }
  }
}

TEST(ValidateGateConfigTest, MessageCarriesTheRejectedValue) {
  GateConfig c;
  c.max_length_cv = 12.5;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("max_length_cv"), HasSubstr("12.5"))));
  c = GateConfig{};
  c.memory_headroom = kNaN;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("memory_headroom"), HasSubstr("nan"))));
  // In full: a value just past a bound must not print as the bound (%g's six digits).
  c = GateConfig{};
  c.max_length_cv = 10.000001;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 10.000001")));
  c = GateConfig{};
  c.max_rs_wait_share = 0.22;
  c.rs_wait_reenable_margin = 0.2200001;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rs_wait_reenable_margin (0.2200001) must be less than "
                                 "max_rs_wait_share (0.22)")));
}

// Several bad fields: the first in field order is named, so a client fixing errors one
// at a time converges.
TEST(ValidateGateConfigTest, FirstInvalidFieldIsNamed) {
  GateConfig c;
  c.window_steps = 0;
  c.memory_headroom = 2.0;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window_steps")));
  c.max_length_cv = kNaN;
  EXPECT_THAT(ValidateGateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_length_cv")));
}

TEST(ValidateGateConfigTest, MarginMustBeBelowMaxRsWaitShare) {
  struct Case {
    double max_rs_wait_share;
    double margin;
    bool ok;
  };
  const Case cases[] = {
      {0.22, 0.03, true},
      {0.22, 0.22, false},                       // equal: re-enable level 0, never resumes
      {0.22, std::nextafter(0.22, 1.0), false},  // just above
      {0.22, 0.5, false},
      {0.22, std::nextafter(0.22, 0.0), true},   // just below
      {0.05, 0.03, true},
      {0.03, 0.03, false},
      {0.02, 0.03, false},  // the default margin with a small threshold
      {1.0, 1.0, false},    // margin at its own upper bound can never pass
      {1.0, std::nextafter(1.0, 0.0), true},
  };
  for (const Case& tc : cases) {
    GateConfig c;
    c.max_rs_wait_share = tc.max_rs_wait_share;
    c.rs_wait_reenable_margin = tc.margin;
    if (tc.ok) {
      EXPECT_THAT(ValidateGateConfig(c), IsOk())
          << tc.max_rs_wait_share << " / " << tc.margin;
    } else {
      EXPECT_THAT(ValidateGateConfig(c),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("rs_wait_reenable_margin"),
                                 HasSubstr("max_rs_wait_share"))))
          << tc.max_rs_wait_share << " / " << tc.margin;
    }
  }
}

}  // namespace
}  // namespace spgate
