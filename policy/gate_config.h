// The gate configuration and the one table of its fields (docs/design.md §3). Every
// consumer of "the list of gate fields" reads it from here: the GateConfig struct itself,
// validation, the wire conversion and field masks (proto/convert.cc, matched to
// spgate.v1.GateConfig by name), the `spgate_gate_threshold` metric, spgatectl's flags
// and help, the C API's options and the simulator's summary. Adding a field is one line
// in SPGATE_GATE_FIELDS plus the proto field of the same name.
//
// Invariant: a GateConfig is always complete (every field has a value); partial configs
// (a file, an API override) exist only on the wire and are layered over a complete one.
//
// Usage:
//   for (const spgate::GateField& f : spgate::kGateFields) {
//     std::cout << f.name << " = " << spgate::GateFieldValue(config, f) << "\n";
//   }
//   const spgate::GateField* f = spgate::FindGateField("max_length_cv");  // null if unknown
#ifndef SPGATE_POLICY_GATE_CONFIG_H_
#define SPGATE_POLICY_GATE_CONFIG_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spgate {

// Which policy decides a job's batches (docs/design.md §3, §11). Values match
// spgate.v1.GateConfig.Policy so conversion is a cast.
enum class GatePolicyKind : uint8_t {
  kStatic = 1,    // the gates of §3 with their thresholds
  kAdaptive = 2,  // learned per-band throughput of each mode; the gates are its prior
};

// "STATIC" / "ADAPTIVE" (the proto enum names).
std::string_view GatePolicyName(GatePolicyKind kind);
// Case-insensitive "static" / "adaptive"; INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<GatePolicyKind> ParseGatePolicy(std::string_view field, std::string_view text);

// Allowed values of a field. Validation refuses anything else with INVALID_ARGUMENT
// naming the field (docs/design.md §3).
enum class GateFieldRange : uint8_t {
  kShare,   // a share or fraction: finite, in (0, 1]
  kCv,      // a coefficient of variation: finite, in (0, 10]
  kCount,   // a step count: an integer in [1, 1e6]
  kPolicy,  // a GatePolicyKind: STATIC or ADAPTIVE
};

// X(type, name, default, range, help) — in spgate.v1.GateConfig field order.
#define SPGATE_GATE_FIELDS(X)                                                              \
  X(double, max_length_cv, 0.18, kCv, "batch length CV above this: TP-only")               \
  X(double, max_rs_wait_share, 0.22, kShare,                                               \
    "rolling reduce-scatter wait share above this: TP-only")                               \
  X(double, bucket_target_cv, 0.15, kCv, "CV the workers' length bucketing aims for")      \
  X(double, rs_wait_reenable_margin, 0.03, kShare,                                         \
    "SP resumes below max_rs_wait_share minus this")                                       \
  X(int64_t, probe_interval_steps, 200, kCount,                                            \
    "steps between SP probes in the RS_WAIT fallback")                                     \
  X(int64_t, min_dwell_steps, 20, kCount, "steps a resumed mode is held at least")         \
  X(int64_t, window_steps, 50, kCount, "steps in the rolling windows")                     \
  X(double, memory_headroom, 0.90, kShare, "fraction of the device budget a mode may use")    \
  X(GatePolicyKind, policy, GatePolicyKind::kStatic, kPolicy,                              \
    "STATIC: the gates decide; ADAPTIVE: each mode's learned tokens/s decides")            \
  X(double, adaptive_cv_band_width, 0.05, kCv,                                             \
    "ADAPTIVE: width of the length-CV bands (8 bands, the last open)")                     \
  X(int64_t, adaptive_tokens_band_base, 8192, kCount,                                      \
    "ADAPTIVE: token-count band edges at 1x, 2x and 4x this (4 bands)")                    \
  X(int64_t, adaptive_half_life_steps, 2000, kCount,                                        \
    "ADAPTIVE: steps after which a throughput sample weighs half")                         \
  X(int64_t, adaptive_min_samples, 8, kCount,                                              \
    "ADAPTIVE: weighted samples each mode needs in a band before the band decides")        \
  X(double, adaptive_margin, 0.01, kShare,                                                 \
    "ADAPTIVE: TP-only only when its tokens/s beats SP's by more than this share")         \
  X(double, adaptive_explore_share, 0.03, kShare,                                          \
    "ADAPTIVE: share of steps exploring (PROBE) while a band learns or after a change")   \
  X(double, adaptive_explore_floor, 0.0025, kShare,                                        \
    "ADAPTIVE: share of a stable (or rare, learning) band's steps that re-measure the "    \
    "mode not chosen")                                                                     \
  X(double, adaptive_change_threshold, 0.05, kShare,                                       \
    "ADAPTIVE: a mode's recent tokens/s this far (and beyond its noise) from the estimate " \
    "is a change: re-learn and explore")                                                   \
  X(int64_t, adaptive_explore_boost_steps, 200, kCount,                                    \
    "ADAPTIVE: steps after a detected change that explore at adaptive_explore_share, "     \
    "unless the pairs measured since (switching free) re-measure both modes sooner")       \
  X(int64_t, adaptive_flip_interval_steps, 50, kCount,                                     \
    "ADAPTIVE, where a switch's cost is measured (above adaptive_margin of a step and "     \
    "1.645 standard errors): a group switches mode at most twice in any 2x this many "      \
    "decisions unless a pin or the memory gate forces it; where switching is free it does " \
    "not bind")                                                                            \
  X(double, adaptive_straggler_share, 0.10, kShare,                                        \
    "ADAPTIVE: a step whose slowest rank was busy beyond its median rank by more than this " \
    "share of the step, above its cell's usual share, is not learned (1: every step is)")

