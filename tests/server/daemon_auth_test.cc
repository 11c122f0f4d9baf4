// spgated's start-up checks and credentials through a real daemon (Daemon::Start on
// loopback): TLS files of the wrong kind and a key that does not match its certificate
// stop start-up naming the flag before any port is bound; the worker API listens on
// loopback unless a worker credential is configured, and refuses a wider --listen
// without one (or warns, with --allow_unauthenticated_workers); worker tokens and worker
// subjects are scoped to job ids on Register; typed admin subjects on real certificates
// tell the review's look-alike CN and borrowed DNS SAN apart (docs/security.md).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "server/daemon.h"
#include "spgate/v1/admin.grpc.pb.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "tests/server/test_util.h"  // TempDir, ReadAll
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kDenied = absl::StatusCode::kPermissionDenied;

std::string Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// A TCP port this test holds (listening, without SO_REUSEPORT), so that a daemon that
// tried to bind it would fail with "cannot listen there". -1 when it cannot be had.
class HeldPort {
 public:
  explicit HeldPort(const char* host = "127.0.0.1", int port = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host, &addr.sin_addr);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 1) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(fd_);
      fd_ = -1;
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = -1;
};

class DaemonAuthTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }

  void MakeCertificates() {
    ASSERT_THAT(::spgate::testing::MakeTestCertificates(
                    dir_, "worker", {},
                    {{"ops", "/O=ml/CN=ops-admin", ""},
                     {"lookalike", "/CN=CN=ops-admin,O=ml", ""},
                     {"evil", "/CN=evil", "DNS:ops-admin,URI:spiffe://cluster/ns/ml/sa/ops"}}),
                IsOk());
  }
  DaemonOptions Tls() const {
    DaemonOptions opts;
    opts.tls_cert = dir_ + "/server.pem";
    opts.tls_key = dir_ + "/server.key";
    opts.tls_client_ca = dir_ + "/ca.pem";
    return opts;
  }
  // A channel to `address`: plaintext for "", else mTLS with dir_/NAME.pem and .key.
  std::shared_ptr<grpc::Channel> Channel(const std::string& address, const std::string& cert) {
    if (cert.empty()) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadAll(dir_ + "/ca.pem");
    ssl.pem_private_key = ReadAll(dir_ + "/" + cert + ".key");
    ssl.pem_cert_chain = ReadAll(dir_ + "/" + cert + ".pem");
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
  }
  // Register of rank 0 of a one-rank group of `job`, as `cert` (mTLS) with `token`.
  absl::Status Register(Daemon& d, const std::string& job, const std::string& token,
                        const std::string& cert = "") {
    v1::RegisterRequest r;
    r.set_job_id(job);
    r.set_incarnation("launch-1");
    r.set_launch_credential("launch-credential-0123456789");
    r.set_group_size(1);
    r.set_host("localhost");
    r.set_memory_budget_bytes(80ull << 30);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::RegisterResponse resp;
    return FromGrpcStatus(
        v1::GateService::NewStub(Channel(d.worker_address(), cert))->Register(&ctx, r, &resp));
  }
  absl::Status AdminCall(Daemon& d, const std::string& cert, bool mutation) {
    auto admin = v1::AdminService::NewStub(Channel(d.admin_address(), cert));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!mutation) {
      v1::VersionedGateConfig cfg;
      return FromGrpcStatus(admin->GetGateConfig(&ctx, v1::GetGateConfigRequest(), &cfg));
    }
    v1::UpdateGateConfigRequest up;
    up.mutable_config()->set_max_length_cv(0.3);
    up.mutable_update_mask()->add_paths("max_length_cv");
    v1::VersionedGateConfig cfg;
    return FromGrpcStatus(admin->UpdateGateConfig(&ctx, up, &cfg));
  }

  std::string dir_;
};

// The review: a key that does not match its certificate was reported as "--listen ...
// cannot listen there". Every port the daemon would bind is held here, so an error
// about a port would mean the check came too late.
TEST_F(DaemonAuthTest, TlsKeyThatDoesNotMatchItsCertificateStopsStartupBeforeAnyBind) {
  MakeCertificates();
  const HeldPort held;
  ASSERT_GT(held.port(), 0);
  const auto with_held_ports = [&](DaemonOptions opts) {
    opts.listen = opts.admin_listen = opts.metrics_listen = held.address();
    return opts;
  };
  DaemonOptions opts = with_held_ports(Tls());
  opts.tls_key = dir_ + "/client.key";  // a valid key, of another certificate
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(kInvalid, HasSubstr("--tls_key: the private key does not match the "
                                           "certificate in --tls_cert")));

  const struct {
    const char* what;
    std::function<void(DaemonOptions&)> set;
    std::string message;
  } wrong_kind[] = {
      {"a key as the certificate", [&](DaemonOptions& o) { o.tls_cert = dir_ + "/server.key"; },
       "--tls_cert: " + dir_ + "/server.key holds no PEM certificate"},
      {"a certificate as the key", [&](DaemonOptions& o) { o.tls_key = dir_ + "/server.pem"; },
       "--tls_key: " + dir_ + "/server.pem holds no PEM private key"},
      {"a key as the client CA", [&](DaemonOptions& o) { o.tls_client_ca = dir_ + "/ca.key"; },
       "--tls_client_ca: " + dir_ + "/ca.key holds no PEM certificate"},
      {"not PEM at all",
       [&](DaemonOptions& o) { o.tls_cert = Write(dir_ + "/junk.pem", "not a certificate\n"); },
       "--tls_cert: " + dir_ + "/junk.pem holds no PEM certificate"},
  };
  for (const auto& c : wrong_kind) {
    DaemonOptions o = with_held_ports(Tls());
    c.set(o);
    EXPECT_THAT(Daemon::Start(o).status(), StatusIs(kInvalid, HasSubstr(c.message))) << c.what;
  }
  // The right files start (on free ports).
  EXPECT_THAT(Daemon::Start(Tls()).status(), IsOk());
}

