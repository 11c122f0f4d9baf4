// The ADAPTIVE policy (docs/design.md §11): each mode's effective tokens/s, learned from
// telemetry per band of (length CV, tokens), decides instead of fixed thresholds. Pure
// like the gates (no I/O, no clock, no locks): the learned table is an argument, and
// the daemon and the worker's fallback evaluate the same function over it.
//
// Decision order:
//   1. pin and 2. memory, exactly as the gates (memory stays absolute, and a flip they
//      force is never held);
//   3. the incumbent: the STATIC gates' decision for the batch (ThresholdGates, its
//      reason kept, so the group's gate state moves as under STATIC). ADAPTIVE departs
//      from it (reason ADAPTIVE) only on evidence:
//      - when both modes have at least adaptive_min_samples (weighted) in the batch's
//        band: when the other mode's saving on this batch at the band's rates (a move to
//        TP-only counts its seconds 1 + adaptive_margin times) is above 0 at one-sided 95 %
//        confidence (kEvidenceZ standard errors, each cell's from its samples' relative
//        spread — at least the table's mean — and its weight; DepartureEvidence; a band's
//        paired evidence may stand in for a stale cell, and where switching is free it
//        also ends a re-learning: EstimateBand), and the band is not re-learning after a
//        change (Relearning);
//        where that interval spans 0, the band's gap shrunk towards the other known
//        bands' pooled gap decides the same test (PoolBands, PooledDepartureEvidence);
//      - otherwise the physics prior's predicted step times (cost_prior.h), when its
//        prediction is clear of twice its error and names the other mode;
//   4. where a switch's cost c is measured (MeasuredSwitchCost > 0), a
//      switch away from the mode the group last chose must be allowed by the flip cap
//      (at most two switches in any 2 × adaptive_flip_interval_steps decisions) and pay
//      for c, as an excursion (this batch's saving ≥ 2c, the way out and back, when the
//      cap leaves both) or as a move (this batch's saving plus kMoveHorizonDecisions − 1
//      steps of the band mix's ≥ c; in a band without evidence the batch's saving is the
//      prior's prediction, and the gates' choice there without one obeys the cap alone);
//      otherwise the group holds its mode (reason ADAPTIVE, flip_held). After a probe
//      run in the mode that is the gates' choice in a band without evidence, the group
//      goes back to the mode the run left unless the switch from that mode pays or the cap
//      has no switch left (a probe run is an excursion; the gates' own wait-share probe
//      is a run of one step). Where switching is free nothing holds and the cap does not
//      bind: the group runs step 3's choice;
//   5. exploration: on kProbeRunSteps consecutive steps of every
//      ceil(kProbeRunSteps/share) (a probe run: two switches buy four samples; where in
//      its period a run falls, a hash of the period's number picks) the band's mode not
//      chosen runs instead (reason PROBE), if the cap (where it binds) leaves the flips
//      out and back; a held group's, the mode it is kept off where that mode's estimate
//      in the band predates the band's last change. The share is adaptive_explore_share
//      while the band learns (too few samples) and carries kLearnMinTraffic of the
//      recent batches, where switching is
//      free while it is known, carries that share and is undecided with its estimates
//      leaning to the mode not chosen (step 3 did not depart, yet by its measure of a
//      saving, which counts TP-only's seconds 1 + adaptive_margin times, that mode saves
//      more than adaptive_margin of the batch's seconds), or while it re-learns after a
//      change (Relearning; where switching is free its first run comes at once), else
//      adaptive_explore_floor, whose first run comes one period in (the schedule:
//      exploration.h). Exploration is how the evidence of step 3 is gathered;
//      it is the one place ADAPTIVE runs a mode neither the gates nor the evidence chose.
//
// The table forgets: a sample's weight halves every adaptive_half_life_steps steps, but a
// cell that had adaptive_min_samples never falls below that weight (an estimate never
// rests on one or two stale steps). Each cell watches its samples' residuals: when the
// recent ones sit more than adaptive_change_threshold (and beyond their own noise) from
// the estimate, the cell is re-based on them (the other mode's, where it is stale, moved
// by the same factor, once between its own samples) and the band marked changed; a band
// that sees a sample after a half-life without one is marked changed too. Either voids
// the band's paired evidence (paired_evidence.h).
//
// Usage:
//   spgate::ThroughputTable table;                       // one per job, pooled
//   spgate::GateOutcome out = spgate::EvaluatePolicy(config, state, facts, rs, pin, &table);
//   ... after the step ran (after_switch: the group's previous step ran the other mode;
//   probe: it ran as the probe `out` asked for) ...
//   spgate::ObserveGroupStep(config, table,
//       {.band = out.band, .mode = mode, .step = facts.step, .tokens = tokens,
//        .seconds = group_step_seconds, .probe = probe, .after_switch = after_switch,
//        .exploration = spgate::ExplorationSwitch(after_switch, probe, previous_probe)});
#ifndef SPGATE_POLICY_ADAPTIVE_POLICY_H_
#define SPGATE_POLICY_ADAPTIVE_POLICY_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "policy/cost_prior.h"
#include "policy/gate_policy.h"
#include "policy/paired_evidence.h"
#include "policy/types.h"

