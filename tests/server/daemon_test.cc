// The daemon end to end: a real spgated (Daemon::Start on 127.0.0.1:0) and real stubs
// on both ports — register, Connect, plans, decisions, config pushes, admin calls,
// auth, metrics on a live scrape, restart and graceful shutdown.
#include "server/daemon.h"

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "server/metrics.h"
#include "server/persistence.h"
#include "proto/grpc_status.h"
#include "spgate/v1/admin.grpc.pb.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "tests/server/test_util.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::chrono::system_clock::time_point Deadline(int ms = 5000) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}


class DaemonTest : public ::testing::Test {
 protected:
  void Start(DaemonOptions opts = {}) {
    leaders_.clear();  // sessions die with the daemon
    auto d = Daemon::Start(std::move(opts));
    ASSERT_THAT(d.status(), IsOk());
    daemon_ = std::move(*d);
    worker_ = v1::GateService::NewStub(
        grpc::CreateChannel(daemon_->worker_address(), grpc::InsecureChannelCredentials()));
    admin_ = v1::AdminService::NewStub(
        grpc::CreateChannel(daemon_->admin_address(), grpc::InsecureChannelCredentials()));
  }

  v1::RegisterResponse Register(const std::string& job, int group, int rank, int size,
                                const std::string& incarnation = "launch-1") {
    v1::RegisterRequest r;
    r.set_job_id(job);
    r.set_incarnation(incarnation);
    r.set_launch_credential("test-launch-credential-0001");
    r.set_group(group);
    r.set_rank_in_group(rank);
    r.set_group_size(size);
    r.set_global_rank(group * size + rank);
    r.set_host("localhost");
    r.set_memory_budget_bytes(80ull << 30);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    EXPECT_TRUE(worker_->Register(&ctx, r, &resp).ok());
    if (rank == 0) leaders_[{job, group}] = resp.session_id();
    return resp;
  }

  static v1::BatchPlan Plan(const std::string& job, int group, int64_t step,
                            std::vector<int64_t> lengths) {
    v1::BatchPlan p;
    p.set_job_id(job);
    p.set_group(group);
    p.set_step(step);
    for (int64_t l : lengths) p.add_lengths(l);
    return p;
  }

  // As the group's leader (registering a one-rank group first when the test did not).
  absl::StatusOr<v1::Decision> Decide(const v1::BatchPlan& plan) {
    if (!leaders_.contains({plan.job_id(), plan.group()})) Register(plan.job_id(), plan.group(), 0, 1);
    v1::DecideRequest req;
    *req.mutable_plan() = plan;
    req.set_session_id(leaders_[{plan.job_id(), plan.group()}]);
    v1::Decision d;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = worker_->Decide(&ctx, req, &d);
    if (!s.ok()) return FromGrpcStatus(s);
    return d;
  }

  absl::StatusOr<v1::VersionedGateConfig> Update(const v1::UpdateGateConfigRequest& r,
                                                 const std::string& token = "") {
    v1::VersionedGateConfig out;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::Status s = admin_->UpdateGateConfig(&ctx, r, &out);
    if (!s.ok()) return FromGrpcStatus(s);
    return out;
  }

  absl::Status Rollback(int64_t to_version) {
    v1::RollbackGateConfigRequest r;
    r.set_to_version(to_version);
    v1::VersionedGateConfig out;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return FromGrpcStatus(admin_->RollbackGateConfig(&ctx, r, &out));
  }

  // spgate_config_updates_total{result=`result`} as the daemon exports it now.
  double ConfigUpdates(const std::string& result) {
    return ::spgate::testing::MetricValue(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()),
                                          "spgate_config_updates_total",
                                          {"result=\"" + result + "\""});
  }

  std::map<std::pair<std::string, int>, std::string> leaders_;  // (job, group) -> session
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::GateService::Stub> worker_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(DaemonTest, RegisterConnectPlanDecision) {
  Start();
  v1::RegisterResponse reg = Register("job1", 0, 0, 2);
  ASSERT_FALSE(reg.session_id().empty());
  EXPECT_DOUBLE_EQ(reg.config().config().max_length_cv(), 0.18);
  EXPECT_EQ(reg.last_decided_step(), -1);

  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10000));
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage hello;
  hello.set_session_id(reg.session_id());
  *hello.add_plans() = Plan("job1", 0, 0, {1024, 1024, 1000});
  *hello.add_plans() = Plan("job1", 0, 1, {100, 4000});
  ASSERT_TRUE(stream->Write(hello));
  v1::DaemonMessage in;
  std::vector<v1::Decision> got;
  while (got.size() < 2 && stream->Read(&in)) {
    for (const auto& d : in.decisions()) got.push_back(d);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].step(), 0);
  EXPECT_EQ(got[0].mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(got[0].reason(), v1::GATES_PASSED);
  EXPECT_EQ(got[1].mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(got[1].reason(), v1::LENGTH_CV);

  // A bad plan on the stream is rejected by name; the stream stays up.
  v1::WorkerMessage bad;
  *bad.add_plans() = Plan("job1", 0, 2, {});
  bad.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_EQ(in.rejections_size(), 1);
  EXPECT_EQ(in.rejections(0).code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(in.rejections(0).message(), HasSubstr("lengths"));
  EXPECT_TRUE(in.has_ack());

  // The same plan through the unary path: the identical decision; another plan for the
  // decided step is refused (it was not decided for that plan).
  auto again = Decide(Plan("job1", 0, 1, {100, 4000}));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->SerializeAsString(), got[1].SerializeAsString());
  EXPECT_THAT(Decide(Plan("job1", 0, 1, {512})).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("different plan")));

  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DaemonTest, TelemetryIsAcknowledgedAndUnknownSessionsRefused) {
  Start();
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage msg;
  msg.set_session_id(reg.session_id());
  // Telemetry is taken for decided steps only (docs/design.md §10): decide steps 0-4
  // first. A message's records are taken before its plans (a client sends a step's record
  // with the next plan), so steps decided in the same message would be too early.
  for (int s = 0; s < 5; ++s) *msg.add_plans() = Plan("job1", 0, s, {512});
  ASSERT_TRUE(stream->Write(msg));
  v1::DaemonMessage decided;
  ASSERT_TRUE(stream->Read(&decided));
  EXPECT_EQ(decided.decisions_size(), 5);
  msg.clear_session_id();
  msg.clear_plans();
  *msg.add_plans() = Plan("job1", 0, 5, {512});  // decided after this message's records
  for (int s = 0; s < 6; ++s) {
    auto* t = msg.add_telemetry();
    t->set_job_id("job1");
    t->set_step(s);
    t->set_mode(v1::SEQUENCE_PARALLEL);
    t->set_step_time_s(0.5);
    t->set_rs_wait_s(0.05);
    t->set_effective_tokens(512);  // at most the plan's {512}
  }
  msg.mutable_heartbeat()->set_telemetry_sent(6);
  ASSERT_TRUE(stream->Write(msg));
  v1::DaemonMessage in;
  ASSERT_TRUE(stream->Read(&in));
  EXPECT_EQ(in.decisions_size(), 1);
  // Step 5 was not decided when its record came: acknowledged as received, not taken (the
  // refusal counts).
  EXPECT_EQ(in.ack().telemetry_received(), 6);
  EXPECT_EQ(testing::MetricValue(testing::ScrapeMetrics(daemon_->metrics_port()),
                                 "spgate_worker_refusals_total", {"reason=\"undecided_step\""}),
            1);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  grpc::ClientContext ctx2;
  ctx2.set_deadline(Deadline());
  auto s2 = worker_->Connect(&ctx2);
  v1::WorkerMessage hello;
  hello.set_session_id("not-a-session");
  s2->Write(hello);
  while (s2->Read(&in)) {
  }
  grpc::Status st = s2->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), HasSubstr("session_id"));
}

