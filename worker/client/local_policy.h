// The worker's fail-static fallback: the daemon's own gate policy (EvaluateGates) run by
// the group leader over the group state it keeps in step with the decisions the group
// actually ran. Invariant: every decision the group runs — the daemon's or a local one —
// advances this state exactly once and in step order, so a local decision is the one the
// daemon would make given the same config, state and rolling wait share.
//
// The config in force for a step is the newest scheduled config whose
// effective_from_step is <= the step; a config never applies in the middle of a step
// because it is looked up once, when the step is decided.
//
// The rolling reduce-scatter wait share is fed by ObserveRsWaitShare with the value the
// leader has for an SP step (the group max when the trainer all-reduces it, otherwise the
// leader's own share — a lower bound of the group value). See docs/client.md.
//
// Not thread-safe: GateClient guards it with its mutex; spgate-sim replay owns one per
// simulated group.
//
// Usage:
//   spgate::client::LocalGatePolicy policy(spgate::GateConfig{}, /*version=*/0);
//   policy.ScheduleConfig(new_config, /*version=*/7, /*effective_from_step=*/102);
//   spgate::client::LocalDecision d = policy.Decide(facts);   // facts.step = 100
//   policy.ObserveRsWaitShare(100, Mode::kSequenceParallel, 0.08);
//   policy.Adopt(101, Mode::kTensorParallelOnly, Reason::kLengthCv);  // daemon's answer
#ifndef SPGATE_WORKER_CLIENT_LOCAL_POLICY_H_
#define SPGATE_WORKER_CLIENT_LOCAL_POLICY_H_

#include <cstdint>
#include <optional>

#include "policy/adaptive_policy.h"
#include "policy/config_schedule.h"
#include "policy/gate_policy.h"
#include "policy/group_state.h"
#include "policy/step_plan.h"
#include "absl/time/time.h"
#include "policy/types.h"

namespace spgate::client {

using ScheduledConfig = spgate::ScheduledConfig;

struct LocalDecision {
  Decision decision;       // what the policy decided (reason is the gate, never
                           // CONTROLLER_UNAVAILABLE)
  int64_t config_version = 0;
};

class LocalGatePolicy {
 public:
  explicit LocalGatePolicy(const GateConfig& initial = GateConfig{}, int64_t version = 0)
      : schedule_(initial, version) {}

  // `config` applies to steps >= effective_from_step (see policy/config_schedule.h).
  void ScheduleConfig(const GateConfig& config, int64_t version, int64_t effective_from_step) {
    schedule_.Schedule(config, version, effective_from_step);
  }

  // The config in force for `step`.
  const ScheduledConfig& ConfigFor(int64_t step) const { return schedule_.At(step); }

  // Decides `facts.step` with the policy and advances the state. An operator pin that was
  // in force when the daemon was last heard from stays in force until it expires at `now`
  // (the operator's explicit choice outlives the daemon's absence, not its own end).
  // `sp_required`: this rank declared a feature that needs SP throughout (JobDirective).
  LocalDecision Decide(const BatchFacts& facts, bool sp_required = false,
                       absl::Time now = absl::InfinitePast());

  // Advances the state with a decision the daemon made for `step`, exactly as the
  // daemon's own evaluation advanced its copy (policy/group_state.h). A PINNED decision
  // carries the pin's end and force, which the fallback keeps.
  void Adopt(int64_t step, Mode mode, Reason reason,
             std::optional<absl::Time> pin_expire = std::nullopt, bool pin_forced = false);

  // Step plans (docs/design.md §12): every micro-batch of a stage's step, as the daemon
  // decides them (DecideStagePlan with the same inputs: the learned table is the stage's,
  // as the daemon pushes it to the stage's leaders, and with cp > 1 the decision comes
  // from the plan alone so that the CP ranks' groups decide alike without talking).
  StagePlanOutcome DecideStage(const JobLayout& layout, const StagePlanFacts& plan,
                               bool sp_required, absl::Time now = absl::InfinitePast());

  // One step's group reduce-scatter wait share. Only SP steps enter the window
  // (docs/design.md §2).
  void ObserveRsWaitShare(int64_t step, Mode mode, double share) {
    group_.ObserveRsWaitShare(step, mode, share, schedule_.At(step).config.window_steps);
  }

  // The job's learned throughput (a pipelined job's: this stage's) as the daemon last sent
  // it: under ADAPTIVE the fallback
  // decides with it, so a daemon outage does not take the group back to thresholds the
  // job had learned were wrong. It is not updated locally (docs/design.md §11).
  void SetLearnedTable(const ThroughputTable& table) { learned_ = table; }
  const ThroughputTable& learned_table() const { return learned_; }

  const GroupGateState& state() const { return group_.gate(); }
  RsWaitObservation rs_wait() const { return group_.rs_wait(); }
  // The pin the fallback honours at `now`, if any.
  std::optional<PinDirective> pin(absl::Time now = absl::InfinitePast()) const {
    if (!pin_ || (pin_expire_ && now >= *pin_expire_)) return std::nullopt;
    return pin_;
  }

 private:
  ConfigSchedule schedule_;
  GroupPolicyState group_;
  ThroughputTable learned_;
  std::optional<PinDirective> pin_;
  std::optional<absl::Time> pin_expire_;  // none: a pin heard of without an end
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_LOCAL_POLICY_H_
