// The daemon's log: one line per event on stderr. Text (the default) reads
// "spgated: <message>"; --log_format=json writes one JSON object per line with four keys,
// "time" (RFC 3339, UTC, microseconds), "level" ("info", "warning", "error"), "message"
// (the text line's words) and "fields" (the event's values as typed key/values), for log
// pipelines that parse instead of grep. Every daemon log line goes through Log.
//
// Usage:
//   spgate::server::SetLogFormat(spgate::server::LogFormat::kJson);
//   Log(LogLevel::kInfo, "reloaded /etc/spgate/gates.textproto",
//       {{"event", "config_reloaded"}, {"path", path}});
#ifndef SPGATE_SERVER_LOG_H_
#define SPGATE_SERVER_LOG_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/token_bucket.h"

namespace spgate::server {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// One key/value of an event. The value keeps its JSON type: a string, an integer or a
// boolean.
struct LogField {
  LogField(std::string k, std::string_view v);
  LogField(std::string k, const char* v) : LogField(std::move(k), std::string_view(v)) {}
  LogField(std::string k, int64_t v);
  LogField(std::string k, int v) : LogField(std::move(k), static_cast<int64_t>(v)) {}
  LogField(std::string k, bool v);

  std::string key;
  std::string json;  // the value as JSON text
};

// --log_format's values: "text" or "json".
bool AbslParseFlag(absl::string_view text, LogFormat* format, std::string* error);
std::string AbslUnparseFlag(LogFormat format);

// Process-wide; set once at start-up, before the daemon's threads log.
void SetLogFormat(LogFormat format);

// Sends gRPC's own log lines (a refused TLS handshake, a port in use: those at or above
// GRPC_VERBOSITY, ERROR by default) through Log, so that --log_format=json is JSON on
// every line: "grpc (FILE:LINE): MESSAGE", with event "grpc", file and line as fields.
// gRPC's ERROR lines are held to GrpcLogLimit's rate per log site: any peer can make a
// refused handshake, and one line each let it write the daemon's log as fast as it
// connects. Lines below ERROR (GRPC_VERBOSITY=INFO/DEBUG, GRPC_TRACE) are not held: an
// operator asked for them.
void RouteGrpcLogs();

// Writes, for each gRPC log site that has gone quiet with lines held back (GrpcLogLimit::
// TakeQuiet at `now`), one line saying how many: a flood that stops has no next line to
// carry its count. The daemon calls it from its housekeeping timer and, with
// absl::InfiniteFuture(), at shutdown.
void FlushHeldGrpcLogs(absl::Time now);

// A token bucket per log site (gRPC's FILE:LINE): kBurst lines at once, then one every
// kRefill. Admit says whether a line at (`file`, `line`) goes out now and, when it does,
// how many lines of that site were held back since the last one that went out (the line
// says so). `file` is gRPC's __FILE__, a literal: the key is its address, no copy. Not
// thread-safe: RouteGrpcLogs serialises it.
class GrpcLogLimit {
 public:
  static constexpr double kBurst = 10;
  static constexpr absl::Duration kRefill = absl::Seconds(6);  // 10 a minute, sustained

  struct Verdict {
    bool emit = false;
    int64_t held_back = 0;  // lines of this site not written since its last one
  };
  Verdict Admit(const char* file, int line, absl::Time now);

  // The sites whose held lines no later line of theirs will report: some held back and
  // none of theirs for kRefill at `now` (a line after that goes out and says so itself).
  // Their counts are taken: a later line of the site starts from 0.
  struct Quiet {
    const char* file = nullptr;
    int line = 0;
    int64_t held_back = 0;
  };
  std::vector<Quiet> TakeQuiet(absl::Time now);

 private:
  struct Site {
    TokenBucket bucket;
    int64_t held_back = 0;
    absl::Time last_held;  // the newest line held back
  };
  std::map<std::pair<const char*, int>, Site> sites_;  // gRPC's log sites: a few dozen
};

// Writes one line to stderr in the current format (a single write, so lines from
// different threads do not interleave).
void Log(LogLevel level, std::string_view message, const std::vector<LogField>& fields = {});
inline void Log(std::string_view message) { Log(LogLevel::kInfo, message); }

// The line Log writes, ending in '\n'. Text: "spgated: [WARNING: ]message".
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          std::string_view message, const std::vector<LogField>& fields);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_LOG_H_
