// Daemon: wires GateState, the two gRPC services, health, reflection, the metrics
// exposer and the housekeeping timer together, and shuts them down in order. The
// worker and admin ports serve their API, health and reflection; the plaintext
// --health_listen port serves grpc.health.v1.Health and nothing else (docs/design.md §6).
// Everything a flag can get wrong — credential files, TLS files that are not PEM of
// their kind or a key that does not match its certificate, a worker API open beyond
// loopback without a worker credential, a --state_dir this process cannot write — stops
// Start before any port is bound (docs/security.md, docs/operations.md).
#include "server/daemon.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "server/gate_state.h"
#include "server/listen_address.h"
#include "server/log.h"
#include "server/operator_store.h"
#include "common/mutex.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/persistence.h"
#include "server/services.h"
#include "server/worker_auth.h"
#include "proto/grpc_status.h"

namespace spgate::server {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "0.0.0.0:50061" -> "127.0.0.1", "[::]:1" -> "[::1]", "host:1" -> "host".
std::string DialHost(const std::string& listen) {
  const AddressParts parts = SplitAddress(listen);
  const std::string host = LocalHostOf(parts);
  return parts.bracketed ? absl::StrCat("[", host, "]") : host;
}

// OpenSSL's password callback: no passphrase. A key that needs one is refused (gRPC
// could not use it either) instead of prompting on a terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY, EVP_PKEY_free>>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text (other PEM blocks before it are skipped).
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  ERR_clear_error();  // the thread's OpenSSL error queue is gRPC's too
  return cert;
}

// What gRPC would otherwise report, much later, as "cannot listen there": the files are
// PEM of their kind and the key belongs to the certificate.
absl::Status CheckTlsFiles(const DaemonOptions& opts, const std::string& cert_pem,
                           const std::string& key_pem, const std::string& client_ca_pem) {
  X509Ptr cert = FirstCertificate(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert: ", opts.tls_cert, " holds no PEM certificate"));
  }
  BioPtr bio = MemoryBio(key_pem);
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: ", opts.tls_key,
        " holds no PEM private key (an unencrypted -----BEGIN PRIVATE KEY----- block)"));
  }
  const bool matches = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: the private key does not match the certificate in --tls_cert (key ",
        opts.tls_key, ", certificate ", opts.tls_cert, ")"));
  }
  if (!opts.tls_client_ca.empty() && FirstCertificate(client_ca_pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_client_ca: ", opts.tls_client_ca, " holds no PEM certificate"));
  }
  return absl::OkStatus();
}

// A token that is both a worker's and an operator's would make every worker holding it
// an operator.
absl::Status CheckWorkerTokensAreNotAdminTokens(const WorkerAuthConfig& workers,
                                                const AdminAuthConfig& admins) {
  for (const WorkerToken& w : workers.tokens) {
    for (const TokenCredential& a : admins.tokens) {
      if (w.secret == a.secret) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--worker_token_file: ", w.where, ": the token of ", w.name,
            " is also the token of ", a.name, " in ",
            a.role == Role::kAdmin ? "--admin_token_file" : "--reader_token_file", " (",
            a.where, "); workers and operators need their own tokens"));
      }
    }
  }
  return absl::OkStatus();
}

