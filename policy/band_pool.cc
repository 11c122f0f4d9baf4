// The bands' pooled evidence; see band_pool.h and docs/design.md §11.
#include "policy/band_pool.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace spgate {

namespace {

// A known band's log gap, log(SP's rate / TP-only's), and its variance (each cell's
// relative variance, at least `variance_floor`, over its weight: the delta method).
struct LogGap {
  double r = 0;
  double variance = 0;
};
LogGap LogGapOf(const BandEstimate& e, double variance_floor) {
  return {std::log(e.sp.tokens_per_s / e.tp.tokens_per_s),
          std::max(e.sp.relative_variance, variance_floor) / e.sp.samples +
              std::max(e.tp.relative_variance, variance_floor) / e.tp.samples};
}

}  // namespace

BandPool PoolBands(const GateConfig& config, const ThroughputTable& table, int64_t step,
                   double variance_floor, const TableFacts* facts) {
  std::array<LogGap, kBands> g;
  int k = 0;
  const TableFacts f = facts != nullptr ? *facts : TableFactsOf(config, table, step);
  for (int b = 0; b < kBands; ++b) {
    // A band with a mode never sampled is not known (EstimateBand): skipped unread.
    if (table.cell(b, Mode::kSequenceParallel).last_step < 0 ||
        table.cell(b, Mode::kTensorParallelOnly).last_step < 0) {
      continue;
    }
    const BandEstimate e = EstimateBand(config, &table, b, step, &f);
    if (!e.known || !(e.tp.tokens_per_s > 0)) continue;
    if (Relearning(config, table, b, step, e)) continue;  // no evidence (EvaluateAdaptive)
    const LogGap x = LogGapOf(e, variance_floor);
    if (std::isfinite(x.r) && x.variance > 0 && std::isfinite(x.variance)) g[k++] = x;
  }
  BandPool pool;
  pool.bands = k;
  if (k < kMinPooledBands) return pool;
  // Fixed-effect mean, Cochran's Q, the between-band variance tau² by moments.
  double sw = 0, sw2 = 0, swr = 0;
  for (int i = 0; i < k; ++i) {
    const double w = 1.0 / g[i].variance;
    sw += w;
    sw2 += w * w;
    swr += w * g[i].r;
  }
  const double fixed = swr / sw;
  double q = 0;
  for (int i = 0; i < k; ++i) q += (g[i].r - fixed) * (g[i].r - fixed) / g[i].variance;
  const double c = sw - sw2 / sw;
  pool.between = c > 0 ? std::max(0.0, (q - (k - 1)) / c) : 0.0;
  double sw_re = 0, swr_re = 0;
  for (int i = 0; i < k; ++i) {
    const double w = 1.0 / (g[i].variance + pool.between);
    sw_re += w;
    swr_re += w * g[i].r;
  }
  pool.mean = swr_re / sw_re;
  pool.mean_variance = 1.0 / sw_re;
  return pool;
}

Evidence PooledDepartureEvidence(const GateConfig& config, const BandEstimate& here,
                                 const BandPool& pool, int64_t tokens, Mode from, Mode to,
                                 double variance_floor) {
  if (from == to || !here.known || !(here.tp.tokens_per_s > 0) || pool.bands < kMinPooledBands) {
    return {};
  }
  const LogGap own = LogGapOf(here, variance_floor);
  // The band's gap shrunk towards the pool's mean by its share of the noise (B); a band
  // measured without noise keeps its own.
  const double noise = own.variance + pool.between;
  const double shrink = noise > 0 ? own.variance / noise : 0.0;
  const double r = (1 - shrink) * own.r + shrink * pool.mean;
  const double sd =
      std::sqrt((1 - shrink) * own.variance + shrink * shrink * pool.mean_variance);
  const double sp_s = static_cast<double>(tokens) / here.sp.tokens_per_s;
  if (to == Mode::kSequenceParallel) {
    return {sp_s * (std::exp(r) - 1), sp_s * (std::exp(r - kEvidenceZ * sd) - 1)};
  }
  const double m = 1.0 + config.adaptive_margin;
  return {sp_s * (1 - std::exp(r) * m), sp_s * (1 - std::exp(r + kEvidenceZ * sd) * m)};
}

}  // namespace spgate
