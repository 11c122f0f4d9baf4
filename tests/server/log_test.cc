// The daemon's log lines (server/log.h): text as before, JSON as one object per line with
// time, level, message and typed fields, whatever bytes the message holds.
#include "server/log.h"

#include <string>

#include <grpc/grpc.h>
#include <grpc/support/log.h>

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
