// Builds the docs/design.md §7 families once and hands out cached children.
#include "server/metrics.h"

#include <algorithm>

#include "common/version.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_config.h"

namespace spgate::server {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

namespace {

Histogram::BucketBoundaries CvBuckets() {
  return {0.02, 0.05, 0.1, 0.15, 0.18, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0};
}
// Step times from 5 ms to 100 s, ten edges a decade (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8):
// neighbours at most 4/3 apart, so a quantile is read to within one such bucket (the
// 1-2.5-5 ladder's were up to 2.5x wide: two modes whose steps averaged 0.122 s and
// 0.158 s both read a p95 of 0.24 s). 44 buckets a job and mode.
Histogram::BucketBoundaries StepBuckets() {
  return {0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06,
          0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.25, 1.5, 2,
          2.5, 3, 4, 5, 6, 8, 10, 12.5, 15, 20, 25, 30, 40, 50, 60, 80, 100};
}
Histogram::BucketBoundaries LatencyBuckets() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1};
}

// The `mode` label of a mode slot (policy/types.h: index = static_cast<int>(Mode)).
std::string ModeText(int mode) { return std::string(ModeLabel(static_cast<Mode>(mode))); }

std::string PolicyLabel(GatePolicyKind kind) {
  return kind == GatePolicyKind::kAdaptive ? "adaptive" : "static";
}

void SetPolicy(const std::array<prometheus::Gauge*, 3>& gauges, GatePolicyKind kind) {
  for (int k = 1; k < 3; ++k) {
    if (gauges[k] != nullptr) gauges[k]->Set(k == static_cast<int>(kind) ? 1.0 : 0.0);
  }
}

}  // namespace

std::string_view SpgateVersion() { return kVersion; }

