// GateState's part in the ADAPTIVE policy (docs/design.md §11): the job's learned table,
// fed by the steps the daemon decided, and its pushes to the leaders. See gate_state.h;
// the private structures are in gate_state_internal.h.
#include "server/gate_state.h"
#include "server/gate_state_internal.h"

namespace spgate::server {

using gate_state_internal::PendingStep;

// The table learns from every step the daemon decided, whatever the policy in force, so
// switching a job to ADAPTIVE starts from what STATIC ran.
void GateState::LearnFromStep(Job& job, Group& g, int slot) {
  const PendingStep& p = g.pending[slot];
  if (const gate_state_internal::CachedDecision* d = g.Cached(p.step);
      d != nullptr && d->band >= 0) {
    const GateConfig& config = g.schedule.At(p.step).config;
    job.learned.Observe(d->band, p.mode, p.step, static_cast<double>(p.tokens), p.step_time,
                        config.adaptive_half_life_steps);
    const CellView v = job.learned.At(d->band, p.mode, p.step, config.adaptive_half_life_steps);
    job.metrics->SetLearned(d->band, p.mode, v.tokens_per_s, v.samples);
    const uint64_t bits = job.learned.PreferenceBits(config, job.learned.newest_step());
    if (bits != job.learned_bits) {
      job.learned_bits = bits;
      job.learned_push_due = true;
    }
  }
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
  const bool had = !job.learned.empty();
  job.learned.Clear();
  job.learned_bits = 0;
  job.learned_push_due = had;  // leaders drop the old table too
  job.gain.Clear();
  job.exploration_steps = 0;
  job.metrics->RemoveLearned();
  job.metrics->adaptive_gain->Set(0);
}

void GateState::CollectLearnedPushes(Job& job, bool force, const std::string* only,
                                     std::vector<std::shared_ptr<SessionSink>>* sinks,
                                     ThroughputTable* table) {
  const absl::Time now = Now();
  if (!force && (!job.learned_push_due || now - job.learned_pushed < options_.learned_push_interval)) {
    return;
  }
  for (auto it = job.sinks.begin(); it != job.sinks.end(); ++it) {
    if (only != nullptr && it->first != *only) continue;
    auto sit = sessions_.find(it->first);
    if (sit == sessions_.end() || sit->second->rank_in_group != 0) continue;  // leaders only
    if (std::shared_ptr<SessionSink> sink = it->second.lock()) sinks->push_back(std::move(sink));
  }
  *table = job.learned;
  if (only == nullptr) {
    job.learned_push_due = false;
    job.learned_pushed = now;
  }
}

}  // namespace spgate::server