// Resolves an empty --listen and refuses a worker API open beyond loopback that takes
// no credential: anyone who reached it could register any job id and steer its
// decisions (docs/security.md, "Worker credentials").
absl::Status ResolveWorkerListen(DaemonOptions& opts) {
  std::vector<std::string> credentials;
  if (!opts.worker_token_file.empty()) credentials.push_back("--worker_token_file");
  if (!opts.tls_client_ca.empty()) credentials.push_back("client certificates (--tls_client_ca)");
  const std::string what = absl::StrJoin(credentials, " and ");
  if (opts.listen.empty()) {
    opts.listen = DefaultWorkerListen(!credentials.empty());
    Log(LogLevel::kInfo,
        credentials.empty()
            ? absl::StrCat("worker API on ", opts.listen,
                           ": loopback only, since no worker credential is configured "
                           "(--worker_token_file or --tls_client_ca opens it to other hosts)")
            : absl::StrCat("worker API on ", opts.listen, ": all interfaces, workers present ",
                           what),
        {{"event", "worker_listen"}, {"listen", opts.listen},
         {"loopback_only", credentials.empty()}});
    return absl::OkStatus();
  }
  if (!credentials.empty() || IsLoopbackListenAddress(opts.listen)) return absl::OkStatus();
  if (!opts.allow_unauthenticated_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", opts.listen,
        " is not a loopback address and no worker credential is configured: anyone who "
        "can reach it could register any job and steer its decisions. Give "
        "--worker_token_file or --tls_client_ca (mTLS), listen on 127.0.0.1, or accept "
        "this with --allow_unauthenticated_workers (docs/security.md)"));
  }
  Log(LogLevel::kWarning,
      absl::StrCat("the worker API on ", opts.listen,
                   " takes no credential (--allow_unauthenticated_workers): whoever can "
                   "reach it can register any job id and steer its decisions"),
      {{"event", "unauthenticated_workers"}, {"listen", opts.listen}});
  return absl::OkStatus();
}

// Refuses an admin API open beyond loopback that no admin credential guards: whoever
// reached it could change the gates and pin modes, and a TP-only pin forced past the
// memory gate can run a job out of memory. A client CA alone (--tls_client_ca) is no
// admin credential: it is the worker API's CA too, so every worker's certificate would
// be an admin's (docs/security.md, "Admin roles and credentials").
absl::Status CheckAdminListen(const DaemonOptions& opts, const AdminAuthConfig& auth) {
  if (auth.configured() || IsLoopbackListenAddress(opts.admin_listen)) return absl::OkStatus();
  const std::string who =
      opts.tls_client_ca.empty()
          ? "anyone who can reach it"
          : "every client with a certificate from --tls_client_ca — every worker's too";
  if (!opts.allow_unauthenticated_admin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--admin_listen=", opts.admin_listen,
        " is not a loopback address and no admin credential is configured: ", who,
        " could change the gates and force pins. Give --admin_token_file, "
        "--reader_token_file or --admin_subjects_file (mTLS), keep --admin_listen on "
        "127.0.0.1, or accept this with --allow_unauthenticated_admin (docs/security.md)"));
  }
  Log(LogLevel::kWarning,
      absl::StrCat("the admin API on ", opts.admin_listen,
                   " takes no admin credential (--allow_unauthenticated_admin): ", who,
                   " may change the gates and force pins"),
      {{"event", "unauthenticated_admin"}, {"admin_listen", opts.admin_listen}});
  return absl::OkStatus();
}

// What identifies one version of the config file. stat() follows symlinks, so a
// kubelet's `..data` symlink swap or a rename over the file shows as a new inode; the
// content hash catches an in-place rewrite within the mtime's resolution and lets an
// identical replacement pass without a reload.
struct ConfigFingerprint {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  int64_t size = -1;
  size_t content_hash = 0;
  bool SameFile(const ConfigFingerprint& o) const {
    return dev == o.dev && ino == o.ino && mtime_ns == o.mtime_ns && size == o.size;
  }
};

// nullopt when the file cannot be stat'ed or read (e.g. in the middle of a swap).
std::optional<ConfigFingerprint> Fingerprint(const std::string& path, bool hash_contents) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  ConfigFingerprint f;
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  f.size = st.st_size;
  if (hash_contents) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    f.content_hash = std::hash<std::string>{}(ss.str());
  }
  return f;
}

