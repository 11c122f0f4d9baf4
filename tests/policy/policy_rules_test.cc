// The rules the daemon, the worker's fallback and commit, and the simulator share, each
// written once in policy/ (docs/design.md §3, §12): the stage memory limit and the gate's
// verdict on a wanted decision (StageMemoryLimit, StageMemoryGate::Admit,
// ApplyStageMemoryGate), an SP-required feature as the directive gate 1 evaluates
// (JobDirective), the shape a plan must have for its job's layout (CheckPlanShape,
// SummarizeMicrobatch), which reasons are forced (IsForcedReason) and a micro-batch's
// decision in a byte (PackModeReason). Tables, with the rows that tell each rule apart
// from its near misses.
#include <iterator>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "policy/exploration.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "policy/types.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr Mode kSp = Mode::kSequenceParallel;
constexpr Mode kTp = Mode::kTensorParallelOnly;

GateConfig Headroom(double h) {
  GateConfig c;
  c.memory_headroom = h;
  return c;
}

TEST(StageMemoryLimit, BudgetTimesHeadroomAtLeastOneByteAndZeroWithoutBudget) {
  struct Row {
    uint64_t budget;
    double headroom;
    uint64_t want;
  };
  const Row rows[] = {
      {0, 0.9, 0},                                    // no budget: no gate
      {100, 0.9, 90},                                 // budget x headroom
      {1000, 1.0, 1000},                              // all of it
      {10, 0.05, 1},                                  // 0.5 bytes rounds down, floored at 1
      {1, 0.5, 1},                                    // a budget never gives "no gate"
      {uint64_t{1} << 40, 0.5, uint64_t{1} << 39},    // step-plan sized budgets stay exact
      {999, 0.999, 998},                              // truncates, never rounds up
  };
  for (const Row& r : rows) {
    EXPECT_EQ(StageMemoryLimit(r.budget, Headroom(r.headroom)), r.want)
        << r.budget << " x " << r.headroom;
  }
}

// One stage of one (1F1B, pp = 1, 3 micro-batches): each micro-batch is alone in flight,
// so the stage's peak is resident (100) + the largest micro-batch's activations. Under SP
// every micro-batch holds 10; under TP-only micro-batch 1 holds 30, the others 20.
std::vector<PipelineOp> OneStage() {
  return StageSchedule({.pp = 1, .microbatches = 3}, 0).value();
}
const std::vector<MicrobatchMemory> kMemory = {{.activation_sp = 10, .activation_tp = 20},
                                               {.activation_sp = 10, .activation_tp = 30},
                                               {.activation_sp = 10, .activation_tp = 20}};

TEST(StageMemoryGate, AdmitKeepsWhatFitsAndOverridesWhatDoesNot) {
  struct Row {
    const char* name;
    uint64_t limit;
    int id;
    Decision wanted;
    bool pin_forced;
    Decision want;
  };
  const Decision sp_pass{kSp, Reason::kGatesPassed};
  const Decision tp_cv{kTp, Reason::kLengthCv};
  const Decision tp_pin{kTp, Reason::kPinned};
  const Decision requires_sp{kSp, Reason::kMemoryRequiresSp};
  const Decision over_budget{kSp, Reason::kMemoryOverBudget};
  const Row rows[] = {
      {"SP stays SP", 125, 1, sp_pass, false, sp_pass},
      {"TP-only that fits", 125, 0, tp_cv, false, tp_cv},
      {"TP-only at the limit exactly", 120, 0, tp_cv, false, tp_cv},
      {"TP-only one byte over", 119, 0, tp_cv, false, requires_sp},
      {"TP-only that does not fit", 125, 1, tp_cv, false, requires_sp},
      {"an unforced pin yields", 125, 1, tp_pin, false, requires_sp},
      {"a forced pin runs", 125, 1, tp_pin, true, tp_pin},
      {"force is the pin's alone", 125, 1, {kTp, Reason::kAdaptive}, true, requires_sp},
      {"all-SP does not fit", 105, 0, tp_cv, false, over_budget},
      {"all-SP does not fit, forced pin", 105, 0, tp_pin, true, tp_pin},
      {"no limit", 0, 1, tp_cv, false, tp_cv},
  };
  const std::vector<PipelineOp> ops = OneStage();
  for (const Row& r : rows) {
    StageMemoryGate gate(ops, 100, kMemory, r.limit);
    EXPECT_EQ(gate.Admit(r.id, r.wanted, r.pin_forced), r.want) << r.name;
    EXPECT_EQ(gate.modes()[r.id], r.want.mode) << r.name;  // the gate counts what it let run
  }
}

