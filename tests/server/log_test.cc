// The daemon's log lines (server/log.h): text as before, JSON as one object per line with
// time, level, message and typed fields, whatever bytes the message holds.
#include "server/log.h"

#include <algorithm>

#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace spgate::server {
namespace {

using ::testing::HasSubstr;

const absl::Time kTime = absl::FromUnixMicros(1700000000123456);

TEST(LogLine, Text) {
  struct Case {
    LogLevel level;
    std::string line;
  };
  for (const Case& c : {Case{LogLevel::kInfo, "spgated: reloaded x\n"},
                        Case{LogLevel::kWarning, "spgated: WARNING: reloaded x\n"},
                        Case{LogLevel::kError, "spgated: reloaded x\n"}}) {
    EXPECT_EQ(FormatLogLine(LogFormat::kText, kTime, c.level, "reloaded x", {{"path", "x"}}), c.line);
  }
}

TEST(LogLine, JsonParsesWithTheFourKeysAndTypedFields) {
  struct Case {
    std::string message;
    std::string parsed;  // the message as a JSON parser reads it back
  };
  for (const Case& c : {Case{"plain", "plain"}, Case{"quote \" backslash \\ tab \t nl \n", "quote \" backslash \\ tab \t nl \n"},
                        Case{"caf\xc3\xa9", "caf\xc3\xa9"},
                        Case{"bad \xff byte", "bad \xef\xbf\xbd byte"}}) {
    const std::string line = FormatLogLine(LogFormat::kJson, kTime, LogLevel::kWarning, c.message,
                                           {{"event", "x"}, {"port", 50061}, {"loopback", true}, {"path", c.message}});
    ASSERT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line: " << line;
    google::protobuf::Struct s;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &s).ok()) << line;
    ASSERT_EQ(s.fields_size(), 4) << line;
    EXPECT_EQ(s.fields().at("time").string_value(), "2023-11-14T22:13:20.123456Z");
    EXPECT_EQ(s.fields().at("level").string_value(), "warning");
    EXPECT_EQ(s.fields().at("message").string_value(), c.parsed);
    const auto& f = s.fields().at("fields").struct_value().fields();
    EXPECT_EQ(f.at("event").string_value(), "x");
    EXPECT_EQ(f.at("port").number_value(), 50061);
    EXPECT_TRUE(f.at("loopback").bool_value());
    EXPECT_EQ(f.at("path").string_value(), c.parsed);
  }
}

// gRPC's own lines (a refused handshake, a port in use) go through Log: under
// --log_format=json every stderr line is one JSON object (they were gRPC's "E1206 ..." text
// between the objects).
TEST(LogLine, GrpcLinesAreTheDaemonsLines) {
  grpc_init();  // reads GRPC_VERBOSITY: gRPC logs nothing before
  RouteGrpcLogs();
  SetLogFormat(LogFormat::kJson);
  ::testing::internal::CaptureStderr();
  gpr_log("src/core/tsi/ssl_transport_security.cc", 1501, GPR_LOG_SEVERITY_ERROR,
          "Handshake failed with fatal error %s", "SSL_ERROR_SSL");
  const std::string line = ::testing::internal::GetCapturedStderr();
  SetLogFormat(LogFormat::kText);
  grpc_shutdown();
  google::protobuf::Struct s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &s).ok()) << line;
  EXPECT_EQ(s.fields().at("level").string_value(), "warning");
  EXPECT_EQ(s.fields().at("message").string_value(),
            "grpc (ssl_transport_security.cc:1501): Handshake failed with fatal error SSL_ERROR_SSL");
  const auto& f = s.fields().at("fields").struct_value().fields();
  EXPECT_EQ(f.at("event").string_value(), "grpc");
  EXPECT_EQ(f.at("file").string_value(), "ssl_transport_security.cc");
  EXPECT_EQ(f.at("line").number_value(), 1501);
}

