// The five gates of docs/design.md §3 in order. Everything the decision depends on is an
// argument; the returned state is the only thing that changes.
#include "policy/gate_policy.h"

#include <cmath>
#include <concepts>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spgate {
namespace {

// Steps from `since` to `step`, saturating instead of overflowing: steps come from the
// wire and may be anywhere in int64, and the "never" sentinels in GroupGateState sit at
// INT64_MIN / 2, so a plain subtraction is undefined for steps above 2^62.
int64_t StepsSince(int64_t step, int64_t since) {
  int64_t d;
  if (__builtin_sub_overflow(step, since, &d)) {
    return step > since ? std::numeric_limits<int64_t>::max()
                        : std::numeric_limits<int64_t>::min();
  }
  return d;
}

// The strings are built only when a trace is wanted: the decision path (trace null)
// must not pay for heap-allocated details it never reads.
void Record(std::vector<GateCheck>* trace, const char* gate, const char* outcome,
            std::optional<double> observed, std::optional<double> threshold,
            const char* detail) {
  if (trace != nullptr) {
    trace->push_back(GateCheck{gate, outcome, observed, threshold, detail});
  }
}

// ... and a detail made by a callable, run only when a trace is wanted.
template <typename Detail>
  requires std::invocable<Detail>
void Record(std::vector<GateCheck>* trace, const char* gate, const char* outcome,
            std::optional<double> observed, std::optional<double> threshold, Detail&& detail) {
  if (trace != nullptr) {
    trace->push_back(GateCheck{gate, outcome, observed, threshold, std::string(detail())});
  }
}

// What either mode's predicted peak may reach: budget x memory_headroom.
double MemoryLimitBytes(const GateConfig& config, const BatchFacts& batch) {
  return static_cast<double>(batch.memory_budget_bytes) * config.memory_headroom;
}

}  // namespace

bool TpOnlyOverBudget(const GateConfig& config, const BatchFacts& batch) {
  return batch.memory_budget_bytes != 0 &&
         static_cast<double>(batch.predicted_peak_bytes_tp) > MemoryLimitBytes(config, batch);
}

std::string_view ModeLabel(Mode mode) {
  return mode == Mode::kSequenceParallel ? "sp" : "tp_only";
}

std::string_view ReasonLabel(Reason reason) {
  switch (reason) {
    case Reason::kGatesPassed: return "gates_passed";
    case Reason::kLengthCv: return "length_cv";
    case Reason::kRsWait: return "rs_wait";
    case Reason::kProbe: return "probe";
    case Reason::kMemoryRequiresSp: return "memory_requires_sp";
    case Reason::kMemoryOverBudget: return "memory_over_budget";
    case Reason::kPinned: return "pinned";
    case Reason::kControllerUnavailable: return "controller_unavailable";
    case Reason::kAdaptive: return "adaptive";
    case Reason::kLengthsUnknown: return "lengths_unknown";
    case Reason::kSpRequired: return "sp_required";
  }
  return "unspecified";
}

