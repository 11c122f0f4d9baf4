// GateClient against a scripted GateService (fake_gate_service.h): the deadline bounds
// every wait, an unreachable or silent daemon costs nothing beyond it, rejected plans and
// forgotten sessions are handled, heartbeats carry local decisions by reason, and the
// telemetry buffer is bounded.
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/client/fake_gate_service.h"
#include "worker/client/gate_client.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using testing::FakeGateServer;
using testing::FakeGateService;

constexpr int64_t kMixed[] = {512, 8192, 1024, 4096};  // CV ~0.8: LENGTH_CV
constexpr int64_t kEven[] = {4096, 4096, 4096};         // CV 0: GATES_PASSED

GateClientOptions Options(const std::string& controller) {
  GateClientOptions o;
  o.controller = controller;
  o.job_id = "proto-test";
  o.incarnation = "test-launch";
  o.group_size = 1;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(200);
  o.seed = 1;
  return o;
}

std::unique_ptr<GateClient> MakeClient(GateClientOptions o) {
  auto c = GateClient::Create(std::move(o));
  EXPECT_THAT(c.status(), IsOk());
  return std::move(*c);
}

TEST(GateClientProtocolTest, DaemonDecisionsArriveOverTheStream) {
  FakeGateServer server;
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kMixed}), IsOk());
  auto d = c->AwaitDecision(1, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_EQ(d->source, DecisionSource::kDaemon);
  EXPECT_EQ(d->reason, Reason::kGatesPassed);  // the fake always says SP
  EXPECT_EQ(d->config_version, 42);
  EXPECT_EQ(c->ConfigFor(1).version, 42);  // the served config is in force
  EXPECT_EQ(c->stats().daemon_decisions, 1);
}

TEST(GateClientProtocolTest, SilentDaemonCostsExactlyTheDeadline) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.answer_plans = false;
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_THAT(c->SubmitPlan({.step = step, .lengths = kMixed}), IsOk());
    const absl::Time start = absl::Now();
    auto d = c->AwaitDecision(step, start + absl::Milliseconds(30));
    const absl::Duration took = absl::Now() - start;
    ASSERT_THAT(d.status(), IsOk());
    EXPECT_EQ(d->source, DecisionSource::kFallback);
    EXPECT_EQ(d->reason, Reason::kControllerUnavailable);
    EXPECT_EQ(d->policy_reason, Reason::kLengthCv);
    EXPECT_GE(took, absl::Milliseconds(29));
    EXPECT_LT(took, absl::Milliseconds(30 + 50)) << "waited past the deadline";
  }
}

TEST(GateClientProtocolTest, UnreachableDaemonDecidesAtOnce) {
  // Nothing listens on port 1.
  auto c = MakeClient(Options("127.0.0.1:1"));
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kEven}), IsOk());
  const absl::Time start = absl::Now();
  auto d = c->AwaitDecision(1, start + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "waited for a dead daemon";
  EXPECT_EQ(d->source, DecisionSource::kFallback);
  EXPECT_EQ(d->policy_reason, Reason::kGatesPassed);
  EXPECT_EQ(d->mode, Mode::kSequenceParallel);
}

TEST(GateClientProtocolTest, RejectedPlanIsDecidedLocallyWithoutWaiting) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.reject_plans = true;
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kEven}), IsOk());
  // Give the rejection time to arrive, then the answer must not wait the 5 s deadline.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (c->stats().plans_rejected == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  const absl::Time start = absl::Now();
  auto d = c->AwaitDecision(1, start + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(d->source, DecisionSource::kFallback);
  EXPECT_THAT(c->stats().last_error, ::testing::HasSubstr("rejected"));
}

