// RETURN_IF_ERROR / ASSIGN_OR_RETURN (Abseil 20220623 ships neither), for every folder.
//
// Usage:
//   RETURN_IF_ERROR(ValidateGateConfig(config));
//   ASSIGN_OR_RETURN(LengthStats stats, ComputeLengthStats(lengths));
#ifndef SPGATE_COMMON_STATUS_MACROS_H_
#define SPGATE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPGATE_CONCAT_INNER_(a, b) a##b
#define SPGATE_CONCAT_(a, b) SPGATE_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    const ::absl::Status spgate_status_ = (expr);    \
    if (!spgate_status_.ok()) return spgate_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  SPGATE_ASSIGN_OR_RETURN_IMPL_(SPGATE_CONCAT_(spgate_statusor_, __LINE__), lhs, rexpr)
#define SPGATE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // SPGATE_COMMON_STATUS_MACROS_H_