// A record that would poison the learned table (docs/design.md §2, "Range rules"), sent
// on a live stream: the largest int64 of tokens over the smallest positive double, and
// 1e15 tokens over 1 s, more than the step's plan held. Both are refused (counted as
// rejected; the second, judged against the step's plan, is acknowledged as received), and
// the job's learned table has no NaN or infinite cell and is the same as before them.
TEST_F(DaemonTest, TelemetryThatWouldPoisonTheLearnedTableIsRefused) {
  Start();
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage msg;
  msg.set_session_id(reg.session_id());
  for (int s = 0; s < 3; ++s) *msg.add_plans() = Plan("job1", 0, s, {512, 512});
  ASSERT_TRUE(stream->Write(msg));
  v1::DaemonMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_EQ(in.decisions_size(), 3);
  auto record = [](int64_t step, double seconds, int64_t tokens) {
    v1::StepTelemetry t;
    t.set_job_id("job1");
    t.set_step(step);
    t.set_mode(v1::SEQUENCE_PARALLEL);
    t.set_step_time_s(seconds);
    t.set_effective_tokens(tokens);
    return t;
  };
  auto learned = [&] {
    v1::GetJobRequest req;
    req.set_job_id("job1");
    v1::Job job;
    grpc::ClientContext c;
    c.set_deadline(Deadline());
    EXPECT_TRUE(admin_->GetJob(&c, req, &job).ok());
    return job.learned();
  };
  v1::WorkerMessage good;
  *good.add_telemetry() = record(0, 0.5, 1024);
  good.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(good));
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_EQ(in.ack().telemetry_received(), 1);
  const v1::LearnedTable before = learned();
  ASSERT_GT(before.cells_size(), 0);

  v1::WorkerMessage poison;
  *poison.add_telemetry() = record(1, 5e-324, std::numeric_limits<int64_t>::max());
  *poison.add_telemetry() = record(2, 1.0, 1'000'000'000'000'000);
  poison.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(poison));
  ASSERT_TRUE(stream->Read(&in));
  EXPECT_EQ(in.ack().telemetry_received(), 2) << "the plan-bound refusal is received";
  const std::string text = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  EXPECT_EQ(::spgate::testing::MetricValue(text, "spgate_telemetry_records_total",
                                           {"result=\"rejected\""}),
            2);
  const v1::LearnedTable after = learned();
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  for (const v1::LearnedCell& cell : after.cells()) {
    EXPECT_TRUE(std::isfinite(cell.tokens() / cell.seconds())) << cell.ShortDebugString();
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DaemonTest, ConfigUpdatesArePushedWithEffectiveFromStep) {
  Start();
  v1::RegisterResponse reg = Register("job1", 3, 0, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10000));
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage hello;
  hello.set_session_id(reg.session_id());
  *hello.add_plans() = Plan("job1", 3, 7, {64});
  ASSERT_TRUE(stream->Write(hello));
  v1::DaemonMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_EQ(in.decisions_size(), 1);

  v1::UpdateGateConfigRequest up;
  up.set_job_id("job1");
  up.mutable_config()->set_max_length_cv(0.5);
  up.mutable_update_mask()->add_paths("max_length_cv");
  auto updated = Update(up);
  ASSERT_THAT(updated.status(), IsOk());
  bool pushed = false;
  while (!pushed && stream->Read(&in)) {
    if (in.has_config_update()) {
      pushed = true;
      EXPECT_EQ(in.config_update().effective_from_step(), 9);
      EXPECT_DOUBLE_EQ(in.config_update().config().config().max_length_cv(), 0.5);
      EXPECT_EQ(in.config_update().config().effective_version(), updated->effective_version());
    }
  }
  EXPECT_TRUE(pushed);
  ctx.TryCancel();
  stream->Finish();
}