namespace spgate {

inline constexpr int kCvBands = 8;
inline constexpr int kTokenBands = 4;
inline constexpr int kBands = kCvBands * kTokenBands;
// Consecutive steps of one exploration run (step 5 above).
inline constexpr int64_t kProbeRunSteps = 4;
static_assert(kPairGapSteps == kProbeRunSteps + 2, "a probe run and a step either side");

// Whether `band` is one of the kBands.
inline bool ValidBand(int band) { return band >= 0 && band < kBands; }

// The band of a batch: length-CV band (edges at 1, 2, …, 7 × adaptive_cv_band_width) ×
// token band (edges at 1, 2, 4 × adaptive_tokens_band_base). In [0, kBands).
int BandOf(const GateConfig& config, double length_cv, int64_t tokens);

// "cv0.tok2": a bounded metric label. Out-of-range bands give "none".
std::string BandLabel(int band);
// "cv [0.1, 0.2) tokens [8192, 16384)": for tables.
std::string BandRangeText(const GateConfig& config, int band);

// The bounds of one sample's relative seconds residual in ThroughputCell::seconds_drift
// (a step five times as slow, or a fifth of the time), and so of the mean.
inline constexpr double kSecondsDriftMin = -0.8;
inline constexpr double kSecondsDriftMax = 4.0;

// One (band, mode) estimate: forgetting-weighted sums of the tokens and the seconds of
// the steps observed, and the weight (the effective number of samples); and the state of
// its change detector.
struct ThroughputCell {
  double tokens = 0;
  double seconds = 0;
  double weight = 0;
  int64_t last_step = -1;  // newest step folded in; -1: never
  double drift = 0;        // fast mean of the recent samples' relative residuals
  double noise = 0;        // slow mean of their squares
  int64_t changed_step = -1;  // newest step a change was detected at; -1: never
  // Consecutive samples the fast mean has sat beyond the change bound: above it counted
  // up, below it down; 0 inside it. Always within ±(kChangeConfirmSamples − 1).
  int32_t beyond = 0;
  // The fast mean (the drift's rate) of the recent samples' seconds over what the estimate
  // gives their tokens, less 1: the mode's level now, in seconds, for paired evidence
  // (paired_evidence.h). In seconds, not in tokens/s as the drift: where stragglers make
  // a few steps slow, the mean of the rates runs above the ratio of the sums, and a level
  // read from the drift made the running mode look faster by that gap. In
  // [kSecondsDriftMin, kSecondsDriftMax]: each sample's term is bounded so.
  double seconds_drift = 0;
  // The fast mean (the drift's rate) of the recent steps' straggler delays over their
  // seconds (GroupStepSample::straggler_s), each step's taken at most
  // adaptive_straggler_share above the mean; < 0: no step's delay known yet. What the
  // mode's ranks spread by as a rule (its own imbalance, jitter), which a straggler's
  // step exceeds (ObserveStraggler).
  double straggler_share = -1;

  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0.0; }
  friend bool operator==(const ThroughputCell&, const ThroughputCell&) = default;
};

