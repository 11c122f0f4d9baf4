// ADAPTIVE's physics prior (docs/design.md §11, "The prior"): before a band has the
// samples to decide, each mode's step time comes from a small α/β cost model instead of
// the static gates. The model is written as SP's step time minus TP-only's:
//
//   t_SP(T, c) = ρ₀·T·(1 + κ·w·c)              ρ₀: SP's balanced seconds per token
//   t_TP(T, c) = ρ₀·T − λ + ε·T
//
//   λ  the latency of the collective calls SP adds: per layer SP runs 2 all-gathers and 2
//      reduce-scatters forward and as many backward where TP-only runs 2 + 2 all-reduces
//      (4·L extra calls a step), while a ring all-reduce moves exactly the bytes of a
//      reduce-scatter plus an all-gather: the bandwidth terms cancel and SP pays 4·L·α
//      more (at TP 8 with NVLink SHARP the all-reduce is faster than the pair; ε absorbs
//      that difference as far as it is linear in T). Measured as the intercept of the SP
//      steps' all-gather seconds against their tokens (the all-gathers are 4·L calls);
//      with too little spread in tokens, 0 (ε then absorbs it at the measured bands'
//      sizes). Nothing the job declares enters: λ from a declared hardware preset (its
//      measured collective curves at each batch's message size) was measured and did
//      not earn its place (docs/benchmarks.md, "The physics prior").
//   w  the reduce-scatter wait per unit of length CV: the slope of the SP steps' wait
//      share ((rs_wait − all_gather) / step seconds, the group's largest) against their
//      length CV. The largest rank's wait is the slowest minus the fastest rank; the step
//      pays the slowest minus the mean, κ = 1/2 of it (kImbalanceShare).
//   ε  the element-wise region's seconds per token SP saves (LayerNorm, dropout and the
//      residual run on T/t tokens per rank instead of T), and κ, the share of the largest
//      rank's wait a step pays (the slowest rank minus the mean, of the slowest minus the
//      fastest): fitted on the bands whose two modes are measured (what the rest of the
//      model leaves of their difference, a weighted least-squares fit; κ only where the
//      bands' CVs tell the two apart, else kImbalanceShare).
//
// Every constant comes from the job's own telemetry. The model answers only with the base
// rate, w and ε (so not before a band is measured); otherwise the static gates decide. Its
// error is the RMS of what the fit leaves; a prediction within twice of it does not decide
// either. Pure: no I/O. FitPrior is the costly part (a pass over the measured bands); a
// caller deciding many batches on one table fits once.
#ifndef SPGATE_POLICY_COST_PRIOR_H_
#define SPGATE_POLICY_COST_PRIOR_H_

#include <cstdint>
#include <span>

namespace spgate {

// What the job declared at Register: the model's shape on a rank. The prior takes none of
// it; it is the learned tables' key (a later launch gets them only when it declares the
// same, server/learned_store.h). 0 is "not declared" for every field.
struct PriorInputs {
  int tp = 0;
  int hidden = 0;
  int layers = 0;                // transformer layers the rank runs (a stage's, pipelined)
  friend bool operator==(const PriorInputs&, const PriorInputs&) = default;
};

// Whether a rank declared anything (its group size alone is not a declaration: every rank
// has one).
inline bool DeclaresPrior(const PriorInputs& in) { return in.hidden > 0 || in.layers > 0; }

// The SP steps' collective telemetry, as forgetting-weighted sums (the table's half-life):
// tokens T, all-gather seconds a, step seconds s, length CV c and wait share q.
struct PriorSums {
  double weight = 0;
  double tokens = 0, tokens_sq = 0;
  double all_gather = 0, tokens_all_gather = 0;
  double seconds = 0;
  double cv = 0, cv_sq = 0;
  double wait = 0, cv_wait = 0;
  int64_t last_step = -1;  // newest step folded in; -1: never
  friend bool operator==(const PriorSums&, const PriorSums&) = default;
};

// One band whose two modes are measured: the step seconds of each at the band's mean
// tokens, the band's CV and the samples behind it (the smaller mode's weight).
struct PriorBandSample {
  double tokens = 0;
  double sp_s = 0;
  double tp_s = 0;
  double cv = 0;
  double weight = 0;
};

// Where a term's constant came from (docs/design.md §11).
enum class PriorSource : uint8_t { kNone, kTelemetry };

// The model's constants, fitted once per table state (FitPrior) and used for any batch
// (PredictPrior).
struct PriorFit {
  bool has = false;               // the base rate, w and ε are known
  double base_s_per_token = 0;    // ρ₀
  double latency_s = 0;           // λ
  double wait_per_cv = 0;         // w: the wait share per unit of length CV
  double imbalance_share = 0;     // κ
  double elementwise_s_per_token = 0;  // ε
  double sp_steps = 0;            // the weight of the SP steps behind ρ₀ and w
  // The model's error as a share of a step: the root mean square of what the fit leaves
  // of the measured bands' differences, at least kPriorMinError (kPriorDefaultError while
  // there are no more bands than constants fitted). A predicted
  // difference within twice of it does not decide (the static gates do).
  double error = 0;
  PriorSource latency_source = PriorSource::kNone;
  PriorSource imbalance_source = PriorSource::kNone;
  PriorSource elementwise_source = PriorSource::kNone;
  // When !has: the first input missing, for the trace and spgatectl.
  const char* missing = "";
};

// The prediction for one batch.
struct PriorEstimate {
  PriorFit fit;
  bool has = false;          // fit.has and the batch has tokens: sp_s and tp_s are set
  double sp_s = 0;           // the batch's predicted step seconds in each mode
  double tp_s = 0;
  double latency_s = 0;      // λ
  double imbalance_s = 0;    // ρ₀·T·κ·w·c
  double elementwise_s = 0;  // ε·T
};

// The prior's error while there are no more measured bands than constants fitted: 2.5 % of
// a step; and its least (a fit that leaves nothing is still a model): 0.5 %.
inline constexpr double kPriorDefaultError = 0.025;
inline constexpr double kPriorMinError = 0.005;
// κ where the measured bands cannot fit it: half (a symmetric spread of the ranks).
inline constexpr double kImbalanceShare = 0.5;
// The spread the regressions need: a CV standard deviation of 0.02 for w (and, over the
// measured bands, for κ), a tokens standard deviation of 5 % of their mean for λ's
// intercept.
inline constexpr double kMinCvSpread = 0.02;
inline constexpr double kMinTokensSpread = 0.05;

// Folds one SP step into `sums`, each older sample's weight halved every `half_life`
// steps, but never below `floor` once the sums had it (as the table's cells). Non-finite
// or out-of-range values are ignored (returns false).
bool AddPriorSample(PriorSums& sums, int64_t half_life, double floor, int64_t step,
                    double tokens, double length_cv, double seconds, double all_gather_s,
                    double rs_wait_s);

// The model's constants: `min_samples` SP steps of weight are needed for the base rate
// and the regressions; `known` are the measured bands ε (and κ) are fitted on.
PriorFit FitPrior(const PriorSums& sums, std::span<const PriorBandSample> known,
                  double min_samples);
// Its prediction for a batch of `tokens` at `length_cv`.
PriorEstimate PredictPrior(const PriorFit& fit, double tokens, double length_cv);
// Both.
PriorEstimate EstimatePrior(const PriorSums& sums, std::span<const PriorBandSample> known,
                            double min_samples, double tokens, double length_cv);

const char* PriorSourceLabel(PriorSource source);

}  // namespace spgate

#endif  // SPGATE_POLICY_COST_PRIOR_H_
