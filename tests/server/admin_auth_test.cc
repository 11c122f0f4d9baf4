// AuthorizeAdminCall as a table: every kind of caller against reads and mutations, with
// and without credentials configured; typed certificate identities that match only
// their own field (the look-alike CN and the borrowed DNS SAN of docs/security.md); and
// the token and subjects file formats.
#include "server/admin_auth.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "spgate/v1/admin.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

CertIdentity Id(absl::string_view text) {
  absl::StatusOr<CertIdentity> id = CertIdentity::Parse(text);
  EXPECT_THAT(id.status(), IsOk()) << text;
  return *std::move(id);
}

AdminAuthConfig Configured() {
  AdminAuthConfig auth;
  auth.tokens = {{"alice", "admin-secret", Role::kAdmin}, {"ci", "reader-secret", Role::kReader}};
  auth.subjects = {{Id("subject:CN=ops-admin,O=ml"), Role::kAdmin},
                   {Id("dns:dash.example.com"), Role::kReader}};
  return auth;
}

CallerCredentials Bearer(const std::string& token) { return {.authorization = "Bearer " + token}; }
// A verified client certificate as CallerCredentialsOf reports it: the RFC 2253 subject,
// the CN's text, DNS and URI SANs.
CallerCredentials Cert(std::string subject, std::string cn, std::vector<std::string> dns = {},
                       std::vector<std::string> uris = {}) {
  return {.has_certificate = true,
          .subject = std::move(subject),
          .common_name = std::move(cn),
          .dns_names = std::move(dns),
          .uris = std::move(uris)};
}
CallerCredentials OpsAdmin() { return Cert("CN=ops-admin,O=ml", "ops-admin"); }

struct Case {
  const char* name;
  bool configured;
  CallerCredentials caller;
  CallKind kind;
  absl::StatusCode want;
  const char* principal;  // when OK
};

class AuthorizeTest : public ::testing::TestWithParam<Case> {};

TEST_P(AuthorizeTest, RoleAndCallGiveTheCode) {
  const Case& c = GetParam();
  const AdminAuthConfig auth = c.configured ? Configured() : AdminAuthConfig{};
  absl::StatusOr<Principal> got = AuthorizeAdminCall(auth, c.caller, c.kind);
  EXPECT_THAT(got.status(), StatusIs(c.want)) << c.name;
  if (got.ok()) {
    EXPECT_EQ(got->name, c.principal);
    // The principal never carries the secret.
    EXPECT_THAT(got->name, Not(HasSubstr("secret")));
  }
}

constexpr auto kRead = CallKind::kRead;
constexpr auto kMutation = CallKind::kMutation;
constexpr auto kOk = absl::StatusCode::kOk;
constexpr auto kUnauthenticated = absl::StatusCode::kUnauthenticated;
constexpr auto kDenied = absl::StatusCode::kPermissionDenied;