// A unary Decide without a plan is INVALID_ARGUMENT saying so (it once read "job_id/group
// (, 0) do not match the session's").
TEST_F(DaemonTest, DecideWithoutAPlanSaysThePlanIsRequired) {
  Start();
  const v1::RegisterResponse leader = Register("job1", 0, 0, 1);
  v1::DecideRequest req;
  req.set_session_id(leader.session_id());
  v1::Decision d;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  EXPECT_THAT(FromGrpcStatus(worker_->Decide(&ctx, req, &d)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan: required")));
}

// One unauthenticated call used to take a group out of the daemon's hands: a unary
// Decide for the group with step 10^15 made the daemon refuse every later plan. Now a
// plan needs the leader's session, and a plan too far ahead is refused without changing
// anything: the group keeps getting the daemon's decisions.
TEST_F(DaemonTest, ForeignOrFarFuturePlansCannotTakeAGroupAway) {
  Start();
  Register("job1", 0, 0, 2);
  const v1::RegisterResponse follower = Register("job1", 0, 1, 2);
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_THAT(Decide(Plan("job1", 0, step, {4096})).status(), IsOk());
  }
  const int64_t far = 1'000'000'000'000'000;
  auto unary = [&](const std::string& session, int64_t step) {
    v1::DecideRequest req;
    *req.mutable_plan() = Plan("job1", 0, step, {4096});
    req.set_session_id(session);
    v1::Decision d;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return FromGrpcStatus(worker_->Decide(&ctx, req, &d));
  };
  EXPECT_THAT(unary("", far), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(unary("0000000000000000ffffffffffffffff", far),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(unary(follower.session_id(), far),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("leader")));
  EXPECT_THAT(Decide(Plan("job1", 0, far, {4096})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_plan_lead_steps")));
  // A plan for a job the session does not belong to creates nothing.
  EXPECT_THAT(unary(follower.session_id(), 0), StatusIs(absl::StatusCode::kPermissionDenied));
  auto next = Decide(Plan("job1", 0, 5, {4096}));
  ASSERT_THAT(next.status(), IsOk()) << "the group must still be the daemon's";
  EXPECT_EQ(next->step(), 5);
  const std::string text = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"not_leader\"} 2"));
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"step_too_far\"} 1"));
  EXPECT_THAT(text, HasSubstr("spgate_worker_refusals_total{reason=\"unknown_session\"} 1"));
}

