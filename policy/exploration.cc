// ADAPTIVE's exploration schedule; see exploration.h and docs/design.md §11.
#include "policy/exploration.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/split_mix.h"
#include "policy/forgetting.h"

namespace spgate {

int64_t ExplorePeriod(double share) {
  if (!(share > 0)) return INT64_MAX;
  const double period = std::ceil(kProbeRunSteps / share - 1e-9);
  if (!(period < 9e18)) return INT64_MAX;  // no int64 overflow for a tiny share
  return std::max<int64_t>(kProbeRunSteps, static_cast<int64_t>(period));
}

namespace {
// ExploreOffset of a share whose period the caller has (MayExplore runs on every decision:
// one division fewer).
int64_t OffsetOf(const GateConfig& config, double share, int64_t period) {
  return share < config.adaptive_explore_share ? period : 0;
}
}  // namespace

int64_t ExploreOffset(const GateConfig& config, double share, int64_t changed) {
  if (changed >= 0 && changed < INT64_MAX) return changed + 1;
  return OffsetOf(config, share, ExplorePeriod(share));
}

int64_t ProbeRunStart(int64_t index, int64_t period) {
  const int64_t places = period - kProbeRunSteps + 1;  // where a whole run fits
  if (index <= 0 || places <= 1 || period == INT64_MAX) return 0;
  const uint64_t h = SplitMix64(static_cast<uint64_t>(index) ^
                                (static_cast<uint64_t>(period) * kSplitMixGamma));
  return static_cast<int64_t>(h % static_cast<uint64_t>(places));
}

namespace {
// `step`'s place in its period's probe run: in [0, kProbeRunSteps) inside it; -1 outside
// (before `offset` too).
int64_t PlaceInRun(int64_t step, int64_t period, int64_t offset) {
  if (step < 0 || step < offset || !(period > 0)) return -1;
  const int64_t since = step - offset;
  const int64_t at = since % period - ProbeRunStart(since / period, period);
  return at >= 0 && at < kProbeRunSteps ? at : -1;
}
}  // namespace

bool InProbeRun(int64_t step, int64_t period, int64_t offset) {
  return PlaceInRun(step, period, offset) >= 0;
}

bool StartsProbeRun(int64_t step, int64_t period, int64_t offset) {
  return PlaceInRun(step, period, offset) == 0;
}

double BandTrafficShare(const GateConfig& config, const ThroughputTable& table, int band,
                        int64_t step) {
  if (band < 0 || band >= kBands) return 0.0;
  double in_band = 0, all = 0;
  for (int b = 0; b < kBands; ++b) {
    for (const Mode m : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      const ThroughputCell& c = table.cell(b, m);
      if (c.last_step < 0 || !(c.weight > 0)) continue;
      const double age = step > c.last_step ? static_cast<double>(step - c.last_step) : 0.0;
      const double w = c.weight * HalfLifeDecay(age, config.adaptive_half_life_steps);
      all += w;
      if (b == band) in_band += w;
    }
  }
  if (!(all >= static_cast<double>(kBands) * SampleFloor(config))) return 1.0;
  return in_band / all;
}

double ExploreShareOf(const GateConfig& config, const ThroughputTable* table, int band,
                      int64_t step, const BandEstimate& estimate, bool leans) {
  const double share = config.adaptive_explore_share;
  const double floor = std::min(config.adaptive_explore_floor, share);
  if (table == nullptr) return share;
  if (!estimate.known) {
    return BandTrafficShare(config, *table, band, step) >= kLearnMinTraffic ? share : floor;
  }
  if (leans && BandTrafficShare(config, *table, band, step) >= kLearnMinTraffic) return share;
  return Relearning(config, *table, band, step, estimate) ? share : floor;
}

bool MayExplore(const GateConfig& config, int64_t step) {
  if (step < 0) return false;
  const double floor = std::min(config.adaptive_explore_floor, config.adaptive_explore_share);
  const int64_t floor_period = ExplorePeriod(floor);
  return InProbeRun(step, ExplorePeriod(config.adaptive_explore_share)) ||
         InProbeRun(step, floor_period, OffsetOf(config, floor, floor_period));
}

}  // namespace spgate
