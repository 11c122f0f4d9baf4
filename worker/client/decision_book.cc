// The leader's decision book; see decision_book.h.
#include "worker/client/decision_book.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/gate_policy.h"
#include "policy/pipeline_memory.h"

namespace spgate::client {
namespace {

BatchFacts FactsOf(const PlanRecord& plan) {
  return BatchFacts{.step = plan.step,
                    .length_cv = plan.length_cv,
                    .tokens = plan.tokens,
                    .predicted_peak_bytes_sp = plan.peak_sp,
                    .predicted_peak_bytes_tp = plan.peak_tp,
                    .memory_budget_bytes = plan.budget};
}

// What the worker's own memory gate runs instead of the daemon's answer `d`, if it
// forbids it: TP-only that does not fit budget x memory_headroom under `config`, unless an
// operator forced it. The gate's rule and reason are the policy's own (PinAndMemoryGates
// without a pin: MEMORY_REQUIRES_SP, or MEMORY_OVER_BUDGET when SP does not fit either),
// so the worker and the daemon can never disagree on what "fits" means. A few
// comparisons; the gate records nothing without a trace.
std::optional<Decision> MemoryGateForbids(const GateDecision& d, const GateConfig& config,
                                          const BatchFacts& facts) {
  if (d.mode != Mode::kTensorParallelOnly) return std::nullopt;
  if (d.reason == Reason::kPinned && d.pin_forced) return std::nullopt;
  return PinAndMemoryGates(config, facts, /*pin=*/std::nullopt, /*trace=*/nullptr);
}

StagePlanFacts StageFactsOf(const PlanRecord& plan, int stage,
                            std::vector<MicrobatchFacts>& storage) {
  storage.clear();
  for (const PlanRecord::Microbatch& m : plan.microbatches) storage.push_back(m.facts);
  return StagePlanFacts{.step = plan.step,
                        .stage = stage,
                        .resident_bytes = plan.resident,
                        .memory_budget_bytes = plan.budget,
                        .microbatches = storage};
}

}  // namespace

absl::Status StepPlanRecord(const JobLayout* layout, const BatchPlanInput& plan, PlanRecord* rec) {
  RETURN_IF_ERROR(CheckPlanShape(layout,
                                 {.batch_lengths = !plan.lengths.empty() ||
                                                   plan.predicted_peak_bytes_sp != 0 ||
                                                   plan.predicted_peak_bytes_tp != 0,
                                  .microbatches = plan.microbatches,
                                  .resident_bytes = plan.resident_bytes,
                                  .memory_budget_bytes = rec->budget},
                                 "this client", "microbatches"));
  if (layout == nullptr) return absl::OkStatus();
  rec->microbatches.assign(plan.microbatches.size(), {});
  for (const MicrobatchPlanInput& m : plan.microbatches) {
    PlanRecord::Microbatch& out = rec->microbatches[m.id];
    ASSIGN_OR_RETURN(out.facts, SummarizeMicrobatch(m, "microbatches"));
    out.lengths.assign(m.lengths.begin(), m.lengths.end());
  }
  rec->resident = plan.resident_bytes;
  return absl::OkStatus();
}

DecisionBook::DecisionBook(const GateConfig& initial, int max_pending_plans,
                           DecisionSource local_source, BookLayout layout)
    : policy_(initial, 0),
      layout_(std::move(layout)),
      max_pending_plans_(max_pending_plans),
      local_source_(local_source) {}

absl::Status DecisionBook::AddPlan(std::shared_ptr<PlanRecord> plan) {
  const int64_t step = plan->step;
  if (step <= last_step_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "plan for step %d: step %d is already decided (steps must increase)", step,
        last_step_));
  }
  if (plans_.contains(step)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("a plan for step %d was already submitted", step));
  }
  if (static_cast<int>(plans_.size()) >= max_pending_plans_) {
    plans_.erase(plans_.begin());
    ++counters_.plans_dropped;
  }
  plans_.emplace(step, std::move(plan));
  ++counters_.plans_submitted;
  return absl::OkStatus();
}

const PlanRecord* DecisionBook::OnDaemonDecision(const GateDecision& d) {
  if (d.step <= last_step_) {
    ++counters_.late_decisions;  // the group already ran this step with a local decision
    return nullptr;
  }
  auto plan = plans_.find(d.step);
  if (plan == plans_.end()) return nullptr;  // not ours (a dropped plan)
  daemon_.insert_or_assign(d.step, d);
  ++counters_.decisions_received;
  return plan->second.get();
}

bool DecisionBook::OnRejection(int64_t step) {
  if (step <= last_step_) return false;
  rejected_.insert(step);
  ++counters_.plans_rejected;
  return true;
}

absl::StatusOr<std::optional<GateDecision>> DecisionBook::Lookup(int64_t step) const {
  if (step == last_step_) return std::optional<GateDecision>(last_);  // same answer
  if (step < last_step_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d is before the last decided step %d (steps must increase)", step, last_step_));
  }
  if (!plans_.contains(step)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no plan was submitted for step %d (or it was dropped)", step));
  }
  return std::optional<GateDecision>();
}

