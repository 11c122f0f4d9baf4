// GateClient against a scripted GateService (fake_gate_service.h): the deadline bounds
// every wait, an unreachable or silent daemon costs nothing beyond it, rejected plans and
// forgotten sessions are handled, heartbeats carry local decisions by reason and memory
// overrides, the telemetry buffer is bounded, every Register carries the launch
// credential (required with a controller), a daemon's TP-only answer the worker's memory
// gate forbids runs SP, a replaced session is never taken back, Close ends other threads'
// waits, a Register refused for a field ends the waits at once, a wait that runs out
// says how long to the millisecond, and Create checks the controller address and
// Register's fields (by the daemon's rules) and ObserveGroupRsWaitShare the share.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/client/fake_gate_service.h"
#include "worker/client/gate_client.h"
#include "worker/client/identity.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using testing::FakeGateServer;
using testing::FakeGateService;

constexpr int64_t kMixed[] = {512, 8192, 1024, 4096};  // CV ~0.8: LENGTH_CV
constexpr int64_t kEven[] = {4096, 4096, 4096};         // CV 0: GATES_PASSED
constexpr char kCredential[] = "0123456789abcdef0123456789abcdef";  // a fixed test credential

GateClientOptions Options(const std::string& controller) {
  GateClientOptions o;
  o.controller = controller;
  o.job_id = "proto-test";
  o.incarnation = "test-launch";
  o.launch_credential = kCredential;
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

// A restarted daemon (a new session, its counters from 0) is told the decisions made
// since the last heartbeat the old one acknowledged, not the worker's whole history: it
// counted 3 + 3 + 2 when the counts ran from the process's start. The daemon answers
// only every fourth heartbeat, naming it (acks merged behind a write): an ack answers
// every heartbeat up to the one it names (taking one heartbeat off per ack left the
// client's count of what was acknowledged at the first decision, and a new session
// counted the later two again).
TEST(GateClientProtocolTest, ANewSessionCountsOnlyWhatNoDaemonAcknowledged) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.answer_plans = false;  // every plan decided locally
  s.heartbeat_ms = 50;
  s.ack_every = 4;
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  auto decide_locally = [&](int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      ASSERT_THAT(c->SubmitPlan({.step = step, .lengths = kMixed}), IsOk());
      ASSERT_THAT(c->AwaitDecision(step, absl::Now()).status(), IsOk());
    }
  };
  auto wait_for_count = [&](int64_t want) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (server.service().last_local_decisions()[v1::LENGTH_CV] != want &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return server.service().last_local_decisions()[v1::LENGTH_CV];
  };
  for (int64_t step = 1; step <= 3; ++step) {  // a decision, then several heartbeats
    decide_locally(step, step);
    ASSERT_EQ(wait_for_count(step), step);
    absl::SleepFor(absl::Milliseconds(400));
  }
  server.service().ForgetSessions();
  server.service().KillStreams();
  decide_locally(4, 5);  // while the daemon is away
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().registrations() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(server.service().registrations(), 2);
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  EXPECT_EQ(wait_for_count(2), 2);
  absl::SleepFor(absl::Milliseconds(200));  // later heartbeats of the session say the same
  EXPECT_EQ(server.service().last_local_decisions()[v1::LENGTH_CV], 2);
  decide_locally(6, 6);
  EXPECT_EQ(wait_for_count(3), 3);  // within a session the count is cumulative
  EXPECT_EQ(c->stats().local_decisions_by_reason[static_cast<int>(Reason::kLengthCv)], 6);
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

