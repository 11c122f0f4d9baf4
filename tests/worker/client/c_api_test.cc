// The C API (spgate_client.h): error codes with messages, a decider over a C broadcast
// callback, pipelines (layout, step plans, a decision per micro-batch on every rank), the launch credential (made, required, checked), a memory override and a
// replaced session in the stats (against the scripted daemon of fake_gate_service.h), a
// TP group of 4 threads in one group session (one telemetry record a step reaches the
// daemon, with the group's maxima and its slowest rank) and in per-rank sessions
// (group_session "false"), the TLS options against a real in-process mTLS daemon, and the
// ctypes example (examples/python/train_loop.py) run against a real in-process daemon,
// with and without mTLS, in a group session and in per-rank sessions.
#include "worker/client/spgate_client.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"
#include "tests/worker/client/fake_gate_service.h"
#include "worker/client/in_memory_broadcast.h"
#ifdef SPGATE_HAVE_SERVER
#include "server/daemon.h"
#include "spgate/v1/admin.grpc.pb.h"
#endif

namespace {

using ::testing::HasSubstr;

TEST(CApiTest, ErrorsCarryCodeAndMessage) {
  spgate_options* o = spgate_options_create();
  EXPECT_EQ(spgate_options_set(o, "no_such_option", "1"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("option \"no_such_option\": unknown"));
  // A removed option says so, not "unknown".
  EXPECT_EQ(spgate_options_set(o, "link_gbps", "450"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("option \"link_gbps\": removed"));
  EXPECT_EQ(spgate_options_set(o, "group_size", "two"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("not an integer"));
  // The C++ name of a duration points at the C API's; a negative duration or byte count,
  // or an int out of range, is refused by the C API's name when set.
  EXPECT_EQ(spgate_options_set(o, "decision_deadline", "5"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("option \"decision_deadline\": unknown; the C API names it \"decision_deadline_ms\""));
  EXPECT_EQ(spgate_options_set(o, "keepalive_time", "5"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("option \"keepalive_time\": not in the C API"));
  EXPECT_EQ(spgate_options_set(o, "decision_deadline_ms", "-5"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("decision_deadline_ms: not a non-negative integer"));
  EXPECT_EQ(spgate_options_set(o, "memory_budget_bytes", "-5"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("memory_budget_bytes: not a non-negative integer"));
  EXPECT_EQ(spgate_options_set(o, "group_size", "4294967298"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("group_size: not an integer in int's range"));
  ASSERT_EQ(spgate_options_set(o, "group_size", "2"), SPGATE_OK);
  EXPECT_STREQ(spgate_last_error(), "");
  ASSERT_EQ(spgate_options_set(o, "rank_in_group", "2"), SPGATE_OK);
  spgate_client* c = nullptr;
  EXPECT_EQ(spgate_client_create(o, &c), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("rank_in_group"));
  EXPECT_EQ(c, nullptr);
  spgate_options_destroy(o);
  EXPECT_EQ(spgate_client_flush(nullptr, 1), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("client is NULL"));
  EXPECT_STREQ(spgate_mode_name(SPGATE_MODE_TENSOR_PARALLEL_ONLY), "tp_only");
  EXPECT_STREQ(spgate_reason_name(SPGATE_REASON_CONTROLLER_UNAVAILABLE), "controller_unavailable");
}

// A one-rank "group": the broadcast callback sees the leader's bytes (the creation's
// verdict, then each decision's head).
int32_t CountingBroadcast(void* buf, size_t size, int32_t root, void* user) {
  auto* calls = static_cast<int*>(user);
  ++*calls;
  return (size == 24 || size == spgate::client::GroupDecider::kCreateVerdictBytes) && root == 0
             ? 0
             : 1;
}

TEST(CApiTest, DeciderDecidesLocallyWithoutAController) {
  spgate_client* c = nullptr;
  ASSERT_EQ(spgate_client_create(nullptr, &c), SPGATE_OK) << spgate_last_error();
  int calls = 0;
  spgate_decider* d = nullptr;
  ASSERT_EQ(spgate_decider_create(c, 0, CountingBroadcast, &calls, &d), SPGATE_OK)
      << spgate_last_error();
  const int64_t mixed[] = {512, 8192, 1024, 4096};
  ASSERT_EQ(spgate_decider_submit_plan(d, 0, mixed, 4, 0, 0, 0), SPGATE_OK);
  spgate_decision out{};
  ASSERT_EQ(spgate_decider_decide(d, 0, -1, &out), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(out.step, 0);
  EXPECT_EQ(out.mode, SPGATE_MODE_TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(out.reason, SPGATE_REASON_LENGTH_CV);
  EXPECT_EQ(out.source, SPGATE_SOURCE_LOCAL_ONLY);
  EXPECT_EQ(calls, 2) << "the creation's verdict and the decision";
  EXPECT_EQ(spgate_decider_decide(d, 1, -1, &out), SPGATE_FAILED_PRECONDITION);
  EXPECT_THAT(spgate_last_error(), HasSubstr("no plan was submitted for step 1"));
  spgate_telemetry t{};
  t.step = 0;
  t.mode = SPGATE_MODE_TENSOR_PARALLEL_ONLY;
  t.reason = SPGATE_REASON_LENGTH_CV;
  t.step_time_s = 0.1;
  EXPECT_EQ(spgate_client_report_telemetry(c, &t), SPGATE_OK);
  t.mode = 9;
  EXPECT_EQ(spgate_client_report_telemetry(c, &t), SPGATE_INVALID_ARGUMENT);
  // The group's wait share: in [0, 1] (a NaN would keep the RS_WAIT gate open for good).
  EXPECT_EQ(spgate_client_observe_group_rs_wait(c, 0, SPGATE_MODE_SEQUENCE_PARALLEL, 0.2),
            SPGATE_OK);
  EXPECT_EQ(spgate_client_observe_group_rs_wait(c, 0, SPGATE_MODE_SEQUENCE_PARALLEL, NAN),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("share: must be finite and in [0, 1]"));
  EXPECT_EQ(spgate_client_observe_group_rs_wait(c, 0, 7, 0.2), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("mode: must be 1 (SP) or 2 (TP-only), got 7"));
  spgate_decider_destroy(d);
  spgate_client_destroy(c);
}

// A broadcast over threads: a decision in one call, its 24-byte head and then a step
// plan's micro-batch decisions (one byte each), as on a real communicator. The sizes each
// rank broadcast are recorded.
struct BytesComm {
  spgate::client::InMemoryBroadcast* group;
  int rank;
  std::vector<size_t> sizes = {};
};
int32_t AnyBroadcast(void* buf, size_t size, int32_t root, void* user) {
  auto* c = static_cast<BytesComm*>(user);
  c->sizes.push_back(size);
  return c->group->Broadcast(c->rank, std::span<uint8_t>(static_cast<uint8_t*>(buf), size), root)
                 .ok()
             ? 0
             : 3;
}

// Pipelines through the C API (docs/design.md §12): the layout and coordinates checked
// naming the field, a step plan with its micro-batches in any order (one without
// lengths), a decision per micro-batch identical on both ranks of the TP group and the
// stage's predicted peak on the leader, and an SP-only feature.
TEST(CApiTest, StepPlansDecidePerMicrobatchOnEveryRank) {
  spgate_options* o = spgate_options_create();
  spgate_layout layout{.tp = 2, .pp = 2, .vp = 1, .cp = 1, .dp = 1, .microbatches = 4,
                       .schedule = 7};
  spgate_stage_coordinates at{.dp_index = 0, .stage = 1, .cp_rank = 0};
  EXPECT_EQ(spgate_options_set_layout(o, &layout, &at), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("layout.schedule"));
  layout.schedule = SPGATE_SCHEDULE_1F1B;
  at.stage = 2;
  EXPECT_EQ(spgate_options_set_layout(o, &layout, &at), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("stage"));
  at.stage = 1;
  ASSERT_EQ(spgate_options_set_layout(o, &layout, &at), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(spgate_options_add_sp_required(o, "Not-A-Name"), SPGATE_INVALID_ARGUMENT);
  ASSERT_EQ(spgate_options_set(o, "group_size", "2"), SPGATE_OK);
  spgate_client* c = nullptr;
  EXPECT_EQ(spgate_client_create(o, &c), SPGATE_INVALID_ARGUMENT);  // group 0 is stage 0's
  EXPECT_THAT(spgate_last_error(), HasSubstr("group"));
  ASSERT_EQ(spgate_options_set(o, "group", "1"), SPGATE_OK);
  ASSERT_EQ(spgate_client_create(o, &c), SPGATE_OK) << spgate_last_error();

  spgate::client::InMemoryBroadcast group(2, absl::Seconds(30));
  BytesComm comm[2] = {{&group, 0}, {&group, 1}};
  spgate_decider* d[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(spgate_decider_create(r == 0 ? c : nullptr, r, AnyBroadcast, &comm[r], &d[r]),
              SPGATE_OK)
        << spgate_last_error();
  }
  const int64_t uniform[] = {512, 512, 512, 512};
  const int64_t mixed[] = {64, 4096, 128, 2048};
  // Ids in reverse order: micro-batches are keyed by id, never by order.
  const spgate_microbatch_plan plan[] = {
      {.id = 3, .lengths = nullptr, .count = 0, .activation_sp = 100, .activation_tp = 200,
       .workspace_sp = 0, .workspace_tp = 0},
      {.id = 2, .lengths = mixed, .count = 4, .activation_sp = 100, .activation_tp = 200,
       .workspace_sp = 0, .workspace_tp = 0},
      {.id = 1, .lengths = uniform, .count = 4, .activation_sp = 100, .activation_tp = 200,
       .workspace_sp = 0, .workspace_tp = 0},
      {.id = 0, .lengths = mixed, .count = 4, .activation_sp = 100, .activation_tp = 200,
       .workspace_sp = 0, .workspace_tp = 0}};
  spgate_microbatch_plan repeated[4] = {plan[0], plan[1], plan[2], plan[2]};
  EXPECT_EQ(spgate_decider_submit_step_plan(d[0], 0, repeated, 4, 1000, 0),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("id"));
  EXPECT_EQ(spgate_client_submit_plan(c, 0, uniform, 4, 0, 0, 0), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("microbatches"));
  ASSERT_EQ(spgate_decider_submit_step_plan(d[0], 0, plan, 4, 1000, 0), SPGATE_OK)
      << spgate_last_error();
  EXPECT_EQ(spgate_decider_submit_step_plan(d[1], 0, plan, 4, 1000, 0), SPGATE_OK);  // no-op

  spgate_decision head[2] = {};
  spgate_microbatch_decision mbs[2][4] = {};
  uint64_t peak[2] = {1, 1};
  spgate_status rc[2] = {-1, -1};
  std::thread follower([&] {
    rc[1] = spgate_decider_decide_microbatches(d[1], 0, -1, &head[1], mbs[1], 4, &peak[1]);
  });
  rc[0] = spgate_decider_decide_microbatches(d[0], 0, -1, &head[0], mbs[0], 4, &peak[0]);
  follower.join();
  ASSERT_EQ(rc[0], SPGATE_OK);
  ASSERT_EQ(rc[1], SPGATE_OK);
  const spgate_microbatch_decision want[4] = {
      {SPGATE_MODE_TENSOR_PARALLEL_ONLY, SPGATE_REASON_LENGTH_CV},
      {SPGATE_MODE_SEQUENCE_PARALLEL, SPGATE_REASON_GATES_PASSED},
      {SPGATE_MODE_TENSOR_PARALLEL_ONLY, SPGATE_REASON_LENGTH_CV},
      {SPGATE_MODE_SEQUENCE_PARALLEL, SPGATE_REASON_LENGTHS_UNKNOWN}};
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(mbs[r][i].mode, want[i].mode) << "rank " << r << " micro-batch " << i;
      EXPECT_EQ(mbs[r][i].reason, want[i].reason) << "rank " << r << " micro-batch " << i;
    }
    EXPECT_EQ(head[r].step, 0);
    EXPECT_EQ(head[r].mode, want[0].mode);
    EXPECT_EQ(head[r].source, SPGATE_SOURCE_LOCAL_ONLY);
  }
  // Stage 1 of 2 holds one micro-batch at a time: resident + the largest one kept.
  EXPECT_EQ(peak[0], 1000u + 200u);
  EXPECT_EQ(peak[1], 0u);
  // One collective per decision: the head and the 4 micro-batch bytes in one broadcast.
  // The creation's verdict, then the decision's head and its micro-batches in one call.
  EXPECT_EQ(comm[0].sizes, (std::vector<size_t>{256, 24 + 4}));
  EXPECT_EQ(comm[1].sizes, (std::vector<size_t>{256, 24 + 4}));
  // The committed step again, asked with the wrong count: refused, naming it.
  spgate_decision again{};
  spgate_microbatch_decision three[3];
  EXPECT_EQ(spgate_client_await_microbatches(c, 0, 0, &again, three, 3, nullptr),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("count"));
  // Count 0, and the plain call that wraps it: the head alone.
  uint64_t head_peak = 0;
  ASSERT_EQ(spgate_client_await_microbatches(c, 0, 0, &again, nullptr, 0, &head_peak), SPGATE_OK)
      << spgate_last_error();
  EXPECT_EQ(again.mode, head[0].mode);
  EXPECT_EQ(head_peak, peak[0]);
  again = {};
  ASSERT_EQ(spgate_client_await_decision(c, 0, 0, &again), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(again.step, 0);
  EXPECT_EQ(again.reason, head[0].reason);
  for (spgate_decider* x : d) spgate_decider_destroy(x);
  spgate_client_destroy(c);

  // An SP-only feature: every micro-batch SP, SP_REQUIRED.
  ASSERT_EQ(spgate_options_add_sp_required(o, "cuda_graphs"), SPGATE_OK);
  ASSERT_EQ(spgate_client_create(o, &c), SPGATE_OK) << spgate_last_error();
  spgate_options_destroy(o);
  ASSERT_EQ(spgate_client_submit_step_plan(c, 0, plan, 4, 1000, 0), SPGATE_OK);
  spgate_microbatch_decision req[4];
  spgate_decision h{};
  ASSERT_EQ(spgate_client_await_microbatches(c, 0, -1, &h, req, 4, nullptr), SPGATE_OK)
      << spgate_last_error();
  for (const spgate_microbatch_decision& x : req) {
    EXPECT_EQ(x.mode, SPGATE_MODE_SEQUENCE_PARALLEL);
    EXPECT_EQ(x.reason, SPGATE_REASON_SP_REQUIRED);
  }
  spgate_client_destroy(c);
}

int32_t AnyReduceMax(double* values, size_t count, int32_t root, void* user) {
  const auto* c = static_cast<const BytesComm*>(user);
  return c->group->MaxReduce(c->rank, std::span<double>(values, count), root).ok() ? 0 : 2;
}

// A step plan's telemetry through the C API: every rank's micro-batch records in the one
// reduction (16 + 8 x 4 doubles and the two ranks' busy times, 2 + 2 x 4), one record for
// the group on the leader's client; a rank
// without them is refused with nobody waiting, and ranks that disagree on a micro-batch's
// mode are INTERNAL on the leader.
TEST(CApiTest, StepPlanTelemetryCarriesEveryMicrobatch) {
  spgate_options* o = spgate_options_create();
  const spgate_layout layout{.tp = 2, .pp = 2, .vp = 1, .cp = 1, .dp = 1, .microbatches = 4,
                             .schedule = SPGATE_SCHEDULE_1F1B};
  const spgate_stage_coordinates at{.dp_index = 0, .stage = 0, .cp_rank = 0};
  ASSERT_EQ(spgate_options_set_layout(o, &layout, &at), SPGATE_OK) << spgate_last_error();
  ASSERT_EQ(spgate_options_set(o, "group_size", "2"), SPGATE_OK);
  spgate_client* c = nullptr;
  ASSERT_EQ(spgate_client_create(o, &c), SPGATE_OK) << spgate_last_error();
  spgate_options_destroy(o);
  spgate::client::InMemoryBroadcast group(2, absl::Seconds(30));
  BytesComm comm[2] = {{&group, 0}, {&group, 1}};
  spgate_decider* d[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(spgate_decider_create_group(r == 0 ? c : nullptr, r, AnyBroadcast, AnyReduceMax,
                                          &comm[r], &d[r]),
              SPGATE_OK)
        << spgate_last_error();
  }
  const int64_t lengths[] = {512, 512};
  spgate_microbatch_plan plan[4];
  for (int32_t i = 0; i < 4; ++i) {
    plan[i] = {.id = i, .lengths = lengths, .count = 2, .activation_sp = 1, .activation_tp = 2,
               .workspace_sp = 0, .workspace_tp = 0};
  }
  spgate_status rc[3][2];
  std::string error[3][2];
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_EQ(spgate_decider_submit_step_plan(d[0], step, plan, 4, 100, 0), SPGATE_OK)
        << spgate_last_error();
    std::thread ranks[2];
    for (int r = 0; r < 2; ++r) {
      ranks[r] = std::thread([&, r, step] {
        spgate_decision head{};
        spgate_microbatch_decision mbs[4];
        if (spgate_decider_decide_microbatches(d[r], step, -1, &head, mbs, 4, nullptr) !=
            SPGATE_OK) {
          rc[step][r] = SPGATE_INTERNAL;
          error[step][r] = spgate_last_error();
          return;
        }
        const spgate_telemetry t{.step = step, .mode = head.mode, .reason = head.reason,
                                 .step_time_s = 1.0, .effective_tokens = 4096};
        spgate_microbatch_telemetry per_mb[4];
        for (int32_t i = 0; i < 4; ++i) {
          per_mb[i] = {.id = i, .mode = mbs[i].mode, .forward_s = 0.1 * (r + 1),
                       .backward_s = 0.2, .effective_tokens = 1024};
        }
        if (step == 1 && r == 1) per_mb[2].mode = per_mb[2].mode == 1 ? 2 : 1;
        rc[step][r] = spgate_decider_report_step_telemetry(d[r], &t, per_mb,
                                                           step == 2 && r == 1 ? 0 : 4);
        error[step][r] = spgate_last_error();
      });
    }
    for (std::thread& t : ranks) t.join();
  }
  EXPECT_EQ(rc[0][0], SPGATE_OK) << error[0][0];
  EXPECT_EQ(rc[0][1], SPGATE_OK) << error[0][1];
  EXPECT_EQ(rc[1][0], SPGATE_INTERNAL);
  EXPECT_THAT(error[1][0], HasSubstr("micro-batch 2"));
  EXPECT_EQ(rc[1][1], SPGATE_OK) << error[1][1];
  EXPECT_EQ(rc[2][0], SPGATE_INVALID_ARGUMENT);
  EXPECT_EQ(rc[2][1], SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(error[2][1], HasSubstr("got none"));
  spgate_client_stats st{};
  ASSERT_EQ(spgate_client_get_stats(c, &st), SPGATE_OK);
  EXPECT_EQ(st.telemetry_reported, 1);
  // The client's own path refuses a bad micro-batch, naming it.
  const spgate_telemetry t{.step = 0, .mode = 1, .reason = 1, .step_time_s = 1.0};
  spgate_microbatch_telemetry bad[4];
  for (int32_t i = 0; i < 4; ++i) bad[i] = {.id = i, .mode = 1, .forward_s = 0.1};
  bad[3].mode = 9;
  EXPECT_EQ(spgate_client_report_step_telemetry(c, &t, bad, 4), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("[id 3].mode"));
  // A count no layout allows is refused before anything is read.
  EXPECT_EQ(spgate_client_report_step_telemetry(c, &t, bad, size_t{1} << 40),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("count"));
  EXPECT_EQ(spgate_client_submit_step_plan(c, 5, plan, size_t{1} << 40, 100, 0),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("count"));
  for (spgate_decider* x : d) spgate_decider_destroy(x);
  spgate_client_destroy(c);
}

TEST(CApiTest, LaunchCredentialIsMadeRequiredAndChecked) {
  char cred[SPGATE_LAUNCH_CREDENTIAL_BUFFER];
  ASSERT_EQ(spgate_new_launch_credential(cred, sizeof(cred)), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(std::string(cred).size(), 32u);
  EXPECT_EQ(std::string(cred).find_first_not_of("0123456789abcdef"), std::string::npos) << cred;
  char other[SPGATE_LAUNCH_CREDENTIAL_BUFFER];
  ASSERT_EQ(spgate_new_launch_credential(other, sizeof(other)), SPGATE_OK);
  EXPECT_STRNE(cred, other);
  char small[32];
  EXPECT_EQ(spgate_new_launch_credential(small, sizeof(small)), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("size: need 33 bytes, got 32"));
  EXPECT_EQ(spgate_new_launch_credential(nullptr, 64), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("buf is NULL"));

  struct Case {
    const char* credential;  // null: not set
    spgate_status want;
    const char* message;
  };
  const Case cases[] = {
      {nullptr, SPGATE_INVALID_ARGUMENT, "launch_credential must be set"},
      {"too-short", SPGATE_INVALID_ARGUMENT, "launch_credential: must be 16 to 128 characters"},
      {cred, SPGATE_OK, ""},
  };
  for (const Case& c : cases) {
    spgate_options* o = spgate_options_create();
    ASSERT_EQ(spgate_options_set(o, "controller", "127.0.0.1:1"), SPGATE_OK);
    ASSERT_EQ(spgate_options_set(o, "job_id", "c-api-cred"), SPGATE_OK);
    ASSERT_EQ(spgate_options_set(o, "incarnation", "c-api-launch"), SPGATE_OK);
    if (c.credential != nullptr) {
      ASSERT_EQ(spgate_options_set(o, "launch_credential", c.credential), SPGATE_OK);
    }
    spgate_client* client = nullptr;
    EXPECT_EQ(spgate_client_create(o, &client), c.want) << spgate_last_error();
    EXPECT_THAT(spgate_last_error(), HasSubstr(c.message));
    spgate_client_destroy(client);
    spgate_options_destroy(o);
  }
}

// Against a scripted daemon that answers TP-only whatever the plan: a plan whose TP-only
// peak is over budget x headroom runs SP (source MEMORY_OVERRIDE) and is counted; then the
// daemon replaces the session, and the stats say so.
TEST(CApiTest, StatsCountMemoryOverridesAndSayWhenTheSessionWasReplaced) {
  spgate::client::testing::FakeGateServer server;
  spgate::client::testing::FakeGateService::Script script;
  script.answer_mode = spgate::v1::TENSOR_PARALLEL_ONLY;
  script.answer_reason = spgate::v1::LENGTH_CV;
  server.service().set_script(script);
  spgate_options* o = spgate_options_create();
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, std::string>>{
           {"controller", server.address()}, {"job_id", "c-api-memory"},
           {"incarnation", "c-api-launch"},
           {"launch_credential", "0123456789abcdef0123456789abcdef"},
           {"initial_backoff_ms", "20"}, {"max_backoff_ms", "100"}}) {
    ASSERT_EQ(spgate_options_set(o, name, value.c_str()), SPGATE_OK) << spgate_last_error();
  }
  spgate_client* c = nullptr;
  ASSERT_EQ(spgate_client_create(o, &c), SPGATE_OK) << spgate_last_error();
  spgate_options_destroy(o);
  ASSERT_EQ(spgate_client_wait_connected(c, 10000), SPGATE_OK) << spgate_last_error();
  const int64_t lengths[] = {4096, 4000, 4100};
  ASSERT_EQ(spgate_client_submit_plan(c, 0, lengths, 3, /*sp=*/500, /*tp=*/950, /*budget=*/1000),
            SPGATE_OK);
  spgate_decision d{};
  ASSERT_EQ(spgate_client_await_decision(c, 0, 5000000, &d), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(d.mode, SPGATE_MODE_SEQUENCE_PARALLEL);
  EXPECT_EQ(d.reason, SPGATE_REASON_MEMORY_REQUIRES_SP);
  EXPECT_EQ(d.source, SPGATE_SOURCE_MEMORY_OVERRIDE);
  spgate_client_stats st{};
  ASSERT_EQ(spgate_client_get_stats(c, &st), SPGATE_OK);
  EXPECT_EQ(st.memory_overrides, 1);
  EXPECT_EQ(st.daemon_decisions, 0);
  EXPECT_EQ(st.session_replaced, 0);

  server.service().ReplaceSessions();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (st.session_replaced == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(spgate_client_get_stats(c, &st), SPGATE_OK);
  }
  EXPECT_EQ(st.session_replaced, 1);
  EXPECT_EQ(st.connected, 0);
  EXPECT_EQ(spgate_client_flush(c, 1000), SPGATE_FAILED_PRECONDITION);
  EXPECT_THAT(spgate_last_error(), HasSubstr("session was replaced"));
  spgate_client_destroy(c);
  EXPECT_EQ(server.service().registrations(), 1);
}

// A TP group of threads in one process: both C callbacks over one InMemoryBroadcast,
// `user_data` naming the calling rank.
struct RankComm {
  spgate::client::InMemoryBroadcast* group;
  int rank;
};

// A plain plan's decision is the 24-byte head alone (the creation's verdict its 256
// bytes), its telemetry the 16 doubles and the group's busy times (one a rank) alone.
int32_t GroupBroadcast(void* buf, size_t size, int32_t root, void* user) {
  const auto* c = static_cast<const RankComm*>(user);
  if (size != sizeof(spgate::client::DecisionWire) &&
      size != spgate::client::GroupDecider::kCreateVerdictBytes) {
    return 1;
  }
  const std::span<uint8_t> bytes(static_cast<uint8_t*>(buf), size);
  return c->group->Broadcast(c->rank, bytes, root).ok() ? 0 : 2;
}

constexpr int kGroupSize = 4;

int32_t GroupReduceMax(double* values, size_t count, int32_t root, void* user) {
  const auto* c = static_cast<const RankComm*>(user);
  if (count != spgate::client::TelemetryWire::kSlots + kGroupSize) return 1;
  return c->group->MaxReduce(c->rank, std::span<double>(values, count), root).ok() ? 0 : 2;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Rank r's measurements of step n: rank 2 is the slowest, rank 1 has the highest peak,
// rank 3 the largest reduce-scatter wait share (0.04 of its step), rank 0 the longest
// all-gather.
spgate_telemetry RankTelemetry(int rank, const spgate_decision& d) {
  spgate_telemetry t{};
  t.step = d.step;
  t.mode = d.mode;
  t.reason = d.reason;
  t.step_time_s = rank == 2 ? 0.5 : 0.1 + 0.01 * rank;
  t.rs_wait_s = t.step_time_s * (rank == 3 ? 0.04 : 0.01);
  t.all_gather_s = rank == 0 ? 0.03 : 0.01;
  t.effective_tokens = 4096 + 4000 + 4100;  // RunGroup's plan: at most its tokens
  t.peak_memory_bytes = (rank == 1 ? 70 : 40 + rank) * kGiB;
  return t;
}

// Options for rank `rank` of a group of kGroupSize against `controller`; `extra` last.
spgate_options* GroupOptions(const std::string& controller, const std::string& job, int rank,
                             const std::vector<std::pair<const char*, std::string>>& extra = {}) {
  spgate_options* o = spgate_options_create();
  std::vector<std::pair<const char*, std::string>> set = {
      {"controller", controller}, {"job_id", job}, {"incarnation", "c-api-launch"},
      {"launch_credential", "0123456789abcdef0123456789abcdef"},
      {"rank_in_group", std::to_string(rank)}, {"group_size", std::to_string(kGroupSize)},
      {"global_rank", std::to_string(rank)}, {"initial_backoff_ms", "20"},
      {"max_backoff_ms", "100"}};
  set.insert(set.end(), extra.begin(), extra.end());
  for (const auto& [name, value] : set) {
    EXPECT_EQ(spgate_options_set(o, name, value.c_str()), SPGATE_OK)
        << name << ": " << spgate_last_error();
  }
  return o;
}

// Runs `steps` steps on kGroupSize threads, rank r with deciders[r]: the leader plans
// n + 1 while n runs, every rank decides n (waiting up to 5 s for the daemon) and reports
// RankTelemetry through spgate_decider_report_telemetry. Returns each rank's decisions.
std::vector<std::vector<spgate_decision>> RunGroup(const std::vector<spgate_decider*>& deciders,
                                                   int steps) {
  const int64_t lengths[] = {4096, 4000, 4100};
  std::vector<std::vector<spgate_decision>> log(kGroupSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kGroupSize; ++r) {
    threads.emplace_back([&, r] {
      spgate_decider* d = deciders[r];
      if (r == 0) {
        EXPECT_EQ(spgate_decider_submit_plan(d, 0, lengths, 3, 0, 0, 0), SPGATE_OK);
      }
      for (int n = 0; n < steps; ++n) {
        if (n + 1 < steps) {
          EXPECT_EQ(spgate_decider_submit_plan(d, n + 1, lengths, 3, 0, 0, 0), SPGATE_OK)
              << spgate_last_error();
        }
        spgate_decision out{};
        EXPECT_EQ(spgate_decider_decide(d, n, 5000000, &out), SPGATE_OK)
            << "rank " << r << ": " << spgate_last_error();
        log[r].push_back(out);
        const spgate_telemetry t = RankTelemetry(r, out);
        EXPECT_EQ(spgate_decider_report_telemetry(d, &t), SPGATE_OK)
            << "rank " << r << ": " << spgate_last_error();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return log;
}

void ExpectSameDecisions(const std::vector<std::vector<spgate_decision>>& log) {
  for (int r = 1; r < kGroupSize; ++r) {
    ASSERT_EQ(log[r].size(), log[0].size());
    for (size_t n = 0; n < log[0].size(); ++n) {
      EXPECT_EQ(std::memcmp(&log[r][n], &log[0][n], sizeof(spgate_decision)), 0)
          << "rank " << r << " step " << n;
    }
  }
}

// One session for the group: only the leader has a client (a follower's is refused), and
// each step's four records become one at the daemon.
TEST(CApiGroupTest, GroupSessionSendsOneRecordPerStep) {
  spgate::client::testing::FakeGateServer server;
  const std::string job = "c-api-group";
  spgate_options* follower = GroupOptions(server.address(), job, 1);
  spgate_client* refused = nullptr;
  EXPECT_EQ(spgate_client_create(follower, &refused), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("group_session"));
  EXPECT_EQ(refused, nullptr);
  spgate_options_destroy(follower);

  spgate_options* o = GroupOptions(server.address(), job, 0);
  spgate_client* leader = nullptr;
  ASSERT_EQ(spgate_client_create(o, &leader), SPGATE_OK) << spgate_last_error();
  spgate_options_destroy(o);
  ASSERT_EQ(spgate_client_wait_connected(leader, 10000), SPGATE_OK) << spgate_last_error();

  spgate::client::InMemoryBroadcast group(kGroupSize, absl::Seconds(30));
  std::vector<RankComm> comm;
  for (int r = 0; r < kGroupSize; ++r) comm.push_back({&group, r});
  // The leader's group session needs the group's max-reduce (refused leaders alone, on a
  // group of their own: creation is collective).
  spgate::client::InMemoryBroadcast alone(1);
  RankComm alone_comm{&alone, 0};
  spgate_decider* d = nullptr;
  EXPECT_EQ(spgate_decider_create(leader, 0, GroupBroadcast, &alone_comm, &d),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("max-reduce"));
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(
      spgate_decider_create_group(nullptr, 0, GroupBroadcast, GroupReduceMax, &alone_comm, &d),
      SPGATE_INVALID_ARGUMENT);

  std::vector<spgate_decider*> deciders(kGroupSize, nullptr);
  for (int r = 0; r < kGroupSize; ++r) {
    ASSERT_EQ(spgate_decider_create_group(r == 0 ? leader : nullptr, r, GroupBroadcast,
                                          GroupReduceMax, &comm[r], &deciders[r]),
              SPGATE_OK)
        << "rank " << r << ": " << spgate_last_error();
  }
  constexpr int kSteps = 12;
  const auto log = RunGroup(deciders, kSteps);
  ExpectSameDecisions(log);
  ASSERT_EQ(spgate_client_flush(leader, 10000), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(server.service().telemetry_seen(), kSteps) << "one record per step, not per rank";
  EXPECT_EQ(server.service().registrations(), 1);
  spgate_client_stats st{};
  ASSERT_EQ(spgate_client_get_stats(leader, &st), SPGATE_OK);
  EXPECT_EQ(st.telemetry_reported, kSteps);
  EXPECT_EQ(st.telemetry_sent, kSteps);
  EXPECT_EQ(st.telemetry_acked, kSteps);
  EXPECT_EQ(st.daemon_decisions, kSteps);

  // A rank whose record is refused still takes part: it and the leader fail, the others
  // contribute, nothing is sent, and the next step goes on.
  std::vector<spgate_status> got(kGroupSize);
  std::vector<std::string> messages(kGroupSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kGroupSize; ++r) {
    threads.emplace_back([&, r] {
      spgate_telemetry t = RankTelemetry(r, log[0].back());
      if (r == 2) t.mode = 7;
      got[r] = spgate_decider_report_telemetry(deciders[r], &t);
      messages[r] = spgate_last_error();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got[0], SPGATE_INVALID_ARGUMENT) << messages[0];
  EXPECT_THAT(messages[0], HasSubstr("was refused"));
  EXPECT_EQ(got[1], SPGATE_OK) << messages[1];
  EXPECT_EQ(got[2], SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(messages[2], HasSubstr("invalid mode 7"));
  EXPECT_EQ(got[3], SPGATE_OK) << messages[3];
  ASSERT_EQ(spgate_client_flush(leader, 10000), SPGATE_OK) << spgate_last_error();
  EXPECT_EQ(server.service().telemetry_seen(), kSteps);

  for (spgate_decider* dd : deciders) spgate_decider_destroy(dd);
  spgate_client_destroy(leader);
}

// group_session "false": the old path, every rank a client and a session of its own,
// spgate_decider_create without a max-reduce, a record per rank and step.
TEST(CApiGroupTest, PerRankSessionsSendEveryRanksRecord) {
  spgate::client::testing::FakeGateServer server;
  std::vector<spgate_client*> clients(kGroupSize, nullptr);
  for (int r = 0; r < kGroupSize; ++r) {
    spgate_options* o =
        GroupOptions(server.address(), "c-api-per-rank", r, {{"group_session", "false"}});
    ASSERT_EQ(spgate_client_create(o, &clients[r]), SPGATE_OK)
        << "rank " << r << ": " << spgate_last_error();
    spgate_options_destroy(o);
  }
  ASSERT_EQ(spgate_client_wait_connected(clients[0], 10000), SPGATE_OK) << spgate_last_error();
  spgate::client::InMemoryBroadcast group(kGroupSize, absl::Seconds(30));
  std::vector<RankComm> comm;
  for (int r = 0; r < kGroupSize; ++r) comm.push_back({&group, r});
  // A max-reduce means a group session, which this leader's client does not have (on a
  // group of its own: creation is collective).
  spgate::client::InMemoryBroadcast alone(1);
  RankComm alone_comm{&alone, 0};
  spgate_decider* d = nullptr;
  EXPECT_EQ(spgate_decider_create_group(clients[0], 0, GroupBroadcast, GroupReduceMax,
                                        &alone_comm, &d),
            SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("group_session=false"));
  // A follower without a client of its own has nothing to report through (a pair of its
  // own, the leader first: the follower takes the leader's verdict).
  spgate::client::InMemoryBroadcast pair(2);
  RankComm pair_comm[2] = {{&pair, 0}, {&pair, 1}};
  spgate_decider* pair_leader = nullptr;
  ASSERT_EQ(spgate_decider_create(clients[0], 0, GroupBroadcast, &pair_comm[0], &pair_leader),
            SPGATE_OK);
  spgate_decider_destroy(pair_leader);
  ASSERT_EQ(spgate_decider_create(nullptr, 1, GroupBroadcast, &pair_comm[1], &d), SPGATE_OK);
  spgate_decision first{};
  first.mode = SPGATE_MODE_SEQUENCE_PARALLEL;
  first.reason = SPGATE_REASON_GATES_PASSED;
  spgate_telemetry t = RankTelemetry(1, first);
  EXPECT_EQ(spgate_decider_report_telemetry(d, &t), SPGATE_FAILED_PRECONDITION);
  spgate_decider_destroy(d);

  std::vector<spgate_decider*> deciders(kGroupSize, nullptr);
  for (int r = 0; r < kGroupSize; ++r) {
    ASSERT_EQ(spgate_decider_create(clients[r], r, GroupBroadcast, &comm[r], &deciders[r]),
              SPGATE_OK)
        << "rank " << r << ": " << spgate_last_error();
  }
  constexpr int kSteps = 10;
  ExpectSameDecisions(RunGroup(deciders, kSteps));
  for (int r = 0; r < kGroupSize; ++r) {
    ASSERT_EQ(spgate_client_flush(clients[r], 10000), SPGATE_OK)
        << "rank " << r << ": " << spgate_last_error();
    spgate_client_stats st{};
    ASSERT_EQ(spgate_client_get_stats(clients[r], &st), SPGATE_OK);
    EXPECT_EQ(st.telemetry_acked, kSteps) << "rank " << r;
  }
  EXPECT_EQ(server.service().telemetry_seen(), kSteps * kGroupSize);
  EXPECT_EQ(server.service().registrations(), kGroupSize);
  for (spgate_decider* dd : deciders) spgate_decider_destroy(dd);
  for (spgate_client* c : clients) spgate_client_destroy(c);
}

#ifdef SPGATE_HAVE_SERVER
// The real daemon sees the group's record: the slowest rank and its step time, the rank
// with the highest peak memory, the largest reduce-scatter share and all-gather.
TEST(CApiGroupTest, TheDaemonSeesTheGroupsMaxima) {
  auto daemon = spgate::server::Daemon::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string job = "c-api-group-maxima";
  spgate_options* o = GroupOptions((*daemon)->worker_address(), job, 0);
  spgate_client* leader = nullptr;
  ASSERT_EQ(spgate_client_create(o, &leader), SPGATE_OK) << spgate_last_error();
  spgate_options_destroy(o);
  ASSERT_EQ(spgate_client_wait_connected(leader, 10000), SPGATE_OK) << spgate_last_error();
  spgate::client::InMemoryBroadcast group(kGroupSize, absl::Seconds(30));
  std::vector<RankComm> comm;
  for (int r = 0; r < kGroupSize; ++r) comm.push_back({&group, r});
  std::vector<spgate_decider*> deciders(kGroupSize, nullptr);
  for (int r = 0; r < kGroupSize; ++r) {
    ASSERT_EQ(spgate_decider_create_group(r == 0 ? leader : nullptr, r, GroupBroadcast,
                                          GroupReduceMax, &comm[r], &deciders[r]),
              SPGATE_OK)
        << "rank " << r << ": " << spgate_last_error();
  }
  constexpr int kSteps = 8;
  const auto log = RunGroup(deciders, kSteps);
  ExpectSameDecisions(log);
  for (const spgate_decision& d : log[0]) EXPECT_EQ(d.source, SPGATE_SOURCE_DAEMON);
  ASSERT_EQ(spgate_client_flush(leader, 10000), SPGATE_OK) << spgate_last_error();

  auto admin = spgate::v1::AdminService::NewStub(
      grpc::CreateChannel((*daemon)->admin_address(), grpc::InsecureChannelCredentials()));
  spgate::v1::Job got;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    spgate::v1::GetJobRequest req;
    req.set_job_id(job);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status s = admin->GetJob(&ctx, req, &got);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (got.groups_size() == 1 && got.groups(0).last_step() == kSteps - 1 &&
        got.groups(0).slowest_rank() >= 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < give_up);
  ASSERT_EQ(got.groups_size(), 1) << got.DebugString();
  const spgate::v1::GroupStatus& g = got.groups(0);
  EXPECT_TRUE(g.group_session());
  EXPECT_EQ(g.group_size(), kGroupSize);
  EXPECT_EQ(g.ranks_active(), kGroupSize) << "the leader's session counts for the group";
  EXPECT_EQ(g.slowest_rank(), 2);
  EXPECT_NEAR(g.slowest_step_time_s(), 0.5, 1e-9);
  EXPECT_EQ(g.peak_memory_rank(), 1);
  EXPECT_NEAR(g.rolling_rs_wait_share(), 0.04, 1e-6) << "rank 3's share, not the slowest's";
  EXPECT_NEAR(g.all_gather_tail_s(), 0.03, 1e-9);
  uint64_t peak = 0;
  int64_t steps = 0;
  for (const spgate::v1::ModeStats& m : got.mode_stats()) {
    peak = std::max<uint64_t>(peak, m.peak_memory_bytes());
    steps += m.steps();
  }
  EXPECT_EQ(peak, 70 * kGiB);
  EXPECT_EQ(steps, kSteps);
  spgate_client_stats st{};
  ASSERT_EQ(spgate_client_get_stats(leader, &st), SPGATE_OK);
  EXPECT_EQ(st.telemetry_acked, kSteps);
  for (spgate_decider* dd : deciders) spgate_decider_destroy(dd);
  spgate_client_destroy(leader);
  (*daemon)->Shutdown(absl::Seconds(2));
}
#endif

std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "c_api_test.XXXXXX").string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// Bad TLS options are refused by spgate_client_create, naming the option, before
// anything is dialled.
TEST(CApiTest, BadTlsOptionsAreRefusedNamingTheOption) {
  const std::string dir = MakeTempDir();
  const std::string empty = dir + "/empty.pem";
  ASSERT_EQ(std::system(("touch " + empty).c_str()), 0);
  struct Case {
    std::vector<std::pair<const char*, std::string>> set;
    const char* message;
  };
  const Case cases[] = {
      {{{"tls_cert", empty}}, "tls_cert and tls_key go together"},
      {{{"tls_key", empty}}, "tls_cert and tls_key go together"},
      {{{"tls_ca", dir + "/missing.pem"}}, "tls_ca: cannot read"},
      {{{"tls_ca", empty}}, "tls_ca: \""},
      {{{"tls_server_name", "localhost"}}, "tls_server_name needs TLS"},
  };
  for (const Case& c : cases) {
    spgate_options* o = spgate_options_create();
    ASSERT_EQ(spgate_options_set(o, "controller", "127.0.0.1:1"), SPGATE_OK);
    for (const auto& [name, value] : c.set) {
      ASSERT_EQ(spgate_options_set(o, name, value.c_str()), SPGATE_OK) << spgate_last_error();
    }
    spgate_client* client = nullptr;
    EXPECT_EQ(spgate_client_create(o, &client), SPGATE_INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(spgate_last_error(), HasSubstr(c.message));
    EXPECT_EQ(client, nullptr);
    spgate_options_destroy(o);
  }
  std::filesystem::remove_all(dir);
}

std::string RunCommand(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  *rc = pclose(p);
  return out;
}

#ifdef PYTHON3_BIN
// The ctypes example's command line with these flags.
std::string TrainLoop(const std::string& flags) {
  return absl::StrCat(PYTHON3_BIN, " ", TRAIN_LOOP_PY, " --lib ", SPGATE_CLIENT_LIB, " ", flags);
}
#endif

#ifdef PYTHON3_BIN
// Flags out of range are usage errors naming the flag, before anything runs.
TEST(CApiTest, PythonCtypesExampleRefusesBadFlags) {
  const std::pair<const char*, const char*> cases[] = {
      {"--tp 0", "argument --tp: must be >= 1, got 0"},
      {"--tp -1", "argument --tp: must be >= 1, got -1"},
      {"--steps 0", "argument --steps: must be >= 1, got 0"},
      {"--deadline_ms -5", "argument --deadline_ms: must be >= 0, got -5"},
      {"--step_ms nan", "argument --step_ms: must be >= 0, got nan"},
  };
  for (const auto& [flags, error] : cases) {
    SCOPED_TRACE(flags);
    int rc = 0;
    const std::string out = RunCommand(TrainLoop(flags), &rc);
    EXPECT_NE(rc, 0) << out;
    EXPECT_THAT(out, HasSubstr(error));
    EXPECT_THAT(out, ::testing::Not(HasSubstr("Traceback")));
  }
}

// A leader whose client cannot be created (here: a controller address with no valid port)
// fails every rank of the group at once: the followers learn it from the decider's
// collective creation, not by waiting out the in-memory broadcast's 60 s.
TEST(CApiTest, PythonCtypesExampleLeaderFailureEndsEveryRankAtOnce) {
  int rc = 0;
  const absl::Time start = absl::Now();
  const std::string out =
      RunCommand(TrainLoop("--controller 127.0.0.1:85136 --tp 3 --steps 5"), &rc);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("rank 0: client_create failed"));
  EXPECT_THAT(out, HasSubstr("controller: \"127.0.0.1:85136\" is not host:port"));
  EXPECT_THAT(out, HasSubstr("rank 1: "));
  EXPECT_THAT(out, HasSubstr("rank 2: "));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("Traceback")));
}
#endif

#if defined(SPGATE_HAVE_SERVER) && defined(PYTHON3_BIN)
TEST(CApiTest, PythonCtypesExampleAgainstTheDaemon) {
  auto daemon = spgate::server::Daemon::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string cmd =
      TrainLoop(absl::StrCat("--controller ", (*daemon)->worker_address(), " --tp 4 --steps 100"));
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"lost_telemetry\": 0"));
  // One group session: a record a step for the group of 4.
  EXPECT_THAT(out, HasSubstr("\"telemetry_sent\": 100"));
  EXPECT_THAT(out, HasSubstr("\"clients\": 1"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("\"daemon_decisions\": 0")));
  (*daemon)->Shutdown(absl::Seconds(2));
}

// --per_rank_sessions: group_session "false", a client and a record per rank.
TEST(CApiTest, PythonCtypesExamplePerRankSessionsAgainstTheDaemon) {
  auto daemon = spgate::server::Daemon::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string cmd = TrainLoop(absl::StrCat(
      "--controller ", (*daemon)->worker_address(), " --tp 3 --steps 40 --per_rank_sessions"));
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"lost_telemetry\": 0"));
  EXPECT_THAT(out, HasSubstr("\"telemetry_sent\": 120"));
  EXPECT_THAT(out, HasSubstr("\"clients\": 3"));
  (*daemon)->Shutdown(absl::Seconds(2));
}
#endif

#ifdef SPGATE_HAVE_SERVER
// An mTLS daemon: with tls_ca, tls_cert, tls_key (and tls_server_name, since the client
// dials 127.0.0.1 and checks "localhost") the decision is the daemon's; without the
// client certificate the daemon refuses the connection and the client decides locally.
class CApiTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    const absl::Status certs = spgate::testing::MakeTestCertificates(dir_);
    ASSERT_TRUE(certs.ok()) << certs;
    spgate::server::DaemonOptions opts;
    opts.tls_cert = dir_ + "/server.pem";
    opts.tls_key = dir_ + "/server.key";
    opts.tls_client_ca = dir_ + "/ca.pem";
    auto daemon = spgate::server::Daemon::Start(opts);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }
  void TearDown() override {
    if (daemon_) daemon_->Shutdown(absl::Seconds(2));
    std::filesystem::remove_all(dir_);
  }

  // Submits a plan for step 0 and returns its decision after waiting for the stream.
  spgate_decision DecideOnce(const std::vector<std::pair<const char*, std::string>>& tls) {
    spgate_options* o = spgate_options_create();
    EXPECT_EQ(spgate_options_set(o, "controller", daemon_->worker_address().c_str()), SPGATE_OK);
    EXPECT_EQ(spgate_options_set(o, "job_id", "c-api-tls"), SPGATE_OK);
    EXPECT_EQ(spgate_options_set(o, "incarnation", "c-api-launch"), SPGATE_OK);
    char cred[SPGATE_LAUNCH_CREDENTIAL_BUFFER];
    EXPECT_EQ(spgate_new_launch_credential(cred, sizeof(cred)), SPGATE_OK);
    EXPECT_EQ(spgate_options_set(o, "launch_credential", cred), SPGATE_OK);
    for (const auto& [name, value] : tls) {
      EXPECT_EQ(spgate_options_set(o, name, value.c_str()), SPGATE_OK) << spgate_last_error();
    }
    spgate_client* c = nullptr;
    EXPECT_EQ(spgate_client_create(o, &c), SPGATE_OK) << spgate_last_error();
    spgate_options_destroy(o);
    spgate_decision d{};
    if (c == nullptr) return d;
    connected_ = spgate_client_wait_connected(c, 1500);
    if (connected_ != SPGATE_OK) connected_error_ = spgate_last_error();
    const int64_t lengths[] = {4096, 4000, 4100};
    EXPECT_EQ(spgate_client_submit_plan(c, 0, lengths, 3, 0, 0, 0), SPGATE_OK);
    EXPECT_EQ(spgate_client_await_decision(c, 0, 2000000, &d), SPGATE_OK) << spgate_last_error();
    spgate_client_destroy(c);
    return d;
  }

  std::string dir_;
  std::unique_ptr<spgate::server::Daemon> daemon_;
  spgate_status connected_ = SPGATE_OK;
  std::string connected_error_;
};

TEST_F(CApiTlsTest, MutualTlsGetsTheDaemonsDecision) {
  const spgate_decision d = DecideOnce({{"tls_ca", dir_ + "/ca.pem"},
                                        {"tls_cert", dir_ + "/client.pem"},
                                        {"tls_key", dir_ + "/client.key"},
                                        {"tls_server_name", "localhost"}});
  EXPECT_EQ(connected_, SPGATE_OK);
  EXPECT_EQ(d.source, SPGATE_SOURCE_DAEMON);
}

TEST_F(CApiTlsTest, WithoutAClientCertificateTheClientDecidesLocally) {
  const spgate_decision d =
      DecideOnce({{"tls_ca", dir_ + "/ca.pem"}, {"tls_server_name", "localhost"}});
  EXPECT_EQ(connected_, SPGATE_DEADLINE_EXCEEDED);
  // gRPC says "Socket closed"; the error says what that usually means (both causes: the
  // client library cannot tell TLS credentials from plaintext ones).
  EXPECT_THAT(connected_error_, HasSubstr("a client certificate missing (tls_cert, tls_key) or "
                                          "not signed by the daemon's --tls_client_ca"));
  EXPECT_EQ(d.source, SPGATE_SOURCE_FALLBACK);
  EXPECT_EQ(d.reason, SPGATE_REASON_CONTROLLER_UNAVAILABLE);
}

TEST_F(CApiTlsTest, APlaintextClientIsToldThePortSpeaksTls) {
  const spgate_decision d = DecideOnce({});
  EXPECT_EQ(connected_, SPGATE_DEADLINE_EXCEEDED);
  EXPECT_THAT(connected_error_,
              HasSubstr("this client spoke plaintext (no tls_ca, tls_cert) and the port "
                        "speaks TLS"));
  EXPECT_EQ(d.source, SPGATE_SOURCE_FALLBACK);
}

#ifdef PYTHON3_BIN
TEST_F(CApiTlsTest, PythonCtypesExampleWithMutualTls) {
  // A generous deadline: this is about the handshake, not about latency on a busy machine.
  const std::string cmd = TrainLoop(absl::StrCat(
      "--controller ", daemon_->worker_address(), " --tp 2 --steps 30 --deadline_ms 2000",
      " --tls_ca ", dir_, "/ca.pem --tls_cert ", dir_, "/client.pem --tls_key ", dir_,
      "/client.key --tls_server_name localhost"));
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"local_decisions\": 0"));
  EXPECT_THAT(out, HasSubstr("\"daemon_decisions\": 30"));
}
#endif
#endif

#ifdef PYTHON3_BIN
TEST(CApiTest, PythonCtypesExampleWithoutADaemon) {
  const std::string cmd = TrainLoop("--tp 3 --steps 60");
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"local_decisions\": 60"));
}
#endif

}  // namespace
