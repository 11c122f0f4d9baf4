// ADAPTIVE's physics prior; see cost_prior.h and docs/design.md §11.
#include "policy/cost_prior.h"

#include <algorithm>
#include <cmath>

#include "policy/forgetting.h"

namespace spgate {
namespace {

bool Finite(double x) { return std::isfinite(x); }

}  // namespace

bool AddPriorSample(PriorSums& sums, int64_t half_life, double floor, int64_t step,
                    double tokens, double length_cv, double seconds, double all_gather_s,
                    double rs_wait_s) {
  if (step < 0 || !Finite(tokens) || !(tokens > 0) || !Finite(length_cv) || length_cv < 0 ||
      !Finite(seconds) || !(seconds > 0) || !Finite(all_gather_s) || all_gather_s < 0 ||
      !Finite(rs_wait_s) || rs_wait_s < 0) {
    return false;
  }
  // The wait beyond the reduce-scatters' own transfer, which moves what the all-gathers do.
  const double wait = std::clamp((rs_wait_s - all_gather_s) / seconds, 0.0, 1.0);
  double keep = 1.0, add = 1.0;  // the sums' weight and the sample's
  if (sums.last_step >= 0 && step >= sums.last_step) {
    // Sums that had `floor` of weight keep it (an estimate never rests on one or two fresh
    // steps after a long gap).
    const double decay = HalfLifeDecay(static_cast<double>(step - sums.last_step), half_life);
    if (sums.weight > 0) keep = FlooredWeight(sums.weight, decay, floor) / sums.weight;
    sums.last_step = step;
  } else if (sums.last_step >= 0) {  // a late sample enters already decayed
    add = HalfLifeDecay(static_cast<double>(sums.last_step - step), half_life);
  } else {
    sums.last_step = step;
  }
  auto fold = [&](double& sum, double x) { sum = sum * keep + add * x; };
  fold(sums.weight, 1.0);
  fold(sums.tokens, tokens);
  fold(sums.tokens_sq, tokens * tokens);
  fold(sums.all_gather, all_gather_s);
  fold(sums.tokens_all_gather, tokens * all_gather_s);
  fold(sums.seconds, seconds);
  fold(sums.cv, length_cv);
  fold(sums.cv_sq, length_cv * length_cv);
  fold(sums.wait, wait);
  fold(sums.cv_wait, length_cv * wait);
  return true;
}

PriorFit FitPrior(const PriorSums& s,
                  std::span<const PriorBandSample> known, double min_samples) {
  PriorFit f;
  if (!(s.weight >= std::max(min_samples, 1.0)) || !(s.tokens > 0) || !(s.seconds > 0)) {
    f.missing = "too few SP steps with collective telemetry for the prior's base rate";
    return f;
  }
  const double W = s.weight;
  const double mean_tokens = s.tokens / W, mean_ag = s.all_gather / W;
  const double mean_cv = s.cv / W, mean_wait = s.wait / W;

  // w: the wait share's slope against the length CV.
  const double var_cv = s.cv_sq / W - mean_cv * mean_cv;
  if (!(var_cv >= kMinCvSpread * kMinCvSpread)) {
    f.missing = "the SP steps' length CV has too little spread to measure the imbalance";
    return f;
  }
  const double w = std::max(0.0, (s.cv_wait / W - mean_cv * mean_wait) / var_cv);
  f.imbalance_source = PriorSource::kTelemetry;

  // λ: the all-gathers' intercept, never more than they take; without the spread in
  // tokens to measure it, 0 (a bias towards SP of that size, which ε absorbs at the
  // measured bands' sizes).
  const double var_tokens = s.tokens_sq / W - mean_tokens * mean_tokens;
  if (var_tokens >= std::pow(kMinTokensSpread * mean_tokens, 2)) {
    const double slope = (s.tokens_all_gather / W - mean_tokens * mean_ag) / var_tokens;
    f.latency_s = std::clamp(mean_ag - slope * mean_tokens, 0.0, mean_ag);
    f.latency_source = PriorSource::kTelemetry;
  }

  // ε and κ: the measured bands' differences, TP-only's step less SP's plus λ, are
  // ε·T − κ·(ρ₀·T·w·c); a weighted least-squares fit of both where at least three bands
  // with CVs kMinCvSpread apart tell them apart, of ε alone at κ = kImbalanceShare where
  // not. Before any band is measured the prior does not answer (docs/benchmarks.md, "The
  // physics prior": a declared element-wise term there cost more than it bought).
  double band_w = 0, band_cv = 0, band_cv_sq = 0;
  int bands = 0;
  for (const PriorBandSample& b : known) {
    if (!(b.weight > 0) || !(b.tokens > 0) || !(b.sp_s > 0) || !(b.tp_s > 0)) continue;
    band_w += b.weight;
    band_cv += b.weight * b.cv;
    band_cv_sq += b.weight * b.cv * b.cv;
    ++bands;
  }
  if (bands == 0) {
    f.missing = "no band with both modes measured yet (the element-wise term is fitted there)";
    return f;
  }
  const double band_var_cv = band_cv_sq / band_w - (band_cv / band_w) * (band_cv / band_w);
  const bool fit_kappa = bands >= 3 && band_var_cv >= kMinCvSpread * kMinCvSpread && w > 0;
  double eps = 0, kappa = kImbalanceShare;
  // x (the band's ρ₀·T·w·c, from its measured SP step) depends on κ a little: refit.
  const auto x_of = [&](const PriorBandSample& b) {
    return b.sp_s * w * b.cv / (1.0 + kappa * w * b.cv);
  };
  for (int pass = 0; pass < (fit_kappa ? 3 : 1); ++pass) {
    double stt = 0, stx = 0, sxx = 0, sty = 0, sxy = 0;
    for (const PriorBandSample& b : known) {
      if (!(b.weight > 0) || !(b.tokens > 0) || !(b.sp_s > 0) || !(b.tp_s > 0)) continue;
      const double x = x_of(b);
      const double y = b.tp_s - b.sp_s + f.latency_s;
      stt += b.weight * b.tokens * b.tokens;
      stx += b.weight * b.tokens * x;
      sxx += b.weight * x * x;
      sty += b.weight * b.tokens * y;
      sxy += b.weight * x * y;
    }
    const double det = stt * sxx - stx * stx;
    if (fit_kappa && det > 1e-2 * stt * sxx) {
      kappa = std::clamp((stx * sty - stt * sxy) / det, 0.0, 1.0);
    }
    eps = (sty + kappa * stx) / stt;
  }
  // ρ₀: SP's seconds per token with the imbalance at the steps' mean CV taken out; a fit
  // gone far off stays within a step.
  const double rho0 = s.seconds / s.tokens / (1.0 + kappa * w * mean_cv);
  eps = std::clamp(eps, -rho0, rho0);
  // The fit's error: the weighted root mean square of what it leaves of the bands'
  // differences, as a share of their SP step, never below kPriorMinError; while no band is
  // left over the constants fitted, kPriorDefaultError. Not scaled up for the constants
  // fitted: with that correction the prior deferred to the gates where they are worst
  // (docs/benchmarks.md, "The physics prior").
  const int params = fit_kappa ? 2 : 1;
  if (bands > params) {
    double sq = 0;
    for (const PriorBandSample& b : known) {
      if (!(b.weight > 0) || !(b.tokens > 0) || !(b.sp_s > 0) || !(b.tp_s > 0)) continue;
      const double r = (b.tp_s - b.sp_s + f.latency_s - (eps * b.tokens - kappa * x_of(b))) / b.sp_s;
      sq += b.weight * r * r;
    }
    f.error = std::max(kPriorMinError, std::sqrt(sq / band_w));
  } else {
    f.error = kPriorDefaultError;
  }
  f.elementwise_source = PriorSource::kTelemetry;
  f.base_s_per_token = rho0;
  f.wait_per_cv = w;
  f.imbalance_share = kappa;
  f.elementwise_s_per_token = eps;
  f.sp_steps = W;
  f.has = true;
  return f;
}

PriorEstimate PredictPrior(const PriorFit& f, double tokens, double length_cv) {
  PriorEstimate e;
  e.fit = f;
  if (!f.has) return e;
  if (!(tokens > 0) || !Finite(tokens) || !Finite(length_cv) || length_cv < 0) {
    e.fit.missing = "the batch has no tokens";
    return e;
  }
  const double rho0 = f.base_s_per_token;
  e.latency_s = f.latency_s;
  e.imbalance_s = rho0 * tokens * f.imbalance_share * f.wait_per_cv * length_cv;
  e.elementwise_s = f.elementwise_s_per_token * tokens;
  e.sp_s = rho0 * tokens + e.imbalance_s;
  // A TP-only step never predicted below a tenth of SP's (a fit gone far off).
  e.tp_s = std::max(rho0 * tokens - e.latency_s + e.elementwise_s, 0.1 * e.sp_s);
  e.has = true;
  return e;
}

PriorEstimate EstimatePrior(const PriorSums& sums, std::span<const PriorBandSample> known,
                            double min_samples, double tokens, double length_cv) {
  return PredictPrior(FitPrior(sums, known, min_samples), tokens, length_cv);
}

const char* PriorSourceLabel(PriorSource source) {
  switch (source) {
    case PriorSource::kTelemetry: return "telemetry";
    case PriorSource::kNone: break;
  }
  return "none";
}

}  // namespace spgate
