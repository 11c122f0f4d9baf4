// spgatectl end to end: a real daemon on port 0 (spgate::server::Daemon) and the real
// spgatectl binary, run as a subprocess for every command. Checks what an operator
// sees: the exit status, stdout, and the server's message on stderr for a refusal.
// Decisions are driven through GateService.Decide, as a simple worker would.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/testing/test_certs.h"
#include "spgate/v1/admin.pb.h"
#include "spgate/v1/gate.grpc.pb.h"

#ifndef SPGATECTL_PATH
#error "SPGATECTL_PATH must name the spgatectl binary"
#endif

namespace spgate {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "spgatectl_e2e.XXXXXX").string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// One spgatectl process; stdout and stderr go to files so a test can look at them
// while it runs (watch) and after it ends.
class CtlProcess {
 public:
  CtlProcess(const fs::path& dir, const std::vector<std::string>& args) {
    static int counter = 0;
    const std::string stem = absl::StrCat("ctl", ++counter);
    out_ = dir / (stem + ".out");
    err_ = dir / (stem + ".err");
    // Everything the child needs is prepared before fork: after it, only
    // async-signal-safe calls (this process has gRPC threads).
    std::vector<std::string> argv_storage = {SPGATECTL_PATH};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = out_.string(), err = err_.string();
    pid_ = fork();
    if (pid_ == 0) {
      const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o < 0 || e < 0) _exit(126);
      dup2(o, 1);
      dup2(e, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~CtlProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // The exit status (128 + signal when killed by one), or -1 if still running after
  // `timeout`.
  int Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (Running()) {
      if (absl::Now() >= deadline) return -1;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return exit_status_;
  }
  bool Running() {
    int status = 0;
    if (exited_) return false;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }
  void Signal(int sig) { kill(pid_, sig); }
  std::string out() const { return ReadAll(out_); }
  std::string err() const { return ReadAll(err_); }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_status_ = -1;
};

struct CtlResult {
  int exit_code;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const CtlResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// A plan's memory facts (all 0: the memory gate is off for it).
struct PlanMemory {
  uint64_t budget = 0;
  uint64_t peak_sp = 0;
  uint64_t peak_tp = 0;
};

class SpgatectlE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    StartDaemon(Options());
  }
  void TearDown() override {
    if (daemon_) daemon_->Shutdown(absl::Seconds(2));
    daemon_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  server::DaemonOptions Options() {
    server::DaemonOptions opts;  // loopback, port 0
    opts.metrics_listen = "";
    opts.state_dir = (dir_ / "state").string();
    fs::create_directories(opts.state_dir);
    return opts;
  }

  void StartDaemon(server::DaemonOptions opts) {
    leaders_.clear();  // sessions die with the daemon
    if (daemon_) daemon_->Shutdown(absl::Seconds(2));
    auto d = server::Daemon::Start(std::move(opts));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    gate_ = v1::GateService::NewStub(
        grpc::CreateChannel(daemon_->worker_address(), grpc::InsecureChannelCredentials()));
  }

  // Runs spgatectl against the daemon's admin port and waits for it.
  CtlResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), absl::StrCat("--admin=", daemon_->admin_address()));
    return CtlRaw(args);
  }
  CtlResult CtlRaw(const std::vector<std::string>& args) {
    CtlProcess p(dir_, args);
    const int code = p.Wait(absl::Seconds(30));
    return {code, p.out(), p.err()};
  }
  std::unique_ptr<CtlProcess> Spawn(std::vector<std::string> args) {
    args.insert(args.begin(), absl::StrCat("--admin=", daemon_->admin_address()));
    return std::make_unique<CtlProcess>(dir_, args);
  }

  // One plan through GateService.Decide, as the group's leader (registered once).
  v1::Decision Decide(const std::string& job, int group, int64_t step,
                      std::vector<int64_t> lengths = {4096, 4096, 4096, 4096},
                      PlanMemory memory = {}) {
    std::string& session = leaders_[{job, group}];
    if (session.empty()) {
      v1::RegisterRequest r;
      r.set_job_id(job);
      r.set_incarnation("spgatectl-e2e");
      r.set_launch_credential("test-launch-credential-0001");
      r.set_hardware_id("NVIDIA H200 sm_90 140GiB");
      r.set_group(group);
      r.set_group_size(1);
      v1::RegisterResponse resp;
      grpc::ClientContext rctx;
      rctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      const grpc::Status rs = gate_->Register(&rctx, r, &resp);
      EXPECT_TRUE(rs.ok()) << rs.error_message();
      session = resp.session_id();
    }
    v1::DecideRequest req;
    req.set_session_id(session);
    req.mutable_plan()->set_job_id(job);
    req.mutable_plan()->set_group(group);
    req.mutable_plan()->set_step(step);
    for (int64_t l : lengths) req.mutable_plan()->add_lengths(l);
    req.mutable_plan()->set_memory_budget_bytes(memory.budget);
    req.mutable_plan()->set_predicted_peak_bytes_sp(memory.peak_sp);
    req.mutable_plan()->set_predicted_peak_bytes_tp(memory.peak_tp);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::Decision d;
    const grpc::Status s = gate_->Decide(&ctx, req, &d);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return d;
  }

  std::map<std::pair<std::string, int>, std::string> leaders_;  // (job, group) -> session
  fs::path dir_;
  std::unique_ptr<server::Daemon> daemon_;
  std::unique_ptr<v1::GateService::Stub> gate_;
};