// The credential is checked before anything dials, and named; its value is a secret and
// never appears in the message.
TEST(GateClientProtocolTest, ALaunchCredentialIsRequiredWithAController) {
  struct Case {
    const char* name;
    std::string credential;
    const char* error;  // null: accepted
  };
  const Case cases[] = {
      {"missing", "", "launch_credential must be set"},
      {"too short", "0123456789abcde", "launch_credential: must be 16 to 128 characters, got 15"},
      {"too long", std::string(129, 'k'),
       "launch_credential: must be 16 to 128 characters, got 129"},
      {"a space", "0123456789 abcdef", "launch_credential: printable ASCII without spaces only "
                                       "(character 11 is not)"},
      {"a control character", "0123456789abcdef\n", "(character 17 is not)"},
      {"not ASCII", "0123456789abcdef\xc3\xa9", "(character 17 is not)"},
      {"16 characters", "0123456789abcdef", nullptr},
      {"128 characters", std::string(128, '~'), nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GateClientOptions o = Options("127.0.0.1:1");
    o.launch_credential = c.credential;
    absl::StatusOr<std::unique_ptr<GateClient>> client = GateClient::Create(o);
    if (c.error == nullptr) {
      EXPECT_THAT(client.status(), IsOk());
      continue;
    }
    EXPECT_THAT(client.status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(c.error)));
    if (c.credential.size() >= 8) {
      EXPECT_THAT(std::string(client.status().message()),
                  ::testing::Not(::testing::HasSubstr(c.credential)));
    }
  }
  // Without a controller nothing is sent, so nothing is required.
  GateClientOptions local = Options("");
  local.launch_credential = "";
  EXPECT_THAT(GateClient::Create(local).status(), IsOk());
}

TEST(GateClientProtocolTest, EveryRegisterCarriesTheLaunchCredential) {
  FakeGateServer server;
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  server.service().ForgetSessions();
  server.service().KillStreams();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().registrations() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(server.service().launch_credentials(),
              ::testing::ElementsAre(kCredential, kCredential));
}

// The hardware id each Register carries: the option given, else SPGATE_HARDWARE_ID, else
// the host's detected id ("cpu:..." here); one the daemon would refuse fails Create.
TEST(GateClientProtocolTest, RegisterCarriesTheHardwareIdGivenElseTheVariableElseDetected) {
  unsetenv("SPGATE_HARDWARE_ID");
  const std::string detected = DefaultHardwareId();
  ASSERT_TRUE(detected.starts_with("cpu:")) << detected;
  struct Case {
    const char* option;
    const char* variable;  // null: unset
    std::string want;
  };
  const Case cases[] = {{"", nullptr, detected},
                        {"", "lab-h200-nvl", "lab-h200-nvl"},
                        {"given-id", "lab-h200-nvl", "given-id"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    if (c.variable != nullptr) setenv("SPGATE_HARDWARE_ID", c.variable, 1);
    FakeGateServer server;
    GateClientOptions o = Options(server.address());
    o.hardware_id = c.option;
    auto client = MakeClient(o);
    unsetenv("SPGATE_HARDWARE_ID");
    ASSERT_THAT(client->WaitUntilConnected(absl::Seconds(10)), IsOk());
    EXPECT_EQ(client->options().hardware_id, c.want);
    EXPECT_THAT(server.service().hardware_ids(), ::testing::ElementsAre(c.want));
  }
  for (const std::string& bad : {std::string(129, 'h'), std::string("H200\x7f")}) {
    GateClientOptions o = Options("127.0.0.1:1");
    o.hardware_id = bad;
    EXPECT_THAT(GateClient::Create(o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("hardware_id: ")));
    // The same value from the environment: the error names the variable to fix.
    o.hardware_id.clear();
    setenv("SPGATE_HARDWARE_ID", bad.c_str(), 1);
    auto from_env = GateClient::Create(o);
    unsetenv("SPGATE_HARDWARE_ID");
    EXPECT_THAT(from_env.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            ::testing::HasSubstr("SPGATE_HARDWARE_ID: ")));
  }
}