TEST(StageMemoryGate, ApplyOverridesInIdOrderAndCountsThem) {
  struct Row {
    const char* name;
    uint64_t limit;
    std::vector<Decision> wanted;
    bool pin_forced;
    std::vector<Decision> want;
    int overridden;
  };
  const Decision tp{kTp, Reason::kRsWait};
  const Decision pin{kTp, Reason::kPinned};
  const Decision sp{kSp, Reason::kProbe};
  const Decision req{kSp, Reason::kMemoryRequiresSp};
  const Decision over{kSp, Reason::kMemoryOverBudget};
  const Row rows[] = {
      {"only the one that does not fit", 125, {tp, tp, tp}, false, {tp, req, tp}, 1},
      {"SP is never touched", 125, {sp, tp, sp}, false, {sp, req, sp}, 1},
      {"everything fits", 130, {tp, tp, tp}, false, {tp, tp, tp}, 0},
      {"forced pins", 125, {pin, pin, pin}, true, {pin, pin, pin}, 0},
      {"unforced pins", 125, {pin, pin, pin}, false, {pin, req, pin}, 1},
      {"over budget", 100, {tp, sp, pin}, false, {over, sp, over}, 2},
  };
  const std::vector<PipelineOp> ops = OneStage();
  for (const Row& r : rows) {
    StageMemoryGate gate(ops, 100, kMemory, r.limit);
    std::vector<Decision> d = r.wanted;
    EXPECT_EQ(ApplyStageMemoryGate(gate, d, r.pin_forced), r.overridden) << r.name;
    EXPECT_EQ(d, r.want) << r.name;
    for (size_t i = 0; i < d.size(); ++i) {
      EXPECT_EQ(gate.modes()[i], d[i].mode) << r.name << " " << i;  // the gate's own modes
    }
  }
}

TEST(JobDirective, SpRequiredOutranksAnyPin) {
  EXPECT_EQ(JobDirective(false, std::nullopt), std::nullopt);
  EXPECT_EQ(JobDirective(false, PinDirective(kTp, true)), PinDirective(kTp, true));
  for (std::optional<PinDirective> pin :
       {std::optional<PinDirective>(), std::optional<PinDirective>(PinDirective(kTp, true)),
        std::optional<PinDirective>(PinDirective(kSp))}) {
    const std::optional<PinDirective> d = JobDirective(true, pin);
    ASSERT_TRUE(d.has_value());
    EXPECT_TRUE(d->sp_required);
    EXPECT_EQ(d->mode, kSp);
  }
  EXPECT_FALSE(PinDirective(kSp, true).sp_required);
}

