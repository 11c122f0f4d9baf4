// The shared per-group rules: AdvanceGroupState (how a decision moves a group's state),
// GroupPolicyState (the wait-share window's admission rule), ConfigSchedule and the step
// telemetry checks. Table-driven, pure.
#include "policy/group_state.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/config_schedule.h"
#include "policy/telemetry.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

struct AdvanceCase {
  const char* name;
  bool in_fallback;
  Decision decision;
  bool want_fallback;
  bool want_flip;  // rs_wait_changed_step moves to this step
  bool want_reset;
};

class AdvanceGroupStateTest : public ::testing::TestWithParam<AdvanceCase> {};

TEST_P(AdvanceGroupStateTest, TransitionDependsOnlyOnStateAndDecision) {
  const AdvanceCase& c = GetParam();
  GroupGateState s;
  s.has_decision = true;
  s.last_step = 9;
  s.mode = c.in_fallback ? Mode::kTensorParallelOnly : Mode::kSequenceParallel;
  s.rs_wait_fallback = c.in_fallback;
  s.rs_wait_changed_step = 3;
  const GateOutcome out = AdvanceGroupState(s, 10, c.decision);
  EXPECT_EQ(out.decision, c.decision);
  EXPECT_EQ(out.next.last_step, 10);
  EXPECT_EQ(out.next.mode, c.decision.mode);
  EXPECT_EQ(out.next.reason, c.decision.reason);
  EXPECT_EQ(out.next.rs_wait_fallback, c.want_fallback);
  EXPECT_EQ(out.next.rs_wait_changed_step, c.want_flip ? 10 : 3);
  EXPECT_EQ(out.reset_rs_wait_window, c.want_reset);
  EXPECT_EQ(out.next.mode_switches, s.mode != c.decision.mode ? 1 : 0);
  EXPECT_EQ(out.next.last_sp_step,
            c.decision.mode == Mode::kSequenceParallel ? 10 : s.last_sp_step);
}

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;