std::string_view LimitLabel(Limit limit) {
  switch (limit) {
    case Limit::kJobs: return "jobs";
    case Limit::kSessionsPerJob: return "sessions_per_job";
    case Limit::kGroupsPerJob: return "groups_per_job";
    case Limit::kSequencesPerPlan: return "sequences_per_plan";
    case Limit::kPlanRate: return "plan_rate";
    case Limit::kTelemetryRate: return "telemetry_rate";
    case Limit::kStreams: return "streams";
    case Limit::kWatchStreams: return "watch_streams";
    case Limit::kItemsPerMessage: return "items_per_message";
    case Limit::kFirstMessage: return "first_message";
  }
  return "unknown";
}

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      decisions_f(BuildCounter().Name("spgate_decisions_total")
                      .Help("Decisions sent to TP groups, by mode and reason: one per "
                            "micro-batch of a step plan (a plain plan's group-step is one).")
                      .Register(*registry_)),
      local_decisions_f(BuildCounter().Name("spgate_worker_local_decisions_total")
                            .Help("Decisions workers made with their local policy (daemon late "
                                  "or unreachable), reported after reconnect; reason is what the "
                                  "local policy decided.")
                            .Register(*registry_)),
      memory_overrides_f(BuildCounter().Name("spgate_worker_memory_overrides_total")
                             .Help("Daemon answers workers did not run because their own "
                                   "memory gate forbade TP-only for the plan answered (they "
                                   "ran SP); reported in heartbeats. Never expected: a "
                                   "config mismatch, a daemon bug or a forged answer.")
                             .Register(*registry_)),
      hardware_id_mismatches_f(
          BuildCounter().Name("spgate_hardware_id_mismatches_total")
              .Help("Ranks that registered with another hardware_id than their launch's "
                    "first rank (accepted; the first rank's keys the learned table).")
              .Register(*registry_)),
      length_cv_f(BuildHistogram().Name("spgate_batch_length_cv")
                      .Help("Coefficient of variation of sequence lengths per decision "
                            "(a plain plan's batch, a step plan's micro-batch).")
                      .Register(*registry_)),
      rs_wait_f(BuildGauge().Name("spgate_rs_wait_share")
                    .Help("Rolling mean over SP steps of the group's reduce-scatter wait share "
                          "(max over ranks of reduce-scatter time / step time).")
                    .Register(*registry_)),
      all_gather_f(BuildGauge().Name("spgate_all_gather_tail_seconds")
                       .Help("Rolling p95 of the per-step all-gather time of the slowest rank.")
                       .Register(*registry_)),
      slowest_rank_f(BuildGauge().Name("spgate_slowest_rank")
                         .Help("rank_in_group of the group's slowest rank in its last complete "
                               "step: the most step time outside its collective waits.")
                         .Register(*registry_)),
      stage_peak_f(BuildGauge().Name("spgate_stage_predicted_peak_bytes")
                       .Help("A pipelined job's stage: the largest predicted peak over the "
                             "step of its TP groups' last step plans, in the modes decided.")
                       .Register(*registry_)),
      stage_tp_only_f(BuildGauge().Name("spgate_stage_tp_only_share")
                          .Help("A pipelined job's stage: the share of its TP groups' last "
                                "step plans' micro-batches decided TP-only.")
                          .Register(*registry_)),
      stage_adaptive_rate_f(
          BuildGauge().Name("spgate_stage_adaptive_tokens_per_second")
              .Help("A pipelined job's stage: learned effective tokens/s of one TP group "
                    "in a mode and a band, from its micro-batches' compute on the stage, "
                    "pooled over its groups.")
              .Register(*registry_)),
      norm_stall_f(BuildGauge().Name("spgate_norm_stall_ratio")
                       .Help("Rolling mean of the share of step time spent in collectives that "
                             "exist only because LayerNorm crossed the shard boundary.")
                       .Register(*registry_)),
      step_duration_f(BuildHistogram().Name("spgate_step_duration_seconds")
                          .Help("Group-step wall time (the group's slowest rank), one "
                                "sample per group-step, by the mode of its record (a "
                                "pipelined stage's: SP when any micro-batch ran SP).")
                          .Register(*registry_)),
      effective_tokens_f(BuildCounter().Name("spgate_effective_tokens_total")
                             .Help("Non-padding tokens processed, summed over the job's TP "
                                   "groups (its rate is the job's tokens/s; every stage of "
                                   "a pipelined job counts its micro-batches), by the mode "
                                   "of the group-step's record.")
                             .Register(*registry_)),
      padding_tokens_f(BuildCounter().Name("spgate_padding_tokens_total")
                           .Help("Padding tokens processed, summed over the job's TP "
                                 "groups, by the mode of the group-step's record.")
                           .Register(*registry_)),
      peak_memory_f(BuildGauge().Name("spgate_peak_memory_bytes")
                        .Help("Largest group-step peak device memory (max over ranks) "
                              "over the group-steps in the job's MODES window of that mode "
                              "(its last 512 micro-batches; a plain plan's group-step is "
                              "one).")
                        .Register(*registry_)),
      memory_budget_f(BuildGauge().Name("spgate_memory_budget_bytes")
                          .Help("Device memory budget the job's workers report.")
                          .Register(*registry_)),
      current_mode_f(BuildGauge().Name("spgate_current_mode")
                         .Help("1 for the mode the group's latest decision chose, else 0.")
                         .Register(*registry_)),
      mode_switches_f(BuildCounter().Name("spgate_mode_switches_total")
                          .Help("Times a group's decided mode changed from one decision "
                                "to the next (a step plan's: micro-batch to micro-batch).")
                          .Register(*registry_)),
      gate_threshold_f(BuildGauge().Name("spgate_gate_threshold")
                           .Help("Effective gate thresholds; job_id=\"_default\" is the global "
                                 "default.")
                           .Register(*registry_)),
      config_version_f(BuildGauge().Name("spgate_config_version")
                           .Help("Version of the effective gate config.")
                           .Register(*registry_)),
      config_updates_f(BuildCounter().Name("spgate_config_updates_total")
                           .Help("Gate config updates and rollbacks, by result.")
                           .Register(*registry_)),
      workers_f(BuildGauge().Name("spgate_workers")
                    .Help("Registered worker ranks by state (stale: no message within "
                          "--stale_after).")
                    .Register(*registry_)),
      decision_latency_f(BuildHistogram().Name("spgate_decision_latency_seconds")
                             .Help("Time from a batch plan's arrival to its decision being sent.")
                             .Register(*registry_)),
      persist_failures_f(BuildCounter().Name("spgate_state_persist_failures_total")
                             .Help("Failed writes to --state_dir: the state file, the launches file, the "
                                   "learned tables; each is logged naming the file.")
                             .Register(*registry_)),
      reload_ok_f(BuildGauge().Name("spgate_config_last_reload_successful")
                      .Help("1 if the last load of --config succeeded, else 0.")
                      .Register(*registry_)),
      build_info_f(BuildGauge().Name("spgate_build_info")
                       .Help("Always 1; the version label is the build.")
                       .Register(*registry_)),
      telemetry_f(BuildCounter().Name("spgate_telemetry_records_total")
                      .Help("Step telemetry records received, by result.")
                      .Register(*registry_)),
      watch_dropped_f(BuildCounter().Name("spgate_watch_dropped_decisions_total")
                          .Help("Decisions not delivered to a WatchDecisions stream that fell "
                                "behind.")
                          .Register(*registry_)),
      worker_refusals_f(BuildCounter().Name("spgate_worker_refusals_total")
                            .Help("Worker requests refused for their sender: a session of a "
                                  "replaced incarnation, a new launch while the job's live one "
                                  "runs, a wrong launch credential, a plan from a non-leader, a "
                                  "plan too far ahead of its group, another plan for a decided "
                                  "step, telemetry for an undecided step, an unknown session.")
                            .Register(*registry_)),
      admin_refusals_f(BuildCounter().Name("spgate_admin_refusals_total")
                           .Help("Admin API calls refused for their sender: without a "
                                 "credential (unauthenticated), or with one that matches none "
                                 "or whose role is too low for the call (denied).")
                           .Register(*registry_)),
      gate_policy_f(BuildGauge().Name("spgate_gate_policy")
                        .Help("1 for the policy in force (static, adaptive), else 0; "
                              "job_id=\"_default\" is the global default.")
                        .Register(*registry_)),
      adaptive_rate_f(BuildGauge().Name("spgate_adaptive_tokens_per_second")
                          .Help("Learned effective tokens/s of one TP group (not the job's "
                                "sum) in a mode and a band of (length CV, tokens), pooled "
                                "over the job's groups.")
                          .Register(*registry_)),
      adaptive_samples_f(BuildGauge().Name("spgate_adaptive_samples")
                             .Help("Forgetting-weighted samples behind each learned estimate.")
                             .Register(*registry_)),
      exploration_f(BuildCounter().Name("spgate_adaptive_exploration_steps_total")
                        .Help("ADAPTIVE decisions that ran a mode to measure it (reason "
                              "probe): the mode not chosen, or a held group's mode it is "
                              "kept off; group-steps, and a step plan's micro-batches.")
                        .Register(*registry_)),
      adaptive_gain_f(BuildGauge().Name("spgate_adaptive_gain_ratio")
                          .Help("Learned throughput of the ADAPTIVE choices over that of the "
                                "STATIC gates' choices for the same batches; 0 until a band "
                                "has decided.")
                          .Register(*registry_)),
      flips_held_f(BuildCounter().Name("spgate_adaptive_flips_held_total")
                       .Help("ADAPTIVE decisions that kept the group's mode although the "
                             "batch's choice was the other: the flip cap had no switch left, "
                             "or the switch would not pay for its learned cost.")
                       .Register(*registry_)),
      adaptive_changes_f(BuildCounter().Name("spgate_adaptive_changes_total")
                             .Help("Changes ADAPTIVE detected in its learned table (a mode's "
                                   "recent tokens/s off its estimate, a band back after a "
                                   "half-life): each raises exploration in the band.")
                             .Register(*registry_)),
      adaptive_straggler_steps_f(
          BuildCounter().Name("spgate_adaptive_straggler_steps_total")
              .Help("Steps (a step plan's micro-batches) ADAPTIVE's table did not learn "
                    "from: the slowest rank was busy beyond the median rank by more than "
                    "adaptive_straggler_share of the step.")
              .Register(*registry_)),
      switch_cost_f(BuildGauge().Name("spgate_adaptive_switch_cost_seconds")
                        .Help("Learned seconds the first step after a mode switch takes beyond "
                              "its band's estimate; ADAPTIVE's switches must save more.")
                        .Register(*registry_)),
      limit_refusals_f(BuildCounter().Name("spgate_limit_refusals_total")
                           .Help("Requests refused because a limit (a spgated flag) was "
                                 "reached, by limit.")
                           .Register(*registry_)),
      config_updates_ok(config_updates_f.Add({{"result", "ok"}})),
      config_updates_invalid(config_updates_f.Add({{"result", "invalid"}})),
      config_updates_conflict(config_updates_f.Add({{"result", "conflict"}})),
      config_updates_denied(config_updates_f.Add({{"result", "denied"}})),
      config_updates_unavailable(config_updates_f.Add({{"result", "unavailable"}})),
      decision_latency(decision_latency_f.Add({}, LatencyBuckets())),
      state_persist_failures(persist_failures_f.Add({})),
      config_last_reload_successful(reload_ok_f.Add({})),
      telemetry_received(telemetry_f.Add({{"result", "accepted"}})),
      telemetry_rejected(telemetry_f.Add({{"result", "rejected"}})),
      watch_dropped(watch_dropped_f.Add({})),
      refused_stale_incarnation(worker_refusals_f.Add({{"reason", "stale_incarnation"}})),
      refused_live_incarnation(worker_refusals_f.Add({{"reason", "live_incarnation"}})),
      refused_not_leader(worker_refusals_f.Add({{"reason", "not_leader"}})),
      refused_step_too_far(worker_refusals_f.Add({{"reason", "step_too_far"}})),
      refused_unknown_session(worker_refusals_f.Add({{"reason", "unknown_session"}})),
      refused_launch_credential(worker_refusals_f.Add({{"reason", "launch_credential"}})),
      refused_plan_mismatch(worker_refusals_f.Add({{"reason", "plan_mismatch"}})),
      refused_undecided_step(worker_refusals_f.Add({{"reason", "undecided_step"}})),
      refused_worker_credential(worker_refusals_f.Add({{"reason", "worker_credential"}})),
      admin_unauthenticated(admin_refusals_f.Add({{"reason", "unauthenticated"}})),
      admin_denied(admin_refusals_f.Add({{"reason", "denied"}})) {
  build_info_f.Add({{"version", std::string(SpgateVersion())}}).Set(1);
  config_last_reload_successful.Set(1);
  for (size_t i = 0; i < kNumGateFields; ++i) {
    if (kGateFields[i].is_choice()) continue;  // the policy: spgate_gate_policy
    global_thresholds_[i] = &gate_threshold_f.Add(
        {{"job_id", "_default"}, {"gate", std::string(kGateFields[i].name)}});
  }
  for (GatePolicyKind k : {GatePolicyKind::kStatic, GatePolicyKind::kAdaptive}) {
    global_policy_[static_cast<int>(k)] =
        &gate_policy_f.Add({{"job_id", "_default"}, {"policy", PolicyLabel(k)}});
  }
  global_version_ = &config_version_f.Add({{"job_id", "_default"}});
  for (int i = 0; i < kNumLimits; ++i) {
    limit_refusals_[i] =
        &limit_refusals_f.Add({{"limit", std::string(LimitLabel(static_cast<Limit>(i)))}});
  }
}

