// The --tls_ca, --tls_cert, --tls_key, --tls_server_name and --worker_token_file flags of
// the clients that are binaries (spgate-worker, spgate-sim), defined once so both spell
// and explain them alike (spgatectl parses its own command line but uses the same TLS
// names; docs/security.md).
//
// Usage (after absl::ParseCommandLine):
//   options.tls = spgate::client::TlsOptionsFromFlags();  // checked by ReadTlsFiles
//   options.worker_token_file = spgate::client::WorkerTokenFileFromFlags();  // ReadWorkerTokenFile
#ifndef SPGATE_WORKER_CLIENT_TLS_FLAGS_H_
#define SPGATE_WORKER_CLIENT_TLS_FLAGS_H_

#include <string>

#include "worker/client/tls.h"

namespace spgate::client {

TlsClientOptions TlsOptionsFromFlags();

// --worker_token_file's path ("" without the flag), read by ReadWorkerTokenFile.
std::string WorkerTokenFileFromFlags();

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_TLS_FLAGS_H_