TEST_F(DaemonTest, WorkerTokenGuardsEveryWorkerCall) {
  const std::string dir = TempDir("daemon_test");
  std::ofstream(dir + "/worker-token") << "s3cret\n";
  DaemonOptions opts;
  opts.worker_token_file = dir + "/worker-token";
  Start(opts);
  v1::RegisterRequest r;
  r.set_job_id("tenant");
  r.set_incarnation("launch-1");
  r.set_launch_credential("test-launch-credential-0001");
  r.set_group_size(1);
  auto call = [&](const std::string& token) {
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    return FromGrpcStatus(worker_->Register(&ctx, r, &resp));
  };
  EXPECT_THAT(call(""), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("worker token")));
  EXPECT_THAT(call("guess"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(call("s3cret"), IsOk());
  // The stream too: refused before it starts.
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = worker_->Connect(&ctx);
  v1::DaemonMessage in;
  EXPECT_FALSE(stream->Read(&in));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Each refusal counted (a job sent to local decisions by its credential showed nowhere).
  EXPECT_EQ(testing::MetricValue(testing::ScrapeMetrics(daemon_->metrics_port()),
                                 "spgate_worker_refusals_total", {"reason=\"worker_credential\""}),
            3);
}

TEST_F(DaemonTest, AdminErrorsUseTheRightCodes) {
  Start();
  // Invalid fields name the field.
  v1::UpdateGateConfigRequest bad;
  bad.mutable_config()->set_max_rs_wait_share(1.5);
  bad.mutable_update_mask()->add_paths("max_rs_wait_share");
  EXPECT_THAT(Update(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_rs_wait_share")));
  // Version conflict.
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.3);
  up.set_expected_version(12345);
  EXPECT_THAT(Update(up).status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("12345")));
  // Unknown job.
  v1::GetJobRequest gj;
  gj.set_job_id("nobody");
  v1::Job job;
  grpc::ClientContext ctx;
  grpc::Status s = admin_->GetJob(&ctx, gj, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("nobody"));
  // Unary Decide validates too.
  EXPECT_THAT(Decide(Plan("job1", 0, 0, {-5})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths[0]")));
}

TEST_F(DaemonTest, MutatingAdminCallsNeedTheToken) {
  const std::string dir = TempDir("daemon_test");
  std::ofstream(dir + "/token") << "s3cret\n";
  DaemonOptions opts;
  opts.admin_token_file = dir + "/token";
  Start(opts);
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.3);
  EXPECT_THAT(Update(up).status(), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(Update(up, "wrong").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Update(up, "s3cret").status(), IsOk());
  // With a credential configured, reads need one too (a reader's or an admin's).
  v1::GetGateConfigRequest get;
  v1::VersionedGateConfig cfg;
  grpc::ClientContext anonymous;
  EXPECT_EQ(admin_->GetGateConfig(&anonymous, get, &cfg).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer s3cret");
  EXPECT_TRUE(admin_->GetGateConfig(&ctx, get, &cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.config().max_length_cv(), 0.3);
}

// Every admin RPC on a real server, called with no credential, a wrong token, the
// reader's token and the admin's: reads are open to both roles, mutations to the admin
// only; denied config updates are counted; the audit log names the principal and never
// holds a secret.
TEST_F(DaemonTest, AdminRolesOnEveryRpc) {
  const std::string dir = TempDir("daemon_test");
  std::ofstream(dir + "/admin-tokens") << "alice:admin-secret\n";
  std::ofstream(dir + "/reader-tokens") << "ci:reader-secret\n";
  DaemonOptions opts;
  opts.state_dir = dir + "/state";
  opts.admin_token_file = dir + "/admin-tokens";
  opts.reader_token_file = dir + "/reader-tokens";
  Start(opts);
  Register("job1", 0, 0, 1);  // PinMode and Unpin need a known job

  using Call = std::function<grpc::Status(grpc::ClientContext*)>;
  int64_t admin_version = 0;
  auto unary = [&](auto method, auto request, auto response) -> Call {
    return [this, method, request, response](grpc::ClientContext* ctx) mutable {
      return ((*admin_).*method)(ctx, request, &response);
    };
  };
  v1::GetJobRequest get_job;
  get_job.set_job_id("job1");
  v1::EvaluateGatesRequest eval;
  eval.add_lengths(100);
  v1::UpdateGateConfigRequest update;
  update.mutable_config()->set_max_length_cv(0.3);
  update.mutable_update_mask()->add_paths("max_length_cv");
  v1::PinModeRequest pin;
  pin.set_job_id("job1");
  pin.set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin.mutable_duration()->set_seconds(60);
  v1::UnpinRequest unpin;
  unpin.set_job_id("job1");
  struct Rpc {
    std::string name;
    bool mutation;
    Call call;
  };
  const std::vector<Rpc> rpcs = {
      {"GetGateConfig", false,
       unary(&v1::AdminService::Stub::GetGateConfig, v1::GetGateConfigRequest(),
             v1::VersionedGateConfig())},
      {"ListJobs", false,
       unary(&v1::AdminService::Stub::ListJobs, v1::ListJobsRequest(), v1::ListJobsResponse())},
      {"GetJob", false, unary(&v1::AdminService::Stub::GetJob, get_job, v1::Job())},
      {"EvaluateGates", false,
       unary(&v1::AdminService::Stub::EvaluateGates, eval, v1::EvaluateGatesResponse())},
      {"ListConfigHistory", false,
       unary(&v1::AdminService::Stub::ListConfigHistory, v1::ListConfigHistoryRequest(),
             v1::ListConfigHistoryResponse())},
      {"WatchDecisions", false,
       [this](grpc::ClientContext* ctx) {
         // An admitted watch stays open until its deadline.
         ctx->set_deadline(Deadline(300));
         auto reader = admin_->WatchDecisions(ctx, v1::WatchDecisionsRequest());
         v1::Decision d;
         while (reader->Read(&d)) {
         }
         grpc::Status s = reader->Finish();
         return s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? grpc::Status::OK : s;
       }},
      {"UpdateGateConfig", true,
       [&](grpc::ClientContext* ctx) {
         v1::VersionedGateConfig out;
         grpc::Status s = admin_->UpdateGateConfig(ctx, update, &out);
         if (s.ok()) admin_version = out.version();
         return s;
       }},
      {"PinMode", true, unary(&v1::AdminService::Stub::PinMode, pin, v1::Pin())},
      {"Unpin", true, unary(&v1::AdminService::Stub::Unpin, unpin, v1::UnpinResponse())},
      {"RollbackGateConfig", true,
       [&](grpc::ClientContext* ctx) {
         v1::RollbackGateConfigRequest rb;
         rb.set_to_version(admin_version);
         v1::VersionedGateConfig out;
         return admin_->RollbackGateConfig(ctx, rb, &out);
       }},
      {"ForgetJob", true,
       [&](grpc::ClientContext* ctx) {
         v1::ForgetJobRequest forget;
         forget.set_job_id("job1");
         v1::ForgetJobResponse out;
         return admin_->ForgetJob(ctx, forget, &out);
       }},
  };
  struct Caller {
    std::string name, token;
    grpc::StatusCode read, mutation;
  };
  const std::vector<Caller> callers = {
      {"none", "", grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::UNAUTHENTICATED},
      {"wrong", "nope", grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::PERMISSION_DENIED},
      {"reader", "reader-secret", grpc::StatusCode::OK, grpc::StatusCode::PERMISSION_DENIED},
      {"admin", "admin-secret", grpc::StatusCode::OK, grpc::StatusCode::OK},
  };
  for (const Rpc& rpc : rpcs) {
    for (const Caller& caller : callers) {
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline());
      if (!caller.token.empty()) ctx.AddMetadata("authorization", "Bearer " + caller.token);
      const grpc::Status s = rpc.call(&ctx);
      EXPECT_EQ(s.error_code(), rpc.mutation ? caller.mutation : caller.read)
          << rpc.name << " as " << caller.name << ": " << s.error_message();
    }
  }
  const std::string metrics = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  EXPECT_EQ(::spgate::testing::MetricValue(metrics, "spgate_config_updates_total",
                                           {"result=\"denied\""}),
            6);  // UpdateGateConfig and RollbackGateConfig, three refused callers each
  // Every refused admin call, by why: 11 calls without a credential; 11 with a wrong
  // token and the reader's 5 mutations denied.
  EXPECT_EQ(::spgate::testing::MetricValue(metrics, "spgate_admin_refusals_total",
                                           {"reason=\"unauthenticated\""}),
            11);
  EXPECT_EQ(::spgate::testing::MetricValue(metrics, "spgate_admin_refusals_total",
                                           {"reason=\"denied\""}),
            16);
  std::ifstream in(opts.state_dir + "/audit.log");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string audit = ss.str();
  EXPECT_THAT(audit, HasSubstr("\"principal\":\"alice\""));
  EXPECT_THAT(audit, ::testing::Not(HasSubstr("secret")));
  EXPECT_EQ(std::count(audit.begin(), audit.end(), '\n'), 5);
  EXPECT_THAT(audit, HasSubstr("\"rpc\":\"ForgetJob\""));
}

TEST_F(DaemonTest, BadCredentialFilesStopStartup) {
  const std::string dir = TempDir("daemon_test");
  std::ofstream(dir + "/empty") << "\n";
  DaemonOptions opts;
  opts.reader_token_file = dir + "/empty";
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--reader_token_file")));
  std::ofstream(dir + "/subjects") << "admin CN=ops\n";
  opts.reader_token_file.clear();
  opts.admin_subjects_file = dir + "/subjects";
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls_client_ca")));
}

TEST_F(DaemonTest, ConfigSurvivesRestart) {
  const std::string dir = TempDir("daemon_test");
  DaemonOptions opts;
  opts.state_dir = dir;
  Start(opts);
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.33);
  up.mutable_update_mask()->add_paths("max_length_cv");
  auto set = Update(up);
  ASSERT_THAT(set.status(), IsOk());
  // A job pinned: its settings come back with it.
  v1::PinModeRequest pin;
  pin.set_job_id("kept");
  pin.set_mode(v1::SEQUENCE_PARALLEL);
  pin.mutable_duration()->set_seconds(600);
  {
    v1::Pin out;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->PinMode(&ctx, pin, &out).ok());
  }
  daemon_->Shutdown(absl::Seconds(1));
  daemon_.reset();
  // The restart says what it read back (it logged only "serving").
  ::testing::internal::CaptureStderr();
  Start(opts);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr(absl::StrCat("restored from ", dir, ": global config version: ",
                                     set->version(), ", jobs with settings: 1, launches: 0, "
                                     "learned tables: 0")));
  v1::VersionedGateConfig cfg;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin_->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.config().max_length_cv(), 0.33);
  EXPECT_EQ(cfg.version(), set->version());
}

TEST_F(DaemonTest, CorruptStateFileStopsStartupNamingTheFile) {
  const std::string dir = TempDir("daemon_test");
  std::ofstream(StateFilePath(dir)) << "this is { not text format";
  DaemonOptions opts;
  opts.state_dir = dir;
  auto d = Daemon::Start(opts);
  EXPECT_THAT(d.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(StateFilePath(dir))));
}