void Metrics::SetGlobalThresholds(const GateConfig& config, int64_t version) {
  for (size_t i = 0; i < kNumGateFields; ++i) {
    if (global_thresholds_[i] != nullptr) {
      global_thresholds_[i]->Set(GateFieldValue(config, kGateFields[i]));
    }
  }
  SetPolicy(global_policy_, config.policy);
  global_version_->Set(static_cast<double>(version));
}

JobMetrics::JobMetrics(Metrics& m, const std::string& job_id) : m_(m), job_id_(job_id) {
  length_cv = &m.length_cv_f.Add({{"job_id", job_id}}, CvBuckets());
  for (int mode = 1; mode < kModeSlots; ++mode) {
    const prometheus::Labels l = {{"job_id", job_id}, {"mode", ModeText(mode)}};
    step_duration[mode] = &m.step_duration_f.Add(l, StepBuckets());
    effective_tokens[mode] = &m.effective_tokens_f.Add(l);
    padding_tokens[mode] = &m.padding_tokens_f.Add(l);
    peak_memory[mode] = &m.peak_memory_f.Add(l);
  }
  memory_budget = &m.memory_budget_f.Add({{"job_id", job_id}});
  workers_active = &m.workers_f.Add({{"job_id", job_id}, {"state", "active"}});
  workers_stale = &m.workers_f.Add({{"job_id", job_id}, {"state", "stale"}});
  for (size_t i = 0; i < kNumGateFields; ++i) {
    if (kGateFields[i].is_choice()) continue;
    thresholds_[i] =
        &m.gate_threshold_f.Add({{"job_id", job_id}, {"gate", std::string(kGateFields[i].name)}});
  }
  for (GatePolicyKind k : {GatePolicyKind::kStatic, GatePolicyKind::kAdaptive}) {
    policy_[static_cast<int>(k)] =
        &m.gate_policy_f.Add({{"job_id", job_id}, {"policy", PolicyLabel(k)}});
  }
  exploration_steps = &m.exploration_f.Add({{"job_id", job_id}});
  memory_overrides = &m.memory_overrides_f.Add({{"job_id", job_id}});
  hardware_id_mismatches = &m.hardware_id_mismatches_f.Add({{"job_id", job_id}});
  adaptive_gain = &m.adaptive_gain_f.Add({{"job_id", job_id}});
  flips_held = &m.flips_held_f.Add({{"job_id", job_id}});
  adaptive_changes = &m.adaptive_changes_f.Add({{"job_id", job_id}});
  adaptive_straggler_steps = &m.adaptive_straggler_steps_f.Add({{"job_id", job_id}});
  adaptive_switch_cost = &m.switch_cost_f.Add({{"job_id", job_id}});
  config_version_ = &m.config_version_f.Add({{"job_id", job_id}});
  // Counters whose label set is known up front start at 0, so rate() over them is 0
  // rather than empty and a panel shows 0 rather than "No data". Local decisions carry
  // the local policy's reason (never CONTROLLER_UNAVAILABLE).
  for (int r = 1; r < kNumReasons; ++r) {
    if (static_cast<Reason>(r) != Reason::kControllerUnavailable) {
      LocalDecisions(static_cast<Reason>(r));
    }
  }
}

