// spgatectl's command line, turned into admin API requests without touching the
// network. ParseCommandLine is pure (arguments in, an Invocation out), so every flag,
// default and refusal is unit-tested; main.cc only sends the request and prints.
//
// A usage error names the flag or argument at fault ("--mode: \"fast\" is not a mode
// (want sp or tp)"); the values the server judges (ranges) are left to the server, whose
// INVALID_ARGUMENT names the field.
//
// Usage:
//   spgate::ctl::Invocation inv;
//   absl::Status s = spgate::ctl::ParseCommandLine({"gates", "set", "--max_length_cv=0.2"}, &inv);
//   // inv.command == Command::kGatesSet, inv.gates_set.update_mask().paths() == {"max_length_cv"}
#ifndef SPGATE_TOOLS_SPGATECTL_COMMANDS_H_
#define SPGATE_TOOLS_SPGATECTL_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::ctl {

// Exit codes: usage errors and RPC errors are told apart so scripts can retry only
// the latter.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;

inline constexpr absl::string_view kDefaultAdminAddress = "127.0.0.1:50062";

enum class OutputFormat { kTable, kJson, kYaml };

// Flags every command accepts.
struct GlobalOptions {
  std::string admin = std::string(kDefaultAdminAddress);
  std::string token_file;       // sent as "authorization: Bearer <token>"
  std::string tls_ca;           // PEM roots; with it (or a client cert) the channel is TLS
  std::string tls_cert;         // client certificate for mTLS (needs tls_key)
  std::string tls_key;
  std::string tls_server_name;  // overrides the name checked against the server cert
  absl::Duration timeout = absl::Seconds(5);  // the command's deadline: all its unary calls
  OutputFormat output = OutputFormat::kTable;

  bool UseTls() const { return !tls_ca.empty() || !tls_cert.empty(); }
};

enum class Command {
  kHelp,        // print `help` and exit 0
  kVersion,     // --version: print `help` (the version line) and exit 0
  kCompletion,  // completion bash|zsh: print `help` (the script) and exit 0
  kGatesGet,
  kGatesSet,
  kJobsList,
  kJobsShow,
  kJobsForget,
  kPin,
  kUnpin,
  kWatch,
  kEval,
  kGatesHistory,
  kGatesRollback,
};

// One parsed command line. Only the request of `command` is filled in.
struct Invocation {
  Command command = Command::kHelp;
  std::string name;  // "gates set": used in messages and for `<name> --help`
  GlobalOptions global;
  std::string help;  // kHelp, kVersion, kCompletion: the text to print

  v1::GetGateConfigRequest gates_get;
  v1::UpdateGateConfigRequest gates_set;
  v1::ListJobsRequest jobs_list;
  v1::GetJobRequest jobs_show;
  v1::ForgetJobRequest jobs_forget;
  v1::PinModeRequest pin;
  v1::UnpinRequest unpin;
  v1::WatchDecisionsRequest watch;
  int64_t watch_count = 0;  // stop after this many decisions; 0: until interrupted
  v1::EvaluateGatesRequest eval;
  v1::ListConfigHistoryRequest gates_history;
  v1::RollbackGateConfigRequest gates_rollback;
};

// The value of an environment variable; nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view name)>;

// Parses argv[1..] into `out`. On a usage error returns INVALID_ARGUMENT whose message
// names the flag, environment variable or argument; `out->name` is set to the command as
// far as it was recognised (empty when not even the command was), for "see spgatectl
// <name> --help". An unknown command, subcommand or flag suggests the nearest known one.
//
// The global flags that name the daemon and the credentials (--admin, --token_file,
// --tls_*, --timeout) are also read from SPGATE_<FLAG> (SPGATE_ADMIN, SPGATE_TLS_CA, ...)
// through `env`: a flag on the command line wins over the variable, the variable over the
// default; an empty variable counts as unset. Without `env`, no variable is read.
absl::Status ParseCommandLine(const std::vector<std::string>& args, const EnvLookup& env,
                              Invocation* out);
absl::Status ParseCommandLine(const std::vector<std::string>& args, Invocation* out);

// getenv as an EnvLookup, for main.
std::optional<std::string> ProcessEnv(absl::string_view name);

// `spgatectl completion SHELL`'s script (SHELL bash or zsh), generated from the command
// table and the flags, so a new command or flag completes without editing it.
absl::StatusOr<std::string> CompletionScript(absl::string_view shell);

// The top-level help (every command, the global flags).
std::string MainHelp();

}  // namespace spgate::ctl

#endif  // SPGATE_TOOLS_SPGATECTL_COMMANDS_H_