INSTANTIATE_TEST_SUITE_P(
    Table, AuthorizeTest,
    ::testing::Values(
        // Nothing configured: open, as before roles existed.
        Case{"open_read", false, {}, kRead, kOk, "anonymous"},
        Case{"open_mutation", false, {}, kMutation, kOk, "anonymous"},
        Case{"open_any_token", false, Bearer("whatever"), kMutation, kOk, "anonymous"},
        // No credential at all.
        Case{"none_read", true, {}, kRead, kUnauthenticated, ""},
        Case{"none_mutation", true, {}, kMutation, kUnauthenticated, ""},
        // Tokens.
        Case{"reader_read", true, Bearer("reader-secret"), kRead, kOk, "ci"},
        Case{"reader_mutation", true, Bearer("reader-secret"), kMutation, kDenied, ""},
        Case{"admin_read", true, Bearer("admin-secret"), kRead, kOk, "alice"},
        Case{"admin_mutation", true, Bearer("admin-secret"), kMutation, kOk, "alice"},
        Case{"wrong_token_read", true, Bearer("nope"), kRead, kDenied, ""},
        Case{"wrong_token_mutation", true, Bearer("nope"), kMutation, kDenied, ""},
        Case{"prefix_of_token", true, Bearer("admin-secre"), kMutation, kDenied, ""},
        Case{"not_bearer", true, {.authorization = "Basic admin-secret"}, kRead, kDenied, ""},
        // The scheme is case-insensitive (RFC 7235), the token not; two headers are one too
        // many (which is meant?).
        Case{"bearer_lower_case", true, {.authorization = "bearer admin-secret"}, kMutation,
             kOk, "alice"},
        Case{"token_case_matters", true, Bearer("ADMIN-SECRET"), kRead, kDenied, ""},
        Case{"authorization_twice", true,
             {.authorization = "Bearer admin-secret", .authorization_repeated = true}, kRead,
             kDenied, ""},
        // A wrong token is refused even with an admin certificate.
        Case{"wrong_token_good_cert", true,
             [] {
               CallerCredentials c = OpsAdmin();
               c.authorization = "Bearer nope";
               return c;
             }(),
             kRead, kDenied, ""},
        // Certificates; the principal is the typed identity that matched.
        Case{"admin_cert_mutation", true, OpsAdmin(), kMutation, kOk,
             "subject:CN=ops-admin,O=ml"},
        Case{"reader_dns_read", true, Cert("CN=dash", "dash", {"dash.example.com"}), kRead, kOk,
             "dns:dash.example.com"},
        Case{"reader_dns_mutation", true, Cert("CN=dash", "dash", {"dash.example.com"}),
             kMutation, kDenied, ""},
        Case{"unlisted_cert", true, Cert("CN=stranger", "stranger"), kRead, kDenied, ""},
        // The review's look-alike: a CN whose text is the admin's subject. Its subject
        // is one RDN (CN=CN=ops-admin\,O=ml as OpenSSL prints it), not two.
        Case{"lookalike_cn", true, Cert("CN=CN=ops-admin\\,O=ml", "CN=ops-admin,O=ml"),
             kRead, kDenied, ""},
        // A dns: entry is not a CN: a CN that spells the DNS name does not match.
        Case{"dns_name_as_cn", true, Cert("CN=dash.example.com", "dash.example.com"), kRead,
             kDenied, ""}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Role x RPC: every method of spgate.v1.AdminService has a kind, and each kind of caller
// gets the expected code on it.
TEST(AdminAuthTest, EveryAdminRpcAgainstEveryRole) {
  const auto* service = v1::AuditEntry::descriptor()->file()->FindServiceByName("AdminService");
  ASSERT_NE(service, nullptr);
  const std::set<std::string> mutations = {"UpdateGateConfig", "PinMode", "Unpin",
                                           "RollbackGateConfig", "ForgetJob"};
  struct Caller {
    const char* name;
    CallerCredentials creds;
    absl::StatusCode read, mutation;
  };
  const Caller callers[] = {
      {"none", {}, kUnauthenticated, kUnauthenticated},
      {"wrong token", Bearer("nope"), kDenied, kDenied},
      {"reader token", Bearer("reader-secret"), kOk, kDenied},
      {"admin token", Bearer("admin-secret"), kOk, kOk},
      {"reader cert", Cert("CN=dash", "dash", {"dash.example.com"}), kOk, kDenied},
      {"admin cert", OpsAdmin(), kOk, kOk},
      {"unlisted cert", Cert("CN=stranger", "stranger"), kDenied, kDenied},
  };
  ASSERT_EQ(service->method_count(), 11);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method = service->method(i)->name();
    const std::optional<CallKind> kind = AdminCallKind(method);
    ASSERT_TRUE(kind.has_value()) << method << " is missing from AdminCallKind";
    const bool mutation = mutations.contains(method);
    EXPECT_EQ(*kind, mutation ? kMutation : kRead) << method;
    for (const Caller& c : callers) {
      EXPECT_THAT(AuthorizeAdminCall(Configured(), c.creds, *kind).status(),
                  StatusIs(mutation ? c.mutation : c.read))
          << method << " as " << c.name;
      EXPECT_THAT(AuthorizeAdminCall(AdminAuthConfig{}, c.creds, *kind).status(), IsOk())
          << method << " as " << c.name << " with nothing configured";
    }
  }
  EXPECT_EQ(AdminCallKind("Frobnicate"), std::nullopt);
}

TEST(AdminAuthTest, CertificatesCountOnlyWithASubjectsFile) {
  AdminAuthConfig auth;
  auth.tokens = {{"alice", "admin-secret", Role::kAdmin}};
  EXPECT_THAT(AuthorizeAdminCall(auth, OpsAdmin(), kRead).status(),
              StatusIs(kUnauthenticated, HasSubstr("authorization: Bearer")));
}

// The review's second case: `admin ops-admin` used to match a certificate CN=evil that
// carries the SAN DNS:ops-admin. Typed, each entry matches its own field only.
TEST(AdminAuthTest, IdentitiesMatchOnlyTheirOwnField) {
  AdminAuthConfig auth;
  auth.subjects = {{Id("cn:ops-admin"), Role::kAdmin},
                   {Id("uri:spiffe://cluster/ns/ml/sa/ops"), Role::kReader}};
  const CallerCredentials evil =
      Cert("CN=evil", "evil", {"ops-admin"}, {"spiffe://cluster/ns/ml/sa/ops"});
  EXPECT_THAT(
      AuthorizeAdminCall(auth, evil, kMutation).status(),
      StatusIs(kDenied, HasSubstr("uri:spiffe://cluster/ns/ml/sa/ops has the reader role")));
  auto read = AuthorizeAdminCall(auth, evil, kRead);
  ASSERT_THAT(read.status(), IsOk());
  EXPECT_EQ(read->name, "uri:spiffe://cluster/ns/ml/sa/ops");
  auto admin = AuthorizeAdminCall(auth, OpsAdmin(), kMutation);
  ASSERT_THAT(admin.status(), IsOk());
  EXPECT_EQ(admin->name, "cn:ops-admin");
  // The highest role of the entries that match wins.
  CallerCredentials both = OpsAdmin();
  both.uris = {"spiffe://cluster/ns/ml/sa/ops"};
  EXPECT_EQ(AuthorizeAdminCall(auth, both, kMutation)->role, Role::kAdmin);
  // Without a certificate nothing matches, whatever the fields say.
  CallerCredentials unverified = OpsAdmin();
  unverified.has_certificate = false;
  EXPECT_THAT(AuthorizeAdminCall(auth, unverified, kRead).status(), StatusIs(kUnauthenticated));
}

TEST(AdminAuthTest, MessagesNameTheRoleNotTheSecret) {
  auto got = AuthorizeAdminCall(Configured(), Bearer("reader-secret"), kMutation);
  EXPECT_THAT(got.status(), StatusIs(kDenied, HasSubstr("ci has the reader role")));
  EXPECT_THAT(got.status().message(), Not(HasSubstr("reader-secret")));
}

TEST(TokenFileTest, NamedAndBareLines) {
  auto tokens = ParseTokenFile("--admin_token_file", "/etc/spgate/admin-token",
                               "# operators\nalice:s3cret\n\n  bob : other \nbare-token\n",
                               Role::kAdmin);
  ASSERT_THAT(tokens.status(), IsOk());
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[0].name, "alice");
  EXPECT_EQ((*tokens)[0].secret, "s3cret");
  EXPECT_EQ((*tokens)[1].name, "bob");
  EXPECT_EQ((*tokens)[1].secret, "other");
  EXPECT_EQ((*tokens)[2].name, "admin-token");  // the file's basename
  EXPECT_EQ((*tokens)[2].secret, "bare-token");
  EXPECT_EQ((*tokens)[2].role, Role::kAdmin);
}

