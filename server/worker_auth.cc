// Worker credentials scoped to job ids; see worker_auth.h.
#include "server/worker_auth.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/bearer_token.h"
#include "common/status_macros.h"
#include "server/admin_auth.h"

namespace spgate::server {
namespace {

constexpr char kTokenFlag[] = "--worker_token_file";
constexpr char kSubjectsFlag[] = "--worker_subjects_file";

// The caller's job id as it may appear in a message: escaped and bounded, since the
// caller chose it and it reaches the worker's log.
std::string QuotedJobId(std::string_view job_id) {
  constexpr size_t kMax = 128;
  const std::string shown =
      absl::CHexEscape(absl::string_view(job_id.data(), std::min(job_id.size(), kMax)));
  return absl::StrCat("\"", shown, job_id.size() > kMax ? "...\"" : "\"");
}

bool IsPatternChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
         c == '-' || c == '*';
}

// "llama-*,gpt-*" (spaces around the commas allowed) -> patterns; `where` prefixes errors.
absl::StatusOr<JobScope> ParseJobPatterns(const std::string& where, absl::string_view text) {
  JobScope scope;
  for (absl::string_view p : absl::StrSplit(text, ',')) {
    p = absl::StripAsciiWhitespace(p);
    if (p.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "an empty job pattern (patterns are separated by ',')"));
    }
    if (!std::all_of(p.begin(), p.end(), IsPatternChar)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "job pattern \"", absl::CHexEscape(p),
          "\" may hold only job-id characters [A-Za-z0-9._-] and '*'"));
    }
    scope.patterns.emplace_back(p);
  }
  return scope;
}

}  // namespace

bool JobScope::Covers(std::string_view job_id) const {
  // fnmatch reads C strings: a job id with a NUL in it is covered by nothing.
  if (job_id.find('\0') != std::string_view::npos) return false;
  const std::string id(job_id);
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return fnmatch(p.c_str(), id.c_str(), 0) == 0;
  });
}

absl::StatusOr<WorkerGrant> AuthenticateWorker(const WorkerAuthConfig& auth,
                                               const CallerCredentials& caller) {
  if (!auth.configured()) return WorkerGrant{std::string(kAnonymousPrincipal), "", JobScope{{"*"}}};
  absl::StatusOr<std::optional<absl::string_view>> token = BearerToken(caller);
  if (!token.ok()) return token.status();
  if (token->has_value()) {
    const WorkerToken* match = nullptr;
    for (const WorkerToken& t : auth.tokens) {  // no early exit: constant time
      if (ConstantTimeEquals(**token, t.secret) && match == nullptr) match = &t;
    }
    if (match == nullptr) return absl::PermissionDeniedError("the worker token does not match");
    return WorkerGrant{match->name, kTokenFlag, match->jobs};
  }
  if (caller.has_certificate && !auth.subjects.empty()) {
    std::optional<WorkerGrant> grant;
    for (const WorkerSubject& s : auth.subjects) {
      if (!s.identity.Matches(caller)) continue;
      if (!grant) grant = WorkerGrant{s.identity.name(), kSubjectsFlag, {}};
      grant->jobs.patterns.insert(grant->jobs.patterns.end(), s.jobs.patterns.begin(),
                                  s.jobs.patterns.end());
    }
    if (!grant) {
      return absl::PermissionDeniedError(absl::StrCat("the client certificate (",
                                                      DescribeCertificate(caller),
                                                      ") is not listed in ", kSubjectsFlag));
    }
    return *std::move(grant);
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "this call needs a worker credential: the worker token (", kTokenFlag,
      ") as metadata 'authorization: Bearer <token>'",
      auth.subjects.empty() ? ""
                            : absl::StrCat(", or a client certificate listed in ", kSubjectsFlag)));
}

absl::Status CheckWorkerJob(const WorkerGrant& grant, std::string_view job_id,
                            JobNamedBy named_by) {
  if (grant.jobs.Covers(job_id)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the worker credential \"", grant.name, "\" (", grant.source, ") may not act for ",
      named_by == JobNamedBy::kCaller ? absl::StrCat("job ", QuotedJobId(job_id))
                                      : std::string("the job of this session")));
}

absl::Status AuthorizeWorkerCall(const WorkerAuthConfig& auth, const CallerCredentials& caller,
                                 std::string_view job_id, JobNamedBy named_by) {
  absl::StatusOr<WorkerGrant> grant = AuthenticateWorker(auth, caller);
  if (!grant.ok()) return grant.status();
  return CheckWorkerJob(*grant, job_id, named_by);
}

