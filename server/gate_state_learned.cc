// GateState's part in the ADAPTIVE policy (docs/design.md §11): the job's learned table,
// fed by the steps the daemon decided, its pushes to the leaders, and its life across
// launches and restarts (--state_dir, server/learned_store.h). See gate_state.h;
// the private structures are in gate_state_internal.h.
#include "server/gate_state.h"
#include "server/gate_state_internal.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "policy/pipeline_memory.h"

namespace spgate::server {

using gate_state_internal::PendingStep;

namespace {

// Whether a sample that ran `ran` was the probe its decision asked for: a worker's memory
// override or its fallback may have run the other mode.
bool RanProbe(std::optional<Decision> decided, Mode ran) {
  return decided.has_value() && decided->reason == Reason::kProbe && decided->mode == ran;
}

// Whether a sample that ran `ran` was forced: the mode a forced reason decided (a pin, the
// memory gate), or SP for a TP-only decision on a step that was not a fallback's — the
// worker's own memory gate, its only override (docs/design.md §4), runs SP where TP-only
// does not fit. Its step after a switch measures no switch cost (ObserveAfterSwitch).
bool RanForced(std::optional<Decision> decided, Mode ran, bool fallback) {
  if (!decided.has_value()) return false;
  if (decided->mode == ran) return IsForcedReason(decided->reason);
  return ran == Mode::kSequenceParallel && !fallback;
}

// Whether a record timed the collectives a straggler's delay is read from in `mode`: SP's
// reduce-scatter, TP-only's all-reduce (ThroughputTable::StragglersKnown).
bool TimedCollectives(Mode mode, double rs_wait, double all_reduce) {
  return mode == Mode::kTensorParallelOnly ? all_reduce > 0 : rs_wait > 0;
}

}  // namespace

void gate_state_internal::PendingStep::FoldMicrobatches(
    std::span<const MicrobatchTelemetryValues> records, bool group_record, size_t group_size) {
  if (microbatches.empty()) microbatches.resize(records.size());
  // A group whose size changed with a step pending (a re-seated rank) keeps no more.
  const bool keep_busy = !group_record && !busy.empty() &&
                         records.size() * group_size <= kMaxStragglerBusyValues &&
                         (microbatch_busy.empty() || BusyStride() == group_size);
  const size_t column = microbatch_columns;
  if (keep_busy && microbatch_busy.empty()) microbatch_busy.assign(records.size() * group_size, 0);
  if (keep_busy && column < group_size) ++microbatch_columns;
  for (const MicrobatchTelemetryValues& m : records) {
    MicrobatchTelemetryValues& a = microbatches[static_cast<size_t>(m.id)];
    a.id = m.id;
    a.mode = m.mode;
    a.forward_s = std::max(a.forward_s, m.forward_s);
    a.backward_s = std::max(a.backward_s, m.backward_s);
    a.rs_wait_s = std::max(a.rs_wait_s, m.rs_wait_s);
    a.all_gather_s = std::max(a.all_gather_s, m.all_gather_s);
    a.all_reduce_s = std::max(a.all_reduce_s, m.all_reduce_s);
    a.effective_tokens = std::max(a.effective_tokens, m.effective_tokens);
    if (group_record) a.straggler_s = m.straggler_s;
    if (keep_busy && column < group_size) {
      microbatch_busy[static_cast<size_t>(m.id) * group_size + column] =
          BusySeconds(m.compute_s(), m.rs_wait_s, m.all_gather_s, 0, m.all_reduce_s);
    }
  }
}

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
void GateState::LearnFromStep(Job& job, Group& g, int slot, absl::Time now) {
  PendingStep& p = g.pending[slot];
  const GateConfig& config = g.schedule.At(p.step).config;
  // One unit of learning: a plain step, or one micro-batch of a step plan on its stage. A
  // plain step's one needs no allocation.
  absl::InlinedVector<GroupStepSample, 1> samples;
  ThroughputTable* table = &job.learned;
  int stage = -1;
  if (!p.microbatches.empty() && job.layout.has_value()) {
    const gate_state_internal::CachedStepPlan* plan = g.CachedPlan(p.step);
    if (plan != nullptr && plan->bands.size() == p.microbatches.size()) {
      stage = CoordinatesOf(*job.layout, g.index).stage;
      table = &job.stage_learned[static_cast<size_t>(stage)];
      samples.reserve(p.microbatches.size());
      // Rank records: a micro-batch's delay is known once every rank's compute is in.
      const size_t stride = p.BusyStride();
      const bool every_rank = stride == static_cast<size_t>(g.size) &&
                              p.microbatch_columns == stride &&
                              p.microbatch_busy.size() >= p.microbatches.size() * stride;
      for (const MicrobatchTelemetryValues& m : p.microbatches) {  // by id (FoldTelemetry)
        const auto id = static_cast<size_t>(m.id);
        const int band = plan->bands[id];
        double delay = m.straggler_s;  // a group record's
        if (!p.busy.empty()) {
          delay = every_rank ? StragglerSeconds(std::span<double>(p.microbatch_busy)
                                                    .subspan(id * stride, stride))
                             : -1;  // a rank missing, or past kMaxStragglerBusyValues
        }
        const std::optional<Decision> decided =
            id < plan->packed.size() ? UnpackModeReason(plan->packed[id]) : std::nullopt;
        samples.push_back({.band = band, .mode = m.mode,
                           .tokens = static_cast<double>(m.effective_tokens),
                           .seconds = m.compute_s(),
                           .length_cv = band < 0 ? -1 : BandCvMidpoint(config, band),
                           .all_gather_s = m.all_gather_s, .rs_wait_s = m.rs_wait_s,
                           .probe = RanProbe(decided, m.mode),
                           .forced = RanForced(decided, m.mode, p.fallback),
                           .straggler_s = delay,
                           .timed = TimedCollectives(m.mode, m.rs_wait_s, m.all_reduce_s)});
      }
    }
    std::vector<MicrobatchTelemetryValues>().swap(p.microbatches);  // the slot's bytes go
    std::vector<double>().swap(p.microbatch_busy);
    p.microbatch_columns = 0;
  } else if (const gate_state_internal::CachedDecision* d = g.Cached(p.step);
             d != nullptr && d->band >= 0) {
    // The group record's all-gather seconds and its largest wait share (docs/design.md §2).
    const Decision decided{static_cast<Mode>(d->mode), static_cast<Reason>(d->reason)};
    samples.push_back({.band = d->band, .mode = p.mode,
                       .tokens = static_cast<double>(p.tokens), .seconds = p.step_time,
                       .length_cv = d->length_cv, .all_gather_s = p.all_gather,
                       .rs_wait_s = p.rs_share * p.step_time,
                       .probe = RanProbe(decided, p.mode),
                       .forced = RanForced(decided, p.mode, p.fallback),
                       // rank records: known once every rank's is in
                       .straggler_s = p.straggler >= 0 ? p.straggler
                                      : p.busy.size() == static_cast<size_t>(g.size)
                                          ? StragglerSeconds(p.busy)
                                          : -1,
                       .timed = TimedCollectives(p.mode, p.rs_share, p.all_reduce)});
  }
  if (samples.empty()) return;

  static_assert(2 * kBands <= 64, "a step's touched cells fit a 64-bit mask");
  uint64_t touched = 0;
  std::optional<Mode> previous;
  bool previous_probe = false;
  if (g.learned_step == p.step - 1) {
    previous = g.learned_mode;
    previous_probe = g.learned_probe;
  }
  for (GroupStepSample& x : samples) {
    x.step = p.step;
    x.after_switch = previous.has_value() && *previous != x.mode;
    x.exploration = ExplorationSwitch(x.after_switch, x.probe, previous_probe);
    previous = x.mode;
    previous_probe = x.probe;
    if (x.band < 0) continue;
    bool straggler = false;
    if (ObserveGroupStep(config, *table, x, /*prior=*/true, &straggler) && stage < 0) {
      // The job's gauge is the plain table's; a stage's cost shows in GetJob's tables.
      job.metrics->adaptive_switch_cost->Set(table->SwitchCostSeconds());
    }
    if (straggler) job.metrics->adaptive_straggler_steps->Increment();
    // A cell exploration's step did not enter (ObserveAfterSwitch) may still be empty.
    if (table->cell(x.band, x.mode).last_step < 0) continue;
    touched |= uint64_t{1} << (x.band * 2 + (x.mode == Mode::kTensorParallelOnly ? 1 : 0));
  }
  g.learned_step = p.step;
  g.learned_mode = *previous;
  g.learned_probe = previous_probe;
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
                          : job.stage_learned_told[static_cast<size_t>(stage)],
                now);
    job.learned_dirty = true;  // written by the sweep thread (PersistLearned)
    job.learned_fold_time = now;
  }
}

