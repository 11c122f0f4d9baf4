// The gate policy (docs/design.md §3): pin, memory, length CV, reduce-scatter wait (with probes,
// a re-enable margin and a minimum dwell), otherwise SP. Pure: no I/O, no clock, no
// locks. The daemon and the worker's fail-static fallback call the same function, so
// the same (config, state, batch) gives the same decision on both sides.
//
// Usage:
//   spgate::GroupGateState state;                  // one per TP group
//   auto stats = spgate::ComputeLengthStats(lengths);   // StatusOr<LengthStats>
//   spgate::BatchFacts facts{.step = 7, .length_cv = stats->cv};
//   spgate::GateOutcome out = spgate::EvaluateGates(config, state, facts, rs, pin);
//   state = out.next;                              // keep the advanced state
//   if (out.reset_rs_wait_window) window.Clear();  // entering the RS_WAIT fallback
#ifndef SPGATE_POLICY_GATE_POLICY_H_
#define SPGATE_POLICY_GATE_POLICY_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/types.h"

namespace spgate {

struct LengthStats {
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t max_length = 0;
  double mean = 0.0;
  double cv = 0.0;  // population stddev / mean; 0 for one sequence
};

// Lengths must be in [1, kMaxSequenceLength]; an empty batch is invalid. Exact integer
// moments, so a near-uniform batch gets a CV of exactly 0 instead of rounding noise.
inline constexpr int64_t kMaxSequenceLength = int64_t{1} << 24;
inline constexpr int64_t kMaxSequencesPerBatch = int64_t{1} << 20;
absl::StatusOr<LengthStats> ComputeLengthStats(std::span<const int64_t> lengths);

// The memory gate's rule (gate 2), the one definition of "TP-only does not fit": the plan
// carries a budget (0 means unknown, and the gate is skipped) and TP-only's predicted peak
// is above budget x memory_headroom. The gates ask it, so does an unforced TP-only pin
// (which yields when it holds), and so do tools that model a fixed TP-only job.
//   if (spgate::TpOnlyOverBudget(config, facts)) { /* only SP may run this batch */ }
bool TpOnlyOverBudget(const GateConfig& config, const BatchFacts& batch);

// One line of the reason chain that EvaluateGates can record (used by the what-if API).
// `observed` and `threshold` are the values the gate compared; a gate that compared none
// (a pin, a memory gate without a budget, a wait share with no SP step yet) leaves them
// empty rather than reporting a 0 it never measured.
struct GateCheck {
  std::string gate;     // pin, memory, length_cv, rs_wait
  std::string outcome;  // pass, fire, skip
  std::optional<double> observed;
  std::optional<double> threshold;
  std::string detail;
};

struct GateOutcome {
  Decision decision;
  GroupGateState next;
  // True when this decision enters the RS_WAIT fallback: the samples that tripped the
  // gate are discarded, so that probes measure the present rather than the past.
  bool reset_rs_wait_window = false;
  // ADAPTIVE only (policy/adaptive_policy.h): the batch's band, and, when the band's
  // estimates decided, the mode the STATIC gates would have run for this batch.
  int band = -1;
  std::optional<Mode> static_choice;
  bool explored = false;  // an ADAPTIVE exploration step (reason PROBE)
  // ADAPTIVE held the group's mode although the batch's choice was the other: the flip
  // cap had no flip left, or the switch would not pay for its learned cost.
  bool flip_held = false;
};

// Advances a group's state by one decided step: the one rule, shared by EvaluateGates
// and by a fallback adopting a decision someone else made (the daemon's), for how a
// decision moves the state (mode, switches, the last SP step, the RS_WAIT hysteresis and
// its dwell, and whether the rolling wait-share window restarts). Because the transition
// depends only on (state, step, decision, policy), the daemon and the worker's copy stay
// equal. Under ADAPTIVE a PROBE (its exploration, or the gates' wait-share probe it keeps
// with their choice) leaves the RS_WAIT hysteresis alone.
GateOutcome AdvanceGroupState(const GroupGateState& state, int64_t step, Decision decision,
                              GatePolicyKind policy = GatePolicyKind::kStatic);

// The two halves of the gates, shared with the ADAPTIVE policy. PinAndMemoryGates: gates
// 1-2, a decision when the directive (a pin, or PinDirective::SpRequired) or the memory
// gate decides. ThresholdGates: gates 3-5 (length
// CV, wait share with its probes and dwell, otherwise SP), given that 1-2 did not decide.
std::optional<Decision> PinAndMemoryGates(const GateConfig& config, const BatchFacts& batch,
                                          std::optional<PinDirective> pin,
                                          std::vector<GateCheck>* trace);
Decision ThresholdGates(const GateConfig& config, const GroupGateState& state,
                        const BatchFacts& batch, const RsWaitObservation& rs_wait,
                        std::vector<GateCheck>* trace);

// Evaluates the gates for `batch` given the group's `state`. `pin` is the active operator
// pin, if any. `trace`, when not null, receives one GateCheck per gate consulted.
// Steps must increase; EvaluateGates does not check it (the caller owns idempotency).
GateOutcome EvaluateGates(const GateConfig& config, const GroupGateState& state,
                          const BatchFacts& batch, const RsWaitObservation& rs_wait,
                          std::optional<PinDirective> pin, std::vector<GateCheck>* trace = nullptr);

}  // namespace spgate

#endif  // SPGATE_POLICY_GATE_POLICY_H_
