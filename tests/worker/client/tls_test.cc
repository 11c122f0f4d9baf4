// The clients' one TLS rule (worker/client/tls.h): which combinations are refused, how
// the refusal names the setting in each spelling, and that files are read and checked
// before anything is dialled. Table-driven; the handshake itself is tested end to end
// (c_api_test, tests/integration/tls_clients_test.py).
#include "worker/client/tls.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::client {
namespace {

namespace fs = std::filesystem;
using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::NotNull;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tls_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ / "a.pem") << "-----BEGIN CERTIFICATE-----\nroots\n";
    std::ofstream(dir_ / "c.pem") << "chain";
    std::ofstream(dir_ / "k.pem") << "key";
    std::ofstream(dir_ / "empty.pem");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const char* name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(TlsTest, FilesAreReadAsGiven) {
  absl::StatusOr<TlsPem> pem =
      ReadTlsFiles({.ca = P("a.pem"), .cert = P("c.pem"), .key = P("k.pem")});
  ASSERT_THAT(pem, IsOk());
  EXPECT_EQ(pem->roots, "-----BEGIN CERTIFICATE-----\nroots\n");
  EXPECT_EQ(pem->cert_chain, "chain");
  EXPECT_EQ(pem->private_key, "key");
  // Roots alone (TLS, no client certificate) and nothing at all (plaintext) are fine.
  EXPECT_THAT(ReadTlsFiles({.ca = P("a.pem"), .server_name = "spgated"}), IsOk());
  EXPECT_THAT(ReadTlsFiles({}), IsOk());
}

TEST_F(TlsTest, BadCombinationsAndFilesAreRefusedNamingTheSetting) {
  struct Case {
    TlsClientOptions options;
    std::string flag_message;    // kTlsFlagNames
    std::string option_message;  // kTlsOptionNames
  };
  const Case cases[] = {
      {{.cert = P("c.pem")}, "--tls_cert and --tls_key go together", "tls_cert and tls_key go"},
      {{.ca = P("a.pem"), .key = P("k.pem")}, "--tls_cert and --tls_key go together",
       "tls_cert and tls_key go"},
      {{.server_name = "spgated"}, "--tls_server_name needs TLS: give --tls_ca",
       "tls_server_name needs TLS: give tls_ca"},
      {{.ca = P("missing.pem")}, "--tls_ca: cannot read \"" + P("missing.pem") + "\"",
       "tls_ca: cannot read"},
      {{.ca = P("empty.pem")}, "--tls_ca: \"" + P("empty.pem") + "\" is empty",
       "tls_ca: \"" + P("empty.pem") + "\" is empty"},
      {{.cert = P("c.pem"), .key = P("missing.pem")}, "--tls_key: cannot read",
       "tls_key: cannot read"},
      {{.cert = P("empty.pem"), .key = P("k.pem")}, "--tls_cert: \"", "tls_cert: \""},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ReadTlsFiles(c.options, kTlsFlagNames),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.flag_message)));
    EXPECT_THAT(ReadTlsFiles(c.options, kTlsOptionNames),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.option_message)));
    EXPECT_THAT(TlsChannelCredentials(c.options, kTlsFlagNames),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.flag_message)));
  }
}

// The worker token file is read as spgated reads its own: whitespace around the token is
// stripped; an unreadable or blank file is refused naming the setting.
TEST_F(TlsTest, WorkerTokenFileIsStrippedAndChecked) {
  std::ofstream(dir_ / "token") << "  s3cret-token\r\n\n";
  std::ofstream(dir_ / "blank") << " \n\t\n";
  EXPECT_THAT(ReadWorkerTokenFile(P("token")), IsOk());
  EXPECT_EQ(*ReadWorkerTokenFile(P("token")), "s3cret-token");
  EXPECT_EQ(*ReadWorkerTokenFile(""), "");  // no file: no token
  EXPECT_THAT(ReadWorkerTokenFile(P("missing")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--worker_token_file: cannot read \"" + P("missing") + "\"")));
  EXPECT_THAT(ReadWorkerTokenFile(P("blank")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--worker_token_file: \"" + P("blank") + "\" is empty")));
  EXPECT_THAT(ReadWorkerTokenFile(P("blank"), "worker_token_file"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("worker_token_file: \"")));
  // A directory cannot be read as a token either.
  EXPECT_THAT(ReadWorkerTokenFile(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--worker_token_file: ")));
}

// The daemon's scoped format (docs/security.md, "Worker credentials"): a worker handed
// its own line, or the whole file, sends the first credential's TOKEN — not its name,
// not its job patterns.
TEST_F(TlsTest, WorkerTokenFileInTheScopedFormatSendsTheFirstToken) {
  const struct {
    const char* text;
    const char* token;
  } cases[] = {
      {"tenant-a:tok-a llama-*,gpt-*\n", "tok-a"},
      {"# this worker's line\n\n  tenant-a:tok-a\tllama-*\r\ntenant-b:tok-b bert\n", "tok-a"},
      {"tenant-a:tok-a\n", "tok-a"},  // without patterns: the daemon refuses, the client sends
      {"# one shared token\ns3cret\n", "s3cret"},
  };
  for (const auto& c : cases) {
    std::ofstream(dir_ / "scoped") << c.text;
    EXPECT_THAT(ReadWorkerTokenFile(P("scoped")), IsOkAndHolds(c.token)) << c.text;
  }
  std::ofstream(dir_ / "comments") << "# nothing but comments\n\n";
  EXPECT_THAT(ReadWorkerTokenFile(P("comments")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is empty")));
  // A byte order mark an editor wrote is not text; a byte no header can carry is refused
  // (gRPC aborted the process at the first call, printing the token), naming the file.
  std::ofstream(dir_ / "marked") << "\xef\xbb\xbftenant-a:tok-a llama-*\n";
  EXPECT_THAT(ReadWorkerTokenFile(P("marked")), IsOkAndHolds("tok-a"));
  std::ofstream(dir_ / "control") << "tenant-a:LEAK\x01ME llama-*\n";
  const absl::StatusOr<std::string> control = ReadWorkerTokenFile(P("control"));
  EXPECT_THAT(control, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("\": the token's character 5 is byte 0x01")));
  EXPECT_THAT(control.status().message(), ::testing::Not(HasSubstr("LEAK")));
  std::ofstream(dir_ / "no-token") << "tenant-a: llama-*\n";
  EXPECT_THAT(ReadWorkerTokenFile(P("no-token")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the first credential line has an empty token")));
}

// Which kind they are shows only in a handshake (the end-to-end tests); here: every
// valid combination, also the force switch (Python's tls={}: the system's roots), yields
// credentials.
TEST_F(TlsTest, ValidCombinationsYieldCredentials) {
  for (const TlsClientOptions& o :
       {TlsClientOptions{}, TlsClientOptions{.ca = P("a.pem")}, TlsClientOptions{.force_tls = true},
        TlsClientOptions{.cert = P("c.pem"), .key = P("k.pem"), .server_name = "spgated"}}) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = TlsChannelCredentials(o);
    ASSERT_THAT(creds, IsOk());
    EXPECT_THAT(*creds, NotNull());
  }
}

}  // namespace
}  // namespace spgate::client