// After a table learned: the leaders are due a push when a band's preference changed, a
// change was detected (the fallback explores after it too) or the prior's choice for a
// band without samples changed (checked at most once per push interval: a fit is a
// microsecond or two), and a detected change is counted.
void GateState::NoteLearned(Job& job, const ThroughputTable& table, const GateConfig& config,
                            gate_state_internal::LearnedTold& told, absl::Time now) {
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
                                     std::vector<LearnedPush>* pushes, absl::Time now) {
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

// --- Learned tables across launches and restarts (server/learned_store.h) ---

namespace spgate::server {

void GateState::PersistFailed(absl::string_view what) const {
  if (options_.on_persist_failure) {
    options_.on_persist_failure(what);
    return;
  }
  metrics_.state_persist_failures.Increment();
  LogLine(std::string(what));
}

void GateState::LogLine(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << "spgated: " << line << std::endl;
  }
}

int GateState::LoadLearned() {
  if (options_.state_dir.empty()) return 0;
  LoadedLearned loaded = LoadLearnedDir(options_.state_dir, kMaxPipelineStages, options_.max_jobs);
  for (const std::string& problem : loaded.problems) LogLine(problem);
  const int read = static_cast<int>(loaded.records.size());
  for (LearnedRecord& r : loaded.records) {
    auto it = jobs_.find(r.job_id);
    // A launch the launches file restored is the one that learned the tables: they come
    // back as they were (its steps go on where they were); any other launch's wait for
    // their job's next launch.
    if (it != jobs_.end() && !it->second->incarnation.empty() &&
        it->second->incarnation == r.incarnation) {
      InstallLearned(*it->second, std::move(r), /*age_steps=*/0);
    } else {
      const std::string id = r.job_id;
      kept_learned_[id] = KeptLearned{std::move(r), /*dirty=*/false};
    }
  }
  return read;
}

void GateState::InstallLearned(Job& job, LearnedRecord r, double age_steps) {
  const GateConfig& config = job.op.effective;
  job.learned = AgeLearned(config, r.table, age_steps);
  job.learned_cv_band_width = r.cv_band_width;
  job.learned_tokens_band_base = r.tokens_band_base;
  if (r.key.layout.has_value()) {
    job.layout = r.key.layout;
    job.stage_learned.clear();
    for (const ThroughputTable& t : r.stage_tables) {
      job.stage_learned.push_back(AgeLearned(config, t, age_steps));
    }
    job.stage_learned_told.assign(job.stage_learned.size(), gate_state_internal::LearnedTold{});
  }
  job.learned_key = r.key;
  job.learned_fold_time = r.fold_time;
  job.learned_step_seconds = r.step_seconds;
  job.learned_dirty = age_steps > 0;  // an aged table differs from its file
  job.learned_push_due = true;        // the leaders get it as their streams attach
  // The gauges, as if the tables had been learned here (a stage's at its newest step).
  for (int band = 0; band < kBands; ++band) {
    for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      if (const CellView v = job.learned.At(config, band, mode, job.learned.newest_step());
          v.samples > 0) {
        job.metrics->SetLearned(band, mode, v.tokens_per_s, v.samples);
      }
      for (size_t s = 0; s < job.stage_learned.size(); ++s) {
        const ThroughputTable& t = job.stage_learned[s];
        if (const CellView v = t.At(config, band, mode, t.newest_step()); v.samples > 0) {
          job.metrics->SetStageLearned(static_cast<int>(s), band, mode, v.tokens_per_s);
        }
      }
    }
  }
}

