// EvaluateGates (docs/design.md §3): pin, memory, length CV, rolling reduce-scatter wait share
// (trip, probes, re-enable margin, minimum dwell), otherwise SP. The first half is a
// table of single decisions, one row per rule and per boundary (exactly at a threshold
// passes, the next double fires); the second half drives one group through hundreds of
// steps the way the daemon does (SP steps feed the rolling window, a trip clears it)
// and checks exactly which steps probe, resume and trip.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_policy.h"
#include "policy/rolling_window.h"
#include "tests/testing/policy_printers.h"

namespace spgate {
namespace {

using ::testing::AllOf;
using ::testing::Not;
using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;
constexpr int64_t kStep = 1000;

double Up(double x) { return std::nextafter(x, std::numeric_limits<double>::infinity()); }
double Down(double x) { return std::nextafter(x, -std::numeric_limits<double>::infinity()); }

BatchFacts Batch(double cv = 0.05) { return BatchFacts{.step = kStep, .length_cv = cv}; }
BatchFacts Memory(uint64_t sp, uint64_t tp, uint64_t budget, double cv = 0.05) {
  return BatchFacts{.step = kStep,
                    .length_cv = cv,
                    .predicted_peak_bytes_sp = sp,
                    .predicted_peak_bytes_tp = tp,
                    .memory_budget_bytes = budget};
}
RsWaitObservation Rs(double mean, int64_t samples = 10) { return {mean, samples}; }

GateConfig Headroom(double h) {
  GateConfig c;
  c.memory_headroom = h;
  return c;
}

// A group that has been deciding SP for a while.
GroupGateState Running() {
  GroupGateState s;
  s.has_decision = true;
  s.last_step = kStep - 1;
  s.last_sp_step = kStep - 1;
  return s;
}
// SP resumed from the RS_WAIT fallback `ago` steps before kStep.
GroupGateState ResumedAgo(int64_t ago) {
  GroupGateState s = Running();
  s.rs_wait_changed_step = kStep - ago;
  return s;
}
// In the RS_WAIT fallback, tripped `tripped_ago` steps before kStep, last SP step
// `sp_ago` steps before kStep.
GroupGateState Fallback(int64_t tripped_ago, int64_t sp_ago) {
  GroupGateState s;
  s.has_decision = true;
  s.last_step = kStep - 1;
  s.mode = kTp;
  s.reason = Reason::kRsWait;
  s.rs_wait_fallback = true;
  s.rs_wait_changed_step = kStep - tripped_ago;
  s.last_sp_step = kStep - sp_ago;
  return s;
}

struct GateCase {
  std::string name;
  GateConfig config;
  GroupGateState state;
  BatchFacts batch;
  RsWaitObservation rs;
  std::optional<PinDirective> pin;
  Mode mode;
  Reason reason;
  bool reset = false;  // reset_rs_wait_window expected
};

std::vector<GateCase> GateCases() {
  const GateConfig d;  // defaults: cv 0.18, rs 0.22, margin 0.03, probe 200, dwell 20
  const double level = d.max_rs_wait_share - d.rs_wait_reenable_margin;
  const uint64_t kGB = 1'000'000'000;
  const uint64_t kMaxU = std::numeric_limits<uint64_t>::max();
  return {
      // ---- nothing fires ----
      {"all_pass", d, {}, Batch(), Rs(0.1), {}, kSp, Reason::kGatesPassed},
      {"all_pass_running", d, Running(), Batch(), Rs(0.1), {}, kSp, Reason::kGatesPassed},
      {"zero_cv_no_samples", d, {}, Batch(0.0), Rs(0, 0), {}, kSp, Reason::kGatesPassed},

      // ---- order: pin > memory > CV > RS ----
      {"pin_sp_beats_everything", d, {}, Memory(3 * kGB, 3 * kGB, kGB, 0.9), Rs(0.9), kSp,
       kSp, Reason::kPinned},
      // A TP-only pin must not OOM the job: unforced, it yields to the memory gate; forced,
      // it wins (the operator said so, and it is audited).
      {"pin_tp_yields_to_memory_requires_sp", d, {}, Memory(kGB / 10, 2 * kGB, kGB), Rs(0.1),
       kTp, kSp, Reason::kMemoryRequiresSp},
      {"pin_tp_yields_to_memory_over_budget", d, {}, Memory(2 * kGB, 3 * kGB, kGB), Rs(0.1),
       kTp, kSp, Reason::kMemoryOverBudget},
      {"forced_pin_tp_beats_memory_requires_sp", d, {}, Memory(kGB / 10, 2 * kGB, kGB),
       Rs(0.1), PinDirective(kTp, /*force=*/true), kTp, Reason::kPinned},
      {"pin_tp_that_fits_holds", d, {}, Memory(kGB / 10, kGB / 2, kGB), Rs(0.9), kTp, kTp,
       Reason::kPinned},
      {"pin_tp_in_fallback_with_probe_due", d, Fallback(500, 500), Batch(), Rs(0, 0), kTp, kTp,
       Reason::kPinned},
      {"pin_sp_in_fallback", d, Fallback(5, 5), Batch(), Rs(0.9), kSp, kSp, Reason::kPinned},
      {"memory_beats_cv_and_rs", d, {}, Memory(kGB / 10, 2 * kGB, kGB, 0.9), Rs(0.9), {}, kSp,
       Reason::kMemoryRequiresSp},
      {"memory_over_budget_beats_cv", d, {}, Memory(2 * kGB, 3 * kGB, kGB, 0.9), Rs(0.9), {},
       kSp, Reason::kMemoryOverBudget},
      {"memory_beats_fallback", d, Fallback(5, 5), Memory(kGB / 10, 2 * kGB, kGB), Rs(0.9), {},
       kSp, Reason::kMemoryRequiresSp},
      {"cv_beats_rs", d, {}, Batch(0.5), Rs(0.9), {}, kTp, Reason::kLengthCv},
      {"cv_beats_due_probe", d, Fallback(500, 500), Batch(0.5), Rs(0, 0), {}, kTp,
       Reason::kLengthCv},
      {"memory_pass_then_cv_fires", d, {}, Memory(kGB, kGB / 2, kGB, 0.5), Rs(0.1), {}, kTp,
       Reason::kLengthCv},
      {"rs_trips", d, Running(), Batch(), Rs(0.3), {}, kTp, Reason::kRsWait, true},

      // ---- memory ----
      {"memory_budget_zero_skips", d, {}, Memory(kMaxU, kMaxU, 0), Rs(0.1), {}, kSp,
       Reason::kGatesPassed},
      {"memory_budget_zero_skips_to_cv", d, {}, Memory(kMaxU, kMaxU, 0, 0.5), Rs(0.1), {}, kTp,
       Reason::kLengthCv},
      {"memory_tp_exactly_at_limit_passes", Headroom(0.5), {}, Memory(500, 500, 1000), Rs(0.1),
       {}, kSp, Reason::kGatesPassed},
      {"memory_tp_at_limit_cv_fires", Headroom(0.5), {}, Memory(500, 500, 1000, 0.5), Rs(0.1),
       {}, kTp, Reason::kLengthCv},
      {"memory_tp_one_byte_over", Headroom(0.5), {}, Memory(400, 501, 1000), Rs(0.1), {}, kSp,
       Reason::kMemoryRequiresSp},
      {"memory_sp_exactly_at_limit_fits", Headroom(0.5), {}, Memory(500, 501, 1000), Rs(0.1),
       {}, kSp, Reason::kMemoryRequiresSp},
      {"memory_both_one_byte_over", Headroom(0.5), {}, Memory(501, 501, 1000), Rs(0.1), {},
       kSp, Reason::kMemoryOverBudget},
      {"memory_sp_larger_both_over", Headroom(0.5), {}, Memory(900, 600, 1000), Rs(0.1), {},
       kSp, Reason::kMemoryOverBudget},
      {"memory_sp_unknown_counts_as_fitting", Headroom(0.5), {}, Memory(0, 600, 1000), Rs(0.1),
       {}, kSp, Reason::kMemoryRequiresSp},
      {"memory_headroom_one_tp_at_budget", Headroom(1.0), {}, Memory(10, 80 * kGB, 80 * kGB),
       Rs(0.1), {}, kSp, Reason::kGatesPassed},
      {"memory_headroom_one_tp_byte_over", Headroom(1.0), {},
       Memory(10, 80 * kGB + 1, 80 * kGB), Rs(0.1), {}, kSp, Reason::kMemoryRequiresSp},
      // Default headroom 0.9 of 80 GB is 72 GB: TP-only under the budget but over the
      // headroom still needs SP.
      {"memory_default_headroom_at_limit", d, {}, Memory(10, 72 * kGB, 80 * kGB), Rs(0.1), {},
       kSp, Reason::kGatesPassed},
      {"memory_default_headroom_byte_over", d, {}, Memory(10, 72 * kGB + 1, 80 * kGB),
       Rs(0.1), {}, kSp, Reason::kMemoryRequiresSp},
      {"memory_default_headroom_applied", d, {}, Memory(10, 79 * kGB, 80 * kGB), Rs(0.1), {},
       kSp, Reason::kMemoryRequiresSp},
      {"memory_default_headroom_sp_at_limit", d, {}, Memory(72 * kGB, 79 * kGB, 80 * kGB),
       Rs(0.1), {}, kSp, Reason::kMemoryRequiresSp},
      {"memory_default_headroom_sp_byte_over", d, {}, Memory(72 * kGB + 1, 79 * kGB, 80 * kGB),
       Rs(0.1), {}, kSp, Reason::kMemoryOverBudget},

      // ---- length CV ----
      {"cv_exactly_at_max_passes", d, {}, Batch(0.18), Rs(0.1), {}, kSp, Reason::kGatesPassed},
      {"cv_just_over_fires", d, {}, Batch(Up(0.18)), Rs(0.1), {}, kTp, Reason::kLengthCv},
      {"cv_huge_fires", d, {}, Batch(50.0), Rs(0.1), {}, kTp, Reason::kLengthCv},

      // ---- RS_WAIT trip ----
      {"rs_exactly_at_max_passes", d, Running(), Batch(), Rs(0.22), {}, kSp,
       Reason::kGatesPassed},
      {"rs_just_over_trips", d, Running(), Batch(), Rs(Up(0.22)), {}, kTp, Reason::kRsWait,
       true},
      {"rs_first_decision_trips", d, {}, Batch(), Rs(0.5, 1), {}, kTp, Reason::kRsWait, true},
      {"rs_no_samples_skips", d, Running(), Batch(), Rs(0.9, 0), {}, kSp, Reason::kGatesPassed},
      {"rs_held_within_dwell_after_resume", d, ResumedAgo(19), Batch(), Rs(0.9), {}, kSp,
       Reason::kGatesPassed},
      {"rs_trips_once_dwell_over", d, ResumedAgo(20), Batch(), Rs(0.9), {}, kTp, Reason::kRsWait,
       true},

      // ---- RS_WAIT fallback: re-enable, dwell, probe ----
      {"fallback_at_level_stays", d, Fallback(100, 100), Batch(), Rs(level), {}, kTp,
       Reason::kRsWait},
      {"fallback_just_below_level_resumes", d, Fallback(100, 100), Batch(), Rs(Down(level)), {},
       kSp, Reason::kGatesPassed},
      {"fallback_between_level_and_max_stays", d, Fallback(100, 100), Batch(), Rs(0.2), {}, kTp,
       Reason::kRsWait},
      {"fallback_low_but_no_samples_stays", d, Fallback(100, 100), Batch(), Rs(0.0, 0), {}, kTp,
       Reason::kRsWait},
      {"fallback_low_within_dwell_stays", d, Fallback(19, 1), Batch(), Rs(0.0), {}, kTp,
       Reason::kRsWait},
      {"fallback_low_dwell_exactly_over_resumes", d, Fallback(20, 1), Batch(), Rs(0.0), {}, kSp,
       Reason::kGatesPassed},
      {"fallback_probe_not_yet_due", d, Fallback(500, 199), Batch(), Rs(0.5), {}, kTp,
       Reason::kRsWait},
      {"fallback_probe_exactly_due", d, Fallback(500, 200), Batch(), Rs(0.5), {}, kSp,
       Reason::kProbe},
      {"fallback_probe_overdue", d, Fallback(500, 450), Batch(), Rs(0.5), {}, kSp,
       Reason::kProbe},
      {"fallback_probe_due_within_dwell", d, Fallback(3, 200), Batch(), Rs(0.0), {}, kSp,
       Reason::kProbe},
      {"fallback_resume_beats_due_probe", d, Fallback(500, 500), Batch(), Rs(0.0), {}, kSp,
       Reason::kGatesPassed},
  };
}

class GateTableTest : public ::testing::TestWithParam<GateCase> {};

TEST_P(GateTableTest, Decides) {
  const GateCase& tc = GetParam();
  ASSERT_TRUE(ValidateGateConfig(tc.config).ok());
  const GateOutcome out = EvaluateGates(tc.config, tc.state, tc.batch, tc.rs, tc.pin);
  EXPECT_EQ(out.decision.mode, tc.mode);
  EXPECT_EQ(out.decision.reason, tc.reason);
  EXPECT_EQ(out.reset_rs_wait_window, tc.reset);

  // Bookkeeping that holds for every decision.
  const GroupGateState& next = out.next;
  EXPECT_TRUE(next.has_decision);
  EXPECT_EQ(next.last_step, tc.batch.step);
  EXPECT_EQ(next.mode, tc.mode);
  EXPECT_EQ(next.reason, tc.reason);
  EXPECT_EQ(next.last_sp_step, tc.mode == kSp ? tc.batch.step : tc.state.last_sp_step);
  EXPECT_EQ(next.mode_switches,
            tc.state.mode_switches + (tc.state.has_decision && tc.state.mode != tc.mode));
  // The fallback flag flips only on a trip (reset) or a resume from the fallback.
  const bool resumed = tc.state.rs_wait_fallback && tc.reason == Reason::kGatesPassed;
  const bool flipped = tc.reset || resumed;
  EXPECT_EQ(next.rs_wait_fallback, flipped ? !tc.state.rs_wait_fallback
                                           : tc.state.rs_wait_fallback);
  EXPECT_EQ(next.rs_wait_changed_step,
            flipped ? tc.batch.step : tc.state.rs_wait_changed_step);

  // Pure: the same inputs give the same outcome, with or without a trace.
  std::vector<GateCheck> trace;
  const GateOutcome again = EvaluateGates(tc.config, tc.state, tc.batch, tc.rs, tc.pin, &trace);
  EXPECT_EQ(again.decision.mode, out.decision.mode);
  EXPECT_EQ(again.decision.reason, out.decision.reason);
  EXPECT_EQ(again.reset_rs_wait_window, out.reset_rs_wait_window);
  EXPECT_EQ(again.next.rs_wait_fallback, next.rs_wait_fallback);
  EXPECT_EQ(again.next.last_sp_step, next.last_sp_step);
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.front().gate, "pin");
}

INSTANTIATE_TEST_SUITE_P(Gates, GateTableTest, ::testing::ValuesIn(GateCases()),
                         [](const ::testing::TestParamInfo<GateCase>& info) {
                           return info.param.name;
                         });

// ---- TpOnlyOverBudget: the memory gate's rule on its own ----

TEST(TpOnlyOverBudgetTest, IsOverBudgetTimesHeadroom) {
  const struct {
    const char* name;
    GateConfig config;
    BatchFacts batch;
    bool over;
  } rows[] = {
      {"no_budget_never", Headroom(0.5), Memory(0, std::numeric_limits<uint64_t>::max(), 0),
       false},
      {"tp_exactly_at_limit_fits", Headroom(0.5), Memory(0, 500, 1000), false},
      {"tp_one_byte_over", Headroom(0.5), Memory(0, 501, 1000), true},
      {"sp_is_not_consulted", Headroom(0.5), Memory(5000, 400, 1000), false},
      {"headroom_one_at_budget", Headroom(1.0), Memory(0, 1000, 1000), false},
      {"headroom_one_byte_over", Headroom(1.0), Memory(0, 1001, 1000), true},
  };
  for (const auto& row : rows) {
    EXPECT_EQ(TpOnlyOverBudget(row.config, row.batch), row.over) << row.name;
  }
}

// The gates' memory verdict is this function's: on every unpinned row of the table the
// memory gate fires exactly when TpOnlyOverBudget holds.
TEST(TpOnlyOverBudgetTest, IsWhatTheMemoryGateFiresOn) {
  for (const GateCase& tc : GateCases()) {
    if (tc.pin.has_value()) continue;
    const GateOutcome out = EvaluateGates(tc.config, tc.state, tc.batch, tc.rs, tc.pin);
    const bool memory_fired = out.decision.reason == Reason::kMemoryRequiresSp ||
                              out.decision.reason == Reason::kMemoryOverBudget;
    EXPECT_EQ(TpOnlyOverBudget(tc.config, tc.batch), memory_fired) << tc.name;
  }
}

// ---- The reason chain (what the what-if API shows) ----

MATCHER_P2(Check, gate, outcome, "") { return arg.gate == gate && arg.outcome == outcome; }
MATCHER_P4(CheckWith, gate, outcome, observed, threshold, "") {
  return arg.gate == gate && arg.outcome == outcome && arg.observed == observed &&
         arg.threshold == threshold;
}

TEST(GateTraceTest, AllPassConsultsEveryGate) {
  std::vector<GateCheck> trace;
  EvaluateGates(GateConfig{}, Running(), Batch(0.1), Rs(0.15), std::nullopt, &trace);
  EXPECT_THAT(trace, ElementsAre(Check("pin", "pass"), Check("memory", "skip"),
                                 CheckWith("length_cv", "pass", 0.1, 0.18),
                                 CheckWith("rs_wait", "pass", 0.15, 0.22)));
  // The pin and a budget-less memory gate compared nothing: no values, not zeros.
  for (int i : {0, 1}) {
    EXPECT_FALSE(trace[i].observed.has_value()) << trace[i].gate;
    EXPECT_FALSE(trace[i].threshold.has_value()) << trace[i].gate;
  }
}

TEST(GateTraceTest, NoSamplesIsASkip) {
  std::vector<GateCheck> trace;
  EvaluateGates(GateConfig{}, GroupGateState{}, Batch(0.1), Rs(0, 0), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3], Check("rs_wait", "skip"));
  EXPECT_THAT(trace[3].detail, HasSubstr("no SP step"));
  // No share was observed, so nothing was compared: neither value is shown.
  EXPECT_FALSE(trace[3].observed.has_value());
  EXPECT_FALSE(trace[3].threshold.has_value());
}