// What a mode switch costs a group: forgetting-weighted sums of the seconds the first
// step after a switch took beyond its band's estimate for its mode.
struct SwitchCostCell {
  double seconds = 0;
  double weight = 0;
  int64_t last_step = -1;  // -1: never measured
  friend bool operator==(const SwitchCostCell&, const SwitchCostCell&) = default;
};

// What a cell says at a step: its estimate and its weight decayed to that step.
struct CellView {
  double tokens_per_s = 0;
  double samples = 0;
  // The relative variance of one sample's tokens/s around the estimate (the cell's
  // change detector's noise, corrected for its start at 0); 0 before a second sample.
  double relative_variance = 0;
};

struct GroupStepSample;  // below

// The learned table of one job: kBands × 2 cells. Small (a few hundred bytes) and
// copyable; the daemon pools every group's steps into one, and sends a copy to workers.
class ThroughputTable {
 public:
  // Folds in one step of a group: `tokens` effective tokens in `seconds` (the group's
  // step time, the max over its ranks). Samples may arrive out of step order (groups are
  // pooled); an older one enters with the weight it would have now. Non-finite or
  // non-positive seconds, negative tokens and bad bands are ignored. Runs the cell's
  // change detector first (see the top of this file). The step is also paired with the
  // other mode's level, where that mode's newest sample is within kPairGapSteps
  // (paired_evidence.h): a probe step, and the steps around any switch.
  void Observe(const GateConfig& config, int band, Mode mode, int64_t step, double tokens,
               double seconds);

  // The first step after a group switched mode: what it took beyond the cell's estimate
  // is a switch's cost (measured only against a cell of adaptive_min_samples' weight).
  // The step enters the cell as it ran, so a mode mostly entered by a switch (a memory
  // gate's, a departure's) carries its cost in its estimate. An `exploration` switch —
  // into a probe run or back from one — is the probe's cost, not the mode's: the step
  // enters less the cost measured before it (MeasuredSwitchCost), and before the table
  // measured any switch, not at all into a cell below the sample floor (its first few
  // samples would carry the whole cost, and the policy would depart on that bias). A
  // `forced` step measures no cost: the memory gate forces a band's largest batches, which
  // take longer than its mean after a switch or not. Returns whether it measured a cost.
  bool ObserveAfterSwitch(const GateConfig& config, int band, Mode mode, int64_t step,
                          double tokens, double seconds, bool exploration = false,
                          bool forced = false);

  // Whether a straggler delayed the step `x` (docs/design.md §11, "Straggler steps"),
  // while StragglersKnown: its delay's share of its seconds is above its cell's
  // straggler_share by more than adaptive_straggler_share. A rank slowed for reasons of
  // its own (a throttled GPU, a noisy neighbour) slows either mode alike, and one such
  // step in a cell moves its estimate by more than the modes differ; ranks whose work
  // differs by design (a mode's own imbalance) spread every step of the cell, which its
  // straggler_share comes to hold. Folds the step's share into straggler_share (a cell's
  // first known share counts at most the bound). A delay not known (< 0) is no straggler
  // and moves nothing.
  bool ObserveStraggler(const GateConfig& config, const GroupStepSample& x);
  // Whether the job's telemetry times the collectives a straggler's delay is read from in
  // both modes: a step of each mode has come timed (GroupStepSample::timed), and none
  // untimed. A worker that times SP's waits but not TP-only's all-reduces shows SP's
  // straggler steps and hides TP-only's; leaving out SP's alone would make SP read fast,
  // so one untimed step turns the rule off for the table's life. Persisted with it.
  bool StragglersKnown() const {
    return !stragglers_.untimed && stragglers_.timed[0] && stragglers_.timed[1];
  }
  // The simulator times every collective from its first step: the rule is on at once.
  void MarkCollectivesTimed() { stragglers_.timed = {true, true}; }
  struct StragglerTiming {
    std::array<bool, 2> timed{};  // [SP, TP-only]: a step of the mode came timed
    bool untimed = false;         // a step came untimed
    friend bool operator==(const StragglerTiming&, const StragglerTiming&) = default;
  };
  const StragglerTiming& straggler_timing() const { return stragglers_; }
  void SetStragglerTiming(const StragglerTiming& t) { stragglers_ = t; }

