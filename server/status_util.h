// absl::Status helpers: the one place where absl::Status becomes grpc::Status, and the
// RETURN_IF_ERROR / ASSIGN_OR_RETURN pair (Abseil 20220623 does not ship them).
#ifndef SPGATE_SERVER_STATUS_UTIL_H_
#define SPGATE_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

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

#define SPGATE_CONCAT_INNER_(a, b) a##b
#define SPGATE_CONCAT_(a, b) SPGATE_CONCAT_INNER_(a, b)

#ifndef RETURN_IF_ERROR
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status spgate_status_ = (expr);      \
    if (!spgate_status_.ok()) return spgate_status_;   \
  } while (0)
#endif

#ifndef ASSIGN_OR_RETURN
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  SPGATE_ASSIGN_OR_RETURN_IMPL_(SPGATE_CONCAT_(spgate_statusor_, __LINE__), lhs, rexpr)
#define SPGATE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()
#endif

#endif  // SPGATE_SERVER_STATUS_UTIL_H_