TEST(GateTraceTest, PinStopsTheChain) {
  std::vector<GateCheck> trace;
  EvaluateGates(GateConfig{}, Running(), Batch(0.9), Rs(0.9), kTp, &trace);
  ASSERT_THAT(trace, ElementsAre(Check("pin", "fire")));
  EXPECT_THAT(trace[0].detail, HasSubstr("tp_only"));
}

TEST(GateTraceTest, MemoryRecordsBytesAndLimit) {
  std::vector<GateCheck> trace;
  EvaluateGates(Headroom(0.5), Running(), Memory(100, 600, 1000), Rs(0.1), std::nullopt,
                &trace);
  ASSERT_THAT(trace, ElementsAre(Check("pin", "pass"), CheckWith("memory", "fire", 600, 500)));
  EXPECT_THAT(trace[1].detail, HasSubstr("SP fits"));

  trace.clear();
  EvaluateGates(Headroom(0.5), Running(), Memory(700, 600, 1000), Rs(0.1), std::nullopt,
                &trace);
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_THAT(trace[1].detail, HasSubstr("neither mode fits"));

  trace.clear();
  EvaluateGates(Headroom(0.5), Running(), Memory(100, 500, 1000), Rs(0.1), std::nullopt,
                &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[1], CheckWith("memory", "pass", 500, 500));
}

