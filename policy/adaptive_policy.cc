// The ADAPTIVE policy and its learned table; see adaptive_policy.h and docs/design.md §11.
#include "policy/adaptive_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spgate {
namespace {

// Weight left after `steps` steps at the given half-life.
double Decay(double steps, int64_t half_life_steps) {
  return std::exp2(-steps / static_cast<double>(std::max<int64_t>(half_life_steps, 1)));
}

void Record(std::vector<GateCheck>* trace, const char* gate, const char* outcome,
            double observed, double threshold, std::string detail) {
  if (trace != nullptr) {
    trace->push_back(GateCheck{gate, outcome, observed, threshold, std::move(detail)});
  }
}

bool ValidBand(int band) { return band >= 0 && band < kBands; }

}  // namespace

int BandOf(const GateConfig& config, double length_cv, int64_t tokens) {
  int cv_band = 0;
  if (length_cv > 0 && config.adaptive_cv_band_width > 0) {
    // The nudge puts a CV exactly on an edge (0.3 with width 0.1: 2.9999999999999996)
    // in the band above it, as the edges are written.
    const double k = std::floor(length_cv / config.adaptive_cv_band_width + 1e-9);
    cv_band = static_cast<int>(std::min<double>(kCvBands - 1, std::max(0.0, k)));
  }
  const int64_t base = std::max<int64_t>(config.adaptive_tokens_band_base, 1);
  const int tok_band = tokens < base ? 0 : tokens < 2 * base ? 1 : tokens < 4 * base ? 2 : 3;
  return cv_band * kTokenBands + tok_band;
}

std::string BandLabel(int band) {
  if (!ValidBand(band)) return "none";
  return absl::StrCat("cv", band / kTokenBands, ".tok", band % kTokenBands);
}

std::string BandRangeText(const GateConfig& config, int band) {
  if (!ValidBand(band)) return "none";
  const int c = band / kTokenBands, t = band % kTokenBands;
  const double w = config.adaptive_cv_band_width;
  const std::string cv = c == kCvBands - 1 ? absl::StrFormat("cv >= %g", c * w)
                                           : absl::StrFormat("cv [%g, %g)", c * w, (c + 1) * w);
  const int64_t b = config.adaptive_tokens_band_base;
  const int64_t edges[] = {0, b, 2 * b, 4 * b};
  const std::string tok = t == kTokenBands - 1
                              ? absl::StrFormat("tokens >= %d", edges[t])
                              : absl::StrFormat("tokens [%d, %d)", edges[t], edges[t + 1]);
  return absl::StrCat(cv, ", ", tok);
}

void ThroughputTable::Observe(int band, Mode mode, int64_t step, double tokens, double seconds,
                              int64_t half_life_steps) {
  if (!ValidBand(band) || !std::isfinite(seconds) || seconds <= 0 || !std::isfinite(tokens) ||
      tokens < 0 || step < 0) {
    return;
  }
  ThroughputCell& c = cells_[Index(band, mode)];
  if (c.last_step < 0) {
    c = ThroughputCell{tokens, seconds, 1.0, step};
  } else if (step >= c.last_step) {
    const double f = Decay(static_cast<double>(step - c.last_step), half_life_steps);
    c.tokens = c.tokens * f + tokens;
    c.seconds = c.seconds * f + seconds;
    c.weight = c.weight * f + 1.0;
    c.last_step = step;
  } else {  // a late sample (another group behind this one): it enters already decayed
    const double f = Decay(static_cast<double>(c.last_step - step), half_life_steps);
    c.tokens += tokens * f;
    c.seconds += seconds * f;
    c.weight += f;
  }
  newest_step_ = std::max(newest_step_, step);
}

CellView ThroughputTable::At(int band, Mode mode, int64_t step, int64_t half_life_steps) const {
  if (!ValidBand(band)) return {};
  const ThroughputCell& c = cells_[Index(band, mode)];
  if (c.last_step < 0) return {};
  const double age = step > c.last_step ? static_cast<double>(step - c.last_step) : 0.0;
  return CellView{c.tokens_per_s(), c.weight * Decay(age, half_life_steps)};
}

void ThroughputTable::SetCell(int band, Mode mode, const ThroughputCell& cell) {
  if (!ValidBand(band)) return;
  cells_[Index(band, mode)] = cell;
  newest_step_ = std::max(newest_step_, cell.last_step);
}

uint64_t ThroughputTable::PreferenceBits(const GateConfig& config, int64_t step) const {
  static_assert(2 * kBands <= 64);
  uint64_t bits = 0;
  for (int b = 0; b < kBands; ++b) {
    const BandEstimate e = EstimateBand(config, this, b, step);
    if (!e.known) continue;
    bits |= uint64_t{1} << (2 * b);
    if (e.preferred == Mode::kTensorParallelOnly) bits |= uint64_t{2} << (2 * b);
  }
  return bits;
}

BandEstimate EstimateBand(const GateConfig& config, const ThroughputTable* table, int band,
                          int64_t step) {
  BandEstimate e;
  if (table == nullptr) return e;
  const int64_t h = config.adaptive_half_life_steps;
  e.sp = table->At(band, Mode::kSequenceParallel, step, h);
  e.tp = table->At(band, Mode::kTensorParallelOnly, step, h);
  const auto min = static_cast<double>(config.adaptive_min_samples);
  e.known = e.sp.samples >= min && e.tp.samples >= min && e.sp.tokens_per_s > 0;
  if (e.sp.tokens_per_s > 0 && e.tp.tokens_per_s > 0) e.ratio = e.tp.tokens_per_s / e.sp.tokens_per_s;
  // The decision's form of the test (a ratio against 1 + margin), so that moving the rule
  // here changed no decision.
  if (e.known && e.tp.tokens_per_s / e.sp.tokens_per_s > 1.0 + config.adaptive_margin) {
    e.preferred = Mode::kTensorParallelOnly;
  }
  return e;
}

