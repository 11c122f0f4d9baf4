// DecisionBook: the leader's plans, the daemon's answers and refusals, the commit of each
// step in order, and the worker's memory gate over the daemon's TP-only answers — driven
// directly, no gRPC, no threads (worker/client/decision_book.h).
#include "worker/client/decision_book.h"

#include <optional>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"
#include "worker/client/wire.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

}  // namespace

void PrintTo(const GateDecision& d, std::ostream* os) {
  *os << "{step " << d.step << ", " << ModeLabel(d.mode) << ", " << ReasonLabel(d.reason)
      << " (policy " << ReasonLabel(d.policy_reason) << "), source "
      << static_cast<int>(d.source) << ", config v" << d.config_version << ", pin "
      << (d.pin_expire ? "until set" : "none") << (d.pin_forced ? " forced" : "")
      << ", micro-batches " << ::testing::PrintToString(d.microbatches) << ", stage peak "
      << d.stage_peak_bytes << "}";
}

namespace {

// A plain plan: its one micro-batch (decision_book.h), lengths {100} of length CV `cv`.
PlanRecord Plan(int64_t step, double cv = 0.0) {
  PlanRecord p;
  p.step = step;
  p.microbatches = {{.length_cv = cv, .tokens = 100}};
  p.lengths = {{100}};
  return p;
}

GateDecision Daemon(int64_t step, Mode mode, Reason reason, int64_t version = 5) {
  GateDecision d;
  d.step = step;
  d.mode = mode;
  d.reason = reason;
  d.policy_reason = reason;
  d.source = DecisionSource::kDaemon;
  d.config_version = version;
  return d;  // a plain plan's answer as the wire gives it: its one decision in mode, reason
}

TEST(DecisionBookTest, PlansMustIncreaseAndBeUnique) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(3)), IsOk());
  EXPECT_THAT(book.AddPlan(Plan(3)), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("3")));
  (void)book.Commit(3, kNow);
  EXPECT_THAT(book.AddPlan(Plan(2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already decided")));
  EXPECT_THAT(book.AddPlan(Plan(3)), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(book.AddPlan(Plan(4)), IsOk());
}

// The writer takes the book's records over, never a copy: the record it holds is the one
// the book keeps (the transport fields it marks are seen by both), and it outlives the
// commit that drops the book's hold.
TEST(DecisionBookTest, PlansAreHandedOverNotCopied) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  auto record = std::make_shared<PlanRecord>(Plan(1));
  std::shared_ptr<const PlanRecord> writer = record;
  ASSERT_THAT(book.AddPlan(std::move(record)), IsOk());
  ASSERT_EQ(book.plans().at(1).get(), writer.get());
  book.plans().at(1)->sent_on_stream = 7;
  EXPECT_EQ(writer->sent_on_stream, 7u);
  (void)book.Commit(1, kNow);
  EXPECT_TRUE(book.plans().empty());
  EXPECT_EQ(writer.use_count(), 1);
  ASSERT_EQ(writer->lengths.size(), 1u);
  EXPECT_EQ(writer->lengths.front(), std::vector<int64_t>{100});
}

TEST(DecisionBookTest, OverTheLimitTheOldestPlanIsDropped) {
  DecisionBook book(GateConfig{}, 2, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(1)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(2)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(3)), IsOk());
  EXPECT_EQ(book.counters().plans_dropped, 1);
  EXPECT_THAT(book.Lookup(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no plan")));
  EXPECT_THAT(book.Lookup(2), IsOk());
}

// A committed or dropped plan's record and map node are kept for the next plans, a record
// only when the book holds its last reference (a writer still holding one keeps its
// record), at most four of each.
TEST(DecisionBookTest, RecordsTheBookAloneHoldsAreRecycled) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  const std::vector<int64_t> lengths = {100, 200};
  std::vector<const PlanRecord*> made;
  for (int64_t step = 1; step <= 3; ++step) {
    std::shared_ptr<PlanRecord> rec = book.NewRecord();
    ASSERT_THAT(MakePlanRecord(nullptr, {.step = step, .lengths = lengths}, 0, rec.get()),
                IsOk());
    made.push_back(rec.get());
    ASSERT_THAT(book.AddPlan(std::move(rec)), IsOk());
  }
  EXPECT_EQ(book.spare_records(), 0u);
  std::shared_ptr<const PlanRecord> writer = book.plans().at(2);  // still being sent
  (void)book.Commit(3, kNow);
  EXPECT_EQ(book.spare_records(), 2u);  // steps 1 and 3
  EXPECT_EQ(book.spare_nodes(), 3u);
  EXPECT_EQ(writer->step, 2);  // untouched
  const std::shared_ptr<PlanRecord> first = book.NewRecord(), second = book.NewRecord();
  EXPECT_THAT((std::vector<const PlanRecord*>{first.get(), second.get()}),
              ::testing::UnorderedElementsAre(made[0], made[2]));
  EXPECT_EQ(book.spare_records(), 0u);
  EXPECT_NE(book.NewRecord().get(), writer.get());  // a new one: the writer's is not a spare

  // A reused node carries its new step, and the spares stay bounded.
  for (int64_t step = 4; step <= 13; ++step) ASSERT_THAT(book.AddPlan(Plan(step)), IsOk());
  EXPECT_EQ(book.spare_nodes(), 0u);
  ASSERT_EQ(book.plans().size(), 10u);
  EXPECT_EQ(book.plans().begin()->first, 4);
  EXPECT_EQ(book.plans().begin()->second->step, 4);
  (void)book.Commit(13, kNow);
  EXPECT_EQ(book.spare_records(), 4u);
  EXPECT_EQ(book.spare_nodes(), 4u);

  // A copy (a shadow) starts without spares, and a record both books hold is neither's.
  ASSERT_THAT(book.AddPlan(Plan(14)), IsOk());
  DecisionBook shadow = book;
  EXPECT_EQ(shadow.spare_records(), 0u);
  EXPECT_EQ(shadow.spare_nodes(), 0u);
  const PlanRecord* shared = book.plans().at(14).get();
  (void)shadow.Commit(14, kNow);
  EXPECT_EQ(shadow.spare_records(), 0u);
  EXPECT_EQ(book.plans().at(14).get(), shared);
  EXPECT_EQ(book.plans().at(14)->step, 14);
}

// A record whose lengths hold room for more than 2^16 sequences is freed, not kept.
TEST(DecisionBookTest, AHugePlansRecordIsNotKept) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  const std::vector<int64_t> huge(70'000, 8), small = {8, 9};
  for (const auto& [step, lengths] :
       {std::pair{int64_t{1}, &huge}, std::pair{int64_t{2}, &small}}) {
    std::shared_ptr<PlanRecord> rec = book.NewRecord();
    ASSERT_THAT(MakePlanRecord(nullptr, {.step = step, .lengths = *lengths}, 0, rec.get()),
                IsOk());
    ASSERT_THAT(book.AddPlan(std::move(rec)), IsOk());
    (void)book.Commit(step, kNow);
    EXPECT_EQ(book.spare_records(), step == 1 ? 0u : 1u) << "step " << step;
    EXPECT_EQ(book.spare_nodes(), 1u);
  }
}

TEST(DecisionBookTest, DaemonAnswerIsCommittedAndAdvancesTheFallback) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(1)), IsOk());
  ASSERT_FALSE(book.Answered(1));
  book.OnDaemonDecision(Daemon(0, Mode::kSequenceParallel, Reason::kGatesPassed));
  ASSERT_NE(book.OnDaemonDecision(Daemon(1, Mode::kTensorParallelOnly, Reason::kRsWait)), nullptr);
  EXPECT_TRUE(book.Answered(1));
  EXPECT_EQ(book.Commit(0, kNow).reason, Reason::kGatesPassed);
  const GateDecision d = book.Commit(1, kNow);
  EXPECT_EQ(d.source, DecisionSource::kDaemon);
  EXPECT_EQ(d.reason, Reason::kRsWait);
  EXPECT_EQ(d.config_version, 5);
  // The fallback now stands where the daemon does: in the RS_WAIT fallback with the last
  // SP step at 0, so a local decision of step 2 (no new wait share, the next probe due at
  // step 200) stays TP-only for RS_WAIT.
  ASSERT_THAT(book.AddPlan(Plan(2)), IsOk());
  const GateDecision local = book.Commit(2, kNow);
  EXPECT_EQ(local.source, DecisionSource::kFallback);
  EXPECT_EQ(local.mode, Mode::kTensorParallelOnly);
  EXPECT_EQ(local.reason, Reason::kControllerUnavailable);
  EXPECT_EQ(local.policy_reason, Reason::kRsWait);
  EXPECT_EQ(book.counters().daemon_decisions, 2);
  EXPECT_EQ(book.counters().local_decisions, 1);
  EXPECT_EQ(book.counters().local_decisions_by_reason[static_cast<int>(Reason::kRsWait)], 1);
}