TEST(GateTraceTest, LengthCvFireStopsBeforeRsWait) {
  std::vector<GateCheck> trace;
  EvaluateGates(GateConfig{}, Running(), Batch(0.4), Rs(0.9), std::nullopt, &trace);
  EXPECT_THAT(trace, ElementsAre(Check("pin", "pass"), Check("memory", "skip"),
                                 CheckWith("length_cv", "fire", 0.4, 0.18)));
}

TEST(GateTraceTest, FallbackShowsTheReenableLevel) {
  const GateConfig c;
  const double level = c.max_rs_wait_share - c.rs_wait_reenable_margin;
  std::vector<GateCheck> trace;
  EvaluateGates(c, Fallback(100, 100), Batch(), Rs(0.3), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3], CheckWith("rs_wait", "fire", 0.3, level));
  EXPECT_THAT(trace[3].detail, HasSubstr("not below re-enable level"));

  trace.clear();
  EvaluateGates(c, Fallback(500, 200), Batch(), Rs(0.3), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3].detail, HasSubstr("probe"));

  trace.clear();
  EvaluateGates(c, Fallback(500, 100), Batch(), Rs(0.1), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3], CheckWith("rs_wait", "pass", 0.1, level));
  EXPECT_THAT(trace[3].detail, HasSubstr("SP resumes"));

  // Right after a trip the window is empty: nothing compared (no value shown), and the
  // sentence names the step the probe is due.
  trace.clear();
  EvaluateGates(c, Fallback(100, 100), Batch(), Rs(0, 0), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3].detail, HasSubstr("waiting for a probe (due at step"));
  EXPECT_FALSE(trace[3].observed.has_value());
  EXPECT_FALSE(trace[3].threshold.has_value());
}

