// GateState's part in the ADAPTIVE policy (docs/design.md §11): the job's learned table,
// fed by the steps the daemon decided, and its pushes to the leaders. See gate_state.h;
// the private structures are in gate_state_internal.h.
#include "server/gate_state.h"
#include "server/gate_state_internal.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

namespace spgate::server {

using gate_state_internal::PendingStep;

namespace {

// One unit of learning: a plain step, or one micro-batch of a step plan on its stage.
struct LearnedSample {
  int band = -1;  // < 0: its band is not known; only its mode is noted
  Mode mode = Mode::kSequenceParallel;
  double tokens = 0, seconds = 0;
  double length_cv = -1;  // < 0: not known (the prior skips it)
  double all_gather_s = 0, rs_wait_s = 0;
};

}  // namespace

// The table learns from every step the daemon decided, whatever the policy in force, so
// switching a job to ADAPTIVE starts from what STATIC ran. One path for both layouts: a
// plain step is one sample into the job's table (its tokens over the group's step time,
// in the band its decision put it in); a step plan's step is one sample per micro-batch
// into its stage's table (docs/design.md §12: tokens over its compute on the stage, in
// the band its plan put it in, the prior's CV at the band's mid-point since the
// micro-batch's own is not kept). In id order — the order a stage's forwards run — a
// sample whose mode differs from the group's previous one (this step's, or the last of
// the step before) measures a switch: the modes that ran (the telemetry's), not the ones
// decided, since a worker's memory override or its fallback may have run another.
void GateState::LearnFromStep(Job& job, Group& g, int slot) {
  PendingStep& p = g.pending[slot];
  const GateConfig& config = g.schedule.At(p.step).config;
  std::vector<LearnedSample> samples;
  ThroughputTable* table = &job.learned;
  int stage = -1;
  if (!p.microbatches.empty() && job.layout.has_value()) {
    const gate_state_internal::CachedStepPlan* plan = g.CachedPlan(p.step);
    if (plan != nullptr && plan->bands.size() == p.microbatches.size()) {
      stage = CoordinatesOf(*job.layout, g.index).stage;
      table = &job.stage_learned[static_cast<size_t>(stage)];
      samples.reserve(p.microbatches.size());
      for (const MicrobatchTelemetryValues& m : p.microbatches) {  // by id (FoldTelemetry)
        const int band = plan->bands[static_cast<size_t>(m.id)];
        samples.push_back({.band = band, .mode = m.mode,
                           .tokens = static_cast<double>(m.effective_tokens),
                           .seconds = m.compute_s(),
                           .length_cv = band < 0 ? -1 : BandCvMidpoint(config, band),
                           .all_gather_s = m.all_gather_s, .rs_wait_s = m.rs_wait_s});
      }
    }
    std::vector<MicrobatchTelemetryValues>().swap(p.microbatches);  // the slot's bytes go
  } else if (const gate_state_internal::CachedDecision* d = g.Cached(p.step);
             d != nullptr && d->band >= 0) {
    // The group record's all-gather seconds and its largest wait share (docs/design.md §2).
    samples.push_back({.band = d->band, .mode = p.mode,
                       .tokens = static_cast<double>(p.tokens), .seconds = p.step_time,
                       .length_cv = d->length_cv, .all_gather_s = p.all_gather,
                       .rs_wait_s = p.rs_share * p.step_time});
  }
  if (samples.empty()) return;

  static_assert(2 * kBands <= 64, "a step's touched cells fit a 64-bit mask");
  uint64_t touched = 0;
  std::optional<Mode> previous;
  if (g.learned_step == p.step - 1) previous = g.learned_mode;
  for (const LearnedSample& x : samples) {
    const bool after_switch = previous.has_value() && *previous != x.mode;
    previous = x.mode;
    if (x.band < 0) continue;
    if (!after_switch) {
      table->Observe(config, x.band, x.mode, p.step, x.tokens, x.seconds);
    } else if (table->ObserveAfterSwitch(config, x.band, x.mode, p.step, x.tokens, x.seconds) &&
               stage < 0) {
      // The job's gauge is the plain table's; a stage's cost shows in GetJob's tables.
      job.metrics->adaptive_switch_cost->Set(table->SwitchCostSeconds());
    }
    if (x.length_cv >= 0) {
      table->ObserveCollectives(config, x.mode, p.step, x.tokens, x.length_cv, x.seconds,
                                x.all_gather_s, x.rs_wait_s, after_switch);
    }
    touched |= uint64_t{1} << (x.band * 2 + (x.mode == Mode::kTensorParallelOnly ? 1 : 0));
  }
  g.learned_step = p.step;
  g.learned_mode = *previous;
  // The cells this step fed, once each (a step has up to 4,096 micro-batches).
  for (int cell = 0; cell < 2 * kBands; ++cell) {
    if ((touched >> cell & 1) == 0) continue;
    const Mode mode = cell % 2 == 1 ? Mode::kTensorParallelOnly : Mode::kSequenceParallel;
    const CellView v = table->At(config, cell / 2, mode, p.step);
    if (stage < 0) {
      job.metrics->SetLearned(cell / 2, mode, v.tokens_per_s, v.samples);
    } else {
      job.metrics->SetStageLearned(stage, cell / 2, mode, v.tokens_per_s);
    }
  }
  if (touched != 0) {
    NoteLearned(job, *table, config,
                stage < 0 ? job.learned_told
                          : job.stage_learned_told[static_cast<size_t>(stage)]);
  }
}

// After a table learned: the leaders are due a push when a band's preference changed, a
// change was detected (the fallback explores after it too) or the prior's choice for a
// band without samples changed (checked at most once per push interval: a fit is a
// microsecond or two), and a detected change is counted.
void GateState::NoteLearned(Job& job, const ThroughputTable& table, const GateConfig& config,
                            gate_state_internal::LearnedTold& told) {
  const uint64_t bits = table.PreferenceBits(config, table.newest_step());
  if (bits != told.bits) {
    told.bits = bits;
    job.learned_push_due = true;
  }
  if (table.changes() > told.changes) {
    job.metrics->adaptive_changes->Increment(static_cast<double>(table.changes() - told.changes));
    told.changes = table.changes();
    job.learned_push_due = true;
  }
  const absl::Time now = Now();
  if (now - told.prior_checked >= options_.learned_push_interval) {
    told.prior_checked = now;
    const uint64_t prior = PriorBits(config, table, table.newest_step());
    if (prior != told.prior_bits) {
      told.prior_bits = prior;
      job.learned_push_due = true;
    }
  }
}

ThroughputTable& GateState::LearnedTableOf(Job& job, int group) {
  if (!job.layout.has_value()) return job.learned;
  return job.stage_learned[static_cast<size_t>(CoordinatesOf(*job.layout, group).stage)];
}

void GateState::KeepBandsOf(Job& job, const GateConfig& config) {
  if (config.adaptive_cv_band_width == job.learned_cv_band_width &&
      config.adaptive_tokens_band_base == job.learned_tokens_band_base) {
    return;
  }
  ClearLearned(job);
  job.learned_cv_band_width = config.adaptive_cv_band_width;
  job.learned_tokens_band_base = config.adaptive_tokens_band_base;
}

void GateState::ClearLearned(Job& job) {
  bool had = !job.learned.empty();
  job.learned.Clear();
  job.learned_told = gate_state_internal::LearnedTold{};
  std::fill(job.stage_learned_told.begin(), job.stage_learned_told.end(),
            gate_state_internal::LearnedTold{});
  for (ThroughputTable& t : job.stage_learned) {
    had = had || !t.empty();
    t.Clear();
  }
  job.learned_push_due = had;  // leaders drop the old table too
  job.gain.Clear();
  job.exploration_steps = 0;
  job.metrics->RemoveLearned();
  job.metrics->adaptive_gain->Set(0);
  job.metrics->adaptive_switch_cost->Set(0);
}

void GateState::CollectLearnedPushes(Job& job, bool force, const std::string* only,
                                     std::vector<LearnedPush>* pushes) {
  const absl::Time now = Now();
  if (!force && (!job.learned_push_due || now - job.learned_pushed < options_.learned_push_interval)) {
    return;
  }
  // One copy per table, shared by the leaders that get it.
  std::vector<std::shared_ptr<const ThroughputTable>> copies(
      job.layout.has_value() ? job.stage_learned.size() : 1);
  for (auto it = job.sinks.begin(); it != job.sinks.end(); ++it) {
    if (only != nullptr && it->first != *only) continue;
    auto sit = sessions_.find(it->first);
    if (sit == sessions_.end() || sit->second->rank_in_group != 0) continue;  // leaders only
    std::shared_ptr<SessionSink> sink = it->second.lock();
    if (sink == nullptr) continue;
    const size_t k =
        job.layout.has_value()
            ? static_cast<size_t>(CoordinatesOf(*job.layout, sit->second->group).stage)
            : 0;
    if (copies[k] == nullptr) {
      copies[k] = std::make_shared<const ThroughputTable>(
          LearnedTableOf(job, sit->second->group));
    }
    pushes->push_back({std::move(sink), copies[k]});
  }
  if (only == nullptr) {
    job.learned_push_due = false;
    job.learned_pushed = now;
  }
}

}  // namespace spgate::server
