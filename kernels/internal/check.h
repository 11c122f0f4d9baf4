// Private helpers for the kernels' argument checks: every public entry point
// validates shapes and pointers on the host, before touching memory or the
// device, and answers INVALID_ARGUMENT naming the offending field. Not part of
// the public API. RETURN_IF_ERROR / ASSIGN_OR_RETURN are the project's one pair
// (common/status_macros.h).
#ifndef SPGATE_KERNELS_INTERNAL_CHECK_H_
#define SPGATE_KERNELS_INTERNAL_CHECK_H_

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace spgate::kernels::internal {

inline absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

inline absl::Status CheckPositive(absl::string_view op, absl::string_view field,
                                  int64_t value) {
  if (value > 0) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " must be > 0, got ", value));
}

inline absl::Status CheckNonNegative(absl::string_view op, absl::string_view field,
                                     int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " must be >= 0, got ", value));
}

inline absl::Status CheckNotNull(absl::string_view op, absl::string_view field,
                                 const void* p) {
  if (p != nullptr) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " must not be null"));
}

// BLAS and CUDA grid dimensions are 32-bit; refuse shapes that would overflow.
inline absl::Status CheckFitsInt32(absl::string_view op, absl::string_view field,
                                   int64_t value) {
  if (value <= std::numeric_limits<int32_t>::max()) return absl::OkStatus();
  return absl::OutOfRangeError(
      absl::StrCat(op, ": ", field, " = ", value, " exceeds the 32-bit BLAS limit"));
}

// The references' input sizes: exactly `want` elements.
inline absl::Status CheckSize(absl::string_view op, absl::string_view field,
                              absl::Span<const double> v, int64_t want) {
  if (static_cast<int64_t>(v.size()) == want) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " has ", v.size(), " elements, want ", want));
}

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_CHECK_H_
