// Step telemetry range rules; see telemetry.h.
#include "policy/telemetry.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace spgate {
namespace {

// The bound the plan sets on a record's tokens (plan_tokens < 0: not known): `field`
// names the record's field and `of` what the plan's count is for (" for micro-batch 3").
absl::Status CheckTokens(absl::string_view field, int64_t tokens, int64_t plan_tokens,
                         absl::string_view of) {
  if (tokens < 0 || tokens > kMaxTelemetryCount) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: must be in [0, 2^53 - 1] (exact as a double), got %d", field, tokens));
  }
  if (plan_tokens >= 0 && tokens > plan_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d exceeds the plan's %d tokens%s", field, tokens, plan_tokens, of));
  }
  return absl::OkStatus();
}

// tokens / seconds, the rate a learned table takes: finite (docs/design.md §2).
absl::Status CheckRate(absl::string_view field, int64_t tokens, double seconds) {
  const double rate = static_cast<double>(tokens) / seconds;
  if (!std::isfinite(rate)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d tokens over %g s is not a finite rate", field, tokens, seconds));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStepTelemetry(const StepTelemetryValues& t, const TelemetryBounds& bounds) {
  if (t.step < 0 || t.step > kMaxTelemetryCount) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.step: must be in [0, 2^53 - 1] (exact as a double), got %d", t.step));
  }
  if (t.mode != 1 && t.mode != 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.mode: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY, got %d", t.mode));
  }
  if (!std::isfinite(t.step_time_s) || t.step_time_s < kMinTelemetrySeconds) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.step_time_s: must be finite and >= %g, got %g", kMinTelemetrySeconds,
        t.step_time_s));
  }
  for (auto [name, v] : {std::pair{"rs_wait_s", t.rs_wait_s},
                         std::pair{"all_gather_s", t.all_gather_s},
                         std::pair{"norm_stall_s", t.norm_stall_s}}) {
    if (!std::isfinite(v) || v < 0 || v > t.step_time_s) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.%s: must be finite, >= 0 and at most step_time_s %g, got %g", name,
          t.step_time_s, v));
    }
  }
  absl::Status s = CheckTokens("telemetry.effective_tokens", t.effective_tokens,
                               bounds.plan_tokens, " for the step");
  if (s.ok()) s = CheckTokens("telemetry.padding_tokens", t.padding_tokens, -1, "");
  return s.ok() ? CheckRate("telemetry.effective_tokens", t.effective_tokens, t.step_time_s) : s;
}

absl::Status ValidateMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                                         int microbatches, const TelemetryBounds& bounds) {
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
    const std::string at = absl::StrFormat("telemetry.micro_batches[id %d]", m.id);
    if (m.mode != Mode::kSequenceParallel && m.mode != Mode::kTensorParallelOnly) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s.mode: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY, got %d", at,
          static_cast<int>(m.mode)));
    }
    for (auto [name, v] : {std::pair{"forward_s", m.forward_s},
                           std::pair{"backward_s", m.backward_s},
                           std::pair{"rs_wait_s", m.rs_wait_s},
                           std::pair{"all_gather_s", m.all_gather_s}}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s.%s: must be finite and >= 0, got %g", at, name, v));
      }
    }
    const double compute = m.compute_s();
    if (!std::isfinite(compute) || compute < kMinTelemetrySeconds) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: forward_s + backward_s must be finite and >= %g, got %g", at,
          kMinTelemetrySeconds, compute));
    }
    for (auto [name, v] :
         {std::pair{"rs_wait_s", m.rs_wait_s}, std::pair{"all_gather_s", m.all_gather_s}}) {
      if (v > compute) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.%s: %g is more than the micro-batch's forward_s + backward_s %g", at, name, v,
            compute));
      }
    }
    const int64_t plan =
        m.id >= 0 && static_cast<size_t>(m.id) < bounds.microbatch_tokens.size()
            ? bounds.microbatch_tokens[static_cast<size_t>(m.id)]
            : -1;
    absl::Status s = CheckTokens(at + ".effective_tokens", m.effective_tokens, plan,
                                 absl::StrFormat(" for micro-batch %d", m.id));
    if (s.ok()) s = CheckRate(at + ".effective_tokens", m.effective_tokens, compute);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateGroupRecord(int ranks, int slowest_rank, int peak_memory_rank,
                                 int group_size) {
  if (ranks < 0 || (ranks > 1 && ranks != group_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.ranks: must be 0 or 1 (one rank's record) or the group's size %d (the "
        "group's record), got %d",
        group_size, ranks));
  }
  if (ranks <= 1) return absl::OkStatus();
  for (auto [name, v] : {std::pair{"slowest_rank", slowest_rank},
                         std::pair{"peak_memory_rank", peak_memory_rank}}) {
    if (v < 0 || v >= ranks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.%s: must be in [0, ranks=%d), got %d", name, ranks, v));
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate
