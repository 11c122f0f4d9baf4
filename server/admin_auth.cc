// Admin roles and credentials; see admin_auth.h.
#include "server/admin_auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/bearer_token.h"
#include "common/status_macros.h"

namespace spgate::server {

bool IsValidCredentialName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '@' && c != '-') return false;
  }
  return true;
}

absl::Status CheckBareTokenName(absl::string_view where, const std::string& path) {
  const std::string name = CredentialFileBasename(path);
  RETURN_IF_ERROR(CheckPrincipalName(where, name));
  if (!absl::StrContains(name, ':')) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": a bare token is named after its file, and \"", name,
      "\" holds ':', as a certificate's principal does (subject:..., uri:...): rename the "
      "file or write NAME:TOKEN"));
}

absl::Status CheckPrincipalName(absl::string_view where, absl::string_view name) {
  if (name != kAnonymousPrincipal) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": the name ", kAnonymousPrincipal,
      " is the audit log's for a call without a credential (a daemon with none configured); "
      "choose another"));
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string CredentialFileBasename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

namespace {

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "reader"; }

}  // namespace

std::optional<CallKind> AdminCallKind(absl::string_view method) {
  static constexpr struct {
    absl::string_view method;
    CallKind kind;
  } kKinds[] = {
      {"GetGateConfig", CallKind::kRead},
      {"ListJobs", CallKind::kRead},
      {"GetJob", CallKind::kRead},
      {"WatchDecisions", CallKind::kRead},
      {"EvaluateGates", CallKind::kRead},
      {"ListConfigHistory", CallKind::kRead},
      {"UpdateGateConfig", CallKind::kMutation},
      {"PinMode", CallKind::kMutation},
      {"Unpin", CallKind::kMutation},
      {"RollbackGateConfig", CallKind::kMutation},
      {"ForgetJob", CallKind::kMutation},
  };
  for (const auto& k : kKinds) {
    if (k.method == method) return k.kind;
  }
  return std::nullopt;
}

absl::StatusOr<Principal> AuthorizeAdminCall(const AdminAuthConfig& auth,
                                             const CallerCredentials& caller, CallKind kind) {
  if (!auth.configured()) return Principal{std::string(kAnonymousPrincipal), Role::kAdmin};
  std::optional<Principal> who;
  absl::StatusOr<std::optional<absl::string_view>> token = BearerToken(caller);
  if (!token.ok()) return token.status();
  if (token->has_value()) {
    const TokenCredential* match = nullptr;
    for (const TokenCredential& t : auth.tokens) {  // no early exit: constant time
      if (ConstantTimeEquals(**token, t.secret) && match == nullptr) match = &t;
    }
    if (match == nullptr) return absl::PermissionDeniedError("the token does not match");
    who = Principal{match->name, match->role};
  } else if (caller.has_certificate && !auth.subjects.empty()) {
    for (const SubjectCredential& s : auth.subjects) {
      if (s.identity.Matches(caller) && (!who || s.role > who->role)) {
        who = Principal{s.identity.name(), s.role};
      }
    }
    if (!who) {
      return absl::PermissionDeniedError(absl::StrCat("the client certificate (",
                                                      DescribeCertificate(caller),
                                                      ") is not listed in --admin_subjects_file"));
    }
  }
  if (!who) {
    return absl::UnauthenticatedError(
        "this call needs a credential: send metadata 'authorization: Bearer <token>' "
        "(spgatectl --token_file) or a client certificate listed for a role");
  }
  if (kind == CallKind::kMutation && who->role != Role::kAdmin) {
    return absl::PermissionDeniedError(absl::StrCat(
        who->name, " has the ", RoleName(who->role),
        " role; this call changes state and needs the admin role"));
  }
  return *who;
}