JobMetrics::~JobMetrics() {
  RemoveStages();
  m_.length_cv_f.Remove(length_cv);
  for (int mode = 1; mode < kModeSlots; ++mode) {
    m_.step_duration_f.Remove(step_duration[mode]);
    m_.effective_tokens_f.Remove(effective_tokens[mode]);
    m_.padding_tokens_f.Remove(padding_tokens[mode]);
    m_.peak_memory_f.Remove(peak_memory[mode]);
    for (auto* c : decisions_[mode]) {
      if (c != nullptr) m_.decisions_f.Remove(c);
    }
  }
  for (auto* c : local_) {
    if (c != nullptr) m_.local_decisions_f.Remove(c);
  }
  m_.memory_budget_f.Remove(memory_budget);
  m_.memory_overrides_f.Remove(memory_overrides);
  m_.hardware_id_mismatches_f.Remove(hardware_id_mismatches);
  m_.workers_f.Remove(workers_active);
  m_.workers_f.Remove(workers_stale);
  for (auto* g : thresholds_) {
    if (g != nullptr) m_.gate_threshold_f.Remove(g);
  }
  for (auto* g : policy_) {
    if (g != nullptr) m_.gate_policy_f.Remove(g);
  }
  m_.exploration_f.Remove(exploration_steps);
  m_.adaptive_gain_f.Remove(adaptive_gain);
  m_.flips_held_f.Remove(flips_held);
  m_.adaptive_changes_f.Remove(adaptive_changes);
  m_.adaptive_straggler_steps_f.Remove(adaptive_straggler_steps);
  m_.switch_cost_f.Remove(adaptive_switch_cost);
  RemoveLearned();
  m_.config_version_f.Remove(config_version_);
}