TEST(GateTraceTest, DwellHoldIsExplained) {
  std::vector<GateCheck> trace;
  EvaluateGates(GateConfig{}, ResumedAgo(3), Batch(), Rs(0.5), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3], CheckWith("rs_wait", "pass", 0.5, 0.22));
  EXPECT_THAT(trace[3].detail, HasSubstr("min_dwell_steps"));
  // In the fallback, a wait share below the re-enable level held by the dwell says so
  // (not "not below re-enable level").
  const GateConfig c;
  trace.clear();
  EvaluateGates(c, Fallback(c.min_dwell_steps - 1, 1), Batch(), Rs(0.1), std::nullopt, &trace);
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_THAT(trace[3].detail, AllOf(HasSubstr("below the re-enable level"),
                                     HasSubstr("min_dwell_steps"), Not(HasSubstr("not below"))));
}

TEST(GateTraceTest, TraceAppends) {
  std::vector<GateCheck> trace = {GateCheck{"earlier", "pass", 0, 0, ""}};
  EvaluateGates(GateConfig{}, Running(), Batch(), Rs(0.1), kSp, &trace);
  EXPECT_THAT(trace, ElementsAre(Check("earlier", "pass"), Check("pin", "fire")));
}

TEST(LabelsTest, ModeAndReasonLabels) {
  EXPECT_EQ(ModeLabel(kSp), "sp");
  EXPECT_EQ(ModeLabel(kTp), "tp_only");
  EXPECT_EQ(ReasonLabel(Reason::kGatesPassed), "gates_passed");
  EXPECT_EQ(ReasonLabel(Reason::kLengthCv), "length_cv");
  EXPECT_EQ(ReasonLabel(Reason::kRsWait), "rs_wait");
  EXPECT_EQ(ReasonLabel(Reason::kProbe), "probe");
  EXPECT_EQ(ReasonLabel(Reason::kMemoryRequiresSp), "memory_requires_sp");
  EXPECT_EQ(ReasonLabel(Reason::kMemoryOverBudget), "memory_over_budget");
  EXPECT_EQ(ReasonLabel(Reason::kPinned), "pinned");
  EXPECT_EQ(ReasonLabel(Reason::kControllerUnavailable), "controller_unavailable");
  EXPECT_EQ(ReasonLabel(Reason::kAdaptive), "adaptive");
}

