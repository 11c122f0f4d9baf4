// Paired evidence of one band (docs/design.md §11, "Paired evidence"): what ADAPTIVE's
// two cells cannot say when they were measured at different times.
//
// A band's two cells are sampled mostly apart: the mode a group runs fills its cell step
// after step, the other mode's only in probe runs. Where step times move for both modes at
// once (a burst of stragglers, a slower node), the running mode's cell absorbs the move and
// the other's, measured before it, does not: their ratio then reads a difference between
// times as a difference between modes. So every step whose band's other mode was measured
// within kPairGapSteps — a probe's, and the steps around any switch (a departure, a return
// to the gates' choice, the end of a probe run) — is measured beside that mode's level at
// that moment (its estimate moved by its cell's fast mean of the recent seconds), and the
// pair's two seconds are of the same time and the same tokens. A band's
// pairs are kept as forgetting-weighted sums of both seconds, the same half-life and floor
// as the cells (forgetting.h); TP-only's rate over SP's is the ratio of the sums (a mean
// of the pairs' log ratios was pulled by the straggler tails). A change detected in the
// band voids its pairs: they measured the gap before it. How EstimateBand reads a band
// through its pairs: adaptive_policy.h, BandEstimate.
#ifndef SPGATE_POLICY_PAIRED_EVIDENCE_H_
#define SPGATE_POLICY_PAIRED_EVIDENCE_H_

#include <cstdint>

#include "policy/gate_config.h"

namespace spgate {

// How near the other mode's newest sample must be for a step to pair with its level,
// and how far apart the band's two cells' newest samples must be for the older one to be
// stale (EstimateBand): a probe run and a step either side.
inline constexpr int64_t kPairGapSteps = 6;

struct PairedCell {
  double sp_seconds = 0;  // forgetting-weighted sum of the pairs' SP seconds
  double tp_seconds = 0;  // and of their TP-only seconds, for the same tokens
  double weight = 0;      // effective number of pairs at last_step
  int64_t last_step = -1;  // newest pair's step; -1: none
  friend bool operator==(const PairedCell&, const PairedCell&) = default;
};

// Folds in one pair of `step`: the seconds the batch took (or would have) in each mode.
// Non-finite or non-positive seconds and negative steps are ignored; returns whether it
// was folded in. A late pair enters already decayed, as a late cell sample does.
bool AddPair(const GateConfig& config, PairedCell& pair, int64_t step, double sp_seconds,
             double tp_seconds);

// What a band's pairs say at `step`: TP-only's rate over SP's (0 without pairs) and the
// pairs' weight decayed to `step` (never below the floor once they had it).
struct PairedView {
  double ratio = 0;
  double samples = 0;
  int64_t last_step = -1;
};
PairedView PairAt(const GateConfig& config, const PairedCell& pair, int64_t step);

}  // namespace spgate

#endif  // SPGATE_POLICY_PAIRED_EVIDENCE_H_