// The directive is gate 1 under both policies: an SP-required job runs SP before a pin
// and before the memory gate (whatever the batch), and without it the pin and memory
// gates decide as before.
TEST(JobDirective, EvaluatedFirstUnderBothPolicies) {
  struct Row {
    const char* name;
    bool sp_required;
    std::optional<PinDirective> pin;
    bool tp_over;  // TP-only's peak over budget x headroom (SP's too)
    Decision want;
  };
  const Row rows[] = {
      {"sp_required", true, std::nullopt, false, {kSp, Reason::kSpRequired}},
      {"sp_required over a forced TP-only pin", true, PinDirective(kTp, true), false,
       {kSp, Reason::kSpRequired}},
      {"sp_required over an SP pin", true, PinDirective(kSp), false, {kSp, Reason::kSpRequired}},
      {"sp_required before the memory gate", true, std::nullopt, true,
       {kSp, Reason::kSpRequired}},
      {"a forced pin without it", false, PinDirective(kTp, true), true, {kTp, Reason::kPinned}},
      {"an unforced pin yields to memory", false, PinDirective(kTp), true,
       {kSp, Reason::kMemoryOverBudget}},
      {"nothing: the length-CV gate", false, std::nullopt, false, {kTp, Reason::kLengthCv}},
  };
  int64_t quiet = 1003;  // not an exploration step
  while (MayExplore(GateConfig{}, quiet)) ++quiet;
  for (GatePolicyKind policy : {GatePolicyKind::kStatic, GatePolicyKind::kAdaptive}) {
    GateConfig config;
    config.policy = policy;
    for (const Row& r : rows) {
      const BatchFacts batch{.step = quiet,
                             .length_cv = 1.0,
                             .tokens = 4096,
                             .predicted_peak_bytes_sp = r.tp_over ? 200u : 10u,
                             .predicted_peak_bytes_tp = r.tp_over ? 300u : 20u,
                             .memory_budget_bytes = 100};
      std::vector<GateCheck> trace;
      const GateOutcome out = EvaluatePolicy(config, GroupGateState{}, batch, {},
                                             JobDirective(r.sp_required, r.pin), nullptr, &trace);
      EXPECT_EQ(out.decision, r.want) << r.name;
      ASSERT_FALSE(trace.empty()) << r.name;
      EXPECT_EQ(trace.front().gate, "pin") << r.name;
      if (r.sp_required) {
        EXPECT_EQ(trace.size(), 1u) << r.name;  // nothing after gate 1 was consulted
        EXPECT_EQ(trace.front().outcome, "fire") << r.name;
        EXPECT_THAT(trace.front().detail, HasSubstr("needs SP")) << r.name;
        EXPECT_FALSE(out.explored) << r.name;
      }
    }
  }
}

// Deciding under the directive advances a group exactly as adopting SP_REQUIRED does (the
// daemon's and the fallback's former path), from any prior state.
TEST(JobDirective, DecideEqualsAdoptingSpRequired) {
  const GateConfig config;
  const Decision priors[] = {{kTp, Reason::kLengthCv},
                             {kTp, Reason::kRsWait},
                             {kSp, Reason::kGatesPassed},
                             {kTp, Reason::kPinned}};
  for (const Decision& prior : priors) {
    GroupPolicyState decided, adopted;
    decided.Adopt(1, prior, config);
    adopted.Adopt(1, prior, config);
    decided.ObserveRsWaitShare(1, kSp, 0.5, config.window_steps);
    adopted.ObserveRsWaitShare(1, kSp, 0.5, config.window_steps);
    const GateOutcome out =
        decided.Decide(config, {.step = 2, .length_cv = 1.0}, JobDirective(true, std::nullopt));
    adopted.Adopt(2, {kSp, Reason::kSpRequired}, config);
    EXPECT_EQ(out.decision, (Decision{kSp, Reason::kSpRequired}));
    const GroupGateState& a = decided.gate();
    const GroupGateState& b = adopted.gate();
    EXPECT_EQ(a.mode, b.mode);
    EXPECT_EQ(a.reason, b.reason);
    EXPECT_EQ(a.last_step, b.last_step);
    EXPECT_EQ(a.last_sp_step, b.last_sp_step);
    EXPECT_EQ(a.mode_switches, b.mode_switches);
    EXPECT_EQ(a.rs_wait_fallback, b.rs_wait_fallback);
    EXPECT_EQ(a.rs_wait_changed_step, b.rs_wait_changed_step);
    EXPECT_EQ(a.decisions, b.decisions);
    EXPECT_EQ(a.has_chosen_mode, b.has_chosen_mode);
    EXPECT_EQ(a.chosen_mode, b.chosen_mode);
    EXPECT_EQ(decided.rs_wait().samples, adopted.rs_wait().samples);
  }
}

