// Step telemetry range rules; see telemetry.h.
#include "policy/telemetry.h"

#include <cmath>
#include <utility>

#include <vector>

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

absl::Status ValidateMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                                         int microbatches) {
  if (records.empty()) return absl::OkStatus();
  if (microbatches > 0) {
    if (static_cast<int64_t>(records.size()) != microbatches) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.micro_batches: %d records, the job's layout has %d micro-batches per step",
          records.size(), microbatches));
    }
    std::vector<bool> seen(static_cast<size_t>(microbatches), false);
    for (const MicrobatchTelemetryValues& m : records) {
      if (m.id < 0 || m.id >= microbatches) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "telemetry.micro_batches: id %d is outside [0, %d)", m.id, microbatches));
      }
      if (seen[m.id]) {
        return absl::InvalidArgumentError(
            absl::StrFormat("telemetry.micro_batches: id %d repeats", m.id));
      }
      seen[m.id] = true;
    }
  }
  for (const MicrobatchTelemetryValues& m : records) {
    if (m.mode != Mode::kSequenceParallel && m.mode != Mode::kTensorParallelOnly) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.micro_batches[id %d].mode: must be SEQUENCE_PARALLEL or "
          "TENSOR_PARALLEL_ONLY, got %d",
          m.id, static_cast<int>(m.mode)));
    }
    for (auto [name, v] : {std::pair{"forward_s", m.forward_s},
                           std::pair{"backward_s", m.backward_s},
                           std::pair{"rs_wait_s", m.rs_wait_s},
                           std::pair{"all_gather_s", m.all_gather_s}}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "telemetry.micro_batches[id %d].%s: must be finite and >= 0, got %g", m.id, name, v));
      }
    }
    if (!(m.compute_s() > 0) || !std::isfinite(m.compute_s())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.micro_batches[id %d]: forward_s + backward_s must be finite and > 0, got %g",
          m.id, m.compute_s()));
    }
    if (m.effective_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.micro_batches[id %d].effective_tokens: must be >= 0, got %d", m.id,
          m.effective_tokens));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate
