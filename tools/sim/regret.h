// Regret per window for `spgate-sim replay --compare` (docs/sim.md, "Regret per window"):
// how far a policy runs below the per-batch oracle over every window of N consecutive
// steps, and how it compares with the best fixed choice in the same window. A whole-run
// mean hides a bad stretch; a window of N steps does not.
//
// The invariant that matters: every policy of a comparison runs the same batches, so over
// any window every policy processes the same tokens and a ratio of tokens/s is the inverse
// ratio of the summed step times. Regret of window W is
//   regret(W) = 1 − tokens/s(policy, W) / tokens/s(oracle, W) = 1 − T_oracle(W) / T_policy(W)
// with T(W) = Σ over the window's steps and all groups of the step seconds: 0.01 is 1 %
// below the oracle. Windows slide by one step ([s, s + N) for every s in [0, steps − N]);
// a run of at most N steps is one window over the whole run.
//
// Usage:
//   absl::StatusOr<WindowedRegret> r =
//       WindowedRegretOf(adaptive_s, oracle_s, best_fixed_s, /*window=*/1000);
//   r->median, r->p95, r->worst, r->worst_vs_best_fixed, r->min_vs_best_fixed
#ifndef SPGATE_TOOLS_SIM_REGRET_H_
#define SPGATE_TOOLS_SIM_REGRET_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"

namespace spgate::sim {

// --regret_window's default, in steps.
inline constexpr int64_t kDefaultRegretWindow = 1000;

struct WindowedRegret {
  int64_t window = 0;   // steps per window (the run's length when it is shorter)
  int64_t windows = 0;  // how many: steps − window + 1
  // Over the windows, nearest rank (like every percentile of spgate-sim).
  double median = 0, p95 = 0, worst = 0;
  int64_t worst_start = 0;  // first step of the worst window (the earliest of equals)
  // The policy's tokens/s over the best fixed choice's: in the worst window, and the
  // smallest over all windows (where the policy runs furthest below that choice).
  double worst_vs_best_fixed = 0;
  double min_vs_best_fixed = 0;
};

// `policy_s`, `oracle_s` and `best_fixed_s` hold, per step, the step seconds summed over
// the groups of one run of the same batches. INVALID_ARGUMENT when they differ in length,
// are empty, a window sum is not positive, or window < 1 (naming --regret_window).
absl::StatusOr<WindowedRegret> WindowedRegretOf(std::span<const double> policy_s,
                                                std::span<const double> oracle_s,
                                                std::span<const double> best_fixed_s,
                                                int64_t window);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_REGRET_H_
