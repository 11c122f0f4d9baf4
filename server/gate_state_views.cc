// GateState's admin views and what-if: read-only, under the state's reader lock. See
// gate_state.h; the private structures are in gate_state_internal.h.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/job_id.h"
#include "common/status_macros.h"
#include "policy/exploration.h"
#include "server/gate_state.h"
#include "server/gate_state_internal.h"

namespace spgate::server {

using gate_state_internal::Active;
using gate_state_internal::AsDirective;
using gate_state_internal::ModeWindow;
using gate_state_internal::RollingValue;

GroupView GateState::ViewOfGroup(const Job& job, const Group& g) const {
  const absl::Time now = Now();
  GroupView out;
  out.group = g.index;
  out.group_size = g.size;
  const gate_state_internal::RankCounts ranks =
      gate_state_internal::CountRanks(g.ranks, g.size, now, options_.stale_after);
  out.ranks_active = ranks.active;
  out.ranks_stale = ranks.stale;
  out.slowest_rank = g.slowest_rank;
  out.slowest_step_time_s = g.slowest_step_time;
  if (job.layout.has_value()) {
    out.coordinates = CoordinatesOf(*job.layout, g.index);
    out.stage_peak_bytes = g.stage_peak;
    out.last_step_tp_microbatches = g.last_tp_microbatches;
  }
  out.peak_memory_rank = g.peak_rank;
  out.group_session = g.group_session;
  const GroupGateState& gate = g.policy.gate();
  out.has_decision = gate.has_decision;
  if (gate.has_decision) {
    out.mode = gate.mode;
    out.reason = gate.reason;
    out.last_step = gate.last_step;
  }
  out.rolling_rs_wait_share = RollingValue(g.policy.rs_wait());
  out.all_gather_tail_s = g.all_gather.Quantile(0.95);
  out.norm_stall_ratio = g.norm_stall.Mean();
  out.rs_wait_fallback = gate.rs_wait_fallback;
  out.mode_switches = gate.mode_switches;
  // The pin that holds the group: its own, else the job's (its group unset).
  if (auto it = job.op.group_pins.find(g.index);
      it != job.op.group_pins.end() && it->second.expire > now) {
    out.pin = PinView{job.id, g.index, it->second.mode, it->second.expire, it->second.force};
  } else if (Active(job.op.pin, now)) {
    out.pin = PinView{job.id, std::nullopt, job.op.pin->mode, job.op.pin->expire,
                      job.op.pin->force};
  }
  return out;
}

JobSummaryView GateState::SummaryOf(const Job& job) const {
  JobSummaryView s;
  s.job_id = job.id;
  s.incarnation = job.incarnation;
  s.groups = static_cast<int>(job.groups.size());
  for (int m = 1; m < kModeSlots; ++m) {
    for (int r = 0; r < kNumReasons; ++r) s.steps_decided += job.decisions[m][r];
  }
  s.group_steps_decided = job.group_steps_decided;
  for (const auto& [gi, g] : job.groups) {
    const GroupView v = ViewOfGroup(job, *g);
    s.ranks_active += v.ranks_active;
    s.ranks_stale += v.ranks_stale;
    if (v.has_decision) ++(v.mode == Mode::kSequenceParallel ? s.sp_groups : s.tp_groups);
  }
  s.config_version = job.op.effective_version;
  if (job.learned_key.has_value()) s.hardware_id = job.learned_key->hardware_id;
  return s;
}

std::vector<JobSummaryView> GateState::ListJobs() const {
  ReaderMutexLock lock(&mu_);
  std::vector<JobSummaryView> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) out.push_back(SummaryOf(*job));
  std::sort(out.begin(), out.end(),
            [](const JobSummaryView& a, const JobSummaryView& b) { return a.job_id < b.job_id; });
  return out;
}

