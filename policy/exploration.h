// ADAPTIVE's exploration schedule (docs/design.md §11, rule 5): which steps a group may
// run the mode not chosen to measure it, and at what share — the full share while a band
// learns (if it carries enough of the traffic), leans undecided to the mode not chosen, or
// re-learns after a change in it, the floor otherwise. Pure, like the rest of policy/;
// EvaluateAdaptive (adaptive_policy.h) decides what a probe runs.
//
// Usage:
//   // cheap: most steps are in no probe run; a band re-learning may run one at once
//   if (spgate::MayExplore(config, step) || relearning) {
//     const double share = spgate::ExploreShareOf(config, &table, band, step, estimate, leans);
//     if (spgate::InProbeRun(step, spgate::ExplorePeriod(share),
//                            spgate::ExploreOffset(config, share, changed_or_minus_1))) {
//       ... the band's mode not chosen ...
//     }
//   }
#ifndef SPGATE_POLICY_EXPLORATION_H_
#define SPGATE_POLICY_EXPLORATION_H_

#include <cstdint>

#include "policy/adaptive_policy.h"
#include "policy/gate_config.h"

namespace spgate {

// The share of the table's recent samples (each cell's weight decayed to `step`, not
// floored) that fall in `band`; 1 while the table holds fewer than kBands ×
// adaptive_min_samples in all (a new job: every band is new; and a job whose half-life
// holds fewer samples than that, e.g. one group at a half-life under ~180 steps, where
// every band then counts as common). A pass over the table.
double BandTrafficShare(const GateConfig& config, const ThroughputTable& table, int band,
                        int64_t step);
// A band learns at adaptive_explore_share only while it carries at least this share of the
// table's recent samples (BandTrafficShare), an even split over the bands: a band needs as
// many samples whatever its traffic, so learning a rare one costs as many probe steps as a
// common one and pays in proportion to its batches; rarer bands are measured at
// adaptive_explore_floor and decided by the gates and the prior until known
// (docs/design.md §11).
inline constexpr double kLearnMinTraffic = 1.0 / kBands;
// The exploration share of `band` at `step` (policy/adaptive_policy.h, step 5):
// adaptive_explore_share while the band (`estimate`, its EstimateBand) carries
// kLearnMinTraffic of the traffic and is not `known`, or `leans` (known, undecided, its
// estimates favouring the mode not chosen by more than adaptive_margin, and switching
// free: step 3 says so),
// or while it re-learns after a change in it (Relearning: within
// adaptive_explore_boost_steps of it, until, switching free, the pairs measured since end
// it); else
// adaptive_explore_floor (at most adaptive_explore_share). `table` null:
// adaptive_explore_share.
double ExploreShareOf(const GateConfig& config, const ThroughputTable* table, int band,
                      int64_t step, const BandEstimate& estimate, bool leans = false);
// The exploration period of a share: a group explores on kProbeRunSteps consecutive steps
// of every period (InProbeRun; at least kProbeRunSteps: a share of 1 explores every step).
int64_t ExplorePeriod(double share);
// The step a share's first probe run starts at: 0 for adaptive_explore_share, one period
// for a share below it (the floor; INT64_MAX, never, where that period is). The floor's
// runs re-measure known bands; a new job has none (every band learns in the share's first
// run, from step 0), so its first run comes a period in rather than repeating at once what
// the share's run has just measured. A relaunch whose step counter restarts at 0 with its
// previous launch's table waits that period too (docs/operations.md).
// A band re-learning after a change detected at step `changed` (Relearning; -1: none) runs
// its first probe run at once, from changed + 1, whatever the share: until the pairs
// measured since end the re-learning, its estimates are no evidence and it runs the
// gates' choice, so every step its run waits costs what a departure would have saved.
int64_t ExploreOffset(const GateConfig& config, double share, int64_t changed = -1);
// Where the probe run of a schedule's period number `index` (0: the one starting at its
// offset) starts, in steps into that period: 0 for the first period (a new job's bands
// learn at once), else a pseudo-random place where the whole run fits, a pure function of
// index and period (the daemon and every fallback agree). Fixed places would alias with
// anything periodic in the job (a neighbour's bursts, evaluation or checkpoint steps every
// N): a period that divides into it puts every run at the same phase of it, and a mode
// measured only there is measured wrong (docs/design.md §11).
int64_t ProbeRunStart(int64_t index, int64_t period);
// Whether `step` is in a period's probe run (kProbeRunSteps steps from ProbeRunStart),
// periods starting at `offset` (no run before it).
bool InProbeRun(int64_t step, int64_t period, int64_t offset = 0);
// Whether `step` starts a probe run of that schedule.
bool StartsProbeRun(int64_t step, int64_t period, int64_t offset = 0);
// Whether a band not re-learning could explore at `step` (in a run of either schedule).
bool MayExplore(const GateConfig& config, int64_t step);

}  // namespace spgate

#endif  // SPGATE_POLICY_EXPLORATION_H_
