// AuthorizeWorkerCall as a table: every kind of worker caller against job ids inside and
// outside its credential's patterns, with and without credentials configured; what a
// refusal may say (the job the caller sent and the credential's name, never the secret,
// never the jobs it does cover); JobScope's globs; and the two file formats.
#include "server/worker_auth.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kOk = absl::StatusCode::kOk;
constexpr auto kUnauthenticated = absl::StatusCode::kUnauthenticated;
constexpr auto kDenied = absl::StatusCode::kPermissionDenied;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

CertIdentity Id(absl::string_view text) {
  absl::StatusOr<CertIdentity> id = CertIdentity::Parse(text);
  EXPECT_THAT(id.status(), IsOk()) << text;
  return *std::move(id);
}

WorkerAuthConfig Configured() {
  WorkerAuthConfig auth;
  auth.tokens = {{"tenant-a", "secret-a", {{"llama-*"}}},
                 {"tenant-b", "secret-b", {{"gpt-*", "bert"}}}};
  auth.subjects = {{Id("cn:trainer-a"), {{"llama-*"}}},
                   {Id("uri:spiffe://cluster/ns/ml/sa/gpt"), {{"gpt-*"}}},
                   {Id("dns:trainer-a.ml.svc"), {{"t5-*"}}}};
  return auth;
}

CallerCredentials Bearer(const std::string& token) { return {.authorization = "Bearer " + token}; }
CallerCredentials Cert(std::string cn, std::vector<std::string> dns = {},
                       std::vector<std::string> uris = {}) {
  return {.has_certificate = true,
          .subject = "CN=" + cn,
          .common_name = cn,
          .dns_names = std::move(dns),
          .uris = std::move(uris)};
}

struct Case {
  const char* name;
  bool configured;
  CallerCredentials caller;
  const char* job_id;
  absl::StatusCode want;
  const char* message;  // a part of the refusal ("" when OK)
};

class AuthorizeWorkerTest : public ::testing::TestWithParam<Case> {};