// A directory this process cannot write: a mode-0555 one, or /proc for root, whom modes
// do not stop (the probe's create fails there for everyone).
std::string UnwritableDir() {
  if (::geteuid() == 0) return "/proc";
  const std::string dir = TempDir("daemon_test");
  std::filesystem::permissions(dir, std::filesystem::perms(0555));
  return dir;
}

TEST_F(DaemonTest, UnwritableStateDirStopsStartupUnlessAllowed) {
  DaemonOptions opts;
  opts.state_dir = UnwritableDir();
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--state_dir " + opts.state_dir + " is not writable"),
                             HasSubstr("--allow_read_only_state_dir"))));
  // Allowed on purpose: it serves and says so, and a change is refused before any write
  // (no audit line appended and cut back), which is no persist failure: the alert on
  // those stays quiet for a daemon read-only by design.
  opts.allow_read_only_state_dir = true;
  ::testing::internal::CaptureStderr();
  Start(opts);
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.33);
  up.mutable_update_mask()->add_paths("max_length_cv");
  EXPECT_THAT(Update(up).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("read-only")));
  // Counted by its outcome, as every config update is.
  EXPECT_EQ(ConfigUpdates("unavailable"), 1);
  EXPECT_THAT(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()),
              HasSubstr("\nspgate_state_persist_failures_total 0\n"));
  // Its stop writes nothing (no error line).
  daemon_.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("serving it read-only"));
  EXPECT_THAT(log, Not(HasSubstr("could not persist")));
  EXPECT_THAT(log, Not(HasSubstr("could not write")));
  // A writable directory passes the probe and keeps no trace of it.
  const std::string dir = TempDir("daemon_test");
  opts = {};
  opts.state_dir = dir;
  Start(opts);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr("probe")));
  }
}

// A rollback the daemon cannot make is an invalid config update, as a value out of range
// is: every outcome of UpdateGateConfig and RollbackGateConfig is counted.
TEST_F(DaemonTest, RefusedRollbacksCountAsInvalidConfigUpdates) {
  Start();  // no --state_dir: no audit log to roll back from
  EXPECT_THAT(Rollback(3),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without --state_dir")));
  EXPECT_EQ(ConfigUpdates("invalid"), 1);
  daemon_.reset();
  DaemonOptions opts;
  opts.state_dir = TempDir("daemon_test");
  Start(opts);
  EXPECT_THAT(Rollback(3), StatusIs(absl::StatusCode::kNotFound, HasSubstr("version 3")));
  EXPECT_EQ(ConfigUpdates("invalid"), 1);
}

// A second daemon on a port a first one serves is refused with the reason (gRPC would
// otherwise share the port with SO_REUSEPORT, and the kernel split the workers between
// two daemons with two states).
TEST_F(DaemonTest, ASecondDaemonOnAPortInUseIsRefused) {
  auto first = Daemon::Start(DaemonOptions{});
  ASSERT_THAT(first.status(), IsOk());
  for (const bool admin : {false, true}) {
    DaemonOptions opts;
    const std::string taken =
        absl::StrCat("127.0.0.1:", admin ? (*first)->admin_port() : (*first)->worker_port());
    (admin ? opts.admin_listen : opts.listen) = taken;
    EXPECT_THAT(Daemon::Start(opts).status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr(absl::StrCat(admin ? "--admin_listen=" : "--listen=", taken,
                                                ": cannot listen there: Address already in use"))));
  }
}

TEST_F(DaemonTest, AStateDirThatIsAFileIsRefusedNamingTheFlag) {
  const std::string file = TempDir("daemon_test") + "/a-file";
  std::ofstream(file) << "not a directory\n";
  DaemonOptions opts;
  opts.state_dir = file;
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--state_dir " + file + " is not a directory")));
}

TEST_F(DaemonTest, InvalidConfigFileStopsStartupAndBadReloadKeepsRunningConfig) {
  const std::string dir = TempDir("daemon_test");
  const std::string path = dir + "/gates.textproto";
  std::ofstream(path) << "max_length_cv: 12\n";
  DaemonOptions opts;
  opts.config_path = path;
  opts.config_poll_interval = absl::ZeroDuration();  // this test reloads by hand
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_length_cv")));
  std::ofstream(path, std::ios::trunc) << "max_length_cv: 0.25\nwindow_steps: 10\n";
  Start(opts);
  std::ofstream(path, std::ios::trunc) << "max_length_cv: nope\n";
  EXPECT_THAT(daemon_->ReloadConfig(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  EXPECT_THAT(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()),
              HasSubstr("spgate_config_last_reload_successful 0"));
  v1::VersionedGateConfig cfg;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin_->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.config().max_length_cv(), 0.25);
  std::ofstream(path, std::ios::trunc) << "max_length_cv: 0.3\n";
  EXPECT_THAT(daemon_->ReloadConfig(), IsOk());
  EXPECT_THAT(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()),
              HasSubstr("spgate_config_last_reload_successful 1"));
}

double ConfigCv(v1::AdminService::Stub* admin) {
  v1::VersionedGateConfig cfg;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  if (!admin->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &cfg).ok()) return -1;
  return cfg.config().max_length_cv();
}

// Polls `cond` every 20 ms for up to 5 s.
bool Eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 250; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// The kubelet's way of updating a ConfigMap file: a new file under a temporary name,
// renamed over the old one. No SIGHUP: the daemon notices by polling.
TEST_F(DaemonTest, ConfigFileReplacedByRenameIsPickedUpWithoutSignal) {
  const std::string dir = TempDir("daemon_test");
  const std::string path = dir + "/gates.textproto";
  std::ofstream(path) << "max_length_cv: 0.25\n";
  DaemonOptions opts;
  opts.config_path = path;
  opts.config_poll_interval = absl::Milliseconds(50);
  Start(opts);
  ASSERT_DOUBLE_EQ(ConfigCv(admin_.get()), 0.25);
  auto replace = [&](const std::string& text) {
    std::ofstream(dir + "/.gates.tmp") << text;
    std::filesystem::rename(dir + "/.gates.tmp", path);
  };
  replace("max_length_cv: 0.4\n");
  EXPECT_TRUE(Eventually([&] { return ConfigCv(admin_.get()) == 0.4; }));
  // An invalid replacement keeps the running config and sets the reload gauge to 0.
  replace("max_length_cv: nope\n");
  EXPECT_TRUE(Eventually([&] {
    return ::spgate::testing::ScrapeMetrics(daemon_->metrics_port())
               .find("spgate_config_last_reload_successful 0") != std::string::npos;
  }));
  EXPECT_DOUBLE_EQ(ConfigCv(admin_.get()), 0.4);
  replace("max_length_cv: 0.5\n");
  EXPECT_TRUE(Eventually([&] { return ConfigCv(admin_.get()) == 0.5; }));
  EXPECT_THAT(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()),
              HasSubstr("spgate_config_last_reload_successful 1"));
  // The same contents under a new inode is no change: no reload.
  replace("max_length_cv: 0.5\n");
  EXPECT_FALSE(daemon_->PollConfig());
}