  // The cell's estimate, its weight decayed to `step` (never below adaptive_min_samples
  // once it had them).
  CellView At(const GateConfig& config, int band, Mode mode, int64_t step) const;

  // One SP step's collective telemetry for the physics prior (cost_prior.h): its tokens,
  // length CV, step seconds, and the group's largest all-gather and reduce-scatter
  // seconds; `after_switch`: the group's previous step ran the other mode, and the step
  // enters less the learned switch cost (as ObserveAfterSwitch). TP-only steps and bad
  // values are ignored; returns whether it was folded in.
  bool ObserveCollectives(const GateConfig& config, Mode mode, int64_t step, double tokens,
                          double length_cv, double seconds, double all_gather_s,
                          double rs_wait_s, bool after_switch = false);
  // What the job declared at Register (kept by Clear: it is not learned).
  void SetPriorInputs(const PriorInputs& inputs) { prior_inputs_ = inputs; }
  const PriorInputs& prior_inputs() const { return prior_inputs_; }
  const PriorSums& prior_sums() const { return prior_sums_; }
  void SetPriorSums(const PriorSums& sums) { prior_sums_ = sums; }

  // The learned cost of a switch in seconds (0 before one was measured; never negative).
  double SwitchCostSeconds() const;
  const SwitchCostCell& switch_cost() const { return switch_cost_; }
  void SetSwitchCost(const SwitchCostCell& cost) { switch_cost_ = cost; }

  // The newest step a change was detected at in the band (either mode); -1: never.
  int64_t BandChangedStep(int band) const;
  // Changes detected since the table started (what the daemon counts and pushes on).
  int64_t changes() const { return changes_; }
  void SetChanges(int64_t changes) { changes_ = changes; }

  const ThroughputCell& cell(int band, Mode mode) const { return cells_[Index(band, mode)]; }
  // Replaces a cell (a table received from the daemon). Bad bands are ignored.
  void SetCell(int band, Mode mode, const ThroughputCell& cell);
  // The band's paired evidence (paired_evidence.h); an empty one for bad bands.
  const PairedCell& pair(int band) const;
  // Replaces it (a table received from the daemon). Bad bands are ignored.
  void SetPair(int band, const PairedCell& pair);
  // Newest step folded into any cell; -1 when empty.
  int64_t newest_step() const { return newest_step_; }
  bool empty() const { return newest_step_ < 0; }
  // Forgets what was learned; the declared prior inputs stay.
  void Clear() {
    const PriorInputs inputs = prior_inputs_;
    *this = ThroughputTable{};
    prior_inputs_ = inputs;
  }

  // Two bits per band: whether the band, at `step`, has the samples to decide, and
  // whether it then prefers TP-only (ahead by more than the margin). Changes of this are what the daemon
  // tells workers about.
  uint64_t PreferenceBits(const GateConfig& config, int64_t step) const;

  friend bool operator==(const ThroughputTable&, const ThroughputTable&) = default;

 private:
  static int Index(int band, Mode mode) {
    return band * 2 + (mode == Mode::kTensorParallelOnly ? 1 : 0);
  }
  // Observe's two parts: the sample into its cell (the change detector first), and its
  // pair.
  void FoldSample(const GateConfig& config, int band, Mode mode, int64_t step, double tokens,
                  double seconds);
  void Pair(const GateConfig& config, int band, Mode mode, int64_t step, double tokens,
            double seconds);
  void MarkChanged(int band, ThroughputCell& c, int64_t step);
  std::array<ThroughputCell, kBands * 2> cells_{};
  std::array<PairedCell, kBands> pairs_{};
  SwitchCostCell switch_cost_;
  PriorInputs prior_inputs_;
  PriorSums prior_sums_;
  int64_t newest_step_ = -1;
  int64_t changes_ = 0;
  StragglerTiming stragglers_;
};