TEST_P(AuthorizeWorkerTest, CredentialAndJobGiveTheCode) {
  const Case& c = GetParam();
  const WorkerAuthConfig auth = c.configured ? Configured() : WorkerAuthConfig{};
  const absl::Status got = AuthorizeWorkerCall(auth, c.caller, c.job_id);
  EXPECT_THAT(got, StatusIs(c.want, HasSubstr(c.message))) << c.name;
  // A refusal never carries a secret.
  EXPECT_THAT(got.message(), Not(HasSubstr("secret"))) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Table, AuthorizeWorkerTest,
    ::testing::Values(
        // Nothing configured: any caller, any job (with only --tls_client_ca the TLS
        // layer has already required a certificate from the CA).
        Case{"open", false, {}, "llama-7b", kOk, ""},
        Case{"open_any_token", false, Bearer("whatever"), "gpt-2", kOk, ""},
        Case{"open_any_cert", false, Cert("anyone"), "gpt-2", kOk, ""},
        // No credential at all.
        Case{"none", true, {}, "llama-7b", kUnauthenticated, "worker token"},
        Case{"none_hears_of_both_credentials", true, {}, "x", kUnauthenticated,
             "--worker_subjects_file"},
        // Tokens: a wrong one, a malformed header, a prefix of a real one.
        Case{"wrong_token", true, Bearer("nope"), "llama-7b", kDenied,
             "the worker token does not match"},
        Case{"prefix_of_token", true, Bearer("secret-"), "llama-7b", kDenied, "does not match"},
        Case{"not_bearer", true, {.authorization = "Basic secret-a"}, "llama-7b", kDenied,
             "not 'Bearer <token>'"},
        // Tokens scoped to jobs.
        Case{"token_own_job", true, Bearer("secret-a"), "llama-7b", kOk, ""},
        Case{"token_other_tenants_job", true, Bearer("secret-a"), "gpt-2", kDenied,
             "the worker credential \"tenant-a\" (--worker_token_file) may not act for job "
             "\"gpt-2\""},
        Case{"token_second_pattern", true, Bearer("secret-b"), "bert", kOk, ""},
        Case{"token_exact_pattern_only", true, Bearer("secret-b"), "bert-large", kDenied,
             "\"bert-large\""},
        Case{"token_glob_needs_its_prefix", true, Bearer("secret-a"), "xllama-1", kDenied,
             "\"xllama-1\""},
        Case{"token_empty_job", true, Bearer("secret-a"), "", kDenied, "job \"\""},
        // A presented token decides alone, even next to a listed certificate.
        Case{"wrong_token_good_cert", true,
             [] {
               CallerCredentials c = Cert("trainer-a");
               c.authorization = "Bearer nope";
               return c;
             }(),
             "llama-7b", kDenied, "does not match"},
        // Certificates, typed.
        Case{"cert_cn_own_job", true, Cert("trainer-a"), "llama-7b", kOk, ""},
        Case{"cert_cn_other_job", true, Cert("trainer-a"), "gpt-2", kDenied,
             "the worker credential \"cn:trainer-a\" (--worker_subjects_file) may not act for "
             "job \"gpt-2\""},
        Case{"cert_uri", true, Cert("whoever", {}, {"spiffe://cluster/ns/ml/sa/gpt"}), "gpt-2",
             kOk, ""},
        Case{"cert_unlisted", true, Cert("stranger"), "llama-7b", kDenied,
             "the client certificate (CN=stranger) is not listed in --worker_subjects_file"},
        // A DNS SAN that spells a listed CN is not that CN.
        Case{"dns_san_is_not_cn", true, Cert("evil", {"trainer-a"}), "llama-7b", kDenied,
             "not listed"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(AuthorizeWorkerTest, RefusalNamesNeitherTheSecretNorTheJobsTheCredentialCovers) {
  const absl::Status s = AuthorizeWorkerCall(Configured(), Bearer("secret-a"), "gpt-2");
  EXPECT_THAT(s, StatusIs(kDenied, HasSubstr("gpt-2")));
  EXPECT_THAT(s.message(), Not(HasSubstr("llama")));
  EXPECT_THAT(s.message(), Not(HasSubstr("secret-a")));
  // The caller's job id is quoted escaped and bounded: it reaches the worker's log.
  const std::string hostile = "x\n" + std::string(500, 'y');
  const absl::Status h = AuthorizeWorkerCall(Configured(), Bearer("secret-a"), hostile);
  EXPECT_THAT(h, StatusIs(kDenied, HasSubstr("x\\n")));
  EXPECT_LT(h.message().size(), 300u);
  // A job the caller did not name (its session's, a session id held by another tenant's
  // credential) is not named back.
  const absl::Status session =
      AuthorizeWorkerCall(Configured(), Bearer("secret-a"), "gpt-2", JobNamedBy::kSession);
  EXPECT_THAT(session, StatusIs(kDenied, HasSubstr("may not act for the job of this session")));
  EXPECT_THAT(session.message(), Not(HasSubstr("gpt-2")));
}

TEST(AuthorizeWorkerTest, CertificatesCountOnlyWithASubjectsFile) {
  WorkerAuthConfig auth = Configured();
  auth.subjects.clear();
  EXPECT_THAT(AuthorizeWorkerCall(auth, Cert("trainer-a"), "llama-7b"),
              StatusIs(kUnauthenticated, HasSubstr("authorization: Bearer")));
}

// A certificate that matches several lines may act for the union of their jobs; the
// grant is named after the first line it matched.
TEST(AuthorizeWorkerTest, ACertificateGetsTheJobsOfEveryLineItMatches) {
  const CallerCredentials both = Cert("trainer-a", {"trainer-a.ml.svc"});
  EXPECT_THAT(AuthorizeWorkerCall(Configured(), both, "llama-7b"), IsOk());
  EXPECT_THAT(AuthorizeWorkerCall(Configured(), both, "t5-small"), IsOk());
  absl::StatusOr<WorkerGrant> grant = AuthenticateWorker(Configured(), both);
  ASSERT_THAT(grant.status(), IsOk());
  EXPECT_EQ(grant->name, "cn:trainer-a");
  EXPECT_THAT(CheckWorkerJob(*grant, "gpt-2"), StatusIs(kDenied, HasSubstr("cn:trainer-a")));
}

TEST(JobScopeTest, GlobsOverJobIds) {
  const struct {
    std::vector<std::string> patterns;
    const char* job_id;
    bool covered;
  } cases[] = {
      {{"*"}, "anything.at_all-1", true},
      {{"*"}, "", true},
      {{"llama-*"}, "llama-7b", true},
      {{"llama-*"}, "llama-", true},
      {{"llama-*"}, "llama", false},
      {{"llama-*"}, "xllama-7b", false},
      {{"a.b"}, "aXb", false},  // '.' is a character, not a wildcard
      {{"a.b"}, "a.b", true},
      {{"*-prod"}, "gpt-prod", true},
      {{"gpt-*", "bert"}, "bert", true},
      {{}, "llama", false},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(JobScope{c.patterns}.Covers(c.job_id), c.covered) << c.job_id;
  }
  EXPECT_FALSE(JobScope{{"llama*"}}.Covers(std::string_view("llama\0x", 7)));
}

TEST(WorkerTokenFileTest, OneBareTokenStillAllowsEveryJob) {
  auto tokens = ParseWorkerTokenFile("/etc/spgate/worker-token", "  s3cret\r\n\n");
  ASSERT_THAT(tokens.status(), IsOk());
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].name, "worker-token");  // the file's basename
  EXPECT_EQ((*tokens)[0].secret, "s3cret");
  EXPECT_TRUE((*tokens)[0].jobs.Covers("any-job"));
}

TEST(WorkerTokenFileTest, NamedTokensWithPatterns) {
  auto tokens = ParseWorkerTokenFile(
      "/t", "# tenants\ntenant-a:tok-a llama-*,gpt-*\n\n  tenant-b:tok-b\tbert , t5-*\n");
  ASSERT_THAT(tokens.status(), IsOk());
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].name, "tenant-a");
  EXPECT_EQ((*tokens)[0].secret, "tok-a");
  EXPECT_EQ((*tokens)[0].jobs.patterns, (std::vector<std::string>{"llama-*", "gpt-*"}));
  EXPECT_EQ((*tokens)[1].jobs.patterns, (std::vector<std::string>{"bert", "t5-*"}));
}

TEST(WorkerTokenFileTest, RefusalsNameTheFlagFileAndLineNeverTheToken) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"\n# only a comment\n", "--worker_token_file: /t is empty"},
      {"a:tok-a\n", "--worker_token_file: /t line 1: no job patterns after a:TOKEN"},
      {"tok-a llama-*\n", "line 1: a credential with job patterns needs a name"},
      {"a:tok-a x\nb:tok-a y\n", "line 2: this token is also the token of a"},
      {"a:tok-a x\na:tok-b y\n", "line 2: the name a is also on line 1"},
      {"a:tok-a x\ntok-b\n", "line 2: a bare token (no NAME:) allows every job and must be "
                             "the file's only credential"},
      {"b@d!:tok-a x\n", "line 1: the name before ':' must be"},
      {"a: x\n", "line 1: empty token"},
      {"a:tok-a llama/*\n", "line 1: job pattern \"llama/*\" may hold only job-id characters"},
      {"a:tok-a llama-*,,gpt\n", "line 1: an empty job pattern"},
      // A token no client can send in a header (gRPC aborted the client, printing it).
      {"a:tok-\x01" "a x\n", "line 1: the token's character 5 is byte 0x01"},
      {"te am:tok-a llama-*\n", "line 1: the name before ':' must be [A-Za-z0-9._@-]+, no spaces"},
      {"anonymous:tok-a x\n", "line 1: the name anonymous is the audit log's"},
  };
  for (const auto& c : cases) {
    const absl::Status s = ParseWorkerTokenFile("/t", c.text).status();
    EXPECT_THAT(s, StatusIs(kInvalid, HasSubstr(c.message))) << c.text;
    EXPECT_THAT(s.message(), Not(HasSubstr("tok-"))) << c.text;
  }
}

