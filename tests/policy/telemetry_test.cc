// The telemetry range rules' bounds (docs/design.md §2, "Range rules"): the seconds floor,
// waits within their step or micro-batch, tokens within the plan, derived rates finite,
// and the group-record fields. Table-driven, pure; the plain field rules are in
// group_state_test.cc.
#include "policy/telemetry.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

TEST(TelemetryBoundsTest, StepRecordWithinItsPlanAndFloor) {
  const StepTelemetryValues ok{.step = 3, .mode = 1, .step_time_s = 0.5, .rs_wait_s = 0.5,
                               .all_gather_s = 0.1, .norm_stall_s = 0.0,
                               .effective_tokens = 8192, .padding_tokens = 4};
  EXPECT_THAT(ValidateStepTelemetry(ok, {.plan_tokens = 8192}), IsOk()) << "at the bound";
  EXPECT_THAT(ValidateStepTelemetry(ok), IsOk()) << "plan not known: tokens unbounded";
  StepTelemetryValues floor = ok;
  floor.step_time_s = kMinTelemetrySeconds;
  floor.rs_wait_s = floor.all_gather_s = 0;
  EXPECT_THAT(ValidateStepTelemetry(floor, {.plan_tokens = 8192}), IsOk()) << "at the floor";

  struct Case {
    StepTelemetryValues v;
    int64_t plan_tokens;
    const char* message;
  };
  auto with = [&](auto f) {
    StepTelemetryValues v = ok;
    f(v);
    return v;
  };
  for (const Case& c : std::vector<Case>{
           // The poisoning record: the largest tokens over the smallest positive double.
           {with([](auto& v) {
              v.effective_tokens = kHuge;
              v.step_time_s = 5e-324;
              v.rs_wait_s = v.all_gather_s = 0;
            }),
            8192, "telemetry.step_time_s: must be finite and >= 1e-06, got 4.94066e-324"},
           {with([](auto& v) { v.effective_tokens = kHuge; }), 8192,
            "telemetry.effective_tokens: must be in [0, 2^53 - 1] (exact as a double), got "
            "9223372036854775807"},
           {with([](auto& v) { v.effective_tokens = kMaxTelemetryCount; }), 8192,
            "telemetry.effective_tokens: 9007199254740991 exceeds the plan's 8192 tokens "
            "for the step"},
           {with([](auto& v) { v.padding_tokens = kMaxTelemetryCount + 1; }), -1,
            "telemetry.padding_tokens: must be in [0, 2^53 - 1]"},
           {with([](auto& v) { v.step = kMaxTelemetryCount + 1; }), -1,
            "telemetry.step: must be in [0, 2^53 - 1]"},
           {with([](auto& v) { v.effective_tokens = 8193; }), 8192,
            "telemetry.effective_tokens: 8193 exceeds"},
           {with([](auto& v) { v.step_time_s = 9e-7; v.rs_wait_s = v.all_gather_s = 0; }), -1,
            "telemetry.step_time_s"},
           {with([](auto& v) { v.step_time_s = INFINITY; }), -1, "telemetry.step_time_s"},
           {with([](auto& v) { v.rs_wait_s = 0.6; }), -1,
            "telemetry.rs_wait_s: must be finite, >= 0 and at most step_time_s 0.5, got 0.6"},
           {with([](auto& v) { v.all_gather_s = 0.51; }), -1, "telemetry.all_gather_s"},
           {with([](auto& v) { v.norm_stall_s = 1; }), -1, "telemetry.norm_stall_s"},
           {with([](auto& v) { v.all_reduce_s = 0.7; }), -1,
            "telemetry.all_reduce_s: must be finite, >= 0 and at most step_time_s 0.5, got 0.7"},
           {with([](auto& v) { v.all_reduce_s = -0.1; }), -1, "telemetry.all_reduce_s"},
           {with([](auto& v) { v.straggler_s = NAN; }), -1, "telemetry.straggler_s"},
           {with([](auto& v) { v.straggler_s = 0.6; }), -1,
            "telemetry.straggler_s: must be finite, >= 0 and at most step_time_s 0.5, got 0.6"},
       }) {
    EXPECT_THAT(ValidateStepTelemetry(c.v, {.plan_tokens = c.plan_tokens}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.message;
  }
}

// Tokens no plan bounds (its decision is no longer cached) over the floor: the largest
// count a record may carry, exact as a double, over the floor is a finite rate.
TEST(TelemetryBoundsTest, UnboundedTokensOverTheFloorStayFinite) {
  const StepTelemetryValues v{.step = kMaxTelemetryCount, .mode = 2,
                              .step_time_s = kMinTelemetrySeconds,
                              .effective_tokens = kMaxTelemetryCount};
  EXPECT_THAT(ValidateStepTelemetry(v), IsOk());
  EXPECT_TRUE(std::isfinite(static_cast<double>(v.effective_tokens) / v.step_time_s));
  EXPECT_EQ(static_cast<int64_t>(static_cast<double>(v.effective_tokens)), v.effective_tokens);
}

TEST(TelemetryBoundsTest, MicrobatchRecordWithinItsPlanAndCompute) {
  const MicrobatchTelemetryValues a{.id = 0, .forward_s = 0.1, .backward_s = 0.2,
                                    .rs_wait_s = 0.3, .all_gather_s = 0.05,
                                    .effective_tokens = 100};
  MicrobatchTelemetryValues b = a;
  b.id = 1;
  b.effective_tokens = 900;
  const std::vector<int64_t> plan{100, 900};
  const TelemetryBounds bounds{.microbatch_tokens = plan};
  EXPECT_THAT(ValidateMicrobatchTelemetry(std::vector{b, a}, 2, bounds), IsOk());
  const std::vector<int64_t> unknown_first{-1, 900};
  MicrobatchTelemetryValues big_a = a;
  big_a.effective_tokens = 1 << 20;
  EXPECT_THAT(ValidateMicrobatchTelemetry(std::vector{big_a, b}, 2,
                                          {.microbatch_tokens = unknown_first}),
              IsOk())
      << "-1: the plan gave no lengths for micro-batch 0";

  struct Case {
    MicrobatchTelemetryValues v;
    const char* message;
  };
  auto with = [&](auto f) {
    MicrobatchTelemetryValues v = b;
    f(v);
    return v;
  };
  for (const Case& c : std::vector<Case>{
           {with([](auto& v) {
              v.effective_tokens = kHuge;
              v.forward_s = 5e-324;
              v.backward_s = v.rs_wait_s = v.all_gather_s = 0;
            }),
            "telemetry.micro_batches[id 1]: forward_s + backward_s must be finite and >= 1e-06"},
           {with([](auto& v) { v.effective_tokens = kHuge; }),
            "telemetry.micro_batches[id 1].effective_tokens: must be in [0, 2^53 - 1]"},
           {with([](auto& v) { v.effective_tokens = 901; }),
            "telemetry.micro_batches[id 1].effective_tokens: 901 exceeds the "
            "plan's 900 tokens for micro-batch 1"},
           {with([](auto& v) { v.forward_s = 1e308; v.backward_s = 1e308; }),
            "forward_s + backward_s must be finite"},
           {with([](auto& v) { v.rs_wait_s = 0.31; }),
            "telemetry.micro_batches[id 1].rs_wait_s: 0.31 is more than the micro-batch's "
            "forward_s + backward_s 0.3"},
           {with([](auto& v) { v.all_gather_s = 1; }),
            "telemetry.micro_batches[id 1].all_gather_s"},
           {with([](auto& v) { v.all_reduce_s = 0.31; }),
            "telemetry.micro_batches[id 1].all_reduce_s: 0.31 is more than the micro-batch's "
            "forward_s + backward_s 0.3"},
           {with([](auto& v) { v.all_reduce_s = -1; }),
            "telemetry.micro_batches[id 1].all_reduce_s: must be finite and >= 0"},
           {with([](auto& v) { v.straggler_s = INFINITY; }),
            "telemetry.micro_batches[id 1].straggler_s: must be finite and >= 0"},
           {with([](auto& v) { v.straggler_s = 0.4; }),
            "telemetry.micro_batches[id 1].straggler_s: 0.4 is more than"},
       }) {
    EXPECT_THAT(ValidateMicrobatchTelemetry(std::vector{a, c.v}, 2, bounds),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.message;
  }
}

// A rank's busy time leaves out every collective its record times, TP-only's all-reduce
// included; a step's straggler delay is the slowest rank's lead over the median rank.
TEST(StragglerSecondsTest, SlowestRankOverTheMedian) {
  EXPECT_DOUBLE_EQ(BusySeconds(1.0, 0.1, 0.2, 0.05, 0.15), 0.5);
  EXPECT_DOUBLE_EQ(BusySeconds(1.0, 0.5, 0.5, 0.5, 0.5), 0.0) << "never negative";
  struct Case {
    std::vector<double> busy;
    double want;
  };
  for (const Case& c : std::vector<Case>{
           {{}, 0.0},
           {{0.7}, 0.0},                      // one rank: no one to lag behind
           {{0.5, 0.8}, 0.0},                 // two: the upper median is the slowest
           {{0.5, 0.5, 0.5, 0.5}, 0.0},       // balanced
           {{0.5, 0.9, 0.5, 0.5}, 0.4},       // one straggler among four
           {{0.9, 0.5, 0.6, 0.5, 0.4}, 0.4},  // odd count: the median is 0.5
           {{1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.2}, 0.7},  // two slow ranks of eight
           {{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, 0.3},  // a steady spread
       }) {
    std::vector<double> busy = c.busy;
    EXPECT_DOUBLE_EQ(StragglerSeconds(busy), c.want) << ::testing::PrintToString(c.busy);
  }
}

TEST(TelemetryBoundsTest, GroupRecordFields) {
  struct Case {
    int ranks, slowest, peak, group_size;
    const char* message;  // nullptr: accepted
  };
  for (const Case& c : std::vector<Case>{
           {0, 0, 0, 4, nullptr},
           {1, 7, -3, 4, nullptr},  // one rank's record: the rank fields are not read
           {4, 3, 0, 4, nullptr},
           {1, 0, 0, 1, nullptr},
           {-1, 0, 0, 4, "telemetry.ranks: must be 0 or 1"},
           {8, 0, 0, 4, "the group's size 4 (the group's record), got 8"},
           {2, 0, 0, 4, "got 2"},
           {4, 4, 0, 4, "telemetry.slowest_rank: must be in [0, ranks=4), got 4"},
           {4, -1, 0, 4, "telemetry.slowest_rank"},
           {4, 0, 4, 4, "telemetry.peak_memory_rank: must be in [0, ranks=4), got 4"},
       }) {
    const absl::Status s = ValidateGroupRecord(c.ranks, c.slowest, c.peak, c.group_size);
    if (c.message == nullptr) {
      EXPECT_THAT(s, IsOk()) << c.ranks << " of " << c.group_size;
    } else {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
    }
  }
}

}  // namespace
}  // namespace spgate
