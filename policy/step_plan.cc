// Job layouts and step plans; see step_plan.h.
#include "policy/step_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spgate {
namespace {

absl::Status InRange(std::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: must be in [%d, %d], got %d", field, lo, hi, value));
}

}  // namespace

absl::Status ValidateJobLayout(const JobLayout& l) {
  if (absl::Status s = InRange("layout.tp", l.tp, 1, kMaxTensorParallel); !s.ok()) return s;
  if (absl::Status s = InRange("layout.cp", l.cp, 1, kMaxContextParallel); !s.ok()) return s;
  if (absl::Status s = InRange("layout.dp", l.dp, 1, kMaxLayoutRanks); !s.ok()) return s;
  if (absl::Status s = ValidatePipelineLayout(l.pipeline()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("layout.", s.message()));
  }
  if (const int64_t chunks = int64_t{l.microbatches} * l.vp; chunks > kMaxStepPlanChunks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout.microbatches: %d micro-batches x vp=%d = %d model-chunk passes per step, more "
        "than %d",
        l.microbatches, l.vp, chunks, kMaxStepPlanChunks));
  }
  const int64_t ranks = int64_t{l.tp} * l.pp * l.cp * l.dp;
  if (ranks > kMaxLayoutRanks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout: tp x pp x cp x dp = %d ranks, more than %d", ranks, kMaxLayoutRanks));
  }
  return absl::OkStatus();
}

std::string_view ScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kInterleaved1F1B ? "interleaved_1f1b" : "1f1b";
}

std::string JobLayoutMismatch(const JobLayout& job, const JobLayout& rank) {
  struct Field {
    const char* name;
    int JobLayout::*member;
  };
  static constexpr Field kFields[] = {
      {"tp", &JobLayout::tp}, {"pp", &JobLayout::pp}, {"vp", &JobLayout::vp},
      {"cp", &JobLayout::cp}, {"dp", &JobLayout::dp}, {"microbatches", &JobLayout::microbatches},
  };
  for (const Field& f : kFields) {
    if (job.*f.member != rank.*f.member) {
      return absl::StrFormat("layout.%s: the job's ranks registered %d, this rank %d", f.name,
                             job.*f.member, rank.*f.member);
    }
  }
  if (job.schedule != rank.schedule) {
    return absl::StrFormat("layout.schedule: the job's ranks registered %s, this rank %s",
                           ScheduleName(job.schedule), ScheduleName(rank.schedule));
  }
  return "";
}

std::string FormatJobLayout(const JobLayout& l) {
  return absl::StrFormat("tp=%d pp=%d vp=%d cp=%d dp=%d microbatches=%d schedule=%s", l.tp, l.pp,
                         l.vp, l.cp, l.dp, l.microbatches, ScheduleName(l.schedule));
}

absl::Status ValidateCoordinates(const JobLayout& l, const StageCoordinates& at) {
  if (absl::Status s = InRange("coordinates.dp_index", at.dp_index, 0, l.dp - 1); !s.ok()) return s;
  if (absl::Status s = InRange("coordinates.stage", at.stage, 0, l.pp - 1); !s.ok()) return s;
  return InRange("coordinates.cp_rank", at.cp_rank, 0, l.cp - 1);
}

int64_t GroupOf(const JobLayout& l, const StageCoordinates& at) {
  return (int64_t{at.dp_index} * l.pp + at.stage) * l.cp + at.cp_rank;
}

StageCoordinates CoordinatesOf(const JobLayout& l, int64_t group) {
  StageCoordinates at;
  at.cp_rank = static_cast<int>(group % l.cp);
  const int64_t unit = group / l.cp;
  at.stage = static_cast<int>(unit % l.pp);
  at.dp_index = static_cast<int>(unit / l.pp);
  return at;
}

absl::Status ValidateSpRequiredFeature(std::string_view name) {
  const bool ok = !name.empty() && name.size() <= 32 &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "sp_required: feature names are 1 to 32 characters of [a-z0-9_], got \"%s\"",
      absl::CEscape(absl::string_view(name.data(), std::min<size_t>(name.size(), 64)))));
}

