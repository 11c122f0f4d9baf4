// The clients' TLS flags; see tls_flags.h.
#include "worker/client/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "", "PEM roots that sign the daemon's certificate; turns TLS on");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mTLS (needs --tls_key); turns TLS on");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check in the daemon's certificate (default: the host of --controller)");
ABSL_FLAG(std::string, worker_token_file, "",
          "File holding the worker token of a spgated run with --worker_token_file: its "
          "first credential line, TOKEN or NAME:TOKEN [JOB_PATTERNS] (only TOKEN is sent, as "
          "'authorization: Bearer <token>'; surrounding whitespace is stripped)");

namespace spgate::client {

TlsClientOptions TlsOptionsFromFlags() {
  return {.ca = absl::GetFlag(FLAGS_tls_ca),
          .cert = absl::GetFlag(FLAGS_tls_cert),
          .key = absl::GetFlag(FLAGS_tls_key),
          .server_name = absl::GetFlag(FLAGS_tls_server_name)};
}

std::string WorkerTokenFileFromFlags() { return absl::GetFlag(FLAGS_worker_token_file); }

}  // namespace spgate::client