TEST(DecisionBookTest, APlainAnswerCarriesItsOneDecisionWithoutAVector) {
  // The wire makes no micro-batch vector for a plain plan's answer (it is decoded on the
  // gRPC thread and committed on the training thread: no heap round trip between them);
  // the book reads its one decision from mode and reason, and takes a one-element list too,
  // whose entry is the decision (the header's reason differs here to tell which is read).
  v1::Decision wire;
  wire.set_step(0);
  wire.set_mode(v1::TENSOR_PARALLEL_ONLY);
  wire.set_reason(v1::RS_WAIT);
  wire.set_config_version(5);
  const std::optional<GateDecision> plain = DecisionFromProto(wire);
  ASSERT_TRUE(plain.has_value());
  EXPECT_TRUE(plain->microbatches.empty());
  EXPECT_EQ(plain->mode, Mode::kTensorParallelOnly);
  EXPECT_EQ(plain->reason, Reason::kRsWait);

  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(1)), IsOk());
  ASSERT_NE(book.OnDaemonDecision(*plain), nullptr);
  GateDecision listed = Daemon(1, Mode::kTensorParallelOnly, Reason::kRsWait);
  listed.microbatches = {{Mode::kTensorParallelOnly, Reason::kLengthCv}};
  ASSERT_NE(book.OnDaemonDecision(listed), nullptr);
  for (const auto& [step, reason] :
       {std::pair{0, Reason::kRsWait}, std::pair{1, Reason::kLengthCv}}) {
    const GateDecision d = book.Commit(step, kNow);
    EXPECT_EQ(d.source, DecisionSource::kDaemon) << "step " << step;
    EXPECT_EQ(d.mode, Mode::kTensorParallelOnly) << "step " << step;
    EXPECT_EQ(d.reason, reason) << "step " << step;
    EXPECT_TRUE(d.microbatches.empty()) << "step " << step << ": a plain plan's caller sees none";
  }
  EXPECT_EQ(book.counters().daemon_decisions, 2);
  EXPECT_EQ(book.counters().local_decisions, 0);
}

TEST(DecisionBookTest, LookupReturnsTheCommittedDecisionAgainAndRefusesOlderSteps) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(7, /*cv=*/0.5)), IsOk());
  auto before = book.Lookup(7);
  ASSERT_THAT(before.status(), IsOk());
  EXPECT_FALSE(before->has_value());
  const GateDecision d = book.Commit(7, kNow);
  EXPECT_EQ(d.policy_reason, Reason::kLengthCv);
  auto again = book.Lookup(7);
  ASSERT_THAT(again.status(), IsOk());
  ASSERT_TRUE(again->has_value());
  EXPECT_EQ(**again, d);
  EXPECT_THAT(book.Lookup(6).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("before the last")));
}

TEST(DecisionBookTest, AnswersForCommittedStepsAreLateAndChangeNothing) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0)), IsOk());
  const GateDecision local = book.Commit(0, kNow);
  EXPECT_EQ(book.OnDaemonDecision(Daemon(0, Mode::kTensorParallelOnly, Reason::kPinned)), nullptr);
  EXPECT_EQ(book.counters().late_decisions, 1);
  EXPECT_EQ(**book.Lookup(0), local);
  // An answer for a step without a plan is not ours.
  EXPECT_EQ(book.OnDaemonDecision(Daemon(9, Mode::kSequenceParallel, Reason::kGatesPassed)), nullptr);
  EXPECT_EQ(book.counters().decisions_received, 0);
}