// End to end: a daemon (here a fake one: the real daemon's own memory gate never says
// this) answers TP-only for a plan whose TP-only peak is over budget x headroom. The
// group runs SP with the worker's memory-gate reason, the override is counted, and the
// next heartbeat carries the count; an answer that fits still runs as answered.
TEST(GateClientProtocolTest, ADaemonTpOnlyAnswerOverBudgetRunsSpAndIsReported) {
  FakeGateServer server;
  FakeGateService::Script s;
  s.answer_mode = v1::TENSOR_PARALLEL_ONLY;
  s.answer_reason = v1::LENGTH_CV;
  s.heartbeat_ms = 50;
  server.service().set_script(s);
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  // Budget 1,000 bytes, memory_headroom 0.9 (the served config): TP-only's 950 does not
  // fit, SP's 500 does.
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kMixed, .predicted_peak_bytes_sp = 500,
                             .predicted_peak_bytes_tp = 950, .memory_budget_bytes = 1000}),
              IsOk());
  ASSERT_THAT(c->SubmitPlan({.step = 2, .lengths = kMixed, .predicted_peak_bytes_sp = 500,
                             .predicted_peak_bytes_tp = 800, .memory_budget_bytes = 1000}),
              IsOk());
  auto d1 = c->AwaitDecision(1, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(d1.status(), IsOk());
  EXPECT_EQ(d1->mode, Mode::kSequenceParallel);
  EXPECT_EQ(d1->reason, Reason::kMemoryRequiresSp);
  EXPECT_EQ(d1->source, DecisionSource::kMemoryOverride);
  EXPECT_EQ(DecisionSourceLabel(d1->source), "memory_override");
  auto d2 = c->AwaitDecision(2, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(d2.status(), IsOk());
  EXPECT_EQ(d2->mode, Mode::kTensorParallelOnly);
  EXPECT_EQ(d2->source, DecisionSource::kDaemon);
  const GateClientStats st = c->stats();
  EXPECT_EQ(st.memory_overrides, 1);
  EXPECT_EQ(st.daemon_decisions, 1);
  EXPECT_EQ(st.local_decisions, 0);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().last_memory_overrides() != 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.service().last_memory_overrides(), 1);
}

// The daemon ends the stream ABORTED: another process registered as this rank (with the
// launch's credential) and holds the seat now. The client does not take it back — no
// Register, no stream, however long it lives — and decides every later step locally, at
// once, saying why.
TEST(GateClientProtocolTest, AReplacedSessionIsNotTakenBack) {
  FakeGateServer server;
  auto c = MakeClient(Options(server.address()));
  ASSERT_THAT(c->WaitUntilConnected(absl::Seconds(10)), IsOk());
  ASSERT_FALSE(c->stats().session_replaced);
  server.service().ReplaceSessions();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!c->stats().session_replaced && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Many backoff periods (20 to 200 ms): a client that reconnects would have by now.
  absl::SleepFor(absl::Milliseconds(600));
  const GateClientStats st = c->stats();
  EXPECT_TRUE(st.session_replaced);
  EXPECT_FALSE(st.connected);
  EXPECT_THAT(st.last_error, ::testing::HasSubstr("ABORTED: session replaced"));
  EXPECT_THAT(st.last_error, ::testing::HasSubstr("another process now holds rank 0 of group 0"));
  EXPECT_EQ(server.service().registrations(), 1);
  EXPECT_EQ(server.service().open_streams(), 0);
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kMixed}), IsOk());
  const absl::Time start = absl::Now();
  auto d = c->AwaitDecision(1, start + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "waited for a daemon it left";
  EXPECT_EQ(d->source, DecisionSource::kFallback);
  EXPECT_EQ(d->policy_reason, Reason::kLengthCv);
  ASSERT_THAT(c->ReportTelemetry({.step = 1, .step_time_s = 0.1}), IsOk());
  EXPECT_THAT(c->WaitUntilConnected(absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("session was replaced")));
  EXPECT_THAT(c->Flush(absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("session was replaced")));
  EXPECT_EQ(server.service().registrations(), 1);
}