prometheus::Counter& JobMetrics::Decisions(Mode mode, Reason reason) {
  auto& slot = decisions_[static_cast<int>(mode)][static_cast<int>(reason)];
  if (slot == nullptr) {
    slot = &m_.decisions_f.Add({{"job_id", job_id_},
                                {"mode", std::string(ModeLabel(mode))},
                                {"reason", std::string(ReasonLabel(reason))}});
  }
  return *slot;
}

prometheus::Counter& JobMetrics::LocalDecisions(Reason reason) {
  auto& slot = local_[static_cast<int>(reason)];
  if (slot == nullptr) {
    slot = &m_.local_decisions_f.Add(
        {{"job_id", job_id_}, {"reason", std::string(ReasonLabel(reason))}});
  }
  return *slot;
}

void JobMetrics::SetThresholds(const GateConfig& config, int64_t version) {
  for (size_t i = 0; i < kNumGateFields; ++i) {
    if (thresholds_[i] != nullptr) thresholds_[i]->Set(GateFieldValue(config, kGateFields[i]));
  }
  SetPolicy(policy_, config.policy);
  config_version_->Set(static_cast<double>(version));
}

void JobMetrics::RecordDecision(const DecisionSample& d, GroupMetrics& group) {
  Decisions(d.mode, d.reason).Increment();
  length_cv->Observe(d.length_cv);
  if (d.adaptive_gain.has_value()) adaptive_gain->Set(*d.adaptive_gain);
  if (d.memory_budget.has_value()) memory_budget->Set(static_cast<double>(*d.memory_budget));
  if (!d.previous_mode.has_value() || *d.previous_mode != d.mode) {
    group.SetMode(d.mode);
    if (d.previous_mode.has_value()) group.mode_switches->Increment();
  }
}

