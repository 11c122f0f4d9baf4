// LocalGatePolicy: the leader's fail-static decisions over the shared group state; see
// local_policy.h.
#include "worker/client/local_policy.h"

namespace spgate::client {

LocalDecision LocalGatePolicy::Decide(const BatchFacts& facts) {
  const ScheduledConfig sc = schedule_.At(facts.step);
  const GateOutcome out = group_.Decide(sc.config, facts, pin_);
  schedule_.Prune(facts.step);
  return LocalDecision{out.decision, sc.version};
}

void LocalGatePolicy::Adopt(int64_t step, Mode mode, Reason reason) {
  group_.Adopt(step, Decision{mode, reason}, schedule_.At(step).config.window_steps);
  pin_ = reason == Reason::kPinned ? std::optional<Mode>(mode) : std::nullopt;
  schedule_.Prune(step);
}

}  // namespace spgate::client