// A ConfigMap volume: config -> ..data/gates.textproto, ..data -> ..2024_a (a directory
// symlink). An update makes ..2024_b and swaps ..data atomically with a rename.
TEST_F(DaemonTest, ConfigMapDataSymlinkSwapIsPickedUp) {
  namespace fs = std::filesystem;
  const std::string dir = TempDir("daemon_test");
  fs::create_directory(dir + "/..2024_a");
  std::ofstream(dir + "/..2024_a/gates.textproto") << "max_length_cv: 0.25\n";
  fs::create_directory_symlink("..2024_a", dir + "/..data");
  fs::create_symlink("..data/gates.textproto", dir + "/gates.textproto");
  DaemonOptions opts;
  opts.config_path = dir + "/gates.textproto";
  opts.config_poll_interval = absl::Milliseconds(50);
  Start(opts);
  ASSERT_DOUBLE_EQ(ConfigCv(admin_.get()), 0.25);
  fs::create_directory(dir + "/..2024_b");
  std::ofstream(dir + "/..2024_b/gates.textproto") << "max_length_cv: 0.35\n";
  fs::create_directory_symlink("..2024_b", dir + "/..data_tmp");
  fs::rename(dir + "/..data_tmp", dir + "/..data");
  fs::remove_all(dir + "/..2024_a");
  EXPECT_TRUE(Eventually([&] { return ConfigCv(admin_.get()) == 0.35; }));
}

TEST_F(DaemonTest, WatchDecisionsStreamsDecisionsAsMade) {
  Start();
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::WatchDecisionsRequest req;
  req.set_job_id("watched");
  auto reader = admin_->WatchDecisions(&ctx, req);
  // The watcher registers asynchronously; drive decisions until one arrives.
  std::thread driver([this] {
    for (int s = 0; s < 200; ++s) {
      (void)Decide(Plan("other", 0, s, {64}));
      (void)Decide(Plan("watched", 0, s, {64}));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  v1::Decision d;
  ASSERT_TRUE(reader->Read(&d));
  EXPECT_EQ(d.job_id(), "watched");
  ctx.TryCancel();
  driver.join();
  reader->Finish();
  // A job id no job may have would wait forever: refused at the start.
  grpc::ClientContext bad_ctx;
  bad_ctx.set_deadline(Deadline());
  req.set_job_id("bad/id");
  auto bad = admin_->WatchDecisions(&bad_ctx, req);
  EXPECT_FALSE(bad->Read(&d));
  const grpc::Status st = bad->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("job_id"));
}

TEST_F(DaemonTest, ShutdownEndsStreamsWithUnavailable) {
  Start();
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage hello;
  hello.set_session_id(reg.session_id());
  hello.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(hello));
  v1::DaemonMessage in;
  ASSERT_TRUE(stream->Read(&in));  // attached
  std::thread stopper([this] { daemon_->Shutdown(absl::Seconds(2)); });
  while (stream->Read(&in)) {
  }
  grpc::Status st = stream->Finish();
  stopper.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
}

// civetweb (the /metrics server) looks at its stop flag between two-second polls; the
// daemon's stop ends the poll with a connection instead of waiting it out (every spgated
// stop and restart took ~2 s).
TEST_F(DaemonTest, AStopDoesNotWaitForTheMetricsServersPoll) {
  Start();
  ASSERT_GT(daemon_->metrics_port(), 0);
  EXPECT_THAT(testing::ScrapeMetrics(daemon_->metrics_port()), HasSubstr("spgate_"));
  const absl::Time start = absl::Now();
  daemon_->Shutdown(absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1000));
}

