// Caller credentials, distinguished names and typed certificate identities; see
// call_credentials.h.
#include "server/call_credentials.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace spgate::server {

// Compares every byte whatever the first difference, so the time taken does not tell
// how much of a guess was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::optional<absl::string_view>> BearerToken(const CallerCredentials& caller) {
  if (!caller.authorization.has_value()) return std::optional<absl::string_view>();
  if (caller.authorization_repeated) {
    return absl::PermissionDeniedError(
        "the authorization metadata was sent more than once; send one 'Bearer <token>'");
  }
  absl::string_view value = *caller.authorization;
  // The scheme is case-insensitive (RFC 7235 §2.1); the token is not.
  constexpr absl::string_view kScheme = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::PermissionDeniedError("the authorization metadata is not 'Bearer <token>'");
  }
  value.remove_prefix(kScheme.size());
  return std::optional<absl::string_view>(value);
}

CallerCredentials CallerCredentialsOf(const grpc::ServerContextBase& ctx) {
  CallerCredentials caller;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    caller.authorization = std::string(it->second.data(), it->second.size());
    caller.authorization_repeated = md.count("authorization") > 1;
  }
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return caller;
  auto values = [&](const char* property) {
    std::vector<std::string> out;
    for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
      out.emplace_back(v.data(), v.size());
    }
    return out;
  };
  // Only a TLS connection has certificate properties; with the daemon's
  // REQUIRE_AND_VERIFY, a client certificate there has been verified against
  // --tls_client_ca (the PEM property is the peer's own certificate).
  const std::vector<std::string> transport = values(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  if (transport.size() != 1 || transport[0] != GRPC_SSL_TRANSPORT_SECURITY_TYPE ||
      values(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) {
    return caller;
  }
  caller.has_certificate = true;
  // One leaf certificate has one subject and at most one CN property (gRPC reports the
  // first CN); more would mean a transport we do not understand, and then no
  // subject or CN entry matches.
  if (std::vector<std::string> s = values(GRPC_X509_SUBJECT_PROPERTY_NAME); s.size() == 1) {
    caller.subject = std::move(s[0]);
  }
  if (std::vector<std::string> cn = values(GRPC_X509_CN_PROPERTY_NAME); cn.size() == 1) {
    caller.common_name = std::move(cn[0]);
  }
  caller.dns_names = values(GRPC_PEER_DNS_PROPERTY_NAME);
  caller.uris = values(GRPC_PEER_URI_PROPERTY_NAME);
  return caller;
}

std::string DescribeCertificate(const CallerCredentials& caller) {
  // OpenSSL has escaped the subject; SANs come raw, and a refusal reaches the caller's log.
  if (!caller.subject.empty()) return caller.subject;
  if (!caller.dns_names.empty())
    return absl::StrCat("DNS:", absl::CHexEscape(caller.dns_names.front()));
  if (!caller.uris.empty()) return absl::StrCat("URI:", absl::CHexEscape(caller.uris.front()));
  return "a certificate with an empty subject";
}

// --- Distinguished names -------------------------------------------------------------

namespace {

bool IsHex(char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); }
int HexValue(char c) {
  return absl::ascii_isdigit(static_cast<unsigned char>(c)) ? c - '0'
                                                            : absl::ascii_tolower(c) - 'a' + 10;
}

// Names OpenSSL prints for the OIDs one meets in client certificates.
std::string CanonicalType(absl::string_view type) {
  static constexpr struct {
    absl::string_view oid, name;
  } kKnown[] = {{"2.5.4.3", "CN"},       {"2.5.4.6", "C"},
                {"2.5.4.7", "L"},        {"2.5.4.8", "ST"},
                {"2.5.4.9", "STREET"},   {"2.5.4.10", "O"},
                {"2.5.4.11", "OU"},      {"2.5.4.5", "SERIALNUMBER"},
                {"0.9.2342.19200300.100.1.25", "DC"},
                {"0.9.2342.19200300.100.1.1", "UID"},
                {"1.2.840.113549.1.9.1", "EMAILADDRESS"}};
  for (const auto& k : kKnown) {
    if (k.oid == type) return std::string(k.name);
  }
  std::string upper = absl::AsciiStrToUpper(type);
  if (upper == "E") return "EMAILADDRESS";
  return upper;
}

bool IsValidType(absl::string_view t) {
  if (t.empty()) return false;
  if (absl::ascii_isalpha(static_cast<unsigned char>(t[0]))) {  // descr
    return std::all_of(t.begin(), t.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-';
    });
  }
  // numericoid: number *( "." number )
  bool digit_before = false;
  for (char c : t) {
    if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      digit_before = true;
    } else if (c == '.' && digit_before) {
      digit_before = false;
    } else {
      return false;
    }
  }
  return digit_before;
}