absl::Status ValidateSpRequiredFeatures(std::span<const std::string> names) {
  if (names.size() > static_cast<size_t>(kMaxSpRequiredFeatures)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sp_required: at most %d features, got %d", kMaxSpRequiredFeatures, names.size()));
  }
  for (const std::string& name : names) {
    if (absl::Status s = ValidateSpRequiredFeature(name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckMicrobatchIds(std::span<const int> ids, int microbatches) {
  if (static_cast<int64_t>(ids.size()) > microbatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "micro_batches: %d sent, the job's layout has %d per step", ids.size(), microbatches));
  }
  // On the stack up to 64 micro-batches: every plan and answer is checked.
  absl::InlinedVector<bool, 64> seen(static_cast<size_t>(microbatches), false);
  for (int id : ids) {
    if (id < 0 || id >= microbatches) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "micro_batches: id %d is outside [0, %d)", id, microbatches));
    }
    if (seen[id]) {
      return absl::InvalidArgumentError(absl::StrFormat("micro_batches: id %d repeats", id));
    }
    seen[id] = true;
  }
  for (int id = 0; id < microbatches; ++id) {
    if (!seen[id]) {
      return absl::InvalidArgumentError(absl::StrFormat("micro_batches: id %d is missing", id));
    }
  }
  return absl::OkStatus();
}

namespace {
std::string OwnerName(PlanOwner whose) {
  if (whose.id.empty()) return std::string(whose.kind);
  return absl::StrFormat("%s %s", whose.kind, whose.id);
}
}  // namespace

absl::Status CheckPlanShape(const JobLayout* layout, const PlanShape& plan, PlanOwner whose,
                            std::string_view field) {
  if (layout == nullptr) {
    if (plan.microbatches.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s registered no layout; its plans carry lengths, not micro-batches",
                        field, OwnerName(whose)));
  }
  if (plan.microbatches.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s registered the layout %s; its plans carry one entry per micro-batch", field,
        OwnerName(whose), FormatJobLayout(*layout)));
  }
  if (plan.batch_lengths) {
    return absl::InvalidArgumentError(
        "lengths: a step plan carries its lengths and memory per micro-batch (lengths and "
        "predicted_peak_bytes_sp/tp must be empty)");
  }
  if (plan.resident_bytes >= kMaxStepPlanBytes || plan.memory_budget_bytes >= kMaxStepPlanBytes) {
    return absl::InvalidArgumentError(
        "resident_bytes, memory_budget_bytes: must be below 2^40 in a step plan");
  }
  absl::InlinedVector<int, 64> ids;
  for (const MicrobatchPlanInput& m : plan.microbatches) ids.push_back(m.id);
  return CheckMicrobatchIds(ids, layout->microbatches);
}

absl::StatusOr<MicrobatchFacts> SummarizeMicrobatch(const MicrobatchPlanInput& m,
                                                    std::string_view field) {
  MicrobatchFacts f{.id = m.id, .lengths_known = !m.lengths.empty(), .memory = m.memory};
  for (uint64_t b : {m.memory.activation_sp, m.memory.activation_tp, m.memory.workspace_sp,
                     m.memory.workspace_tp}) {
    if (b >= kMaxStepPlanBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[id=%d]: byte counts must be below 2^40, got %d", field, m.id, b));
    }
  }
  if (f.lengths_known) {
    absl::StatusOr<LengthStats> stats = ComputeLengthStats(m.lengths);
    if (!stats.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s[id=%d].%s", field, m.id, stats.status().message()));
    }
    f.length_cv = stats->cv;
    f.tokens = stats->tokens;
  }
  return f;
}