TEST(DecisionBookTest, RejectionMeansDecideLocallyWithoutWaiting) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(4)), IsOk());
  EXPECT_TRUE(book.OnRejection(4));
  EXPECT_TRUE(book.Answered(4));
  EXPECT_EQ(book.Commit(4, kNow).source, DecisionSource::kFallback);
  EXPECT_FALSE(book.OnRejection(4)) << "a refusal for a committed step is ignored";
  EXPECT_EQ(book.counters().plans_rejected, 1);
}

TEST(DecisionBookTest, CommitForgetsEverythingUpToTheStep) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  for (int64_t s : {1, 2, 3}) ASSERT_THAT(book.AddPlan(Plan(s)), IsOk());
  book.OnDaemonDecision(Daemon(1, Mode::kSequenceParallel, Reason::kGatesPassed));
  book.OnDaemonDecision(Daemon(3, Mode::kTensorParallelOnly, Reason::kLengthCv));
  (void)book.Commit(2, kNow);  // 1 was skipped by the trainer
  EXPECT_EQ(book.plans().size(), 1u);
  EXPECT_FALSE(book.Answered(1));
  EXPECT_TRUE(book.Answered(3));
  EXPECT_EQ(book.Commit(3, kNow).reason, Reason::kLengthCv);
}

TEST(DecisionBookTest, WithoutAControllerLocalDecisionsKeepTheGatesReason) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kLocalOnly);
  ASSERT_THAT(book.AddPlan(Plan(0, /*cv=*/0.5)), IsOk());
  const GateDecision d = book.Commit(0, kNow);
  EXPECT_EQ(d.source, DecisionSource::kLocalOnly);
  EXPECT_EQ(d.reason, Reason::kLengthCv);
}

TEST(DecisionBookTest, ScheduledConfigAppliesFromItsStep) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  GateConfig loose;
  loose.max_length_cv = 0.9;
  book.ScheduleConfig(loose, 8, /*effective_from_step=*/2);
  ASSERT_THAT(book.AddPlan(Plan(1, 0.5)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(2, 0.5)), IsOk());
  const GateDecision d1 = book.Commit(1, kNow);
  const GateDecision d2 = book.Commit(2, kNow);
  EXPECT_EQ(d1.policy_reason, Reason::kLengthCv);
  EXPECT_EQ(d1.config_version, 0);
  EXPECT_EQ(d2.policy_reason, Reason::kGatesPassed);
  EXPECT_EQ(d2.config_version, 8);
}

TEST(DecisionBookTest, APinHeardFromTheDaemonHoldsUntilItEndsThenTheGatesDecide) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  for (int64_t s = 0; s < 4; ++s) ASSERT_THAT(book.AddPlan(Plan(s, /*cv=*/0.0)), IsOk());
  GateDecision pinned = Daemon(0, Mode::kTensorParallelOnly, Reason::kPinned);
  pinned.pin_expire = kNow + absl::Minutes(10);
  book.OnDaemonDecision(pinned);
  ASSERT_EQ(book.Commit(0, kNow).reason, Reason::kPinned);
  // The daemon is away: the pin still holds while it lasts...
  EXPECT_EQ(book.Commit(1, kNow + absl::Minutes(9)).policy_reason, Reason::kPinned);
  // ...and not after, when the gates decide again (CV 0: SP).
  const GateDecision after = book.Commit(2, kNow + absl::Minutes(10));
  EXPECT_EQ(after.policy_reason, Reason::kGatesPassed);
  EXPECT_EQ(after.mode, Mode::kSequenceParallel);
}

TEST(DecisionBookTest, AnUnforcedTpPinHeardFromTheDaemonYieldsToMemoryLocallyToo) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0)), IsOk());
  PlanRecord big = Plan(1);
  big.budget = 1000;
  big.microbatches[0].memory = {.activation_sp = 500, .activation_tp = 950};  // TP over 0.9 x budget
  ASSERT_THAT(book.AddPlan(big), IsOk());
  GateDecision pinned = Daemon(0, Mode::kTensorParallelOnly, Reason::kPinned);
  pinned.pin_expire = kNow + absl::Hours(1);
  book.OnDaemonDecision(pinned);
  (void)book.Commit(0, kNow);
  const GateDecision local = book.Commit(1, kNow);
  EXPECT_EQ(local.mode, Mode::kSequenceParallel);
  EXPECT_EQ(local.policy_reason, Reason::kMemoryRequiresSp);
}

// ---- The worker's memory gate over the daemon's answers ----

// A plan with a 1,000-byte budget: under the default memory_headroom (0.9) either mode
// fits when its predicted peak is at most 900 bytes.
PlanRecord MemoryPlan(int64_t step, uint64_t peak_sp, uint64_t peak_tp, uint64_t budget = 1000) {
  PlanRecord p = Plan(step);
  p.microbatches[0].memory = {.activation_sp = peak_sp, .activation_tp = peak_tp};
  p.budget = budget;
  return p;
}

