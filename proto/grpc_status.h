// The one conversion between absl::Status and grpc::Status, for both ends of the wire
// (the daemon's services and the worker client). The RETURN_IF_ERROR / ASSIGN_OR_RETURN
// pair comes along from common/status_macros.h.
#ifndef SPGATE_PROTO_GRPC_STATUS_H_
#define SPGATE_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace spgate {

// absl and gRPC share the canonical code numbering, so the code maps one to one.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace spgate

#endif  // SPGATE_PROTO_GRPC_STATUS_H_