TEST_F(DaemonAuthTest, AWorkerApiBeyondLoopbackNeedsAWorkerCredential) {
  for (const char* listen : {"0.0.0.0:0", "[::]:0"}) {
    DaemonOptions opts;
    opts.listen = listen;
    EXPECT_THAT(Daemon::Start(opts).status(),
                StatusIs(kInvalid, AllOf(HasSubstr(absl::StrCat("--listen=", listen,
                                                                " is not a loopback address")),
                                         HasSubstr("--worker_token_file or --tls_client_ca"),
                                         HasSubstr("--allow_unauthenticated_workers"))));
  }
  DaemonOptions opts;
  opts.listen = "0.0.0.0:0";
  opts.allow_unauthenticated_workers = true;
  ::testing::internal::CaptureStderr();
  auto allowed = Daemon::Start(opts);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(allowed.status(), IsOk());
  EXPECT_THAT(log, HasSubstr("WARNING: the worker API on 0.0.0.0:0 takes no credential "
                             "(--allow_unauthenticated_workers)"));
  allowed->reset();

  opts.allow_unauthenticated_workers = false;
  opts.worker_token_file = Write(dir_ + "/worker-token", "s3cret\n");
  EXPECT_THAT(Daemon::Start(opts).status(), IsOk());
}

// The admin API likewise: beyond loopback it needs an admin credential. A client CA alone
// is none: it signs the workers' certificates too, so every worker would be an admin.
TEST_F(DaemonAuthTest, AnAdminApiBeyondLoopbackNeedsAnAdminCredential) {
  MakeCertificates();
  DaemonOptions plain;
  plain.admin_listen = "0.0.0.0:0";
  EXPECT_THAT(Daemon::Start(plain).status(),
              StatusIs(kInvalid, AllOf(HasSubstr("--admin_listen=0.0.0.0:0 is not a loopback "
                                                 "address and no admin credential"),
                                       HasSubstr("anyone who can reach it"),
                                       HasSubstr("--allow_unauthenticated_admin"))));
  DaemonOptions tls = Tls();
  tls.admin_listen = "[::]:0";
  EXPECT_THAT(Daemon::Start(tls).status(),
              StatusIs(kInvalid, HasSubstr("every client with a certificate from "
                                           "--tls_client_ca — every worker's too")));
  tls.admin_subjects_file = Write(dir_ + "/admins", "admin cn:ops-admin\n");
  EXPECT_THAT(Daemon::Start(tls).status(), IsOk());
  plain.admin_token_file = Write(dir_ + "/admin-token", "alice:s3cret-0123\n");
  EXPECT_THAT(Daemon::Start(plain).status(), IsOk());

  plain.admin_token_file.clear();
  plain.allow_unauthenticated_admin = true;
  ::testing::internal::CaptureStderr();
  auto allowed = Daemon::Start(plain);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(allowed.status(), IsOk());
  EXPECT_THAT(log, HasSubstr("WARNING: the admin API on 0.0.0.0:0 takes no admin credential "
                             "(--allow_unauthenticated_admin)"));
}

// An empty --listen resolves to port 50061: loopback without a worker credential, every
// interface with one. The port is held here, so the daemon's refusal names the address
// it chose (and nothing is left listening on the fixed port).
TEST_F(DaemonAuthTest, AnEmptyListenIsLoopbackUnlessAWorkerCredentialIsConfigured) {
  const HeldPort held("0.0.0.0", 50061);
  if (held.port() != 50061) GTEST_SKIP() << "port 50061 is in use by another process";
  DaemonOptions opts;
  opts.listen = "";
  ::testing::internal::CaptureStderr();
  const absl::Status loopback = Daemon::Start(opts).status();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(loopback, StatusIs(absl::StatusCode::kUnavailable,
                                 HasSubstr("--listen=127.0.0.1:50061: cannot listen there")));
  EXPECT_THAT(log, HasSubstr("worker API on 127.0.0.1:50061: loopback only, since no worker "
                             "credential is configured"));
  opts.worker_token_file = Write(dir_ + "/worker-token", "s3cret\n");
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("--listen=0.0.0.0:50061: cannot listen there")));
}