absl::StatusOr<LengthStats> ComputeLengthStats(std::span<const int64_t> lengths) {
  if (lengths.empty()) {
    return absl::InvalidArgumentError("lengths: a batch needs at least one sequence");
  }
  if (static_cast<int64_t>(lengths.size()) > kMaxSequencesPerBatch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "lengths: %d sequences, at most %d per batch", lengths.size(), kMaxSequencesPerBatch));
  }
  // Sums of x and x^2 in integers: chunks of 1024 keep the 64-bit partial sums exact
  // (1024 * 2^50 < 2^64); the chunk totals go into 128 bits. The inner loop uses only
  // operations baseline x86-64 (SSE2) has for vectors: the range check is a shift
  // (x - 1 wraps to a huge value for x <= 0, so (x - 1) >> 24 is nonzero exactly when
  // x is outside [1, 2^24]), the square is a 32x32->64 multiply and the max is 32-bit.
  static_assert(kMaxSequenceLength == int64_t{1} << 24);
  unsigned __int128 sum = 0, sum_sq = 0;
  uint64_t bad = 0;
  int32_t max_length = 0;
  const size_t n = lengths.size();
  for (size_t begin = 0; begin < n; begin += 1024) {
    const size_t end = std::min(n, begin + 1024);
    uint64_t s = 0, s2 = 0, b = 0;
    int32_t m = 0;
    for (size_t i = begin; i < end; ++i) {
      const uint64_t x = static_cast<uint64_t>(lengths[i]);
      b |= (x - 1) >> 24;
      const uint32_t u = static_cast<uint32_t>(x) & ((uint32_t{1} << 25) - 1);
      s += u;
      s2 += static_cast<uint64_t>(u) * u;
      m = std::max(m, static_cast<int32_t>(u));
    }
    sum += s;
    sum_sq += s2;
    bad |= b;
    max_length = std::max(max_length, m);
  }
  if (bad != 0) {
    for (size_t i = 0; i < n; ++i) {
      if (lengths[i] < 1 || lengths[i] > kMaxSequenceLength) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "lengths[%d] = %d: a sequence length must be in [1, %d]", i, lengths[i],
            kMaxSequenceLength));
      }
    }
  }
  LengthStats stats;
  stats.sequences = static_cast<int64_t>(n);
  stats.tokens = static_cast<int64_t>(sum);
  stats.max_length = max_length;
  stats.mean = static_cast<double>(sum) / static_cast<double>(n);
  // n^2 * variance = n * sum_sq - sum^2, exact in 128 bits.
  const unsigned __int128 n2var = static_cast<unsigned __int128>(n) * sum_sq - sum * sum;
  const double variance = static_cast<double>(n2var) / (static_cast<double>(n) * n);
  stats.cv = std::sqrt(variance) / stats.mean;
  return stats;
}

GateOutcome AdvanceGroupState(const GroupGateState& state, int64_t step, Decision decision,
                              GatePolicyKind policy) {
  GateOutcome out;
  out.decision = decision;
  GroupGateState& s = out.next;
  s = state;
  if (s.has_decision && s.mode != decision.mode) ++s.mode_switches;
  // ADAPTIVE's forced-run counts: a forced decision right after one the policy chose
  // starts a run.
  s.chosen_weight *= kForcedRunKeep;
  for (double& runs : s.forced_runs) runs *= kForcedRunKeep;
  if (IsForcedReason(decision.reason)) {
    if (s.has_decision && !IsForcedReason(s.reason)) {
      s.forced_runs[decision.mode == Mode::kSequenceParallel ? 0 : 1] += 1;
    }
  } else {
    s.chosen_weight += 1;
    // A switch the policy chose, for the flip cap. Keeping the mode a forced decision left
    // the group in (a hold where the way back would not pay) changes the policy's mode
    // but switches nothing.
    if (s.has_chosen_mode && s.chosen_mode != decision.mode &&
        !(s.has_decision && s.mode == decision.mode)) {
      s.prev_switch_at = s.last_switch_at;
      s.last_switch_at = s.decisions;
    }
    s.has_chosen_mode = true;
    s.chosen_mode = decision.mode;
  }
  // A probe run's first decision keeps the mode it leaves (after a forced decision, the
  // mode the policy had chosen: a run does not go back to a pin's or the memory gate's
  // mode); its later ones keep that.
  if (decision.reason == Reason::kProbe &&
      !(state.has_decision && state.reason == Reason::kProbe)) {
    s.probe_from = !state.has_decision ? decision.mode
                   : IsForcedReason(state.reason) && state.has_chosen_mode ? state.chosen_mode
                                                                           : state.mode;
  }
  ++s.decisions;
  s.has_decision = true;
  s.last_step = step;
  s.mode = decision.mode;
  s.reason = decision.reason;
  if (decision.mode == Mode::kSequenceParallel) s.last_sp_step = step;
  switch (decision.reason) {
    case Reason::kProbe:
      // ADAPTIVE exploration is not the RS_WAIT fallback's probe.
      if (policy == GatePolicyKind::kAdaptive) break;
      [[fallthrough]];
    case Reason::kRsWait:
      if (!s.rs_wait_fallback) {
        // Entering the fallback. The samples that tripped the gate are discarded, so that
        // probes measure the present rather than the past. (The gates only probe while in
        // the fallback; a PROBE seen outside it means this copy of the state missed the
        // entry, and the window is left alone.)
        s.rs_wait_fallback = true;
        s.rs_wait_changed_step = step;
        out.reset_rs_wait_window = decision.reason == Reason::kRsWait;
      }
      break;
    case Reason::kGatesPassed:
      if (s.rs_wait_fallback) {  // SP resumes: the dwell counts from here
        s.rs_wait_fallback = false;
        s.rs_wait_changed_step = step;
      }
      break;
    default:
      // Pin, memory, length-CV (and adaptive) decisions leave the RS_WAIT hysteresis as
      // it was.
      break;
  }
  return out;
}