// In a step plan the directive outranks unknown lengths too; a pin does not.
TEST(JobDirective, StepPlanSpRequiredOutranksUnknownLengths) {
  const JobLayout l{.pp = 2, .microbatches = 2};
  std::vector<MicrobatchFacts> mbs(2);
  mbs[0] = {.id = 0, .length_cv = 1.0, .tokens = 4096, .memory = {}};
  mbs[1].id = 1;
  mbs[1].lengths_known = false;
  const StagePlanFacts plan{.step = 0, .stage = 1, .microbatches = mbs};
  for (GatePolicyKind policy : {GatePolicyKind::kStatic, GatePolicyKind::kAdaptive}) {
    GateConfig config;
    config.policy = policy;
    GroupPolicyState required;
    EXPECT_THAT(DecideStagePlan(required, config, l, plan, PinDirective(kTp, true), nullptr, true)
                    .decisions,
                Each(Decision{kSp, Reason::kSpRequired}));
    GroupPolicyState pinned;
    const StagePlanOutcome out =
        DecideStagePlan(pinned, config, l, plan, PinDirective(kTp, true), nullptr, false);
    EXPECT_EQ(out.decisions[0], (Decision{kTp, Reason::kPinned}));
    EXPECT_EQ(out.decisions[1], (Decision{kSp, Reason::kLengthsUnknown}));
  }
}

TEST(CheckPlanShape, MicrobatchesNeedALayoutAndALayoutNeedsThem) {
  const JobLayout layout{.pp = 2, .microbatches = 3};
  const auto id = [](int i) { return MicrobatchPlanInput{.id = i, .lengths = {}, .memory = {}}; };
  const std::vector<MicrobatchPlanInput> good = {id(2), id(0), id(1)};
  const std::vector<MicrobatchPlanInput> repeated = {id(0), id(1), id(1)};
  struct Row {
    const char* name;
    const JobLayout* layout;
    PlanShape plan;
    absl::StatusCode code;
    std::string message;  // a substring, "" when OK
  };
  const uint64_t big = kMaxStepPlanBytes;
  const Row rows[] = {
      {"plain plan, no layout", nullptr, {.batch_lengths = true, .microbatches = {}}, absl::StatusCode::kOk, ""},
      {"micro-batches without a layout", nullptr, {.microbatches = good},
       absl::StatusCode::kInvalidArgument, "mbs: job j registered no layout"},
      {"a layout without micro-batches", &layout, {.batch_lengths = true, .microbatches = {}},
       absl::StatusCode::kInvalidArgument, "one entry per micro-batch"},
      {"batch lengths beside micro-batches", &layout,
       {.batch_lengths = true, .microbatches = good}, absl::StatusCode::kInvalidArgument,
       "lengths"},
      {"resident at 2^40", &layout, {.microbatches = good, .resident_bytes = big},
       absl::StatusCode::kInvalidArgument, "resident_bytes"},
      {"budget at 2^40", &layout, {.microbatches = good, .memory_budget_bytes = big},
       absl::StatusCode::kInvalidArgument, "memory_budget_bytes"},
      {"just under 2^40", &layout,
       {.microbatches = good, .resident_bytes = big - 1, .memory_budget_bytes = big - 1},
       absl::StatusCode::kOk, ""},
      {"a repeated id", &layout, {.microbatches = repeated}, absl::StatusCode::kInvalidArgument,
       "id 1 repeats"},
      {"a step plan", &layout, {.microbatches = good}, absl::StatusCode::kOk, ""},
  };
  for (const Row& r : rows) {
    const absl::Status s = CheckPlanShape(r.layout, r.plan, {.kind = "job", .id = "j"}, "mbs");
    EXPECT_EQ(s.code(), r.code) << r.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(r.message)) << r.name;
  }
}

