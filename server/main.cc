// spgated: the gate daemon. Flags per docs/design.md §5; absl's --flagfile and --fromenv work.
// Without a worker credential the worker API stays on loopback (docs/security.md,
// "Worker credentials"); every flag mistake stops start-up before a port is bound.
// Signals: SIGTERM/SIGINT drain and stop; SIGHUP re-reads --config (which is also
// polled every --config_poll_interval).
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/mutex.h"
#include "server/daemon.h"
#include "server/defaults.h"
#include "server/listen_address.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"

ABSL_FLAG(std::string, listen, "",
          "Worker API (spgate.v1.GateService) address; empty: 127.0.0.1:50061 without a worker "
          "credential, 0.0.0.0:50061 with --worker_token_file or --tls_client_ca");
ABSL_FLAG(std::string, admin_listen, "127.0.0.1:50062", "Admin API (spgate.v1.AdminService) address");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9461",
          "Prometheus /metrics address (HOST:PORT or PORT; the default is every interface); "
          "[IPv6]:PORT and +PORT only where civetweb was built with IPv6 (Debian 12's is "
          "not); empty: off");
ABSL_FLAG(std::string, health_listen, "", "Plaintext gRPC health-only address; empty: off");
ABSL_FLAG(std::string, state_dir, "", "Directory for operator changes made through the API");
ABSL_FLAG(bool, allow_read_only_state_dir, false,
          "Start even when --state_dir is not writable (its state is loaded; every API "
          "change is then refused with UNAVAILABLE). Without it such a directory stops start-up");
ABSL_FLAG(std::string, config, "", "Gate config file (spgate.v1.GateConfig, text format)");
ABSL_FLAG(std::string, admin_token_file, "",
          "Admin-role bearer tokens, one NAME:TOKEN (or bare TOKEN) per line");
ABSL_FLAG(std::string, reader_token_file, "",
          "Read-only-role bearer tokens, one NAME:TOKEN (or bare TOKEN) per line");
ABSL_FLAG(std::string, admin_subjects_file, "",
          "mTLS client identities mapped to roles: ROLE IDENTITY per line, IDENTITY one of "
          "cn:NAME, dns:NAME, uri:URI, subject:DN");
ABSL_FLAG(spgate::server::LogFormat, log_format, spgate::server::LogFormat::kText,
          "Log lines on stderr: text, or json (one object per line: time, level, message, fields)");
ABSL_FLAG(absl::Duration, config_poll_interval, absl::Seconds(5),
          "How often --config is checked for a new file (ConfigMap swaps); 0: SIGHUP only");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (turns TLS on for both APIs)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA bundle; when set, clients must present a cert it signed");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1), "Heartbeat interval told to workers");
ABSL_FLAG(absl::Duration, stale_after, absl::Seconds(5), "A rank silent this long counts as stale");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5), "How long shutdown waits for calls");
ABSL_FLAG(int, max_jobs, 1024, "Most jobs tracked at once (bounds the job_id label)");
ABSL_FLAG(int, max_groups_per_job, spgate::server::kDefaultMaxGroupsPerJob, "Most TP groups per job");
ABSL_FLAG(int64_t, max_plan_lead_steps, spgate::server::kDefaultMaxPlanLeadSteps,
          "Plans more than this many steps after their group's last decided step are refused");
ABSL_FLAG(std::string, worker_token_file, "",
          "Worker bearer tokens scoped to job ids: NAME:TOKEN JOB_PATTERN[,JOB_PATTERN...] per "
          "line, or one bare TOKEN (every job); every worker call must carry one");
ABSL_FLAG(std::string, worker_subjects_file, "",
          "mTLS client identities mapped to job ids: IDENTITY JOB_PATTERN[,JOB_PATTERN...] per "
          "line, IDENTITY one of cn:NAME, dns:NAME, uri:URI, subject:DN; needs --tls_client_ca");
ABSL_FLAG(bool, allow_unauthenticated_workers, false,
          "Start with a non-loopback --listen although no worker credential is configured "
          "(anyone who reaches the port can register any job); logs a WARNING");