// The gate thresholds, every field with its default.
struct GateConfig {
#define SPGATE_GATE_CONFIG_MEMBER_(type, name, def, range, help) type name = def;
  SPGATE_GATE_FIELDS(SPGATE_GATE_CONFIG_MEMBER_)
#undef SPGATE_GATE_CONFIG_MEMBER_

  friend bool operator==(const GateConfig&, const GateConfig&) = default;
};

// One row of the field table. Exactly one of the member pointers is set.
struct GateField {
  std::string_view name;
  GateFieldRange range;
  double GateConfig::*real = nullptr;
  int64_t GateConfig::*count = nullptr;
  GatePolicyKind GateConfig::*choice = nullptr;
  std::string_view help;

  bool is_count() const { return count != nullptr; }
  // An enum field (the policy): not a threshold, shown and parsed by name.
  bool is_choice() const { return choice != nullptr; }
};

namespace internal {
template <typename T>
struct GateFieldMember;
template <>
struct GateFieldMember<double> {
  static constexpr GateField Make(std::string_view n, GateFieldRange r, double GateConfig::*m,
                                  std::string_view h) {
    return GateField{n, r, m, nullptr, nullptr, h};
  }
};
template <>
struct GateFieldMember<int64_t> {
  static constexpr GateField Make(std::string_view n, GateFieldRange r, int64_t GateConfig::*m,
                                  std::string_view h) {
    return GateField{n, r, nullptr, m, nullptr, h};
  }
};
template <>
struct GateFieldMember<GatePolicyKind> {
  static constexpr GateField Make(std::string_view n, GateFieldRange r,
                                  GatePolicyKind GateConfig::*m, std::string_view h) {
    return GateField{n, r, nullptr, nullptr, m, h};
  }
};
}  // namespace internal

#define SPGATE_GATE_FIELD_ROW_(type, name, def, range, help)                    \
  ::spgate::internal::GateFieldMember<type>::Make(#name, GateFieldRange::range, \
                                                  &GateConfig::name, help),
inline constexpr auto kGateFields = std::to_array<GateField>({
    SPGATE_GATE_FIELDS(SPGATE_GATE_FIELD_ROW_)
});
#undef SPGATE_GATE_FIELD_ROW_
inline constexpr size_t kNumGateFields = kGateFields.size();

// The row named `name`; null for an unknown name.
const GateField* FindGateField(std::string_view name);

// The field's value as a double (counts are at most 1e6 once valid, so exact; a choice
// is its enum value).
double GateFieldValue(const GateConfig& config, const GateField& field);

// A value as its shortest text that reads back to it: an out-of-range 10.000001 must not
// print as the in-range "10", nor 0.2200001 as 0.22 (six digits, %g's and StrCat's).
std::string ShortestText(double v);

// The value as text: "0.18", "50", "ADAPTIVE".
std::string GateFieldText(const GateConfig& config, const GateField& field);

// Sets the field from text (a number, or a policy name); INVALID_ARGUMENT naming the
// field when the text is not one. The range is checked by CheckGateField, not here.
absl::Status SetGateFieldFromText(GateConfig& config, const GateField& field,
                                  std::string_view text);

// The value of the field named `name`; NaN for an unknown name.
double GateFieldValue(const GateConfig& config, std::string_view name);

// "(0, 1]", "(0, 10]", "[1, 1000000]" or "STATIC|ADAPTIVE": for help texts and errors.
std::string_view GateFieldRangeText(GateFieldRange range);

// The field's range check; the error names the field and the value.
absl::Status CheckGateField(const GateConfig& config, const GateField& field);

// Every field's range, then the rules between fields; the error names the field.
absl::Status ValidateGateConfig(const GateConfig& config);

}  // namespace spgate

#endif  // SPGATE_POLICY_GATE_CONFIG_H_