// A byte order mark an editor wrote is not part of the first line; a bare token's file
// name, its principal, must be a name (one with ':' reads as a certificate's).
TEST(WorkerTokenFileTest, AByteOrderMarkIsNotTextAndABareTokensFileIsAName) {
  auto marked = ParseWorkerTokenFile("/t", "\xef\xbb\xbf" "a:tok-a llama-*\n");
  ASSERT_THAT(marked.status(), IsOk());
  EXPECT_EQ((*marked)[0].name, "a");
  EXPECT_EQ((*marked)[0].where, "/t line 1");
  const absl::Status s = ParseWorkerTokenFile("/d/uri:spiffe", "tok-a\n").status();
  EXPECT_THAT(s, StatusIs(kInvalid, HasSubstr("a bare token is named after its file")));
  EXPECT_THAT(s.message(), Not(HasSubstr("tok-")));
}

TEST(WorkerSubjectsFileTest, TypedIdentitiesWithPatterns) {
  auto s = ParseWorkerSubjectsFile(
      "/s",
      "# trainers\ncn:trainer-a llama-*\nuri:spiffe://cluster/ns/ml/sa/gpt gpt-*,bert\n"
      "subject:CN=Trainer B,O=ml   t5-*\n");
  ASSERT_THAT(s.status(), IsOk());
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[0].identity.name(), "cn:trainer-a");
  EXPECT_EQ((*s)[1].jobs.patterns, (std::vector<std::string>{"gpt-*", "bert"}));
  // A subject may hold spaces: the patterns are the last field.
  EXPECT_EQ((*s)[2].identity.name(), "subject:CN=Trainer B,O=ml");
  EXPECT_TRUE((*s)[2].identity.Matches(
      {.has_certificate = true, .subject = "CN=Trainer B,O=ml", .common_name = "Trainer B"}));
  // A byte order mark an editor wrote is not part of the first identity.
  auto marked = ParseWorkerSubjectsFile("/s", "\xef\xbb\xbf" "cn:trainer-a llama-*\n");
  ASSERT_THAT(marked.status(), IsOk());
  EXPECT_EQ((*marked)[0].identity.name(), "cn:trainer-a");
}

TEST(WorkerSubjectsFileTest, RefusalsNameTheFlagFileLineAndFix) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"", "--worker_subjects_file: /s is empty"},
      {"trainer-a llama-*\n",
       "--worker_subjects_file: /s line 1: \"trainer-a\" does not say which field of the "
       "certificate it names; write cn:trainer-a or dns:trainer-a"},
      {"cn:trainer-a\n", "line 1: no job patterns after the identity"},
      {"cn:trainer-a llama-*, gpt-*\n", "line 1: the job patterns are one comma-separated list "
                                        "without spaces"},
      {"cn:a x\ncn:a y\n", "line 2: cn:a is listed twice"},
      {"cn:CN=a,O=b x\n", "write subject:CN=a,O=b"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseWorkerSubjectsFile("/s", c.text).status(),
                StatusIs(kInvalid, HasSubstr(c.message)))
        << c.text;
  }
}

TEST(LoadWorkerAuthTest, FilesAreReadAndErrorsNameTheFlag) {
  const std::string path = ::testing::TempDir() + "/worker_auth_test_tokens";
  FILE* f = fopen(path.c_str(), "w");
  fputs("tenant-a:tok-a llama-*\n", f);
  fclose(f);
  auto auth = LoadWorkerAuth(path, "");
  ASSERT_THAT(auth.status(), IsOk());
  EXPECT_TRUE(auth->configured());
  EXPECT_EQ(auth->tokens.size(), 1u);
  EXPECT_FALSE(LoadWorkerAuth("", "")->configured());
  EXPECT_THAT(LoadWorkerAuth(path + ".missing", "").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--worker_token_file: cannot read")));
  EXPECT_THAT(LoadWorkerAuth("", path + ".missing").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--worker_subjects_file: cannot read")));
}

}  // namespace
}  // namespace spgate::server
