// The range rules for step telemetry (docs/design.md §2, "Range rules"), shared by the
// daemon, which refuses a record that breaks them, and the worker client, which refuses
// it before it is sent, so that "sent minus acknowledged" counts only records lost in
// transit. Plain values and what the caller knows of the step (TelemetryBounds) in, a
// Status naming the field out. Invariant: a record these accept has every rate the daemon
// derives from it (tokens / seconds, wait / step time) finite, and claims no more tokens
// than its plan held where the plan is known, so it cannot put NaN or Inf into a learned
// table.
//
// Usage:
//   spgate::StepTelemetryValues v{.step = 7, .mode = 1, .step_time_s = 0.4, ...};
//   RETURN_IF_ERROR(spgate::ValidateStepTelemetry(v, {.plan_tokens = 8192}));
#ifndef SPGATE_POLICY_TELEMETRY_H_
#define SPGATE_POLICY_TELEMETRY_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "policy/types.h"

namespace spgate {

// The shortest step, or micro-batch compute (forward_s + backward_s), a record may claim:
// 1 µs, below one kernel launch and one collective call on any accelerator, so a real step
// is far above it, while tokens over it stay finite for any token count a plan can hold.
inline constexpr double kMinTelemetrySeconds = 1e-6;

// The largest step and token count a record may carry: 2^53 - 1, the last integer a
// double holds exactly, so the group's MAX-reduce (which carries them as doubles,
// docs/design.md §2) converts them back without loss or overflow.
inline constexpr int64_t kMaxTelemetryCount = (int64_t{1} << 53) - 1;

// A rank's step time outside the collective waits its record reports (reduce-scatter,
// all-gather, the norm boundary's, all-reduce), never negative. A group's ranks finish a
// step together at its collectives, so the rank with the most is the one the others waited
// for: the group's slowest rank (docs/design.md §2). A worker that does not time its
// all-reduces (TP-only's) reports none, and a TP-only step's busy time is then its step time.
inline double BusySeconds(double step_time_s, double rs_wait_s, double all_gather_s,
                          double norm_stall_s, double all_reduce_s = 0) {
  const double busy = step_time_s - rs_wait_s - all_gather_s - norm_stall_s - all_reduce_s;
  return busy > 0 ? busy : 0.0;
}

// A step's straggler delay (docs/design.md §2): the seconds its slowest rank was busy
// beyond its median rank (the upper median of an even count), from the ranks' BusySeconds.
// 0 for fewer than two ranks. Reorders `busy`.
double StragglerSeconds(std::span<double> busy);
// The most busy times a step's micro-batches' straggler delays are taken from (micro-batches
// × ranks: 64 micro-batches of a TP-8 group, 32 KiB): beyond, the daemon and a group's
// leader keep none, and the micro-batches' delays are not measured.
inline constexpr size_t kMaxStragglerBusyValues = 4096;

// What the checker knows of the step a record reports: its plan's tokens (Σ lengths), so a
// record claims no more. The daemon takes them from the step's cached decision, the
// client from its last committed plan; unknown (-1, or no entry) is not checked.
struct TelemetryBounds {
  int64_t plan_tokens = -1;                    // the step's (a step plan's: Σ micro-batches)
  std::span<const int64_t> microbatch_tokens;  // a step plan's, by id; -1: not known
};

struct StepTelemetryValues {
  int64_t step = 0;
  int32_t mode = 0;  // the wire value: 1 = SP, 2 = TP-only; anything else is refused
  double step_time_s = 0;
  double rs_wait_s = 0;
  double all_gather_s = 0;
  double norm_stall_s = 0;
  int64_t effective_tokens = 0;
  int64_t padding_tokens = 0;
  double all_reduce_s = 0;
  double straggler_s = 0;  // a group record's StragglerSeconds
};

// step in [0, kMaxTelemetryCount], a known mode, step_time_s finite and >=
// kMinTelemetrySeconds, the four waits and straggler_s finite, >= 0 and each at most
// step_time_s, token counts
// in [0, kMaxTelemetryCount], effective_tokens at most bounds.plan_tokens (when known) and
// effective_tokens / step_time_s finite. INVALID_ARGUMENT naming the first field that
// breaks its rule.
absl::Status ValidateStepTelemetry(const StepTelemetryValues& t,
                                   const TelemetryBounds& bounds = {});

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
  double all_reduce_s = 0;  // of forward_s + backward_s, inside all-reduce calls
  double straggler_s = 0;   // a group record's: StragglerSeconds of the ranks' compute

  double compute_s() const { return forward_s + backward_s; }
  friend bool operator==(const MicrobatchTelemetryValues&,
                         const MicrobatchTelemetryValues&) = default;
};

// A step's micro-batch records: empty, or one per id 0 .. microbatches-1 in any order
// (CheckMicrobatchIds's rule; `microbatches` 0: the ids are not checked), each with a known
// mode, the six times finite and >= 0 with forward_s + backward_s >= kMinTelemetrySeconds
// and each wait (and straggler_s) at most that sum, tokens in [0, kMaxTelemetryCount] and
// at most bounds.microbatch_tokens[id] (when known), and tokens / (forward_s + backward_s)
// finite.
// INVALID_ARGUMENT naming the micro-batch and the field.
absl::Status ValidateMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                                         int microbatches, const TelemetryBounds& bounds = {});

// A record's group fields (docs/design.md §2): `ranks` 0 or 1 (one rank's record) or
// `group_size` (the group's, from its leader), and then slowest_rank and peak_memory_rank
// in [0, ranks). The client and the daemon both check with this; INVALID_ARGUMENT naming
// the field.
absl::Status ValidateGroupRecord(int ranks, int slowest_rank, int peak_memory_rank,
                                 int group_size);

}  // namespace spgate

#endif  // SPGATE_POLICY_TELEMETRY_H_
