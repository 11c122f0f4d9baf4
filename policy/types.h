// Domain value types shared by the daemon and the worker's fail-static fallback.
// Plain structs with no I/O: the policy is a pure function over these.
#ifndef SPGATE_POLICY_TYPES_H_
#define SPGATE_POLICY_TYPES_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "policy/gate_config.h"

namespace spgate {

enum class Mode : uint8_t { kSequenceParallel = 1, kTensorParallelOnly = 2 };
// Arrays indexed by static_cast<int>(Mode) (index 0 unused).
inline constexpr int kModeSlots = 3;
inline constexpr Mode OtherMode(Mode m) {
  return m == Mode::kSequenceParallel ? Mode::kTensorParallelOnly : Mode::kSequenceParallel;
}

// Values match spgate.v1.Reason so conversion is a cast.
enum class Reason : uint8_t {
  kGatesPassed = 1,
  kLengthCv = 2,
  kRsWait = 3,
  kProbe = 4,
  kMemoryRequiresSp = 5,
  kMemoryOverBudget = 6,
  kPinned = 7,
  kControllerUnavailable = 8,
  kAdaptive = 9,
  kLengthsUnknown = 10,  // a pipeline stage without the micro-batch's lengths: SP
  kSpRequired = 11,      // the job declared a feature that needs SP throughout
};
inline constexpr int kNumReasons = 12;  // index 0 unused

// Metric label values (docs/design.md §7): "sp" / "tp_only" and the lower-case enum names.
std::string_view ModeLabel(Mode mode);
std::string_view ReasonLabel(Reason reason);

// What the policy needs from a batch plan. Lengths are summarised by the caller with
// ComputeLengthStats so the policy itself does no per-sequence work.
struct BatchFacts {
  int64_t step = 0;
  double length_cv = 0.0;
  int64_t tokens = 0;  // the batch's tokens (the ADAPTIVE policy's band)
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;  // 0: unknown, the memory gate is skipped
};

// Rolling reduce-scatter wait share of the group (mean over the SP steps observed since
// the window was last reset, at most window_steps of them).
struct RsWaitObservation {
  double mean = 0.0;
  int64_t samples = 0;
};

// Per-group state the policy reads and returns updated. Small and trivially copyable,
// so keeping it by value costs nothing on the decision path.
struct GroupGateState {
  bool has_decision = false;
  int64_t last_step = std::numeric_limits<int64_t>::min();
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  // RS_WAIT hysteresis: true while the group is in the RS_WAIT fallback.
  bool rs_wait_fallback = false;
  // Step at which rs_wait_fallback last flipped (for min_dwell_steps).
  int64_t rs_wait_changed_step = std::numeric_limits<int64_t>::min() / 2;
  // Last step that ran SP (any reason): probes are due probe_interval_steps after it.
  int64_t last_sp_step = std::numeric_limits<int64_t>::min() / 2;
  int64_t mode_switches = 0;
  // ADAPTIVE's flip cap (docs/design.md §11): decisions taken (a step plan's micro-batches
  // count one each); the mode of the last decision the policy chose (not forced by a pin,
  // the memory gate, an SP-required feature or unknown lengths: those are exempt from the
  // cap, and so is the way back from them to the mode it chose); and the decision indices
  // of the last two switches it chose (a chosen decision that keeps the mode a forced one
  // left the group in switches nothing and is not one).
  int64_t decisions = 0;
  bool has_chosen_mode = false;
  Mode chosen_mode = Mode::kSequenceParallel;
  int64_t last_switch_at = std::numeric_limits<int64_t>::min() / 2;
  int64_t prev_switch_at = std::numeric_limits<int64_t>::min() / 2;
  // ADAPTIVE's forced runs (ForcedRunSeconds, docs/design.md §11): the decisions the policy
  // chose and the runs of forced decisions that began right after one, by the forced
  // mode (index: SP 0, TP-only 1), each forgotten by kForcedRunKeep per decision.
  double chosen_weight = 0;
  double forced_runs[2] = {0, 0};
  // ADAPTIVE's probe run is an excursion (docs/design.md §11): the mode the group ran when
  // the run in progress (reason kProbe) began (after a forced decision, the mode the policy
  // had chosen), which its way back returns to unless a switch from it pays.
  Mode probe_from = Mode::kSequenceParallel;
};

// What the forced-run counts keep of their past per decision: 2^(-1/50), a half-life of
// the 50 decisions a move is judged over (kMoveHorizonDecisions, adaptive_policy.h).
inline constexpr double kForcedRunKeep = 0.9862327044933592;

// The directive gate 1 evaluates (docs/design.md §3, §12): an operator pin, or a job's
// feature that needs SP throughout (sp_required: SP, reason SP_REQUIRED). A TP-only pin
// yields to the memory gate unless forced: a pin must not OOM a job by accident.
struct PinDirective {
  PinDirective(Mode m, bool f = false, bool sp = false)  // NOLINT: a Mode is a pin
      : mode(m), force(f), sp_required(sp) {}
  Mode mode;
  bool force;
  bool sp_required;
  friend bool operator==(const PinDirective&, const PinDirective&) = default;
};

// A decision the policy did not choose (a pin, the memory gate, an SP-required feature,
// unknown lengths): exempt from ADAPTIVE's flip cap, and what a fallback's pin survives.
inline bool IsForcedReason(Reason r) {
  return r == Reason::kPinned || r == Reason::kMemoryRequiresSp ||
         r == Reason::kMemoryOverBudget || r == Reason::kSpRequired || r == Reason::kLengthsUnknown;
}

// The directive in force for a job: an SP-required feature outranks any operator pin (a
// TP-only step would break it).
inline std::optional<PinDirective> JobDirective(bool sp_required, std::optional<PinDirective> pin) {
  return sp_required ? PinDirective(Mode::kSequenceParallel, true, true) : pin;
}

struct Decision {
  Mode mode = Mode::kSequenceParallel;
  Reason reason = Reason::kGatesPassed;
  friend bool operator==(const Decision&, const Decision&) = default;
};

// A micro-batch's decision in one byte, mode << 4 | reason: what the daemon's step-plan
// cache, the group's broadcast and the worker's run record carry (docs/design.md §12).
// UnpackModeReason: nullopt for a byte that is not a decision.
static_assert(kNumReasons <= 16, "a packed decision keeps the reason in 4 bits");
inline uint8_t PackModeReason(Decision d) {
  return static_cast<uint8_t>(static_cast<int>(d.mode) << 4 | static_cast<int>(d.reason));
}
inline std::optional<Decision> UnpackModeReason(uint8_t b) {
  const int mode = b >> 4, reason = b & 15;
  if ((mode != 1 && mode != 2) || reason < 1 || reason >= kNumReasons) return std::nullopt;
  return Decision{static_cast<Mode>(mode), static_cast<Reason>(reason)};
}

}  // namespace spgate

#endif  // SPGATE_POLICY_TYPES_H_
