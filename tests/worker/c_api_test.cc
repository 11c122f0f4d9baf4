// The C API (spgate_client.h): error codes with messages, a decider over a C broadcast
// callback, and the ctypes example (examples/python/train_loop.py) run against a real
// in-process daemon.
#include "worker/client/spgate_client.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#ifdef SPGATE_HAVE_SERVER
#include "server/daemon.h"
#endif

namespace {

using ::testing::HasSubstr;

TEST(CApiTest, ErrorsCarryCodeAndMessage) {
  spgate_options* o = spgate_options_create();
  EXPECT_EQ(spgate_options_set(o, "no_such_option", "1"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("unknown option \"no_such_option\""));
  EXPECT_EQ(spgate_options_set(o, "group_size", "two"), SPGATE_INVALID_ARGUMENT);
  EXPECT_THAT(spgate_last_error(), HasSubstr("not an integer"));
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

// A one-rank "group": the broadcast callback sees the leader's bytes.
int32_t CountingBroadcast(void* buf, size_t size, int32_t root, void* user) {
  auto* calls = static_cast<int*>(user);
  ++*calls;
  return size == 24 && root == 0 ? 0 : 1;
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
  EXPECT_EQ(calls, 1);
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
  spgate_decider_destroy(d);
  spgate_client_destroy(c);
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

#if defined(SPGATE_HAVE_SERVER) && defined(PYTHON3_BIN)
TEST(CApiTest, PythonCtypesExampleAgainstTheDaemon) {
  auto daemon = spgate::server::Daemon::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string cmd =
      absl::StrCat(PYTHON3_BIN, " ", TRAIN_LOOP_PY, " --lib ", SPGATE_CLIENT_LIB,
                   " --controller ", (*daemon)->worker_address(), " --tp 4 --steps 100");
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"lost_telemetry\": 0"));
  EXPECT_THAT(out, HasSubstr("\"telemetry_sent\": 400"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("\"daemon_decisions\": 0")));
  (*daemon)->Shutdown(absl::Seconds(2));
}
#endif

#ifdef PYTHON3_BIN
TEST(CApiTest, PythonCtypesExampleWithoutADaemon) {
  const std::string cmd = absl::StrCat(PYTHON3_BIN, " ", TRAIN_LOOP_PY, " --lib ",
                                       SPGATE_CLIENT_LIB, " --tp 3 --steps 60");
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"consistency_violations\": 0"));
  EXPECT_THAT(out, HasSubstr("\"local_decisions\": 60"));
}
#endif

}  // namespace