GateDecision DecisionBook::CommitStepPlan(const PlanRecord& plan, absl::Time now) {
  const JobLayout& layout = *layout_.layout;
  const ScheduledConfig& sc = policy_.ConfigFor(plan.step);
  std::vector<MicrobatchFacts> storage;
  const StagePlanFacts facts = StageFactsOf(plan, layout_.stage, storage);
  GateDecision d;
  auto it = daemon_.find(plan.step);
  if (it != daemon_.end() &&
      it->second.microbatches.size() != static_cast<size_t>(layout.microbatches)) {
    daemon_.erase(it);  // not an answer to this plan: decided locally
    it = daemon_.end();
  }
  if (it != daemon_.end()) {
    d = it->second;
    // The stage's memory gate over the daemon's modes: a TP-only micro-batch that does not
    // fit runs SP (source memory_override), unless an operator forced it.
    const std::vector<PipelineOp> ops = StageSchedule(layout.pipeline(), layout_.stage).value();
    std::vector<MicrobatchMemory> memory;
    for (const MicrobatchFacts& f : storage) memory.push_back(f.memory);
    StageMemoryGate gate(ops, plan.resident, memory, StageMemoryLimit(plan.budget, sc.config));
    const bool overridden = ApplyStageMemoryGate(gate, d.microbatches, d.pin_forced) > 0;
    for (const Decision& m : d.microbatches) {
      policy_.Adopt(plan.step, m.mode, m.reason, d.pin_expire, d.pin_forced);
    }
    if (overridden) {
      d.source = DecisionSource::kMemoryOverride;
      d.config_version = sc.version;
      d.stage_peak_bytes = gate.peak_bytes();
      ++counters_.memory_overrides;
    } else {
      ++counters_.daemon_decisions;
    }
  } else {
    StagePlanOutcome out = policy_.DecideStage(layout, facts, layout_.sp_required, now);
    d.step = plan.step;
    d.source = local_source_;
    d.config_version = sc.version;
    d.microbatches = std::move(out.decisions);
    d.stage_peak_bytes = out.peak_bytes;
    ++counters_.local_decisions;
    ++counters_.local_decisions_by_reason[static_cast<int>(d.microbatches.front().reason)];
  }
  d.mode = d.microbatches.front().mode;
  d.policy_reason = d.microbatches.front().reason;
  d.reason = d.source == DecisionSource::kFallback ? Reason::kControllerUnavailable
                                                   : d.policy_reason;
  return d;
}

GateDecision DecisionBook::Commit(int64_t step, absl::Time now) {
  GateDecision d;
  const PlanRecord& plan = *plans_.at(step);
  const BatchFacts facts = FactsOf(plan);
  if (layout_.layout.has_value()) {
    d = CommitStepPlan(plan, now);
  } else if (auto it = daemon_.find(step); it != daemon_.end()) {
    const ScheduledConfig& sc = policy_.ConfigFor(step);
    if (const std::optional<Decision> sp = MemoryGateForbids(it->second, sc.config, facts)) {
      d.step = step;
      d.mode = sp->mode;
      d.reason = d.policy_reason = sp->reason;
      d.source = DecisionSource::kMemoryOverride;
      d.config_version = sc.version;  // the config the override was judged under
      // The fallback stands where the group does: on the SP step it ran.
      policy_.Adopt(step, d.mode, d.reason);
      ++counters_.memory_overrides;
    } else {
      d = it->second;
      policy_.Adopt(step, d.mode, d.reason, d.pin_expire, d.pin_forced);
      ++counters_.daemon_decisions;
    }
  } else {
    const LocalDecision ld = policy_.Decide(facts, layout_.sp_required, now);
    d.step = step;
    d.mode = ld.decision.mode;
    d.policy_reason = ld.decision.reason;
    d.source = local_source_;
    d.reason = local_source_ == DecisionSource::kFallback ? Reason::kControllerUnavailable
                                                          : d.policy_reason;
    d.config_version = ld.config_version;
    ++counters_.local_decisions;
    ++counters_.local_decisions_by_reason[static_cast<int>(d.policy_reason)];
  }
  last_step_ = step;
  last_ = d;
  last_tokens_ = layout_.layout.has_value() ? 0 : (plan.tokens > 0 ? plan.tokens : -1);
  last_microbatch_tokens_.clear();
  for (const PlanRecord::Microbatch& m : plan.microbatches) {
    last_microbatch_tokens_.push_back(m.facts.lengths_known ? m.facts.tokens : -1);
    last_tokens_ =
        m.facts.lengths_known && last_tokens_ >= 0 ? last_tokens_ + m.facts.tokens : -1;
  }
  plans_.erase(plans_.begin(), plans_.upper_bound(step));
  absl::erase_if(daemon_, [step](const auto& kv) { return kv.first <= step; });
  absl::erase_if(rejected_, [step](int64_t s) { return s <= step; });
  return d;
}

}  // namespace spgate::client