TEST(DecisionBookMemoryGateTest, ADaemonTpOnlyAnswerRunsOnlyWhenItFits) {
  struct Case {
    const char* name;
    uint64_t peak_sp, peak_tp, budget;
    Mode answer_mode;
    Reason answer_reason;
    bool pin_forced;
    // What runs:
    Mode mode;
    Reason reason;
    DecisionSource source;
  };
  const Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
  const DecisionSource kDaemon = DecisionSource::kDaemon;
  const DecisionSource kOverride = DecisionSource::kMemoryOverride;
  const Case cases[] = {
      {"TP-only that fits runs", 500, 800, 1000, kTp, Reason::kLengthCv, false,
       kTp, Reason::kLengthCv, kDaemon},
      {"TP-only at exactly budget x headroom fits", 500, 900, 1000, kTp, Reason::kRsWait, false,
       kTp, Reason::kRsWait, kDaemon},
      {"TP-only over the limit runs SP", 500, 950, 1000, kTp, Reason::kLengthCv, false,
       kSp, Reason::kMemoryRequiresSp, kOverride},
      {"neither fits: SP, over budget", 920, 950, 1000, kTp, Reason::kLengthCv, false,
       kSp, Reason::kMemoryOverBudget, kOverride},
      {"an unforced TP-only pin over the limit runs SP", 500, 950, 1000, kTp, Reason::kPinned,
       false, kSp, Reason::kMemoryRequiresSp, kOverride},
      {"a forced TP-only pin runs as forced", 500, 950, 1000, kTp, Reason::kPinned, true,
       kTp, Reason::kPinned, kDaemon},
      {"an SP answer is unchanged", 920, 950, 1000, kSp, Reason::kGatesPassed, false,
       kSp, Reason::kGatesPassed, kDaemon},
      {"no budget: no memory gate", 500, uint64_t{1} << 50, 0, kTp, Reason::kLengthCv, false,
       kTp, Reason::kLengthCv, kDaemon},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
    ASSERT_THAT(book.AddPlan(MemoryPlan(3, c.peak_sp, c.peak_tp, c.budget)), IsOk());
    GateDecision answer = Daemon(3, c.answer_mode, c.answer_reason, /*version=*/5);
    answer.pin_forced = c.pin_forced;
    if (c.answer_reason == Reason::kPinned) answer.pin_expire = kNow + absl::Hours(1);
    ASSERT_NE(book.OnDaemonDecision(answer), nullptr);
    const GateDecision d = book.Commit(3, kNow);
    EXPECT_EQ(d.step, 3);
    EXPECT_EQ(d.mode, c.mode);
    EXPECT_EQ(d.reason, c.reason);
    EXPECT_EQ(d.policy_reason, c.reason);
    EXPECT_EQ(d.source, c.source);
    const bool overridden = c.source == kOverride;
    EXPECT_EQ(book.counters().memory_overrides, overridden ? 1 : 0);
    EXPECT_EQ(book.counters().daemon_decisions, overridden ? 0 : 1);
    EXPECT_EQ(book.counters().local_decisions, 0);
    if (overridden) {
      EXPECT_EQ(d.config_version, 0) << "the worker's config judged it";
      EXPECT_EQ(d.pin_expire, std::nullopt);
      EXPECT_FALSE(d.pin_forced);
    } else {
      EXPECT_EQ(d, answer);  // a plain plan's: no micro-batch list, as the wire gives it
    }
    EXPECT_EQ(**book.Lookup(3), d) << "asking again gives what ran";
  }
}

// The limit is budget x memory_headroom of the config in force for the step (the one a
// local decision of that step would use), not of the config at the time of the answer.
TEST(DecisionBookMemoryGateTest, TheConfigInForceForTheStepSetsTheLimit) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  GateConfig roomy;
  roomy.memory_headroom = 0.99;
  book.ScheduleConfig(roomy, 9, /*effective_from_step=*/2);
  ASSERT_THAT(book.AddPlan(MemoryPlan(1, 500, 950)), IsOk());
  ASSERT_THAT(book.AddPlan(MemoryPlan(2, 500, 950)), IsOk());
  book.OnDaemonDecision(Daemon(1, Mode::kTensorParallelOnly, Reason::kLengthCv, 9));
  book.OnDaemonDecision(Daemon(2, Mode::kTensorParallelOnly, Reason::kLengthCv, 9));
  const GateDecision d1 = book.Commit(1, kNow);  // 950 > 0.9 x 1000
  EXPECT_EQ(d1.mode, Mode::kSequenceParallel);
  EXPECT_EQ(d1.source, DecisionSource::kMemoryOverride);
  EXPECT_EQ(d1.config_version, 0);
  const GateDecision d2 = book.Commit(2, kNow);  // 950 <= 0.99 x 1000
  EXPECT_EQ(d2.mode, Mode::kTensorParallelOnly);
  EXPECT_EQ(d2.source, DecisionSource::kDaemon);
  EXPECT_EQ(book.counters().memory_overrides, 1);
}

// The fallback's group state adopts the SP step that ran, not the daemon's TP-only: had it
// adopted the daemon's RS_WAIT answer it would be in the RS_WAIT fallback with its last SP
// step at 0, and its next local decision (CV 0, no wait samples, the next probe due at
// step 200) would be TP-only for RS_WAIT, as in DaemonAnswerIsCommittedAndAdvancesTheFallback.
TEST(DecisionBookMemoryGateTest, TheFallbackAdoptsWhatRan) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0)), IsOk());
  ASSERT_THAT(book.AddPlan(MemoryPlan(1, 500, 950)), IsOk());
  ASSERT_THAT(book.AddPlan(Plan(2)), IsOk());
  book.OnDaemonDecision(Daemon(0, Mode::kSequenceParallel, Reason::kGatesPassed));
  book.OnDaemonDecision(Daemon(1, Mode::kTensorParallelOnly, Reason::kRsWait));
  ASSERT_EQ(book.Commit(0, kNow).source, DecisionSource::kDaemon);
  ASSERT_EQ(book.Commit(1, kNow).source, DecisionSource::kMemoryOverride);
  const GateDecision local = book.Commit(2, kNow);
  EXPECT_EQ(local.source, DecisionSource::kFallback);
  EXPECT_EQ(local.mode, Mode::kSequenceParallel);
  EXPECT_EQ(local.policy_reason, Reason::kGatesPassed);
}

// A local decision never needs the override: the fallback runs the same memory gate.
TEST(DecisionBookMemoryGateTest, LocalDecisionsAreNotOverrides) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(MemoryPlan(1, 500, 950)), IsOk());
  const GateDecision d = book.Commit(1, kNow);
  EXPECT_EQ(d.source, DecisionSource::kFallback);
  EXPECT_EQ(d.policy_reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(book.counters().memory_overrides, 0);
  EXPECT_EQ(book.counters().local_decisions, 1);
}


