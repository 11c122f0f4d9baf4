// The worker client's options and the one table of them. Every surface that lists "the
// client's options" reads them from here: the GateClientOptions struct itself, the C
// API's spgate_options_set (by name, from text), the Python keyword arguments of
// spgate.Client (and, through a test, python/spgate/_spgate.pyi), and spgate-worker's
// flags that hand options on (defaults and help). Adding an option is one line in
// SPGATE_CLIENT_OPTIONS; its surface column says how far out it is exposed.
//
// Invariant: every default is written once, in the table; a surface that shows or parses
// a default gets it from GateClientOptions{} through the row, never from a literal of
// its own.
//
// Usage:
//   for (const spgate::client::ClientOption& row : spgate::client::kClientOptions) {
//     std::cout << CApiOptionName(row) << " = " << ClientOptionDefaultText(row) << "\n";
//   }
//   GateClientOptions o;
//   const ClientOption* row = FindCApiOption("decision_deadline_ms");  // null if unknown
//   RETURN_IF_ERROR(SetClientOptionFromText(o, *row, "50"));          // 50 ms
#ifndef SPGATE_WORKER_CLIENT_CLIENT_OPTIONS_H_
#define SPGATE_WORKER_CLIENT_CLIENT_OPTIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "policy/gate_config.h"
#include "policy/step_plan.h"

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace spgate::client {

// How far out an option is exposed; each surface includes the ones before it.
enum class ClientOptionSurface : uint8_t {
  kCxx,         // GateClientOptions only (tuning knobs)
  kCApi,        // also spgate_options_set
  kCApiPython,  // also spgate.Client(...) keyword arguments
};

// X(type, name, default, unit, surface, help), in the order of spgate.Client's keyword
// arguments. `unit` is the unit of the number the C API's text takes: a duration
// (absl::Duration in C++, seconds in Python) is set there as `name`_ms, in milliseconds.
#define SPGATE_CLIENT_OPTIONS(X)                                                            \
  X(std::string, job_id, "", "", kCApiPython, "the job's id, as spgated and spgatectl show it") \
  X(std::string, controller, "", "", kCApiPython,                                            \
    "spgated's worker API address host:port; empty: no daemon, the leader decides every "    \
    "step with the local policy (source local, the gate's own reason)")                      \
  X(std::string, incarnation, "", "", kCApiPython,                                           \
    "one launch of the job (docs/design.md §10): the same on every rank, new on every "       \
    "relaunch; required with a controller")                                                  \
  X(std::string, launch_credential, "", "", kCApiPython,                                     \
    "the launch's secret (docs/design.md §10): 16-128 printable ASCII characters, the same "  \
    "on every rank, made by world rank 0 (NewLaunchCredential) and broadcast unless "        \
    "SPGATE_LAUNCH_CREDENTIAL sets it; required with a controller")                          \
  X(std::string, worker_token, "", "", kCApiPython,                                          \
    "shared worker credential of a daemon run with --worker_token_file; empty: none")        \
  X(int, group, 0, "", kCApiPython, "TP group index")                                         \
  X(int, rank_in_group, 0, "", kCApiPython,                                                  \
    "rank in the TP group; 0 is the leader, the only rank that submits plans")               \
  X(int, group_size, 1, "ranks", kCApiPython, "ranks in the TP group (t)")                   \
  X(int, global_rank, 0, "", kCApiPython, "world rank")                                       \
  X(bool, group_session, true, "", kCApiPython,                                             \
    "the leader's session speaks for its TP group (docs/design.md §2): one session and one " \
    "telemetry record per step for the group, reduced in the group by "                     \
    "GroupDecider::ReportTelemetry, so the other ranks need no client; false: every rank "   \
    "registers and reports its own record (per-rank sessions)")                              \
  X(std::string, host, "", "", kCApiPython, "host reported to spgated; empty: the host name") \
  X(std::string, hardware_id, "", "", kCApiPython,                                           \
    "the kind of hardware, reported to spgated as part of the learned tables' relaunch key " \
    "(docs/operations.md, \"What persists\"); at most 128 printable ASCII characters; "      \
    "empty: SPGATE_HARDWARE_ID, else detected (a CUDA worker's GPU, else \"cpu:\" and the "   \
    "CPU model)")                                                                             \
  X(uint64_t, memory_budget_bytes, 0, "bytes", kCApiPython,                                  \
    "device memory budget of the memory gate for plans that carry none; 0: none")            \
  X(absl::Duration, decision_deadline, absl::Milliseconds(20), "ms", kCApiPython,            \
    "how long AwaitDecision(step) waits for the daemon's answer before deciding locally "    \
    "(docs/design.md §4)")                                                                   \
  X(absl::Duration, rpc_timeout, absl::Seconds(2), "ms", kCApiPython,                        \
    "deadline of each Register call")                                                        \
  X(absl::Duration, initial_backoff, absl::Milliseconds(100), "ms", kCApiPython,             \
    "first reconnect backoff; initial * 2^attempt, capped at max_backoff")                   \
  X(absl::Duration, max_backoff, absl::Seconds(5), "ms", kCApiPython,                        \
    "longest reconnect backoff")                                                             \
  X(int, telemetry_buffer, 4096, "records", kCApiPython,                                     \
    "telemetry records kept while the stream is busy or down; beyond it the oldest are "     \
    "dropped and counted (telemetry_dropped)")                                               \
  X(uint64_t, seed, 0, "", kCApiPython, "seed of the backoff jitter; 0: random")             \
  X(double, backoff_jitter, 0.2, "", kCxx,                                                   \
    "each backoff is multiplied by a uniform factor in [1 - jitter, 1 + jitter]")            \
  X(absl::Duration, keepalive_time, absl::Seconds(10), "ms", kCxx,                           \
    "HTTP/2 keepalive ping interval (spgated accepts pings every >= 5 s, also without "      \
    "calls; 10 s detects a dead peer in ~15 s on a quiet stream)")                           \
  X(absl::Duration, keepalive_timeout, absl::Seconds(5), "ms", kCxx,                         \
    "how long a keepalive ping may go unanswered")                                           \
  X(absl::Duration, telemetry_flush_interval, absl::ZeroDuration(), "ms", kCxx,              \
    "0: telemetry goes out with the next write (within the shared runtime's 0.5 ms poll); "  \
    "> 0: batched up to this long unless a message's worth is pending")                      \
  X(int, max_telemetry_per_message, 512, "records", kCxx,                                    \
    "telemetry records in one WorkerMessage")                                                \
  X(int, max_pending_plans, 1024, "plans", kCxx,                                             \
    "plans kept for steps not yet decided (pipelining depth); older ones are dropped")       \
  X(bool, rs_wait_from_own_telemetry, true, "", kCxx,                                        \
    "feed the fallback's rolling wait share with this rank's own telemetry until the "       \
    "trainer calls ObserveGroupRsWaitShare (local_policy.h)")

// The model's shape, reported to spgated at Register: GateClientOptions::model.
#define SPGATE_CLIENT_MODEL_OPTIONS(X)                                         \
  X(int, layers, 0, "", kCApi, "model shape reported to spgated: transformer blocks") \
  X(int, hidden, 0, "", kCApi, "model shape: hidden size")                     \
  X(int, heads, 0, "", kCApi, "model shape: attention heads")                  \
  X(int, ffn_hidden, 0, "", kCApi, "model shape: MLP hidden size")

struct GateClientOptions {
#define SPGATE_CLIENT_OPTION_MEMBER_(type, name, def, unit, surface, help) type name = def;
  SPGATE_CLIENT_OPTIONS(SPGATE_CLIENT_OPTION_MEMBER_)
  struct Model {
    SPGATE_CLIENT_MODEL_OPTIONS(SPGATE_CLIENT_OPTION_MEMBER_)
  } model;
#undef SPGATE_CLIENT_OPTION_MEMBER_

  // Outside the table, because they are not plain values:
  // Config used until the daemon's arrives (and forever without a daemon). Its fields
  // have their own table (kGateFields, policy/gate_config.h); the C API sets them by
  // those names.
  GateConfig initial_config;
  // Optional: a channel to use (e.g. shared by the ranks of one simulated process);
  // otherwise one is created with `credentials` (insecure when null; TlsChannelCredentials
  // in tls.h builds them from the --tls_* settings) and, when set, `tls_server_name` as
  // the name checked in the daemon's certificate instead of the host of `controller`. The
  // C API and Python take the TLS settings as tls_* / tls= and build these two.
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;
  // Pipelined jobs (docs/design.md §12): the job's layout (tp = group_size) and where this
  // rank's TP group sits in it; with a layout the leader submits step plans (one entry per
  // micro-batch) and gets one decision per micro-batch. None: pp = 1, plain plans.
  std::optional<JobLayout> layout;
  StageCoordinates coordinates;
  // Features this rank runs that need SP for the whole job (names of [a-z0-9_]; at most
  // 8): every decision is SP, reason SP_REQUIRED, from the daemon and the fallback.
  std::vector<std::string> sp_required;
};

// What a row holds; picks the member's C++ type.
enum class ClientOptionType : uint8_t { kText, kInt, kUint64, kReal, kFlag, kDuration };

// One row of the option table.
struct ClientOption {
  std::string_view name;  // the member's name (the Python keyword)
  ClientOptionType type;
  std::string_view unit;
  ClientOptionSurface surface;
  std::string_view help;
  // The member in `options`, of the C++ type `type` names (ClientOptionRef reads it).
  void* (*member)(GateClientOptions& options);

  constexpr bool in_c_api() const { return surface >= ClientOptionSurface::kCApi; }
  constexpr bool in_python() const { return surface >= ClientOptionSurface::kCApiPython; }
};

namespace internal {
template <typename T>
struct ClientOptionTypeOf;
template <> struct ClientOptionTypeOf<std::string> {
  static constexpr ClientOptionType kType = ClientOptionType::kText;
};
template <> struct ClientOptionTypeOf<int> {
  static constexpr ClientOptionType kType = ClientOptionType::kInt;
};
template <> struct ClientOptionTypeOf<uint64_t> {
  static constexpr ClientOptionType kType = ClientOptionType::kUint64;
};
template <> struct ClientOptionTypeOf<double> {
  static constexpr ClientOptionType kType = ClientOptionType::kReal;
};
template <> struct ClientOptionTypeOf<bool> {
  static constexpr ClientOptionType kType = ClientOptionType::kFlag;
};
template <> struct ClientOptionTypeOf<absl::Duration> {
  static constexpr ClientOptionType kType = ClientOptionType::kDuration;
};
}  // namespace internal

// The C++ type of a row's member.
template <ClientOptionType> struct ClientOptionCxx;
template <> struct ClientOptionCxx<ClientOptionType::kText> { using type = std::string; };
template <> struct ClientOptionCxx<ClientOptionType::kInt> { using type = int; };
template <> struct ClientOptionCxx<ClientOptionType::kUint64> { using type = uint64_t; };
template <> struct ClientOptionCxx<ClientOptionType::kReal> { using type = double; };
template <> struct ClientOptionCxx<ClientOptionType::kFlag> { using type = bool; };
template <> struct ClientOptionCxx<ClientOptionType::kDuration> { using type = absl::Duration; };

#define SPGATE_CLIENT_OPTION_ROW_(path, type, name, def, unit, surface, help)          \
  ClientOption{#name, internal::ClientOptionTypeOf<type>::kType, unit,                  \
               ClientOptionSurface::surface, help,                                      \
               +[](GateClientOptions& o) -> void* { return &o.path; }},
#define SPGATE_CLIENT_OPTION_TOP_ROW_(type, name, def, unit, surface, help) \
  SPGATE_CLIENT_OPTION_ROW_(name, type, name, def, unit, surface, help)
#define SPGATE_CLIENT_OPTION_MODEL_ROW_(type, name, def, unit, surface, help) \
  SPGATE_CLIENT_OPTION_ROW_(model.name, type, name, def, unit, surface, help)
inline constexpr auto kClientOptions = std::to_array<ClientOption>({
    SPGATE_CLIENT_OPTIONS(SPGATE_CLIENT_OPTION_TOP_ROW_)
    SPGATE_CLIENT_MODEL_OPTIONS(SPGATE_CLIENT_OPTION_MODEL_ROW_)
});
#undef SPGATE_CLIENT_OPTION_MODEL_ROW_
#undef SPGATE_CLIENT_OPTION_TOP_ROW_
#undef SPGATE_CLIENT_OPTION_ROW_

// The row's member in `options`, as its C++ type. T must be the row's type.
template <typename T>
T& ClientOptionRef(GateClientOptions& options, const ClientOption& row) {
  static_assert(sizeof(internal::ClientOptionTypeOf<T>) > 0);
  return *static_cast<T*>(row.member(options));
}
template <typename T>
const T& ClientOptionRef(const GateClientOptions& options, const ClientOption& row) {
  return *static_cast<const T*>(row.member(const_cast<GateClientOptions&>(options)));
}

// The row named `name` (a member name, e.g. "decision_deadline"); null if unknown.
const ClientOption* FindClientOption(std::string_view name);

// The name the C API sets a row by: its name, or name_ms for a duration.
std::string CApiOptionName(const ClientOption& row);
// The row the C API's `name` sets (rows in_c_api() only); null if none.
const ClientOption* FindCApiOption(std::string_view name);

// Sets the row's member from the C API's text: an integer (a duration in milliseconds),
// a finite number, true/false, or the text itself. INVALID_ARGUMENT naming the option
// ("group_size: not an integer: \"two\"") when the text is not one, or a negative value
// of an unsigned or duration option, or an int out of range; the options' own ranges are
// checked by GateClient::Create.
absl::Status SetClientOptionFromText(GateClientOptions& options, const ClientOption& row,
                                     std::string_view text);

// The row's value in `options` as text in the C API's unit ("20" for 20 ms, "4096",
// "0.2", "true", "" for empty text); ClientOptionDefaultText is that of the default.
std::string ClientOptionText(const GateClientOptions& options, const ClientOption& row);
std::string ClientOptionDefaultText(const ClientOption& row);

// The help text of the row named `name` ("" if unknown): for the flags of the client
// binaries that hand an option on (a literal, so NUL-terminated).
const char* ClientOptionHelp(std::string_view name);

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_CLIENT_OPTIONS_H_