absl::StatusOr<JobView> GateState::GetJob(const std::string& job_id) const {
  RETURN_IF_ERROR(ValidateJobId(job_id));  // a malformed id is not merely unknown
  ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* found, FindJob(job_id, std::nullopt));
  const Job& job = *found;
  JobView out;
  out.summary = SummaryOf(job);
  out.layout = job.layout;
  out.sp_required = job.sp_required;
  for (const auto& [gi, g] : job.groups) out.groups.push_back(ViewOfGroup(job, *g));
  // Per micro-batch (a plain plan's step is its one): tokens/s is one group's, its tokens
  // over its seconds — a step's time, or a micro-batch's compute on its stage.
  const ModeWindow& tp = job.modes[static_cast<int>(Mode::kTensorParallelOnly)];
  const double tp_tps = tp.seconds.Sum() > 0 ? tp.tokens.Sum() / tp.seconds.Sum() : 0;
  const double tp_p95 = tp.seconds.Quantile(0.95);
  const double tp_peak = tp.peak.Max();
  for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const ModeWindow& w = job.modes[static_cast<int>(mode)];
    ModeStatsView ms;
    ms.mode = mode;
    ms.microbatches = w.seconds.size();
    ms.steps = w.StepsInWindow();
    ms.effective_tokens_per_s = w.seconds.Sum() > 0 ? w.tokens.Sum() / w.seconds.Sum() : 0;
    ms.step_time_p95_s = w.seconds.Quantile(0.95);
    ms.peak_memory_bytes = static_cast<uint64_t>(std::max(0.0, w.peak.Max()));
    if (!tp.seconds.empty() && !w.seconds.empty()) {
      ms.compared_to_tp = true;
      ms.tokens_per_s_vs_tp = tp_tps > 0 ? ms.effective_tokens_per_s / tp_tps : 0;
      ms.step_time_p95_vs_tp = tp_p95 > 0 ? ms.step_time_p95_s / tp_p95 : 0;
      ms.peak_memory_vs_tp = tp_peak > 0 ? w.peak.Max() / tp_peak : 0;
    }
    out.mode_stats.push_back(ms);
  }
  for (int m = 1; m < kModeSlots; ++m) {
    for (int r = 1; r < kNumReasons; ++r) {
      if (job.decisions[m][r] == 0) continue;
      out.decisions.push_back({static_cast<Mode>(m), static_cast<Reason>(r), job.decisions[m][r]});
    }
  }
  const absl::Time now = Now();
  if (Active(job.op.pin, now)) {
    out.pins.push_back(
        PinView{job.id, std::nullopt, job.op.pin->mode, job.op.pin->expire, job.op.pin->force});
  }
  // Every pin in force, also for groups that have not registered (yet, or again after a
  // restart): an operator may pin a group before its ranks come back.
  for (const auto& [group, pin] : job.op.group_pins) {
    if (pin.expire > now) {
      out.pins.push_back(PinView{job.id, group, pin.mode, pin.expire, pin.force});
    }
  }
  out.local_decisions = job.local_decisions;
  out.memory_overrides = job.memory_overrides;
  out.learned.config = job.op.effective;
  out.learned.table = job.learned;
  out.learned.at_step = job.learned.newest_step();
  out.learned.gain_ratio = job.gain.ratio();
  out.learned.exploration_steps = job.exploration_steps;
  out.stage_learned = job.stage_learned;
  return out;
}