// The last committed plan bounds its step's telemetry (docs/design.md §2, "Range rules"):
// its tokens, for that step only, and nothing when the plan's lengths are not known.
TEST(DecisionBookTest, TheLastCommittedPlanBoundsItsStepsTelemetry) {
  DecisionBook book(GateConfig{}, 16, DecisionSource::kFallback);
  PlanRecord p = Plan(3);
  p.lengths = {{100, 200}};
  p.microbatches[0].tokens = 300;
  ASSERT_THAT(book.AddPlan(std::move(p)), IsOk());
  PlanRecord unknown = Plan(4);
  unknown.microbatches[0].lengths_known = false;
  ASSERT_THAT(book.AddPlan(std::move(unknown)), IsOk());
  EXPECT_EQ(book.TelemetryBoundsFor(3).plan_tokens, -1) << "not committed yet";
  book.Commit(3, kNow);
  const TelemetryBounds b = book.TelemetryBoundsFor(3);
  EXPECT_EQ(b.plan_tokens, 300);
  EXPECT_THAT(std::vector<int64_t>(b.microbatch_tokens.begin(), b.microbatch_tokens.end()),
              ::testing::ElementsAre(300));
  EXPECT_THAT(ValidateStepTelemetry({.step = 3, .mode = 1, .step_time_s = 1,
                                     .effective_tokens = 301},
                                    b),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("telemetry.effective_tokens: 301 exceeds the plan's 300")));
  EXPECT_EQ(book.TelemetryBoundsFor(2).plan_tokens, -1) << "another step: not known";
  book.Commit(4, kNow);
  EXPECT_EQ(book.TelemetryBoundsFor(3).plan_tokens, -1) << "only the last committed step";
  EXPECT_EQ(book.TelemetryBoundsFor(4).plan_tokens, -1) << "no token count: not bounded";
}

// --- step plans (docs/design.md §12) ---

