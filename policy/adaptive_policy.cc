// The ADAPTIVE policy; its learned table is in throughput_table.cc. See adaptive_policy.h and
// docs/design.md §11.
#include "policy/adaptive_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "policy/band_pool.h"
#include "policy/exploration.h"
#include "policy/forgetting.h"

namespace spgate {
namespace {

// `detail` is a callable that makes the text: it runs only when a trace is wanted, so the
// decision path (trace null) formats nothing.
template <typename Detail>
void Record(std::vector<GateCheck>* trace, const char* gate, const char* outcome,
            std::optional<double> observed, std::optional<double> threshold, Detail&& detail) {
  if (trace != nullptr) {
    trace->push_back(GateCheck{gate, outcome, observed, threshold, std::string(detail())});
  }
}


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

namespace {

// `mode`'s estimate is the other's times the pairs' ratio, on the pairs' weight, with one
// pair's relative variance: the two modes' (each pair carries a sample of each).
void ReadThroughPairs(Mode mode, BandEstimate& e) {
  const double variance = e.sp.relative_variance + e.tp.relative_variance;
  CellView& read = mode == Mode::kTensorParallelOnly ? e.tp : e.sp;
  read.tokens_per_s = mode == Mode::kTensorParallelOnly ? e.sp.tokens_per_s * e.pair.ratio
                                                        : e.tp.tokens_per_s / e.pair.ratio;
  read.samples = e.pair.samples;
  read.relative_variance = variance;
  e.read_through_pairs = true;
}

// Where one of the band's cells is stale (its newest sample more than kPairGapSteps older
// than the other's, and no newer than the pairs') and the pairs' log gap differs from the
// cells' by more than kEvidenceZ standard errors of the difference (each cell's relative
// variance at least `variance_floor`, as rule 3's; a pair's the two cells' over the pairs'
// weight), the stale cell is read through the pairs. Where they agree, the cells stand:
// they rest on more samples, and a few pairs under random stragglers are noisier than a
// stale but steady cell.
void ReadStaleCellThroughPairs(const ThroughputTable& table, int band, double variance_floor,
                               BandEstimate& e) {
  const int64_t sp_last = table.cell(band, Mode::kSequenceParallel).last_step;
  const int64_t tp_last = table.cell(band, Mode::kTensorParallelOnly).last_step;
  const bool tp_stale = sp_last - tp_last > kPairGapSteps;
  if (!tp_stale && !(tp_last - sp_last > kPairGapSteps)) return;
  if (e.pair.last_step < (tp_stale ? tp_last : sp_last)) return;
  const double v_sp = std::max(e.sp.relative_variance, variance_floor);
  const double v_tp = std::max(e.tp.relative_variance, variance_floor);
  const double variance = (v_sp + v_tp) / e.pair.samples + v_sp / e.sp.samples + v_tp / e.tp.samples;
  const double gap = std::log(e.pair.ratio * e.sp.tokens_per_s / e.tp.tokens_per_s);
  if (!(std::abs(gap) > kEvidenceZ * std::sqrt(variance))) return;
  ReadThroughPairs(tp_stale ? Mode::kTensorParallelOnly : Mode::kSequenceParallel, e);
}

// After a change detected lately the pairs, all measured since (a change voids them), are
// the band's evidence: the cell the change re-based stands on its recent samples, and the
// other, which the change did not re-base (mostly weight from before it, at most moved by
// the re-based cell's factor), is read through them. Where the change re-based both, both
// stand. (Where the change is the other cell's alone, that cell is right and reading it
// through the pairs costs only precision, which its variance says.)
void ReadChangedBandThroughPairs(const ThroughputTable& table, int band, BandEstimate& e) {
  const int64_t changed = table.BandChangedStep(band);
  const bool sp_rebased = table.cell(band, Mode::kSequenceParallel).changed_step == changed;
  const bool tp_rebased = table.cell(band, Mode::kTensorParallelOnly).changed_step == changed;
  if (sp_rebased != tp_rebased) {
    ReadThroughPairs(sp_rebased ? Mode::kTensorParallelOnly : Mode::kSequenceParallel, e);
  }
}

}  // namespace

TableFacts TableFactsOf(const GateConfig& config, const ThroughputTable& table, int64_t step) {
  const TableNoise noise = TableNoiseOf(config, table);
  return {MeasuredSwitchCost(config, table, step, &noise), noise.relative_variance};
}

BandEstimate EstimateBand(const GateConfig& config, const ThroughputTable* table, int band,
                          int64_t step, const TableFacts* facts) {
  BandEstimate e;
  if (table == nullptr) return e;
  e.sp = table->At(config, band, Mode::kSequenceParallel, step);
  e.tp = table->At(config, band, Mode::kTensorParallelOnly, step);
  const auto min = static_cast<double>(config.adaptive_min_samples);
  e.pair = PairAt(config, table->pair(band), step);
  if (e.pair.samples >= min && e.pair.ratio > 0 && e.sp.samples > 0 && e.tp.samples > 0 &&
      e.sp.tokens_per_s > 0 && e.tp.tokens_per_s > 0) {
    const TableFacts f = facts != nullptr ? *facts : TableFactsOf(config, *table, step);
    // Where switching is free pairs speak in full: they end a re-learning (Relearning) and
    // read a changed band through them. Where a switch's cost is measured they read a stale
    // cell only: a re-learning they ended would leave the decision to cells measured mostly
    // on steps after a switch, off by what is left of its cost (docs/design.md §11,
    // "Paired evidence").
    e.paired = !(f.switch_cost > 0);
    if (ChangedLately(config, *table, band, step)) {
      if (e.paired) ReadChangedBandThroughPairs(*table, band, e);
    } else {
      ReadStaleCellThroughPairs(*table, band, f.variance_floor, e);
    }
  }
  e.known = e.sp.samples >= min && e.tp.samples >= min && e.sp.tokens_per_s > 0;
  if (e.sp.tokens_per_s > 0 && e.tp.tokens_per_s > 0) e.ratio = e.tp.tokens_per_s / e.sp.tokens_per_s;
  // The decision's form of the test (a ratio against 1 + margin), so that moving the rule
  // here changed no decision.
  if (e.known && e.tp.tokens_per_s / e.sp.tokens_per_s > 1.0 + config.adaptive_margin) {
    e.preferred = Mode::kTensorParallelOnly;
  }
  return e;
}

bool ChangedLately(const GateConfig& config, const ThroughputTable& table, int band,
                   int64_t step) {
  const int64_t changed = table.BandChangedStep(band);
  return changed >= 0 && step >= changed && step - changed < config.adaptive_explore_boost_steps;
}

bool Relearning(const GateConfig& config, const ThroughputTable& table, int band, int64_t step,
                const BandEstimate& e) {
  return ChangedLately(config, table, band, step) &&
         !(e.paired && e.pair.last_step >= table.BandChangedStep(band));
}

PriorFit FitPriorOf(const GateConfig& config, const ThroughputTable* table) {
  if (table == nullptr) return {};
  // The measured bands: both cells at the sample floor (a cell that reached it never
  // decays below it, so the raw weights say what EstimateBand would), at the band's mean
  // tokens and its CV's mid-point; the open top CV band has no mid-point and is left out.
  const double floor = SampleFloor(config);
  std::array<PriorBandSample, kBands> known;
  size_t n = 0;
  for (int b = 0; b < kBands; ++b) {
    const double cv = BandCvMidpoint(config, b);
    if (cv < 0) continue;
    const ThroughputCell& sp = table->cell(b, Mode::kSequenceParallel);
    const ThroughputCell& tp = table->cell(b, Mode::kTensorParallelOnly);
    if (!(sp.weight >= floor) || !(tp.weight >= floor) || !(sp.tokens_per_s() > 0) ||
        !(tp.tokens_per_s() > 0)) {
      continue;
    }
    const double tokens = 0.5 * (sp.tokens / sp.weight + tp.tokens / tp.weight);
    known[n++] = PriorBandSample{tokens, tokens / sp.tokens_per_s(), tokens / tp.tokens_per_s(),
                                cv, std::min(sp.weight, tp.weight)};
  }
  return FitPrior(table->prior_sums(),
                  std::span<const PriorBandSample>(known.data(), n), floor);
}

PriorEstimate PriorOf(const GateConfig& config, const ThroughputTable* table,
                      const BatchFacts& batch) {
  return PredictPrior(FitPriorOf(config, table), static_cast<double>(batch.tokens),
                      batch.length_cv);
}

double BandCvMidpoint(const GateConfig& config, int band) {
  if (!ValidBand(band) || band / kTokenBands == kCvBands - 1) return -1;
  return (band / kTokenBands + 0.5) * config.adaptive_cv_band_width;
}

uint64_t PriorBits(const GateConfig& config, const ThroughputTable& table, int64_t step) {
  const PriorFit fit = FitPriorOf(config, &table);
  if (!fit.has) return 0;
  const double base = static_cast<double>(std::max<int64_t>(config.adaptive_tokens_band_base, 1));
  const double middle[kTokenBands] = {0.5 * base, 1.5 * base, 3 * base, 6 * base};
  uint64_t bits = 0;
  const TableFacts facts = TableFactsOf(config, table, step);
  for (int b = 0; b < kBands; ++b) {
    if (EstimateBand(config, &table, b, step, &facts).known) continue;
    const ThroughputCell& sp = table.cell(b, Mode::kSequenceParallel);
    const ThroughputCell& tp = table.cell(b, Mode::kTensorParallelOnly);
    const ThroughputCell& c = sp.weight >= tp.weight ? sp : tp;
    const double tokens = c.weight > 0 ? c.tokens / c.weight : middle[b % kTokenBands];
    const double mid = BandCvMidpoint(config, b);
    const double cv = mid >= 0 ? mid : (kCvBands - 1) * config.adaptive_cv_band_width;
    const PriorChoice pc = ChoosePrior(
        config, fit,
        BatchFacts{.step = step, .length_cv = cv, .tokens = static_cast<int64_t>(tokens)});
    if (!pc.decides) continue;
    bits |= uint64_t{1} << (2 * b);
    if (pc.mode == Mode::kTensorParallelOnly) bits |= uint64_t{2} << (2 * b);
  }
  return bits;
}

PriorChoice ChoosePrior(const GateConfig& config, const PriorFit& fit, const BatchFacts& batch) {
  PriorChoice c;
  c.estimate = PredictPrior(fit, static_cast<double>(batch.tokens), batch.length_cv);
  if (!c.estimate.has) return c;
  c.ratio = c.estimate.sp_s / c.estimate.tp_s;
  const double need = 1.0 + config.adaptive_margin;
  c.decides = std::abs(c.ratio - need) > 2 * fit.error;
  if (c.decides && c.ratio > need) c.mode = Mode::kTensorParallelOnly;
  return c;
}

bool AdaptiveGainLedger::Add(const GateConfig& config, const ThroughputTable& table,
                             const GateOutcome& outcome, int64_t step, int64_t tokens) {
  if (!outcome.static_choice.has_value()) return false;
  const double ran = table.At(config, outcome.band, outcome.decision.mode, step).tokens_per_s;
  const double gates = table.At(config, outcome.band, *outcome.static_choice, step).tokens_per_s;
  if (!(ran > 0) || !(gates > 0)) return false;
  adaptive_s_ += static_cast<double>(tokens) / ran;
  static_s_ += static_cast<double>(tokens) / gates;
  return true;
}

bool FlipsAllowed(const GateConfig& config, const GroupGateState& state, int flips) {
  if (!state.has_chosen_mode) return true;  // the first choice switches nothing
  const int64_t window = 2 * config.adaptive_flip_interval_steps;
  std::array<int64_t, 4> history = {state.prev_switch_at, state.last_switch_at};
  size_t n = 2;
  for (int k = 0; k < flips && n < history.size(); ++k) {
    const int64_t at = state.decisions + k;
    int in_window = 1;  // this one
    for (size_t i = 0; i < n; ++i) in_window += at - history[i] < window ? 1 : 0;
    if (in_window > 2) return false;
    history[n++] = at;
  }
  return true;
}

SwitchSaving SwitchSavingOf(const GateConfig& config, const ThroughputTable& table, Mode from,
                            Mode to, const BatchFacts& batch, const BandEstimate& here) {
  if (from == to) return {};
  // A step's seconds in `mode` at the band's estimate, TP-only's weighted by 1 + margin.
  const auto weighted = [&](Mode mode, double tokens, double rate) {
    const double t = tokens / rate;
    return mode == Mode::kTensorParallelOnly ? t * (1.0 + config.adaptive_margin) : t;
  };
  double batch_saving = 0;
  if (here.known && here.tp.tokens_per_s > 0) {
    const auto tokens = static_cast<double>(batch.tokens);
    const double rate_from = from == Mode::kSequenceParallel ? here.sp.tokens_per_s : here.tp.tokens_per_s;
    const double rate_to = to == Mode::kSequenceParallel ? here.sp.tokens_per_s : here.tp.tokens_per_s;
    batch_saving = weighted(from, tokens, rate_from) - weighted(to, tokens, rate_to);
  }
  // The mix: each known band's saving per step at its mean tokens, weighted by its share
  // of the steps the move is judged over: the weight its cells hold, decayed by the steps
  // since their newest sample over kMoveHorizonDecisions, not the table's half-life, so a
  // band the lengths stopped bringing (a shift in the data) leaves the mix within a few
  // horizons rather than half-lives. A band whose change was detected lately counts in
  // the weight but saves nothing: its estimates are no evidence until both modes are
  // measured again (EvaluateAdaptive, step 3). (That is Relearning here: the mix is weighed
  // only where a switch's cost is measured, and there pairs do not end a re-learning.)
  const double h = static_cast<double>(std::max<int64_t>(config.adaptive_half_life_steps, 1));
  const double floor = SampleFloor(config);
  double mix_saving = 0, mix_weight = 0;
  for (int b = 0; b < kBands; ++b) {
    double tokens = 0, weight = 0;
    double samples[2] = {0, 0}, rate[2] = {0, 0};
    int cells = 0;
    for (int m = 0; m < 2; ++m) {
      const ThroughputCell& c = table.cell(b, m == 0 ? Mode::kSequenceParallel : Mode::kTensorParallelOnly);
      if (c.last_step < 0 || !(c.weight > 0)) continue;
      const double age = batch.step > c.last_step ? static_cast<double>(batch.step - c.last_step) : 0;
      weight += c.weight * std::exp2(-age / static_cast<double>(kMoveHorizonDecisions));
      samples[m] = FlooredWeight(c.weight, std::exp2(-age / h), floor);
      rate[m] = c.tokens_per_s();
      tokens += c.tokens / c.weight;  // the cell's mean tokens per step
      ++cells;
    }
    if (!(weight > 0)) continue;
    mix_weight += weight;
    if (ChangedLately(config, table, b, batch.step)) continue;
    if (samples[0] < floor || samples[1] < floor || !(rate[0] > 0) || !(rate[1] > 0)) continue;
    const double mean_tokens = tokens / cells;
    const double rate_from = from == Mode::kSequenceParallel ? rate[0] : rate[1];
    const double rate_to = to == Mode::kSequenceParallel ? rate[0] : rate[1];
    mix_saving += weight * (weighted(from, mean_tokens, rate_from) - weighted(to, mean_tokens, rate_to));
  }
  if (mix_weight > 0) mix_saving /= mix_weight;
  return {batch_saving, mix_saving};
}

Evidence DepartureEvidence(const GateConfig& config, const BandEstimate& here, int64_t tokens,
                           Mode from, Mode to, double variance_floor) {
  if (from == to || !here.known || !(here.tp.tokens_per_s > 0)) return {};
  const auto t = static_cast<double>(tokens);
  // A step's seconds in `mode` and their variance; a departure to TP-only counts its
  // seconds 1 + margin times (SP holds less memory), one to SP need only be faster.
  const auto seconds = [&](Mode mode, double* variance) {
    const CellView& v = mode == Mode::kSequenceParallel ? here.sp : here.tp;
    double x = t / v.tokens_per_s;
    if (mode == Mode::kTensorParallelOnly && to == Mode::kTensorParallelOnly) {
      x *= 1.0 + config.adaptive_margin;
    }
    const double relative = std::max(v.relative_variance, variance_floor);
    *variance = v.samples > 0 ? x * x * relative / v.samples : 0.0;
    return x;
  };
  double var_from = 0, var_to = 0;
  const double saving = seconds(from, &var_from) - seconds(to, &var_to);
  return {saving, saving - kEvidenceZ * std::sqrt(var_from + var_to)};
}

namespace {

// The seconds per decision that choosing `mode` pays for the forced runs it brings, at a
// switch's measured `cost` (docs/design.md §11). A run of decisions forced into the other
// mode (the memory gate's SP for a batch TP-only cannot fit) costs a group that chose
// `mode` two switches: the way back lands in `mode`'s own samples (a step enters as it
// ran), the way in in the forced mode's. So the way in is charged here, once per forced
// run into the other mode, spread over the decisions the policy chose; choosing the
// forced mode brings none.
double ForcedRunSeconds(const GroupGateState& state, Mode mode, double cost) {
  if (!(cost > 0) || !(state.chosen_weight >= 1)) return 0.0;
  const double runs = state.forced_runs[mode == Mode::kSequenceParallel ? 1 : 0];
  return cost * runs / state.chosen_weight;
}

// What leaving `from` for the other mode saves per decision in forced runs' switches.
double ForcedRunSaving(const GroupGateState& state, Mode from, double cost) {
  return ForcedRunSeconds(state, from, cost) - ForcedRunSeconds(state, OtherMode(from), cost);
}

// Step 3 of EvaluateAdaptive: the incumbent (the gates' decision), or the other mode where
// the band's evidence or the prior says so. Sets *prior when the prior departed, and
// *predicted whenever it predicted the batch (a band without evidence): what a switch to
// the gates' choice is weighed by where a switch's cost is measured (CostHolds).
// `forced_saving`: what leaving the incumbent saves per decision in forced runs' switches
// (ForcedRunSaving), added to the band's evidence.
Decision DepartOnEvidence(const GateConfig& config, const BatchFacts& batch, int band,
                          const ThroughputTable* table, const PriorFit* prior_fit,
                          const BandEstimate& e, const Decision& incumbent,
                          bool recently_changed, const TableFacts& facts,
                          double forced_saving, std::optional<PriorEstimate>* prior,
                          std::optional<PriorEstimate>* predicted, bool* leans,
                          std::vector<GateCheck>* trace) {
  const Mode other = OtherMode(incumbent.mode);
  if (e.known && recently_changed) {
    Record(trace, "adaptive", "skip", std::nullopt,
           static_cast<double>(config.adaptive_explore_boost_steps),
           [&] {
             return absl::StrFormat(
                 "band %s: a change was detected within adaptive_explore_boost_steps, "
                 "and the pairs since are under adaptive_min_samples; re-learning, the "
                 "gates' choice stands",
                 BandLabel(band));
           });
    return incumbent;
  }
  if (e.known) {
    Evidence ev =
        DepartureEvidence(config, e, batch.tokens, incumbent.mode, other, facts.variance_floor);
    // Inconclusive alone (the saving's interval spans 0): the band's gap shrunk towards
    // the other bands' (PoolBands) decides.
    bool pooled = false;
    if (!(ev.bound_s > 0) && table != nullptr && 2 * ev.saving_s - ev.bound_s > 0) {
      const BandPool pool = PoolBands(config, *table, batch.step, facts.variance_floor, &facts);
      if (pool.bands >= kMinPooledBands) {
        Record(trace, "adaptive_pooled", "check", ev.bound_s, 0, [&] {
          return absl::StrFormat(
              "band %s alone cannot tell (%.4g s at 95 %% confidence): pooled with %d known "
              "bands, mean log(SP / TP-only) %.4f, between-band variance %.3g",
              BandLabel(band), ev.bound_s, pool.bands, pool.mean, pool.between);
        });
        ev = PooledDepartureEvidence(config, e, pool, batch.tokens, incumbent.mode, other,
                                     facts.variance_floor);
        pooled = true;
      }
    }
    ev.saving_s += forced_saving;
    ev.bound_s += forced_saving;
    const bool depart = ev.bound_s > 0;
    // Undecided, but the estimates lean to the other mode by more than the margin of this
    // batch's seconds: more of its samples cost nothing expected (ExploreShareOf).
    const CellView& from = incumbent.mode == Mode::kSequenceParallel ? e.sp : e.tp;
    *leans = !depart && from.tokens_per_s > 0 &&
             ev.saving_s > config.adaptive_margin * static_cast<double>(batch.tokens) /
                               from.tokens_per_s;
    Record(trace, "adaptive", depart ? "fire" : "pass", ev.bound_s, 0, [&] {
      return absl::StrFormat(
          "band %s: TP-only's learned tokens/s is %.3fx SP's; %s saves %.4g s "
          "on this batch against the gates' %s (TP-only counted 1 + "
          "adaptive_margin times; %.4g s of it the switches of forced runs), %.4g s at "
          "95 %% confidence%s: %s",
          BandLabel(band), e.ratio, ModeLabel(other), ev.saving_s, ModeLabel(incumbent.mode),
          forced_saving, ev.bound_s, pooled ? " with the bands' pool" : "",
          depart ? ModeLabel(other) : "the gates' choice");
    });
    return depart ? Decision{other, Reason::kAdaptive} : incumbent;
  }
  Record(trace, "adaptive", "skip", std::min(e.sp.samples, e.tp.samples),
         static_cast<double>(config.adaptive_min_samples), [&] {
           return absl::StrFormat(
               "band %s: %.1f SP and %.1f TP-only samples, fewer than "
               "adaptive_min_samples",
               BandLabel(band), e.sp.samples, e.tp.samples);
         });
  const PriorChoice pc =
      ChoosePrior(config, prior_fit != nullptr ? *prior_fit : FitPriorOf(config, table), batch);
  const PriorEstimate& p = pc.estimate;
  if (p.has) *predicted = p;
  const double need = 1.0 + config.adaptive_margin;
  if (!pc.decides) {
    Record(trace, "prior", "skip", p.has ? std::optional<double>(pc.ratio) : std::nullopt, need,
           [&] {
      return p.has ? absl::StrFormat(
                         "predicted SP / TP-only step %.4f is within twice the "
                         "model's error (%.2g %%) of 1 + adaptive_margin; the "
                         "gates' choice stands",
                         pc.ratio, 100 * p.fit.error)
                   : absl::StrCat(p.fit.missing, "; the gates' choice stands");
    });
    return incumbent;
  }
  const bool tp_only = pc.mode == Mode::kTensorParallelOnly;
  Record(trace, "prior", tp_only ? "fire" : "pass", pc.ratio, need, [&] {
    return absl::StrFormat(
        "predicted step: SP %.4g s, TP-only %.4g s (SP's extra latency "
        "%.3g s [%s], imbalance %.3g s [%s], element-wise saving %.3g s "
        "[%s]; error %.2g %%): %s%s",
        p.sp_s, p.tp_s, p.latency_s, PriorSourceLabel(p.fit.latency_source), p.imbalance_s,
        PriorSourceLabel(p.fit.imbalance_source), p.elementwise_s,
        PriorSourceLabel(p.fit.elementwise_source), 100 * p.fit.error, tp_only ? "TP-only" : "SP",
        pc.mode == incumbent.mode ? ", as the gates" : "");
  });
  if (pc.mode == incumbent.mode) return incumbent;
  *prior = p;
  return {pc.mode, Reason::kAdaptive};
}

// Step 4 of EvaluateAdaptive, for a choice that would switch the group away from the mode
// it runs while a switch's cost is measured: whether the flip cap holds the group in it.
bool CapHolds(const GateConfig& config, const GroupGateState& state, const Decision& choice,
              double cost, std::vector<GateCheck>* trace) {
  // The way back from a forced decision to the mode the policy chose is exempt from the
  // cap (the cap is for the policy's own switches), not from the cost.
  const bool back_from_forced = IsForcedReason(state.reason) && state.has_chosen_mode &&
                                choice.mode == state.chosen_mode;
  if (back_from_forced || FlipsAllowed(config, state, 1)) return false;
  Record(trace, "flip_cap", "fire", 2, static_cast<double>(config.adaptive_flip_interval_steps),
         [&] {
           return absl::StrFormat(
               "a switch costs %.4g s (measured) and two switches came within "
               "the last %d decisions: %s holds",
               cost, 2 * config.adaptive_flip_interval_steps, ModeLabel(state.mode));
         });
  return true;
}

// Step 4's other half: whether the switch from the mode the group runs (state.mode) to
// `choice` fails to pay for its measured `cost`. `prior`: set when the prior departed;
// `predicted`: the prior's prediction for a batch in a band without evidence, whether or
// not it departed.
bool CostHolds(const GateConfig& config, const GroupGateState& state, const BatchFacts& batch,
               const ThroughputTable* table, const BandEstimate& e, const Decision& incumbent,
               const Decision& choice, const std::optional<PriorEstimate>& prior,
               const std::optional<PriorEstimate>& predicted, const TableNoise& noise,
               double cost, std::vector<GateCheck>* trace) {
  const Mode current = state.mode;
  const bool back_from_probe = state.reason == Reason::kProbe;
  // In a band without evidence the choice is the prior's departure or the gates' choice;
  // either is weighed by the prior's predicted saving where it predicts the batch, and
  // the gates' choice without a prediction obeys the cap alone.
  if (table != nullptr && (e.known || predicted.has_value()) && !back_from_probe) {
    SwitchSaving s = SwitchSavingOf(config, *table, current, choice.mode, batch, e);
    if (!e.known) {
      // The prior's batch saving. A switch the prior made must pay as a move (the band
      // mix's measured saving over the horizon), never as an excursion; the way to the
      // gates' choice weighs it as the way back to the incumbent in a known band weighs
      // its estimated saving.
      const double sp = predicted->sp_s, tp = predicted->tp_s * (1.0 + config.adaptive_margin);
      s.batch = current == Mode::kSequenceParallel ? sp - tp : tp - sp;
    } else if (choice.mode != incumbent.mode) {
      // The band's own confident saving. A departure the bands' pool made has its own
      // bound at or below 0 here, so it pays for the cost only as a move over the mix.
      s.batch = DepartureEvidence(config, e, batch.tokens, current, choice.mode,
                                  noise.relative_variance)
                    .bound_s;
    }
    // Every decision in the move saves the forced runs' switches alike.
    const double forced = ForcedRunSaving(state, current, cost);
    s.batch += forced;
    s.mix_per_step += forced;
    const double over_horizon =
        s.batch + static_cast<double>(kMoveHorizonDecisions - 1) * s.mix_per_step;
    const double excursion = s.batch - 2 * cost;
    const double move = over_horizon - cost;
    if (!(excursion >= 0 && !prior.has_value() && FlipsAllowed(config, state, 2)) &&
        !(move >= 0)) {
      Record(trace, "switch_cost", "fire", std::max(s.batch, over_horizon), cost, [&] {
        return absl::StrFormat(
            "switching to %s saves %.4g s on this batch%s and %.4g s a "
            "step on the mix: neither pays a switch's measured cost %.4g s "
            "(out and back, or over %d decisions): %s holds",
            ModeLabel(choice.mode), s.batch, e.known ? "" : " (predicted)",
            s.mix_per_step, cost, kMoveHorizonDecisions, ModeLabel(current));
      });
      return true;
    }
  }
  return false;
}

// Step 4 after a probe decision: whether the group goes back to the mode it ran before the
// run (state.probe_from; docs/design.md §11, "A probe run is an excursion"). It does where
// the group runs the mode the run measured, that mode is the gates' choice in a band
// without evidence (nothing learned, or re-learning after a change; the prior did not
// depart), the switch to it from the mode the run left does not pay (CostHolds, as if the
// group still ran that mode) and the cap leaves the switch back: the run was to measure,
// and without evidence the group's mode would otherwise be set by when a probe fell. Where
// the band's evidence chose the mode the run ran, the group stays: that switch is paid,
// and going back would be one more. Within the run this sets the way back that step 5's
// probe overrides (the run goes on); so a step plan's held run covers its step's first
// micro-batch, the later ones go back.
bool ProbeRunReturns(const GateConfig& config, const GroupGateState& state,
                     const BatchFacts& batch, const ThroughputTable* table,
                     const BandEstimate& e, bool recently_changed, const Decision& incumbent,
                     const Decision& choice, const std::optional<PriorEstimate>& prior,
                     const std::optional<PriorEstimate>& predicted, const TableNoise& noise,
                     double cost) {
  if (!state.has_decision || state.reason != Reason::kProbe || choice.mode != state.mode ||
      state.probe_from == state.mode || choice.mode != incumbent.mode || prior.has_value() ||
      (e.known && !recently_changed) || !FlipsAllowed(config, state, 1)) {
    return false;
  }
  GroupGateState left = state;
  left.mode = state.probe_from;
  left.reason = Reason::kAdaptive;
  return CostHolds(config, left, batch, table, e, incumbent, choice, prior, predicted, noise,
                   cost, nullptr);
}

// Step 5 of EvaluateAdaptive: the mode the step's probe run measures, where the step is in
// one and measures a mode other than `chosen` (step 4's choice); records the check.
// Exploration measures the mode not chosen, on the kProbeRunSteps steps of the band's
// period's probe run, if the cap (where it binds) leaves the flips out and back. Where
// switching is free, a band whose estimates lean undecided to the mode not chosen explores
// at the full share (its samples cost nothing expected), and one re-learning after a change
// runs its first run at once (the pairs it measures end the re-learning). Where a cost is
// measured neither: each run pays it twice, and pairs do not end a re-learning. (Only a
// step in a probe run of either share, or of a band re-learning, can explore: the band's
// share, a pass over the table for a band still learning, is taken on those alone.)
std::optional<Mode> ExploreStep(const GateConfig& config, const GroupGateState& state,
                                const ThroughputTable* table, int band, int64_t step,
                                const BandEstimate& e, bool recently_changed, bool leans,
                                bool free, bool held, Mode wanted, Mode chosen,
                                std::vector<GateCheck>* trace) {
  const bool relearn_now = recently_changed && free;
  int64_t period = 0, offset = 0;
  if (MayExplore(config, step) || relearn_now) {
    const double share = ExploreShareOf(config, table, band, step, e, leans && free);
    period = ExplorePeriod(share);
    offset = ExploreOffset(config, share, relearn_now ? table->BandChangedStep(band) : -1);
  }
  if (!(period > 0 && InProbeRun(step, period, offset))) return std::nullopt;
  // The mode not chosen before any hold (`wanted`: a held group already runs the other),
  // but a held group's the mode it is kept off where that mode's estimate in the band
  // predates the band's last change: the hold weighs a guess, and only a run replaces it.
  // While the band learns, its less-sampled mode at the run's start. A run in progress
  // goes on in its mode while the band learns, and where a switch's cost is measured (its
  // switches are paid; choosing the mode anew on every step switched the group on each
  // one, and a switch before any was measured teaches nothing: ObserveAfterSwitch). A step
  // plan's micro-batches share their step: the first of a step goes on with the previous
  // step's probe run, the others take the mode anew each.
  const bool kept_off_stale = held && e.known && table != nullptr &&
                              table->cell(band, wanted).last_step < table->BandChangedStep(band);
  const bool run_goes_on = state.has_decision && state.reason == Reason::kProbe &&
                           state.last_step == step - 1 && !StartsProbeRun(step, period, offset);
  const bool learning = !e.known && e.sp.samples != e.tp.samples;
  const Mode probe = run_goes_on && (learning || !free) ? state.mode
                     : !learning ? (kept_off_stale ? wanted : OtherMode(wanted))
                     : e.sp.samples < e.tp.samples ? Mode::kSequenceParallel
                                                   : Mode::kTensorParallelOnly;
  const int flips = state.has_chosen_mode && probe != state.chosen_mode ? 2 : 0;
  if (probe == chosen) {
    Record(trace, "explore", "pass", static_cast<double>(period), std::nullopt,
           [] { return "exploration step; the mode to measure is the one chosen"; });
    return std::nullopt;
  }
  if (!free && !FlipsAllowed(config, state, flips)) {
    Record(trace, "explore", "skip", static_cast<double>(period), std::nullopt, [&] {
      return absl::StrFormat(
          "exploration step (%d in %d), but the flip cap has no switch out and back left",
          kProbeRunSteps, period);
    });
    return std::nullopt;
  }
  Record(trace, "explore", "fire", static_cast<double>(period), std::nullopt, [&] {
    return absl::StrFormat("exploration step (%d in %d): %s runs to be measured%s",
                           kProbeRunSteps, period, ModeLabel(probe),
                           kept_off_stale && probe == wanted
                               ? " (the mode the group is held off: its estimate "
                                 "predates the band's last change)"
                               : "");
  });
  return probe;
}

}  // namespace

GateOutcome EvaluateAdaptive(const GateConfig& config, const GroupGateState& state,
                             const BatchFacts& batch, const RsWaitObservation& rs_wait,
                             std::optional<PinDirective> pin, const ThroughputTable* table,
                             std::vector<GateCheck>* trace, const PriorFit* prior_fit) {
  const int band = BandOf(config, batch.length_cv, batch.tokens);
  std::optional<Mode> static_choice;
  bool explored = false, held = false;
  auto finish = [&](Decision d) {
    GateOutcome out = AdvanceGroupState(state, batch.step, d, GatePolicyKind::kAdaptive);
    out.band = band;
    out.static_choice = static_choice;
    out.explored = explored;
    out.flip_held = held;
    return out;
  };

  // 1-2. Pin and memory, exactly as the gates.
  if (std::optional<Decision> d = PinAndMemoryGates(config, batch, pin, trace)) return finish(*d);

  // 3. The incumbent, the gates' decision; the other mode only on evidence. A change
  // detected in the band re-based one mode's estimate on a few recent samples; the other's
  // is from before it (at most moved by the same factor): for adaptive_explore_boost_steps
  // (or, switching free, until the pairs since it have the floor's weight) they are no
  // evidence (Relearning).
  // The table's noise: what a step spreads by, for the switch cost and the evidence (no
  // cell's spread is taken below the job's mean: stragglers hit every cell alike, and a
  // cell whose recent samples missed them would look surer than it is).
  const TableNoise noise = table == nullptr ? TableNoise{} : TableNoiseOf(config, *table);
  const double cost =
      table == nullptr ? 0.0 : MeasuredSwitchCost(config, *table, batch.step, &noise);
  const TableFacts facts{cost, noise.relative_variance};
  const BandEstimate e = EstimateBand(config, table, band, batch.step, &facts);
  const bool recently_changed =
      table != nullptr && Relearning(config, *table, band, batch.step, e);
  const Decision incumbent = ThresholdGates(config, state, batch, rs_wait, trace);
  if (e.known) static_choice = incumbent.mode;
  std::optional<PriorEstimate> prior;      // set when the prior departed
  std::optional<PriorEstimate> predicted;  // set when the prior predicted the batch
  bool leans = false;
  const double forced_saving = ForcedRunSaving(state, incumbent.mode, cost);
  Decision choice = DepartOnEvidence(config, batch, band, table, prior_fit, e, incumbent,
                                     recently_changed, facts, forced_saving, &prior,
                                     &predicted, &leans, trace);

  // 4. Where a switch's cost is measured, a switch must be allowed by the flip cap and pay
  // for it; where switching is free, neither binds. A switch is away from the mode the
  // group runs, whatever put it there: the way back to the policy's mode after a forced
  // decision (pin, memory) costs what any switch costs, and pays for it or the group stays
  // (the cap is for the policy's own switches: a forced one and the way back to the
  // policy's mode are exempt). A hold keeps the mode the group runs, so it never makes a
  // switch. A departure on the band's evidence weighs its confident saving, the way back
  // to the incumbent its estimated one, each as an excursion or a move; the prior's
  // departure only as a move (its batch saving is a prediction; the mix's is measured);
  // the gates' choice in a band without evidence the prior's predicted saving, as an
  // excursion or a move, and the cap alone where the prior has no prediction; the way back
  // from a probe run is free of the cost (the cap let the run out and back), and a run
  // that ended in the gates' choice of a band without evidence goes back to the mode it
  // left unless the switch from that mode pays (ProbeRunReturns).
  const bool free = !(cost > 0);
  const Mode wanted = choice.mode;
  bool back = false;  // the way back from a probe run (ProbeRunReturns)
  if (!free && state.has_decision && choice.mode != state.mode) {
    held = CapHolds(config, state, choice, cost, trace) ||
           CostHolds(config, state, batch, table, e, incumbent, choice, prior, predicted, noise,
                     cost, trace);
    if (held) choice = {state.mode, Reason::kAdaptive};
  } else if (!free && ProbeRunReturns(config, state, batch, table, e, recently_changed,
                                      incumbent, choice, prior, predicted, noise, cost)) {
    back = true;
    choice = {state.probe_from, Reason::kAdaptive};
  }

  // 5. Exploration (ExploreStep), which a probe run's later steps go on with.
  if (const std::optional<Mode> probe = ExploreStep(config, state, table, band, batch.step, e,
                                                    recently_changed, leans, free, held, wanted,
                                                    choice.mode, trace)) {
    choice = {*probe, Reason::kProbe};
    explored = true;
    held = false;
  }
  // The way back is traced where it decided: a run that goes on, or a new one, overrides it.
  if (back && !explored) {
    Record(trace, "probe_return", "fire", std::nullopt, cost, [&] {
      return absl::StrFormat(
          "the probe run measured %s, the gates' choice in a band without evidence; a "
          "switch to it from %s, which the run left, would not pay the measured %.4g s: "
          "back to %s",
          ModeLabel(state.mode), ModeLabel(state.probe_from), cost, ModeLabel(state.probe_from));
    });
  }
  return finish(choice);
}

GateOutcome EvaluatePolicy(const GateConfig& config, const GroupGateState& state,
                           const BatchFacts& batch, const RsWaitObservation& rs_wait,
                           std::optional<PinDirective> pin, const ThroughputTable* table,
                           std::vector<GateCheck>* trace, const PriorFit* prior_fit) {
  if (config.policy == GatePolicyKind::kAdaptive) {
    return EvaluateAdaptive(config, state, batch, rs_wait, pin, table, trace, prior_fit);
  }
  return EvaluateGates(config, state, batch, rs_wait, pin, trace);
}

}  // namespace spgate
