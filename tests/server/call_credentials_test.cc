// Caller credentials end to end: distinguished names parsed as RFC 4514 (escapes, case of
// attribute types, multi-valued RDNs), typed identities and what each matches, and
// CallerCredentialsOf against real certificates over mTLS — what gRPC 1.51 reports
// (x509_subject as OpenSSL's RFC 2253, the CN's text, peer_dns, peer_uri) is what the
// parser and the matchers expect, so the look-alike CN and the borrowed DNS SAN of
// docs/security.md are told apart on real handshakes.
#include "server/call_credentials.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spgate/v1/gate.grpc.pb.h"
#include "tests/server/test_util.h"  // TempDir
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

DistinguishedName Dn(absl::string_view text) {
  absl::StatusOr<DistinguishedName> dn = ParseDistinguishedName(text);
  EXPECT_THAT(dn.status(), IsOk()) << text;
  return dn.ok() ? *dn : DistinguishedName{};
}

TEST(DistinguishedNameTest, ParsesRdnsAttributesAndEscapes) {
  const DistinguishedName dn = Dn("CN=ops-admin,O=ml");
  ASSERT_EQ(dn.rdns.size(), 2u);
  EXPECT_THAT(dn.rdns[0], ElementsAre(DnAttribute{"CN", "ops-admin", false}));
  EXPECT_THAT(dn.rdns[1], ElementsAre(DnAttribute{"O", "ml", false}));
  // An escaped ',' is part of the value: one RDN.
  const DistinguishedName one = Dn("CN=CN=ops-admin\\,O=ml");
  ASSERT_EQ(one.rdns.size(), 1u);
  EXPECT_EQ(one.rdns[0][0].value, "CN=ops-admin,O=ml");
  EXPECT_EQ(Dn("CN=a\\2Cb").rdns[0][0].value, "a,b");
  EXPECT_EQ(Dn("CN=caf\\C3\\A9").rdns[0][0].value, "caf\xC3\xA9");
  // Unescaped spaces around the value go, escaped ones stay.
  EXPECT_EQ(Dn("CN= a b ,O=ml").rdns[0][0].value, "a b");
  EXPECT_EQ(Dn("CN=\\ a\\ ").rdns[0][0].value, " a ");
  EXPECT_EQ(Dn("CN=a\\+b").rdns[0].size(), 1u);
  EXPECT_EQ(Dn("CN=a+OU=b").rdns[0].size(), 2u);
  EXPECT_THAT(Dn("").rdns, IsEmpty());
  const DistinguishedName der = Dn("1.2.3.4=#0403616263");
  EXPECT_TRUE(der.rdns[0][0].der);
  EXPECT_EQ(der.rdns[0][0].value, "0403616263");
}

TEST(DistinguishedNameTest, EqualityIsOnTheParsedName) {
  const struct {
    const char* a;
    const char* b;
    bool equal;
  } cases[] = {
      {"CN=ops-admin,O=ml", "CN=ops-admin,O=ml", true},
      {"CN=ops-admin,O=ml", "cn=ops-admin, o=ml", true},     // types case-insensitive
      {"CN=ops-admin,O=ml", "2.5.4.3=ops-admin,2.5.4.10=ml", true},  // OIDs of the names
      {"CN=a\\,b", "CN=a\\2cb", true},                        // two spellings of ','
      {"CN=caf\\C3\\A9", "CN=caf\xC3\xA9", true},             // OpenSSL escapes UTF-8
      {"CN=a+OU=b,O=ml", "OU=b+CN=a,O=ml", true},             // an RDN is a set
      {"emailAddress=a@b,CN=x", "E=a@b,CN=x", true},
      {"CN=ops-admin,O=ml", "CN=CN=ops-admin\\,O=ml", false},  // the look-alike
      {"CN=ops-admin,O=ml", "O=ml,CN=ops-admin", false},       // RDN order matters
      {"CN=ops-admin,O=ml", "CN=Ops-Admin,O=ml", false},       // values are exact
      {"CN=ops-admin,O=ml", "CN=ops-admin", false},
      {"CN=a+OU=b", "CN=a,OU=b", false},
      {"1.2.3.4=#616263", "1.2.3.4=\\#616263", false},         // DER is not text
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Dn(c.a) == Dn(c.b), c.equal) << c.a << " vs " << c.b;
  }
}