ABSL_FLAG(bool, allow_unauthenticated_admin, false,
          "Start with a non-loopback --admin_listen although no admin credential "
          "(--admin_token_file, --reader_token_file, --admin_subjects_file) is configured: "
          "whoever reaches the port, or holds any certificate from --tls_client_ca, may "
          "change gates and pins; logs a WARNING");
ABSL_FLAG(int64_t, decision_cache_steps, spgate::server::kDefaultDecisionCacheSteps,
          "Decisions each TP group keeps to answer retried plans idempotently");
ABSL_FLAG(absl::Duration, learned_persist_interval,
          spgate::server::kDefaultLearnedPersistInterval,
          "With --state_dir: a learning job's ADAPTIVE tables are written there at most once "
          "per this interval, and at shutdown (docs/operations.md); 0: every sweep (1 s)");

// Limits (docs/design.md §10): each refusal is RESOURCE_EXHAUSTED and counted in
// spgate_limit_refusals_total{limit=...}.
ABSL_FLAG(absl::Duration, forget_after, absl::Minutes(30),
          "Ranks silent this long (no stream), groups without ranks and idle jobs are dropped "
          "from the live state");
ABSL_FLAG(int, max_receive_message_bytes, spgate::server::kDefaultMaxReceiveMessageBytes,
          "Largest message either gRPC port accepts (larger: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_concurrent_streams_per_connection,
          spgate::server::kDefaultMaxConcurrentStreamsPerConnection,
          "HTTP/2 streams one client connection may have open at once");
ABSL_FLAG(int, max_streams, spgate::server::kDefaultMaxStreams,
          "Connect and WatchDecisions streams open at once, in total");
ABSL_FLAG(int, max_watch_streams, spgate::server::kDefaultMaxWatchStreams,
          "WatchDecisions streams open at once");
ABSL_FLAG(absl::Duration, first_message_timeout, spgate::server::kDefaultFirstMessageTimeout,
          "A Connect stream that names no session within this long is ended");
ABSL_FLAG(absl::Duration, handshake_timeout, spgate::server::kDefaultHandshakeTimeout,
          "A connection that has not finished its TLS and HTTP/2 handshake this long after "
          "it opened is closed");
ABSL_FLAG(int, max_sessions_per_job, spgate::server::kDefaultMaxSessionsPerJob,
          "Worker sessions (registered ranks) per job");
ABSL_FLAG(int, max_sequences_per_plan, spgate::server::kDefaultMaxSequencesPerPlan,
          "Sequences in one batch plan (at most 1048576)");
ABSL_FLAG(double, max_plans_per_second, spgate::server::kDefaultMaxPlansPerSecond,
          "Plans a second per session, bursts of twice that; 0: no limit");
ABSL_FLAG(double, max_telemetry_per_second, spgate::server::kDefaultMaxTelemetryPerSecond,
          "Telemetry records a second per session, bursts of twice that; 0: no limit");
ABSL_FLAG(absl::Duration, min_ping_interval,
          absl::Milliseconds(spgate::server::kDefaultMinPingIntervalMs),
          "Shortest interval between a client's pings without data that is not a strike");
ABSL_FLAG(int, max_ping_strikes, spgate::server::kDefaultMaxPingStrikes,
          "Pings closer than --min_ping_interval forgiven before the connection is closed; "
          "0: never closed");

