// The gRPC channel a GateClient dials (built in wire.cc), declared apart from the client
// so that wire.cc, which defines it, needs nothing of gate_client.h; gate_client.h
// includes it for callers that share one channel among several clients
// (GateClientOptions::channel).
//
// Invariant: the channel's keepalive and reconnect backoff follow the options (its own
// backoff never outlasts the client's), so a restarted daemon waits for the client, not
// for the channel.
#ifndef SPGATE_WORKER_CLIENT_CHANNEL_H_
#define SPGATE_WORKER_CLIENT_CHANNEL_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "worker/client/client_options.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace spgate::client {

// The channel GateClient creates (keepalive and reconnect settings of `options`), for
// callers that share one among several clients. `own_connection`: a TCP connection of its
// own instead of gRPC's process-wide one per target (spgate-sim uses one per group, like
// one per training pod).
std::shared_ptr<grpc::Channel> CreateGateChannel(const GateClientOptions& options,
                                                 bool own_connection = false);

// `controller` as a client dials it: host:port with a port in [1, 65535] (an IPv6 address
// in brackets, [::1]:50061; gRPC's dns:/// prefix allowed), or a unix socket (unix:PATH,
// unix-abstract:NAME). "" is valid: no daemon. INVALID_ARGUMENT naming controller, and
// what is wrong, otherwise: gRPC would take "host:85136" as port 19600, and ":abc" or a
// bare host as port 0, and never say so.
absl::Status ValidateControllerAddress(std::string_view controller);

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_CHANNEL_H_