// A flood that stops has no next line to say how many were held back: once a site has
// held none for 6 s its count is taken, once, and FlushHeldGrpcLogs writes it as the
// site's line.
TEST(GrpcLogLimitTest, AFloodThatStopsIsCountedOnceQuiet) {
  GrpcLogLimit limit;
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  const char* const kTsi = "src/core/tsi/ssl_transport_security.cc";
  for (int i = 0; i < 300; ++i) limit.Admit(kTsi, 1501, t0 + absl::Milliseconds(i));
  EXPECT_TRUE(limit.Admit(kTsi, 1502, t0).emit) << "a site with nothing held back";
  const absl::Time last = t0 + absl::Milliseconds(299);
  EXPECT_TRUE(limit.TakeQuiet(last + absl::Seconds(5)).empty())
      << "a line of the site now would go out and say it";
  const std::vector<GrpcLogLimit::Quiet> quiet = limit.TakeQuiet(last + absl::Seconds(6));
  ASSERT_EQ(quiet.size(), 1u);
  EXPECT_EQ(quiet[0].file, kTsi);
  EXPECT_EQ(quiet[0].line, 1501);
  EXPECT_EQ(quiet[0].held_back, 290);
  EXPECT_TRUE(limit.TakeQuiet(last + absl::Seconds(60)).empty()) << "said once";
  const GrpcLogLimit::Verdict next = limit.Admit(kTsi, 1501, last + absl::Seconds(61));
  EXPECT_TRUE(next.emit);
  EXPECT_EQ(next.held_back, 0) << "already said";
}

TEST(LogLine, HeldGrpcLinesAreSaidWhenTheSiteGoesQuiet) {
  grpc_init();
  RouteGrpcLogs();
  // A site of its own (the limiter is the process's; what other tests held back is said
  // first, out of the way): its burst, then one held back.
  ::testing::internal::CaptureStderr();
  FlushHeldGrpcLogs(absl::InfiniteFuture());
  (void)::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  static int line = 7000;  // a fresh site each run (the limiter outlives a test)
  ++line;
  for (int i = 0; i < 11; ++i) {
    gpr_log("src/core/lib/iomgr/tcp_server.cc", line, GPR_LOG_SEVERITY_ERROR, "flood");
  }
  const std::string burst = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(burst.begin(), burst.end(), '\n'), 10) << burst;
  ::testing::internal::CaptureStderr();
  FlushHeldGrpcLogs(absl::Now());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "not quiet yet";
  ::testing::internal::CaptureStderr();
  FlushHeldGrpcLogs(absl::InfiniteFuture());
  FlushHeldGrpcLogs(absl::InfiniteFuture());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            absl::StrCat("spgated: WARNING: grpc (tcp_server.cc:", line,
                         "): 1 more from here not logged; none since\n"));
  grpc_shutdown();
}

// The housekeeping thread flushes beside gRPC's threads logging: every line of a site is
// written or counted once, by a later line of the site or by a flush.
TEST(LogLine, EveryHeldLineIsCountedOnceBesideAFlushingThread) {
  grpc_init();
  RouteGrpcLogs();
  static int base = 9000;  // fresh sites each run (the limiter outlives a test)
  base += 10;
  constexpr int kThreads = 4, kLines = 300;
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) {
        gpr_log("src/core/lib/surface/server.cc", base + t, GPR_LOG_SEVERITY_ERROR, "flood");
      }
    });
  }
  std::thread flusher([] {
    for (int i = 0; i < 200; ++i) FlushHeldGrpcLogs(absl::InfiniteFuture());
  });
  for (std::thread& th : threads) th.join();
  flusher.join();
  FlushHeldGrpcLogs(absl::InfiniteFuture());
  const std::string out = ::testing::internal::GetCapturedStderr();
  grpc_shutdown();
  for (int t = 0; t < kThreads; ++t) {
    const std::string site = absl::StrCat("grpc (server.cc:", base + t, "): ");
    int64_t accounted = 0;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (!absl::StartsWith(line, absl::StrCat("spgated: WARNING: ", site))) continue;
      line.remove_prefix(absl::string_view("spgated: WARNING: ").size() + site.size());
      int64_t n = 0;
      if (absl::StartsWith(line, "flood")) {
        ++accounted;  // a line written, and the held ones it says
        const size_t open = line.find(" (");
        if (open != absl::string_view::npos) {
          const absl::string_view count = line.substr(open + 2, line.find(' ', open + 2) - open - 2);
          ASSERT_TRUE(absl::SimpleAtoi(count, &n)) << line;
        }
      } else {
        ASSERT_TRUE(absl::SimpleAtoi(line.substr(0, line.find(' ')), &n)) << line;  // a flush
      }
      accounted += n;
    }
    EXPECT_EQ(accounted, kLines) << site;
  }
}

