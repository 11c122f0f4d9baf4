// Who may call which admin RPC (docs/design.md §6, docs/security.md). Two roles: a
// reader may call the reads, an admin everything. Credentials are bearer tokens
// (--reader_token_file, --admin_token_file) and typed certificate identities from an
// mTLS handshake mapped to roles (--admin_subjects_file: `admin cn:ops-admin`,
// `reader subject:CN=dash,O=ml`; server/call_credentials.h). AuthorizeAdminCall is a
// pure function of the configured credentials, what the caller presented and the kind of
// call; the service only gathers the caller's side from the gRPC context
// (CallerCredentialsOf).
//
// Invariants:
//  - nothing configured: every call is allowed, as before roles existed;
//  - anything configured: a call presenting no credential is UNAUTHENTICATED, a wrong
//    token PERMISSION_DENIED, a valid credential whose role is too low PERMISSION_DENIED;
//  - a presented token decides alone (a wrong token is refused even with a good cert);
//  - a subjects entry matches only the certificate field its kind names;
//  - the principal is a credential's name or the matched identity ("cn:ops-admin"),
//    never a secret, so it can go to logs and the audit file.
//
// Usage:
//   ASSIGN_OR_RETURN(AdminAuthConfig auth, LoadAdminAuth(admin_file, reader_file, subjects));
//   CallerCredentials caller = CallerCredentialsOf(*ctx);
//   absl::StatusOr<Principal> who = AuthorizeAdminCall(auth, caller, CallKind::kMutation);
#ifndef SPGATE_SERVER_ADMIN_AUTH_H_
#define SPGATE_SERVER_ADMIN_AUTH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/call_credentials.h"

namespace spgate::server {

enum class Role { kReader = 1, kAdmin = 2 };
enum class CallKind { kRead, kMutation };

struct TokenCredential {
  std::string name;    // the principal
  std::string secret;
  Role role;
  std::string where;   // "PATH line N": where a start-up error points
  bool bare = false;   // a bare TOKEN line: named after its file
};

struct SubjectCredential {
  CertIdentity identity;  // matches only the certificate field of its kind
  Role role;
};

struct AdminAuthConfig {
  std::vector<TokenCredential> tokens;
  std::vector<SubjectCredential> subjects;
  bool configured() const { return !tokens.empty() || !subjects.empty(); }
};

struct Principal {
  std::string name;  // "anonymous" when nothing is configured
  Role role;
};

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
// IDENTITY the rest of the line, typed (CertIdentity::Parse: `admin cn:ops-admin`,
// `admin subject:CN=ops-admin,O=ml`, `reader dns:ci.example.com`,
// `admin uri:spiffe://cluster/ns/ml/sa/ops`); '#' starts a comment line. An untyped
// identity is refused naming the file, the line and the fix.
absl::StatusOr<std::vector<SubjectCredential>> ParseSubjectsFile(const std::string& path,
                                                                 const std::string& text);

// Shared with the worker credential files (worker_auth.h). A credential's name is
// [A-Za-z0-9._@-]{1,128}; a file that cannot be read is FAILED_PRECONDITION naming the
// flag and the file; a bare token is named after its file's basename.
bool IsValidCredentialName(absl::string_view name);
// The principal of every call where no credential is configured (open mode), in the audit
// log and in errors; no credential may take the name.
inline constexpr absl::string_view kAnonymousPrincipal = "anonymous";
// INVALID_ARGUMENT at `where` when a bare token's file basename (its principal) holds ':'
// (a certificate principal's mark) or is kAnonymousPrincipal, or when `name` is.
absl::Status CheckBareTokenName(absl::string_view where, const std::string& path);
absl::Status CheckPrincipalName(absl::string_view where, absl::string_view name);
absl::StatusOr<std::string> ReadCredentialFile(const std::string& flag, const std::string& path);
std::string CredentialFileBasename(const std::string& path);

// Reads the files (an empty path: none). Errors name the flag and the file.
absl::StatusOr<AdminAuthConfig> LoadAdminAuth(const std::string& admin_token_file,
                                              const std::string& reader_token_file,
                                              const std::string& subjects_file);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_ADMIN_AUTH_H_
