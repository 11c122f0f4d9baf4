// Regret per window; see regret.h and docs/sim.md.
#include "tools/sim/regret.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "tools/sim/summary.h"

namespace spgate::sim {

absl::StatusOr<WindowedRegret> WindowedRegretOf(std::span<const double> policy_s,
                                                std::span<const double> oracle_s,
                                                std::span<const double> best_fixed_s,
                                                int64_t window) {
  if (window < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--regret_window must be >= 1 step, got %d", window));
  }
  const size_t n = policy_s.size();
  if (n == 0 || oracle_s.size() != n || best_fixed_s.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WindowedRegretOf: want one step time per step for each run, got %d, %d and %d",
        policy_s.size(), oracle_s.size(), best_fixed_s.size()));
  }
  WindowedRegret out;
  out.window = std::min<int64_t>(window, static_cast<int64_t>(n));
  const size_t w = static_cast<size_t>(out.window);
  out.windows = static_cast<int64_t>(n - w + 1);
  // Prefix sums in long double: a window's sum is a difference of two of them, exact for
  // integer seconds and otherwise good to ~1e-15 of the run's total time.
  std::vector<long double> pp(n + 1, 0), po(n + 1, 0), pf(n + 1, 0);
  for (size_t k = 0; k < n; ++k) {
    pp[k + 1] = pp[k] + policy_s[k];
    po[k + 1] = po[k] + oracle_s[k];
    pf[k + 1] = pf[k] + best_fixed_s[k];
  }
  std::vector<double> regret;
  regret.reserve(static_cast<size_t>(out.windows));
  for (size_t s = 0; s + w <= n; ++s) {
    const long double p = pp[s + w] - pp[s], o = po[s + w] - po[s], f = pf[s + w] - pf[s];
    if (!(p > 0) || !(o > 0) || !(f > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("WindowedRegretOf: the window at step %d has no positive time", s));
    }
    const double r = static_cast<double>(1 - o / p);
    const double vs_fixed = static_cast<double>(f / p);  // tokens/s ratio: inverse times
    // Strictly greater: the earliest of equal windows stays the worst.
    if (regret.empty() || r > out.worst) {
      out.worst = r;
      out.worst_start = static_cast<int64_t>(s);
      out.worst_vs_best_fixed = vs_fixed;
    }
    out.min_vs_best_fixed = regret.empty() ? vs_fixed : std::min(out.min_vs_best_fixed, vs_fixed);
    regret.push_back(r);
  }
  out.median = Percentile(regret, 0.5);
  out.p95 = Percentile(std::move(regret), 0.95);
  return out;
}

}  // namespace spgate::sim