// Server reflection on one builder, or none on it. Loading grpc++_reflection registers
// its plugin for every ServerBuilder in the process (a static initialiser), so a server
// without reflection has to take that plugin out, not merely not add one.
class ReflectionOption : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    auto reflection = std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>();
    const std::string name = reflection->name();
    std::erase_if(*plugins, [&](const auto& p) { return p->name() == name; });
    if (enabled_) plugins->push_back(std::move(reflection));
  }

 private:
  bool enabled_;
};

// Creates and removes a probe file in `dir`: the one test of writability that holds for
// every reason a write can fail (ownership, mode, a read-only mount, an ACL, SELinux).
absl::Status CheckStateDirWritable(const std::string& dir) {
  const std::string probe = absl::StrCat(dir, "/.spgated-write-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir ", dir, " is not writable by uid ", ::geteuid(), " (creating a file there: ",
        std::strerror(err), "); give the directory to that user (the container image runs as "
        "uid 65532), or pass --allow_read_only_state_dir to serve with API changes refused"));
  }
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir ", dir, ": cannot remove the probe file ", probe, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// Every failed write to --state_dir (the state file, audit.log, the launches file, a
// learned table): counted and logged once, naming the file.
std::function<void(absl::string_view)> PersistFailureReport(Metrics* m) {
  return [m](absl::string_view what) {
    m->state_persist_failures.Increment();
    Log(LogLevel::kWarning, std::string(what), {{"event", "state_persist_failed"}});
  };
}

}  // namespace

class Daemon::Impl {
 public:
  DaemonOptions opts;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<OperatorStore> store;
  std::unique_ptr<GateState> state;
  bool state_read_only = false;  // --allow_read_only_state_dir over an unwritable one
  StreamRegistry streams;
  std::unique_ptr<GateServiceImpl> gate_service;
  std::unique_ptr<AdminServiceImpl> admin_service;
  // The health-only port's answer to every method but Health: UNIMPLEMENTED. (A server
  // needs one callback or sync service to start; this is it, and it serves nothing.)
  // Declared before the servers, so it outlives them.
  grpc::CallbackGenericService unimplemented;
  std::unique_ptr<grpc::Server> worker_server, admin_server, health_server;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  int worker_port = 0, admin_port = 0, metrics_port = 0, health_port = 0;
  std::thread sweeper;
  std::thread config_poller;
  absl::Notification stop_sweeper;
  Mutex poll_mu;  // one poll at a time; the fingerprint of the file last looked at
  std::optional<ConfigFingerprint> config_seen ABSL_GUARDED_BY(poll_mu);
  Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;

