// ADAPTIVE's learned table: its cells' sums, forgetting, change detection and pairs, and the
// switch cost it learns; see adaptive_policy.h and docs/design.md §11.
#include <algorithm>
#include <cmath>

#include "policy/adaptive_policy.h"
#include "policy/forgetting.h"

namespace spgate {

namespace {

// The change detector's constants (docs/design.md §11): the fast mean follows the last
// several samples (weight 1/8 each), the noise the last few dozen (1/16); a change must
// stand out of the fast mean's own spread by kChangeSigmas. Tuned on the simulator's
// grid: 1/4 and 3 sigmas re-based stationary cells on noise (docs/benchmarks.md).
constexpr double kDriftRate = 0.125;
constexpr double kNoiseRate = 1.0 / 16;
constexpr double kChangeSigmas = 4.0;
static_assert(kChangeConfirmSamples * kDriftRate == 1.0, "held over the fast mean's window");

// A relative residual, bounded: one absurd step time (a clock glitch) moves the detector
// as far as a step four times as fast or infinitely slow, and never to inf or NaN.
double BoundedResidual(double r) { return std::clamp(r, -1.0, 4.0); }

bool ValidSample(int band, int64_t step, double tokens, double seconds) {
  return band >= 0 && band < kBands && std::isfinite(seconds) && seconds > 0 &&
         std::isfinite(tokens) && tokens >= 0 && step >= 0;
}

// The share of its final value a slow mean started at 0 has reached after `weight` samples:
// 1 − (1 − kNoiseRate)^min(weight, 64). Every decision takes it for every cell
// (TableNoiseOf), so the power is one exp2 of a constant logarithm, and a cell past 64
// samples (most, in a running job) takes the constant.
constexpr double kLog2NoiseKeep = -0.09310940439148147;  // log2(1 - 1/16)
constexpr double kNoiseStartedFull = 0.9839246036490473;  // 1 - (15/16)^64
double NoiseStarted(double weight) {
  if (weight >= 64.0) return kNoiseStartedFull;
  return 1.0 - std::exp2(weight * kLog2NoiseKeep);
}

// A cell's relative variance of one sample around its estimate (the detector's noise).
double RelativeVariance(const ThroughputCell& c) {
  if (!(c.weight > 0) || !std::isfinite(c.noise) || !(c.noise > 0)) return 0.0;
  return c.noise / NoiseStarted(c.weight);
}

// The running mode's level now, as a factor on its own cell's estimate: the fast mean of
// its recent seconds (seconds_drift), bounded as the residuals are.
double LevelNow(const ThroughputCell& running) {
  return std::max(1.0 + running.seconds_drift, 0.2);
}

// How much slower than its estimate the band runs now, as a factor on the estimate of the
// mode a group just entered: the level of the mode it left behind (LevelNow) where that
// one has the sample floor's weight and a sample within kPairGapSteps of `step` (either
// side: a late sample of another group), else 1. A slowdown (a straggler burst) slows
// every mode of the band alike (as TableNoiseOf takes stragglers); a level under 1 is
// not taken: that is a cell running faster than an estimate that took in a slowdown, and
// whether the entered cell took it in too is not known (docs/design.md §11).
double SlowdownNow(const ThroughputCell& left, int64_t step, double floor) {
  if (left.last_step < 0 || !(left.weight >= floor) ||
      std::abs(step - left.last_step) > kPairGapSteps) {
    return 1.0;
  }
  return std::max(1.0, LevelNow(left));
}

}  // namespace

void ThroughputTable::MarkChanged(int band, ThroughputCell& c, int64_t step) {
  ++changes_;
  c.changed_step = std::max(c.changed_step, step);
  // The pairs measured the modes' gap before the change: void (paired_evidence.h).
  pairs_[band] = PairedCell{};
}

void ThroughputTable::Observe(const GateConfig& config, int band, Mode mode, int64_t step,
                              double tokens, double seconds) {
  if (!ValidSample(band, step, tokens, seconds)) return;
  FoldSample(config, band, mode, step, tokens, seconds);
  // After the fold: a change this sample confirmed voids the pairs before it, not this one.
  Pair(config, band, mode, step, tokens, seconds);
}

void ThroughputTable::Pair(const GateConfig& config, int band, Mode mode, int64_t step,
                           double tokens, double seconds) {
  // The other mode's level now: the seconds the step's tokens take at that cell's estimate,
  // moved by the fast mean of its recent seconds (paired_evidence.h). A late step from
  // before the band's last change pairs with nothing: the change voided its time's pairs.
  const ThroughputCell& o = cells_[Index(band, OtherMode(mode))];
  if (!(tokens > 0) || !(o.weight >= SampleFloor(config)) || !(o.tokens_per_s() > 0) ||
      std::abs(step - o.last_step) > kPairGapSteps || step < BandChangedStep(band)) {
    return;
  }
  const double other_s = tokens / o.tokens_per_s() * LevelNow(o);
  const bool sp = mode == Mode::kSequenceParallel;
  AddPair(config, pairs_[band], step, sp ? seconds : other_s, sp ? other_s : seconds);
}

void ThroughputTable::FoldSample(const GateConfig& config, int band, Mode mode, int64_t step,
                                 double tokens, double seconds) {
  const int64_t h = config.adaptive_half_life_steps;
  const double floor = SampleFloor(config);
  ThroughputCell& c = cells_[Index(band, mode)];
  ThroughputCell& o = cells_[Index(band, OtherMode(mode))];
  if (c.last_step < 0) {
    const int64_t changed = c.changed_step;
    const double straggler_share = c.straggler_share;  // ObserveStraggler's, kept apart
    c = ThroughputCell{tokens, seconds, 1.0, step};
    c.changed_step = changed;
    c.straggler_share = straggler_share;
    newest_step_ = std::max(newest_step_, step);
    return;
  }
  // A band back after a half-life without samples: its estimates are stale, explore.
  if (step - std::max(c.last_step, o.last_step) > h) MarkChanged(band, c, step);
  // The change detector, on the sample's residual against the estimate before it.
  const double estimate = c.tokens_per_s();
  if (estimate > 0) {
    const double residual = BoundedResidual(tokens / seconds / estimate - 1.0);
    // The noise is the spread around the fast mean (a level shift does not inflate it),
    // corrected for its start at 0 (the cell's weight counts its samples until they
    // decay); the fast mean's own spread under that noise is what a change must exceed.
    const double around = residual - c.drift;
    c.noise += kNoiseRate * (around * around - c.noise);
    c.drift += kDriftRate * (residual - c.drift);
    if (tokens > 0) {  // bounded as the residual: one absurd step moves it a finite way
      const double r =
          std::clamp(seconds * estimate / tokens - 1.0, kSecondsDriftMin, kSecondsDriftMax);
      c.seconds_drift += kDriftRate * (r - c.seconds_drift);
    }
    const double spread =
        std::sqrt(c.noise / NoiseStarted(c.weight) * kDriftRate / (2.0 - kDriftRate));
    const bool over =
        c.weight >= floor &&
        std::abs(c.drift) > std::max(config.adaptive_change_threshold, kChangeSigmas * spread);
    const int32_t side = c.drift > 0 ? 1 : -1;
    c.beyond = !over ? 0 : c.beyond * side > 0 ? c.beyond + side : side;
    if (std::abs(c.beyond) >= kChangeConfirmSamples) {
      // Re-base the cell on the recent samples, at the floor's weight, and explore. The
      // band's estimates are no evidence for a departure until the boosted exploration has
      // measured both again, or the pairs since speak (Relearning).
      // Re-based through the seconds, so a cell's mean tokens per step (the band mix's
      // weights in SwitchSavingOf) stay what they were.
      const double factor = std::max(1.0 + c.drift, 1e-3);
      // A stale other mode's estimate moves by the same factor, the change taken as the
      // band's (its length mix moved, a node slowed): left as it was, it read the change as
      // a gap between the modes when the window ended (docs/design.md §11, "Change
      // detection"). Stale: no sample within kPairGapSteps (a cell sampled that lately
      // follows the band by its own detector). Only a cell with a sample at or after the
      // band's last change mark moves: one whose newest sample is older was moved at that
      // change (or left, at a mark for a band back after a half-life), so the running
      // mode's detections cannot ratchet it. (A new launch that inherits the table
      // restamps its cells' newest steps, which allows one more move.)
      if (o.weight > 0 && step - o.last_step > kPairGapSteps &&
          o.last_step >= BandChangedStep(band)) {
        o.seconds /= factor;
      }
      const double mean_tokens = c.tokens / c.weight;
      c.weight = floor;
      c.tokens = mean_tokens * floor;
      c.seconds = c.tokens / (estimate * factor);
      c.drift = 0;
      c.seconds_drift = 0;
      c.beyond = 0;
      MarkChanged(band, c, step);
    }
  }
  if (step >= c.last_step) {
    const double w =
        FlooredWeight(c.weight, HalfLifeDecay(static_cast<double>(step - c.last_step), h), floor);
    const double k = w / c.weight;
    c.tokens = c.tokens * k + tokens;
    c.seconds = c.seconds * k + seconds;
    c.weight = w + 1.0;
    c.last_step = step;
  } else {  // a late sample (another group behind this one): it enters already decayed
    const double f = HalfLifeDecay(static_cast<double>(c.last_step - step), h);
    c.tokens += tokens * f;
    c.seconds += seconds * f;
    c.weight += f;
  }
  newest_step_ = std::max(newest_step_, step);
}

bool ThroughputTable::ObserveAfterSwitch(const GateConfig& config, int band, Mode mode,
                                         int64_t step, double tokens, double seconds,
                                         bool exploration, bool forced) {
  if (!ValidSample(band, step, tokens, seconds)) return false;
  const ThroughputCell& c = cell(band, mode);
  // Measured against an estimate of at least the sample floor's weight only, and not
  // against one a change detected lately in the band (ChangedLately) left from before it:
  // the other cell, re-based, took in what changed, which may be the band's slowdown.
  const bool left_before_change =
      c.changed_step < BandChangedStep(band) && ChangedLately(config, *this, band, step);
  const bool measured = !forced && c.weight >= SampleFloor(config) && c.tokens_per_s() > 0 &&
                        !left_before_change;
  // Exploration's cost as measured before this step, at most half the step (as
  // ObserveCollectives).
  const double cost = exploration ? MeasuredSwitchCost(config, *this, step) : 0.0;
  const double entered = std::max(seconds - cost, 0.5 * seconds);
  const bool enters =
      !exploration || switch_cost_.last_step >= 0 || c.weight >= SampleFloor(config);
  if (measured) {
    // Against the mode's estimate slowed as the band runs now (SlowdownNow): a straggler
    // burst slows the step after a switch as it slows every other, and measured against
    // the estimate from before the burst, every switch in it looked like a cost.
    const double level = SlowdownNow(cell(band, OtherMode(mode)), step, SampleFloor(config));
    const double excess = seconds - tokens / c.tokens_per_s() * level;
    const int64_t h = config.adaptive_half_life_steps;
    SwitchCostCell& s = switch_cost_;
    if (s.last_step < 0) {
      s = SwitchCostCell{excess, 1.0, step};
    } else if (step >= s.last_step) {
      const double f = HalfLifeDecay(static_cast<double>(step - s.last_step), h);
      s = SwitchCostCell{s.seconds * f + excess, s.weight * f + 1.0, step};
    } else {
      const double f = HalfLifeDecay(static_cast<double>(s.last_step - step), h);
      s.seconds += excess * f;
      s.weight += f;
    }
  }
  // The step still measures its mode. A forced or chosen switch's step enters as it ran:
  // taking the learned cost off every such step would measure the next switch against an
  // estimate the cost itself raised — where most of a mode's steps follow a switch (a
  // stage's micro-batches between forced ones) any cost is then its own fixed point.
  // Exploration's switches are charged to exploration, not to the mode (docs/design.md
  // §11).
  if (enters) Observe(config, band, mode, step, tokens, entered);
  return measured;
}

bool ThroughputTable::ObserveStraggler(const GateConfig& config, const GroupStepSample& x) {
  if (!ValidBand(x.band)) return false;
  if (x.timed) {
    stragglers_.timed[x.mode == Mode::kTensorParallelOnly ? 1 : 0] = true;
  } else {
    stragglers_.untimed = true;
  }
  if (!StragglersKnown() || !(x.straggler_s >= 0) || !(x.seconds > 0) ||
      !std::isfinite(x.straggler_s / x.seconds)) {
    return false;
  }
  ThroughputCell& c = cells_[Index(x.band, x.mode)];
  const double share = std::min(x.straggler_s / x.seconds, 1.0);
  if (c.straggler_share < 0) c.straggler_share = std::min(share, config.adaptive_straggler_share);
  const double bound = c.straggler_share + config.adaptive_straggler_share;
  c.straggler_share += kDriftRate * (std::min(share, bound) - c.straggler_share);
  return share > bound;
}

bool ObserveGroupStep(const GateConfig& config, ThroughputTable& table,
                      const GroupStepSample& x, bool prior, bool* straggler) {
  const bool slowed = x.band >= 0 && table.ObserveStraggler(config, x);
  if (straggler != nullptr) *straggler = slowed;
  if (x.band < 0 || slowed) return false;
  bool measured = false;
  if (x.after_switch) {
    measured = table.ObserveAfterSwitch(config, x.band, x.mode, x.step, x.tokens, x.seconds,
                                        x.exploration, x.forced);
  } else {
    table.Observe(config, x.band, x.mode, x.step, x.tokens, x.seconds);
  }
  if (prior) {
    table.ObserveCollectives(config, x.mode, x.step, x.tokens, x.length_cv, x.seconds,
                             x.all_gather_s, x.rs_wait_s, x.after_switch);
  }
  return measured;
}

bool ThroughputTable::ObserveCollectives(const GateConfig& config, Mode mode, int64_t step,
                                         double tokens, double length_cv, double seconds,
                                         double all_gather_s, double rs_wait_s,
                                         bool after_switch) {
  if (mode != Mode::kSequenceParallel) return false;
  if (after_switch && std::isfinite(seconds)) {
    seconds = std::max(seconds - SwitchCostSeconds(), 0.5 * seconds);
  }
  return AddPriorSample(prior_sums_, config.adaptive_half_life_steps, SampleFloor(config), step,
                        tokens, length_cv,
                        seconds, all_gather_s, rs_wait_s);
}

double ThroughputTable::SwitchCostSeconds() const {
  const SwitchCostCell& s = switch_cost_;
  if (!(s.weight > 0) || !std::isfinite(s.seconds)) return 0.0;
  return std::max(0.0, s.seconds / s.weight);
}

int64_t ThroughputTable::BandChangedStep(int band) const {
  if (!ValidBand(band)) return -1;
  return std::max(cell(band, Mode::kSequenceParallel).changed_step,
                  cell(band, Mode::kTensorParallelOnly).changed_step);
}

CellView ThroughputTable::At(const GateConfig& config, int band, Mode mode, int64_t step) const {
  if (!ValidBand(band)) return {};
  const ThroughputCell& c = cells_[Index(band, mode)];
  if (c.last_step < 0) return {};
  const double age = step > c.last_step ? static_cast<double>(step - c.last_step) : 0.0;
  return CellView{c.tokens_per_s(),
                  FlooredWeight(c.weight, HalfLifeDecay(age, config.adaptive_half_life_steps),
                                SampleFloor(config)),
                  RelativeVariance(c)};
}

void ThroughputTable::SetCell(int band, Mode mode, const ThroughputCell& cell) {
  if (!ValidBand(band)) return;
  cells_[Index(band, mode)] = cell;
  newest_step_ = std::max(newest_step_, cell.last_step);
}

const PairedCell& ThroughputTable::pair(int band) const {
  static const PairedCell kNone;
  return ValidBand(band) ? pairs_[band] : kNone;
}

void ThroughputTable::SetPair(int band, const PairedCell& pair) {
  if (!ValidBand(band)) return;
  pairs_[band] = pair;
  newest_step_ = std::max(newest_step_, pair.last_step);
}

uint64_t ThroughputTable::PreferenceBits(const GateConfig& config, int64_t step) const {
  static_assert(2 * kBands <= 64);
  uint64_t bits = 0;
  const TableFacts facts = TableFactsOf(config, *this, step);
  for (int b = 0; b < kBands; ++b) {
    const BandEstimate e = EstimateBand(config, this, b, step, &facts);
    if (!e.known) continue;
    bits |= uint64_t{1} << (2 * b);
    if (e.preferred == Mode::kTensorParallelOnly) bits |= uint64_t{2} << (2 * b);
  }
  return bits;
}

TableNoise TableNoiseOf(const GateConfig& config, const ThroughputTable& table) {
  // Over the cells with the sample floor's weight, weighted by it.
  const double floor = SampleFloor(config);
  TableNoise n;
  double weight = 0;
  for (int b = 0; b < kBands; ++b) {
    for (const Mode m : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      const ThroughputCell& c = table.cell(b, m);
      if (!(c.weight >= floor) || !(c.tokens > 0)) continue;
      const double v = RelativeVariance(c);
      n.step_seconds += c.seconds;
      n.spread_seconds += std::sqrt(v) * c.seconds;
      n.relative_variance += c.weight * v;
      weight += c.weight;
    }
  }
  if (!(weight > 0)) return {};
  n.step_seconds /= weight;
  n.spread_seconds /= weight;
  n.relative_variance /= weight;
  return n;
}

double MeasuredSwitchCost(const GateConfig& config, const ThroughputTable& table, int64_t step,
                          const TableNoise* noise) {
  const double cost = table.SwitchCostSeconds();
  const SwitchCostCell& s = table.switch_cost();
  if (!(cost > 0) || !(s.weight > 0) || s.last_step < 0) return 0.0;
  const TableNoise n = noise != nullptr ? *noise : TableNoiseOf(config, table);
  if (!(n.step_seconds > 0)) return 0.0;  // nothing to say what a step takes: not measured
  // Below the margin of a step a cost is no difference the policy acts on (a band's
  // estimate of the step after a switch is off by about that much, switching or not).
  if (!(cost > config.adaptive_margin * n.step_seconds)) return 0.0;
  const double age = step > s.last_step ? static_cast<double>(step - s.last_step) : 0.0;
  const double w = s.weight * HalfLifeDecay(age, config.adaptive_half_life_steps);
  if (!(w > 0)) return 0.0;
  return cost > kEvidenceZ * n.spread_seconds / std::sqrt(w) ? cost : 0.0;
}

}  // namespace spgate