// A plan refused by a daemon limit (RESOURCE_EXHAUSTED: a rate, the sequences per plan)
// is like any refusal: decided locally at once, counted, and the stream stays up.
TEST(GateClientProtocolTest, PlanRefusedByALimitIsDecidedLocallyWithoutWaiting) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.reject_plans = true;
  s.reject_code = 8;  // RESOURCE_EXHAUSTED
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_THAT(c->SubmitPlan({.step = step, .lengths = kEven}), IsOk());
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (c->stats().plans_rejected < step && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    const absl::Time start = absl::Now();
    auto d = c->AwaitDecision(step, start + absl::Seconds(5));
    ASSERT_THAT(d.status(), IsOk());
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "waited on a refusal";
    EXPECT_EQ(d->source, DecisionSource::kFallback);
  }
  EXPECT_EQ(c->stats().plans_rejected, 3);
  EXPECT_THAT(c->stats().last_error, ::testing::HasSubstr("--max_plans_per_second"));
  EXPECT_EQ(server.service().registrations(), 1) << "a refused plan does not end the session";
}

TEST(GateClientProtocolTest, ForgottenSessionMeansRegisterAgain) {
  FakeGateServer server;
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  EXPECT_EQ(server.service().registrations(), 1);
  // As after a daemon restart: the stream ends, and the old session id is unknown.
  server.service().ForgetSessions();
  server.service().KillStreams();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().registrations() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server.service().registrations(), 2);
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  const GateClientStats st = c->stats();
  EXPECT_EQ(st.registrations, 2);
  EXPECT_GE(st.stream_failures, 2);  // UNAVAILABLE, then NOT_FOUND
  // Decisions flow on the new session.
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kEven}), IsOk());
  auto d = c->AwaitDecision(1, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_EQ(d->source, DecisionSource::kDaemon);
}

TEST(GateClientProtocolTest, HeartbeatsReportLocalDecisionsByReason) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.answer_plans = false;
  s.heartbeat_ms = 50;
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_THAT(c->SubmitPlan({.step = step, .lengths = kMixed}), IsOk());
    ASSERT_THAT(c->AwaitDecision(step, absl::Now()).status(), IsOk());
  }
  ASSERT_THAT(c->SubmitPlan({.step = 4, .lengths = kEven}), IsOk());
  ASSERT_THAT(c->AwaitDecision(4, absl::Now()).status(), IsOk());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  std::map<int, int64_t> seen;
  while (absl::Now() < give_up) {
    seen = server.service().last_local_decisions();
    if (seen[v1::LENGTH_CV] == 3 && seen[v1::GATES_PASSED] == 1) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(seen[v1::LENGTH_CV], 3);
  EXPECT_EQ(seen[v1::GATES_PASSED], 1);
  EXPECT_EQ(c->stats().local_decisions_by_reason[static_cast<int>(Reason::kLengthCv)], 3);
}

TEST(GateClientProtocolTest, TelemetryIsAcknowledgedAfterFlush) {
  FakeGateServer server;
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  for (int64_t step = 0; step < 1000; ++step) {
    ASSERT_THAT(c->ReportTelemetry({.step = step, .step_time_s = 0.1, .rs_wait_s = 0.01}),
                IsOk());
  }
  ASSERT_THAT(c->Flush(absl::Seconds(10)), IsOk());
  const GateClientStats st = c->stats();
  EXPECT_EQ(st.telemetry_sent, 1000);
  EXPECT_EQ(st.telemetry_acked, 1000);
  EXPECT_EQ(server.service().telemetry_seen(), 1000);
}

TEST(GateClientProtocolTest, TelemetryBufferIsBoundedAndDropsAreCounted) {
  GateClientOptions o = Options("127.0.0.1:1");
  o.telemetry_buffer = 8;
  auto c = MakeClient(o);
  for (int64_t step = 0; step < 20; ++step) {
    ASSERT_THAT(c->ReportTelemetry({.step = step, .step_time_s = 0.1}), IsOk());
  }
  EXPECT_EQ(c->stats().telemetry_dropped, 12);
  EXPECT_THAT(c->Flush(absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::HasSubstr("buffered")));
}

}  // namespace
}  // namespace spgate::client
