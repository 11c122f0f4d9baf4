// The C API (spgate_client.h): error codes with messages, a decider over a C broadcast
// callback, the launch credential (made, required, checked), a memory override and a
// replaced session in the stats (against the scripted daemon of fake_gate_service.h), the
// TLS options against a real in-process mTLS daemon, and the ctypes example
// (examples/python/train_loop.py) run against a real in-process daemon, with and without
// mTLS.
#include "worker/client/spgate_client.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"
#include "tests/worker/client/fake_gate_service.h"
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
  EXPECT_THAT(out, HasSubstr("\"telemetry_sent\": 400"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("\"daemon_decisions\": 0")));
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
    const int64_t lengths[] = {4096, 4000, 4100};
    EXPECT_EQ(spgate_client_submit_plan(c, 0, lengths, 3, 0, 0, 0), SPGATE_OK);
    EXPECT_EQ(spgate_client_await_decision(c, 0, 2000000, &d), SPGATE_OK) << spgate_last_error();
    spgate_client_destroy(c);
    return d;
  }

  std::string dir_;
  std::unique_ptr<spgate::server::Daemon> daemon_;
  spgate_status connected_ = SPGATE_OK;
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
  EXPECT_EQ(d.source, SPGATE_SOURCE_FALLBACK);
  EXPECT_EQ(d.reason, SPGATE_REASON_CONTROLLER_UNAVAILABLE);
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
