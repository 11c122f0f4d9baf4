// The daemon's log lines; see log.h.
#include "server/log.h"

#include <grpc/support/log.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace spgate::server {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// A JSON string literal. Bytes that are not UTF-8 (a file name can hold any) become
// U+FFFD, so every line stays valid JSON.
std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const size_t n = Utf8Length(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
    i += n;
  }
  return out + "\"";
}

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

}  // namespace

LogField::LogField(std::string k, std::string_view v) : key(std::move(k)), json(JsonString(v)) {}
LogField::LogField(std::string k, int64_t v) : key(std::move(k)), json(absl::StrCat(v)) {}
LogField::LogField(std::string k, bool v) : key(std::move(k)), json(v ? "true" : "false") {}

bool AbslParseFlag(absl::string_view text, LogFormat* format, std::string* error) {
  if (text == "text") {
    *format = LogFormat::kText;
  } else if (text == "json") {
    *format = LogFormat::kJson;
  } else {
    *error = absl::StrCat("\"", text, "\" is not a log format (want text or json)");
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

void SetLogFormat(LogFormat format) { g_format.store(format, std::memory_order_relaxed); }

GrpcLogLimit::Verdict GrpcLogLimit::Admit(const char* file, int line, absl::Time now) {
  auto [it, fresh] = sites_.try_emplace({file, line});
  Site& site = it->second;
  if (fresh) site.bucket = TokenBucket(1.0 / absl::ToDoubleSeconds(kRefill), kBurst, now);
  if (!site.bucket.TryTake(now)) {
    ++site.held_back;
    site.last_held = now;
    return {};
  }
  return {true, std::exchange(site.held_back, 0)};
}

std::vector<GrpcLogLimit::Quiet> GrpcLogLimit::TakeQuiet(absl::Time now) {
  std::vector<Quiet> quiet;
  for (auto& [key, site] : sites_) {
    if (site.held_back > 0 && now - site.last_held >= kRefill) {
      quiet.push_back({key.first, key.second, std::exchange(site.held_back, 0)});
    }
  }
  return quiet;
}

namespace {

// RouteGrpcLogs' limiter and its lock, shared with FlushHeldGrpcLogs.
ABSL_CONST_INIT absl::Mutex g_grpc_limit_mu(absl::kConstInit);
GrpcLogLimit& GrpcLimit() {
  static GrpcLogLimit* const limit = new GrpcLogLimit();
  return *limit;
}

// One of gRPC's lines as the daemon writes it: "grpc (FILE:LINE): MESSAGE", FILE the
// source file's name without its directory.
void LogGrpc(LogLevel level, const char* path, int line, std::string_view message,
             int64_t held_back) {
  const char* slash = path == nullptr ? nullptr : std::strrchr(path, '/');
  const std::string file = slash != nullptr ? slash + 1 : (path ? path : "");
  std::vector<LogField> fields = {{"event", "grpc"}, {"file", file}, {"line", line}};
  if (held_back > 0) fields.emplace_back("held_back", held_back);
  const absl::string_view text(message.data(), message.size());
  Log(level, absl::StrCat("grpc (", file, ":", line, "): ", text), fields);
}

}  // namespace

void RouteGrpcLogs() {
  gpr_set_log_function([](gpr_log_func_args* args) {
    const bool error = args->severity == GPR_LOG_SEVERITY_ERROR;
    GrpcLogLimit::Verdict v{true, 0};
    if (error) {
      absl::MutexLock lock(&g_grpc_limit_mu);
      v = GrpcLimit().Admit(args->file, args->line, absl::Now());
    }
    if (!v.emit) return;
    // A refused handshake or a port in use is gRPC's ERROR: the daemon's warning (it goes
    // on serving, or says why it cannot start on a line of its own).
    const std::string held =
        v.held_back > 0
            ? absl::StrCat(" (", v.held_back, " more from here not logged since the last)")
            : "";
    LogGrpc(error ? LogLevel::kWarning : LogLevel::kInfo, args->file, args->line,
            absl::StrCat(args->message, held), v.held_back);
  });
}

void FlushHeldGrpcLogs(absl::Time now) {
  std::vector<GrpcLogLimit::Quiet> quiet;
  {
    absl::MutexLock lock(&g_grpc_limit_mu);
    quiet = GrpcLimit().TakeQuiet(now);
  }
  for (const GrpcLogLimit::Quiet& q : quiet) {
    LogGrpc(LogLevel::kWarning, q.file, q.line,
            absl::StrCat(q.held_back, " more from here not logged; none since"), q.held_back);
  }
}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          std::string_view message, const std::vector<LogField>& fields) {
  if (format == LogFormat::kText) {
    // As the daemon always wrote them: only a warning is marked ("cannot start: ..." says
    // what it is on its own).
    const absl::string_view prefix = level == LogLevel::kWarning ? "WARNING: " : "";
    return absl::StrCat("spgated: ", prefix, absl::string_view(message.data(), message.size()),
                        "\n");
  }
  std::string out = absl::StrCat(
      "{\"time\":\"", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone()),
      "\",\"level\":\"", LevelName(level), "\",\"message\":", JsonString(message),
      ",\"fields\":{");
  for (size_t i = 0; i < fields.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", JsonString(fields[i].key), ":", fields[i].json);
  }
  return out + "}}\n";
}

void Log(LogLevel level, std::string_view message, const std::vector<LogField>& fields) {
  const std::string line =
      FormatLogLine(g_format.load(std::memory_order_relaxed), absl::Now(), level, message, fields);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace spgate::server