absl::StatusOr<std::vector<TokenCredential>> ParseTokenFile(const std::string& flag,
                                                            const std::string& path,
                                                            const std::string& text, Role role) {
  std::vector<TokenCredential> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(text), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(flag, ": ", path, " line ", line_no);
    TokenCredential cred{CredentialFileBasename(path), std::string(line), role,
                         absl::StrCat(path, " line ", line_no)};
    if (const size_t colon = line.find(':'); colon != absl::string_view::npos) {
      cred.name = std::string(absl::StripAsciiWhitespace(line.substr(0, colon)));
      cred.secret = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      if (!IsValidCredentialName(cred.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the name before ':' must be [A-Za-z0-9._@-]+ (the line is NAME:TOKEN)"));
      }
      RETURN_IF_ERROR(CheckPrincipalName(where, cred.name));
    } else {
      RETURN_IF_ERROR(CheckBareTokenName(where, path));
      cred.bare = true;
    }
    // A token no client can send (a control byte, UTF-8) is a mistake in the file.
    RETURN_IF_ERROR(CheckBearerToken(cred.secret, where));
    // One name on two lines of a file is one principal with two tokens (a rotation's
    // overlap): fine.
    out.push_back(std::move(cred));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is empty"));
  return out;
}

absl::StatusOr<std::vector<SubjectCredential>> ParseSubjectsFile(const std::string& path,
                                                                 const std::string& text) {
  std::vector<SubjectCredential> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(text), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where =
        absl::StrCat("--admin_subjects_file: ", path, " line ", line_no, ": ");
    const size_t space = line.find_first_of(" \t");
    const absl::string_view role_text = line.substr(0, space);
    const absl::string_view identity =
        space == absl::string_view::npos ? "" : absl::StripAsciiWhitespace(line.substr(space));
    Role role = Role::kReader;
    if (role_text == "admin") {
      role = Role::kAdmin;
    } else if (role_text != "reader") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "role \"", role_text, "\" is not admin or reader (the line is ROLE IDENTITY)"));
    }
    if (identity.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "no identity after the role"));
    }
    absl::StatusOr<CertIdentity> id = CertIdentity::Parse(identity);
    if (!id.ok()) return absl::InvalidArgumentError(absl::StrCat(where, id.status().message()));
    for (const SubjectCredential& other : out) {
      if (other.identity.name() == id->name()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, id->name(), " is listed twice; give each identity one role"));
      }
    }
    out.push_back({*std::move(id), role});
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--admin_subjects_file: ", path, " is empty"));
  }
  return out;
}

absl::StatusOr<AdminAuthConfig> LoadAdminAuth(const std::string& admin_token_file,
                                              const std::string& reader_token_file,
                                              const std::string& subjects_file) {
  AdminAuthConfig auth;
  const struct {
    const char* flag;
    const std::string& path;
    Role role;
  } token_files[] = {{"--admin_token_file", admin_token_file, Role::kAdmin},
                     {"--reader_token_file", reader_token_file, Role::kReader}};
  for (const auto& f : token_files) {
    if (f.path.empty()) continue;
    auto text = ReadCredentialFile(f.flag, f.path);
    if (!text.ok()) return text.status();
    auto tokens = ParseTokenFile(f.flag, f.path, *text, f.role);
    if (!tokens.ok()) return tokens.status();
    for (TokenCredential& t : *tokens) {
      for (const TokenCredential& other : auth.tokens) {
        // One NAME given in both files would be one principal with two roles; bare tokens
        // are named after their files, and two files may share a basename.
        if (other.name == t.name && !other.bare && !t.bare) {
          return absl::InvalidArgumentError(absl::StrCat(
              f.flag, ": ", t.where, ": the name ", t.name, " is also on ", other.where,
              " (", other.role == Role::kAdmin ? "--admin_token_file" : "--reader_token_file",
              "); give each principal one name and one role"));
        }
        if (other.secret == t.secret) {
          return absl::InvalidArgumentError(absl::StrCat(
              f.flag, ": ", t.where, ": the token of ", t.name, " is also the token of ",
              other.name, " (", other.where, "); every credential needs its own token"));
        }
      }
      auth.tokens.push_back(std::move(t));
    }
  }
  if (!subjects_file.empty()) {
    auto text = ReadCredentialFile("--admin_subjects_file", subjects_file);
    if (!text.ok()) return text.status();
    auto subjects = ParseSubjectsFile(subjects_file, *text);
    if (!subjects.ok()) return subjects.status();
    auth.subjects = *std::move(subjects);
  }
  return auth;
}

}  // namespace spgate::server