LearnedRecord GateState::RecordOf(const Job& job) const {
  LearnedRecord r;
  r.job_id = job.id;
  r.incarnation = job.incarnation;
  r.key = *job.learned_key;
  r.fold_time = job.learned_fold_time == absl::InfinitePast() ? Now() : job.learned_fold_time;
  // The job's mean step time over the launch's group-steps in this daemon's life, else
  // what it was when the tables came back.
  double seconds = 0;
  int64_t steps = 0;
  for (const gate_state_internal::ModeWindow& w : job.modes) {
    seconds += w.step_seconds;
    steps += w.group_steps;
  }
  r.step_seconds = steps > 0 && seconds > 0 ? seconds / static_cast<double>(steps)
                                            : job.learned_step_seconds;
  r.cv_band_width = job.learned_cv_band_width;
  r.tokens_band_base = job.learned_tokens_band_base;
  r.table = job.learned;
  if (job.layout.has_value()) r.stage_tables = job.stage_learned;
  return r;
}

// A launch's tables outlive it in memory (and on disk): the job's next launch may adopt
// them. Called before its live state is dropped (a new launch, an idle job).
void GateState::StashLearned(Job& job) {
  const bool any = !job.learned.empty() ||
                   std::any_of(job.stage_learned.begin(), job.stage_learned.end(),
                               [](const ThroughputTable& t) { return !t.empty(); });
  if (job.learned_key.has_value() && any && !job.incarnation.empty()) {
    if (static_cast<int>(kept_learned_.size()) >= options_.max_jobs &&
        !kept_learned_.contains(job.id)) {
      // Room for it: the one folded longest ago goes (its file stays on disk).
      auto oldest = std::min_element(kept_learned_.begin(), kept_learned_.end(),
                                     [](const auto& a, const auto& b) {
                                       return a.second.record.fold_time < b.second.record.fold_time;
                                     });
      kept_learned_.erase(oldest);
    }
    kept_learned_[job.id] = KeptLearned{RecordOf(job), job.learned_dirty};
  }
  job.learned_key.reset();
  job.learned_fold_time = absl::InfinitePast();
  job.learned_step_seconds = 0;
  job.learned_dirty = false;
  job.learned_restamp = false;
}

