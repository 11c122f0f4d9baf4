// The leader's decision book; see decision_book.h.
#include "worker/client/decision_book.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/gate_policy.h"
#include "policy/pipeline_memory.h"

namespace spgate::client {

absl::Status MakePlanRecord(const JobLayout* layout, const BatchPlanInput& plan,
                            uint64_t default_budget, PlanRecord* rec, bool keep_lengths) {
  rec->step = plan.step;
  rec->budget = plan.memory_budget_bytes != 0 ? plan.memory_budget_bytes : default_budget;
  rec->resident = 0;
  rec->sent_on_stream = 0;
  rec->submitted = absl::Time();
  rec->taken = absl::InfinitePast();
  // microbatches and lengths are resized below (never cleared: absl::InlinedVector's
  // clear() frees its heap buffer) and every id assigned (a missing id is refused), so a
  // spare's buffers keep their capacity.
  RETURN_IF_ERROR(CheckPlanShape(layout,
                                 {.batch_lengths = !plan.lengths.empty() ||
                                                   plan.predicted_peak_bytes_sp != 0 ||
                                                   plan.predicted_peak_bytes_tp != 0,
                                  .microbatches = plan.microbatches,
                                  .resident_bytes = plan.resident_bytes,
                                  .memory_budget_bytes = rec->budget},
                                 {.kind = "this client"}, "microbatches"));
  if (layout == nullptr) {
    ASSIGN_OR_RETURN(const LengthStats stats, ComputeLengthStats(plan.lengths));
    rec->microbatches.resize(1);
    rec->microbatches[0] = {.length_cv = stats.cv,
                            .tokens = stats.tokens,
                            .memory = {.activation_sp = plan.predicted_peak_bytes_sp,
                                       .activation_tp = plan.predicted_peak_bytes_tp}};
    rec->lengths.resize(keep_lengths ? 1 : 0);
    if (keep_lengths) rec->lengths[0].assign(plan.lengths.begin(), plan.lengths.end());
    return absl::OkStatus();
  }
  rec->microbatches.resize(plan.microbatches.size());
  rec->lengths.resize(keep_lengths ? plan.microbatches.size() : 0);
  for (const MicrobatchPlanInput& m : plan.microbatches) {
    ASSIGN_OR_RETURN(rec->microbatches[m.id], SummarizeMicrobatch(m, "microbatches"));
    if (keep_lengths) rec->lengths[m.id].assign(m.lengths.begin(), m.lengths.end());
  }
  rec->resident = plan.resident_bytes;
  return absl::OkStatus();
}

DecisionBook::DecisionBook(const GateConfig& initial, int max_pending_plans,
                           DecisionSource local_source, BookLayout layout)
    : policy_(initial, 0),
      layout_(std::move(layout)),
      max_pending_plans_(max_pending_plans),
      local_source_(local_source) {
  if (layout_.layout.has_value()) {
    ops_ = StageSchedule(layout_.layout->pipeline(), layout_.stage).value();
  }
}

namespace {

// A daemon answer's decisions, one per micro-batch: a step plan's as sent, a plain plan's
// one in its mode and reason (DecisionFromProto makes no vector for it). Into `out` (for a
// plain plan the book's buffer, kept from step to step; a step plan's goes to the caller).
size_t AnsweredMicrobatches(const GateDecision& answer) {
  return answer.microbatches.empty() ? 1 : answer.microbatches.size();
}
void AnswerDecisions(const GateDecision& answer, std::vector<Decision>* out) {
  if (answer.microbatches.empty()) {
    out->assign(1, Decision{answer.mode, answer.reason});
  } else {
    out->assign(answer.microbatches.begin(), answer.microbatches.end());
  }
}

}  // namespace

// The one place a plain plan and a step plan differ: the policy's rules for their
// decisions (docs/design.md §4, §12). A plain plan is one decision, decided by the gates
// over its BatchFacts (the memory gate before the others) and gated by its two predicted
// peaks (PinAndMemoryGates without a pin: TpOnlyOverBudget); a step plan's micro-batches are
// decided by the stage's DecideStagePlan and gated by the schedule-aware StageMemoryGate.
// Both gates admit alike: a decision runs unless it is TP-only that does not fit and not a
// forced pin (PINNED with pin_forced), which runs SP for MEMORY_REQUIRES_SP, or
// MEMORY_OVER_BUDGET when SP does not fit either. The rules are the policy's own, so the
// worker and the daemon never disagree on what "fits" means.
DecisionBook::Admitted DecisionBook::DecideOrAdmit(const PlanRecord& plan,
                                                   const GateConfig& config,
                                                   const GateDecision* answer, absl::Time now) {
  decisions_.clear();
  if (answer != nullptr) AnswerDecisions(*answer, &decisions_);
  if (!layout_.layout.has_value()) {
    const MicrobatchFacts& m = plan.microbatches.front();
    const BatchFacts facts{.step = plan.step,
                           .length_cv = m.length_cv,
                           .tokens = m.tokens,
                           .predicted_peak_bytes_sp = m.memory.activation_sp,
                           .predicted_peak_bytes_tp = m.memory.activation_tp,
                           .memory_budget_bytes = plan.budget};
    if (answer == nullptr) {
      decisions_.push_back(policy_.Decide(facts, layout_.sp_required, now).decision);
      return {};
    }
    const Decision wanted = decisions_.front();
    Decision& d = decisions_.front();
    if (d.mode == Mode::kTensorParallelOnly &&
        !(d.reason == Reason::kPinned && answer->pin_forced)) {
      d = PinAndMemoryGates(config, facts, /*pin=*/std::nullopt, /*trace=*/nullptr).value_or(d);
    }
    return {0, d != wanted};
  }
  if (answer == nullptr) {
    StagePlanOutcome out = policy_.DecideStage(
        *layout_.layout,
        {.step = plan.step, .stage = layout_.stage, .resident_bytes = plan.resident,
         .memory_budget_bytes = plan.budget, .microbatches = plan.microbatches},
        layout_.sp_required, now);
    decisions_ = std::move(out.decisions);
    return {out.peak_bytes, 0};
  }
  memory_.clear();
  for (const MicrobatchFacts& f : plan.microbatches) memory_.push_back(f.memory);
  StageMemoryGate gate(ops_, plan.resident, memory_, StageMemoryLimit(plan.budget, config));
  const int overridden = ApplyStageMemoryGate(gate, decisions_, answer->pin_forced);
  return {gate.peak_bytes(), overridden};
}

std::shared_ptr<PlanRecord> DecisionBook::NewRecord() {
  if (spares_.records.empty()) return std::make_shared<PlanRecord>();
  std::shared_ptr<PlanRecord> rec = std::move(spares_.records.back());
  spares_.records.pop_back();
  return rec;
}

DecisionBook::PlanMap::iterator DecisionBook::Retire(PlanMap::iterator it) {
  const auto next = std::next(it);
  PlanMap::node_type node = plans_.extract(it);
  // use_count() is 1 only when no one else holds the record: the writer drops its
  // references under the client's lock, as this runs (decision_book.h, NewRecord).
  if (node.mapped().use_count() == 1 && spares_.records.size() < kSpares) {
    size_t room = 0;
    for (const std::vector<int64_t>& l : node.mapped()->lengths) room += l.capacity();
    if (room <= kMaxSpareLengths) spares_.records.push_back(std::move(node.mapped()));
  }
  node.mapped().reset();
  if (spares_.nodes.size() < kSpares) spares_.nodes.push_back(std::move(node));
  return next;
}

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
    Retire(plans_.begin());
    ++counters_.plans_dropped;
  }
  if (spares_.nodes.empty()) {
    plans_.emplace(step, std::move(plan));
  } else {
    PlanMap::node_type node = std::move(spares_.nodes.back());
    spares_.nodes.pop_back();
    node.key() = step;
    node.mapped() = std::move(plan);
    plans_.insert(std::move(node));
  }
  ++counters_.plans_submitted;
  return absl::OkStatus();
}