class DnParser {
 public:
  explicit DnParser(absl::string_view text) : s_(text) {}

  absl::StatusOr<DistinguishedName> Parse() {
    DistinguishedName dn;
    SkipSpaces();
    if (i_ == s_.size()) return dn;
    for (;;) {
      std::vector<DnAttribute> rdn;
      for (;;) {
        absl::StatusOr<DnAttribute> a = Attribute();
        if (!a.ok()) return a.status();
        rdn.push_back(*std::move(a));
        if (i_ < s_.size() && s_[i_] == '+') {
          ++i_;
          continue;
        }
        break;
      }
      // A multi-valued RDN is a set: the order it is printed in does not matter.
      std::sort(rdn.begin(), rdn.end());
      dn.rdns.push_back(std::move(rdn));
      if (i_ == s_.size()) return dn;
      if (s_[i_] != ',') return Error("expected ',' or '+'");
      ++i_;
    }
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a distinguished name (RFC 4514): ", what, " at character ", i_ + 1));
  }
  void SkipSpaces() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }

  absl::StatusOr<DnAttribute> Attribute() {
    SkipSpaces();
    const size_t eq = s_.find('=', i_);
    if (eq == absl::string_view::npos) return Error("an attribute without '='");
    const absl::string_view type = absl::StripAsciiWhitespace(s_.substr(i_, eq - i_));
    if (!IsValidType(type)) {
      return Error(absl::StrCat("attribute type \"", absl::CHexEscape(type),
                                "\" is not a name or an OID"));
    }
    DnAttribute a{CanonicalType(type), "", false};
    i_ = eq + 1;
    SkipSpaces();
    if (i_ < s_.size() && s_[i_] == '#') return HexString(std::move(a));
    size_t significant = 0;  // value up to its last character that is not an unescaped space
    while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '+') {
      const char c = s_[i_];
      if (c == '\\') {
        if (i_ + 1 >= s_.size()) return Error("'\\' at the end");
        const char n = s_[i_ + 1];
        if (IsHex(n) && i_ + 2 < s_.size() && IsHex(s_[i_ + 2])) {
          a.value.push_back(static_cast<char>(HexValue(n) * 16 + HexValue(s_[i_ + 2])));
          i_ += 3;
        } else if (absl::StrContains(" \"#+,;<=>\\", n)) {
          a.value.push_back(n);
          i_ += 2;
        } else {
          return Error(absl::StrCat("'\\", std::string(1, n), "' is not an escape"));
        }
        significant = a.value.size();
        continue;
      }
      if (c == '"' || c == ';' || c == '<' || c == '>' || c == '\0') {
        return Error(absl::StrCat("'", absl::CHexEscape(std::string(1, c)),
                                  "' must be escaped with '\\'"));
      }
      a.value.push_back(c);
      if (c != ' ') significant = a.value.size();
      ++i_;
    }
    a.value.resize(significant);
    return a;
  }

  // "#" hexstring: the value's DER bytes (what OpenSSL prints for unknown types).
  absl::StatusOr<DnAttribute> HexString(DnAttribute a) {
    ++i_;
    while (i_ + 1 < s_.size() && IsHex(s_[i_]) && IsHex(s_[i_ + 1])) {
      a.value.push_back(absl::ascii_tolower(s_[i_]));
      a.value.push_back(absl::ascii_tolower(s_[i_ + 1]));
      i_ += 2;
    }
    SkipSpaces();
    if (a.value.empty() || (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '+')) {
      return Error("'#' must be followed by pairs of hex digits");
    }
    a.der = true;
    return a;
  }

  absl::string_view s_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<DistinguishedName> ParseDistinguishedName(absl::string_view text) {
  return DnParser(text).Parse();
}

// --- Typed identities ----------------------------------------------------------------

