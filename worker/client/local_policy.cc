// LocalGatePolicy: config schedule, group state and rolling wait share for the leader's
// fail-static decisions; see local_policy.h.
#include "worker/client/local_policy.h"

#include <limits>

namespace spgate::client {

LocalGatePolicy::LocalGatePolicy(const GateConfig& initial, int64_t version)
    : window_(initial.window_steps) {
  schedule_.push_back({initial, version, std::numeric_limits<int64_t>::min()});
}

void LocalGatePolicy::ScheduleConfig(const GateConfig& config, int64_t version,
                                     int64_t effective_from_step) {
  while (schedule_.size() > 1 && schedule_.back().effective_from_step >= effective_from_step) {
    schedule_.pop_back();
  }
  if (schedule_.back().effective_from_step >= effective_from_step) {
    // The only entry left starts at or after this one: the new config replaces it.
    schedule_.back() = {config, version, effective_from_step};
    return;
  }
  schedule_.push_back({config, version, effective_from_step});
}

const ScheduledConfig& LocalGatePolicy::ConfigFor(int64_t step) const {
  for (auto it = schedule_.rbegin(); it != schedule_.rend(); ++it) {
    if (it->effective_from_step <= step) return *it;
  }
  // Every entry starts after `step` (a re-registration scheduled the daemon's config
  // from the group's next step): the oldest config is the best we know for it.
  return schedule_.front();
}

void LocalGatePolicy::Prune(int64_t step) {
  // Steps only increase: an entry is dead once its successor is in force.
  while (schedule_.size() > 1 && schedule_[1].effective_from_step <= step) {
    schedule_.pop_front();
  }
}

LocalDecision LocalGatePolicy::Decide(const BatchFacts& facts) {
  const ScheduledConfig& sc = ConfigFor(facts.step);
  window_.Resize(sc.config.window_steps);
  GateOutcome out = EvaluateGates(sc.config, state_, facts, rs_wait(), pin_);
  state_ = out.next;
  if (out.reset_rs_wait_window) window_.Clear();
  LocalDecision d{out.decision, sc.version};
  Prune(facts.step);
  return d;
}

void LocalGatePolicy::Adopt(int64_t step, Mode mode, Reason reason) {
  GroupGateState& s = state_;
  if (s.has_decision && s.mode != mode) ++s.mode_switches;
  s.has_decision = true;
  s.last_step = step;
  s.mode = mode;
  s.reason = reason;
  if (mode == Mode::kSequenceParallel) s.last_sp_step = step;
  switch (reason) {
    case Reason::kRsWait:
    case Reason::kProbe:
      if (!s.rs_wait_fallback) {
        // Entering the fallback: the daemon discards the samples that tripped the gate.
        s.rs_wait_fallback = true;
        s.rs_wait_changed_step = step;
        if (reason == Reason::kRsWait) window_.Clear();
      }
      break;
    case Reason::kGatesPassed:
      if (s.rs_wait_fallback) {
        s.rs_wait_fallback = false;
        s.rs_wait_changed_step = step;
      }
      break;
    default:
      // Pin, memory and length-CV decisions leave the RS_WAIT hysteresis as it was.
      break;
  }
  pin_ = reason == Reason::kPinned ? std::optional<Mode>(mode) : std::nullopt;
  Prune(step);
}

void LocalGatePolicy::ObserveRsWaitShare(int64_t step, Mode mode, double share) {
  if (mode != Mode::kSequenceParallel) return;
  window_.Resize(ConfigFor(step).config.window_steps);
  window_.Push(share);
}

}  // namespace spgate::client
