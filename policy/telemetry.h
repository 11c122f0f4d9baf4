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
#include <span>

#include "absl/status/status.h"
#include "policy/types.h"

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

// One micro-batch of a step plan on one pipeline stage (docs/design.md §12): what ADAPTIVE
// learns a pipelined job from, per (stage, band), since a stage's step mixes micro-batches
// of both modes. The times are its compute on the stage (collectives included), without
// p2p waits and the pipeline's bubble.
struct MicrobatchTelemetryValues {
  int32_t id = 0;
  Mode mode = Mode::kSequenceParallel;
  double forward_s = 0;
  double backward_s = 0;  // recompute included
  double rs_wait_s = 0;   // of forward_s + backward_s, inside reduce-scatter calls
  double all_gather_s = 0;
  int64_t effective_tokens = 0;

  double compute_s() const { return forward_s + backward_s; }
  friend bool operator==(const MicrobatchTelemetryValues&,
                         const MicrobatchTelemetryValues&) = default;
};

// A step's micro-batch records: empty, or one per id 0 .. microbatches-1 in any order
// (CheckMicrobatchIds's rule; `microbatches` 0: the ids are not checked), each with a known
// mode, the four times finite and >= 0 with forward_s + backward_s > 0, and tokens >= 0.
// INVALID_ARGUMENT naming the micro-batch and the field.
absl::Status ValidateMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                                         int microbatches);

}  // namespace spgate

#endif  // SPGATE_POLICY_TELEMETRY_H_
