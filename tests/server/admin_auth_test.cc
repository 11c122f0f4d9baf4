// AuthorizeAdminCall as a table: every kind of caller against reads and mutations, with
// and without credentials configured; and the token and subjects file formats.
#include "server/admin_auth.h"

#include <set>
#include <string>

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

AdminAuthConfig Configured() {
  AdminAuthConfig auth;
  auth.tokens = {{"alice", "admin-secret", Role::kAdmin}, {"ci", "reader-secret", Role::kReader}};
  auth.subjects = {{"CN=ops-admin,O=ml", Role::kAdmin}, {"dash.example.com", Role::kReader}};
  return auth;
}

CallerCredentials Bearer(const std::string& token) { return {"Bearer " + token, {}}; }
CallerCredentials Cert(std::vector<std::string> ids) { return {std::nullopt, std::move(ids)}; }

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
        Case{"not_bearer", true, {"Basic admin-secret", {}}, kRead, kDenied, ""},
        // A wrong token is refused even with an admin certificate.
        Case{"wrong_token_good_cert", true, {"Bearer nope", {"CN=ops-admin,O=ml"}}, kRead,
             kDenied, ""},
        // Certificates.
        Case{"admin_cert_mutation", true, Cert({"CN=ops-admin,O=ml", "ops-admin"}), kMutation,
             kOk, "CN=ops-admin,O=ml"},
        Case{"reader_dns_read", true, Cert({"CN=dash", "dash", "dash.example.com"}), kRead, kOk,
             "dash.example.com"},
        Case{"reader_dns_mutation", true, Cert({"dash.example.com"}), kMutation, kDenied, ""},
        Case{"unlisted_cert", true, Cert({"CN=stranger"}), kRead, kDenied, ""}),
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
      {"reader cert", Cert({"dash.example.com"}), kOk, kDenied},
      {"admin cert", Cert({"CN=ops-admin,O=ml"}), kOk, kOk},
      {"unlisted cert", Cert({"CN=stranger"}), kDenied, kDenied},
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
  EXPECT_THAT(AuthorizeAdminCall(auth, Cert({"CN=ops-admin,O=ml"}), kRead).status(),
              StatusIs(kUnauthenticated, HasSubstr("authorization: Bearer")));
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
}

TEST(SubjectsFileTest, RolesAndIdentities) {
  auto s = ParseSubjectsFile("/s", "admin CN=ops-admin,O=ml\n# ci\nreader   ci.example.com\n");
  ASSERT_THAT(s.status(), IsOk());
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].identity, "CN=ops-admin,O=ml");
  EXPECT_EQ((*s)[0].role, Role::kAdmin);
  EXPECT_EQ((*s)[1].identity, "ci.example.com");
  EXPECT_EQ((*s)[1].role, Role::kReader);
  EXPECT_THAT(ParseSubjectsFile("/s", "owner CN=x\n").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("role \"owner\"")));
  EXPECT_THAT(ParseSubjectsFile("/s", "admin\n").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no identity")));
}

TEST(LoadAdminAuthTest, OneTokenCannotHaveTwoRoles) {
  const std::string dir = ::testing::TempDir();
  const std::string a = dir + "/admin_auth_test_a", r = dir + "/admin_auth_test_r";
  FILE* f = fopen(a.c_str(), "w");
  fputs("alice:same\n", f);
  fclose(f);
  f = fopen(r.c_str(), "w");
  fputs("ci:same\n", f);
  fclose(f);
  EXPECT_THAT(LoadAdminAuth(a, r, "").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("also the token of alice")));
  EXPECT_THAT(LoadAdminAuth(dir + "/missing", "", "").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--admin_token_file")));
}

}  // namespace
}  // namespace spgate::server