TEST_F(DaemonTest, EveryMetricFamilyIsExportedAndPromtoolIsSilent) {
  Start();
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = worker_->Connect(&ctx);
  v1::WorkerMessage msg;
  msg.set_session_id(reg.session_id());
  *msg.add_plans() = Plan("job1", 0, 0, {1000, 1000});
  auto* t = msg.add_telemetry();
  t->set_job_id("job1");
  t->set_step(0);
  t->set_mode(v1::SEQUENCE_PARALLEL);
  t->set_step_time_s(0.2);
  t->set_rs_wait_s(0.01);
  t->set_all_gather_s(0.02);
  t->set_effective_tokens(2000);
  t->set_peak_memory_bytes(1 << 30);
  auto* local = msg.mutable_heartbeat()->add_local_decisions();
  local->set_reason(v1::GATES_PASSED);
  local->set_count(2);
  msg.mutable_heartbeat()->set_seq(7);
  ASSERT_TRUE(stream->Write(msg));
  v1::DaemonMessage in;
  ASSERT_TRUE(stream->Read(&in));
  EXPECT_EQ(in.ack().heartbeat_seq(), 7) << "the ack names the heartbeat it answers";
  daemon_->Sweep();
  const std::string text = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  for (const char* family :
       {"spgate_decisions_total", "spgate_worker_local_decisions_total",
        "spgate_batch_length_cv", "spgate_rs_wait_share", "spgate_all_gather_tail_seconds",
        "spgate_norm_stall_ratio", "spgate_step_duration_seconds",
        "spgate_effective_tokens_total", "spgate_padding_tokens_total",
        "spgate_peak_memory_bytes", "spgate_memory_budget_bytes", "spgate_current_mode",
        "spgate_mode_switches_total", "spgate_gate_threshold", "spgate_config_version",
        "spgate_config_updates_total", "spgate_workers", "spgate_decision_latency_seconds",
        "spgate_state_persist_failures_total", "spgate_config_last_reload_successful",
        "spgate_build_info", "spgate_limit_refusals_total"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + family + " ")) << family;
  }
  EXPECT_THAT(text, HasSubstr(
      "spgate_decisions_total{job_id=\"job1\",mode=\"sp\",reason=\"gates_passed\"} 1"));
  EXPECT_THAT(text, HasSubstr("spgate_worker_local_decisions_total{job_id=\"job1\",reason=\"gates_passed\"} 2"));
  // Reasons the job's workers never reported exist from registration on, at 0.
  EXPECT_THAT(text, HasSubstr("spgate_worker_local_decisions_total{job_id=\"job1\",reason=\"length_cv\"} 0"));
  EXPECT_THAT(text, HasSubstr("spgate_worker_local_decisions_total{job_id=\"job1\",reason=\"rs_wait\"} 0"));
  EXPECT_THAT(text, Not(HasSubstr(
                        "local_decisions_total{job_id=\"job1\",reason=\"controller_unavailable\"}")))
      << "a local decision carries the local policy's reason";
  EXPECT_THAT(text, HasSubstr("spgate_gate_threshold{gate=\"max_length_cv\",job_id=\"_default\"} 0.18"));
  EXPECT_THAT(text, HasSubstr("spgate_workers{job_id=\"job1\",state=\"active\"} 1"));
  // Step-time buckets ten a decade, neighbours at most 4/3 apart (metrics.md).
  for (const char* le : {"0.1", "0.125", "0.15", "0.2", "12.5", "100"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
        "spgate_step_duration_seconds_bucket{job_id=\"job1\",mode=\"sp\",le=\"", le, "\"}")))
        << le;
  }
  // Every limit's series exists from the start, at 0.
  for (int i = 0; i < kNumLimits; ++i) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("spgate_limit_refusals_total{limit=\"",
                                             std::string(LimitLabel(static_cast<Limit>(i))),
                                             "\"} 0")));
  }
#ifdef PROMTOOL_BIN
  const std::string file = TempDir("daemon_test") + "/scrape.txt";
  std::ofstream(file) << text;
  const std::string cmd = std::string(PROMTOOL_BIN) + " check metrics < " + file + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(out, "") << "promtool check metrics complained";
  EXPECT_EQ(rc, 0);
#else
  ADD_FAILURE() << "promtool was not found when the build was configured: `make deps` "
                   "installs it (Debian's prometheus package); re-run cmake afterwards";
#endif
  ctx.TryCancel();
  stream->Finish();
}

// ---- limits (docs/design.md §10) ----

// --max_concurrent_streams_per_connection is HTTP/2's own limit: a call over it waits
// (the client queues it) rather than failing, on that connection only; a call on another
// connection goes through, and the queued one runs once a slot frees.
TEST_F(DaemonTest, StreamsPerConnectionAreCappedOnThatConnectionOnly) {
  DaemonOptions opts;
  opts.max_concurrent_streams_per_connection = 1;
  Start(opts);
  grpc::ClientContext w;
  w.set_deadline(Deadline(10000));
  auto watch = admin_->WatchDecisions(&w, v1::WatchDecisionsRequest());
  watch->WaitForInitialMetadata();  // holds the connection's one stream
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(500));
    v1::VersionedGateConfig out;
    const grpc::Status s = admin_->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    auto other = v1::AdminService::NewStub(grpc::CreateCustomChannel(
        daemon_->admin_address(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(5000));
    v1::VersionedGateConfig out;
    EXPECT_TRUE(other->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &out).ok());
  }
  w.TryCancel();
  watch->Finish();
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(5000));
  v1::VersionedGateConfig out;
  EXPECT_TRUE(admin_->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &out).ok());
}

// ---- requests that do not parse, calls that never send one (docs/design.md §6) ----

// A raw call: the method's path and the request's bytes as sent, the status back.
grpc::Status RawUnary(const std::string& address, const std::string& method,
                      const std::string& bytes, std::string* details_out = nullptr) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10000));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