// ---- Many steps of one group ----

// One TP group driven as the daemon drives it: the policy decides; an SP step (of any
// reason) then measures `rs_if_sp` into the rolling window; a trip clears the window.
class GroupSim {
 public:
  explicit GroupSim(GateConfig config) : config_(config), window_(config.window_steps) {
    EXPECT_TRUE(ValidateGateConfig(config).ok());
  }

  GateOutcome Run(const BatchFacts& batch, double rs_if_sp,
                  std::optional<Mode> pin = std::nullopt) {
    const RsWaitObservation obs{window_.Mean(), window_.size()};
    GateOutcome out = EvaluateGates(config_, state_, batch, obs, pin);
    EXPECT_GT(batch.step, state_.last_step);
    state_ = out.next;
    if (out.reset_rs_wait_window) {
      window_.Clear();
      ++resets_;
    }
    if (out.decision.mode == kSp) window_.Push(rs_if_sp);
    return out;
  }
  GateOutcome Step(int64_t step, double rs_if_sp) {
    return Run(BatchFacts{.step = step, .length_cv = 0.05}, rs_if_sp);
  }

  const GroupGateState& state() const { return state_; }
  const RollingWindow& window() const { return window_; }
  int resets() const { return resets_; }

 private:
  GateConfig config_;
  GroupGateState state_;
  RollingWindow window_;
  int resets_ = 0;
};

GateConfig Config(int64_t probe, int64_t dwell, int64_t window = 50) {
  GateConfig c;
  c.probe_interval_steps = probe;
  c.min_dwell_steps = dwell;
  c.window_steps = window;
  return c;
}

// Powers of two, so window means of repeated samples are exact and the level is 0.125.
GateConfig ExactConfig(int64_t probe, int64_t dwell, int64_t window = 50) {
  GateConfig c = Config(probe, dwell, window);
  c.max_rs_wait_share = 0.25;
  c.rs_wait_reenable_margin = 0.125;
  return c;
}

TEST(RsWaitSequenceTest, TripClearsTheWindowOnce) {
  GroupSim g(GateConfig{});
  GateOutcome out = g.Step(0, 0.30);  // nothing observed yet: SP, measures 0.30
  EXPECT_EQ(out.decision.reason, Reason::kGatesPassed);
  EXPECT_EQ(g.window().size(), 1);
  out = g.Step(1, 0.30);
  EXPECT_EQ(out.decision.mode, kTp);
  EXPECT_EQ(out.decision.reason, Reason::kRsWait);
  EXPECT_TRUE(out.reset_rs_wait_window);
  EXPECT_TRUE(out.next.rs_wait_fallback);
  EXPECT_EQ(out.next.rs_wait_changed_step, 1);
  EXPECT_TRUE(g.window().empty());  // the samples that tripped it are gone
  for (int64_t s = 2; s < 1000; ++s) {
    out = g.Step(s, 0.30);
    EXPECT_FALSE(out.reset_rs_wait_window) << s;  // no second trip while in fallback
  }
  EXPECT_EQ(g.resets(), 1);
}

