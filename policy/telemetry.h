// The range rules for one rank's step telemetry (docs/design.md §2), shared by the
// daemon, which refuses a record that breaks them, and the worker client, which refuses
// it before it is sent, so that "sent minus acknowledged" counts only records lost in
// transit. Plain values in, a Status naming the field out.
//
// Usage:
//   spgate::StepTelemetryValues v{.step = 7, .mode = 1, .step_time_s = 0.4, ...};
//   RETURN_IF_ERROR(spgate::ValidateStepTelemetry(v));
#ifndef SPGATE_POLICY_TELEMETRY_H_
#define SPGATE_POLICY_TELEMETRY_H_

#include <cstdint>

#include "absl/status/status.h"

namespace spgate {

struct StepTelemetryValues {
  int64_t step = 0;
  int32_t mode = 0;  // the wire value: 1 = SP, 2 = TP-only; anything else is refused
  double step_time_s = 0;
  double rs_wait_s = 0;
  double all_gather_s = 0;
  double norm_stall_s = 0;
  int64_t effective_tokens = 0;
  int64_t padding_tokens = 0;
};

// step >= 0, a known mode, step_time_s finite and > 0, the three times finite and >= 0,
// token counts >= 0. INVALID_ARGUMENT naming the first field that breaks its rule.
absl::Status ValidateStepTelemetry(const StepTelemetryValues& t);

}  // namespace spgate

#endif  // SPGATE_POLICY_TELEMETRY_H_