std::optional<Decision> PinAndMemoryGates(const GateConfig& config, const BatchFacts& batch,
                                          std::optional<PinDirective> pin,
                                          std::vector<GateCheck>* trace) {
  // The memory gate's verdict is needed first by an unforced TP-only pin.
  const bool has_budget = batch.memory_budget_bytes != 0;
  const double limit = MemoryLimitBytes(config, batch);
  const double tp = static_cast<double>(batch.predicted_peak_bytes_tp);
  const double sp = static_cast<double>(batch.predicted_peak_bytes_sp);
  const bool tp_over = TpOnlyOverBudget(config, batch);

  // 1. The directive: an SP-required feature, or a pin. A TP-only pin that is not forced
  // yields to the memory gate.
  if (pin.has_value()) {
    if (pin->mode == Mode::kTensorParallelOnly && !pin->force && tp_over) {
      Record(trace, "pin", "skip", tp, limit,
             "operator pin to tp_only yields: TP-only would exceed budget x headroom "
             "(pin with force to override)");
    } else {
      Record(trace, "pin", "fire", std::nullopt, std::nullopt,
             pin->sp_required                       ? "a feature of the job needs SP throughout"
             : pin->mode == Mode::kSequenceParallel ? "operator pin to sp"
             : pin->force                           ? "operator pin to tp_only (forced)"
                                                    : "operator pin to tp_only");
      return Decision{pin->mode, pin->sp_required ? Reason::kSpRequired : Reason::kPinned};
    }
  } else {
    Record(trace, "pin", "pass", std::nullopt, std::nullopt, "no pin");
  }

  // 2. Memory: never choose TP-only when it would not fit.
  if (!has_budget) {
    Record(trace, "memory", "skip", std::nullopt, std::nullopt, "no memory budget in the plan");
  } else if (tp_over) {
    const bool sp_fits = sp <= limit;
    Record(trace, "memory", "fire", tp, limit,
           sp_fits ? "TP-only would exceed budget x headroom; SP fits"
                   : "neither mode fits budget x headroom; SP is the smaller");
    return Decision{Mode::kSequenceParallel,
                    sp_fits ? Reason::kMemoryRequiresSp : Reason::kMemoryOverBudget};
  } else {
    Record(trace, "memory", "pass", tp, limit, "TP-only fits budget x headroom");
  }
  return std::nullopt;
}

Decision ThresholdGates(const GateConfig& config, const GroupGateState& state,
                        const BatchFacts& batch, const RsWaitObservation& rs_wait,
                        std::vector<GateCheck>* trace) {
  // 3. Length CV of this batch.
  if (batch.length_cv > config.max_length_cv) {
    Record(trace, "length_cv", "fire", batch.length_cv, config.max_length_cv,
           "batch length CV above max_length_cv");
    return {Mode::kTensorParallelOnly, Reason::kLengthCv};
  }
  Record(trace, "length_cv", "pass", batch.length_cv, config.max_length_cv,
         "batch length CV within max_length_cv");

  // 4. Rolling reduce-scatter wait share, with hysteresis, probes and dwell.
  const bool dwell_over =
      StepsSince(batch.step, state.rs_wait_changed_step) >= config.min_dwell_steps;
  const double reenable_below = config.max_rs_wait_share - config.rs_wait_reenable_margin;
  if (!state.rs_wait_fallback) {
    if (rs_wait.samples > 0 && rs_wait.mean > config.max_rs_wait_share) {
      if (dwell_over) {
        Record(trace, "rs_wait", "fire", rs_wait.mean, config.max_rs_wait_share,
               "rolling reduce-scatter wait share above max_rs_wait_share");
        return {Mode::kTensorParallelOnly, Reason::kRsWait};
      }
      Record(trace, "rs_wait", "pass", rs_wait.mean, config.max_rs_wait_share,
             "above threshold, but SP resumed less than min_dwell_steps ago");
    } else {
      // Nothing compared without a sample: neither value is shown.
      const bool compared = rs_wait.samples > 0;
      Record(trace, "rs_wait", compared ? "pass" : "skip",
             compared ? std::optional<double>(rs_wait.mean) : std::nullopt,
             compared ? std::optional<double>(config.max_rs_wait_share) : std::nullopt,
             compared ? "rolling wait share within max_rs_wait_share"
                      : "no SP step observed yet");
    }
    return {Mode::kSequenceParallel, Reason::kGatesPassed};
  }

  // In the RS_WAIT fallback.
  if (rs_wait.samples > 0 && rs_wait.mean < reenable_below && dwell_over) {
    Record(trace, "rs_wait", "pass", rs_wait.mean, reenable_below,
           "probes measured a wait share below max_rs_wait_share - margin: SP resumes");
    return {Mode::kSequenceParallel, Reason::kGatesPassed};
  }
  // Right after a trip the window is empty (its samples were discarded): no share to show.
  const std::optional<double> share =
      rs_wait.samples > 0 ? std::optional<double>(rs_wait.mean) : std::nullopt;
  if (StepsSince(batch.step, state.last_sp_step) >= config.probe_interval_steps) {
    Record(trace, "rs_wait", "fire", share, reenable_below,
           "in RS_WAIT fallback; probe_interval_steps since the last SP step: probe");
    return {Mode::kSequenceParallel, Reason::kProbe};
  }
  if (rs_wait.samples == 0) {  // nothing to compare until the probe
    Record(trace, "rs_wait", "fire", std::nullopt, std::nullopt, [&] {
      return absl::StrFormat(
          "in RS_WAIT fallback; waiting for a probe (due at step %d: probe_interval_steps "
          "after the last SP step; sooner if a config raises max_rs_wait_share - margin)",
          state.last_sp_step + config.probe_interval_steps);
    });
    return {Mode::kTensorParallelOnly, Reason::kRsWait};
  }
  Record(trace, "rs_wait", "fire", share, reenable_below,
         rs_wait.mean < reenable_below
             ? "in RS_WAIT fallback; wait share below the re-enable level, but the last "
               "switch was less than min_dwell_steps ago"
             : "in RS_WAIT fallback; wait share not below re-enable level");
  return {Mode::kTensorParallelOnly, Reason::kRsWait};
}

GateOutcome EvaluateGates(const GateConfig& config, const GroupGateState& state,
                          const BatchFacts& batch, const RsWaitObservation& rs_wait,
                          std::optional<PinDirective> pin, std::vector<GateCheck>* trace) {
  const std::optional<Decision> first = PinAndMemoryGates(config, batch, pin, trace);
  const Decision d = first ? *first : ThresholdGates(config, state, batch, rs_wait, trace);
  return AdvanceGroupState(state, batch.step, d, GatePolicyKind::kStatic);
}

}  // namespace spgate