TEST(DistinguishedNameTest, MalformedNamesSayWhatAndWhere) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"CN", "an attribute without '='"},
      {"=a", "attribute type \"\" is not a name or an OID"},
      {"C N=a", "attribute type \"C N\""},
      {"CN=a;O=b", "';' must be escaped"},
      {"CN=a\"b", "'\\\"' must be escaped"},
      {"CN=a\\q", "'\\q' is not an escape"},
      {"CN=a\\", "'\\' at the end"},
      {"CN=a,", "an attribute without '='"},
      {"1.2=#zz", "'#' must be followed by pairs of hex digits"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseDistinguishedName(c.text).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.text;
  }
}

TEST(CertIdentityTest, KindsAndNames) {
  const struct {
    const char* text;
    IdentityKind kind;
    const char* name;
  } cases[] = {
      {"cn:ops-admin", IdentityKind::kCommonName, "cn:ops-admin"},
      {"CN:Ops Admin", IdentityKind::kCommonName, "cn:Ops Admin"},
      {"dns:trainer.ml.svc", IdentityKind::kDnsName, "dns:trainer.ml.svc"},
      {"uri:spiffe://cluster/ns/ml/sa/ops", IdentityKind::kUri,
       "uri:spiffe://cluster/ns/ml/sa/ops"},
      {"subject:CN=ops-admin,O=ml", IdentityKind::kSubject, "subject:CN=ops-admin,O=ml"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<CertIdentity> id = CertIdentity::Parse(c.text);
    ASSERT_THAT(id.status(), IsOk()) << c.text;
    EXPECT_EQ(id->kind(), c.kind) << c.text;
    EXPECT_EQ(id->name(), c.name);
  }
}

// Which caller each kind matches: only its own field.
TEST(CertIdentityTest, EachKindMatchesOnlyItsField) {
  const CallerCredentials ops{.has_certificate = true,
                              .subject = "CN=ops-admin,O=ml",
                              .common_name = "ops-admin"};
  const CallerCredentials lookalike{.has_certificate = true,
                                    .subject = "CN=CN=ops-admin\\,O=ml",
                                    .common_name = "CN=ops-admin,O=ml"};
  const CallerCredentials evil{.has_certificate = true,
                               .subject = "CN=evil",
                               .common_name = "evil",
                               .dns_names = {"Ops-Admin"},
                               .uris = {"spiffe://cluster/ns/ml/sa/ops"}};
  CallerCredentials no_cert = ops;
  no_cert.has_certificate = false;
  const struct {
    const char* identity;
    bool ops, lookalike, evil;
  } cases[] = {
      {"subject:CN=ops-admin,O=ml", true, false, false},
      {"subject:cn=ops-admin, o=ml", true, false, false},
      {"subject:CN=CN\\=ops-admin\\,O\\=ml", false, true, false},  // naming it honestly
      {"cn:ops-admin", true, false, false},
      {"dns:ops-admin", false, false, true},  // DNS names ignore case
      {"uri:spiffe://cluster/ns/ml/sa/ops", false, false, true},
      {"uri:spiffe://cluster/ns/ml/sa/OPS", false, false, false},
  };
  for (const auto& c : cases) {
    absl::StatusOr<CertIdentity> id = CertIdentity::Parse(c.identity);
    ASSERT_THAT(id.status(), IsOk()) << c.identity;
    EXPECT_EQ(id->Matches(ops), c.ops) << c.identity;
    EXPECT_EQ(id->Matches(lookalike), c.lookalike) << c.identity;
    EXPECT_EQ(id->Matches(evil), c.evil) << c.identity;
    EXPECT_FALSE(id->Matches(no_cert)) << c.identity;
  }
}

TEST(CallerCredentialsTest, BearerToken) {
  EXPECT_FALSE(BearerToken({})->has_value());
  EXPECT_EQ(**BearerToken({.authorization = "Bearer abc"}), "abc");
  // The scheme in any case (RFC 7235); another scheme, or the header twice, is refused.
  EXPECT_EQ(**BearerToken({.authorization = "bearer abc"}), "abc");
  EXPECT_EQ(**BearerToken({.authorization = "BEARER abc"}), "abc");
  EXPECT_THAT(BearerToken({.authorization = "Basic abc"}).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(BearerToken({.authorization = "Bearerabc"}).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(
      BearerToken({.authorization = "Bearer abc", .authorization_repeated = true}).status(),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("more than once")));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
}

// --- Real certificates -----------------------------------------------------------------

// A GateService that records CallerCredentialsOf for each Register and answers OK.
class RecordingGate final : public v1::GateService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const v1::RegisterRequest*,
                                     v1::RegisterResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      seen_ = CallerCredentialsOf(*ctx);
    }
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  CallerCredentials seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  CallerCredentials seen_ ABSL_GUARDED_BY(mu_);
};

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class RealCertificatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_THAT(::spgate::testing::MakeTestCertificates(
                    dir_, "worker", {},
                    {{"ops", "/O=ml/CN=ops-admin", ""},
                     {"lookalike", "/CN=CN=ops-admin,O=ml", ""},
                     {"evil", "/CN=evil", "DNS:ops-admin,URI:spiffe://cluster/ns/ml/sa/ops"}}),
                IsOk());
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = Read(dir_ + "/ca.pem");
    ssl.pem_key_cert_pairs.push_back({Read(dir_ + "/server.key"), Read(dir_ + "/server.pem")});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &tls_port_);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &plain_port_);
    builder.RegisterService(&gate_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Registers over mTLS with NAME.pem/.key (or plaintext for "") and returns what the
  // server saw.
  CallerCredentials CallAs(const std::string& name, const std::string& token = "") {
    std::shared_ptr<grpc::Channel> channel;
    if (name.empty()) {
      channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", plain_port_),
                                    grpc::InsecureChannelCredentials());
    } else {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = Read(dir_ + "/ca.pem");
      ssl.pem_private_key = Read(dir_ + "/" + name + ".key");
      ssl.pem_cert_chain = Read(dir_ + "/" + name + ".pem");
      grpc::ChannelArguments args;
      args.SetSslTargetNameOverride("localhost");
      channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", tls_port_),
                                          grpc::SslCredentials(ssl), args);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::RegisterResponse resp;
    const grpc::Status s =
        v1::GateService::NewStub(channel)->Register(&ctx, v1::RegisterRequest(), &resp);
    EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
    return gate_.seen();
  }

  std::string dir_;
  RecordingGate gate_;
  int tls_port_ = 0, plain_port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(RealCertificatesTest, GrpcReportsWhatTheParserExpects) {
  const CallerCredentials ops = CallAs("ops", "tok");
  EXPECT_TRUE(ops.has_certificate);
  EXPECT_EQ(ops.authorization, "Bearer tok");
  EXPECT_EQ(ops.subject, "CN=ops-admin,O=ml");  // RFC 2253: the most specific RDN first
  EXPECT_EQ(ops.common_name, "ops-admin");
  EXPECT_THAT(ops.dns_names, IsEmpty());
  EXPECT_THAT(ops.uris, IsEmpty());

  const CallerCredentials lookalike = CallAs("lookalike");
  EXPECT_EQ(lookalike.subject, "CN=CN=ops-admin\\,O=ml");
  EXPECT_EQ(lookalike.common_name, "CN=ops-admin,O=ml");
  EXPECT_FALSE(lookalike.authorization.has_value());

  const CallerCredentials evil = CallAs("evil");
  EXPECT_EQ(evil.subject, "CN=evil");
  EXPECT_EQ(evil.common_name, "evil");
  EXPECT_THAT(evil.dns_names, ElementsAre("ops-admin"));
  EXPECT_THAT(evil.uris, ElementsAre("spiffe://cluster/ns/ml/sa/ops"));

  const CallerCredentials plain = CallAs("", "tok");
  EXPECT_FALSE(plain.has_certificate);
  EXPECT_EQ(plain.authorization, "Bearer tok");
  EXPECT_THAT(plain.subject, IsEmpty());
}

// The review's two cases on real handshakes: each typed entry matches its own
// certificate and not the look-alike.
TEST_F(RealCertificatesTest, TypedIdentitiesTellTheLookAlikesApart) {
  const CallerCredentials ops = CallAs("ops");
  const CallerCredentials lookalike = CallAs("lookalike");
  const CallerCredentials evil = CallAs("evil");
  const struct {
    const char* identity;
    bool ops, lookalike, evil;
  } cases[] = {
      {"subject:CN=ops-admin,O=ml", true, false, false},
      {"cn:ops-admin", true, false, false},
      {"dns:ops-admin", false, false, true},
      {"uri:spiffe://cluster/ns/ml/sa/ops", false, false, true},
  };
  for (const auto& c : cases) {
    absl::StatusOr<CertIdentity> id = CertIdentity::Parse(c.identity);
    ASSERT_THAT(id.status(), IsOk());
    EXPECT_EQ(id->Matches(ops), c.ops) << c.identity;
    EXPECT_EQ(id->Matches(lookalike), c.lookalike) << c.identity;
    EXPECT_EQ(id->Matches(evil), c.evil) << c.identity;
  }
}

}  // namespace
}  // namespace spgate::server