TEST(SummarizeMicrobatch, NamesTheMicrobatchAndSummarisesItsLengths) {
  const std::vector<int64_t> lengths = {100, 300}, bad = {100, 0}, none;
  struct Row {
    const char* name;
    std::vector<int64_t> lengths;
    MicrobatchMemory memory;
    std::string error;  // a substring, "" when OK
  };
  const uint64_t big = kMaxStepPlanBytes;
  const Row rows[] = {
      {"known lengths", lengths, {.activation_sp = 1, .workspace_tp = big - 1}, ""},
      {"unknown lengths", none, {}, ""},
      {"a bad length", bad, {}, "mb[id=7].lengths[1]"},
      {"activation at 2^40", lengths, {.activation_tp = big}, "mb[id=7]: byte counts"},
      {"workspace at 2^40", none, {.workspace_sp = big}, "mb[id=7]: byte counts"},
  };
  for (const Row& r : rows) {
    const absl::StatusOr<MicrobatchFacts> f = SummarizeMicrobatch({.id = 7, .lengths = r.lengths, .memory = r.memory}, "mb");
    if (!r.error.empty()) {
      EXPECT_THAT(f.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(r.error)))
          << r.name;
      continue;
    }
    ASSERT_THAT(f.status(), IsOk()) << r.name;
    EXPECT_EQ(f->id, 7);
    EXPECT_EQ(f->lengths_known, !r.lengths.empty()) << r.name;
    EXPECT_EQ(f->memory.workspace_tp, r.memory.workspace_tp) << r.name;
    if (r.lengths.empty()) continue;
    EXPECT_EQ(f->tokens, 400);
    EXPECT_DOUBLE_EQ(f->length_cv, 0.5);  // stddev 100 over mean 200
  }
}

TEST(IsForcedReason, ThePoliciesOwnChoicesAreNotForced) {
  const std::pair<Reason, bool> rows[] = {
      {Reason::kGatesPassed, false},      {Reason::kLengthCv, false},
      {Reason::kRsWait, false},           {Reason::kProbe, false},
      {Reason::kMemoryRequiresSp, true},  {Reason::kMemoryOverBudget, true},
      {Reason::kPinned, true},            {Reason::kControllerUnavailable, false},
      {Reason::kAdaptive, false},         {Reason::kLengthsUnknown, true},
      {Reason::kSpRequired, true},
  };
  static_assert(std::size(rows) == kNumReasons - 1, "a row per reason");
  for (const auto& [reason, forced] : rows) {
    EXPECT_EQ(IsForcedReason(reason), forced) << ReasonLabel(reason);
  }
}

TEST(PackModeReason, EveryDecisionRoundTripsAndNothingElseUnpacks) {
  for (Mode m : {kSp, kTp}) {
    for (int r = 1; r < kNumReasons; ++r) {
      const Decision d{m, static_cast<Reason>(r)};
      const uint8_t b = PackModeReason(d);
      EXPECT_EQ(b >> 4, static_cast<int>(m));
      EXPECT_EQ(UnpackModeReason(b), d) << int{b};
    }
  }
  EXPECT_EQ(PackModeReason({kTp, Reason::kRsWait}), 0x23);  // the byte on the wire
  EXPECT_EQ(PackModeReason({kSp, Reason::kSpRequired}), 0x1B);
  for (int b : {0x00, 0x10, 0x20, 0x1C, 0x2F, 0x01, 0x31, 0xFF}) {
    EXPECT_EQ(UnpackModeReason(static_cast<uint8_t>(b)), std::nullopt) << b;
  }
}

}  // namespace
}  // namespace spgate
