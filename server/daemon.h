// spgated as a library: a small public handle that owns the gRPC servers (worker and
// admin ports), the metrics exposer and the gate state. main.cc is flags around this;
// tests and benchmarks start a real daemon on port 0 with it.
//
// Usage:
//   spgate::server::DaemonOptions opts;           // loopback, port 0 everywhere
//   opts.state_dir = dir;
//   ASSIGN_OR_RETURN(auto daemon, spgate::server::Daemon::Start(opts));
//   auto channel = grpc::CreateChannel(daemon->worker_address(), ...);
//   ...
//   daemon->Shutdown(absl::Seconds(5));           // NOT_SERVING, drain, flush state
#ifndef SPGATE_SERVER_DAEMON_H_
#define SPGATE_SERVER_DAEMON_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/defaults.h"
#include "server/state_options.h"

namespace spgate::server {

struct DaemonOptions {
  // Worker API. Empty: port 50061, on 127.0.0.1 without a worker credential (no
  // worker_token_file, no tls_client_ca) and on 0.0.0.0 with one. A non-loopback
  // address without a worker credential is refused unless allow_unauthenticated_workers
  // (docs/security.md, "Worker credentials").
  std::string listen = "127.0.0.1:0";
  std::string admin_listen = "127.0.0.1:0";    // admin API
  std::string metrics_listen = "127.0.0.1:0";  // Prometheus /metrics; empty: off
  std::string health_listen;                   // plaintext health-only port; empty: off
  std::string state_dir;                       // empty: API changes are not persisted
  // A state_dir this process cannot write stops Start (naming --state_dir) before any
  // port is bound, unless a read-only one is allowed on purpose: then the persisted state
  // is loaded and every API change is refused with UNAVAILABLE, as a failed write is.
  bool allow_read_only_state_dir = false;
  std::string config_path;                     // GateConfig text format; empty: none
  // Admin credentials (server/admin_auth.h, docs/security.md). None set: every admin
  // call is open; any set: every admin call needs a credential of a high enough role.
  std::string admin_token_file;                // admin role: NAME:TOKEN lines
  std::string reader_token_file;               // read-only role: NAME:TOKEN lines
  std::string admin_subjects_file;             // mTLS identities -> roles: ROLE IDENTITY lines
  // How often the --config file is checked for a new version (a ConfigMap swap needs no
  // SIGHUP); zero: only SIGHUP reloads.
  absl::Duration config_poll_interval = absl::Seconds(5);
  // PEM files; cert+key turn TLS on. The key must match the certificate, and every file
  // must hold PEM of its kind, or Start fails naming the flag before any port is bound.
  std::string tls_cert, tls_key, tls_client_ca;
  // Worker credentials (server/worker_auth.h, docs/security.md), each scoped to job-id
  // patterns. None set: any worker may act for any job.
  std::string worker_token_file;     // NAME:TOKEN JOB_PATTERN[,...] lines, or one bare TOKEN
  std::string worker_subjects_file;  // mTLS identities -> jobs: IDENTITY JOB_PATTERN[,...]
  bool allow_unauthenticated_workers = false;  // a non-loopback `listen` without a credential
  // A non-loopback admin_listen needs an admin credential (a token file or a subjects
  // file; a client CA alone is not one: it signs the workers' certificates too) unless
  // this is set (docs/security.md, "Admin roles and credentials").
  bool allow_unauthenticated_admin = false;
  // The live state's options: heartbeats, staleness, caches, the job/group/session and
  // rate limits, the plan lead and the clock (injected for tests; empty: absl::Now).
  StateOptions state;
  // Limits (docs/design.md §10; defaults in server/defaults.h).
  int max_receive_message_bytes = kDefaultMaxReceiveMessageBytes;  // both gRPC ports
  int max_concurrent_streams_per_connection = kDefaultMaxConcurrentStreamsPerConnection;
  int max_streams = kDefaultMaxStreams;              // Connect + WatchDecisions, in total
  int max_watch_streams = kDefaultMaxWatchStreams;
  absl::Duration first_message_timeout = kDefaultFirstMessageTimeout;  // Connect streams
  absl::Duration handshake_timeout = kDefaultHandshakeTimeout;  // TLS + HTTP/2 preface, all ports
  int min_ping_interval_ms = kDefaultMinPingIntervalMs;  // pings without data, from clients
  int max_ping_strikes = kDefaultMaxPingStrikes;         // then GOAWAY; 0: never
};

class Daemon {
 public:
  // Loads --config and the persisted state (a corrupt state file is an error naming
  // it), binds every port, and reports SERVING.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  int worker_port() const;
  int admin_port() const;
  int metrics_port() const;  // 0 when off
  int health_port() const;   // 0 when off
  std::string worker_address() const;  // "127.0.0.1:PORT" (host of the listen flag)
  std::string admin_address() const;

  // Re-reads the config file (SIGHUP). On error the running config stays and
  // spgate_config_last_reload_successful is set to 0. Without --config: FAILED_PRECONDITION,
  // logged as a warning (event config_reload_skipped); the gauge stays.
  absl::Status ReloadConfig();

  // Reloads the config file if its identity (device, inode, mtime, size) and contents
  // changed since the last look, with ReloadConfig's rules; true if it reloaded. Runs
  // every config_poll_interval on its own thread; tests may call it directly.
  bool PollConfig();

  // Runs housekeeping now (stale ranks, pin expiry, gauges); also runs on a timer.
  void Sweep();

  // NOT_SERVING, ends open streams with UNAVAILABLE, waits up to `grace`, flushes state.
  // Idempotent; the destructor calls it.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_DAEMON_H_
