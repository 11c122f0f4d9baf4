// Step telemetry range rules; see telemetry.h.
#include "policy/telemetry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace spgate {
namespace {

// The step's record, where a micro-batch's id goes below.
constexpr int64_t kStepRecord = std::numeric_limits<int64_t>::min();

// A record's field as an error names it: the step's (`microbatch` kStepRecord) or a
// micro-batch's ("telemetry.micro_batches[id 3].rs_wait_s"; `name` empty: the micro-batch
// itself). Built only for an error: a valid record costs no string.
std::string FieldName(int64_t microbatch, absl::string_view name) {
  if (microbatch == kStepRecord) return absl::StrCat("telemetry.", name);
  return absl::StrCat("telemetry.micro_batches[id ", microbatch, "]", name.empty() ? "" : ".",
                      name);
}

// The bound the plan sets on a record's tokens (plan_tokens < 0: not known).
absl::Status CheckTokens(int64_t microbatch, absl::string_view name, int64_t tokens,
                         int64_t plan_tokens) {
  if (tokens < 0 || tokens > kMaxTelemetryCount) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: must be in [0, 2^53 - 1] (exact as a double), got %d",
        FieldName(microbatch, name), tokens));
  }
  if (plan_tokens >= 0 && tokens > plan_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d exceeds the plan's %d tokens%s", FieldName(microbatch, name), tokens,
        plan_tokens,
        microbatch == kStepRecord ? std::string(" for the step")
                                  : absl::StrFormat(" for micro-batch %d", microbatch)));
  }
  return absl::OkStatus();
}

// tokens / seconds, the rate a learned table takes: finite (docs/design.md §2).
absl::Status CheckRate(int64_t microbatch, absl::string_view name, int64_t tokens,
                       double seconds) {
  const double rate = static_cast<double>(tokens) / seconds;
  if (!std::isfinite(rate)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d tokens over %g s is not a finite rate",
                        FieldName(microbatch, name), tokens, seconds));
  }
  return absl::OkStatus();
}

}  // namespace

double StragglerSeconds(std::span<double> busy) {
  if (busy.size() < 2) return 0.0;
  const auto median = busy.begin() + static_cast<std::ptrdiff_t>(busy.size() / 2);
  std::nth_element(busy.begin(), median, busy.end());
  const double slowest = *std::max_element(median, busy.end());
  return std::max(0.0, slowest - *median);
}

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
                         std::pair{"norm_stall_s", t.norm_stall_s},
                         std::pair{"all_reduce_s", t.all_reduce_s},
                         std::pair{"straggler_s", t.straggler_s}}) {
    if (!std::isfinite(v) || v < 0 || v > t.step_time_s) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "telemetry.%s: must be finite, >= 0 and at most step_time_s %g, got %g", name,
          t.step_time_s, v));
    }
  }
  RETURN_IF_ERROR(
      CheckTokens(kStepRecord, "effective_tokens", t.effective_tokens, bounds.plan_tokens));
  RETURN_IF_ERROR(CheckTokens(kStepRecord, "padding_tokens", t.padding_tokens, -1));
  return CheckRate(kStepRecord, "effective_tokens", t.effective_tokens, t.step_time_s);
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
    // On the stack for up to 64 micro-batches: a record is checked on every step.
    absl::InlinedVector<bool, 64> seen(static_cast<size_t>(microbatches), false);
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
          "%s: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY, got %d",
          FieldName(m.id, "mode"), static_cast<int>(m.mode)));
    }
    for (auto [name, v] : {std::pair{"forward_s", m.forward_s},
                           std::pair{"backward_s", m.backward_s},
                           std::pair{"rs_wait_s", m.rs_wait_s},
                           std::pair{"all_gather_s", m.all_gather_s},
                           std::pair{"all_reduce_s", m.all_reduce_s},
                           std::pair{"straggler_s", m.straggler_s}}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: must be finite and >= 0, got %g", FieldName(m.id, name), v));
      }
    }
    const double compute = m.compute_s();
    if (!std::isfinite(compute) || compute < kMinTelemetrySeconds) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: forward_s + backward_s must be finite and >= %g, got %g", FieldName(m.id, ""),
          kMinTelemetrySeconds, compute));
    }
    for (auto [name, v] :
         {std::pair{"rs_wait_s", m.rs_wait_s}, std::pair{"all_gather_s", m.all_gather_s},
          std::pair{"all_reduce_s", m.all_reduce_s}, std::pair{"straggler_s", m.straggler_s}}) {
      if (v > compute) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %g is more than the micro-batch's forward_s + backward_s %g",
            FieldName(m.id, name), v, compute));
      }
    }
    const int64_t plan =
        m.id >= 0 && static_cast<size_t>(m.id) < bounds.microbatch_tokens.size()
            ? bounds.microbatch_tokens[static_cast<size_t>(m.id)]
            : -1;
    RETURN_IF_ERROR(CheckTokens(m.id, "effective_tokens", m.effective_tokens, plan));
    RETURN_IF_ERROR(CheckRate(m.id, "effective_tokens", m.effective_tokens, compute));
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