// Probes come exactly every probe_interval_steps after the last SP step: the trip is at
// step 1 after the SP step 0, so with the wait share staying high the probes are the
// steps s > 1 with s % P == 0, and every other step is RS_WAIT.
TEST(RsWaitSequenceTest, ProbeCadenceIsExact) {
  for (int64_t p : {1, 2, 3, 7, 20, 50, 200, 999}) {
    SCOPED_TRACE("probe_interval_steps " + std::to_string(p));
    GroupSim g(Config(p, 20));
    g.Step(0, 0.30);
    ASSERT_EQ(g.Step(1, 0.30).decision.reason, Reason::kRsWait);
    int probes = 0;
    bool last_was_probe = false;
    for (int64_t s = 2; s <= 3000; ++s) {
      const GateOutcome out = g.Step(s, 0.30);
      last_was_probe = s % p == 0;
      if (s % p == 0) {
        ASSERT_EQ(out.decision.mode, kSp) << "step " << s;
        ASSERT_EQ(out.decision.reason, Reason::kProbe) << "step " << s;
        ++probes;
      } else {
        ASSERT_EQ(out.decision.mode, kTp) << "step " << s;
        ASSERT_EQ(out.decision.reason, Reason::kRsWait) << "step " << s;
      }
    }
    EXPECT_EQ(probes, 3000 / p - (p == 1 ? 1 : 0));
    // Into TP at the trip, then out to SP and back for every probe (p == 1: the group
    // probes on every step after the trip, so it stays in SP).
    EXPECT_EQ(g.state().mode_switches, p == 1 ? 2 : 1 + 2 * probes - (last_was_probe ? 1 : 0));
  }
}

TEST(RsWaitSequenceTest, ProbeCadenceDoesNotDependOnAbsoluteStep) {
  const int64_t base = 7'654'321;
  GroupSim g(Config(200, 20));
  g.Step(base, 0.5);
  ASSERT_EQ(g.Step(base + 1, 0.5).decision.reason, Reason::kRsWait);
  std::vector<int64_t> probes;
  for (int64_t s = base + 2; s < base + 1000; ++s) {
    if (g.Step(s, 0.5).decision.reason == Reason::kProbe) probes.push_back(s - base);
  }
  EXPECT_THAT(probes, ElementsAre(200, 400, 600, 800));
}

// Hysteresis: a probe below max_rs_wait_share but not below max - margin keeps the
// fallback; exactly at the level keeps it; the first window mean below it resumes.
TEST(RsWaitSequenceTest, ReenableNeedsMeanBelowMaxMinusMargin) {
  GroupSim g(ExactConfig(/*probe=*/10, /*dwell=*/1));
  g.Step(0, 0.5);
  ASSERT_EQ(g.Step(1, 0.5).decision.reason, Reason::kRsWait);
  // Probes measure 0.2: under the threshold 0.25, above the level 0.125.
  for (int64_t s = 2; s <= 50; ++s) {
    const GateOutcome out = g.Step(s, 0.2);
    ASSERT_EQ(out.decision.reason, s % 10 == 0 ? Reason::kProbe : Reason::kRsWait) << s;
  }
  // A window full of samples at exactly the level: still no resume.
  GroupSim h(ExactConfig(10, 1));
  h.Step(0, 0.5);
  h.Step(1, 0.5);
  for (int64_t s = 2; s <= 100; ++s) {
    const GateOutcome out = h.Step(s, 0.125);
    ASSERT_EQ(out.decision.reason, s % 10 == 0 ? Reason::kProbe : Reason::kRsWait) << s;
  }
  EXPECT_EQ(h.window().size(), 10);
  EXPECT_EQ(h.window().Mean(), 0.125);
  // The probe at step 110 measures 0: the mean drops below the level, and the very next
  // step resumes SP.
  EXPECT_EQ(h.Step(101, 0.0).decision.reason, Reason::kRsWait);
  for (int64_t s = 102; s < 110; ++s) ASSERT_EQ(h.Step(s, 0.0).decision.reason, Reason::kRsWait);
  EXPECT_EQ(h.Step(110, 0.0).decision.reason, Reason::kProbe);
  const GateOutcome resumed = h.Step(111, 0.0);
  EXPECT_EQ(resumed.decision.mode, kSp);
  EXPECT_EQ(resumed.decision.reason, Reason::kGatesPassed);
  EXPECT_FALSE(resumed.next.rs_wait_fallback);
  EXPECT_EQ(resumed.next.rs_wait_changed_step, 111);
  for (int64_t s = 112; s < 400; ++s) {
    ASSERT_EQ(h.Step(s, 0.0).decision.reason, Reason::kGatesPassed) << s;
  }
}

// Defaults, window of one: the level is computed as the policy computes it.
TEST(RsWaitSequenceTest, ReenableAtDefaultLevel) {
  const GateConfig c = Config(5, 1, /*window=*/1);
  const double level = c.max_rs_wait_share - c.rs_wait_reenable_margin;
  GroupSim g(c);
  g.Step(0, 0.5);
  g.Step(1, 0.5);
  for (int64_t s = 2; s <= 5; ++s) g.Step(s, level);  // the probe at 5 measures the level
  EXPECT_EQ(g.Step(6, level).decision.reason, Reason::kRsWait);
  for (int64_t s = 7; s <= 10; ++s) g.Step(s, Down(level));  // probe at 10 just below
  EXPECT_EQ(g.Step(11, 0.0).decision.reason, Reason::kGatesPassed);
}

// After a trip the fallback is held min_dwell_steps even when a probe measures a low
// wait share; probes keep their cadence meanwhile; SP resumes at trip + min_dwell.
TEST(RsWaitSequenceTest, DwellHoldsTheFallback) {
  for (int64_t dwell : {1, 5, 20, 21, 23, 100}) {
    SCOPED_TRACE("min_dwell_steps " + std::to_string(dwell));
    GroupSim g(ExactConfig(/*probe=*/5, dwell));
    g.Step(0, 0.5);
    ASSERT_EQ(g.Step(1, 0.5).decision.reason, Reason::kRsWait);  // trip at 1
    // The first probe (step 5) measures 0; the earliest resume is then
    // max(6, 1 + dwell), the step after a probe has measured and the dwell has passed.
    const int64_t resume_at = std::max<int64_t>(6, 1 + dwell);
    for (int64_t s = 2; s < resume_at; ++s) {
      const GateOutcome out = g.Step(s, 0.0);
      ASSERT_EQ(out.decision.reason, s % 5 == 0 ? Reason::kProbe : Reason::kRsWait) << s;
    }
    const GateOutcome out = g.Step(resume_at, 0.0);
    EXPECT_EQ(out.decision.reason, Reason::kGatesPassed) << resume_at;
    EXPECT_FALSE(out.next.rs_wait_fallback);
  }
}

// After a resume, SP is held min_dwell_steps even when the wait share is high again;
// the trip comes exactly at resume + min_dwell.
TEST(RsWaitSequenceTest, DwellHoldsSpAfterResume) {
  for (int64_t dwell : {1, 2, 20, 57}) {
    SCOPED_TRACE("min_dwell_steps " + std::to_string(dwell));
    GroupSim g(ExactConfig(/*probe=*/5, dwell, /*window=*/2));
    g.Step(0, 0.5);
    g.Step(1, 0.5);  // trip
    // Probes (every 5th step) measure 0 until the resume, as in DwellHoldsTheFallback;
    // from the resume on every SP step measures 1.0, so with a window of two the mean
    // is above 0.25 from the step after the resume on.
    const int64_t resumed_at = std::max<int64_t>(6, 1 + dwell);
    for (int64_t s = 2; s < resumed_at; ++s) g.Step(s, 0.0);
    ASSERT_EQ(g.Step(resumed_at, 1.0).decision.reason, Reason::kGatesPassed);
    ASSERT_EQ(g.state().rs_wait_changed_step, resumed_at);
    for (int64_t s = resumed_at + 1; s < resumed_at + dwell; ++s) {
      const GateOutcome out = g.Step(s, 1.0);
      ASSERT_EQ(out.decision.mode, kSp) << s;
      ASSERT_EQ(out.decision.reason, Reason::kGatesPassed) << s;
    }
    const GateOutcome trip = g.Step(resumed_at + dwell, 1.0);
    EXPECT_EQ(trip.decision.reason, Reason::kRsWait);
    EXPECT_TRUE(trip.reset_rs_wait_window);
  }
}

// Any SP step in the fallback is a measurement: a memory-forced or pinned SP step moves
// the next probe to probe_interval_steps after it.
TEST(RsWaitSequenceTest, ForcedSpStepResetsTheProbeTimer) {
  for (Reason forced : {Reason::kMemoryRequiresSp, Reason::kPinned}) {
    SCOPED_TRACE(std::string(ReasonLabel(forced)));
    GroupSim g(Config(200, 20));
    g.Step(0, 0.5);
    g.Step(1, 0.5);  // trip; without interference the first probe would be at 200
    for (int64_t s = 2; s < 150; ++s) ASSERT_EQ(g.Step(s, 0.5).decision.reason, Reason::kRsWait);
    const BatchFacts need_sp{.step = 150,
                             .length_cv = 0.05,
                             .predicted_peak_bytes_sp = 100,
                             .predicted_peak_bytes_tp = 2000,
                             .memory_budget_bytes = 1000};
    const GateOutcome out = forced == Reason::kPinned
                                ? g.Run(BatchFacts{.step = 150, .length_cv = 0.05}, 0.5, kSp)
                                : g.Run(need_sp, 0.5);
    ASSERT_EQ(out.decision.reason, forced);
    EXPECT_TRUE(out.next.rs_wait_fallback);  // still in the fallback
    EXPECT_EQ(out.next.last_sp_step, 150);
    std::vector<int64_t> probes;
    for (int64_t s = 151; s <= 800; ++s) {
      if (g.Step(s, 0.5).decision.reason == Reason::kProbe) probes.push_back(s);
    }
    EXPECT_THAT(probes, ElementsAre(350, 550, 750));
  }
}

TEST(RsWaitSequenceTest, ForcedSpStepCanEndTheFallback) {
  GroupSim g(Config(200, 20));
  g.Step(0, 0.5);
  g.Step(1, 0.5);
  for (int64_t s = 2; s < 150; ++s) g.Step(s, 0.5);
  const BatchFacts need_sp{.step = 150,
                           .length_cv = 0.05,
                           .predicted_peak_bytes_sp = 100,
                           .predicted_peak_bytes_tp = 2000,
                           .memory_budget_bytes = 1000};
  ASSERT_EQ(g.Run(need_sp, 0.01).decision.reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(g.Step(151, 0.01).decision.reason, Reason::kGatesPassed);
  EXPECT_FALSE(g.state().rs_wait_fallback);
}

// A probe that falls on a high-CV batch is deferred to the next batch the CV gate lets
// through, and the cadence restarts from there.
TEST(RsWaitSequenceTest, LengthCvDefersADueProbe) {
  GroupSim g(Config(200, 20));
  g.Step(0, 0.5);
  g.Step(1, 0.5);
  for (int64_t s = 2; s < 200; ++s) g.Step(s, 0.5);
  EXPECT_EQ(g.Run(BatchFacts{.step = 200, .length_cv = 0.9}, 0.5).decision.reason,
            Reason::kLengthCv);
  EXPECT_EQ(g.Step(201, 0.5).decision.reason, Reason::kProbe);
  std::vector<int64_t> probes;
  for (int64_t s = 202; s <= 700; ++s) {
    if (g.Step(s, 0.5).decision.reason == Reason::kProbe) probes.push_back(s);
  }
  EXPECT_THAT(probes, ElementsAre(401, 601));
}

TEST(RsWaitSequenceTest, PinDoesNotEndTheFallback) {
  GroupSim g(Config(200, 20));
  g.Step(0, 0.5);
  g.Step(1, 0.5);
  for (int64_t s = 2; s < 100; ++s) {
    EXPECT_EQ(g.Run(BatchFacts{.step = s, .length_cv = 0.05}, 0.5, kTp).decision.reason,
              Reason::kPinned);
  }
  EXPECT_TRUE(g.state().rs_wait_fallback);
  EXPECT_EQ(g.Step(100, 0.5).decision.reason, Reason::kRsWait);
}

// The worked example in docs/gates.md, step by step (telemetry arrives at once here).
TEST(RsWaitSequenceTest, DocsGatesExample) {
  GroupSim g(GateConfig{});
  for (int64_t s = 0; s < 999; ++s) {
    ASSERT_EQ(g.Step(s, 0.21).decision.reason, Reason::kGatesPassed) << s;
  }
  EXPECT_NEAR(g.window().Mean(), 0.21, 1e-12);
  EXPECT_EQ(g.Step(999, 0.75).decision.reason, Reason::kGatesPassed);  // the straggler
  EXPECT_NEAR(g.window().Mean(), 0.2208, 1e-12);
  const GateOutcome trip = g.Step(1000, 0.0);
  EXPECT_EQ(trip.decision.reason, Reason::kRsWait);
  EXPECT_TRUE(trip.reset_rs_wait_window);
  for (int64_t s = 1001; s <= 1198; ++s) {
    ASSERT_EQ(g.Step(s, 0.0).decision.reason, Reason::kRsWait) << s;
  }
  EXPECT_EQ(g.Step(1199, 0.20).decision.reason, Reason::kProbe);
  for (int64_t s = 1200; s <= 1398; ++s) {
    ASSERT_EQ(g.Step(s, 0.0).decision.reason, Reason::kRsWait) << s;
  }
  EXPECT_EQ(g.Step(1399, 0.12).decision.reason, Reason::kProbe);
  EXPECT_NEAR(g.window().Mean(), 0.16, 1e-12);
  EXPECT_EQ(g.Step(1400, 0.9).decision.reason, Reason::kGatesPassed);  // resume
  for (int64_t s = 1401; s <= 1419; ++s) {
    ASSERT_EQ(g.Step(s, 0.9).decision.reason, Reason::kGatesPassed) << s;  // held
  }
  EXPECT_EQ(g.Step(1420, 0.9).decision.reason, Reason::kRsWait);
}

TEST(ModeSwitchTest, CountsEveryChangeOfMode) {
  GroupSim g(GateConfig{});
  struct Row {
    BatchFacts batch;
    std::optional<Mode> pin;
    Reason reason;
    int64_t switches;
  };
  const Row rows[] = {
      {{.step = 0}, {}, Reason::kGatesPassed, 0},  // the first decision is not a switch
      {{.step = 1}, {}, Reason::kGatesPassed, 0},
      {{.step = 2, .length_cv = 0.5}, {}, Reason::kLengthCv, 1},
      {{.step = 3, .length_cv = 0.5}, {}, Reason::kLengthCv, 1},
      {{.step = 4}, {}, Reason::kGatesPassed, 2},
      {{.step = 5}, kTp, Reason::kPinned, 3},
      {{.step = 6}, kTp, Reason::kPinned, 3},
      {{.step = 7,
        .predicted_peak_bytes_sp = 1,
        .predicted_peak_bytes_tp = 2000,
        .memory_budget_bytes = 1000},
       {},
       Reason::kMemoryRequiresSp,
       4},
      {{.step = 8}, kSp, Reason::kPinned, 4},  // same mode, other reason: not a switch
      {{.step = 9, .length_cv = 0.19}, {}, Reason::kLengthCv, 5},
  };
  for (const Row& r : rows) {
    const GateOutcome out = g.Run(r.batch, 0.0, r.pin);
    EXPECT_EQ(out.decision.reason, r.reason) << r.batch.step;
    EXPECT_EQ(out.next.mode_switches, r.switches) << r.batch.step;
  }
}

// Steps anywhere in int64 must not overflow the step arithmetic (the never-set
// sentinels are far below zero): a trip at the largest step still trips.
TEST(StepArithmeticTest, LargestStepsDoNotOverflow) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  GateOutcome out =
      EvaluateGates(GateConfig{}, GroupGateState{}, BatchFacts{.step = kMax}, Rs(0.5, 1), {});
  EXPECT_EQ(out.decision.reason, Reason::kRsWait);

  GroupGateState s;  // in the fallback with no SP step ever recorded
  s.has_decision = true;
  s.mode = kTp;
  s.rs_wait_fallback = true;
  out = EvaluateGates(GateConfig{}, s, BatchFacts{.step = kMax}, Rs(0.5, 1), {});
  EXPECT_EQ(out.decision.reason, Reason::kProbe);
  out = EvaluateGates(GateConfig{}, s, BatchFacts{.step = kMax}, Rs(0.0, 1), {});
  EXPECT_EQ(out.decision.reason, Reason::kGatesPassed);

  GroupGateState near = Running();
  near.last_sp_step = kMax - 10;
  near.rs_wait_changed_step = kMax - 10;
  near.rs_wait_fallback = true;
  out = EvaluateGates(GateConfig{}, near, BatchFacts{.step = kMax}, Rs(0.0, 1), {});
  EXPECT_EQ(out.decision.reason, Reason::kRsWait);  // dwell 20 not over, probe not due
}

}  // namespace
}  // namespace spgate
