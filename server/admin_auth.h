// Who may call which admin RPC (docs/design.md §6, docs/security.md). Two roles: a
// reader may call the reads, an admin everything. Credentials are bearer tokens
// (--reader_token_file, --admin_token_file) and certificate identities from an mTLS
// handshake mapped to roles (--admin_subjects_file). AuthorizeAdminCall is a pure
// function of the configured credentials, what the caller presented and the kind of
// call; the service only gathers the caller's side from the gRPC context.
//
// Invariants:
//  - nothing configured: every call is allowed, as before roles existed;
//  - anything configured: a call presenting no credential is UNAUTHENTICATED, a wrong
//    token PERMISSION_DENIED, a valid credential whose role is too low PERMISSION_DENIED;
//  - a presented token decides alone (a wrong token is refused even with a good cert);
//  - the principal is a credential's name or the matched certificate identity, never a
//    secret, so it can go to logs and the audit file.
//
// Usage:
//   ASSIGN_OR_RETURN(AdminAuthConfig auth, LoadAdminAuth(admin_file, reader_file, subjects));
//   CallerCredentials caller{.authorization = header, .peer_identities = {"CN=ops"}};
//   absl::StatusOr<Principal> who = AuthorizeAdminCall(auth, caller, CallKind::kMutation);
#ifndef SPGATE_SERVER_ADMIN_AUTH_H_
#define SPGATE_SERVER_ADMIN_AUTH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spgate::server {

enum class Role { kReader = 1, kAdmin = 2 };
enum class CallKind { kRead, kMutation };

struct TokenCredential {
  std::string name;    // the principal
  std::string secret;
  Role role;
};

struct SubjectCredential {
  std::string identity;  // matched exactly against the peer's subject, CN or DNS SANs
  Role role;
};

struct AdminAuthConfig {
  std::vector<TokenCredential> tokens;
  std::vector<SubjectCredential> subjects;
  bool configured() const { return !tokens.empty() || !subjects.empty(); }
};

// What the caller presented.
struct CallerCredentials {
  std::optional<std::string> authorization;  // the "authorization" metadata, verbatim
  std::vector<std::string> peer_identities;  // verified cert subject, CN, DNS SANs
};

struct Principal {
  std::string name;  // "anonymous" when nothing is configured
  Role role;
};

// Equal strings, compared in time that does not depend on where they first differ (for
// secrets: tokens on the admin and worker APIs).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

absl::StatusOr<Principal> AuthorizeAdminCall(const AdminAuthConfig& auth,
                                             const CallerCredentials& caller, CallKind kind);

// Whether an AdminService method (by its proto name, "PinMode") reads or mutates; nullopt
// for a name not in the table. The test holds the table against the service descriptor,
// so a new RPC cannot go unclassified.
std::optional<CallKind> AdminCallKind(absl::string_view method);

// A token file: one credential per non-empty line, `NAME:TOKEN`, or a bare `TOKEN`
// (no ':'), which is named after the file's basename; '#' starts a comment line. NAME
// is [A-Za-z0-9._@-]+. `flag` names the flag in errors.
absl::StatusOr<std::vector<TokenCredential>> ParseTokenFile(const std::string& flag,
                                                            const std::string& path,
                                                            const std::string& text, Role role);
// A subjects file: one `ROLE IDENTITY` per non-empty line, ROLE `admin` or `reader`,
// IDENTITY the rest of the line (e.g. `admin CN=ops-admin,O=ml` or
// `reader ci.example.com`); '#' starts a comment line.
absl::StatusOr<std::vector<SubjectCredential>> ParseSubjectsFile(const std::string& path,
                                                                 const std::string& text);

// Reads the files (an empty path: none). Errors name the flag and the file.
absl::StatusOr<AdminAuthConfig> LoadAdminAuth(const std::string& admin_token_file,
                                              const std::string& reader_token_file,
                                              const std::string& subjects_file);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_ADMIN_AUTH_H_
