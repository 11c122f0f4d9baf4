// spgatectl's output: admin API responses rendered as aligned tables for people or as
// JSON (or the same document as YAML) for scripts (protobuf's JSON mapping with the proto field names, every field
// printed, so a script sees `"removed": 0` rather than a missing key). Pure functions of
// the response (and of `now` where a table shows "in 9m58s"), so they are unit-tested.
//
// Usage:
//   std::cout << spgate::ctl::FormatGateConfig(response, OutputFormat::kTable);
//   std::cerr << spgate::ctl::FormatRpcError("gates set", grpc::StatusCode::ABORTED, msg);
#ifndef SPGATE_TOOLS_SPGATECTL_FORMAT_H_
#define SPGATE_TOOLS_SPGATECTL_FORMAT_H_

#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "spgate/v1/admin.pb.h"
#include "tools/spgatectl/commands.h"

namespace spgate::ctl {

// An aligned text table: columns separated by two spaces, numbers right-aligned.
class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string name;
    Align align = Align::kLeft;
  };

  explicit Table(std::vector<Column> columns);
  void AddRow(std::vector<std::string> cells);  // missing cells are blank
  std::string Render() const;                   // header + rows, each ending in '\n'

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Protobuf JSON with the proto field names and every field printed. `multiline` adds
// indentation; without it the object is on one line (watch prints one per decision).
std::string ToJson(const google::protobuf::Message& message, bool multiline = true);
// ToJson for kJson; for kYaml the same document as YAML (yaml.h).
std::string ToStructured(const google::protobuf::Message& message, OutputFormat format);

// "sp", "tp_only" (the metrics' labels) and lower-case reason names ("length_cv").
std::string ModeName(v1::Mode mode);
std::string ReasonName(v1::Reason reason);
// gRPC status code name: "INVALID_ARGUMENT", "ABORTED", ...
std::string StatusCodeName(int code);

// "spgatectl: <command>: <CODE>: <message>\n" — how a refused call is reported.
std::string FormatRpcError(absl::string_view command, int code, absl::string_view message);
// A line after an UNAVAILABLE of a connection that never opened whose last reason is
// gRPC's "Socket closed": the daemon ended the connection during its handshake, which is what a TLS port refusing this client looks
// like (no client certificate, one from another CA, plaintext against TLS); empty for
// anything else. `tls`: whether the call spoke TLS (TlsClientOptions::enabled).
std::string HandshakeHint(int code, absl::string_view message, bool tls);

std::string FormatGateConfig(const v1::VersionedGateConfig& config, OutputFormat format);
// Jobs and a job. A count newer than the daemon that answered reads 0 (proto3 scalars
// have no presence); where the older fields prove it is not 0 — decisions without
// group-steps, a MODES row's group-steps without micro-batches — it is unknown: the
// tables print "-" and a note, JSON and YAML null (the key stays).
std::string FormatJobList(const v1::ListJobsResponse& jobs, OutputFormat format);
std::string FormatJob(const v1::Job& job, OutputFormat format, absl::Time now);
bool GroupStepsUnreported(const v1::JobSummary& summary);
bool MicrobatchesUnreported(const v1::ModeStats& mode);
inline constexpr absl::string_view kGroupStepsUnreportedNote =
    "(daemon does not report group-steps; upgrade spgated)";
inline constexpr absl::string_view kMicrobatchesUnreportedNote =
    "(daemon does not report micro-batches per mode; upgrade spgated)";
// Those notes, a line each, for the counts `jobs` / `job` leaves unknown ("" for none):
// under JSON or YAML they go to stderr, so that stdout stays one document.
std::string UnreportedNote(const v1::ListJobsResponse& jobs);
std::string UnreportedNote(const v1::Job& job);
std::string FormatPin(const v1::Pin& pin, OutputFormat format, absl::Time now);
std::string FormatUnpin(const v1::UnpinRequest& request, const v1::UnpinResponse& response,
                        OutputFormat format);
std::string FormatForgetJob(const v1::ForgetJobRequest& request,
                            const v1::ForgetJobResponse& response, OutputFormat format);
// One line (ending in '\n') per decision, for watch.
std::string FormatDecisionLine(const v1::Decision& decision, OutputFormat format);
// The audit log page: a table (TIME, VERSION, SCOPE, PRINCIPAL, CALL, CHANGE) and, when
// older entries exist, the --page_token to ask for them.
std::string FormatHistory(const v1::ListConfigHistoryResponse& history, OutputFormat format);
// The decision, the reason chain and, when the daemon sent them, the same batch under
// each policy (format_eval.cc).
std::string FormatEvaluation(const v1::EvaluateGatesResponse& response, OutputFormat format);
// A value a gate compared with `other` (its threshold, or the value it was compared
// with): four significant digits, or as many as tell it from `other` when they differ,
// so that a firing row never reads "fire 0.22 0.22". The eval table and the head above
// it both print through it.
std::string ComparedText(double value, double other);

// Where the daemon stands with a job, as GetJob tells: a launch of it runs; it is listed
// for its operator settings alone (overrides or pins set ahead of a launch, or kept after
// a forget); it is unknown (NOT_FOUND); or the lookup failed (nothing to say).
enum class JobPresence { kRunning, kNoLaunch, kUnknown, kUnsure };
// The stderr line of `command` (gates set, gates rollback, watch) about a job no launch
// of which runs, so that a mistyped job id shows; `then` says what becomes of the
// request. "" for kRunning and kUnsure.
std::string JobPresenceNote(absl::string_view command, absl::string_view job,
                            JobPresence presence, absl::string_view then);

// After `pin` (an unforced TP-only pin) succeeded: the stderr line of `command` when the
// memory gate held a pinned group in SP at its last decision (its reason in `job`,
// GetJob's answer: memory_requires_sp or memory_over_budget). Such a pin yields to that
// gate while TP-only does not fit, so its decisions keep the memory reason; the line
// names --force. "" otherwise (an SP or forced pin, no such group).
std::string MemoryGateNote(absl::string_view command, const v1::PinModeRequest& pin,
                           const v1::Job& job);

// Shared by the formatters: "max_length_cv=0.2 window_steps=10" for the fields set in
// `config`, `per_line` to a line (0: all on one); and a two-column "key  value" block,
// a value's further lines indented under its first.
std::string SetFieldsText(const v1::GateConfig& config, int per_line = 0);
std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& rows);

}  // namespace spgate::ctl

#endif  // SPGATE_TOOLS_SPGATECTL_FORMAT_H_