  absl::Status Start();
  absl::StatusOr<v1::GateConfig> LoadConfigFile();
  absl::Status RestoreState(v1::GateConfig file_layer);
  absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(
      const std::string& flag, const std::string& address,
      std::shared_ptr<grpc::ServerCredentials> creds, grpc::Service* service, int* port);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials();
  bool PollConfig();
  absl::Status Reload();  // ReloadConfig's rules, without touching the fingerprint
  // grpc.health.v1 on every server: "" (the whole server) and, by name, the services it
  // stands for — each API port its own, the health-only port both — so a checker set up
  // per service gets an answer rather than NOT_FOUND. The per-name statuses follow the
  // server's (SetServingStatus(bool) sets them all).
  void SetServing(bool serving) {
    const std::string gate = v1::GateService::service_full_name();
    const std::string admin = v1::AdminService::service_full_name();
    const std::pair<grpc::Server*, std::vector<std::string>> servers[] = {
        {worker_server.get(), {gate}},
        {admin_server.get(), {admin}},
        {health_server.get(), {gate, admin}}};
    for (const auto& [s, names] : servers) {
      if (s == nullptr || s->GetHealthCheckService() == nullptr) continue;
      for (const std::string& name : names) {
        s->GetHealthCheckService()->SetServingStatus(name, serving);
      }
      s->GetHealthCheckService()->SetServingStatus(serving);
    }
  }
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Daemon::Impl::Credentials() {
  if (opts.tls_cert.empty() && opts.tls_key.empty()) {
    if (!opts.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (opts.tls_cert.empty() || opts.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  grpc::SslServerCredentialsOptions ssl;
  ASSIGN_OR_RETURN(std::string cert, ReadSmallFile("--tls_cert", opts.tls_cert));
  ASSIGN_OR_RETURN(std::string key, ReadSmallFile("--tls_key", opts.tls_key));
  if (!opts.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile("--tls_client_ca", opts.tls_client_ca));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  RETURN_IF_ERROR(CheckTlsFiles(opts, cert, key, ssl.pem_root_certs));
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> Daemon::Impl::Serve(
    const std::string& flag, const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> creds, grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, std::move(creds), port);
  if (service != nullptr) {
    builder.RegisterService(service);
  } else {
    // The health-only port: the default health service, and UNIMPLEMENTED for the rest.
    builder.RegisterCallbackGenericService(&unimplemented);
  }
  builder.SetOption(std::make_unique<ReflectionOption>(/*enabled=*/service != nullptr));
  // Limits (docs/design.md §10). A larger message is refused by gRPC with
  // RESOURCE_EXHAUSTED before any handler runs; streams over the per-connection cap wait
  // in the client's HTTP/2 layer.
  builder.SetMaxReceiveMessageSize(opts.max_receive_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             opts.max_concurrent_streams_per_connection);
  // Keepalive enforcement: the shipped clients ping every 10 s, also when idle
  // (worker/client/wire.cc), which is accepted; a client pinging more often than
  // --min_ping_interval gets a strike per ping, and after --max_ping_strikes the
  // connection is closed (GOAWAY "too_many_pings").
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             opts.min_ping_interval_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, opts.max_ping_strikes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // No bandwidth-delay probes (a PING and its ACK per read burst): workers' messages are a
  // few hundred bytes, and at 2,048 connections each probe is two more wake-ups.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // A connection that has not finished its handshake (TLS, then HTTP/2's SETTINGS) by
  // then is closed.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(opts.handshake_timeout)));
  // gRPC sets SO_REUSEPORT by default: a second daemon on a port in use would start and
  // the kernel would split the connections between the two, each with its own state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    const std::string why = WhyCannotListen(address);
    return absl::UnavailableError(
        absl::StrCat(flag, "=", address, ": cannot listen there", why.empty() ? "" : ": ", why));
  }
  return server;
}

absl::StatusOr<v1::GateConfig> Daemon::Impl::LoadConfigFile() {
  if (opts.config_path.empty()) return v1::GateConfig();
  absl::StatusOr<v1::GateConfig> loaded = LoadGateConfigFile(opts.config_path);
  if (!loaded.ok()) {  // the flag named, as every start-up error does
    return absl::Status(loaded.status().code(),
                        absl::StrCat("--config: ", loaded.status().message()));
  }
  MutexLock lock(&poll_mu);
  config_seen = Fingerprint(opts.config_path, /*hash_contents=*/true);
  return loaded;
}

// The operator store and the gate state, restored from --state_dir (read-only where
// allowed and it cannot be written), before any port reports SERVING.
absl::Status Daemon::Impl::RestoreState(v1::GateConfig file_layer) {
  // A path that is there but no directory would be read as one first ("cannot read
  // DIR/spgated-state.textproto: Not a directory"): say which flag it is.
  if (struct stat st{}; !opts.state_dir.empty() && ::stat(opts.state_dir.c_str(), &st) == 0 &&
                        !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state_dir ", opts.state_dir, " is not a directory (give a directory, or a path "
        "where one can be made)"));
  }
  metrics = std::make_unique<Metrics>();
  // The persisted state is restored here, before any port reports SERVING.
  StoreOptions store_options;
  store_options.state_dir = opts.state_dir;
  store_options.clock = opts.state.clock;
  store_options.max_job_scopes = opts.state.max_jobs;
  const auto persist_failed = PersistFailureReport(metrics.get());
  store_options.on_persist_failure = persist_failed;
  // Before any port reports SERVING: an unwritable directory would otherwise show up only
  // as UNAVAILABLE on the first change. One that does not exist yet Create makes (or
  // fails to), and then checks below.
  std::error_code no_dir;
  const bool existed =
      !opts.state_dir.empty() && std::filesystem::is_directory(opts.state_dir, no_dir);
  if (existed) {
    absl::Status writable = CheckStateDirWritable(opts.state_dir);
    if (!opts.allow_read_only_state_dir) RETURN_IF_ERROR(writable);
    state_read_only = !writable.ok();  // served read-only: nothing is written, at stop too
  }
  store_options.read_only = state_read_only;
  ASSIGN_OR_RETURN(store, OperatorStore::Create(std::move(store_options), std::move(file_layer)));
  if (!opts.state_dir.empty() && !existed) RETURN_IF_ERROR(CheckStateDirWritable(opts.state_dir));
  if (state_read_only) {
    Log(LogLevel::kWarning,
        absl::StrCat("--state_dir ", opts.state_dir, " is not writable: serving it read-only "
                     "(--allow_read_only_state_dir): its state is loaded, API changes are "
                     "refused, new launches are kept in memory, learned tables are not saved"),
        {{"event", "state_read_only"}, {"path", opts.state_dir}});
  }
  opts.state.state_dir = opts.state_dir;  // the launches file lives beside the state file
  opts.state.read_only_state_dir = state_read_only;
  if (!opts.state.on_persist_failure) opts.state.on_persist_failure = persist_failed;
  // The state's own lines (a refused learned-table file, a failed write) in --log_format.
  if (!opts.state.log) {
    opts.state.log = [](const std::string& line) {
      Log(LogLevel::kWarning, line, {{"event", "state_warning"}});
    };
  }
  ASSIGN_OR_RETURN(state, GateState::Create(opts.state, *metrics, store.get()));
  store->SetListener(state.get());
  if (!opts.state_dir.empty()) {
    Log(LogLevel::kInfo,
        absl::StrCat("restored from ", opts.state_dir, ": global config version: ",
                     store->GlobalVersion(), ", ", state->RestoredSummary()),
        {{"event", "state_restored"}, {"path", opts.state_dir}});
  }
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Start() {
  if (!opts.state.clock) opts.state.clock = [] { return absl::Now(); };
  ASSIGN_OR_RETURN(v1::GateConfig file_layer, LoadConfigFile());
  // Flag combinations first: they need no file read to be wrong.
  if (!opts.admin_subjects_file.empty() && opts.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--admin_subjects_file maps client certificates to roles and needs --tls_client_ca");
  }
  if (!opts.worker_subjects_file.empty() && opts.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--worker_subjects_file maps client certificates to job ids and needs --tls_client_ca");
  }
  ASSIGN_OR_RETURN(AdminAuthConfig auth, LoadAdminAuth(opts.admin_token_file,
                                                       opts.reader_token_file,
                                                       opts.admin_subjects_file));
  ASSIGN_OR_RETURN(WorkerAuthConfig worker_auth,
                   LoadWorkerAuth(opts.worker_token_file, opts.worker_subjects_file));
  RETURN_IF_ERROR(CheckWorkerTokensAreNotAdminTokens(worker_auth, auth));
  RETURN_IF_ERROR(ResolveWorkerListen(opts));
  RETURN_IF_ERROR(CheckAdminListen(opts, auth));
  ASSIGN_OR_RETURN(auto creds, Credentials());

  RETURN_IF_ERROR(RestoreState(std::move(file_layer)));

  streams.SetLimits(opts.max_streams, opts.max_watch_streams);
  gate_service = std::make_unique<GateServiceImpl>(state.get(), *metrics, &streams,
                                                   std::move(worker_auth));
  admin_service = std::make_unique<AdminServiceImpl>(state.get(), store.get(), *metrics,
                                                     &streams, std::move(auth));
  grpc::EnableDefaultHealthCheckService(true);

  if (!opts.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(metrics_endpoint,
                     MetricsEndpoint::Listen(opts.metrics_listen, metrics->registry()));
    metrics_port = metrics_endpoint->port();
  }
  ASSIGN_OR_RETURN(worker_server, Serve("--listen", opts.listen, creds, gate_service.get(),
                                        &worker_port));
  ASSIGN_OR_RETURN(admin_server, Serve("--admin_listen", opts.admin_listen, creds,
                                       admin_service.get(), &admin_port));
  if (!opts.health_listen.empty()) {
    ASSIGN_OR_RETURN(health_server, Serve("--health_listen", opts.health_listen,
                                          grpc::InsecureServerCredentials(), nullptr,
                                          &health_port));
  }
  SetServing(true);
  const absl::Duration period =
      std::min({opts.state.heartbeat_interval, opts.first_message_timeout / 2, absl::Seconds(1)});
  sweeper = std::thread([this, period] {
    while (!stop_sweeper.WaitForNotificationWithTimeout(period)) {
      state->Sweep();
      state->PersistLearned(/*all=*/false);  // rate-limited per job, off the decision path
      streams.ExpireSilent(absl::Now() - opts.first_message_timeout, *metrics);
      FlushHeldGrpcLogs(absl::Now());
    }
  });
  if (!opts.config_path.empty() && opts.config_poll_interval > absl::ZeroDuration()) {
    config_poller = std::thread([this] {
      while (!stop_sweeper.WaitForNotificationWithTimeout(opts.config_poll_interval)) {
        (void)PollConfig();
      }
    });
  }
  // Which listeners are off, so that an empty flag never reads as "port 0".
  std::vector<std::string> off;
  if (metrics_port == 0) off.push_back("metrics (--metrics_listen)");
  if (health_port == 0) off.push_back("health-only port (--health_listen)");
  Log(LogLevel::kInfo,
      absl::StrCat("serving: worker API on port ", worker_port, ", admin API on port ",
                   admin_port,
                   metrics_port ? absl::StrCat(", metrics on port ", metrics_port) : "",
                   health_port ? absl::StrCat(", health on port ", health_port) : "",
                   off.empty() ? "" : absl::StrCat("; off: ", absl::StrJoin(off, ", "))),
      // Port 0: that listener is off.
      {{"event", "serving"}, {"worker_port", worker_port}, {"admin_port", admin_port},
       {"metrics_port", metrics_port}, {"health_port", health_port}});
  return absl::OkStatus();
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Shutdown(absl::Seconds(2)); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  absl::Status s = impl->Start();
  if (!s.ok()) {
    impl->stop_sweeper.Notify();
    if (impl->sweeper.joinable()) impl->sweeper.join();
    if (impl->config_poller.joinable()) impl->config_poller.join();
    for (auto* srv : {impl->worker_server.get(), impl->admin_server.get(),
                      impl->health_server.get()}) {
      if (srv != nullptr) srv->Shutdown(std::chrono::system_clock::now());
    }
    SyncWithFinishedCallbacks();
    return s;
  }
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

int Daemon::worker_port() const { return impl_->worker_port; }
int Daemon::admin_port() const { return impl_->admin_port; }
int Daemon::metrics_port() const { return impl_->metrics_port; }
int Daemon::health_port() const { return impl_->health_port; }
std::string Daemon::worker_address() const {
  return absl::StrCat(DialHost(impl_->opts.listen), ":", impl_->worker_port);
}
std::string Daemon::admin_address() const {
  return absl::StrCat(DialHost(impl_->opts.admin_listen), ":", impl_->admin_port);
}

absl::Status Daemon::ReloadConfig() {
  if (impl_->opts.config_path.empty()) {
    // Said, as every reload is: a SIGHUP that changed nothing in silence reads as one
    // that reloaded.
    const std::string why = "no --config file to reload: the daemon was started without "
                            "--config; the config stays as it is";
    Log(LogLevel::kWarning, absl::StrCat("config reload skipped: ", why),
        {{"event", "config_reload_skipped"}, {"error", why}});
    return absl::FailedPreconditionError(why);
  }
  {
    // A SIGHUP reload counts as having seen this version of the file.
    MutexLock lock(&impl_->poll_mu);
    impl_->config_seen = Fingerprint(impl_->opts.config_path, /*hash_contents=*/true);
  }
  return impl_->Reload();
}

bool Daemon::PollConfig() { return impl_->PollConfig(); }

bool Daemon::Impl::PollConfig() {
  if (opts.config_path.empty()) return false;
  {
    MutexLock lock(&poll_mu);
    std::optional<ConfigFingerprint> now = Fingerprint(opts.config_path, /*hash_contents=*/false);
    if (!now.has_value()) return false;  // gone for a moment (a swap): look again later
    if (config_seen.has_value() && config_seen->SameFile(*now)) return false;
    now = Fingerprint(opts.config_path, /*hash_contents=*/true);
    if (!now.has_value()) return false;
    const bool same_contents =
        config_seen.has_value() && config_seen->content_hash == now->content_hash;
    config_seen = now;
    if (same_contents) return false;
  }
  Log(LogLevel::kInfo, absl::StrCat(opts.config_path, " changed on disk; reloading"),
      {{"event", "config_changed"}, {"path", opts.config_path}});
  (void)Reload();
  return true;
}

absl::Status Daemon::Impl::Reload() {
  absl::StatusOr<v1::GateConfig> file = LoadGateConfigFile(opts.config_path);
  absl::Status s = file.ok() ? store->ReloadConfigFile(*file) : file.status();
  // Log before the gauge moves: whoever watches the gauge (an alert, a test) finds the
  // reason already in the log.
  if (!s.ok()) {
    Log(LogLevel::kError,
        absl::StrCat("config reload failed, keeping the running config: ", s.message()),
        {{"event", "config_reload_failed"}, {"path", opts.config_path},
         {"error", std::string(s.message())}});
  } else {
    Log(LogLevel::kInfo, absl::StrCat("reloaded ", opts.config_path),
        {{"event", "config_reloaded"}, {"path", opts.config_path}});
  }
  metrics->config_last_reload_successful.Set(s.ok() ? 1 : 0);
  return s;
}

void Daemon::Sweep() { impl_->state->Sweep(); }

void Daemon::Shutdown(absl::Duration grace) {
  Impl& d = *impl_;
  {
    MutexLock lock(&d.shutdown_mu);
    if (d.shut_down) return;
    d.shut_down = true;
  }
  Log(LogLevel::kInfo, "shutting down: NOT_SERVING, draining streams",
      {{"event", "shutting_down"}});
  d.state->BeginDrain();
  d.SetServing(false);
  d.streams.DrainAll();
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace);
  for (auto* srv : {d.worker_server.get(), d.admin_server.get(), d.health_server.get()}) {
    if (srv != nullptr) srv->Shutdown(deadline);
  }
  SyncWithFinishedCallbacks();
  d.stop_sweeper.Notify();
  if (d.sweeper.joinable()) d.sweeper.join();
  if (d.config_poller.joinable()) d.config_poller.join();
  if (!d.state_read_only) {  // a read-only state directory was never written
    if (absl::Status s = d.store->Flush(); !s.ok()) {
      Log(LogLevel::kError, std::string(s.message()), {{"event", "state_flush_failed"}});
    }
    d.state->PersistLearned(/*all=*/true);
  }
  d.metrics_endpoint.reset();
  FlushHeldGrpcLogs(absl::InfiniteFuture());  // gRPC's lines held back and not yet said
  Log(LogLevel::kInfo, "stopped", {{"event", "stopped"}});
}

}  // namespace spgate::server
