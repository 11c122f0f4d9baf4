// Everything the gates keep per TP group, in one place: the gate state (GroupGateState)
// and the rolling reduce-scatter wait share it reads. The daemon keeps one per group and
// the worker's fail-static fallback keeps one for its group; both advance it only through
// the methods below, so the same inputs give the same decisions on both sides
// (docs/design.md §3, §4).
//
// Invariants:
//  - every decision the group runs advances the state exactly once, in step order
//    (Decide when deciding here, Adopt when someone else decided);
//  - only SP steps enter the wait-share window (an TP-only step has no reduce-scatter),
//    and a step decided before the group entered the RS_WAIT fallback does not enter it
//    after (plans are pipelined, so such a step can report late; its sample belongs to
//    the past the fallback discarded, not to the probes that decide when SP resumes);
//  - the window holds at most window_steps samples of the config in force for the step
//    being decided or observed.
//
// Not thread-safe; pure (no clock, no I/O).
//
// Usage:
//   spgate::GroupPolicyState group;
//   spgate::Decision d = group.Decide(config, facts, pin).decision;
//   group.ObserveRsWaitShare(facts.step, d.mode, /*share=*/0.08, config.window_steps);
//   group.Adopt(facts.step + 1, daemon_decision, config);
#ifndef SPGATE_POLICY_GROUP_STATE_H_
#define SPGATE_POLICY_GROUP_STATE_H_

#include <optional>
#include <vector>

#include "policy/adaptive_policy.h"
#include "policy/gate_policy.h"
#include "policy/rolling_window.h"
#include "policy/types.h"

namespace spgate {

class GroupPolicyState {
 public:
  GroupPolicyState() : window_(GateConfig{}.window_steps) {}

  // Evaluates config.policy for `batch` and advances the state. `table` is the job's
  // learned throughput (ADAPTIVE; null: nothing learned).
  GateOutcome Decide(const GateConfig& config, const BatchFacts& batch,
                     std::optional<PinDirective> pin, const ThroughputTable* table = nullptr,
                     std::vector<GateCheck>* trace = nullptr) {
    window_.Resize(config.window_steps);
    GateOutcome out = EvaluatePolicy(config, gate_, batch, rs_wait(), pin, table, trace);
    Apply(out);
    return out;
  }

  // The policy's answer for `batch` without changing anything (what-if).
  GateOutcome Peek(const GateConfig& config, const BatchFacts& batch,
                   std::optional<PinDirective> pin, const ThroughputTable* table = nullptr,
                   std::vector<GateCheck>* trace = nullptr) const {
    RollingWindow w = window_;
    w.Resize(config.window_steps);
    return EvaluatePolicy(config, gate_, batch, {w.Mean(), w.size()}, pin, table, trace);
  }

  // Advances the state with a decision made elsewhere for `step` under `config`, exactly
  // as Decide would have advanced it had it made that decision.
  void Adopt(int64_t step, Decision decision, const GateConfig& config) {
    window_.Resize(config.window_steps);
    Apply(AdvanceGroupState(gate_, step, decision, config.policy));
  }

  // One step's group reduce-scatter wait share (max over the group's ranks).
  void ObserveRsWaitShare(int64_t step, Mode mode, double share, int64_t window_steps) {
    if (mode != Mode::kSequenceParallel) return;
    if (gate_.rs_wait_fallback && step < gate_.rs_wait_changed_step) return;
    window_.Resize(window_steps);
    window_.Push(share);
  }

  // Sizes the wait-share window for `config` before the state is read without Decide (a
  // step plan's micro-batches: EvaluatePolicy, then Adopt), as Decide does first.
  void Prepare(const GateConfig& config) { window_.Resize(config.window_steps); }

  const GroupGateState& gate() const { return gate_; }
  RsWaitObservation rs_wait() const { return {window_.Mean(), window_.size()}; }

 private:
  void Apply(const GateOutcome& out) {
    gate_ = out.next;
    if (out.reset_rs_wait_window) window_.Clear();
  }

  GroupGateState gate_;
  RollingWindow window_;
};

}  // namespace spgate

#endif  // SPGATE_POLICY_GROUP_STATE_H_
