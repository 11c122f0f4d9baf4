// Step telemetry range rules; see telemetry.h.
#include "policy/telemetry.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"

namespace spgate {

absl::Status ValidateStepTelemetry(const StepTelemetryValues& t) {
  if (t.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("telemetry.step: must be >= 0, got %d", t.step));
  }
  if (t.mode != 1 && t.mode != 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.mode: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY, got %d", t.mode));
  }
  if (!std::isfinite(t.step_time_s) || t.step_time_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("telemetry.step_time_s: must be finite and > 0, got %g", t.step_time_s));
  }
  for (auto [name, v] : {std::pair{"rs_wait_s", t.rs_wait_s},
                         std::pair{"all_gather_s", t.all_gather_s},
                         std::pair{"norm_stall_s", t.norm_stall_s}}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("telemetry.%s: must be finite and >= 0, got %g", name, v));
    }
  }
  for (auto [name, v] : {std::pair{"effective_tokens", t.effective_tokens},
                         std::pair{"padding_tokens", t.padding_tokens}}) {
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("telemetry.%s: must be >= 0, got %d", name, v));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate
