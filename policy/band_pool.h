// The ADAPTIVE policy's pooled evidence (docs/design.md §11, rule 3): where one band's
// samples cannot yet tell the modes apart, the other measured bands' gaps, as far as they
// agree with each other, can. Each known band's log(SP's rate / TP-only's) and its
// variance are pooled by the random-effects model of DerSimonian and Laird (1986): the
// between-band variance tau² by moments from Cochran's Q, the mean weighted by
// 1 / (variance + tau²); the band's own gap is then shrunk towards that mean by its share
// of the noise (the empirical-Bayes estimate). Pure, like the rest of policy/.
//
// Known limits (docs/design.md §11): tau² is estimated from few bands (3 or more) and its
// own uncertainty is not added to the shrunk gap's variance, and bands whose gaps follow
// a smooth trend across CV or tokens are pulled towards the trend's middle.
//
// Usage (what EvaluateAdaptive does where the band's own interval spans 0):
//   const BandPool pool = PoolBands(config, table, step, noise.relative_variance);
//   const Evidence ev = PooledDepartureEvidence(config, here, pool, tokens, from, to, floor);
#ifndef SPGATE_POLICY_BAND_POOL_H_
#define SPGATE_POLICY_BAND_POOL_H_

#include <cstdint>

#include "policy/adaptive_policy.h"

namespace spgate {

// The known bands' gaps pooled (random effects, DerSimonian and Laird 1986): each band's
// log(SP's rate / TP-only's) with its variance, the between-band variance by moments, and
// the precision-weighted mean. Bands re-learning after a change are left out. Fewer than
// kMinPooledBands: none (bands == the count).
inline constexpr int kMinPooledBands = 3;
struct BandPool {
  int bands = 0;
  double mean = 0;           // the pooled log gap
  double mean_variance = 0;  // its variance
  double between = 0;        // tau²: how far the bands' true gaps spread
};
// `facts`: the table's TableFactsOf at `step`, as EstimateBand takes them.
BandPool PoolBands(const GateConfig& config, const ThroughputTable& table, int64_t step,
                   double variance_floor, const TableFacts* facts = nullptr);
// DepartureEvidence with the band's gap shrunk towards the pool's mean by its share of the
// noise (the empirical-Bayes estimate): what the band's own samples cannot yet tell apart,
// the other bands can, as far as they agree with each other.
Evidence PooledDepartureEvidence(const GateConfig& config, const BandEstimate& here,
                                 const BandPool& pool, int64_t tokens, Mode from, Mode to,
                                 double variance_floor);

}  // namespace spgate

#endif  // SPGATE_POLICY_BAND_POOL_H_