absl::StatusOr<std::vector<WorkerToken>> ParseWorkerTokenFile(const std::string& path,
                                                              const std::string& text) {
  std::vector<WorkerToken> out;
  std::map<std::string, int> line_of_name;
  int line_no = 0, bare_line = 0;
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(text), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(kTokenFlag, ": ", path, " line ", line_no, ": ");
    const std::string at = absl::StrCat(kTokenFlag, ": ", path, " line ", line_no);
    const size_t space = line.find_first_of(" \t");
    const absl::string_view credential = line.substr(0, space);
    const absl::string_view patterns =
        space == absl::string_view::npos ? "" : absl::StripAsciiWhitespace(line.substr(space));
    WorkerToken t;
    if (const size_t colon = credential.find(':'); colon != absl::string_view::npos) {
      t.name = std::string(credential.substr(0, colon));
      t.secret = std::string(credential.substr(colon + 1));
      if (!IsValidCredentialName(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the name before ':' must be [A-Za-z0-9._@-]+ (the line is NAME:TOKEN "
                   "JOB_PATTERN[,JOB_PATTERN...])"));
      }
      if (t.secret.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "empty token"));
      RETURN_IF_ERROR(CheckPrincipalName(at, t.name));
      if (patterns.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "no job patterns after ", t.name,
            ":TOKEN (the line is NAME:TOKEN JOB_PATTERN[,JOB_PATTERN...]; '*' allows every job)"));
      }
      absl::StatusOr<JobScope> jobs = ParseJobPatterns(where, patterns);
      if (!jobs.ok()) return jobs.status();
      t.jobs = *std::move(jobs);
      if (auto [it, fresh] = line_of_name.emplace(t.name, line_no); !fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the name ", t.name, " is also on line ", it->second,
            "; every credential needs its own name"));
      }
    } else {
      if (absl::StrContains(patterns.substr(0, patterns.find_first_of(" \t")), ':')) {
        // "te am:TOKEN llama-*": a name with a space, not a bare token with patterns.
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the name before ':' must be [A-Za-z0-9._@-]+, no spaces (the line is "
                   "NAME:TOKEN JOB_PATTERN[,JOB_PATTERN...])"));
      }
      if (!patterns.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "a credential with job patterns needs a name: NAME:TOKEN JOB_PATTERN[,...]"));
      }
      RETURN_IF_ERROR(CheckBareTokenName(at, path));
      t = WorkerToken{CredentialFileBasename(path), std::string(credential), JobScope{{"*"}}};
      bare_line = line_no;
    }
    // A token no client can send (a control byte, UTF-8) is a mistake in the file.
    RETURN_IF_ERROR(CheckBearerToken(t.secret, at));
    t.where = absl::StrCat(path, " line ", line_no);
    for (const WorkerToken& other : out) {
      if (other.secret == t.secret) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "this token is also the token of ", other.name,
            "; every credential needs its own token"));
      }
    }
    out.push_back(std::move(t));
  }
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat(kTokenFlag, ": ", path, " is empty"));
  // A bare token names no one and allows every job: fine as a file's one shared token
  // (the format before scopes), ambiguous next to named ones.
  if (bare_line != 0 && out.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kTokenFlag, ": ", path, " line ", bare_line,
        ": a bare token (no NAME:) allows every job and must be the file's only credential; "
        "write NAME:TOKEN JOB_PATTERN[,JOB_PATTERN...] on every line"));
  }
  return out;
}

absl::StatusOr<std::vector<WorkerSubject>> ParseWorkerSubjectsFile(const std::string& path,
                                                                   const std::string& text) {
  std::vector<WorkerSubject> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(text), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(kSubjectsFlag, ": ", path, " line ", line_no, ": ");
    // The patterns are the last field: a CN or a subject may itself hold spaces.
    const size_t space = line.find_last_of(" \t");
    if (space == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "no job patterns after the identity (the line is IDENTITY "
                 "JOB_PATTERN[,JOB_PATTERN...]; '*' allows every job)"));
    }
    const absl::string_view identity = absl::StripAsciiWhitespace(line.substr(0, space));
    if (absl::EndsWith(identity, ",")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the job patterns are one comma-separated list without spaces (the line is "
                 "IDENTITY JOB_PATTERN[,JOB_PATTERN...])"));
    }
    absl::StatusOr<CertIdentity> id = CertIdentity::Parse(identity);
    if (!id.ok()) return absl::InvalidArgumentError(absl::StrCat(where, id.status().message()));
    absl::StatusOr<JobScope> jobs = ParseJobPatterns(where, line.substr(space + 1));
    if (!jobs.ok()) return jobs.status();
    for (const WorkerSubject& other : out) {
      if (other.identity.name() == id->name()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, id->name(), " is listed twice; put all its job patterns on one line"));
      }
    }
    out.push_back({*std::move(id), *std::move(jobs)});
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kSubjectsFlag, ": ", path, " is empty"));
  }
  return out;
}

absl::StatusOr<WorkerAuthConfig> LoadWorkerAuth(const std::string& token_file,
                                                const std::string& subjects_file) {
  WorkerAuthConfig auth;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadCredentialFile(kTokenFlag, token_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<WorkerToken>> tokens = ParseWorkerTokenFile(token_file, *text);
    if (!tokens.ok()) return tokens.status();
    auth.tokens = *std::move(tokens);
  }
  if (!subjects_file.empty()) {
    absl::StatusOr<std::string> text = ReadCredentialFile(kSubjectsFlag, subjects_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<WorkerSubject>> subjects =
        ParseWorkerSubjectsFile(subjects_file, *text);
    if (!subjects.ok()) return subjects.status();
    auth.subjects = *std::move(subjects);
  }
  return auth;
}

}  // namespace spgate::server
