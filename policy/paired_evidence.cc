// A band's paired evidence; see paired_evidence.h and docs/design.md §11.
#include "policy/paired_evidence.h"

#include <algorithm>
#include <cmath>

#include "policy/forgetting.h"

namespace spgate {

bool AddPair(const GateConfig& config, PairedCell& pair, int64_t step, double sp_seconds,
             double tp_seconds) {
  if (step < 0 || !std::isfinite(sp_seconds) || !std::isfinite(tp_seconds) ||
      !(sp_seconds > 0) || !(tp_seconds > 0)) {
    return false;
  }
  const int64_t h = config.adaptive_half_life_steps;
  if (pair.last_step < 0) {
    pair = PairedCell{sp_seconds, tp_seconds, 1.0, step};
  } else if (step >= pair.last_step) {
    const double w = FlooredWeight(
        pair.weight, HalfLifeDecay(static_cast<double>(step - pair.last_step), h),
        SampleFloor(config));
    const double k = pair.weight > 0 ? w / pair.weight : 0.0;
    pair = PairedCell{pair.sp_seconds * k + sp_seconds, pair.tp_seconds * k + tp_seconds,
                      w + 1.0, step};
  } else {
    const double f = HalfLifeDecay(static_cast<double>(pair.last_step - step), h);
    pair.sp_seconds += sp_seconds * f;
    pair.tp_seconds += tp_seconds * f;
    pair.weight += f;
  }
  return true;
}

PairedView PairAt(const GateConfig& config, const PairedCell& pair, int64_t step) {
  if (pair.last_step < 0 || !(pair.sp_seconds > 0) || !(pair.tp_seconds > 0)) return {};
  const double age = step > pair.last_step ? static_cast<double>(step - pair.last_step) : 0.0;
  return PairedView{
      pair.sp_seconds / pair.tp_seconds,
      FlooredWeight(pair.weight, HalfLifeDecay(age, config.adaptive_half_life_steps),
                    SampleFloor(config)),
      pair.last_step};
}

}  // namespace spgate
