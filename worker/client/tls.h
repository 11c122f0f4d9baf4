// TLS for every spgate client (docs/design.md §10): spgate-worker, spgate-sim, spgatectl,
// the C API and the Python package turn TLS on with the same four settings and one rule,
// so a name means the same thing in each of them:
//   ca           PEM roots that sign the daemon's certificate; turns TLS on
//   cert, key    PEM client certificate and its key for mTLS, always together; turn TLS on
//   server_name  the name checked in the daemon's certificate (default: the host dialled)
// Without ca or cert the channel is plaintext. Everything is checked before anything is
// dialled: a cert without its key, a server name without TLS, or a file that cannot be
// read or is empty is INVALID_ARGUMENT naming the setting as the caller spells it
// (--tls_cert for a flag, tls_cert for a C API option).
//
// The server name is not part of the credentials: it is the channel argument
// GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, which the caller sets on its channel
// (GateClientOptions::tls_server_name does it for the worker client's channel).
//
// The worker credential (a line of a daemon's --worker_token_file) is read here too, by
// one rule for every client: ReadWorkerTokenFile.
//
// Usage:
//   TlsClientOptions tls{.ca = "ca.pem", .cert = "worker.pem", .key = "worker.key"};
//   ASSIGN_OR_RETURN(options.credentials, TlsChannelCredentials(tls, kTlsFlagNames));
//   options.tls_server_name = tls.server_name;
#ifndef SPGATE_WORKER_CLIENT_TLS_H_
#define SPGATE_WORKER_CLIENT_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace spgate::client {

struct TlsClientOptions {
  std::string ca;           // path of the PEM roots
  std::string cert;         // path of the PEM client certificate (mTLS); needs key
  std::string key;          // path of the PEM private key of cert
  std::string server_name;  // overrides the name checked in the daemon's certificate
  // TLS even with neither ca nor cert, trusting the system's roots (the Python
  // package's tls={} asks for this; the flags have no such switch).
  bool force_tls = false;
  bool enabled() const { return force_tls || !ca.empty() || !cert.empty(); }
};

// How messages spell the four settings.
struct TlsOptionNames {
  const char* ca;
  const char* cert;
  const char* key;
  const char* server_name;
};
inline constexpr TlsOptionNames kTlsFlagNames = {"--tls_ca", "--tls_cert", "--tls_key",
                                                 "--tls_server_name"};
inline constexpr TlsOptionNames kTlsOptionNames = {"tls_ca", "tls_cert", "tls_key",
                                                   "tls_server_name"};

// The PEM text of the given files ("" where a path is not given).
struct TlsPem {
  std::string roots;
  std::string cert_chain;
  std::string private_key;
};

// Checks the combination and reads the files (no gRPC: safe before MPI_Init or fork).
absl::StatusOr<TlsPem> ReadTlsFiles(const TlsClientOptions& options,
                                    const TlsOptionNames& names = kTlsFlagNames);

// SSL credentials from ReadTlsFiles when options.enabled(), else insecure ones.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const TlsClientOptions& options, const TlsOptionNames& names = kTlsFlagNames);

// The worker token in `path` (GateClientOptions::worker_token), read from a file in
// spgated's --worker_token_file format (docs/security.md, "Worker credentials"): the
// first credential line, '#' comment and blank lines skipped; of `NAME:TOKEN
// JOB_PATTERN[,...]` only TOKEN (the patterns are the daemon's business), of a bare
// `TOKEN` line the token. So an operator can hand a worker its own line, and a one-token
// file works for the daemon and the clients alike. "" when `path` is empty; a file that
// cannot be read, holds no credential line, or whose line has an empty token is
// INVALID_ARGUMENT naming `name`.
absl::StatusOr<std::string> ReadWorkerTokenFile(const std::string& path,
                                                const char* name = "--worker_token_file");

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_TLS_H_
