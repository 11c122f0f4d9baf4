// Which worker may act for which job (docs/security.md, "Worker credentials"). A worker
// credential is a bearer token (--worker_token_file) or a typed client-certificate
// identity (--worker_subjects_file), each scoped to job-id patterns, so one tenant's
// credential cannot register, connect or decide under another tenant's job id.
// AuthorizeWorkerCall is a pure function of the configured credentials, what the caller
// presented (server/call_credentials.h) and the job id the call acts for.
//
// Invariants (admin_auth.h's, where they apply):
//  - nothing configured: every call is allowed, for every job (with only
//    --tls_client_ca, the TLS layer has already required a certificate from the CA);
//  - configured: no credential is UNAUTHENTICATED, a wrong token PERMISSION_DENIED
//    ("the worker token does not match"), an unlisted certificate PERMISSION_DENIED, a
//    valid credential whose patterns do not cover the job PERMISSION_DENIED naming the
//    job id the caller sent and the credential's name — never its secret, never the
//    jobs it does cover;
//  - a presented token decides alone; without one a certificate listed in
//    --worker_subjects_file decides (the union of its matching lines' patterns).
//
// Usage:
//   ASSIGN_OR_RETURN(WorkerAuthConfig auth, LoadWorkerAuth(token_file, subjects_file));
//   RETURN_IF_ERROR(AuthorizeWorkerCall(auth, CallerCredentialsOf(*ctx), request.job_id()));
// A stream whose job is known only later authenticates first and checks the job then:
//   ASSIGN_OR_RETURN(WorkerGrant grant, AuthenticateWorker(auth, CallerCredentialsOf(*ctx)));
//   ...                                    // the first message names the session
//   RETURN_IF_ERROR(CheckWorkerJob(grant, session.job_id));
#ifndef SPGATE_SERVER_WORKER_AUTH_H_
#define SPGATE_SERVER_WORKER_AUTH_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/call_credentials.h"

namespace spgate::server {

// Job-id patterns: fnmatch(3) globs without flags ("llama-*"; "*" is every job). Job ids
// are [A-Za-z0-9._-], so '*' is the only character with a meaning.
struct JobScope {
  std::vector<std::string> patterns;
  bool Covers(std::string_view job_id) const;
};

struct WorkerToken {
  std::string name;    // the principal: NAME, or the file's basename for a bare token
  std::string secret;
  JobScope jobs;       // a bare token: {"*"}
  std::string where;   // "PATH line N": where a start-up error points
};

struct WorkerSubject {
  CertIdentity identity;  // its name() is the principal
  JobScope jobs;
};

struct WorkerAuthConfig {
  std::vector<WorkerToken> tokens;
  std::vector<WorkerSubject> subjects;
  bool configured() const { return !tokens.empty() || !subjects.empty(); }
};

// An authenticated worker caller: who, and the jobs it may act for.
struct WorkerGrant {
  std::string name;    // "anonymous" when nothing is configured; never a secret
  std::string source;  // the flag whose file named it ("" when nothing is configured)
  JobScope jobs;
};

// Who the caller is; the errors of AuthorizeWorkerCall but the job's.
absl::StatusOr<WorkerGrant> AuthenticateWorker(const WorkerAuthConfig& auth,
                                               const CallerCredentials& caller);
// Where a call's job id came from: the request named it, or the session the request
// named did (a caller holding another's session id must not learn that session's job).
enum class JobNamedBy { kCaller, kSession };
// PERMISSION_DENIED naming grant.name, and `job_id` when the caller named it, when
// grant.jobs does not cover it.
absl::Status CheckWorkerJob(const WorkerGrant& grant, std::string_view job_id,
                            JobNamedBy named_by = JobNamedBy::kCaller);
// Both: the one call a worker RPC makes once it knows its job id.
absl::Status AuthorizeWorkerCall(const WorkerAuthConfig& auth, const CallerCredentials& caller,
                                 std::string_view job_id,
                                 JobNamedBy named_by = JobNamedBy::kCaller);

// --worker_token_file: one credential per non-empty line, `NAME:TOKEN
// JOB_PATTERN[,JOB_PATTERN...]`; '#' starts a comment line. A file whose only credential
// is a bare `TOKEN` (no ':', no patterns) keeps working: that token may act for every
// job and is named after the file's basename. NAME is [A-Za-z0-9._@-]+; a token or a
// name in two lines is an error. Errors name the flag, the file and the line.
absl::StatusOr<std::vector<WorkerToken>> ParseWorkerTokenFile(const std::string& path,
                                                              const std::string& text);
// --worker_subjects_file: one `IDENTITY JOB_PATTERN[,JOB_PATTERN...]` per non-empty
// line, IDENTITY typed as in CertIdentity::Parse (`cn:trainer-a llama-*`,
// `uri:spiffe://cluster/ns/ml/sa/trainer llama-*,gpt-*`); the patterns are the last
// field, without spaces. Errors name the flag, the file and the line.
absl::StatusOr<std::vector<WorkerSubject>> ParseWorkerSubjectsFile(const std::string& path,
                                                                   const std::string& text);

// Reads the files (an empty path: none). Errors name the flag and the file.
absl::StatusOr<WorkerAuthConfig> LoadWorkerAuth(const std::string& token_file,
                                                const std::string& subjects_file);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_WORKER_AUTH_H_