void JobMetrics::SetLearned(int band, Mode mode, double tokens_per_s, double samples) {
  if (band < 0 || band >= static_cast<int>(learned_rate_.size())) return;
  const int m = static_cast<int>(mode);
  if (learned_rate_[band][m] == nullptr) {
    const prometheus::Labels l = {{"job_id", job_id_},
                                  {"band", BandLabel(band)},
                                  {"mode", ModeText(m)}};
    learned_rate_[band][m] = &m_.adaptive_rate_f.Add(l);
    learned_samples_[band][m] = &m_.adaptive_samples_f.Add(l);
  }
  learned_rate_[band][m]->Set(tokens_per_s);
  learned_samples_[band][m]->Set(samples);
}

void JobMetrics::RemoveLearned() {
  RemoveStageLearned(nullptr);
  for (auto& row : learned_rate_) {
    for (auto*& g : row) {
      if (g != nullptr) m_.adaptive_rate_f.Remove(g);
      g = nullptr;
    }
  }
  for (auto& row : learned_samples_) {
    for (auto*& g : row) {
      if (g != nullptr) m_.adaptive_samples_f.Remove(g);
      g = nullptr;
    }
  }
}

void JobMetrics::SetStage(int stage, uint64_t predicted_peak_bytes, double tp_only_share) {
  auto [it, added] = stages_.try_emplace(stage);
  if (added) {
    const prometheus::Labels l = {{"job_id", job_id_}, {"stage", std::to_string(stage)}};
    it->second = {&m_.stage_peak_f.Add(l), &m_.stage_tp_only_f.Add(l)};
  }
  it->second.first->Set(static_cast<double>(predicted_peak_bytes));
  it->second.second->Set(tp_only_share);
}