// Close() from another thread ends the waits in progress at once, and the client stays
// valid for them until it is destroyed (Python's close() relies on it).
TEST(GateClientProtocolTest, CloseEndsTheWaitsOfOtherThreadsAtOnce) {
  auto c = MakeClient(Options("127.0.0.1:1"));  // nothing listens: the waits would run out
  absl::Status connected, flushed;
  absl::Duration connected_after, flushed_after;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    connected = c->WaitUntilConnected(absl::Seconds(20));
    connected_after = absl::Now() - start;
  });
  std::thread flusher([&] {
    flushed = c->Flush(absl::Seconds(20));
    flushed_after = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));
  c->Close();
  waiter.join();
  flusher.join();
  EXPECT_THAT(connected, StatusIs(absl::StatusCode::kFailedPrecondition,
                                  ::testing::HasSubstr("the client is closed")));
  EXPECT_THAT(flushed, StatusIs(absl::StatusCode::kFailedPrecondition,
                                ::testing::HasSubstr("the client is closed")));
  EXPECT_LT(connected_after, absl::Seconds(5));
  EXPECT_LT(flushed_after, absl::Seconds(5));
  // Later calls: answered locally, at once.
  ASSERT_THAT(c->SubmitPlan({.step = 1, .lengths = kEven}), IsOk());
  auto d = c->AwaitDecision(1, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_EQ(d->source, DecisionSource::kFallback);
  EXPECT_THAT(c->WaitUntilConnected(absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  c->Close();  // idempotent
}

// A wait that ran out names the address and how long it waited, to the millisecond: a
// timeout computed from a deadline (give_up - now) or a float read "1.99999988s".
TEST(GateClientProtocolTest, AWaitThatRunsOutSaysHowLongInMilliseconds) {
  auto c = MakeClient(Options("127.0.0.1:1"));  // nothing listens
  EXPECT_THAT(c->WaitUntilConnected(absl::Milliseconds(300) - absl::Nanoseconds(120)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       ::testing::StartsWith("not connected to 127.0.0.1:1 after 300ms; ")));
}

// A Register the daemon refuses for a field (INVALID_ARGUMENT: here a group past its
// --max_groups_per_job) ends WaitUntilConnected and Flush at once with the daemon's
// message, as a refused credential does; the client keeps retrying meanwhile.
TEST(GateClientProtocolTest, ARegisterRefusedForAFieldEndsTheWaitsAtOnce) {
  FakeGateServer server;
  FakeGateService::Script script;
  script.register_code = 3;  // INVALID_ARGUMENT
  script.register_message = "group: must be in [0, 4096) (--max_groups_per_job), got 5000";
  server.service().set_script(script);
  GateClientOptions o = Options(server.address());
  o.group = 5000;
  auto c = MakeClient(o);
  const absl::Time start = absl::Now();
  EXPECT_THAT(c->WaitUntilConnected(absl::Seconds(20)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(::testing::HasSubstr("refused this client's registration"),
                                        ::testing::HasSubstr("group: must be in [0, 4096) (--max_groups_per_job), got 5000"))));
  EXPECT_THAT(c->Flush(absl::Seconds(20)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("group:")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().launch_credentials().size() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(server.service().launch_credentials().size(), 2u) << "a refused Register is retried";
  EXPECT_EQ(server.service().registrations(), 0);
  // Once the daemon takes it (e.g. restarted with a larger limit), the client connects.
  server.service().set_script(FakeGateService::Script{});
  give_up = absl::Now() + absl::Seconds(10);
  while (!c->stats().connected && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_THAT(c->WaitUntilConnected(absl::Seconds(1)), IsOk());
}

// A controller address that reaches a gRPC server without the worker API (spgated's
// admin port answers Register UNIMPLEMENTED, with no message) is a refusal, not a daemon
// down: the waits end at once, naming what the address is likely to be.
TEST(GateClientProtocolTest, AServerWithoutTheWorkerApiEndsTheWaitsAtOnce) {
  FakeGateServer server;
  FakeGateService::Script script;
  script.register_code = 12;  // UNIMPLEMENTED
  server.service().set_script(script);
  auto c = MakeClient(Options(server.address()));
  const absl::Time start = absl::Now();
  EXPECT_THAT(c->WaitUntilConnected(absl::Seconds(20)),
              StatusIs(absl::StatusCode::kUnimplemented,
                       ::testing::AllOf(::testing::HasSubstr("refused this client's registration"),
                                        ::testing::HasSubstr("does not serve spgated's worker API"),
                                        ::testing::HasSubstr("the admin or health port"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(c->stats().last_error, ::testing::StartsWith("Register: UNIMPLEMENTED: "));
}

// The controller address: host:port with a port in [1, 65535], an IPv6 address in
// brackets, or a unix socket; anything else is refused by Create, naming controller,
// instead of dialling some other port.
TEST(GateClientProtocolTest, TheControllerAddressIsChecked) {
  struct Case {
    const char* controller;
    const char* error;  // null: accepted
  };
  const Case cases[] = {
      {"127.0.0.1:50061", nullptr},
      {"localhost:1", nullptr},
      {"spgated.train.svc:65535", nullptr},
      {"[::1]:50061", nullptr},
      {"dns:///spgated.train.svc:50061", nullptr},
      {"unix:/run/spgated.sock", nullptr},
      {"unix-abstract:spgated", nullptr},
      {"127.0.0.1:85136", "the port must be a number in [1, 65535], got \"85136\""},
      {"127.0.0.1:0", "got \"0\""},
      {"127.0.0.1:-1", "got \"-1\""},
      {"127.0.0.1:", "got \"\""},
      {":abc", "no host"},
      {":50061", "no host"},
      {"127.0.0.1", "no port"},
      {"[::1]", "no port"},
      {"::1:50061", "an IPv6 address in brackets"},
      {"[::1:50061", "an IPv6 address in brackets"},
      {"host name:50061", "printable ASCII without spaces"},
      {"unix:", "unix: needs a name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.controller);
    absl::StatusOr<std::unique_ptr<GateClient>> client =
        GateClient::Create(Options(c.controller));
    if (c.error == nullptr) {
      EXPECT_THAT(client.status(), IsOk());
      continue;
    }
    EXPECT_THAT(client.status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(::testing::StartsWith("controller: "),
                                          ::testing::HasSubstr(c.error))));
  }
}

// The fields Register carries are held to the daemon's rules at Create
// (common/registration.h), naming the field, rather than refused by the daemon on every
// retry while the client waits out its deadline.
TEST(GateClientProtocolTest, RegisterFieldsFollowTheDaemonsRules) {
  struct Case {
    const char* name;
    void (*set)(GateClientOptions&);
    const char* error;  // null: accepted
  };
  const Case cases[] = {
      {"global_rank -5", [](GateClientOptions& o) { o.global_rank = -5; },
       "global_rank: must be >= 0, got -5"},
      {"host of 300", [](GateClientOptions& o) { o.host = std::string(300, 'h'); },
       "host: at most 255 characters, got 300"},
      {"host of 255", [](GateClientOptions& o) { o.host = std::string(255, 'h'); }, nullptr},
      {"group_size 2000", [](GateClientOptions& o) { o.group_size = 2000; },
       "group_size: must be in [1, 1024], got 2000"},
      {"group_size 1024", [](GateClientOptions& o) { o.group_size = 1024; }, nullptr},
      {"group_size 0", [](GateClientOptions& o) { o.group_size = 0; },
       "group_size: must be in [1, 1024], got 0"},
      {"group -1", [](GateClientOptions& o) { o.group = -1; }, "group: must be >= 0, got -1"},
      {"incarnation with a space", [](GateClientOptions& o) { o.incarnation = "a b"; },
       "incarnation: printable ASCII without spaces only"},
      {"incarnation of 129", [](GateClientOptions& o) { o.incarnation = std::string(129, 'i'); },
       "incarnation: at most 128 characters, got 129"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GateClientOptions o = Options("127.0.0.1:1");
    c.set(o);
    absl::StatusOr<std::unique_ptr<GateClient>> client = GateClient::Create(o);
    if (c.error == nullptr) {
      EXPECT_THAT(client.status(), IsOk());
    } else {
      EXPECT_THAT(client.status(),
                  StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(c.error)));
    }
  }
}

// The group's wait share the trainer passes: in [0, 1], or INVALID_ARGUMENT naming share
// (a NaN would keep the RS_WAIT gate from ever closing again) and nothing is observed.
TEST(GateClientProtocolTest, AGroupWaitShareOutsideZeroToOneIsRefused) {
  auto c = MakeClient(Options(""));
  for (double share : {std::nan(""), -0.1, 1.5, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(share);
    EXPECT_THAT(c->ObserveGroupRsWaitShare(1, Mode::kSequenceParallel, share),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("share: ")));
  }
  EXPECT_THAT(c->ObserveGroupRsWaitShare(1, static_cast<Mode>(7), 0.5),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("mode: ")));
  EXPECT_THAT(c->ObserveGroupRsWaitShare(1, Mode::kSequenceParallel, 0.0), IsOk());
  EXPECT_THAT(c->ObserveGroupRsWaitShare(2, Mode::kSequenceParallel, 1.0), IsOk());
}

}  // namespace
}  // namespace spgate::client
