// ADAPTIVE's physics prior; see cost_prior.h and docs/design.md §11.
#include "policy/cost_prior.h"

#include <algorithm>
#include <cmath>

namespace spgate {
namespace {

bool Finite(double x) { return std::isfinite(x); }

}  // namespace

bool AddPriorSample(PriorSums& sums, int64_t half_life, int64_t step, double tokens,
                    double length_cv, double seconds, double all_gather_s, double rs_wait_s) {
  if (step < 0 || !Finite(tokens) || !(tokens > 0) || !Finite(length_cv) || length_cv < 0 ||
      !Finite(seconds) || !(seconds > 0) || !Finite(all_gather_s) || all_gather_s < 0 ||
      !Finite(rs_wait_s) || rs_wait_s < 0) {
    return false;
  }
  // The wait beyond the reduce-scatters' own transfer, which moves what the all-gathers do.
  const double wait = std::clamp((rs_wait_s - all_gather_s) / seconds, 0.0, 1.0);
  const double h = static_cast<double>(std::max<int64_t>(half_life, 1));
  double keep = 1.0, add = 1.0;  // the sums' weight and the sample's
  if (sums.last_step >= 0 && step >= sums.last_step) {
    keep = std::exp2(-static_cast<double>(step - sums.last_step) / h);
    sums.last_step = step;
  } else if (sums.last_step >= 0) {  // a late sample enters already decayed
    add = std::exp2(-static_cast<double>(sums.last_step - step) / h);
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

PriorEstimate EstimatePrior(const PriorInputs& in, const PriorSums& s,
                            std::span<const PriorBandSample> known, double min_samples,
                            double tokens, double length_cv) {
  PriorEstimate e;
  if (!(s.weight >= std::max(min_samples, 1.0)) || !(s.tokens > 0) || !(s.seconds > 0)) {
    e.missing = "too few SP steps with collective telemetry for the prior's base rate";
    return e;
  }
  if (!(tokens > 0) || !Finite(tokens) || !Finite(length_cv) || length_cv < 0) {
    e.missing = "the batch has no tokens";
    return e;
  }
  const double W = s.weight;
  const double mean_tokens = s.tokens / W, mean_ag = s.all_gather / W;
  const double mean_cv = s.cv / W, mean_wait = s.wait / W;

  // w: the wait share's slope against the length CV.
  const double var_cv = s.cv_sq / W - mean_cv * mean_cv;
  if (!(var_cv >= kMinCvSpread * kMinCvSpread)) {
    e.missing = "the SP steps' length CV has too little spread to measure the imbalance";
    return e;
  }
  const double w = std::max(0.0, (s.cv_wait / W - mean_cv * mean_wait) / var_cv);
  e.imbalance_source = PriorSource::kTelemetry;

  // λ: the all-gathers' intercept, their mean less the declared bandwidth term, or the
  // declared latency; none: 0 (a bias towards SP of that size).
  const double var_tokens = s.tokens_sq / W - mean_tokens * mean_tokens;
  const double calls = 4.0 * in.layers;
  if (var_tokens >= std::pow(kMinTokensSpread * mean_tokens, 2)) {
    const double slope = (s.tokens_all_gather / W - mean_tokens * mean_ag) / var_tokens;
    e.latency_s = std::clamp(mean_ag - slope * mean_tokens, 0.0, mean_ag);
    e.latency_source = PriorSource::kTelemetry;
  } else if (in.link_gbps > 0 && in.hidden > 0 && in.layers > 0 && in.tp > 1) {
    const double t = in.tp;
    const double transfer =
        calls * (t - 1) / t * mean_tokens * in.hidden * 2.0 / (in.link_gbps * 1e9);
    e.latency_s = std::clamp(mean_ag - transfer, 0.0, mean_ag);
    e.latency_source = PriorSource::kTelemetry;
  } else if (in.link_latency_us > 0 && in.layers > 0) {
    e.latency_s = calls * in.link_latency_us * 1e-6;
    e.latency_source = PriorSource::kDeclared;
  }

  // ε and κ: the measured bands' differences, TP-only's step less SP's plus λ, are
  // ε·T − κ·(ρ·T·w·c) (ρ: the band's SP seconds per token, so the imbalance is the band's
  // own); a weighted least-squares fit of both where the bands' CVs tell them apart, of ε
  // alone at κ = kImbalanceShare where not. Before any band is measured the prior does not
  // answer (docs/benchmarks.md, "The physics prior": a declared element-wise term there
  // cost more than it bought).
  double eps = 0, kappa = kImbalanceShare;
  bool measured = false;
  double sq_error = 0, error_weight = 0;
  int bands = 0;
  for (int pass = 0; pass < 3; ++pass) {  // x depends on κ a little: refit with the last
    double stt = 0, stx = 0, sxx = 0, sty = 0, sxy = 0;
    for (const PriorBandSample& b : known) {
      if (!(b.weight > 0) || !(b.tokens > 0) || !(b.sp_s > 0) || !(b.tp_s > 0)) continue;
      const double x = b.sp_s * w * b.cv / (1.0 + kappa * w * b.cv);  // ρ₀·T·w·c
      const double y = b.tp_s - b.sp_s + e.latency_s;
      stt += b.weight * b.tokens * b.tokens;
      stx += b.weight * b.tokens * x;
      sxx += b.weight * x * x;
      sty += b.weight * b.tokens * y;
      sxy += b.weight * x * y;
    }
    if (!(stt > 0)) break;
    measured = true;
    const double det = stt * sxx - stx * stx;
    if (det > 1e-6 * stt * sxx) kappa = std::clamp((stx * sty - stt * sxy) / det, 0.0, 1.0);
    eps = (sty + kappa * stx) / stt;
  }
  // The fit's error: the weighted RMS of what it leaves of the bands' differences, as a
  // share of their SP step (one band or two cannot show it: kPriorDefaultError).
  for (const PriorBandSample& b : known) {
    if (!measured || !(b.weight > 0) || !(b.tokens > 0) || !(b.sp_s > 0) || !(b.tp_s > 0)) continue;
    const double x = b.sp_s * w * b.cv / (1.0 + kappa * w * b.cv);
    const double r = (b.tp_s - b.sp_s + e.latency_s - (eps * b.tokens - kappa * x)) / b.sp_s;
    sq_error += b.weight * r * r;
    error_weight += b.weight;
    ++bands;
  }
  e.error = bands >= 3 ? std::sqrt(sq_error / error_weight) : kPriorDefaultError;
  if (measured) {
    e.elementwise_source = PriorSource::kTelemetry;
  } else {
    e.missing = "no band with both modes measured yet (the element-wise term is fitted there)";
    return e;
  }
  e.imbalance_share = kappa;
  e.wait_per_cv = w;
  e.sp_steps = W;
  // ρ₀: SP's seconds per token with the imbalance at the steps' mean CV taken out.
  const double rho0 = s.seconds / s.tokens / (1.0 + kappa * w * mean_cv);
  eps = std::clamp(eps, -rho0, rho0);  // a fit gone far off stays within a step
  e.base_s_per_token = rho0;

  e.imbalance_s = rho0 * tokens * kappa * w * length_cv;
  e.elementwise_s = eps * tokens;
  e.sp_s = rho0 * tokens + e.imbalance_s;
  // A TP-only step never predicted below a tenth of SP's (a fit gone far off).
  e.tp_s = std::max(rho0 * tokens - e.latency_s + e.elementwise_s, 0.1 * e.sp_s);
  e.has = true;
  return e;
}

const char* PriorSourceLabel(PriorSource source) {
  switch (source) {
    case PriorSource::kTelemetry: return "telemetry";
    case PriorSource::kDeclared: return "declared";
    case PriorSource::kNone: break;
  }
  return "none";
}

}  // namespace spgate