TEST_F(DaemonTest, RequestsThatDoNotParseAreInvalidArgumentNamingTheMessage) {
  Start();
  // Bytes that are no protobuf at all, and a RegisterRequest whose job_id (field 1) is
  // not UTF-8 (0xff 0xfe).
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage";
  const std::string bad_utf8("\x0a\x02\xff\xfe", 4);
  struct Case {
    std::string address, method, bytes, message;
  };
  const std::vector<Case> cases = {
      {daemon_->worker_address(), "/spgate.v1.GateService/Register", garbage,
       "spgate.v1.RegisterRequest"},
      {daemon_->worker_address(), "/spgate.v1.GateService/Register", bad_utf8,
       "spgate.v1.RegisterRequest"},
      {daemon_->worker_address(), "/spgate.v1.GateService/Decide", garbage,
       "spgate.v1.DecideRequest"},
      {daemon_->admin_address(), "/spgate.v1.AdminService/UpdateGateConfig", garbage,
       "spgate.v1.UpdateGateConfigRequest"},
      {daemon_->admin_address(), "/spgate.v1.AdminService/GetJob", bad_utf8,
       "spgate.v1.GetJobRequest"},
      {daemon_->admin_address(), "/spgate.v1.AdminService/WatchDecisions", garbage,
       "spgate.v1.WatchDecisionsRequest"},
  };
  for (const Case& c : cases) {
    const grpc::Status s = RawUnary(c.address, c.method, c.bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": "
                                                                 << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message + ": the request does not parse"))
        << c.method;
  }
  // A method the services do not have is still UNIMPLEMENTED.
  EXPECT_EQ(RawUnary(daemon_->worker_address(), "/spgate.v1.GateService/Nope", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // A Connect stream whose message does not parse is ended naming WorkerMessage.
  grpc::GenericStub stub(
      grpc::CreateChannel(daemon_->worker_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(10000));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/spgate.v1.GateService/Connect", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice slice(garbage);
  grpc::ByteBuffer msg(&slice, 1);
  call->Write(msg, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("spgate.v1.WorkerMessage"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// A unary call that sends its headers and never its request is ended after
// --first_message_timeout rather than held until its connection closes.
TEST_F(DaemonTest, AUnaryCallThatNeverSendsItsRequestIsEnded) {
  DaemonOptions opts;
  opts.first_message_timeout = absl::Milliseconds(300);
  Start(opts);
  for (const auto& [address, method] :
       std::vector<std::pair<std::string, std::string>>{
           {daemon_->worker_address(), "/spgate.v1.GateService/Register"},
           {daemon_->admin_address(), "/spgate.v1.AdminService/ListJobs"},
           {daemon_->admin_address(), "/spgate.v1.AdminService/WatchDecisions"}}) {
    grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(20000));
    grpc::CompletionQueue cq;
    const absl::Time opened = absl::Now();
    auto call = stub.PrepareCall(&ctx, method, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(2));  // no request, no half-close
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("--first_message_timeout")) << method;
    EXPECT_LT(absl::Now() - opened, absl::Seconds(5)) << method;
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  // A call that half-closes without a request is told so at once.
  const grpc::Status empty_close = [&] {
    grpc::GenericStub stub(
        grpc::CreateChannel(daemon_->worker_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(10000));
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(&ctx, "/spgate.v1.GateService/Decide", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }();
  EXPECT_EQ(empty_close.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty_close.error_message(), HasSubstr("without its request message"));
}

// A Connect stream that never names its session is ended after --first_message_timeout,
// and its slot under --max_streams comes back; a stream that names it stays.
TEST_F(DaemonTest, ASilentStreamIsEndedAndGivesBackItsSlot) {
  DaemonOptions opts;
  opts.max_streams = 1;
  opts.first_message_timeout = absl::Milliseconds(300);
  Start(opts);
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  grpc::ClientContext silent_ctx;
  silent_ctx.set_deadline(Deadline(10000));
  const absl::Time opened = absl::Now();
  auto silent = worker_->Connect(&silent_ctx);  // admitted: it holds the only slot
  v1::DaemonMessage in;
  EXPECT_FALSE(silent->Read(&in));
  grpc::Status s = silent->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("--first_message_timeout"));
  EXPECT_GE(absl::Now() - opened, absl::Milliseconds(250));
  EXPECT_LT(absl::Now() - opened, absl::Seconds(5));

  // The slot is free again, and a stream that names its session outlives the timeout.
  ASSERT_TRUE(Eventually([&] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(Deadline(10000));
    auto st = worker_->Connect(c.get());
    v1::WorkerMessage hello;
    hello.set_session_id(reg.session_id());
    hello.mutable_heartbeat();
    st->Write(hello);
    if (!st->Read(&in)) {
      st->Finish();
      return false;
    }
    absl::SleepFor(absl::Milliseconds(900));  // three timeouts
    hello.clear_session_id();
    const bool alive = st->Write(hello) && st->Read(&in) && in.has_ack();
    c->TryCancel();
    st->Finish();
    return alive;
  }));
  const std::string metrics = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  EXPECT_EQ(::spgate::testing::MetricValue(metrics, "spgate_limit_refusals_total",
                                           {"limit=\"first_message\""}),
            1);
}

TEST_F(DaemonTest, StreamLimitsRefuseWithResourceExhaustedAndFreeTheirSlot) {
  DaemonOptions opts;
  opts.max_streams = 2;
  opts.max_watch_streams = 1;
  Start(opts);
  v1::RegisterResponse reg = Register("job1", 0, 0, 1);
  auto open_watch = [&](grpc::ClientContext* ctx) {
    ctx->set_deadline(Deadline(10000));
    return admin_->WatchDecisions(ctx, v1::WatchDecisionsRequest());
  };
  grpc::ClientContext w1;
  auto watch1 = open_watch(&w1);
  watch1->WaitForInitialMetadata();  // admitted
  grpc::ClientContext w2;
  auto watch2 = open_watch(&w2);
  v1::Decision d;
  EXPECT_FALSE(watch2->Read(&d));
  grpc::Status s = watch2->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("--max_watch_streams"));

  auto connect = [&](grpc::ClientContext* ctx) {
    ctx->set_deadline(Deadline(10000));
    auto stream = worker_->Connect(ctx);
    v1::WorkerMessage hello;
    hello.set_session_id(reg.session_id());
    hello.mutable_heartbeat();
    stream->Write(hello);
    return stream;
  };
  grpc::ClientContext c1;
  auto stream1 = connect(&c1);
  v1::DaemonMessage in;
  ASSERT_TRUE(stream1->Read(&in));  // the second slot: admitted, acknowledged
  grpc::ClientContext c2;
  auto stream2 = connect(&c2);
  EXPECT_FALSE(stream2->Read(&in));
  s = stream2->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("--max_streams"));

  // A closed stream gives its slot back.
  w1.TryCancel();
  watch1->Finish();
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext c3;
    auto stream3 = connect(&c3);
    const bool ok = stream3->Read(&in);
    c3.TryCancel();
    stream3->Finish();
    return ok;
  }));
  const std::string metrics = ::spgate::testing::ScrapeMetrics(daemon_->metrics_port());
  EXPECT_EQ(::spgate::testing::MetricValue(metrics, "spgate_limit_refusals_total",
                                           {"limit=\"watch_streams\""}),
            1);
  EXPECT_GE(::spgate::testing::MetricValue(metrics, "spgate_limit_refusals_total",
                                           {"limit=\"streams\""}),
            1);
  c1.TryCancel();
  stream1->Finish();
}

TEST_F(DaemonTest, AnOversizedMessageIsResourceExhaustedOnBothPorts) {
  DaemonOptions opts;
  opts.max_receive_message_bytes = 64 << 10;
  Start(opts);
  v1::BatchPlan big = Plan("job1", 0, 0, {});
  for (int i = 0; i < 40000; ++i) big.add_lengths(4096);  // ~120 KiB on the wire
  EXPECT_THAT(Decide(big).status(), StatusIs(absl::StatusCode::kResourceExhausted));
  v1::EvaluateGatesRequest eval;
  *eval.mutable_lengths() = big.lengths();
  v1::EvaluateGatesResponse out;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  EXPECT_EQ(admin_->EvaluateGates(&ctx, eval, &out).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The daemon goes on serving: a normal plan is decided.
  EXPECT_THAT(Decide(Plan("job1", 0, 0, {4096, 4096})).status(), IsOk());
}

}  // namespace
}  // namespace spgate::server
