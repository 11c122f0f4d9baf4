// The clients' TLS settings -> gRPC channel credentials; see tls.h.
#include "worker/client/tls.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/bearer_token.h"
#include "common/status_macros.h"
#include "grpcpp/security/credentials.h"

namespace spgate::client {
namespace {

absl::Status ReadPem(const char* name, const std::string& path, std::string* out) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(name, ": cannot read \"", path, "\""));
  *out = text.str();
  // An empty file would turn into "no roots" or "no certificate" inside gRPC and fail
  // at the first handshake with a far vaguer message.
  if (out->empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": \"", path, "\" is empty"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsPem> ReadTlsFiles(const TlsClientOptions& o, const TlsOptionNames& names) {
  if (o.cert.empty() != o.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.cert, " and ", names.key, " go together (a client certificate needs its key)"));
  }
  if (!o.enabled() && !o.server_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.server_name, " needs TLS: give ", names.ca, " (and ", names.cert, "/", names.key,
        " for mTLS)"));
  }
  TlsPem pem;
  if (absl::Status s = ReadPem(names.ca, o.ca, &pem.roots); !s.ok()) return s;
  if (absl::Status s = ReadPem(names.cert, o.cert, &pem.cert_chain); !s.ok()) return s;
  if (absl::Status s = ReadPem(names.key, o.key, &pem.private_key); !s.ok()) return s;
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const TlsClientOptions& options, const TlsOptionNames& names) {
  absl::StatusOr<TlsPem> pem = ReadTlsFiles(options, names);
  if (!pem.ok()) return pem.status();
  if (!options.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(pem->roots);  // empty: gRPC's default roots
  ssl.pem_cert_chain = std::move(pem->cert_chain);
  ssl.pem_private_key = std::move(pem->private_key);
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::string> ReadWorkerTokenFile(const std::string& path, const char* name) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(name, ": cannot read \"", path, "\""));
  const std::string whole = text.str();
  for (absl::string_view line : absl::StrSplit(WithoutByteOrderMark(whole), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    // The credential is the first field; job patterns may follow (the daemon's).
    absl::string_view token = line.substr(0, line.find_first_of(" \t"));
    if (const size_t colon = token.find(':'); colon != absl::string_view::npos) {
      token.remove_prefix(colon + 1);  // NAME:TOKEN: only TOKEN is sent
    }
    // An empty token would be sent as "Bearer " and refused at every call, far from the cause.
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": \"", path, "\": the first credential line has an empty token"));
    }
    // A byte a header cannot carry: refused here, not by gRPC's abort at the first call.
    RETURN_IF_ERROR(CheckBearerToken(token, absl::StrCat(name, ": \"", path, "\"")));
    return std::string(token);
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": \"", path, "\" is empty"));
}

}  // namespace spgate::client
