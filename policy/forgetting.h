// Forgetting with a floor, shared by ADAPTIVE's learned cells, its switch cost and its
// prior's sums (docs/design.md §11): a sample's weight halves every half-life, but a sum
// that once had the sample floor's weight never decays below it.
#ifndef SPGATE_POLICY_FORGETTING_H_
#define SPGATE_POLICY_FORGETTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "policy/gate_config.h"

namespace spgate {

// The sample floor: adaptive_min_samples as a weight, the floor FlooredWeight keeps a
// learned cell at once it had it.
inline double SampleFloor(const GateConfig& config) {
  return static_cast<double>(config.adaptive_min_samples);
}

// Weight left after `steps` steps at the given half-life (at least 1 step).
inline double HalfLifeDecay(double steps, int64_t half_life_steps) {
  return std::exp2(-steps / static_cast<double>(std::max<int64_t>(half_life_steps, 1)));
}

// The weight a sum of weight `w` keeps over a decay of `f`: w·f, but never below `floor`
// once it had it (exactly the floor: a band held at it stays known).
inline double FlooredWeight(double w, double f, double floor) {
  const double d = w * f;
  return w >= floor && d < floor ? floor : d;
}

}  // namespace spgate

#endif  // SPGATE_POLICY_FORGETTING_H_