namespace {

// The daemon's options, one flag each (docs/design.md §5, §10).
spgate::server::DaemonOptions DaemonOptionsFromFlags() {
  spgate::server::DaemonOptions opts;
  opts.listen = absl::GetFlag(FLAGS_listen);
  opts.admin_listen = absl::GetFlag(FLAGS_admin_listen);
  opts.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  opts.health_listen = absl::GetFlag(FLAGS_health_listen);
  opts.state_dir = absl::GetFlag(FLAGS_state_dir);
  opts.allow_read_only_state_dir = absl::GetFlag(FLAGS_allow_read_only_state_dir);
  opts.config_path = absl::GetFlag(FLAGS_config);
  opts.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  opts.reader_token_file = absl::GetFlag(FLAGS_reader_token_file);
  opts.admin_subjects_file = absl::GetFlag(FLAGS_admin_subjects_file);
  opts.config_poll_interval = absl::GetFlag(FLAGS_config_poll_interval);
  opts.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  opts.tls_key = absl::GetFlag(FLAGS_tls_key);
  opts.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  opts.state.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  opts.state.stale_after = absl::GetFlag(FLAGS_stale_after);
  opts.state.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  opts.state.max_groups_per_job = absl::GetFlag(FLAGS_max_groups_per_job);
  opts.state.decision_cache_steps = absl::GetFlag(FLAGS_decision_cache_steps);
  opts.state.learned_persist_interval = absl::GetFlag(FLAGS_learned_persist_interval);
  opts.state.max_plan_lead_steps = absl::GetFlag(FLAGS_max_plan_lead_steps);
  opts.worker_token_file = absl::GetFlag(FLAGS_worker_token_file);
  opts.worker_subjects_file = absl::GetFlag(FLAGS_worker_subjects_file);
  opts.allow_unauthenticated_workers = absl::GetFlag(FLAGS_allow_unauthenticated_workers);
  opts.allow_unauthenticated_admin = absl::GetFlag(FLAGS_allow_unauthenticated_admin);
  opts.state.forget_after = absl::GetFlag(FLAGS_forget_after);
  opts.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  opts.max_concurrent_streams_per_connection =
      absl::GetFlag(FLAGS_max_concurrent_streams_per_connection);
  opts.max_streams = absl::GetFlag(FLAGS_max_streams);
  opts.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  opts.first_message_timeout = absl::GetFlag(FLAGS_first_message_timeout);
  opts.handshake_timeout = absl::GetFlag(FLAGS_handshake_timeout);
  opts.state.max_sessions_per_job = absl::GetFlag(FLAGS_max_sessions_per_job);
  opts.state.max_sequences_per_plan = absl::GetFlag(FLAGS_max_sequences_per_plan);
  opts.state.max_plans_per_second = absl::GetFlag(FLAGS_max_plans_per_second);
  opts.state.max_telemetry_per_second = absl::GetFlag(FLAGS_max_telemetry_per_second);
  opts.min_ping_interval_ms =
      static_cast<int>(absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_min_ping_interval)));
  opts.max_ping_strikes = absl::GetFlag(FLAGS_max_ping_strikes);
  return opts;
}