// The launch's first registrant sets what the launch declared; the job's kept tables
// are adopted when they were learned under the same declaration, else dropped (the
// launch starts cold and its own tables replace the file). Adopted tables are aged by
// the steps the job could have run since their last fold — the wall-clock gap over the
// job's mean step time, since a relaunch's step counter rewinds to its checkpoint or
// starts at 0 — and restamped at the launch's first decided step (RestampLearnedAt).
void GateState::AdoptLearned(Job& job, const RegisterInput& r) {
  job.learned_key = LearnedKey{r.layout, r.prior_inputs, r.hardware_id};
  auto it = kept_learned_.find(job.id);
  if (it == kept_learned_.end()) return;
  LearnedRecord kept = std::move(it->second.record);
  kept_learned_.erase(it);
  if (kept.key != *job.learned_key) return;
  const bool same_launch = kept.incarnation == job.incarnation;
  const double gap_s = std::max(0.0, absl::ToDoubleSeconds(Now() - kept.fold_time));
  const double age = same_launch || !(kept.step_seconds > 0)
                         ? 0.0
                         : std::min(gap_s / kept.step_seconds, 1e12);
  const PriorInputs declared = job.learned.prior_inputs();
  InstallLearned(job, std::move(kept), age);
  if (age > 0) job.learned_fold_time = Now();  // aged to now: a later relaunch ages from here
  job.learned.SetPriorInputs(declared);
  for (ThroughputTable& t : job.stage_learned) t.SetPriorInputs(declared);
  job.learned_restamp = !same_launch;
}

void GateState::RestampLearnedAt(Job& job, const GateConfig& config, int64_t step) {
  job.learned_restamp = false;
  job.learned = RestampLearned(config, job.learned, step);
  for (ThroughputTable& t : job.stage_learned) t = RestampLearned(config, t, step);
}

void GateState::PersistLearned(bool all) {
  if (options_.state_dir.empty() || options_.read_only_state_dir) return;
  MutexLock io(&learned_io_mu_);
  std::vector<LearnedRecord> due;
  {
    MutexLock lock(&mu_);
    const absl::Time now = Now();
    for (auto& [id, job] : jobs_) {
      if (!job->learned_dirty || !job->learned_key.has_value() || job->incarnation.empty()) {
        continue;
      }
      if (!all && now - job->learned_saved < options_.learned_persist_interval) continue;
      due.push_back(RecordOf(*job));
      job->learned_dirty = false;
      job->learned_saved = now;
    }
    for (auto& [id, kept] : kept_learned_) {  // a retry waits the interval too
      if (!kept.dirty || (!all && now - kept.saved < options_.learned_persist_interval)) {
        continue;
      }
      due.push_back(kept.record);
      kept.dirty = false;
      kept.saved = now;
    }
  }
  for (const LearnedRecord& r : due) {
    absl::Status s = SaveLearned(options_.state_dir, r, kMaxPipelineStages);
    if (s.ok()) continue;
    PersistFailed(absl::StrCat("learned tables of job ", r.job_id, " not written (tried again "
                               "after --learned_persist_interval): ", s.message()));
    MutexLock lock(&mu_);
    if (auto it = jobs_.find(r.job_id);
        it != jobs_.end() && it->second->incarnation == r.incarnation) {
      it->second->learned_dirty = true;
    } else if (auto kit = kept_learned_.find(r.job_id); kit != kept_learned_.end()) {
      kit->second.dirty = true;
    }
  }
}

}  // namespace spgate::server