absl::StatusOr<CertIdentity> CertIdentity::Parse(absl::string_view text) {
  static constexpr struct {
    absl::string_view prefix;
    IdentityKind kind;
  } kKinds[] = {{"cn", IdentityKind::kCommonName},
                {"dns", IdentityKind::kDnsName},
                {"uri", IdentityKind::kUri},
                {"subject", IdentityKind::kSubject}};
  const size_t colon = text.find(':');
  const std::string prefix =
      colon == absl::string_view::npos ? "" : absl::AsciiStrToLower(text.substr(0, colon));
  const auto* known = std::find_if(std::begin(kKinds), std::end(kKinds),
                                   [&](const auto& k) { return k.prefix == prefix; });
  if (known == std::end(kKinds)) {
    // An untyped identity matched any field before; say which kind it most likely means.
    const std::string t(text);
    std::string fix = absl::StrCat("cn:", t, " or dns:", t);
    if (absl::StrContains(t, "://")) {
      fix = absl::StrCat("uri:", t);
    } else if (absl::StrContains(t, "=")) {
      fix = absl::StrCat("subject:", t);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", t, "\" does not say which field of the certificate it names; write ", fix,
        " (kinds: cn:NAME, dns:NAME, uri:URI, subject:DN)"));
  }
  CertIdentity id;
  id.kind_ = known->kind;
  id.value_ = std::string(text.substr(colon + 1));
  id.name_ = absl::StrCat(known->prefix, ":", id.value_);
  const std::string& v = id.value_;
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat("nothing after \"", prefix, ":\""));
  switch (id.kind_) {
    case IdentityKind::kCommonName:
      // A CN holding '=' is the look-alike of a subject (CN "CN=ops-admin,O=ml"):
      // whoever wrote it almost certainly meant the subject.
      if (absl::StrContains(v, "=")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"cn:", v, "\": a common name with '=' reads as a distinguished name; write subject:",
            v, " to match the whole subject"));
      }
      break;
    case IdentityKind::kDnsName:
      if (!std::all_of(v.begin(), v.end(), [](char c) {
            return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                   c == '_' || c == '*';
          })) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"dns:", v, "\" is not a DNS name (letters, digits, '.', '-', '*'); write uri:", v,
            " for a URI SAN, subject:", v, " for the subject, or cn:", v, " for the common name"));
      }
      break;
    case IdentityKind::kUri: {
      const size_t scheme = v.find(':');
      const bool scheme_ok =
          scheme != std::string::npos && scheme > 0 &&
          absl::ascii_isalpha(static_cast<unsigned char>(v[0])) &&
          std::all_of(v.begin(), v.begin() + scheme, [](char c) {
            return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' ||
                   c == '.';
          });
      if (!scheme_ok || std::any_of(v.begin(), v.end(), [](char c) {
            return absl::ascii_isspace(static_cast<unsigned char>(c));
          })) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"uri:", v, "\" is not a URI (SCHEME:..., e.g. spiffe://cluster/ns/ml/sa/ops)"));
      }
      break;
    }
    case IdentityKind::kSubject: {
      absl::StatusOr<DistinguishedName> dn = ParseDistinguishedName(v);
      if (!dn.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"subject:", v, "\": ", dn.status().message()));
      }
      if (dn->rdns.empty())
        return absl::InvalidArgumentError("\"subject:\" names an empty subject");
      id.subject_ = *std::move(dn);
      break;
    }
  }
  return id;
}

bool CertIdentity::Matches(const CallerCredentials& caller) const {
  if (!caller.has_certificate) return false;
  switch (kind_) {
    case IdentityKind::kCommonName:
      return caller.common_name == value_;
    case IdentityKind::kDnsName:
      // DNS names compare case-insensitively (RFC 4343).
      return std::any_of(caller.dns_names.begin(), caller.dns_names.end(),
                         [&](const std::string& d) { return absl::EqualsIgnoreCase(d, value_); });
    case IdentityKind::kUri:
      return std::find(caller.uris.begin(), caller.uris.end(), value_) != caller.uris.end();
    case IdentityKind::kSubject: {
      if (caller.subject.empty()) return false;
      absl::StatusOr<DistinguishedName> theirs = ParseDistinguishedName(caller.subject);
      return theirs.ok() && *theirs == *subject_;
    }
  }
  return false;
}

}  // namespace spgate::server