bool AdaptiveGainLedger::Add(const GateConfig& config, const ThroughputTable& table,
                             const GateOutcome& outcome, int64_t step, int64_t tokens) {
  if (!outcome.static_choice.has_value()) return false;
  const int64_t h = config.adaptive_half_life_steps;
  const double ran = table.At(outcome.band, outcome.decision.mode, step, h).tokens_per_s;
  const double gates = table.At(outcome.band, *outcome.static_choice, step, h).tokens_per_s;
  if (!(ran > 0) || !(gates > 0)) return false;
  adaptive_s_ += static_cast<double>(tokens) / ran;
  static_s_ += static_cast<double>(tokens) / gates;
  return true;
}

int64_t ExplorePeriod(const GateConfig& config) {
  const double share = config.adaptive_explore_share;
  if (!(share > 0)) return INT64_MAX;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(1.0 / share - 1e-9)));
}

GateOutcome EvaluateAdaptive(const GateConfig& config, const GroupGateState& state,
                             const BatchFacts& batch, const RsWaitObservation& rs_wait,
                             std::optional<PinDirective> pin, const ThroughputTable* table,
                             std::vector<GateCheck>* trace) {
  const int band = BandOf(config, batch.length_cv, batch.tokens);
  std::optional<Mode> static_choice;
  bool explored = false;
  auto finish = [&](Decision d) {
    GateOutcome out = AdvanceGroupState(state, batch.step, d, GatePolicyKind::kAdaptive);
    out.band = band;
    out.static_choice = static_choice;
    out.explored = explored;
    return out;
  };

  // 1-2. Pin and memory, exactly as the gates.
  if (std::optional<Decision> d = PinAndMemoryGates(config, batch, pin, trace)) return finish(*d);

  // 3. The band's estimates, or the gates while the band has too few samples.
  const BandEstimate e = EstimateBand(config, table, band, batch.step);
  const CellView& sp = e.sp;
  const CellView& tp = e.tp;
  const auto min = static_cast<double>(config.adaptive_min_samples);
  const double need = 1.0 + config.adaptive_margin;
  Decision choice;
  if (e.known) {
    static_choice = ThresholdGates(config, state, batch, rs_wait, nullptr).mode;
    const double ratio = tp.tokens_per_s / sp.tokens_per_s;
    if (e.preferred == Mode::kTensorParallelOnly) {
      Record(trace, "adaptive", "fire", ratio, need,
             absl::StrFormat("band %s: TP-only's learned tokens/s is %.3fx SP's, above "
                             "1 + adaptive_margin",
                             BandLabel(band), ratio));
      choice = {Mode::kTensorParallelOnly, Reason::kAdaptive};
    } else {
      Record(trace, "adaptive", "pass", ratio, need,
             absl::StrFormat("band %s: TP-only's learned tokens/s is %.3fx SP's, not above "
                             "1 + adaptive_margin: SP (less memory)",
                             BandLabel(band), ratio));
      choice = {Mode::kSequenceParallel, Reason::kAdaptive};
    }
  } else {
    Record(trace, "adaptive", "skip", std::min(sp.samples, tp.samples), min,
           absl::StrFormat("band %s: %.1f SP and %.1f TP-only samples, fewer than "
                           "adaptive_min_samples; the static gates decide",
                           BandLabel(band), sp.samples, tp.samples));
    choice = ThresholdGates(config, state, batch, rs_wait, trace);
  }

  // 4. Exploration: the less-sampled mode, on one step in ExplorePeriod, while it has
  // fewer than twice the samples a band needs (a well-measured mode is not re-measured
  // until its samples fade; with many groups pooled that is seldom).
  const int64_t period = ExplorePeriod(config);
  if (batch.step >= 0 && batch.step % period == 0 && std::min(sp.samples, tp.samples) < 2 * min) {
    const Mode less = sp.samples < tp.samples   ? Mode::kSequenceParallel
                      : tp.samples < sp.samples ? Mode::kTensorParallelOnly
                      : choice.mode == Mode::kSequenceParallel ? Mode::kTensorParallelOnly
                                                               : Mode::kSequenceParallel;
    if (less != choice.mode) {
      Record(trace, "explore", "fire", static_cast<double>(period), 0,
             absl::StrFormat("exploration step (one in %d): the less-sampled mode %s runs",
                             period, ModeLabel(less)));
      choice = {less, Reason::kProbe};
      explored = true;
    } else {
      Record(trace, "explore", "pass", static_cast<double>(period), 0,
             "exploration step; the less-sampled mode is the one chosen");
    }
  }
  return finish(choice);
}

GateOutcome EvaluatePolicy(const GateConfig& config, const GroupGateState& state,
                           const BatchFacts& batch, const RsWaitObservation& rs_wait,
                           std::optional<PinDirective> pin, const ThroughputTable* table,
                           std::vector<GateCheck>* trace) {
  if (config.policy == GatePolicyKind::kAdaptive) {
    return EvaluateAdaptive(config, state, batch, rs_wait, pin, table, trace);
  }
  return EvaluateGates(config, state, batch, rs_wait, pin, trace);
}

}  // namespace spgate