namespace {

// How the gate treats a TP-only answer after a first pass it could not hold: not ranked
// (an answer the first pass did not give: Admit, as in id order), ranked out (runs SP, as
// the gate would have it), or ranked in (runs TP-only: the ranked set fits as a whole,
// not each prefix of it in id order).
enum class Admission : uint8_t { kUnranked, kRefused, kAdmitted };

// What DecideStagePlan's passes share: the plan, the stage's limit, the policy's inputs,
// and (after a first pass the gate could not hold) each micro-batch's Admission.
struct StagePass {
  const GateConfig& config;
  const StagePlanFacts& plan;
  int microbatches = 0;
  uint64_t limit = 0;
  std::optional<PinDirective> directive;
  bool pin_forced = false;
  bool sp_required = false;
  bool plan_only = false;
  const ThroughputTable* learned = nullptr;
  const PriorFit* prior_fit = nullptr;
  std::vector<Admission> admit;  // empty: the gate in id order
};

// A micro-batch the policy answered TP-only in the first pass, and how the gate ranks it:
// forced pins first, then ADAPTIVE's exploration (a probe refused for memory would not
// measure the band), then those whose gain the learned table estimates (seconds saved),
// then the rest by the length-CV gate's own measure, CV × tokens; ties in id order.
struct TpOnlyWish {
  int id = 0;
  bool forced = false;
  bool explored = false;
  int tier = 0;
  double gain = 0;
};

void RankWish(const StagePass& p, const StagePlanOutcome& first, TpOnlyWish& w) {
  const MicrobatchFacts& f = p.plan.microbatches[w.id];
  const int band = first.bands[w.id];
  const double tokens = static_cast<double>(f.tokens);
  w.tier = w.forced ? 3 : w.explored ? 2 : 0;
  if (w.tier > 0) return;
  if (p.config.policy == GatePolicyKind::kAdaptive && p.learned != nullptr && band >= 0) {
    const int64_t step = p.plan.step;
    const double sp = p.learned->At(p.config, band, Mode::kSequenceParallel, step).tokens_per_s;
    const double tp = p.learned->At(p.config, band, Mode::kTensorParallelOnly, step).tokens_per_s;
    const double gain = tokens / sp - tokens / tp;
    if (sp > 0 && tp > 0 && std::isfinite(gain)) {  // a NaN would break the ranking's order
      w.tier = 1;
      w.gain = gain;
      return;
    }
  }
  w.gain = f.length_cv * tokens;
}

// One pass over the plan's micro-batches in id order on a gate with every micro-batch SP,
// advancing `group` once each; the TP-only answers are appended to `wishes` (when not
// null).
StagePlanOutcome DecidePass(const StagePass& p, StageMemoryGate& gate, GroupPolicyState& group,
                            std::vector<TpOnlyWish>* wishes) {
  const int m = p.microbatches;
  StagePlanOutcome out;
  out.decisions.resize(static_cast<size_t>(m));
  out.bands.assign(static_cast<size_t>(m), -1);
  static_assert(kBands <= 127, "a band fits in an int8_t");
  out.over_budget = !gate.all_sp_fits();
  const RsWaitObservation no_samples;
  for (int id = 0; id < m; ++id) {
    const MicrobatchFacts& f = p.plan.microbatches[id];
    Decision d;
    if (f.lengths_known) {
      out.bands[id] = static_cast<int8_t>(BandOf(p.config, f.length_cv, f.tokens));
    }
    // Unknown lengths run SP, unless the directive is an SP-required feature: it outranks
    // them as it does a pin.
    if (!f.lengths_known && !p.sp_required) {
      d = {Mode::kSequenceParallel, Reason::kLengthsUnknown};
    } else {
      // The single-batch memory gate is off (no budget in the facts): the stage's gate
      // below is the memory gate of a step plan.
      BatchFacts facts{.step = p.plan.step, .length_cv = f.length_cv, .tokens = f.tokens};
      const GateOutcome wanted =
          EvaluatePolicy(p.config, group.gate(), facts, p.plan_only ? no_samples : group.rs_wait(),
                         p.directive, p.learned, nullptr, p.prior_fit);
      const bool tp = wanted.decision.mode == Mode::kTensorParallelOnly;
      const bool forced = p.pin_forced && wanted.decision.reason == Reason::kPinned;
      const Admission a = p.admit.empty() ? Admission::kUnranked : p.admit[id];
      if (!tp || forced || a == Admission::kUnranked) {
        d = gate.Admit(id, wanted.decision, p.pin_forced);
      } else if (a == Admission::kAdmitted) {
        gate.TryTpOnly(id, /*force=*/true);  // the set fits; DecideStagePlan checks the peak
        d = wanted.decision;
      } else {
        d = {Mode::kSequenceParallel,
             gate.all_sp_fits() ? Reason::kMemoryRequiresSp : Reason::kMemoryOverBudget};
      }
      if (tp && wishes != nullptr) {
        wishes->push_back({.id = id, .forced = forced, .explored = wanted.explored});
      }
      if (wanted.explored && d == wanted.decision) ++out.explored;
      if (wanted.flip_held && d == wanted.decision) ++out.flips_held;
    }
    group.Adopt(p.plan.step, d, p.config);
    out.decisions[id] = d;
  }
  out.peak_bytes = gate.peak_bytes();
  return out;
}

}  // namespace