namespace step_plans {

const JobLayout kLayout{.tp = 2, .pp = 4, .microbatches = 4};

GateConfig FullHeadroom() {
  GateConfig c;
  c.memory_headroom = 1.0;
  c.max_length_cv = 0.5;
  return c;
}

// Four micro-batches of lengths {1, 1, 10} (CV above 0.5: TP-only wanted), 10 / 20 bytes of
// activations under SP / TP-only, resident 100: on stage 0 of 4 (four in flight) a budget
// of 145 fits SP (140) but no TP-only micro-batch.
PlanRecord StepPlan(int64_t step, uint64_t budget = 145) {
  static const std::vector<int64_t> kLengths = {1, 1, 10};
  std::vector<MicrobatchPlanInput> mbs;
  for (int id = 3; id >= 0; --id) {  // any order: keyed by id
    mbs.push_back({.id = id, .lengths = kLengths,
                   .memory = {.activation_sp = 10, .activation_tp = 20}});
  }
  PlanRecord rec;
  EXPECT_THAT(MakePlanRecord(&kLayout,
                             {.step = step, .memory_budget_bytes = budget, .microbatches = mbs,
                              .resident_bytes = 100},
                             /*default_budget=*/0, &rec),
              IsOk());
  return rec;
}

TEST(DecisionBookStepPlanTest, TheStageGateOverridesADaemonTpOnlyAnswerThatDoesNotFit) {
  DecisionBook book(FullHeadroom(), 16, DecisionSource::kFallback,
                    {.layout = kLayout, .stage = 0});
  ASSERT_THAT(book.AddPlan(StepPlan(0)), IsOk());
  GateDecision d = Daemon(0, Mode::kTensorParallelOnly, Reason::kLengthCv);
  d.microbatches.assign(4, {Mode::kTensorParallelOnly, Reason::kLengthCv});
  book.OnDaemonDecision(d);
  const GateDecision ran = book.Commit(0, kNow);
  EXPECT_EQ(ran.source, DecisionSource::kMemoryOverride);
  ASSERT_EQ(ran.microbatches.size(), 4u);
  for (const Decision& m : ran.microbatches) {
    EXPECT_EQ(m, (Decision{Mode::kSequenceParallel, Reason::kMemoryRequiresSp}));
  }
  EXPECT_EQ(ran.stage_peak_bytes, 140u);
  EXPECT_EQ(book.counters().memory_overrides, 1);

  // A daemon answer that fits runs as it came; the local decision is the policy's.
  ASSERT_THAT(book.AddPlan(StepPlan(1, /*budget=*/0)), IsOk());
  d = Daemon(1, Mode::kTensorParallelOnly, Reason::kLengthCv);
  d.microbatches.assign(4, {Mode::kTensorParallelOnly, Reason::kLengthCv});
  book.OnDaemonDecision(d);
  EXPECT_EQ(book.Commit(1, kNow).source, DecisionSource::kDaemon);
  ASSERT_THAT(book.AddPlan(StepPlan(2)), IsOk());
  const GateDecision local = book.Commit(2, kNow);
  EXPECT_EQ(local.source, DecisionSource::kFallback);
  EXPECT_EQ(local.reason, Reason::kControllerUnavailable);
  ASSERT_EQ(local.microbatches.size(), 4u);
  EXPECT_EQ(local.microbatches[0], (Decision{Mode::kSequenceParallel, Reason::kMemoryRequiresSp}));
  // One local commit; by reason, one per micro-batch decided, as the daemon counts its
  // decisions (spgate_decisions_total), so the local share compares like with like.
  EXPECT_EQ(book.counters().local_decisions, 1);
  std::array<int64_t, kNumReasons> by_reason{};
  for (const Decision& m : local.microbatches) ++by_reason[static_cast<int>(m.reason)];
  EXPECT_EQ(book.counters().local_decisions_by_reason, by_reason);
  EXPECT_EQ(by_reason[static_cast<int>(Reason::kMemoryRequiresSp)] +
                by_reason[static_cast<int>(Reason::kLengthCv)] +
                by_reason[static_cast<int>(Reason::kGatesPassed)],
            4);
}

TEST(DecisionBookStepPlanTest, AnAnswerForAnotherNumberOfMicrobatchesIsDecidedLocally) {
  DecisionBook book(FullHeadroom(), 16, DecisionSource::kFallback,
                    {.layout = kLayout, .stage = 3});
  ASSERT_THAT(book.AddPlan(StepPlan(0)), IsOk());
  GateDecision d = Daemon(0, Mode::kSequenceParallel, Reason::kGatesPassed);
  d.microbatches.assign(2, {Mode::kSequenceParallel, Reason::kGatesPassed});
  book.OnDaemonDecision(d);
  const GateDecision ran = book.Commit(0, kNow);
  EXPECT_EQ(ran.source, DecisionSource::kFallback);
  ASSERT_EQ(ran.microbatches.size(), 4u);
  EXPECT_EQ(ran.microbatches[3], (Decision{Mode::kTensorParallelOnly, Reason::kLengthCv}));
}

// A plain plan's answer is one decision: an answer of more micro-batches is not its answer.
TEST(DecisionBookStepPlanTest, APlainPlansAnswerOfMoreMicrobatchesIsDecidedLocally) {
  DecisionBook book(FullHeadroom(), 16, DecisionSource::kFallback);
  ASSERT_THAT(book.AddPlan(Plan(0, /*cv=*/2.0)), IsOk());
  GateDecision d = Daemon(0, Mode::kSequenceParallel, Reason::kGatesPassed);
  d.microbatches.assign(2, {Mode::kSequenceParallel, Reason::kGatesPassed});
  book.OnDaemonDecision(d);
  const GateDecision ran = book.Commit(0, kNow);
  EXPECT_EQ(ran.source, DecisionSource::kFallback);
  EXPECT_EQ(ran.policy_reason, Reason::kLengthCv);
  EXPECT_TRUE(ran.microbatches.empty());
}

// An override keeps the answer's pin while a PINNED micro-batch still runs: an unforced
// TP-only pin over four micro-batches where (budget 150) only micro-batch 0 fits TP-only.
// When none runs, the override carries no pin, as a plain plan's does.
TEST(DecisionBookStepPlanTest, AnOverrideKeepsThePinOnlyWhileAPinnedMicrobatchRuns) {
  for (const uint64_t budget : {150u, 145u}) {
    SCOPED_TRACE(budget);
    DecisionBook book(FullHeadroom(), 16, DecisionSource::kFallback,
                      {.layout = kLayout, .stage = 0});
    ASSERT_THAT(book.AddPlan(StepPlan(0, budget)), IsOk());
    GateDecision d = Daemon(0, Mode::kTensorParallelOnly, Reason::kPinned);
    d.microbatches.assign(4, {Mode::kTensorParallelOnly, Reason::kPinned});
    d.pin_expire = kNow + absl::Hours(1);
    book.OnDaemonDecision(d);
    const GateDecision ran = book.Commit(0, kNow);
    EXPECT_EQ(ran.source, DecisionSource::kMemoryOverride);
    const Decision sp{Mode::kSequenceParallel, Reason::kMemoryRequiresSp};
    const Decision pinned{Mode::kTensorParallelOnly, Reason::kPinned};
    if (budget == 150) {
      EXPECT_THAT(ran.microbatches, ::testing::ElementsAre(pinned, sp, sp, sp));
      EXPECT_EQ(ran.stage_peak_bytes, 150u);
      EXPECT_EQ(ran.pin_expire, d.pin_expire);
    } else {
      EXPECT_THAT(ran.microbatches, ::testing::ElementsAre(sp, sp, sp, sp));
      EXPECT_EQ(ran.pin_expire, std::nullopt);
    }
    EXPECT_EQ(book.counters().memory_overrides, 1);
  }
}

TEST(DecisionBookStepPlanTest, MakePlanRecordNamesWhatIsWrong) {
  const std::vector<int64_t> lengths = {5};
  std::vector<MicrobatchPlanInput> mbs = {{.id = 0, .lengths = lengths},
                                          {.id = 1, .lengths = lengths},
                                          {.id = 1, .lengths = lengths},
                                          {.id = 3, .lengths = lengths}};
  PlanRecord rec;
  EXPECT_THAT(MakePlanRecord(&kLayout, {.microbatches = mbs}, 0, &rec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 1 repeats")));
  mbs[2].id = 2;
  EXPECT_THAT(MakePlanRecord(&kLayout, {.lengths = lengths, .microbatches = mbs}, 0, &rec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths")));
  mbs[1].memory.activation_tp = uint64_t{1} << 41;
  EXPECT_THAT(MakePlanRecord(&kLayout, {.microbatches = mbs}, 0, &rec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("microbatches[id=1]")));
  EXPECT_THAT(MakePlanRecord(&kLayout, {}, 0, &rec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one entry per micro-batch")));
}

// MakePlanRecord into a record that held another plan (a spare) gives what it gives into a
// new one: nothing of the last plan stays but its buffers' capacity.
TEST(DecisionBookStepPlanTest, ARefilledRecordEqualsANewOne) {
  const std::vector<int64_t> many = {5, 6, 7, 8, 9, 10, 11, 12}, few = {3};
  const std::vector<MicrobatchPlanInput> mbs = {
      {.id = 1, .lengths = few, .memory = {.activation_sp = 7, .activation_tp = 9}},
      {.id = 0, .lengths = many},
      {.id = 3, .lengths = few},
      {.id = 2, .lengths = many, .memory = {.workspace_sp = 4}}};
  struct Input {
    const JobLayout* layout;
    BatchPlanInput plan;
    bool keep_lengths;
  };
  const Input inputs[] = {
      {nullptr, {.step = 1, .lengths = many, .predicted_peak_bytes_sp = 50}, true},
      {nullptr, {.step = 2, .lengths = few, .memory_budget_bytes = 900}, true},
      {nullptr, {.step = 3, .lengths = many}, false},
      {&kLayout, {.step = 4, .microbatches = mbs, .resident_bytes = 100}, true},
      {&kLayout, {.step = 5, .memory_budget_bytes = 7, .microbatches = mbs}, false},
  };
  for (const Input& last : inputs) {
    for (const Input& next : inputs) {
      SCOPED_TRACE(absl::StrFormat("step %d refilled with step %d", last.plan.step,
                                   next.plan.step));
      PlanRecord fresh, reused;
      ASSERT_THAT(MakePlanRecord(next.layout, next.plan, 64, &fresh, next.keep_lengths), IsOk());
      ASSERT_THAT(MakePlanRecord(last.layout, last.plan, 64, &reused, last.keep_lengths), IsOk());
      reused.sent_on_stream = 3;  // the writer's marks
      reused.submitted = reused.taken = kNow;
      ASSERT_THAT(MakePlanRecord(next.layout, next.plan, 64, &reused, next.keep_lengths), IsOk());
      EXPECT_TRUE(reused == fresh);  // every field (PlanRecord's operator==)
    }
  }
}

// A refill keeps the record's buffers (a steady client allocates nothing for its plans):
// a plan of fewer micro-batches and shorter lengths leaves the capacities the last one
// needed.
TEST(DecisionBookStepPlanTest, ARefilledRecordKeepsItsBuffers) {
  const JobLayout two{.tp = 2, .pp = 4, .microbatches = 2};
  const std::vector<int64_t> eight = {1, 2, 3, 4, 5, 6, 7, 8}, three = {1, 2, 3};
  std::vector<MicrobatchPlanInput> four_mbs, two_mbs;
  for (int id = 0; id < 4; ++id) four_mbs.push_back({.id = id, .lengths = eight});
  for (int id = 0; id < 2; ++id) two_mbs.push_back({.id = id, .lengths = three});
  PlanRecord rec;
  ASSERT_THAT(MakePlanRecord(&kLayout, {.step = 1, .microbatches = four_mbs}, 0, &rec), IsOk());
  ASSERT_THAT(MakePlanRecord(&two, {.step = 2, .microbatches = two_mbs}, 0, &rec), IsOk());
  ASSERT_EQ(rec.microbatches.size(), 2u);
  EXPECT_GE(rec.microbatches.capacity(), 4u);
  ASSERT_EQ(rec.lengths.size(), 2u);
  EXPECT_GE(rec.lengths.capacity(), 4u);
  EXPECT_EQ(rec.lengths[1], three);
  EXPECT_GE(rec.lengths[1].capacity(), 8u);
  // A plain plan after them: the same buffers, one entry.
  ASSERT_THAT(MakePlanRecord(nullptr, {.step = 3, .lengths = three}, 0, &rec), IsOk());
  EXPECT_EQ(rec.microbatches.size(), 1u);
  EXPECT_GE(rec.microbatches.capacity(), 4u);
  EXPECT_GE(rec.lengths[0].capacity(), 8u);
}

TEST(DecisionBookStepPlanTest, SpRequiredDecidesSpLocally) {
  DecisionBook book(FullHeadroom(), 16, DecisionSource::kLocalOnly, {.sp_required = true});
  ASSERT_THAT(book.AddPlan(Plan(0, /*cv=*/2.0)), IsOk());
  const GateDecision d = book.Commit(0, kNow);
  EXPECT_EQ(d.mode, Mode::kSequenceParallel);
  EXPECT_EQ(d.reason, Reason::kSpRequired);
}

// A committed step plan bounds each micro-batch's record by its own tokens and the step's
// by their sum (docs/design.md §2, "Range rules").
TEST(DecisionBookStepPlanTest, TheLastCommittedStepPlanBoundsEachMicrobatch) {
  DecisionBook book(FullHeadroom(), 16, DecisionSource::kFallback,
                    {.layout = kLayout, .stage = 0});
  ASSERT_THAT(book.AddPlan(StepPlan(0)), IsOk());
  book.Commit(0, kNow);
  const TelemetryBounds b = book.TelemetryBoundsFor(0);
  EXPECT_EQ(b.plan_tokens, 48);
  EXPECT_THAT(std::vector<int64_t>(b.microbatch_tokens.begin(), b.microbatch_tokens.end()),
              ::testing::ElementsAre(12, 12, 12, 12));
  const MicrobatchTelemetryValues m{.id = 2, .forward_s = 0.1, .backward_s = 0.2,
                                    .effective_tokens = 13};
  EXPECT_THAT(ValidateMicrobatchTelemetry(std::span(&m, 1), 0, b),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("telemetry.micro_batches[id 2].effective_tokens: 13 exceeds "
                                 "the plan's 12 tokens for micro-batch 2")));
}

}  // namespace step_plans

// --- one commit path: a plain plan is the one-micro-batch case (docs/design.md §4) ---

namespace one_path {

const JobLayout kOneMicrobatch{.tp = 2, .pp = 1, .microbatches = 1};
const Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
const DecisionSource kDaemonSource = DecisionSource::kDaemon;
const DecisionSource kOverride = DecisionSource::kMemoryOverride;
const DecisionSource kLocal = DecisionSource::kFallback;

enum class Answer { kNone, kRejected, kGiven };

// One step of a sequence: the plan (a step plan's one micro-batch holds peak_sp / peak_tp
// as its activations, on a stage with nothing resident, so its stage peak is the peak of
// the mode it runs), the daemon's side, and what runs.
struct Row {
  double cv;
  uint64_t peak_sp, peak_tp, budget;
  Answer answer;
  Mode answer_mode;
  Reason answer_reason;
  bool pin_forced;
  Mode mode;
  Reason reason;  // the policy's reason (CONTROLLER_UNAVAILABLE is the source's)
  DecisionSource source;
  int64_t config_version;
};

// A plain book, or a book of one-micro-batch step plans, with the config of version 9
// (memory_headroom 0.99) in force from step 10.
DecisionBook Book(bool step_plans, bool sp_required) {
  DecisionBook book(GateConfig{}, 64, DecisionSource::kFallback,
                    {.layout = step_plans ? std::optional(kOneMicrobatch) : std::nullopt,
                     .sp_required = sp_required});
  GateConfig roomy;
  roomy.memory_headroom = 0.99;
  book.ScheduleConfig(roomy, 9, /*effective_from_step=*/10);
  return book;
}

// The one record of either shape (only the book's layout differs).
PlanRecord RowPlan(int64_t step, const Row& r) {
  PlanRecord p;
  p.step = step;
  p.budget = r.budget;
  p.microbatches = {{.length_cv = r.cv, .tokens = 100,
                     .memory = {.activation_sp = r.peak_sp, .activation_tp = r.peak_tp}}};
  p.lengths = {{100}};
  return p;
}

// Runs `rows` as steps 0, 1, ... and checks every field of every committed decision and
// the book's counters; the same rows hold for either plan shape.
void RunSequence(std::span<const Row> rows, bool step_plans, bool sp_required) {
  SCOPED_TRACE(step_plans ? "one-micro-batch step plans" : "plain plans");
  DecisionBook book = Book(step_plans, sp_required);
  DecisionBookCounters want;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const int64_t step = static_cast<int64_t>(i);
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ASSERT_THAT(book.AddPlan(RowPlan(step, r)), IsOk());
    ++want.plans_submitted;
    GateDecision answer = Daemon(step, r.answer_mode, r.answer_reason);
    // A one-micro-batch step plan's answer lists its decision, as the daemon sends it; a
    // plain plan's has none (DecisionFromProto).
    if (step_plans) answer.microbatches = {{r.answer_mode, r.answer_reason}};
    answer.pin_forced = r.pin_forced;
    if (r.answer_reason == Reason::kPinned) answer.pin_expire = kNow + absl::Hours(1);
    if (r.answer == Answer::kGiven) {
      ASSERT_NE(book.OnDaemonDecision(answer), nullptr);
      ++want.decisions_received;
    } else if (r.answer == Answer::kRejected) {
      ASSERT_TRUE(book.OnRejection(step));
      ++want.plans_rejected;
    }
    // What runs, every field: the daemon's answer as it came; an override keeps the
    // answer but runs SP under the worker's config, without the pin it no longer runs; a
    // local decision is the policy's, labelled with the source.
    GateDecision expected = answer;
    if (!step_plans) expected.microbatches.clear();  // a plain plan's caller sees none
    if (r.source != kDaemonSource) {
      if (r.source == kLocal) expected = GateDecision{.step = step};
      expected.mode = r.mode;
      expected.policy_reason = r.reason;
      expected.reason = r.source == kLocal ? Reason::kControllerUnavailable : r.reason;
      expected.source = r.source;
      expected.config_version = r.config_version;
      if (r.reason != Reason::kPinned) {
        expected.pin_expire.reset();
        expected.pin_forced = false;
      }
      if (step_plans) {
        expected.microbatches = {{r.mode, r.reason}};
        expected.stage_peak_bytes = r.mode == kSp ? r.peak_sp : r.peak_tp;
      }
    }
    EXPECT_EQ(book.Commit(step, kNow), expected);
    EXPECT_EQ(**book.Lookup(step), expected);
    if (r.source == kDaemonSource) ++want.daemon_decisions;
    if (r.source == kOverride) ++want.memory_overrides;
    if (r.source == kLocal) {
      ++want.local_decisions;
      ++want.local_decisions_by_reason[static_cast<int>(r.reason)];
    }
  }
  const DecisionBookCounters& got = book.counters();
  EXPECT_EQ(got.plans_submitted, want.plans_submitted);
  EXPECT_EQ(got.plans_rejected, want.plans_rejected);
  EXPECT_EQ(got.decisions_received, want.decisions_received);
  EXPECT_EQ(got.daemon_decisions, want.daemon_decisions);
  EXPECT_EQ(got.local_decisions, want.local_decisions);
  EXPECT_EQ(got.memory_overrides, want.memory_overrides);
  EXPECT_EQ(got.late_decisions, 0);
  EXPECT_EQ(got.local_decisions_by_reason, want.local_decisions_by_reason);
}

const Answer kNone = Answer::kNone, kRejected = Answer::kRejected, kGiven = Answer::kGiven;
const Reason kGates = Reason::kGatesPassed, kCv = Reason::kLengthCv, kPin = Reason::kPinned;
const Reason kMemSp = Reason::kMemoryRequiresSp;

// Defaults: max_length_cv 0.18, memory_headroom 0.9 (a 1,000-byte budget fits 900 bytes).
const Row kRows[] = {
    // {cv, peak_sp, peak_tp, budget, answer, its mode, its reason, pin_forced,
    //  what runs: mode, policy reason, source, config_version}
    {0.0, 0, 0, 0, kNone, kSp, kGates, false, kSp, kGates, kLocal, 0},
    {0.0, 0, 0, 0, kGiven, kSp, kGates, false, kSp, kGates, kDaemonSource, 5},
    {0.5, 500, 800, 1000, kGiven, kTp, kCv, false, kTp, kCv, kDaemonSource, 5},
    // TP-only that does not fit runs SP, judged under the worker's config (version 0).
    {0.5, 500, 950, 1000, kGiven, kTp, kCv, false, kSp, kMemSp, kOverride, 0},
    {0.5, 920, 950, 1000, kGiven, kTp, Reason::kRsWait, false, kSp, Reason::kMemoryOverBudget,
     kOverride, 0},
    {0.0, 500, 950, 1000, kGiven, kTp, kPin, false, kSp, kMemSp, kOverride, 0},
    // A forced pin runs, and the fallback keeps it while the daemon is silent.
    {0.0, 500, 950, 1000, kGiven, kTp, kPin, true, kTp, kPin, kDaemonSource, 5},
    {0.0, 500, 950, 1000, kNone, kSp, kGates, false, kTp, kPin, kLocal, 0},
    {0.0, 0, 0, 0, kGiven, kSp, kGates, false, kSp, kGates, kDaemonSource, 5},  // pin ends
    {0.5, 500, 950, 1000, kNone, kSp, kGates, false, kSp, kMemSp, kLocal, 0},
    // Version 9 from step 10: 950 fits 0.99 x 1,000, 995 does not.
    {0.5, 500, 950, 1000, kRejected, kSp, kGates, false, kTp, kCv, kLocal, 9},
    {0.5, 500, 995, 1000, kGiven, kTp, kCv, false, kSp, kMemSp, kOverride, 9},
    {0.0, 0, 0, 0, kNone, kSp, kGates, false, kSp, kGates, kLocal, 9},
};

const Row kSpRequiredRows[] = {
    {0.5, 500, 800, 1000, kNone, kSp, kGates, false, kSp, Reason::kSpRequired, kLocal, 0},
    {0.5, 500, 800, 1000, kGiven, kSp, Reason::kSpRequired, false, kSp, Reason::kSpRequired,
     kDaemonSource, 5},
    {0.5, 500, 950, 1000, kRejected, kSp, kGates, false, kSp, Reason::kSpRequired, kLocal, 0},
};

TEST(DecisionBookOnePathTest, APlainPlanCommitsAsItsOneMicrobatchStepPlan) {
  for (const bool step_plans : {false, true}) {
    RunSequence(kRows, step_plans, /*sp_required=*/false);
    RunSequence(kSpRequiredRows, step_plans, /*sp_required=*/true);
  }
}

}  // namespace one_path

}  // namespace
}  // namespace spgate::client
