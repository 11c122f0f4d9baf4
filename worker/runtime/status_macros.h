// RETURN_IF_ERROR / ASSIGN_OR_RETURN for the worker runtime (Abseil 20220623 ships
// neither). The definitions are identical to server/status_util.h's and guarded the same
// way, so a file that includes both compiles.
#ifndef SPGATE_WORKER_RUNTIME_STATUS_MACROS_H_
#define SPGATE_WORKER_RUNTIME_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#ifndef SPGATE_CONCAT_
#define SPGATE_CONCAT_INNER_(a, b) a##b
#define SPGATE_CONCAT_(a, b) SPGATE_CONCAT_INNER_(a, b)
#endif

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

#endif  // SPGATE_WORKER_RUNTIME_STATUS_MACROS_H_