// The flags' ranges, checked before a port is bound: the first flag out of range, with
// its range and the value given, or empty when all are in range.
std::string FlagRangeError(const spgate::server::DaemonOptions& opts) {
  using absl::FormatDuration;
  const spgate::server::StateOptions& st = opts.state;
  struct Check {
    const char* flag;
    bool ok;
    const char* range;
    std::string got;
  };
  const absl::Duration zero = absl::ZeroDuration();
  const Check checks[] = {
      {"learned_persist_interval", st.learned_persist_interval >= zero, ">= 0",
       FormatDuration(st.learned_persist_interval)},
      {"forget_after", st.forget_after > zero, "> 0", FormatDuration(st.forget_after)},
      {"first_message_timeout", opts.first_message_timeout > zero, "> 0",
       FormatDuration(opts.first_message_timeout)},
      {"handshake_timeout", opts.handshake_timeout > zero && opts.handshake_timeout <= absl::Hours(1),
       "in (0, 1h]", FormatDuration(opts.handshake_timeout)},
      {"max_receive_message_bytes", opts.max_receive_message_bytes >= 1024, ">= 1024",
       absl::StrCat(opts.max_receive_message_bytes)},
      {"max_concurrent_streams_per_connection", opts.max_concurrent_streams_per_connection >= 1,
       ">= 1", absl::StrCat(opts.max_concurrent_streams_per_connection)},
      {"max_streams", opts.max_streams >= 1, ">= 1", absl::StrCat(opts.max_streams)},
      {"max_watch_streams", opts.max_watch_streams >= 0, ">= 0",
       absl::StrCat(opts.max_watch_streams)},
      {"max_sessions_per_job", st.max_sessions_per_job >= 1, ">= 1",
       absl::StrCat(st.max_sessions_per_job)},
      {"max_sequences_per_plan", st.max_sequences_per_plan >= 1 && st.max_sequences_per_plan <= (1 << 20),
       "in [1, 1048576]", absl::StrCat(st.max_sequences_per_plan)},
      {"max_plans_per_second", st.max_plans_per_second >= 0, ">= 0 (0: off)",
       absl::StrCat(st.max_plans_per_second)},
      {"max_telemetry_per_second", st.max_telemetry_per_second >= 0, ">= 0 (0: off)",
       absl::StrCat(st.max_telemetry_per_second)},
      {"min_ping_interval", opts.min_ping_interval_ms >= 0, ">= 0",
       absl::StrCat(opts.min_ping_interval_ms, "ms")},
      {"max_ping_strikes", opts.max_ping_strikes >= 0, ">= 0", absl::StrCat(opts.max_ping_strikes)},
      {"max_plan_lead_steps", st.max_plan_lead_steps >= 1, ">= 1",
       absl::StrCat(st.max_plan_lead_steps)},
      {"config_poll_interval", opts.config_poll_interval >= zero, ">= 0 (0 turns polling off)",
       FormatDuration(opts.config_poll_interval)},
      {"heartbeat_interval", st.heartbeat_interval > zero, "> 0",
       FormatDuration(st.heartbeat_interval)},
      {"stale_after", st.stale_after > zero, "> 0", FormatDuration(st.stale_after)},
      {"shutdown_grace", absl::GetFlag(FLAGS_shutdown_grace) >= zero, ">= 0",
       FormatDuration(absl::GetFlag(FLAGS_shutdown_grace))},
      {"max_jobs", st.max_jobs >= 1, ">= 1", absl::StrCat(st.max_jobs)},
      {"max_groups_per_job", st.max_groups_per_job >= 1, ">= 1", absl::StrCat(st.max_groups_per_job)},
      {"decision_cache_steps", st.decision_cache_steps >= 1 && st.decision_cache_steps <= 1'000'000,
       "in [1, 1000000]", absl::StrCat(st.decision_cache_steps)},
  };
  for (const Check& c : checks) {
    if (!c.ok) return absl::StrCat("--", c.flag, ": must be ", c.range, ", got ", c.got);
  }
  for (const auto& [flag, address] : {std::pair{"listen", &opts.listen},
                                      std::pair{"admin_listen", &opts.admin_listen},
                                      std::pair{"health_listen", &opts.health_listen}}) {
    if (std::string error = spgate::server::ListenAddressShapeError(flag, *address);
        !error.empty()) {
      return error;
    }
  }
  if (std::string error = spgate::server::MetricsAddressShapeError(opts.metrics_listen);
      !error.empty()) {
    return error;
  }
  if (std::string error = spgate::server::MetricsAddressFamilyError(
          opts.metrics_listen, spgate::server::MetricsEndpointHasIpv6());
      !error.empty()) {
    return error;
  }
  // Two listeners on one socket: the second bind failed with "Address already in use"
  // and gRPC's own dump. An empty --listen is its default.
  const std::string worker_listen =
      opts.listen.empty() ? spgate::server::DefaultWorkerListen(!opts.worker_token_file.empty() ||
                                                                !opts.tls_client_ca.empty())
                          : opts.listen;
  if (std::string error = spgate::server::SharedListenAddressError(
          {{"listen", worker_listen}, {"admin_listen", opts.admin_listen},
           {"metrics_listen", opts.metrics_listen, /*civetweb=*/true},
           {"health_listen", opts.health_listen}});
      !error.empty()) {
    return error;
  }
  if (st.stale_after < 2 * st.heartbeat_interval) {
    // An idle client sends a heartbeat of its own every 1.5 intervals (docs/api.md).
    return absl::StrCat("--stale_after must be at least twice --heartbeat_interval (an idle "
                        "worker heartbeats every 1.5 intervals), got ",
                        FormatDuration(st.stale_after), " and ",
                        FormatDuration(st.heartbeat_interval));
  }
  return "";
}

// Until SIGTERM or SIGINT (blocked in `signals`): SIGHUP re-reads the config; then a drain
// of --shutdown_grace.
int ServeUntilSignalled(spgate::server::Daemon& daemon, const sigset_t& signals) {
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      (void)daemon.ReloadConfig();
      continue;
    }
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    spgate::server::Log(spgate::server::LogLevel::kInfo, std::string("received ") + name,
                        {{"event", "signal"}, {"signal", name}});
    daemon.Shutdown(absl::GetFlag(FLAGS_shutdown_grace));
    return 0;
  }
}

