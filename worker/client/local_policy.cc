// LocalGatePolicy: the leader's fail-static decisions over the shared group state; see
// local_policy.h.
#include "worker/client/local_policy.h"

namespace spgate::client {

LocalDecision LocalGatePolicy::Decide(const BatchFacts& facts, bool sp_required, absl::Time now) {
  const ScheduledConfig sc = schedule_.At(facts.step);
  const GateOutcome out =
      group_.Decide(sc.config, facts, JobDirective(sp_required, pin(now)), &learned_);
  schedule_.Prune(facts.step);
  return LocalDecision{out.decision, sc.version};
}

StagePlanOutcome LocalGatePolicy::DecideStage(const JobLayout& layout, const StagePlanFacts& plan,
                                              bool sp_required, absl::Time now) {
  const ScheduledConfig sc = schedule_.At(plan.step);
  StagePlanOutcome out = DecideStagePlan(group_, sc.config, layout, plan, pin(now), &learned_,
                                         sp_required, {.plan_only = layout.cp > 1});
  schedule_.Prune(plan.step);
  return out;
}

void LocalGatePolicy::Adopt(int64_t step, Mode mode, Reason reason,
                            std::optional<absl::Time> pin_expire, bool pin_forced) {
  group_.Adopt(step, Decision{mode, reason}, schedule_.At(step).config);
  // The daemon's latest word on pins: PINNED carries the pin; any other reason means no
  // pin applied at that step, unless a forced reason outranked it (an unforced TP-only pin
  // the memory gate overruled is learned at the next PINNED decision).
  if (reason == Reason::kPinned) {
    pin_ = PinDirective(mode, pin_forced);
    pin_expire_ = pin_expire;
  } else if (!(pin_ && IsForcedReason(reason))) {
    pin_.reset();
    pin_expire_.reset();
  }
  schedule_.Prune(step);
}

}  // namespace spgate::client