template <typename T>
T ParseJson(const std::string& json) {
  T m;
  const auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << json;
  return m;
}

TEST_F(SpgatectlE2eTest, GatesGetShowsTheDefaults) {
  const CtlResult r = Ctl({"gates", "get"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("scope    global\n"));
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.18  default"));
  EXPECT_THAT(r.out, ContainsRegex("window_steps +50  default"));
  EXPECT_THAT(r.err, IsEmpty());
}

TEST_F(SpgatectlE2eTest, GatesSetThenGetShowsIt) {
  CtlResult r = Ctl({"gates", "set", "--max_length_cv=0.25", "--window_steps=10"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.25  override"));

  r = Ctl({"gates", "get"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.25  override"));
  EXPECT_THAT(r.out, ContainsRegex("window_steps +10  override"));
  EXPECT_THAT(r.out, ContainsRegex("max_rs_wait_share +0.22  default"));

  // A job override on top, then --clear removes it (masked but unset). The job has not
  // run here: its scope is kept, and spgatectl says the daemon does not know it yet (a
  // typo would look the same). Its override lists it (jobs list), with no launch: a
  // second change says that instead. Once it runs, nothing is said.
  r = Ctl({"gates", "set", "--job_id=llama", "--max_length_cv=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("gates set: job llama is not known to the daemon yet"));
  r = Ctl({"jobs", "list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("\nllama "));
  r = Ctl({"gates", "set", "--job_id=llama", "--window_steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("gates set: no launch of job llama is running"),
                           Not(HasSubstr("not known"))));
  r = Ctl({"gates", "set", "--job_id=llama", "--clear=window_steps"});
  ASSERT_EQ(r.exit_code, 0) << r;
  Decide("llama", 0, 0);
  r = Ctl({"gates", "set", "--job_id=llama", "--max_length_cv=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, IsEmpty());
  r = Ctl({"gates", "get", "--job_id=llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("scope    job llama\n"));
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.5  override"));
  EXPECT_THAT(r.out, ContainsRegex("window_steps +10  inherited"));

  r = Ctl({"gates", "set", "--job_id=llama", "--clear=max_length_cv"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.25  inherited"));
}

// gates rollback of a job scope warns as gates set does (a mistyped id answers "as it
// is" for version 0); the exit status stays 0.
TEST_F(SpgatectlE2eTest, RollbackOfAnUnknownJobSaysSo) {
  CtlResult r = Ctl({"gates", "rollback", "--job_id=nope", "--to_version=0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("scope    job nope\n"));
  EXPECT_THAT(r.err, HasSubstr("spgatectl: gates rollback: job nope is not known to the daemon "
                               "yet (jobs list shows the ones it knows)"));
  Decide("llama", 0, 0);
  r = Ctl({"gates", "rollback", "--job_id=llama", "--to_version=0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, IsEmpty());
  r = Ctl({"gates", "rollback", "--to_version=0"});  // the global scope: no job to look up
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, IsEmpty());
}

TEST_F(SpgatectlE2eTest, InvalidValueIsRefusedWithTheServersMessage) {
  const CtlResult r = Ctl({"gates", "set", "--max_rs_wait_share=1.5"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("max_rs_wait_share"));
  EXPECT_THAT(r.out, IsEmpty());
  // Nothing changed.
  EXPECT_THAT(Ctl({"gates", "get"}).out, ContainsRegex("max_rs_wait_share +0.22  default"));
}

TEST_F(SpgatectlE2eTest, LocalValidationNamesTheFlagAndExitsWithUsage) {
  const CtlResult r = Ctl({"gates", "set", "--max_length_cv=lots"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: --max_length_cv: \"lots\" is not a number\n"));
  EXPECT_THAT(r.err, HasSubstr("run 'spgatectl gates set --help' for usage"));
}

TEST_F(SpgatectlE2eTest, VersionConflictIsAborted) {
  CtlResult r = Ctl({"--output=json", "gates", "set", "--window_steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto config = ParseJson<v1::VersionedGateConfig>(r.out);
  ASSERT_GT(config.version(), 0);

  r = Ctl({"gates", "set", "--window_steps=30",
           absl::StrCat("--expected_version=", config.version() + 5)});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: ABORTED: "));
  EXPECT_THAT(r.err, HasSubstr("version"));

  r = Ctl({"gates", "set", "--window_steps=30",
           absl::StrCat("--expected_version=", config.version())});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("window_steps +30  override"));
}

TEST_F(SpgatectlE2eTest, UnknownJobIsNotFound) {
  CtlResult r = Ctl({"jobs", "list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "no jobs\n");

  r = Ctl({"jobs", "show", "nope"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: jobs show: NOT_FOUND: "));
  EXPECT_THAT(r.err, HasSubstr("nope"));

  r = Ctl({"eval", "--lengths=100", "--job_id=nope"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: eval: NOT_FOUND: "));
}

TEST_F(SpgatectlE2eTest, JobsListAndShowAfterDecisions) {
  for (int64_t step = 0; step < 3; ++step) Decide("llama", 0, step);
  Decide("llama", 1, 0, {128, 65536});  // high CV: TP-only
  CtlResult r = Ctl({"jobs", "list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("JOB "));
  // 4 group-steps, each its one micro-batch; group 0 SP, group 1 TP-only.
  EXPECT_THAT(r.out, ContainsRegex("GROUP_STEPS +MICROBATCHES +SP_GROUPS +TP_GROUPS +VERSION\n"));
  EXPECT_THAT(r.out, ContainsRegex("\nllama +2 +[0-9]+ +[0-9]+ +4 +4 +1 +1 "));

  r = Ctl({"jobs", "show", "llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("job               llama\n"));
  EXPECT_THAT(r.out, HasSubstr("hardware          NVIDIA H200 sm_90 140GiB\n"));  // Register's
  EXPECT_THAT(r.out, HasSubstr("group-steps       4 decided\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("micro-batches     ")));  // a plain job's are its steps
  EXPECT_THAT(r.out, HasSubstr("\nGROUPS\n"));
  EXPECT_THAT(r.out, ContainsRegex("\n +0 .* sp +gates_passed +2 "));
  EXPECT_THAT(r.out, ContainsRegex("\n +1 .* tp_only +length_cv +0 "));
  EXPECT_THAT(r.out, HasSubstr("\nMODES (rolling window of group-steps; tokens/s per group;"));
  EXPECT_THAT(r.out, ContainsRegex("DECISIONS \\(group-steps\\)\nMODE +REASON +COUNT\n"));
  EXPECT_THAT(r.out, ContainsRegex("sp +gates_passed +3\n"));
  EXPECT_THAT(r.out, ContainsRegex("tp_only +length_cv +1\n"));
  EXPECT_THAT(r.out, HasSubstr("PINS\n(none)\n"));
}

TEST_F(SpgatectlE2eTest, PinAndUnpin) {
  Decide("llama", 0, 0);
  CtlResult r = Ctl({"pin", "llama", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("pinned job llama all groups to tp_only until "));
  EXPECT_THAT(r.out, HasSubstr("(in 9m5"));
  EXPECT_THAT(r.err, IsEmpty()) << "no memory gate holds the job";

  v1::Decision d = Decide("llama", 0, 1);
  EXPECT_EQ(d.mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(d.reason(), v1::PINNED);

  r = Ctl({"jobs", "show", "llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("PINS\nTARGET +MODE +EXPIRES +LEFT\nall groups +tp_only "));

  r = Ctl({"pin", "llama", "--group=0", "--mode=sp", "--for=8d"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: pin: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("duration"));

  r = Ctl({"unpin", "llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "removed 1 pin of job llama\n");
  d = Decide("llama", 0, 2);
  EXPECT_NE(d.reason(), v1::PINNED);

  r = Ctl({"--output=json", "unpin", "llama", "--group=0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ParseJson<v1::UnpinResponse>(r.out).removed(), 0);
}

// An unforced TP-only pin yields to the memory gate; on a job that gate holds in SP the
// pin's decisions keep the memory reason, so pin says so on stderr and names --force.
TEST_F(SpgatectlE2eTest, ATpPinOnAJobTheMemoryGateHoldsSaysItYieldsAndNamesForce) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const PlanMemory tight{.budget = 80 * kGiB, .peak_sp = 60 * kGiB, .peak_tp = 90 * kGiB};
  const std::vector<int64_t> lengths = {4096, 4096, 4096, 4096};
  ASSERT_EQ(Decide("llama", 0, 0, lengths, tight).reason(), v1::MEMORY_REQUIRES_SP);
  ASSERT_EQ(Decide("llama", 1, 0, lengths).reason(), v1::GATES_PASSED);
  CtlResult r = Ctl({"pin", "llama", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("pinned job llama all groups to tp_only until "));
  EXPECT_EQ(r.err, "spgatectl: pin: job llama: the memory gate held 1 of 2 groups in SP at the "
                   "last decision (memory_requires_sp): a TP-only pin yields to it while "
                   "TP-only does not fit; --force overrides it (audited)\n");
  EXPECT_EQ(Decide("llama", 0, 1, lengths, tight).reason(), v1::MEMORY_REQUIRES_SP);
  r = Ctl({"pin", "llama", "--group=0", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("the memory gate held group 0 in SP"));
  r = Ctl({"pin", "llama", "--group=1", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, IsEmpty()) << "group 1 is not held";
  // Forced, the pin takes TP-only past the gate: nothing to say.
  r = Ctl({"pin", "llama", "--group=0", "--mode=tp", "--for=10m", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_EQ(Decide("llama", 0, 2, lengths, tight).reason(), v1::PINNED);
  // JSON output keeps stdout one document; the note is on stderr.
  r = Ctl({"--output=json", "pin", "llama", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ParseJson<v1::Pin>(r.out).mode(), v1::TENSOR_PARALLEL_ONLY);
}

TEST_F(SpgatectlE2eTest, EvalPrintsTheDecisionAndReasonChain) {
  CtlResult r = Ctl({"eval", "--lengths=512,4096,16384"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("decision       tp_only (length_cv)\n"));
  EXPECT_THAT(r.out, ContainsRegex("\nlength_cv +fire +[0-9.]+ +0.18 "));

  r = Ctl({"eval", "--lengths=4096,4096", "--rs_wait_share=0.3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("decision       tp_only (rs_wait)\n"));

  // A hypothetical config layered over the live one, for this evaluation only.
  r = Ctl({"eval", "--lengths=512,4096,16384", "--max_length_cv=5"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("decision       sp (gates_passed)\n"));
  EXPECT_THAT(r.out, HasSubstr("max_length_cv=5 "));
  EXPECT_THAT(Ctl({"gates", "get"}).out, ContainsRegex("max_length_cv +0.18  default"));

  // TP-only would not fit: SP whatever the other gates say.
  r = Ctl({"eval", "--lengths=512,16384", "--budget=80GiB", "--peak_sp=60GiB", "--peak_tp=79GiB"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("decision       sp (memory_requires_sp)\n"));

  r = Ctl({"eval", "--lengths=0"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: eval: INVALID_ARGUMENT: "));

  r = Ctl({"--output=json", "eval", "--lengths=100,200"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto resp = ParseJson<v1::EvaluateGatesResponse>(r.out);
  EXPECT_GT(resp.checks_size(), 0);
  EXPECT_TRUE(resp.config_used().has_max_length_cv());
  // The same batch under each policy: CV 0.33 is TP-only for the gates and, with nothing
  // learned, for ADAPTIVE's prior too (the evaluation avoids an exploration step).
  ASSERT_EQ(resp.by_policy_size(), 2);
  EXPECT_EQ(resp.by_policy(0).policy(), v1::GateConfig::STATIC);
  EXPECT_EQ(resp.by_policy(1).policy(), v1::GateConfig::ADAPTIVE);
  for (const auto& p : resp.by_policy()) {
    EXPECT_EQ(p.mode(), v1::TENSOR_PARALLEL_ONLY);
    EXPECT_EQ(p.reason(), v1::LENGTH_CV);
  }
  r = Ctl({"eval", "--lengths=100,100"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("POLICIES (the same batch under each)"));
  EXPECT_THAT(r.out, ContainsRegex("ADAPTIVE +sp +gates_passed"));
}

TEST_F(SpgatectlE2eTest, WatchCountStopsAfterNDecisions) {
  int64_t step = 0;
  Decide("llama", 0, step++);  // a job the daemon knows: nothing said on stderr
  auto watch = Spawn({"watch", "llama", "--count=3"});
  // The watch may subscribe after the first plans; keep deciding until it has seen 3.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (watch->Running() && absl::Now() < deadline) {
    Decide("other", 0, step);  // filtered out by the job argument
    Decide("llama", 0, step++);
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(watch->Wait(absl::Seconds(5)), 0) << watch->err();
  const std::vector<std::string> lines = absl::StrSplit(watch->out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << watch->out();
  for (const std::string& line : lines) {
    EXPECT_THAT(line, AllOf(HasSubstr("job=llama group=0 step="), HasSubstr(" mode=sp"),
                            HasSubstr(" reason=gates_passed")));
  }
  EXPECT_THAT(watch->err(), IsEmpty());
}

// A job the daemon does not know yet is watched (its decisions appear once it starts),
// and spgatectl says so instead of waiting in silence; a job id no job may have is a
// usage error, before anything is sent.
TEST_F(SpgatectlE2eTest, WatchOfAJobNotYetKnownSaysSoAndWaits) {
  auto watch = Spawn({"watch", "later", "--count=1"});
  int64_t step = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (watch->err().empty() && watch->Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(watch->err(), HasSubstr("job later is not known to the daemon yet"));
  while (watch->Running() && absl::Now() < deadline) {
    Decide("later", 0, step++);
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(watch->Wait(absl::Seconds(5)), 0) << watch->err();
  EXPECT_THAT(watch->out(), HasSubstr("job=later group=0"));
  CtlResult r = Ctl({"watch", "bad/id", "--count=1"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("job_id: \"bad/id\" may contain only"));
}

TEST_F(SpgatectlE2eTest, WatchJsonIsOneDecisionPerLine) {
  auto watch = Spawn({"--output=json", "watch", "--count=2"});
  int64_t step = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (watch->Running() && absl::Now() < deadline) {
    Decide("llama", 3, step++, {100, 50000});
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(watch->Wait(absl::Seconds(5)), 0) << watch->err();
  const std::vector<std::string> lines = absl::StrSplit(watch->out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << watch->out();
  for (const std::string& line : lines) {
    const auto d = ParseJson<v1::Decision>(line);
    EXPECT_EQ(d.job_id(), "llama");
    EXPECT_EQ(d.group(), 3);
    EXPECT_EQ(d.reason(), v1::LENGTH_CV);
  }
}

TEST_F(SpgatectlE2eTest, WatchStopsCleanlyOnSigterm) {
  for (int sig : {SIGTERM, SIGINT}) {
    auto watch = Spawn({"watch"});
    int64_t step = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (watch->out().empty() && watch->Running() && absl::Now() < deadline) {
      Decide(absl::StrCat("job", sig), 0, step++);
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_THAT(watch->out(), HasSubstr("job=job")) << watch->err();
    watch->Signal(sig);
    EXPECT_EQ(watch->Wait(absl::Seconds(5)), 0) << "signal " << sig << ": " << watch->err();
    EXPECT_THAT(watch->err(), IsEmpty());
  }
}

TEST_F(SpgatectlE2eTest, JsonOutputParses) {
  Decide("llama", 0, 0);
  CtlResult r = Ctl({"--output=json", "gates", "get"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_DOUBLE_EQ(ParseJson<v1::VersionedGateConfig>(r.out).config().max_length_cv(), 0.18);

  r = Ctl({"--output=json", "jobs", "list"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto jobs = ParseJson<v1::ListJobsResponse>(r.out);
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).job_id(), "llama");

  r = Ctl({"jobs", "show", "llama", "--output=json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ParseJson<v1::Job>(r.out).summary().job_id(), "llama");
  EXPECT_THAT(r.out, HasSubstr("\"steps_decided\""));  // proto field names
  EXPECT_THAT(r.out, HasSubstr("\"group_steps_decided\""));
  EXPECT_THAT(r.out, HasSubstr("\"hardware_id\": \"NVIDIA H200 sm_90 140GiB\""));
  EXPECT_THAT(r.out, HasSubstr("\"microbatches\""));  // mode_stats: its samples

  r = Ctl({"--output=json", "pin", "llama", "--mode=sp", "--for=1m", "--group=0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto pin = ParseJson<v1::Pin>(r.out);
  EXPECT_EQ(pin.mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(pin.group(), 0);
}

TEST_F(SpgatectlE2eTest, UnreachableDaemonIsAnRpcError) {
  const CtlResult r = CtlRaw({"--admin=127.0.0.1:1", "--timeout=2s", "jobs", "list"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: jobs list: UNAVAILABLE: "));
}

TEST_F(SpgatectlE2eTest, TokenIsSentAsBearerMetadata) {
  const fs::path token = dir_ / "token", wrong = dir_ / "wrong";
  std::ofstream(token) << "s3cret\n";
  std::ofstream(wrong) << "guess\n";
  server::DaemonOptions opts = Options();
  opts.admin_token_file = token.string();
  StartDaemon(opts);

  CtlResult r = Ctl({"gates", "set", "--max_length_cv=0.3"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: UNAUTHENTICATED: "));

  r = Ctl({"gates", "set", "--max_length_cv=0.3", "--token_file=" + wrong.string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: PERMISSION_DENIED: "));

  r = Ctl({"gates", "set", "--max_length_cv=0.3", "--token_file=" + token.string()});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.3  override"));

  r = Ctl({"gates", "get", "--token_file=" + (dir_ / "missing").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--token_file: cannot read"));

  // With a credential configured, reads need one as well.
  r = Ctl({"gates", "get"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates get: UNAUTHENTICATED: "));
}

// Two roles: the reader's token reads but cannot change anything; the admin's named
// token (the daemon's own NAME:TOKEN file works as spgatectl's --token_file) can, and
// the history names who did it.
TEST_F(SpgatectlE2eTest, ReaderAndAdminRoles) {
  const fs::path admin = dir_ / "admin-tokens", reader = dir_ / "reader-tokens";
  std::ofstream(admin) << "alice:admin-secret\n";
  std::ofstream(reader) << "ci:reader-secret\n";
  server::DaemonOptions opts = Options();
  opts.admin_token_file = admin.string();
  opts.reader_token_file = reader.string();
  StartDaemon(opts);
  const std::string as_reader = "--token_file=" + reader.string();
  const std::string as_admin = "--token_file=" + admin.string();

  CtlResult r = Ctl({"gates", "get", as_reader});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = Ctl({"gates", "set", "--max_length_cv=0.3", as_reader});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: PERMISSION_DENIED: ci has the reader role"));
  r = Ctl({"gates", "set", "--max_length_cv=0.3", as_admin});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = Ctl({"gates", "rollback", "--to_version=1", as_reader});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates rollback: PERMISSION_DENIED: "));
  r = Ctl({"gates", "history", as_reader});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("global +alice +UpdateGateConfig +max_length_cv - -> 0.3"));
  EXPECT_THAT(ReadAll(dir_ / "state" / "audit.log"), Not(HasSubstr("secret")));
}

TEST_F(SpgatectlE2eTest, HistoryAndRollback) {
  CtlResult r = Ctl({"--output=json", "gates", "set", "--max_length_cv=0.3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const int64_t first = ParseJson<v1::VersionedGateConfig>(r.out).version();
  r = Ctl({"gates", "set", "--max_length_cv=0.4", "--window_steps=10"});
  ASSERT_EQ(r.exit_code, 0) << r;
  r = Ctl({"gates", "set", "--job_id=llama", "--min_dwell_steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r;

  r = Ctl({"gates", "history"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("VERSION +SCOPE +PRINCIPAL +CALL +CHANGE"));
  EXPECT_THAT(r.out, HasSubstr("max_length_cv 0.3 -> 0.4, window_steps - -> 10"));
  EXPECT_LT(r.out.find("job llama"), r.out.find("global"));  // newest first

  r = Ctl({"--output=json", "gates", "history", "--job_id=llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto history = ParseJson<v1::ListConfigHistoryResponse>(r.out);
  ASSERT_EQ(history.entries_size(), 1);
  EXPECT_EQ(history.entries(0).job_id(), "llama");
  EXPECT_EQ(history.entries(0).principal(), "anonymous");

  r = Ctl({"gates", "rollback", absl::StrCat("--to_version=", first)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("max_length_cv +0.3  override"));
  EXPECT_THAT(r.out, ContainsRegex("window_steps +50  default"));
  r = Ctl({"gates", "history", "--limit=1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("RollbackGateConfig  to version ", first)));
  EXPECT_THAT(r.out, HasSubstr("older entries: --page_token="));

  r = Ctl({"gates", "rollback", "--to_version=999"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates rollback: NOT_FOUND: version 999"));
  r = Ctl({"gates", "rollback", "--job_id=llama", absl::StrCat("--to_version=", first)});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates rollback: INVALID_ARGUMENT: "));
}

// A forced TP-only pin says so in its reply, in the history and in the audit log; an
// unforced one does not; a pin that replaces another records the old one, and an unpin
// what it removed.
TEST_F(SpgatectlE2eTest, ForcedPinIsAudited) {
  Decide("llama", 0, 0);
  CtlResult r = Ctl({"pin", "llama", "--mode=tp", "--for=10m"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, Not(HasSubstr("forced")));
  r = Ctl({"gates", "history", "--job_id=llama", "--limit=1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("PinMode +tp_only until [^\n]*\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("force")));
  EXPECT_THAT(r.out, Not(HasSubstr("->")));

  r = Ctl({"pin", "llama", "--mode=tp", "--for=20m", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(", forced past the memory gate\n"));
  r = Ctl({"gates", "history", "--job_id=llama", "--limit=1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("PinMode +tp_only until [^ ]+ -> tp_only until [^ ]+ \\(force\\)"));

  r = Ctl({"--output=json", "gates", "history", "--job_id=llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto history = ParseJson<v1::ListConfigHistoryResponse>(r.out);
  ASSERT_EQ(history.entries_size(), 2);
  EXPECT_TRUE(history.entries(0).force());
  ASSERT_TRUE(history.entries(0).has_replaced_pin());
  EXPECT_EQ(history.entries(0).replaced_pin().mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_FALSE(history.entries(0).replaced_pin().force());
  EXPECT_FALSE(history.entries(1).force());
  EXPECT_FALSE(history.entries(1).has_replaced_pin());
  const std::string log = ReadAll(dir_ / "state" / "audit.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2) << log;
  EXPECT_THAT(log.substr(0, log.find('\n')), Not(HasSubstr("\"force\":true")));
  EXPECT_THAT(log.substr(log.find('\n')), HasSubstr("\"force\":true"));

  // --force is refused where it means nothing, before anything is sent.
  r = Ctl({"pin", "llama", "--mode=sp", "--for=10m", "--force"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--force applies only to --mode=tp"));
  r = Ctl({"unpin", "llama", "--force"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("unpin removes pins and has no --force"));

  r = Ctl({"unpin", "llama"});
  ASSERT_EQ(r.exit_code, 0) << r;
  r = Ctl({"gates", "history", "--job_id=llama", "--limit=1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ContainsRegex("Unpin +removed 1: tp_only until [^ ]+ \\(force\\)"));
}

// mTLS: the daemon requires a client certificate signed by the test CA.
TEST_F(SpgatectlE2eTest, MutualTls) {
  // `make deps` installs the openssl CLI; without it this test cannot make its CA, and
  // that is a failure of the set-up, not a reason to pass.
  const std::string d = dir_.string();
  // client.pem: CN=operator; viewer.pem: CN=viewer, a second identity.
  const absl::Status certs = testing::MakeTestCertificates(d, "operator", {"viewer"});
  ASSERT_TRUE(certs.ok()) << certs;

  server::DaemonOptions opts = Options();
  opts.tls_cert = d + "/server.pem";
  opts.tls_key = d + "/server.key";
  opts.tls_client_ca = d + "/ca.pem";
  StartDaemon(opts);

  const std::string ca = "--tls_ca=" + d + "/ca.pem";
  CtlResult r = Ctl({"gates", "get", ca, "--tls_cert=" + d + "/client.pem",
                     "--tls_key=" + d + "/client.key", "--tls_server_name=localhost"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("scope    global"));

  r = Ctl({"gates", "get", ca, "--tls_server_name=localhost"});  // no client certificate
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates get: UNAVAILABLE: "));

  r = Ctl({"gates", "get"});  // plaintext against a TLS port
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates get: UNAVAILABLE: "));

  // Certificates mapped to roles: CN=operator is an admin, CN=viewer a reader.
  std::ofstream(dir_ / "subjects") << "admin cn:operator\nreader cn:viewer\n";
  opts.admin_subjects_file = d + "/subjects";
  StartDaemon(opts);
  const std::vector<std::string> viewer = {ca, "--tls_cert=" + d + "/viewer.pem",
                                           "--tls_key=" + d + "/viewer.key",
                                           "--tls_server_name=localhost"};
  const std::vector<std::string> operator_cert = {ca, "--tls_cert=" + d + "/client.pem",
                                                  "--tls_key=" + d + "/client.key",
                                                  "--tls_server_name=localhost"};
  auto with = [](std::vector<std::string> args, const std::vector<std::string>& creds) {
    args.insert(args.end(), creds.begin(), creds.end());
    return args;
  };
  r = Ctl(with({"gates", "get"}, viewer));
  EXPECT_EQ(r.exit_code, 0) << r;
  r = Ctl(with({"gates", "set", "--max_length_cv=0.3"}, viewer));
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("spgatectl: gates set: PERMISSION_DENIED: cn:viewer has the reader"));
  r = Ctl(with({"gates", "set", "--max_length_cv=0.3"}, operator_cert));
  EXPECT_EQ(r.exit_code, 0) << r;
  r = Ctl(with({"--output=json", "gates", "history", "--limit=1"}, viewer));
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ParseJson<v1::ListConfigHistoryResponse>(r.out).entries(0).principal(), "cn:operator");
}

// The TLS flags go through the clients' one rule (worker/client/tls.h): a bad one is a
// usage error naming the flag, before anything is dialled.
TEST_F(SpgatectlE2eTest, BadTlsFlagsAreUsageErrors) {
  const std::string empty = (dir_ / "empty.pem").string();
  std::ofstream{empty};
  CtlResult r = Ctl({"gates", "get", "--tls_ca=" + empty});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--tls_ca: \"" + empty + "\" is empty"));
  r = Ctl({"gates", "get", "--tls_ca=" + (dir_ / "missing.pem").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--tls_ca: cannot read"));
  r = Ctl({"gates", "get", "--tls_server_name=localhost"});  // no TLS to check it in
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--tls_server_name needs TLS"));
}

}  // namespace
}  // namespace spgate