absl::StatusOr<WhatIfResult> GateState::WhatIf(const WhatIfInput& in) const {
  // A batch the daemon would refuse as a plan is refused here too: its group would decide
  // it locally, and a decision shown for it would not be the daemon's.
  RETURN_IF_ERROR(CheckSequences(in.lengths.size()));
  ASSIGN_OR_RETURN(const LengthStats stats, ComputeLengthStats(in.lengths));
  if (in.rs_wait_share.has_value() &&
      (!std::isfinite(*in.rs_wait_share) || *in.rs_wait_share < 0 || *in.rs_wait_share > 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rs_wait_share: must be finite and in [0, 1], got %g", *in.rs_wait_share));
  }
  RETURN_IF_ERROR(ValidateGateConfig(in.config));
  if (in.group.has_value() && in.job_id.empty()) {
    return absl::InvalidArgumentError("group: needs job_id");
  }
  ReaderMutexLock lock(&mu_);
  GroupPolicyState fresh;
  const GroupPolicyState* policy = &fresh;
  const ThroughputTable* table = nullptr;
  std::optional<PinDirective> pin;
  int64_t step = 0;
  if (!in.job_id.empty()) {
    ASSIGN_OR_RETURN(const Job* job, FindJob(in.job_id, in.group));
    table = &job->learned;
    step = std::max<int64_t>(0, job->learned.newest_step() + 1);
    std::optional<PinState> active;
    if (in.group.has_value()) {
      const Group& g = *job->groups.at(*in.group);
      policy = &g.policy;
      active = ActivePin(*job, *in.group);
      step = g.policy.gate().has_decision ? g.policy.gate().last_step + 1 : 0;
    } else if (Active(job->op.pin, Now())) {
      active = job->op.pin;  // the job's pin holds every group; a group's own needs --group
    }
    // A job's SP-required features rank as gate 1's directive, as in its decisions.
    pin = JobDirective(!job->sp_required.empty(), AsDirective(active));
  }
  // Without a group there is no real next step: ask about one that is not an ADAPTIVE
  // exploration step, so the answer is what the policy makes of the batch itself.
  // Three probe runs can adjoin (two of the share's, one at the end of its period and the
  // next at the start of the next, and the floor's); with a share of 1 every step
  // explores, and the answer is then an exploration step's, as it is where the batch's
  // band re-learns after a change and runs its first probe run at once.
  for (int i = 0; !in.group.has_value() && i < 3 * kProbeRunSteps && MayExplore(in.config, step);
       ++i) {
    ++step;
  }
  const BatchFacts facts{.step = step,
                         .length_cv = stats.cv,
                         .tokens = stats.tokens,
                         .predicted_peak_bytes_sp = in.predicted_peak_bytes_sp,
                         .predicted_peak_bytes_tp = in.predicted_peak_bytes_tp,
                         .memory_budget_bytes = in.memory_budget_bytes};
  WhatIfResult out;
  // The group's state as its next decision under the config asked about would read it
  // (a raised resume level makes a tripped group's probe due: GroupPolicyState::Prepare).
  GroupPolicyState prepared = *policy;
  prepared.Prepare(in.config);
  const RsWaitObservation rs = in.rs_wait_share.has_value()
                                   ? RsWaitObservation{*in.rs_wait_share, 1}
                                   : prepared.rs_wait();
  const std::optional<double> rs_mean = RollingValue(rs);
  const GateOutcome outcome =
      EvaluatePolicy(in.config, prepared.gate(), facts, rs, pin, table, &out.checks);
  // The trace speaks of a live group's window; say where a what-if's value came from.
  for (GateCheck& c : out.checks) {
    if (c.gate != "rs_wait") continue;
    if (in.rs_wait_share.has_value()) {
      c.detail += " (the wait share given, --rs_wait_share)";
    } else if (!in.group.has_value()) {
      c.detail = "no --group or --rs_wait_share: no wait share to test (a group's is its "
                 "rolling window)";
    }
  }
  for (GatePolicyKind kind : {GatePolicyKind::kStatic, GatePolicyKind::kAdaptive}) {
    GateConfig c = in.config;
    c.policy = kind;
    out.by_policy.emplace_back(
        kind, EvaluatePolicy(c, prepared.gate(), facts, rs, pin, table, nullptr).decision);
  }
  out.decision = DecisionRecord{.job_id = in.job_id,
                                .group = in.group.value_or(0),
                                .step = step,
                                .mode = outcome.decision.mode,
                                .reason = outcome.decision.reason,
                                .config_version = in.config_version,
                                .length_cv = stats.cv,
                                .rolling_rs_wait_share = rs_mean,
                                .time = Now(),
                                .pin_expire = std::nullopt,
                                .pin_forced = false};
  return out;
}

}  // namespace spgate::server
