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

#include <limits>
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
    Prepare(config);
    GateOutcome out = EvaluatePolicy(config, gate_, batch, rs_wait(), pin, table, trace);
    Apply(out);
    return out;
  }

  // The policy's answer for `batch` without changing anything (what-if).
  GateOutcome Peek(const GateConfig& config, const BatchFacts& batch,
                   std::optional<PinDirective> pin, const ThroughputTable* table = nullptr,
                   std::vector<GateCheck>* trace = nullptr) const {
    GroupPolicyState peek = *this;
    peek.Prepare(config);
    return EvaluatePolicy(config, peek.gate_, batch, peek.rs_wait(), pin, table, trace);
  }

  // Advances the state with a decision made elsewhere for `step` under `config`, exactly
  // as Decide would have advanced it had it made that decision.
  void Adopt(int64_t step, Decision decision, const GateConfig& config) {
    Prepare(config);
    Apply(AdvanceGroupState(gate_, step, decision, config.policy));
  }

  // One step's group reduce-scatter wait share (max over the group's ranks).
  void ObserveRsWaitShare(int64_t step, Mode mode, double share, int64_t window_steps) {
    if (mode != Mode::kSequenceParallel) return;
    if (gate_.rs_wait_fallback && step < gate_.rs_wait_changed_step) return;
    window_.Resize(window_steps);
    window_.Push(share);
  }

  // Readies the state for a decision under `config`, as Decide, Peek and Adopt do first
  // and a step plan's micro-batches (EvaluatePolicy, then Adopt) do before they read it:
  // sizes the wait-share window, and where the config raised the wait share SP resumes
  // below (max_rs_wait_share - rs_wait_reenable_margin) while the group is in the RS_WAIT
  // fallback, makes its probe due at once: a group that tripped under the old level
  // measures whether it passes the new one now, not probe_interval_steps after its last
  // SP step (docs/design.md §3).
  void Prepare(const GateConfig& config) {
    window_.Resize(config.window_steps);
    const double resume_below = config.max_rs_wait_share - config.rs_wait_reenable_margin;
    if (gate_.rs_wait_fallback && resume_below > resume_below_) {
      gate_.last_sp_step = GroupGateState{}.last_sp_step;  // never: the probe is due
    }
    resume_below_ = resume_below;
  }

  const GroupGateState& gate() const { return gate_; }
  RsWaitObservation rs_wait() const { return {window_.Mean(), window_.size()}; }

 private:
  void Apply(const GateOutcome& out) {
    gate_ = out.next;
    if (out.reset_rs_wait_window) window_.Clear();
  }

  GroupGateState gate_;
  RollingWindow window_;
  // The resume level of the config the state last decided under (Prepare); NaN: none yet.
  double resume_below_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace spgate

#endif  // SPGATE_POLICY_GROUP_STATE_H_