// absl refuses a flag (unknown, a value that does not parse, a --fromenv variable that
// is not set) with "ERROR: ..." on std::cerr and exits from inside its parser, before
// --log_format is known. So while the flags are parsed std::cerr writes to a buffer, and
// absl's hook for fatal usage errors (below) keeps each message; at the first it registers
// LogFlagErrors to run at exit. Registered after the handler ParseFlags registered
// (common/cli.h: it ends the process with status 2), it runs before it, when every flag
// that parsed, --log_format too, holds its value. Never freed: std::cerr may point into
// the buffer until the process ends.
struct FlagErrors {
  std::stringbuf buffer;
  std::streambuf* cerr = nullptr;  // std::cerr's own buffer while parsing; null otherwise
  std::vector<std::string> messages;
};
FlagErrors* const flag_errors = new FlagErrors();

void LogFlagErrors() {
  std::cerr.rdbuf(flag_errors->cerr);
  flag_errors->cerr = nullptr;
  const spgate::server::LogFormat format = absl::GetFlag(FLAGS_log_format);
  if (format == spgate::server::LogFormat::kText) {
    std::cerr << flag_errors->buffer.str() << std::flush;  // absl's lines, as they were
    return;
  }
  spgate::server::SetLogFormat(format);
  for (const std::string& message : flag_errors->messages) {
    spgate::server::Log(spgate::server::LogLevel::kError, message,
                        {{"event", "usage_error"}, {"error", message}});
  }
}

std::vector<char*> ParseFlagsIntoTheLog(int argc, char** argv) {
  flag_errors->cerr = std::cerr.rdbuf(&flag_errors->buffer);
  std::vector<char*> rest = spgate::ParseFlags(argc, argv);
  // Parsed: whatever else absl wrote goes out as it was.
  std::cerr.rdbuf(flag_errors->cerr);
  flag_errors->cerr = nullptr;
  std::cerr << flag_errors->buffer.str() << std::flush;
  return rest;
}

}  // namespace

// absl/flags/usage_config.h: called for each fatal usage error, right after absl wrote it
// to std::cerr and before it exits (a weak symbol of absl's, which this one replaces).
extern "C" void ABSL_INTERNAL_C_SYMBOL(AbslInternalReportFatalUsageError)(absl::string_view msg) {
  if (flag_errors->cerr == nullptr) return;  // not while ParseFlagsIntoTheLog parses
  if (flag_errors->messages.empty()) std::atexit(LogFlagErrors);
  flag_errors->messages.emplace_back(msg);
}

int main(int argc, char** argv) {
  spgate::DisableMutexDeadlockDetection();
  spgate::InitFlagsUsage("spgated");
  absl::SetProgramUsageMessage("decides per batch and TP group between sequence "
                               "parallel and tensor-parallel-only execution.");
  std::vector<char*> rest = ParseFlagsIntoTheLog(argc, argv);
  spgate::server::SetLogFormat(absl::GetFlag(FLAGS_log_format));
  spgate::server::RouteGrpcLogs();
  // Usage errors in --log_format too (text: "spgated: ...", as before).
  auto usage = [](const std::string& error) {
    spgate::server::Log(spgate::server::LogLevel::kError, error,
                        {{"event", "usage_error"}, {"error", error}});
    return 2;
  };
  if (rest.size() > 1) {
    return usage(absl::StrCat("unexpected argument '", rest[1],
                              "' (flags take the form --name=value)"));
  }

  // Block the signals before any thread starts so that only sigwait below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const spgate::server::DaemonOptions opts = DaemonOptionsFromFlags();
  if (const std::string error = FlagRangeError(opts); !error.empty()) return usage(error);
  auto daemon = spgate::server::Daemon::Start(opts);
  if (!daemon.ok()) {
    spgate::server::Log(spgate::server::LogLevel::kError,
                        "cannot start: " + std::string(daemon.status().message()),
                        {{"event", "start_failed"}, {"error", std::string(daemon.status().message())}});
    return 1;
  }
  return ServeUntilSignalled(**daemon, signals);
}
