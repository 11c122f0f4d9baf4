// What a caller presented to spgated — the authorization metadata and, on an mTLS
// connection, its verified client certificate's identities — and the typed certificate
// identities the subjects files name (docs/security.md, "Admin roles and credentials"
// and "Worker credentials"). Admin and worker authorization (admin_auth.h,
// worker_auth.h) are pure functions over these; CallerCredentialsOf is the one place
// that reads them out of a gRPC call.
//
// Invariant: an identity names one kind of certificate field and matches only that
// field. `cn:ops-admin` is the common name and never a DNS SAN; `subject:CN=a,O=b` is
// the whole subject compared as a parsed distinguished name, so a certificate whose CN
// is the literal text "CN=a,O=b" (subject `CN=CN=a\,O=b`) never equals it.
//
// Usage:
//   ASSIGN_OR_RETURN(CertIdentity id, CertIdentity::Parse("dns:trainer.ml.svc"));
//   CallerCredentials caller = CallerCredentialsOf(*ctx);  // in a handler
//   if (id.Matches(caller)) ...
#ifndef SPGATE_SERVER_CALL_CREDENTIALS_H_
#define SPGATE_SERVER_CALL_CREDENTIALS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace spgate::server {

// What the caller presented.
// (Every member has an initializer, so designated initializers may name only some.)
struct CallerCredentials {
  std::optional<std::string> authorization{};  // the "authorization" metadata, verbatim
  bool authorization_repeated = false;          // sent more than once: which one is meant?
  // The client certificate of an mTLS connection, already verified by the TLS layer
  // against --tls_client_ca, as gRPC's auth context reports it. Empty without one.
  bool has_certificate = false;
  std::string subject{};                 // x509_subject: RFC 2253 as OpenSSL prints it
  std::string common_name{};             // x509_common_name: the CN's text, unescaped
  std::vector<std::string> dns_names{};  // peer_dns: DNS subjectAltNames
  std::vector<std::string> uris{};       // peer_uri: URI subjectAltNames (SPIFFE ids)
};

// The credentials of the call `ctx` serves: its "authorization" metadata and, when the
// connection is TLS with a client certificate, the certificate's subject, CN, DNS and
// URI SANs. Never fails; a caller without either gets an empty CallerCredentials.
CallerCredentials CallerCredentialsOf(const grpc::ServerContextBase& ctx);

// The token of "authorization: Bearer <token>": nullopt when the caller sent no
// authorization metadata; PERMISSION_DENIED when it is not of that form (as a wrong
// token is: existing scripts see the same code).
absl::StatusOr<std::optional<absl::string_view>> BearerToken(const CallerCredentials& caller);

// Equal strings, compared in time that does not depend on where they first differ (for
// secrets: tokens on the admin and worker APIs).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// A parsed distinguished name (RFC 4514, which RFC 2253 output also is): a sequence of
// RDNs, each a set of attribute=value pairs. Attribute types compare case-insensitively
// (and the common OIDs equal their names: 2.5.4.3 is CN); values compare exactly, after
// escapes are undone (`\,`, `\2C`); a `#hex` value is the DER bytes and equals only
// another `#hex` value. Spaces around ',', '+' and '=' are ignored, escaped ones kept.
struct DnAttribute {
  std::string type;   // upper case, OIDs of known names replaced by the name
  std::string value;  // unescaped bytes; hex digits (lower case) when `der`
  bool der = false;   // written as #hex
  bool operator==(const DnAttribute&) const = default;
  auto operator<=>(const DnAttribute&) const = default;
};
struct DistinguishedName {
  std::vector<std::vector<DnAttribute>> rdns;  // in written order; each RDN sorted
  bool operator==(const DistinguishedName&) const = default;
};
// INVALID_ARGUMENT saying what is wrong and where (no file or flag: the caller adds them).
absl::StatusOr<DistinguishedName> ParseDistinguishedName(absl::string_view text);

enum class IdentityKind { kCommonName, kDnsName, kUri, kSubject };

// One typed identity of a subjects file: `cn:NAME`, `dns:NAME`, `uri:URI` or
// `subject:DN`. Which kind is part of the identity, so an entry never matches a field
// of another kind.
class CertIdentity {
 public:
  // INVALID_ARGUMENT for an untyped entry, or one that could be meant as another kind
  // (a `cn:` holding '=', a `dns:` that is not a DNS name), naming the fix: "write
  // cn:ops-admin or dns:ops-admin". The message has no file or line: the caller adds them.
  static absl::StatusOr<CertIdentity> Parse(absl::string_view text);

  bool Matches(const CallerCredentials& caller) const;
  IdentityKind kind() const { return kind_; }
  // "cn:ops-admin": the kind in lower case and the value as written. It is the principal
  // of a certificate caller, and cannot collide with a token's name (which has no ':').
  const std::string& name() const { return name_; }

 private:
  IdentityKind kind_ = IdentityKind::kCommonName;
  std::string value_;               // after the prefix
  std::string name_;                // kind:value
  std::optional<DistinguishedName> subject_;  // kSubject
};

// How to name a certificate caller in a refusal: its subject, else its first SAN.
std::string DescribeCertificate(const CallerCredentials& caller);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_CALL_CREDENTIALS_H_
