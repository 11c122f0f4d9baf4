// The worker client's value types: what a trainer hands GateClient (options, a batch's
// plan, a step's telemetry) and what it gets back (a decision and who made it). Kept
// below the facade (gate_client.h) so that the client's own parts — the decision book,
// the wire conversion — use them without including the class they serve.
//
// Invariant: plain values only (no gRPC, no state); a GateDecision compares equal on
// every rank of a group that ran the same step the same way.
//
// Usage:
//   spgate::client::GateDecision d{.step = 7, .mode = spgate::Mode::kTensorParallelOnly,
//                                  .reason = spgate::Reason::kLengthCv,
//                                  .policy_reason = spgate::Reason::kLengthCv};
//   std::cout << DecisionSourceLabel(d.source);  // "daemon"
#ifndef SPGATE_WORKER_CLIENT_CLIENT_TYPES_H_
#define SPGATE_WORKER_CLIENT_CLIENT_TYPES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "policy/step_plan.h"
#include "policy/telemetry.h"
#include "policy/types.h"
#include "worker/client/client_options.h"  // GateClientOptions, with its table

namespace spgate::client {

using spgate::MicrobatchPlanInput;  // one micro-batch of a step plan (policy/step_plan.h)

// One batch's plan (docs/design.md §3 memory gate inputs plus the sequence lengths). A
// client with a layout (GateClientOptions::layout) sends step plans instead: every
// micro-batch of the step in `microbatches`, the stage's `resident_bytes`, and no lengths
// or predicted peaks.
struct BatchPlanInput {
  int64_t step = 0;
  std::span<const int64_t> lengths;  // tokens per sequence, each in [1, 2^24]
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;  // 0: the client's option; both 0: no memory gate
  std::span<const MicrobatchPlanInput> microbatches;
  uint64_t resident_bytes = 0;
};

enum class DecisionSource : uint8_t {
  kDaemon = 1,     // the daemon's answer arrived before the deadline
  kFallback = 2,   // late or unreachable daemon: local policy, CONTROLLER_UNAVAILABLE
  kLocalOnly = 3,  // no controller configured: local policy, the gate's own reason
  // The daemon answered TP-only for a plan whose TP-only peak the worker's own memory gate
  // says does not fit (and no operator forced it): SP ran instead, with that gate's reason
  // (decision_book.h).
  kMemoryOverride = 4,
};

// "daemon", "fallback", "local", "memory_override".
inline std::string_view DecisionSourceLabel(DecisionSource source) {
  switch (source) {
    case DecisionSource::kDaemon: return "daemon";
    case DecisionSource::kFallback: return "fallback";
    case DecisionSource::kLocalOnly: return "local";
    case DecisionSource::kMemoryOverride: return "memory_override";
  }
  return "unknown";
}

struct GateDecision {
  int64_t step = 0;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;         // as run and reported
  Reason policy_reason = Reason::kGatesPassed;  // the gate that decided (== reason
                                                // unless reason is CONTROLLER_UNAVAILABLE)
  DecisionSource source = DecisionSource::kDaemon;
  int64_t config_version = 0;
  // PINNED decisions from the daemon: when the pin ends and whether it was forced, so a
  // fallback that keeps honouring the pin while the daemon is away stops on time.
  std::optional<absl::Time> pin_expire;
  bool pin_forced = false;
  // A step plan's answer: one decision per micro-batch, by id (mode and reason above are
  // micro-batch 0's), and the stage's predicted peak with them (docs/design.md §12). Empty
  // for a plain plan, whose one decision is mode and reason (in the daemon's answer too).
  std::vector<Decision> microbatches;
  uint64_t stage_peak_bytes = 0;
  friend bool operator==(const GateDecision&, const GateDecision&) = default;
};

// One rank's measurements of one step (docs/design.md §2); the client adds job, group and rank.
struct StepTelemetryInput {
  int64_t step = 0;
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  double step_time_s = 0;
  double rs_wait_s = 0;
  double all_gather_s = 0;
  double norm_stall_s = 0;
  int64_t effective_tokens = 0;
  int64_t padding_tokens = 0;
  uint64_t peak_memory_bytes = 0;
  // Inside all-reduce calls (TP-only's): with the waits above, what a rank's busy time
  // (BusySeconds) leaves out, so that its straggler rule can see TP-only's stragglers.
  double all_reduce_s = 0;
  // A group record's: the slowest rank's busy time less the median rank's
  // (StragglerSeconds; GroupDecider fills it). A rank's own record leaves it 0.
  double straggler_s = 0;
  // 0 or 1: this rank's own record. The group's size: the group's record, which only the
  // leader sends (GroupDecider::ReportTelemetry makes it): each value the largest of the
  // group's ranks, rs_wait_s and norm_stall_s the largest rank's share times step_time_s
  // (docs/design.md §2), with the slowest rank (the most step time outside its collective
  // waits, BusySeconds) and the rank with the highest peak.
  // A group session's client of a group of more than one takes only group records.
  int ranks = 0;
  int slowest_rank = 0;
  int peak_memory_rank = 0;
  // A step plan's step (docs/design.md §12): the stage's compute per micro-batch, one
  // record per id of the layout's micro-batches (the daemon learns a pipelined job's
  // ADAPTIVE table from these, per stage). In a group record each value is the largest
  // over the ranks (GroupDecider reduces them).
  std::vector<MicrobatchTelemetryValues> microbatches;
};

// The values the telemetry rules check (policy/telemetry.h), as the daemon gets them.
inline StepTelemetryValues TelemetryValues(const StepTelemetryInput& t) {
  return {.step = t.step,
          .mode = static_cast<int32_t>(t.mode),
          .step_time_s = t.step_time_s,
          .rs_wait_s = t.rs_wait_s,
          .all_gather_s = t.all_gather_s,
          .norm_stall_s = t.norm_stall_s,
          .effective_tokens = t.effective_tokens,
          .padding_tokens = t.padding_tokens,
          .all_reduce_s = t.all_reduce_s,
          .straggler_s = t.straggler_s};
}

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_CLIENT_TYPES_H_