// What one band's learned estimates say at a step, written once for the policy (step 3
// above weighs them with DepartureEvidence), the preference bits and spgatectl's table.
struct BandEstimate {
  CellView sp;
  CellView tp;
  // Both modes have adaptive_min_samples and SP has a positive estimate.
  bool known = false;
  // When known: TP-only, if its estimate beats SP's by more than adaptive_margin, else SP.
  Mode preferred = Mode::kSequenceParallel;
  // TP-only's estimate over SP's; 0 when either has none.
  double ratio = 0;
  // The band's pairs speak in full (paired_evidence.h): no switch cost is measured, they
  // have adaptive_min_samples' weight, and both cells an estimate.
  bool paired = false;
  // One cell's estimate is the other's times the pairs' ratio, on the pairs' weight (read
  // through the pairs): where `paired`, within adaptive_explore_boost_steps of a change
  // detected in the band (the pairs are all from since: a change voids them), the cell the
  // change did not re-base; outside that window, a cost measured or not, a cell whose
  // newest sample is more than kPairGapSteps older than the other's, where the pairs' gap
  // differs from the cells' beyond their noise.
  bool read_through_pairs = false;
  PairedView pair;
};
// What EstimateBand needs of the whole table, a pass over its cells a caller deciding many
// bands makes once: the measured switch cost at the step (MeasuredSwitchCost; pairs speak
// in full only where it is 0) and the table's noise (TableNoiseOf's relative variance,
// the floor of a cell's, as in step 3).
struct TableFacts {
  double switch_cost = 0;
  double variance_floor = 0;
};
TableFacts TableFactsOf(const GateConfig& config, const ThroughputTable& table, int64_t step);
// `table` null: an empty table. `facts`: the table's TableFactsOf at `step`; computed
// where needed when null.
BandEstimate EstimateBand(const GateConfig& config, const ThroughputTable* table, int band,
                          int64_t step, const TableFacts* facts = nullptr);

// Whether a change was detected in the band within adaptive_explore_boost_steps before
// `step` (the longest it re-learns: Relearning).
bool ChangedLately(const GateConfig& config, const ThroughputTable& table, int band,
                   int64_t step);
// Whether the band's estimates `e` (its EstimateBand) are no evidence at `step`: a change
// was detected lately and the pairs measured since have not yet adaptive_min_samples'
// weight. A change re-bases one mode's cell on a few recent samples; the other's is from
// before it (moved by the same factor where it was stale).
bool Relearning(const GateConfig& config, const ThroughputTable& table, int band, int64_t step,
                const BandEstimate& e);

// The physics prior (cost_prior.h) of a table: its constants, fitted on the table's prior
// inputs, its collective sums and its measured bands (the costly part: a pass over the
// bands); and its prediction for `batch`. `table` null: nothing to fit.
PriorFit FitPriorOf(const GateConfig& config, const ThroughputTable* table);
PriorEstimate PriorOf(const GateConfig& config, const ThroughputTable* table,
                      const BatchFacts& batch);
// The CV a band's batches are taken to have where only the band is known: its range's
// mid-point; -1 for the open top band and bad bands.
double BandCvMidpoint(const GateConfig& config, int band);

// Two bits per band without samples (not EstimateBand's `known`): whether the prior decides
// its batches (at its cells' mean tokens, else its token range's middle, and its CV's
// mid-point, the top band's lower edge), and whether for TP-only. What the daemon also
// tells workers about (their fallback predicts from the table it was last sent).
uint64_t PriorBits(const GateConfig& config, const ThroughputTable& table, int64_t step);

// What the prior decides for `batch` (step 3 above): `decides` when it has its inputs and
// its predicted SP / TP-only step ratio is further than twice its error from
// 1 + adaptive_margin; then TP-only when the ratio is above it.
struct PriorChoice {
  PriorEstimate estimate;
  double ratio = 0;  // predicted SP step / TP-only step; 0 without a prediction
  bool decides = false;
  Mode mode = Mode::kSequenceParallel;
};
PriorChoice ChoosePrior(const GateConfig& config, const PriorFit& fit, const BatchFacts& batch);