INSTANTIATE_TEST_SUITE_P(
    Reasons, AdvanceGroupStateTest,
    ::testing::Values(
        AdvanceCase{"EnterOnRsWait", false, {kTp, Reason::kRsWait}, true, true, true},
        AdvanceCase{"StayOnRsWait", true, {kTp, Reason::kRsWait}, true, false, false},
        AdvanceCase{"ProbeInFallback", true, {kSp, Reason::kProbe}, true, false, false},
        AdvanceCase{"ProbeOutsideEntersWithoutReset", false, {kSp, Reason::kProbe}, true, true,
                    false},
        AdvanceCase{"ResumeOnGatesPassed", true, {kSp, Reason::kGatesPassed}, false, true, false},
        AdvanceCase{"GatesPassedOutside", false, {kSp, Reason::kGatesPassed}, false, false, false},
        AdvanceCase{"LengthCvKeepsFallback", true, {kTp, Reason::kLengthCv}, true, false, false},
        AdvanceCase{"PinKeepsFallback", true, {kSp, Reason::kPinned}, true, false, false},
        AdvanceCase{"MemoryOutside", false, {kSp, Reason::kMemoryRequiresSp}, false, false,
                    false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GroupPolicyStateTest, OnlySpStepsAndNotStaleOnesEnterTheWindow) {
  GateConfig c;
  c.window_steps = 4;
  GroupPolicyState g;
  g.ObserveRsWaitShare(0, Mode::kTensorParallelOnly, 0.9, c.window_steps);
  EXPECT_EQ(g.rs_wait().samples, 0);
  for (int64_t s = 0; s < 3; ++s) g.ObserveRsWaitShare(s, Mode::kSequenceParallel, 0.5, 4);
  // Step 5 enters the RS_WAIT fallback: the window restarts.
  const GateOutcome out = g.Decide(c, BatchFacts{.step = 5}, std::nullopt);
  ASSERT_EQ(out.decision.reason, Reason::kRsWait);
  EXPECT_EQ(g.rs_wait().samples, 0);
  // Step 4 was decided before the fallback began; its late sample is not a probe's.
  g.ObserveRsWaitShare(4, Mode::kSequenceParallel, 0.5, 4);
  EXPECT_EQ(g.rs_wait().samples, 0);
  g.ObserveRsWaitShare(6, Mode::kSequenceParallel, 0.01, 4);
  EXPECT_EQ(g.rs_wait().samples, 1);
}

TEST(GroupPolicyStateTest, AdoptMovesTheStateAsDecideWould) {
  GateConfig c;
  c.window_steps = 4;
  GroupPolicyState decided, adopted;
  for (GroupPolicyState* g : {&decided, &adopted}) {
    for (int64_t s = 0; s < 3; ++s) g->ObserveRsWaitShare(s, Mode::kSequenceParallel, 0.5, 4);
  }
  const GateOutcome out = decided.Decide(c, BatchFacts{.step = 3}, std::nullopt);
  adopted.Adopt(3, out.decision, c);
  EXPECT_EQ(adopted.gate().rs_wait_fallback, decided.gate().rs_wait_fallback);
  EXPECT_EQ(adopted.gate().rs_wait_changed_step, decided.gate().rs_wait_changed_step);
  EXPECT_EQ(adopted.rs_wait().samples, decided.rs_wait().samples);
}

TEST(GroupPolicyStateTest, PeekChangesNothing) {
  GroupPolicyState g;
  g.ObserveRsWaitShare(0, Mode::kSequenceParallel, 0.9, 50);
  const GateOutcome peek = g.Peek(GateConfig{}, BatchFacts{.step = 1}, std::nullopt);
  EXPECT_EQ(peek.decision.reason, Reason::kRsWait);
  EXPECT_FALSE(g.gate().has_decision);
  EXPECT_EQ(g.rs_wait().samples, 1);
}

// A group in the RS_WAIT fallback waits probe_interval_steps after its last SP step to
// measure again. A config that raises the level SP resumes below (max_rs_wait_share -
// margin) makes the probe due at its next decision, by Decide, Peek and Adopt alike; one
// that lowers it, or changes another field, does not.
TEST(GroupPolicyStateTest, ARaisedResumeLevelMakesTheProbeDue) {
  struct Case {
    const char* name;
    double max_rs_wait_share, margin, max_length_cv;
    Reason want;
  };
  const GateConfig before;  // 0.22 - 0.03 by default
  const Case cases[] = {
      {"threshold raised", 0.5, before.rs_wait_reenable_margin, before.max_length_cv,
       Reason::kProbe},
      {"margin narrowed", before.max_rs_wait_share, 0.01, before.max_length_cv,
       Reason::kProbe},
      {"threshold lowered", 0.2, before.rs_wait_reenable_margin, before.max_length_cv,
       Reason::kRsWait},
      {"another field", before.max_rs_wait_share, before.rs_wait_reenable_margin, 1.5,
       Reason::kRsWait},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GateConfig after = before;
    after.max_rs_wait_share = c.max_rs_wait_share;
    after.rs_wait_reenable_margin = c.margin;
    after.max_length_cv = c.max_length_cv;
    ASSERT_THAT(ValidateGateConfig(after), IsOk());
    GroupPolicyState decided;
    for (int64_t s = 0; s < 3; ++s) {  // SP steps whose wait shares come in late, high
      ASSERT_EQ(decided.Decide(before, BatchFacts{.step = s}, std::nullopt).decision.mode,
                Mode::kSequenceParallel);
    }
    for (int64_t s = 0; s < 3; ++s) {
      decided.ObserveRsWaitShare(s, Mode::kSequenceParallel, 0.3, before.window_steps);
    }
    ASSERT_EQ(decided.Decide(before, BatchFacts{.step = 3}, std::nullopt).decision.reason,
              Reason::kRsWait);  // tripped: the window is empty until a probe
    ASSERT_EQ(decided.Decide(before, BatchFacts{.step = 4}, std::nullopt).decision.reason,
              Reason::kRsWait);
    GroupPolicyState adopted = decided;
    std::vector<GateCheck> trace;
    EXPECT_EQ(decided.Peek(after, BatchFacts{.step = 5}, std::nullopt, nullptr, &trace)
                  .decision.reason,
              c.want);
    const GateOutcome out = decided.Decide(after, BatchFacts{.step = 5}, std::nullopt);
    EXPECT_EQ(out.decision.reason, c.want);
    adopted.Adopt(5, out.decision, after);
    EXPECT_EQ(adopted.gate().last_sp_step, decided.gate().last_sp_step);
    // Due once: the next decision under the same config waits for the interval again.
    if (c.want == Reason::kProbe) {
      EXPECT_EQ(decided.Decide(after, BatchFacts{.step = 6}, std::nullopt).decision.reason,
                Reason::kRsWait);
    }
  }
}

// Adopt goes through the same rule: a tripped group that adopts a decision made elsewhere
// under a raised level (here the length-CV gate's TP-only, which runs no SP) probes at
// its next decision, as the group that decided it does.
TEST(GroupPolicyStateTest, AdoptingUnderARaisedLevelMakesTheProbeDueToo) {
  const GateConfig before;
  GateConfig after = before;
  after.max_rs_wait_share = 0.5;
  GroupPolicyState decided;
  for (int64_t s = 0; s < 3; ++s) decided.Decide(before, BatchFacts{.step = s}, std::nullopt);
  for (int64_t s = 0; s < 3; ++s) {
    decided.ObserveRsWaitShare(s, Mode::kSequenceParallel, 0.3, before.window_steps);
  }
  ASSERT_EQ(decided.Decide(before, BatchFacts{.step = 3}, std::nullopt).decision.reason,
            Reason::kRsWait);
  GroupPolicyState adopted = decided;
  const BatchFacts uneven{.step = 4, .length_cv = 5.0};  // over max_length_cv: TP-only
  const GateOutcome out = decided.Decide(after, uneven, std::nullopt);
  ASSERT_EQ(out.decision.reason, Reason::kLengthCv);
  adopted.Adopt(4, out.decision, after);
  EXPECT_EQ(adopted.gate().last_sp_step, decided.gate().last_sp_step);
  EXPECT_EQ(adopted.Decide(after, BatchFacts{.step = 5}, std::nullopt).decision.reason,
            Reason::kProbe);
  EXPECT_EQ(decided.Decide(after, BatchFacts{.step = 5}, std::nullopt).decision.reason,
            Reason::kProbe);
}

// While a tripped group waits, the trace names the step its probe is due and shows no
// value: nothing was compared.
TEST(GroupPolicyStateTest, WaitingForAProbeShowsNoValues) {
  GateConfig c;
  GroupPolicyState g;
  for (int64_t s = 0; s < 3; ++s) g.Decide(c, BatchFacts{.step = s}, std::nullopt);
  for (int64_t s = 0; s < 3; ++s) {
    g.ObserveRsWaitShare(s, Mode::kSequenceParallel, 0.3, c.window_steps);
  }
  g.Decide(c, BatchFacts{.step = 3}, std::nullopt);  // trips; step 2 was the last SP step
  std::vector<GateCheck> trace;
  g.Peek(c, BatchFacts{.step = 4}, std::nullopt, nullptr, &trace);
  const auto rs = std::find_if(trace.begin(), trace.end(),
                               [](const GateCheck& x) { return x.gate == "rs_wait"; });
  ASSERT_NE(rs, trace.end());
  EXPECT_FALSE(rs->observed.has_value());
  EXPECT_FALSE(rs->threshold.has_value());
  EXPECT_THAT(rs->detail, HasSubstr("waiting for a probe (due at step 202"));
}

TEST(ConfigScheduleTest, LookupPruneAndReplace) {
  GateConfig a, b, c;
  b.max_length_cv = 0.3;
  c.max_length_cv = 0.4;
  ConfigSchedule s(a, 1);
  s.Schedule(b, 2, 10);
  s.Schedule(c, 3, 20);
  EXPECT_EQ(s.At(9).version, 1);
  EXPECT_EQ(s.At(10).version, 2);
  EXPECT_EQ(s.At(25).version, 3);
  s.Schedule(b, 4, 15);  // a newer update from 15 on replaces the one from 20
  EXPECT_EQ(s.At(25).version, 4);
  EXPECT_EQ(s.size(), 3u);
  s.Prune(16);
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.At(0).version, 4) << "older steps get the oldest config kept";
  EXPECT_EQ(s.latest().effective_from_step, 15);
}

TEST(ValidateStepTelemetryTest, EveryRuleNamesItsField) {
  const StepTelemetryValues ok{.step = 1, .mode = 1, .step_time_s = 0.5};
  EXPECT_THAT(ValidateStepTelemetry(ok), IsOk());
  struct Case {
    StepTelemetryValues v;
    const char* field;
  };
  auto with = [&](auto f) {
    StepTelemetryValues v = ok;
    f(v);
    return v;
  };
  for (const Case& c : std::vector<Case>{
           {with([](auto& v) { v.step = -1; }), "telemetry.step"},
           {with([](auto& v) { v.mode = 0; }), "telemetry.mode"},
           {with([](auto& v) { v.mode = 7; }), "telemetry.mode"},
           {with([](auto& v) { v.step_time_s = 0; }), "telemetry.step_time_s"},
           {with([](auto& v) { v.step_time_s = NAN; }), "telemetry.step_time_s"},
           {with([](auto& v) { v.rs_wait_s = -1; }), "telemetry.rs_wait_s"},
           {with([](auto& v) { v.all_gather_s = INFINITY; }), "telemetry.all_gather_s"},
           {with([](auto& v) { v.norm_stall_s = NAN; }), "telemetry.norm_stall_s"},
           {with([](auto& v) { v.effective_tokens = -1; }), "telemetry.effective_tokens"},
           {with([](auto& v) { v.padding_tokens = -2; }), "telemetry.padding_tokens"},
       }) {
    EXPECT_THAT(ValidateStepTelemetry(c.v),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
}

TEST(ValidateMicrobatchTelemetryTest, IdsAndEveryRuleNamed) {
  const MicrobatchTelemetryValues a{.id = 0, .forward_s = 0.1, .backward_s = 0.2,
                                    .effective_tokens = 100};
  MicrobatchTelemetryValues b = a;
  b.id = 1;
  b.mode = Mode::kTensorParallelOnly;
  const std::vector<MicrobatchTelemetryValues> ok{b, a};  // any order
  EXPECT_THAT(ValidateMicrobatchTelemetry(ok, 2), IsOk());
  EXPECT_THAT(ValidateMicrobatchTelemetry({}, 2), IsOk()) << "none sent: nothing to check";
  EXPECT_THAT(ValidateMicrobatchTelemetry(ok, 0), IsOk()) << "0: ids unchecked";
  EXPECT_THAT(ValidateMicrobatchTelemetry(ok, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 records")));
  EXPECT_THAT(ValidateMicrobatchTelemetry(std::vector{a, a}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 0 repeats")));
  MicrobatchTelemetryValues far = a;
  far.id = 5;
  EXPECT_THAT(ValidateMicrobatchTelemetry(std::vector{a, far}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 5 is outside")));
  struct Case {
    MicrobatchTelemetryValues v;
    const char* field;
  };
  auto with = [&](auto f) {
    MicrobatchTelemetryValues v = a;
    f(v);
    return v;
  };
  for (const Case& c : std::vector<Case>{
           {with([](auto& v) { v.mode = static_cast<Mode>(0); }), "[id 0].mode"},
           {with([](auto& v) { v.forward_s = NAN; }), "[id 0].forward_s"},
           {with([](auto& v) { v.backward_s = -1; }), "[id 0].backward_s"},
           {with([](auto& v) { v.rs_wait_s = INFINITY; }), "[id 0].rs_wait_s"},
           {with([](auto& v) { v.all_gather_s = -0.5; }), "[id 0].all_gather_s"},
           {with([](auto& v) { v.forward_s = v.backward_s = 0; }), "forward_s + backward_s"},
           {with([](auto& v) { v.effective_tokens = -3; }), "[id 0].effective_tokens"},
       }) {
    EXPECT_THAT(ValidateMicrobatchTelemetry(std::span(&c.v, 1), 1),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
}

TEST(GateFieldTableTest, DefaultsRangesAndLookup) {
  const GateConfig d;
  EXPECT_EQ(GateFieldValue(d, "max_length_cv"), 0.18);
  EXPECT_EQ(GateFieldValue(d, "window_steps"), 50);
  EXPECT_TRUE(std::isnan(GateFieldValue(d, "nope")));
  EXPECT_EQ(FindGateField("nope"), nullptr);
  for (const GateField& f : kGateFields) {
    EXPECT_EQ(FindGateField(f.name), &f);
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_THAT(CheckGateField(d, f), IsOk()) << f.name;
    EXPECT_EQ(f.is_count(), f.range == GateFieldRange::kCount) << f.name;
    EXPECT_EQ(f.is_choice(), f.range == GateFieldRange::kPolicy) << f.name;
  }
}

// Text in and out of every field, and errors that name the field.
TEST(GateFieldTableTest, TextRoundTripsAndBadTextIsRefusedByName) {
  GateConfig c;
  const GateField* policy = FindGateField("policy");
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(GateFieldText(c, *policy), "STATIC");
  EXPECT_THAT(SetGateFieldFromText(c, *policy, "adaptive"), IsOk());
  EXPECT_EQ(c.policy, GatePolicyKind::kAdaptive);
  EXPECT_EQ(GateFieldText(c, *policy), "ADAPTIVE");
  EXPECT_THAT(SetGateFieldFromText(c, *policy, "Static"), IsOk());
  EXPECT_EQ(c.policy, GatePolicyKind::kStatic);
  EXPECT_THAT(SetGateFieldFromText(c, *policy, "dynamic"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy")));
  EXPECT_EQ(c.policy, GatePolicyKind::kStatic);  // unchanged
  const GateField* window = FindGateField("window_steps");
  EXPECT_THAT(SetGateFieldFromText(c, *window, "64"), IsOk());
  EXPECT_EQ(GateFieldText(c, *window), "64");
  EXPECT_THAT(SetGateFieldFromText(c, *window, "6.5"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window_steps")));
  const GateField* margin = FindGateField("adaptive_margin");
  EXPECT_THAT(SetGateFieldFromText(c, *margin, "0.05"), IsOk());
  EXPECT_EQ(c.adaptive_margin, 0.05);
  EXPECT_THAT(SetGateFieldFromText(c, *margin, "nan"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adaptive_margin")));
  c.policy = static_cast<GatePolicyKind>(0);
  EXPECT_THAT(ValidateGateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("policy must be STATIC or ADAPTIVE")));
}

}  // namespace
}  // namespace spgate