void JobMetrics::SetStageLearned(int stage, int band, Mode mode, double tokens_per_s) {
  if (stage < 0 || band < 0 || band >= kBands) return;
  const int m = static_cast<int>(mode);
  const int64_t key = (int64_t{stage} * kBands + band) * kModeSlots + m;
  auto [it, added] = stage_learned_.try_emplace(key, nullptr);
  if (added) {
    it->second = &m_.stage_adaptive_rate_f.Add({{"job_id", job_id_},
                                                {"stage", std::to_string(stage)},
                                                {"band", BandLabel(band)},
                                                {"mode", ModeText(m)}});
  }
  it->second->Set(tokens_per_s);
}

void JobMetrics::RemoveStageLearned(const std::vector<int>* keep_stages) {
  for (auto it = stage_learned_.begin(); it != stage_learned_.end();) {
    const int stage = static_cast<int>(it->first / (int64_t{kBands} * kModeSlots));
    if (keep_stages != nullptr &&
        std::find(keep_stages->begin(), keep_stages->end(), stage) != keep_stages->end()) {
      ++it;
      continue;
    }
    m_.stage_adaptive_rate_f.Remove(it->second);
    it = stage_learned_.erase(it);
  }
}

void JobMetrics::RetainStages(const std::vector<int>& present) {
  RemoveStageLearned(&present);
  for (auto it = stages_.begin(); it != stages_.end();) {
    if (std::find(present.begin(), present.end(), it->first) != present.end()) {
      ++it;
      continue;
    }
    m_.stage_peak_f.Remove(it->second.first);
    m_.stage_tp_only_f.Remove(it->second.second);
    it = stages_.erase(it);
  }
}

void JobMetrics::RemoveStages() {
  RemoveStageLearned(nullptr);
  for (auto& [stage, gauges] : stages_) {
    m_.stage_peak_f.Remove(gauges.first);
    m_.stage_tp_only_f.Remove(gauges.second);
  }
  stages_.clear();
}

GroupMetrics::GroupMetrics(Metrics& m, const std::string& job_id, int group) : m_(m) {
  const prometheus::Labels l = {{"job_id", job_id}, {"group", std::to_string(group)}};
  rs_wait_share = &m.rs_wait_f.Add(l);
  all_gather_tail = &m.all_gather_f.Add(l);
  norm_stall_ratio = &m.norm_stall_f.Add(l);
  slowest_rank = &m.slowest_rank_f.Add(l);
  slowest_rank->Set(-1);
  mode_switches = &m.mode_switches_f.Add(l);
  for (int mode = 1; mode < kModeSlots; ++mode) {
    prometheus::Labels lm = l;
    lm["mode"] = ModeText(mode);
    current_mode_[mode] = &m.current_mode_f.Add(lm);
  }
}

GroupMetrics::~GroupMetrics() {
  m_.rs_wait_f.Remove(rs_wait_share);
  m_.all_gather_f.Remove(all_gather_tail);
  m_.norm_stall_f.Remove(norm_stall_ratio);
  m_.slowest_rank_f.Remove(slowest_rank);
  m_.mode_switches_f.Remove(mode_switches);
  for (int mode = 1; mode < kModeSlots; ++mode) m_.current_mode_f.Remove(current_mode_[mode]);
}

void GroupMetrics::SetMode(Mode mode) {
  for (int m = 1; m < kModeSlots; ++m) {
    current_mode_[m]->Set(m == static_cast<int>(mode) ? 1.0 : 0.0);
  }
}

}  // namespace spgate::server
