// The --tls_ca, --tls_cert, --tls_key and --tls_server_name flags of the clients that are
// binaries (spgate-worker, spgate-sim), defined once so both spell and explain them alike
// (spgatectl parses its own command line but uses the same names; docs/security.md).
//
// Usage (after absl::ParseCommandLine):
//   options.tls = spgate::client::TlsOptionsFromFlags();  // checked by ReadTlsFiles
#ifndef SPGATE_WORKER_CLIENT_TLS_FLAGS_H_
#define SPGATE_WORKER_CLIENT_TLS_FLAGS_H_

#include "worker/client/tls.h"

namespace spgate::client {

TlsClientOptions TlsOptionsFromFlags();

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_TLS_FLAGS_H_
