// DecisionBook: the leader's plans, the daemon's answers and refusals, and the commit of
// each step in order — driven directly, no gRPC, no threads (worker/client/decision_book.h).
#include "worker/client/decision_book.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

PlanRecord Plan(int64_t step, double cv = 0.0) {
  PlanRecord p;
  p.step = step;
  p.lengths = {100};
  p.length_cv = cv;
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
  return d;
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
  big.peak_tp = 950;  // over 0.9 x budget
  big.peak_sp = 500;
  ASSERT_THAT(book.AddPlan(big), IsOk());
  GateDecision pinned = Daemon(0, Mode::kTensorParallelOnly, Reason::kPinned);
  pinned.pin_expire = kNow + absl::Hours(1);
  book.OnDaemonDecision(pinned);
  (void)book.Commit(0, kNow);
  const GateDecision local = book.Commit(1, kNow);
  EXPECT_EQ(local.mode, Mode::kSequenceParallel);
  EXPECT_EQ(local.policy_reason, Reason::kMemoryRequiresSp);
}

}  // namespace
}  // namespace spgate::client