TEST_F(DaemonAuthTest, WorkerTokensAreScopedToJobs) {
  DaemonOptions opts;
  opts.worker_token_file =
      Write(dir_ + "/worker-tokens",
            "# tenants\ntenant-a:tok-a-0123 llama-*\ntenant-b:tok-b-4567 gpt-*\n");
  auto d = Daemon::Start(opts);
  ASSERT_THAT(d.status(), IsOk());
  Daemon& daemon = **d;
  EXPECT_THAT(Register(daemon, "llama-7b", "tok-a-0123"), IsOk());
  EXPECT_THAT(Register(daemon, "gpt-2", "tok-b-4567"), IsOk());
  const absl::Status squat = Register(daemon, "gpt-2", "tok-a-0123");
  EXPECT_THAT(squat, StatusIs(kDenied, AllOf(HasSubstr("\"tenant-a\""), HasSubstr("\"gpt-2\""))));
  EXPECT_THAT(squat.message(), AllOf(Not(HasSubstr("tok-")), Not(HasSubstr("llama"))));
  EXPECT_THAT(Register(daemon, "llama-7b", ""),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("worker token")));
  EXPECT_THAT(Register(daemon, "llama-7b", "guess"),
              StatusIs(kDenied, HasSubstr("the worker token does not match")));
  // Every refusal counted, the out-of-scope one included.
  EXPECT_EQ(testing::MetricValue(testing::ScrapeMetrics(daemon.metrics_port()),
                                 "spgate_worker_refusals_total", {"reason=\"worker_credential\""}),
            3);
}

TEST_F(DaemonAuthTest, CredentialFileMistakesStopStartup) {
  DaemonOptions opts;
  opts.worker_subjects_file = Write(dir_ + "/worker-subjects", "cn:trainer llama-*\n");
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(kInvalid, HasSubstr("--worker_subjects_file maps client certificates to "
                                           "job ids and needs --tls_client_ca")));
  opts = {};
  opts.worker_token_file = Write(dir_ + "/worker-tokens", "tenant-a:shared-0123 llama-*\n");
  opts.admin_token_file = Write(dir_ + "/admin-tokens", "alice:shared-0123\n");
  const absl::Status shared = Daemon::Start(opts).status();
  EXPECT_THAT(shared,
              StatusIs(kInvalid, HasSubstr("worker-tokens line 1: the token of tenant-a is "
                                           "also the token of alice in --admin_token_file (")));
  EXPECT_THAT(shared.message(), Not(HasSubstr("shared-0123")));
  opts = {};
  opts.worker_token_file =
      Write(dir_ + "/worker-tokens", "tenant-a:tok llama-*\ntenant-b:tok gpt-*\n");
  EXPECT_THAT(Daemon::Start(opts).status(),
              StatusIs(kInvalid, HasSubstr("line 2: this token is also the token of tenant-a")));
}

// mTLS with real certificates: worker subjects scoped to jobs, typed admin subjects.
TEST_F(DaemonAuthTest, TypedCertificateIdentitiesOnBothPorts) {
  MakeCertificates();
  DaemonOptions opts = Tls();
  opts.worker_subjects_file =
      Write(dir_ + "/worker-subjects",
            "cn:ops-admin llama-*\nuri:spiffe://cluster/ns/ml/sa/ops gpt-*\n");
  opts.admin_subjects_file = Write(dir_ + "/admin-subjects",
                                   "admin subject:CN=ops-admin,O=ml\nreader dns:ops-admin\n");
  auto d = Daemon::Start(opts);
  ASSERT_THAT(d.status(), IsOk());
  Daemon& daemon = **d;
  // Workers.
  EXPECT_THAT(Register(daemon, "llama-7b", "", "ops"), IsOk());
  EXPECT_THAT(Register(daemon, "gpt-2", "", "ops"),
              StatusIs(kDenied, HasSubstr("\"cn:ops-admin\" (--worker_subjects_file) may not act "
                                          "for job \"gpt-2\"")));
  EXPECT_THAT(Register(daemon, "gpt-2", "", "evil"), IsOk());  // by its URI SAN
  EXPECT_THAT(Register(daemon, "llama-8b", "", "evil"),
              StatusIs(kDenied, HasSubstr("uri:spiffe://cluster/ns/ml/sa/ops")));
  EXPECT_THAT(Register(daemon, "llama-9b", "", "lookalike"),
              StatusIs(kDenied, HasSubstr("not listed in --worker_subjects_file")));
  // Operators: the subject is the admin; a CN that spells it is nobody; a DNS SAN
  // that spells the admin's CN is only what its own dns: line says.
  EXPECT_THAT(AdminCall(daemon, "ops", /*mutation=*/true), IsOk());
  EXPECT_THAT(AdminCall(daemon, "lookalike", /*mutation=*/false),
              StatusIs(kDenied, HasSubstr("is not listed in --admin_subjects_file")));
  EXPECT_THAT(AdminCall(daemon, "evil", /*mutation=*/false), IsOk());
  EXPECT_THAT(AdminCall(daemon, "evil", /*mutation=*/true),
              StatusIs(kDenied, HasSubstr("dns:ops-admin has the reader role")));
}

}  // namespace
}  // namespace spgate::server