StagePlanOutcome DecideStagePlan(GroupPolicyState& group, const GateConfig& config,
                                 const JobLayout& layout, const StagePlanFacts& plan,
                                 std::optional<PinDirective> pin, const ThroughputTable* table,
                                 bool sp_required, StagePlanOptions options) {
  const int m = layout.microbatches;
  // The stage's ops under its schedule; the layout and stage are the caller's to check.
  std::vector<PipelineOp> ops = StageSchedule(layout.pipeline(), plan.stage).value();
  std::vector<MicrobatchMemory> memory(static_cast<size_t>(m));
  for (const MicrobatchFacts& f : plan.microbatches) memory[f.id] = f.memory;
  const ThroughputTable* learned = options.plan_only ? nullptr : table;
  // The prior's fit, once for the plan's micro-batches (up to 4,096 of them).
  const PriorFit prior_fit = config.policy == GatePolicyKind::kAdaptive && learned != nullptr
                                 ? FitPriorOf(config, learned)
                                 : PriorFit{};
  StagePass pass{.config = config, .plan = plan, .microbatches = m,
                 .limit = StageMemoryLimit(plan.memory_budget_bytes, config),
                 .directive = JobDirective(sp_required, pin),
                 .pin_forced = pin.has_value() && pin->force, .sp_required = sp_required,
                 .plan_only = options.plan_only, .learned = learned, .prior_fit = &prior_fit,
                 .admit = {}};
  StageMemoryGate gate(ops, plan.resident_bytes, memory, pass.limit);
  group.Prepare(config);
  if (pass.limit == 0 || m == 1) return DecidePass(pass, gate, group, nullptr);
  // The gate in id order first. Where it could not hold every micro-batch the policy
  // wanted TP-only, those expected to gain most get it, as many as fit together
  // (docs/design.md §12): the plan is decided again from the group as it was, with the
  // gate admitting that set.
  const GroupPolicyState before = group;
  std::vector<TpOnlyWish> wishes;
  wishes.reserve(static_cast<size_t>(m));
  StagePlanOutcome first = DecidePass(pass, gate, group, &wishes);
  const auto tp_only = [&](int id) {
    return first.decisions[id].mode == Mode::kTensorParallelOnly;
  };
  if (std::all_of(wishes.begin(), wishes.end(),
                  [&](const TpOnlyWish& w) { return tp_only(w.id); })) {
    return first;
  }
  // Where ADAPTIVE measured a switch's cost, the gate keeps id order: a ranking interleaves
  // TP-only and SP micro-batches, and the switches it adds are not in the gain.
  if (config.policy == GatePolicyKind::kAdaptive && learned != nullptr &&
      MeasuredSwitchCost(config, *learned, plan.step) > 0) {
    return first;
  }
  for (TpOnlyWish& w : wishes) RankWish(pass, first, w);
  std::sort(wishes.begin(), wishes.end(), [](const TpOnlyWish& a, const TpOnlyWish& b) {
    if (a.tier != b.tier) return a.tier > b.tier;
    if (a.gain != b.gain) return a.gain > b.gain;
    return a.id < b.id;
  });
  gate.Reset();
  pass.admit.assign(static_cast<size_t>(m), Admission::kUnranked);
  bool same = true;
  for (const TpOnlyWish& w : wishes) {
    const bool in = gate.TryTpOnly(w.id, /*force=*/w.forced);
    pass.admit[w.id] = in ? Admission::kAdmitted : Admission::kRefused;
    same = same && in == tp_only(w.id);
  }
  if (same) return first;
  group = before;
  gate.Reset();
  StagePlanOutcome ranked = DecidePass(pass, gate, group, nullptr);
  // The policy answered as in the first pass, or the set still fits: never a peak above
  // the limit (or above the first pass's, where a forced pin went over it).
  if (ranked.peak_bytes <= std::max(pass.limit, first.peak_bytes)) return ranked;
  group = before;
  gate.Reset();
  pass.admit.clear();
  return DecidePass(pass, gate, group, nullptr);
}
}  // namespace spgate