const PlanRecord* DecisionBook::OnDaemonDecision(GateDecision d) {
  const int64_t step = d.step;
  if (step <= last_step_) {
    ++counters_.late_decisions;  // the group already ran this step with a local decision
    return nullptr;
  }
  auto plan = plans_.find(step);
  if (plan == plans_.end()) return nullptr;  // not ours (a dropped plan)
  daemon_.insert_or_assign(step, std::move(d));
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

GateDecision DecisionBook::Commit(int64_t step, absl::Time now) {
  const PlanRecord& plan = *plans_.at(step);
  const ScheduledConfig& sc = policy_.ConfigFor(step);
  // An answer is this plan's only with one decision per micro-batch of it (a plain
  // answer's one in its mode and reason: AnsweredMicrobatches); otherwise the step is
  // decided locally.
  const auto it = daemon_.find(step);
  GateDecision* answer =
      it != daemon_.end() && AnsweredMicrobatches(it->second) == plan.microbatches.size()
          ? &it->second
          : nullptr;
  const Admitted run = DecideOrAdmit(plan, sc.config, answer, now);
  GateDecision d;
  if (answer != nullptr) {
    d = std::move(*answer);
    // The fallback stands where the group does: on the decisions that run.
    for (const Decision& m : decisions_) {
      policy_.Adopt(step, m.mode, m.reason, d.pin_expire, d.pin_forced);
    }
    if (run.overridden > 0) {
      d.source = DecisionSource::kMemoryOverride;
      d.config_version = sc.version;  // the config the override was judged under
      d.stage_peak_bytes = run.stage_peak_bytes;
      if (std::ranges::none_of(decisions_,
                               [](const Decision& m) { return m.reason == Reason::kPinned; })) {
        d.pin_expire.reset();  // no pin runs
        d.pin_forced = false;
      }
      ++counters_.memory_overrides;
    } else {
      ++counters_.daemon_decisions;
    }
  } else {
    d = {.step = step, .source = local_source_, .config_version = sc.version,
         .stage_peak_bytes = run.stage_peak_bytes};
    ++counters_.local_decisions;
    // By reason, each decision (a step plan's: each micro-batch's), as the daemon counts
    // its own (spgate_decisions_total): the heartbeat's counts are what the local share
    // of a job's decisions is computed from.
    for (const Decision& m : decisions_) {
      ++counters_.local_decisions_by_reason[static_cast<int>(m.reason)];
    }
  }
  d.mode = decisions_.front().mode;
  d.policy_reason = decisions_.front().reason;
  d.reason = d.source == DecisionSource::kFallback ? Reason::kControllerUnavailable
                                                   : d.policy_reason;
  // The caller's view: a step plan's decisions per micro-batch, none for a plain plan.
  d.microbatches.clear();
  if (layout_.layout.has_value()) d.microbatches.swap(decisions_);
  last_step_ = step;
  last_ = d;
  last_tokens_ = 0;
  last_microbatch_tokens_.clear();
  for (const MicrobatchFacts& m : plan.microbatches) {
    last_microbatch_tokens_.push_back(m.lengths_known ? m.tokens : -1);
    last_tokens_ = m.lengths_known && last_tokens_ >= 0 ? last_tokens_ + m.tokens : -1;
  }
  for (auto it = plans_.begin(); it != plans_.end() && it->first <= step;) it = Retire(it);
  absl::erase_if(daemon_, [step](const auto& kv) { return kv.first <= step; });
  absl::erase_if(rejected_, [step](int64_t s) { return s <= step; });
  return d;
}

}  // namespace spgate::client