// Any peer can make a refused handshake: a site's lines are held to a burst of 10 and one
// every 6 s after it, and the next line out says how many were held back. Sites are apart.
TEST(GrpcLogLimitTest, ABurstThenOneEverySixSecondsPerSite) {
  GrpcLogLimit limit;
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  const char* const kTsi = "src/core/tsi/ssl_transport_security.cc";
  for (int i = 0; i < 10; ++i) {
    const GrpcLogLimit::Verdict v = limit.Admit(kTsi, 1501, t0);
    EXPECT_TRUE(v.emit) << i;
    EXPECT_EQ(v.held_back, 0) << i;
  }
  for (int i = 0; i < 290; ++i) EXPECT_FALSE(limit.Admit(kTsi, 1501, t0).emit) << i;
  EXPECT_TRUE(limit.Admit(kTsi, 1502, t0).emit) << "another line: its own bucket";
  EXPECT_FALSE(limit.Admit(kTsi, 1501, t0 + absl::Seconds(5)).emit);
  // (A hair past 6 s: the bucket's refill is a rate, in floating point.)
  const GrpcLogLimit::Verdict next =
      limit.Admit(kTsi, 1501, t0 + absl::Seconds(6) + absl::Milliseconds(10));
  EXPECT_TRUE(next.emit);
  EXPECT_EQ(next.held_back, 291);
  EXPECT_FALSE(limit.Admit(kTsi, 1501, t0 + absl::Seconds(7)).emit);
  // Quiet for a minute: the burst is back, and the count starts again.
  const GrpcLogLimit::Verdict later = limit.Admit(kTsi, 1501, t0 + absl::Seconds(70));
  EXPECT_TRUE(later.emit);
  EXPECT_EQ(later.held_back, 1);
  for (int i = 1; i < 10; ++i) EXPECT_TRUE(limit.Admit(kTsi, 1501, t0 + absl::Seconds(70)).emit);
  EXPECT_FALSE(limit.Admit(kTsi, 1501, t0 + absl::Seconds(70)).emit);
  // A clock that steps back refills nothing and breaks nothing.
  EXPECT_FALSE(limit.Admit(kTsi, 1501, t0).emit);
}

// Through gRPC's log function: 300 refused handshakes write 10 lines, not 300; lines below
// ERROR (an operator's GRPC_VERBOSITY or GRPC_TRACE) are not held. The line numbers are
// new on every run of the test (the limiter is the process's: --gtest_repeat).
TEST(LogLine, GrpcErrorLinesAreHeldToTheirRate) {
  static int run = 0;
  const int line = 5000 + 2 * run++;
  grpc_init();
  RouteGrpcLogs();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 300; ++i) {
    gpr_log("src/core/tsi/ssl_transport_security.cc", line, GPR_LOG_SEVERITY_ERROR,
            "Handshake failed with fatal error %s", "SSL_ERROR_SSL");
  }
  const std::string errors = ::testing::internal::GetCapturedStderr();
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 30; ++i) {
    gpr_log("src/core/lib/surface/call.cc", line + 1, GPR_LOG_SEVERITY_INFO, "trace %d", i);
  }
  const std::string infos = ::testing::internal::GetCapturedStderr();
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
  grpc_shutdown();
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 10) << errors;
  EXPECT_EQ(std::count(infos.begin(), infos.end(), '\n'), 30) << infos;
}

TEST(LogLine, FlagValues) {
  LogFormat f = LogFormat::kText;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("json", &f, &error));
  EXPECT_EQ(f, LogFormat::kJson);
  EXPECT_EQ(AbslUnparseFlag(f), "json");
  EXPECT_TRUE(AbslParseFlag("text", &f, &error));
  EXPECT_EQ(f, LogFormat::kText);
  EXPECT_FALSE(AbslParseFlag("logfmt", &f, &error));
  EXPECT_THAT(error, HasSubstr("\"logfmt\" is not a log format (want text or json)"));
}

}  // namespace
}  // namespace spgate::server