// ADAPTIVE's gain over the STATIC gates (docs/design.md §11): the learned seconds of the
// batches ADAPTIVE decided from its estimates, at the rate of the mode it ran and at the
// rate of the mode the gates would have run. The daemon keeps one per job.
class AdaptiveGainLedger {
 public:
  // Adds one decided batch of `tokens` tokens at `step`. Counts only outcomes whose band
  // decided (static_choice set) and whose two modes both have a learned rate; returns
  // whether it counted.
  bool Add(const GateConfig& config, const ThroughputTable& table, const GateOutcome& outcome,
           int64_t step, int64_t tokens);
  // STATIC's seconds over ADAPTIVE's for the same batches (above 1: ADAPTIVE gained);
  // 0 before anything was counted.
  double ratio() const { return adaptive_s_ > 0 ? static_s_ / adaptive_s_ : 0.0; }
  void Clear() { *this = AdaptiveGainLedger{}; }

 private:
  double adaptive_s_ = 0;
  double static_s_ = 0;
};

// The ADAPTIVE policy for `batch` (see the top of this file). `table` null: empty.
// The outcome's band is the batch's; static_choice is what the STATIC gates would have
// run for the same batch, set when the band decided (for the gain estimate).
// `prior_fit`: the table's FitPriorOf, for a caller deciding many batches on one table
// (a step plan's micro-batches); null: fitted here when a band needs the prior.
GateOutcome EvaluateAdaptive(const GateConfig& config, const GroupGateState& state,
                             const BatchFacts& batch, const RsWaitObservation& rs_wait,
                             std::optional<PinDirective> pin, const ThroughputTable* table,
                             std::vector<GateCheck>* trace = nullptr,
                             const PriorFit* prior_fit = nullptr);

// config.policy's function: EvaluateGates for STATIC, EvaluateAdaptive for ADAPTIVE.
GateOutcome EvaluatePolicy(const GateConfig& config, const GroupGateState& state,
                           const BatchFacts& batch, const RsWaitObservation& rs_wait,
                           std::optional<PinDirective> pin, const ThroughputTable* table,
                           std::vector<GateCheck>* trace = nullptr,
                           const PriorFit* prior_fit = nullptr);

// Whether the flip cap lets the group switch `flips` times in a row from its next
// decision on: at most two switches in any 2 × adaptive_flip_interval_steps decisions.
// The cap binds only where MeasuredSwitchCost is above 0.
bool FlipsAllowed(const GateConfig& config, const GroupGateState& state, int flips);

// The one-sided confidence of every test ADAPTIVE makes on its evidence (a departure, a
// measured switch cost): 1.645 standard errors, 95 % under a normal approximation.
inline constexpr double kEvidenceZ = 1.645;

// What a table's steps spread by, over its cells with adaptive_min_samples' weight
// (weighted by it): their mean step seconds, the mean spread of one step around its cell's
// estimate in seconds, and the mean relative variance of one sample. Zero without such cells.
struct TableNoise {
  double step_seconds = 0;
  double spread_seconds = 0;
  double relative_variance = 0;
};
TableNoise TableNoiseOf(const GateConfig& config, const ThroughputTable& table);

// The learned switch cost where it is measured with confidence: its mean, when that is
// above adaptive_margin of the table's mean step (a smaller difference is none the policy
// acts on) and above kEvidenceZ standard errors of the mean (one measurement's spread taken
// as the table's spread_seconds, over the square root of the cost's weight decayed to
// `step`); 0 otherwise, and where nothing was measured. `noise`: the table's TableNoiseOf
// when the caller has it.
double MeasuredSwitchCost(const GateConfig& config, const ThroughputTable& table, int64_t step,
                          const TableNoise* noise = nullptr);

// The evidence for running `to` instead of `from` on a batch of `tokens` in a band with
// estimates `here` (known): the seconds saved at the band's rates (a move to TP-only counts
// TP-only's seconds 1 + adaptive_margin times; a move to SP need only be faster) and that
// saving's one-sided lower bound, kEvidenceZ standard errors below it (the two estimates
// independent, each with its cell's relative variance, at least `variance_floor` — the
// table's mean, TableNoiseOf — over its weight).
struct Evidence {
  double saving_s = 0;
  double bound_s = 0;
};
Evidence DepartureEvidence(const GateConfig& config, const BandEstimate& here, int64_t tokens,
                           Mode from, Mode to, double variance_floor = 0);

// What running `to` instead of `from` saves, in seconds (TP-only's seconds counted
// 1 + adaptive_margin times, as the band rule does; negative when `to` is slower): on this
// batch at its band's estimate `here` (0 when not known), and per step of the band mix
// (each known band at its mean tokens, weighted by its share of the recent steps).
struct SwitchSaving {
  double batch = 0;
  double mix_per_step = 0;
};
SwitchSaving SwitchSavingOf(const GateConfig& config, const ThroughputTable& table, Mode from,
                            Mode to, const BatchFacts& batch, const BandEstimate& here);

// Whether a step after a switch is exploration's (ObserveAfterSwitch): the switch was into
// a probe (`probe`: the step ran as one) or back from one (`previous_probe`). The daemon
// and the simulator feed their tables through this one rule.
inline bool ExplorationSwitch(bool after_switch, bool probe, bool previous_probe) {
  return after_switch && (probe || previous_probe);
}

// One step (or micro-batch) a group ran, as its learned table takes it (ObserveGroupStep).
struct GroupStepSample {
  int band = -1;  // < 0: its band is not known, and the table learns nothing from it
  Mode mode = Mode::kSequenceParallel;
  int64_t step = 0;
  double tokens = 0, seconds = 0;
  double length_cv = -1;                   // < 0: not known (the prior skips it)
  double all_gather_s = 0, rs_wait_s = 0;  // the physics prior's (ObserveCollectives)
  // Ran in the mode ADAPTIVE decided as a probe: what a caller derives `exploration` from
  // (ExplorationSwitch, with the previous step's); the table itself does not read it.
  bool probe = false;
  bool after_switch = false;  // the group's (stage's) previous one ran the other mode
  bool exploration = false;   // ExplorationSwitch's
  // Ran in the mode a pin, the memory gate or another forced reason decided
  // (IsForcedReason): after a switch, its excess is not taken as the switch's cost.
  bool forced = false;
  // The seconds its slowest rank was busy beyond its median rank (StragglerSeconds); < 0:
  // not known. A straggler's step (ThroughputTable::ObserveStraggler) is not learned.
  double straggler_s = -1;
  // Its record timed its mode's collective (SP's reduce-scatter, TP-only's all-reduce),
  // which the straggler rule needs in both modes (ThroughputTable::StragglersKnown).
  bool timed = false;
};

// Folds `x` into `table` — of a straggler's step (ObserveStraggler; `*straggler` says)
// only its delay, of an unknown band nothing: after a switch through ObserveAfterSwitch
// (what it took beyond its estimate is the switch's cost), else through Observe; with
// `prior`, an SP step's collectives also feed the physics prior (ObserveCollectives,
// which skips an unknown CV). The daemon and the simulator feed their tables through this
// one rule. Returns whether it measured a switch's cost.
bool ObserveGroupStep(const GateConfig& config, ThroughputTable& table,
                      const GroupStepSample& x, bool prior = true, bool* straggler = nullptr);

// The decisions a move to the other mode is judged over (step 4 above).
inline constexpr int64_t kMoveHorizonDecisions = 50;

// A detected change must hold: the cell's fast mean beyond the bound, on the same side, on
// this many consecutive samples (its own window, the inverse of its rate). Stragglers put a
// few slow samples close together far more often than normal noise would: such a cluster
// carries the fast mean past the bound for a sample or two, a level shift keeps it there
// (docs/design.md §11).
inline constexpr int32_t kChangeConfirmSamples = 8;

}  // namespace spgate

#endif  // SPGATE_POLICY_ADAPTIVE_POLICY_H_
