// GroupDecider: the leader decides, everyone receives the same bytes; see
// group_decider.h.
#include "worker/client/group_decider.h"

#include "absl/strings/str_format.h"

namespace spgate::client {

DecisionWire ToWire(const GateDecision& d) {
  DecisionWire w;
  w.step = d.step;
  w.config_version = d.config_version;
  w.mode = static_cast<uint8_t>(d.mode);
  w.reason = static_cast<uint8_t>(d.reason);
  w.policy_reason = static_cast<uint8_t>(d.policy_reason);
  w.source = static_cast<uint8_t>(d.source);
  return w;
}

absl::StatusOr<GateDecision> FromWire(const DecisionWire& w) {
  auto valid_reason = [](uint8_t r) { return r >= 1 && r < kNumReasons; };
  if ((w.mode != 1 && w.mode != 2) || !valid_reason(w.reason) || !valid_reason(w.policy_reason) ||
      w.source < static_cast<uint8_t>(DecisionSource::kDaemon) ||
      w.source > static_cast<uint8_t>(DecisionSource::kMemoryOverride)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast payload for step %d is not a decision (mode %d, reason %d, source %d)",
        w.step, w.mode, w.reason, w.source));
  }
  GateDecision d;
  d.step = w.step;
  d.config_version = w.config_version;
  d.mode = static_cast<Mode>(w.mode);
  d.reason = static_cast<Reason>(w.reason);
  d.policy_reason = static_cast<Reason>(w.policy_reason);
  d.source = static_cast<DecisionSource>(w.source);
  return d;
}

absl::StatusOr<std::unique_ptr<GroupDecider>> GroupDecider::Create(GateClient* client,
                                                                   int rank_in_group,
                                                                   BroadcastFn broadcast) {
  if (rank_in_group < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank_in_group must be >= 0, got %d", rank_in_group));
  }
  if (!broadcast) return absl::InvalidArgumentError("broadcast function is empty");
  if (rank_in_group == 0) {
    if (client == nullptr) {
      return absl::InvalidArgumentError("the group leader (rank 0) needs a GateClient");
    }
    if (client->options().rank_in_group != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the leader's GateClient was created for rank %d", client->options().rank_in_group));
    }
  }
  return std::unique_ptr<GroupDecider>(
      new GroupDecider(rank_in_group == 0 ? client : nullptr, rank_in_group, std::move(broadcast)));
}

absl::Status GroupDecider::SubmitPlan(const BatchPlanInput& plan) {
  if (!is_leader()) return absl::OkStatus();
  return client_->SubmitPlan(plan);
}

absl::StatusOr<GateDecision> GroupDecider::Decide(int64_t step) {
  if (!is_leader()) return Decide(step, absl::InfiniteFuture());
  return Decide(step, absl::Now() + client_->options().decision_deadline);
}

absl::StatusOr<GateDecision> GroupDecider::Decide(int64_t step, absl::Time deadline) {
  DecisionWire wire;
  if (is_leader()) {
    absl::StatusOr<GateDecision> d = client_->AwaitDecision(step, deadline);
    if (d.ok()) {
      wire = ToWire(*d);
    } else {
      // Peers are (or will be) inside the broadcast: they must learn of the failure
      // rather than wait forever for a decision.
      wire.step = step;
      wire.status_code = static_cast<int32_t>(d.status().code());
    }
    if (absl::Status s = broadcast_(wire, 0); !s.ok()) return s;
    return d;
  }
  if (absl::Status s = broadcast_(wire, 0); !s.ok()) return s;
  if (wire.step != step) {
    return absl::InternalError(absl::StrFormat(
        "rank %d expected the decision for step %d but the leader broadcast step %d: the "
        "group's ranks are out of step",
        rank_in_group_, step, wire.step));
  }
  if (wire.status_code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(wire.status_code),
                        absl::StrFormat("the group leader could not decide step %d", step));
  }
  return FromWire(wire);
}

}  // namespace spgate::client