TEST(TokenFileTest, RefusalsNameTheFlagFileAndLine) {
  EXPECT_THAT(ParseTokenFile("--reader_token_file", "/t", "\n# only a comment\n", Role::kReader)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--reader_token_file: /t is empty")));
  EXPECT_THAT(ParseTokenFile("--admin_token_file", "/t", "ok:a\nbad name:x\n", Role::kAdmin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/t line 2")));
  EXPECT_THAT(ParseTokenFile("--admin_token_file", "/t", "alice:\n", Role::kAdmin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1: empty token")));
  // A token no client can send in a header (gRPC aborted the client, printing it), the open
  // mode's principal, a bare token whose file name reads as a certificate's principal: each
  // refused at start-up, naming the line and never the token.
  const struct {
    const char* path;
    std::string text;
    const char* message;
  } refused[] = {
      {"/t", std::string("alice:LEAK\x01ME\n"), "/t line 1: the token's character 5 is byte 0x01"},
      {"/t", "anonymous:LEAK\n", "line 1: the name anonymous is the audit log's"},
      {"/d/subject:CN=ops-admin,O=ml", "LEAK\n", "a bare token is named after its file, and "
                                                   "\"subject:CN=ops-admin,O=ml\" holds ':'"},
      {"/d/anonymous", "LEAK\n", "the name anonymous is the audit log's"},
  };
  for (const auto& c : refused) {
    const absl::Status s = ParseTokenFile("--admin_token_file", c.path, c.text, Role::kAdmin).status();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message))) << c.text;
    EXPECT_THAT(s.message(), Not(HasSubstr("LEAK"))) << c.text;
  }
  // One name on two lines is one principal with two tokens (a rotation's overlap), and a
  // passphrase keeps its spaces (a header carries them).
  auto rotating = ParseTokenFile("--admin_token_file", "/t",
                                 "alice:old-token\nalice:new token phrase\n", Role::kAdmin);
  ASSERT_THAT(rotating.status(), IsOk());
  ASSERT_EQ(rotating->size(), 2u);
  EXPECT_EQ((*rotating)[1].name, "alice");
  EXPECT_EQ((*rotating)[1].secret, "new token phrase");
  // A byte order mark an editor wrote is not part of the first line.
  auto marked = ParseTokenFile("--admin_token_file", "/t", "\xef\xbb\xbf" "alice:s3cret\n",
                               Role::kAdmin);
  ASSERT_THAT(marked.status(), IsOk());
  EXPECT_EQ((*marked)[0].name, "alice");
  EXPECT_EQ((*marked)[0].secret, "s3cret");
}

TEST(SubjectsFileTest, RolesAndTypedIdentities) {
  auto s = ParseSubjectsFile("/s",
                             "admin subject:CN=ops-admin,O=ml\n# ci\nreader   dns:ci.example.com\n"
                             "admin cn:ops\nreader uri:spiffe://cluster/ns/ml/sa/ops\n");
  ASSERT_THAT(s.status(), IsOk());
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[0].identity.name(), "subject:CN=ops-admin,O=ml");
  EXPECT_EQ((*s)[0].identity.kind(), IdentityKind::kSubject);
  EXPECT_EQ((*s)[0].role, Role::kAdmin);
  EXPECT_EQ((*s)[1].identity.name(), "dns:ci.example.com");
  EXPECT_EQ((*s)[1].role, Role::kReader);
  EXPECT_EQ((*s)[2].identity.kind(), IdentityKind::kCommonName);
  EXPECT_EQ((*s)[3].identity.kind(), IdentityKind::kUri);
  // A byte order mark an editor wrote is not part of the first role.
  auto marked = ParseSubjectsFile("/s", "\xef\xbb\xbf" "admin cn:ops\n");
  ASSERT_THAT(marked.status(), IsOk());
  EXPECT_EQ((*marked)[0].role, Role::kAdmin);
  EXPECT_THAT(ParseSubjectsFile("/s", "owner cn:x\n").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("role \"owner\"")));
  EXPECT_THAT(ParseSubjectsFile("/s", "admin\n").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no identity")));
}

// An untyped identity matched the subject, the CN and every DNS SAN alike; now it stops
// start-up naming the flag, the file, the line and the fix.
TEST(SubjectsFileTest, UntypedOrAmbiguousIdentitiesAreRefusedWithTheFix) {
  const struct {
    const char* line;
    const char* message;
  } cases[] = {
      {"admin ops-admin",
       "--admin_subjects_file: /s line 2: \"ops-admin\" does not say which field of the "
       "certificate it names; write cn:ops-admin or dns:ops-admin"},
      {"admin CN=ops-admin,O=ml", "/s line 2: \"CN=ops-admin,O=ml\" does not say which field of "
                                  "the certificate it names; write subject:CN=ops-admin,O=ml"},
      {"reader spiffe://cluster/ns/ml/sa/ops", "write uri:spiffe://cluster/ns/ml/sa/ops"},
      // A CN with '=' is the look-alike of a subject.
      {"admin cn:CN=ops-admin,O=ml", "write subject:CN=ops-admin,O=ml"},
      {"admin dns:spiffe://x/y", "is not a DNS name"},
      {"admin uri:no scheme", "is not a URI"},
      {"admin subject:CN=a;O=b", "not a distinguished name"},
      {"admin cn:", "nothing after \"cn:\""},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseSubjectsFile("/s", absl::StrCat("# header\n", c.line, "\n")).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.line;
  }
  EXPECT_THAT(
      ParseSubjectsFile("/s", "admin cn:a\nreader cn:a\n").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: cn:a is listed twice")));
}

TEST(LoadAdminAuthTest, OneTokenCannotHaveTwoRoles) {
  const std::string dir = ::testing::TempDir();
  const std::string a = dir + "/admin_auth_test_a", r = dir + "/admin_auth_test_r";
  std::ofstream(a) << "alice:same\n";
  std::ofstream(r) << "ci:same\n";
  // Both places named, line by line (the file had no line number).
  EXPECT_THAT(LoadAdminAuth(a, r, "").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(r + " line 1: the token of ci is also the token of alice (" + a +
                                 " line 1)")));
  // One name in both files: one principal with two roles, refused naming both places.
  std::ofstream(a) << "alice:one\n";
  std::ofstream(r) << "alice:two\n";
  EXPECT_THAT(LoadAdminAuth(a, r, "").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(r + " line 1: the name alice is also on " + a +
                                 " line 1 (--admin_token_file)")));
  // Bare tokens are named after their files, and two files may share a basename (a Secret
  // mounted as .../admin/token and .../reader/token): not one principal with two roles.
  std::filesystem::create_directories(dir + "/admin");
  std::filesystem::create_directories(dir + "/reader");
  std::ofstream(dir + "/admin/token") << "admin-bare\n";
  std::ofstream(dir + "/reader/token") << "reader-bare\n";
  EXPECT_THAT(LoadAdminAuth(dir + "/admin/token", dir + "/reader/token", "").status(), IsOk());
  EXPECT_THAT(LoadAdminAuth(dir + "/missing", "", "").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--admin_token_file")));
}

}  // namespace
}  // namespace spgate::server
