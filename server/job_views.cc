// Admin views; see job_views.h.
#include "server/job_views.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "proto/convert.h"

namespace spgate::server {
namespace {

void ToProto(const PinView& p, v1::Pin* out) {
  out->set_job_id(p.job_id);
  if (p.group) out->set_group(*p.group);
  out->set_mode(spgate::ToProto(p.mode));
  *out->mutable_expire_time() = ToTimestamp(p.expire);
  out->set_force(p.force);
}

void ToProto(const JobSummaryView& s, v1::JobSummary* out) {
  out->set_job_id(s.job_id);
  out->set_incarnation(s.incarnation);
  out->set_groups(s.groups);
  out->set_ranks_active(s.ranks_active);
  out->set_ranks_stale(s.ranks_stale);
  out->set_steps_decided(s.steps_decided);
  out->set_group_steps_decided(s.group_steps_decided);
  out->set_sp_groups(s.sp_groups);
  out->set_tp_groups(s.tp_groups);
  out->set_config_version(s.config_version);
  out->set_hardware_id(s.hardware_id);
}

void ToProto(const GroupView& g, v1::GroupStatus* out) {
  out->set_group(g.group);
  out->set_group_size(g.group_size);
  out->set_ranks_active(g.ranks_active);
  out->set_ranks_stale(g.ranks_stale);
  if (g.has_decision) {
    out->set_mode(spgate::ToProto(g.mode));
    out->set_reason(spgate::ToProto(g.reason));
  }
  out->set_last_step(g.last_step);
  if (g.rolling_rs_wait_share) out->set_rolling_rs_wait_share(*g.rolling_rs_wait_share);
  out->set_all_gather_tail_s(g.all_gather_tail_s);
  out->set_norm_stall_ratio(g.norm_stall_ratio);
  out->set_rs_wait_fallback(g.rs_wait_fallback);
  out->set_mode_switches(g.mode_switches);
  if (g.pin) ToProto(*g.pin, out->mutable_pin());
  out->set_slowest_rank(g.slowest_rank);
  out->set_slowest_step_time_s(g.slowest_step_time_s);
  out->set_peak_memory_rank(g.peak_memory_rank);
  out->set_group_session(g.group_session);
  if (g.coordinates) spgate::ToProto(*g.coordinates, out->mutable_coordinates());
  out->set_predicted_stage_peak_bytes(g.stage_peak_bytes);
  out->set_last_step_tp_only_microbatches(g.last_step_tp_microbatches);
}

void ToProto(const ModeStatsView& m, v1::ModeStats* out) {
  out->set_mode(spgate::ToProto(m.mode));
  out->set_steps(m.steps);
  out->set_microbatches(m.microbatches);
  out->set_effective_tokens_per_s(m.effective_tokens_per_s);
  out->set_step_time_p95_s(m.step_time_p95_s);
  out->set_peak_memory_bytes(m.peak_memory_bytes);
  if (m.compared_to_tp) {
    out->set_tokens_per_s_vs_tp(m.tokens_per_s_vs_tp);
    out->set_step_time_p95_vs_tp(m.step_time_p95_vs_tp);
    out->set_peak_memory_vs_tp(m.peak_memory_vs_tp);
  }
}

template <typename Request>
std::optional<int> GroupOf(const Request& r) {
  return r.has_group() ? std::optional<int>(r.group()) : std::nullopt;
}

}  // namespace

PlanInput PlanFromProto(const v1::BatchPlan& p) {
  PlanInput in{.job_id = p.job_id(),
               .group = p.group(),
               .step = p.step(),
               .lengths = std::span<const int64_t>(p.lengths().data(),
                                                   static_cast<size_t>(p.lengths_size())),
               .predicted_peak_bytes_sp = p.predicted_peak_bytes_sp(),
               .predicted_peak_bytes_tp = p.predicted_peak_bytes_tp(),
               .memory_budget_bytes = p.memory_budget_bytes(),
               .resident_bytes = p.resident_bytes()};
  // At most kMaxItemsPerMessage-bounded messages reach here; the count itself is checked
  // by the state before anything is computed from it.
  in.microbatches.reserve(static_cast<size_t>(std::min(p.micro_batches_size(), kMaxMicrobatches)));
  for (const v1::MicroBatchPlan& m : p.micro_batches()) {
    if (static_cast<int>(in.microbatches.size()) > kMaxMicrobatches) break;  // refused anyway
    in.microbatches.push_back(
        {.id = m.id(),
         .lengths = std::span<const int64_t>(m.lengths().data(),
                                             static_cast<size_t>(m.lengths_size())),
         .memory = {.activation_sp = m.activation_bytes_sp(),
                    .activation_tp = m.activation_bytes_tp(),
                    .workspace_sp = m.workspace_bytes_sp(),
                    .workspace_tp = m.workspace_bytes_tp()}});
  }
  return in;
}

TelemetryRecord TelemetryFromProto(const v1::StepTelemetry& t) {
  TelemetryRecord r{.job_id = t.job_id(),
                    .group = t.group(),
                    .rank_in_group = t.rank_in_group(),
                    .values = {.step = t.step(),
                               .mode = static_cast<int32_t>(t.mode()),
                               .step_time_s = t.step_time_s(),
                               .rs_wait_s = t.rs_wait_s(),
                               .all_gather_s = t.all_gather_s(),
                               .norm_stall_s = t.norm_stall_s(),
                               .effective_tokens = t.effective_tokens(),
                               .padding_tokens = t.padding_tokens(),
                               .all_reduce_s = t.all_reduce_s(),
                               .straggler_s = t.straggler_s()},
                    .peak_memory_bytes = t.peak_memory_bytes(),
                    .ranks = t.ranks(),
                    .slowest_rank = t.slowest_rank(),
                    .peak_memory_rank = t.peak_memory_rank(),
                    .fallback = t.reason() == v1::CONTROLLER_UNAVAILABLE};
  r.microbatches.reserve(static_cast<size_t>(t.micro_batches_size()));
  for (const v1::MicroBatchTelemetry& m : t.micro_batches()) {
    // A wire mode that is neither is kept as 0, which the telemetry rules refuse.
    const bool known = m.mode() == v1::SEQUENCE_PARALLEL || m.mode() == v1::TENSOR_PARALLEL_ONLY;
    r.microbatches.push_back({.id = m.id(),
                              .mode = static_cast<Mode>(known ? static_cast<int>(m.mode()) : 0),
                              .forward_s = m.forward_s(),
                              .backward_s = m.backward_s(),
                              .rs_wait_s = m.rs_wait_s(),
                              .all_gather_s = m.all_gather_s(),
                              .effective_tokens = m.effective_tokens(),
                              .all_reduce_s = m.all_reduce_s(),
                              .straggler_s = m.straggler_s()});
  }
  return r;
}

// The largest model dimension Register takes (ADAPTIVE's prior multiplies hidden and
// layers into byte counts; every field is range-checked alike).
constexpr int kMaxModelDimension = 1 << 20;

absl::StatusOr<RegisterInput> RegisterFromProto(const v1::RegisterRequest& r) {
  RegisterInput in{.job_id = r.job_id(),
                       .incarnation = r.incarnation(),
                       .group = r.group(),
                       .rank_in_group = r.rank_in_group(),
                       .group_size = r.group_size(),
                       .global_rank = r.global_rank(),
                       .host = r.host(),
                       .memory_budget_bytes = r.memory_budget_bytes(),
                       .launch_credential = r.launch_credential(),
                       .group_session = r.group_session(),
                       .hardware_id = r.hardware_id()};
  if (r.has_layout()) {
    ASSIGN_OR_RETURN(JobLayout layout, FromProto(r.layout()));
    in.layout = layout;
    in.coordinates = FromProto(r.coordinates());
  } else if (r.has_coordinates()) {
    return absl::InvalidArgumentError("coordinates: sent without a layout");
  }
  in.sp_required.assign(r.sp_required().begin(), r.sp_required().end());
  // The model's shape (the learned tables' key). The deprecated `hardware` is ignored.
  const v1::ModelShape& model = r.model();
  const std::pair<const char*, int> shape[] = {
      {"model.hidden", model.hidden()}, {"model.layers", model.layers()},
      {"model.heads", model.heads()}, {"model.ffn_hidden", model.ffn_hidden()},
      {"model.tp", model.tp()}};
  for (const auto& [name, value] : shape) {
    if (value < 0 || value > kMaxModelDimension) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: must be 0 (not declared) or in [1, %d], got %d", name, kMaxModelDimension, value));
    }
  }
  in.prior_inputs = PriorInputs{
      .tp = r.group_size(), .hidden = r.model().hidden(), .layers = r.model().layers()};
  return in;
}

v1::RegisterResponse ToProto(const RegisterResult& r) {
  v1::RegisterResponse resp;
  resp.set_session_id(r.session_id);
  if (r.config) *resp.mutable_config() = *r.config;
  resp.set_effective_from_step(r.effective_from_step);
  resp.mutable_heartbeat_interval()->set_seconds(absl::ToInt64Seconds(r.heartbeat_interval));
  resp.mutable_heartbeat_interval()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(r.heartbeat_interval) % 1'000'000'000));
  resp.set_last_decided_step(r.last_decided_step);
  return resp;
}

HeartbeatInput HeartbeatFromProto(const v1::Heartbeat& hb) {
  HeartbeatInput in;
  for (const auto& c : hb.local_decisions()) {
    if (IsValidReason(c.reason())) in.local_decisions[c.reason()] = c.count();
  }
  in.memory_overrides = hb.memory_overrides();
  return in;
}

v1::ConfigUpdate ToProto(const ConfigPush& push) {
  v1::ConfigUpdate update;
  if (push.config) *update.mutable_config() = *push.config;
  update.set_effective_from_step(push.effective_from_step);
  return update;
}

void ToProto(const DecisionRecord& d, v1::Decision* out) {
  // `out` may be reused: nothing of the last decision may stay (an unset rolling share or
  // pin end, a plain plan's empty micro-batch list). Clear keeps the buffers.
  out->Clear();
  out->set_job_id(d.job_id);
  out->set_group(d.group);
  out->set_step(d.step);
  out->set_mode(spgate::ToProto(d.mode));
  out->set_reason(spgate::ToProto(d.reason));
  out->set_config_version(d.config_version);
  out->set_length_cv(d.length_cv);
  if (d.rolling_rs_wait_share) out->set_rolling_rs_wait_share(*d.rolling_rs_wait_share);
  *out->mutable_decide_time() = ToTimestamp(d.time);
  if (d.pin_expire) *out->mutable_pin_expire_time() = ToTimestamp(*d.pin_expire);
  out->set_pin_forced(d.pin_forced);
  for (size_t i = 0; i < d.microbatches.size(); ++i) {
    v1::MicroBatchDecision* m = out->add_micro_batches();
    m->set_id(static_cast<int32_t>(i));
    m->set_mode(spgate::ToProto(d.microbatches[i].mode));
    m->set_reason(spgate::ToProto(d.microbatches[i].reason));
  }
  if (!d.microbatches.empty()) out->set_predicted_stage_peak_bytes(d.stage_peak_bytes);
}

absl::StatusOr<v1::VersionedGateConfig> GetGateConfigView(const GateState& state,
                                                           const OperatorStore& store,
                                                           const std::string& job_id) {
  if (!job_id.empty() && !store.HasJobScope(job_id)) RETURN_IF_ERROR(state.CheckJob(job_id));
  return store.GetGateConfig(job_id);
}

v1::ListJobsResponse ListJobsView(const GateState& state) {
  v1::ListJobsResponse out;
  for (const JobSummaryView& s : state.ListJobs()) ToProto(s, out.add_jobs());
  return out;
}

absl::StatusOr<v1::Job> GetJobView(const GateState& state, const OperatorStore& store,
                                   const std::string& job_id) {
  ASSIGN_OR_RETURN(const JobView view, state.GetJob(job_id));
  v1::Job out;
  ToProto(view.summary, out.mutable_summary());
  for (const GroupView& g : view.groups) ToProto(g, out.add_groups());
  for (const ModeStatsView& m : view.mode_stats) ToProto(m, out.add_mode_stats());
  for (const DecisionCountView& d : view.decisions) {
    auto* c = out.add_decisions();
    c->set_mode(spgate::ToProto(d.mode));
    c->set_reason(spgate::ToProto(d.reason));
    c->set_count(d.count);
  }
  *out.mutable_config() = store.GetGateConfig(job_id);
  for (const PinView& p : view.pins) ToProto(p, out.add_pins());
  out.set_local_decisions(view.local_decisions);
  out.set_memory_overrides(view.memory_overrides);
  *out.mutable_learned() = ToProto(view.learned.table);
  out.set_learned_at_step(view.learned.at_step);
  out.set_adaptive_gain_ratio(view.learned.gain_ratio);
  out.set_exploration_steps(view.learned.exploration_steps);
  for (const ThroughputTable& t : view.stage_learned) *out.add_stage_learned() = ToProto(t);
  if (view.layout) spgate::ToProto(*view.layout, out.mutable_layout());
  for (const std::string& f : view.sp_required) out.add_sp_required(f);
  return out;
}

namespace {

// A pin's group as Register would take it: below --max_groups_per_job (a negative one
// is the store's INVALID_ARGUMENT).
absl::Status CheckPinGroup(const GateState& state, bool has_group, int group) {
  // (A negative one is the store's INVALID_ARGUMENT, said first.)
  return has_group && group >= 0
             ? ValidateGroupIndex(group, state.options().max_groups_per_job)
             : absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Pin> PinModeView(const GateState& state, OperatorStore& store,
                                    const v1::PinModeRequest& r, const AuditContext& audit) {
  RETURN_IF_ERROR(OperatorStore::ValidatePinRequest(r));
  RETURN_IF_ERROR(CheckPinGroup(state, r.has_group(), r.group()));
  // Registered: the job has live groups (the named one, when a group is pinned). A job
  // listed only for its operator settings has none.
  bool registered = false;
  if (absl::StatusOr<JobView> job = state.GetJob(r.job_id()); job.ok()) {
    for (const GroupView& g : job->groups) registered |= !r.has_group() || g.group == r.group();
  }
  ASSIGN_OR_RETURN(v1::Pin pin, store.PinMode(r, audit));
  pin.set_pending(!registered);
  return pin;
}

absl::StatusOr<v1::UnpinResponse> UnpinView(const GateState& state, OperatorStore& store,
                                            const v1::UnpinRequest& r, const AuditContext& audit) {
  RETURN_IF_ERROR(OperatorStore::ValidateUnpinRequest(r));
  RETURN_IF_ERROR(CheckPinGroup(state, r.has_group(), r.group()));
  if (!store.HasJobScope(r.job_id())) RETURN_IF_ERROR(state.CheckJob(r.job_id()));
  ASSIGN_OR_RETURN(int removed, store.Unpin(r, audit));
  v1::UnpinResponse resp;
  resp.set_removed(removed);
  return resp;
}

absl::StatusOr<v1::EvaluateGatesResponse> EvaluateGatesView(const GateState& state,
                                                            const OperatorStore& store,
                                                            const v1::EvaluateGatesRequest& r) {
  WhatIfInput in;
  in.job_id = r.job_id();
  in.group = GroupOf(r);
  if (!r.job_id().empty()) RETURN_IF_ERROR(state.CheckJob(r.job_id(), in.group));
  const JobOperatorView op = store.ViewForJob(r.job_id());
  in.config = LayerGateConfig(op.effective, r.config());
  in.config_version = r.job_id().empty() ? store.GlobalVersion() : op.effective_version;
  in.lengths = std::span<const int64_t>(r.lengths().data(), static_cast<size_t>(r.lengths_size()));
  if (r.has_rs_wait_share()) in.rs_wait_share = r.rs_wait_share();
  in.predicted_peak_bytes_sp = r.predicted_peak_bytes_sp();
  in.predicted_peak_bytes_tp = r.predicted_peak_bytes_tp();
  in.memory_budget_bytes = r.memory_budget_bytes();
  ASSIGN_OR_RETURN(const WhatIfResult result, state.WhatIf(in));
  v1::EvaluateGatesResponse resp;
  ToProto(result.decision, resp.mutable_decision());
  for (const GateCheck& c : result.checks) {
    auto* out = resp.add_checks();
    out->set_gate(c.gate);
    out->set_outcome(c.outcome);
    if (c.observed.has_value()) out->set_observed(*c.observed);
    if (c.threshold.has_value()) out->set_threshold(*c.threshold);
    out->set_detail(c.detail);
  }
  *resp.mutable_config_used() = spgate::ToProto(in.config);
  for (const auto& [kind, d] : result.by_policy) {
    v1::PolicyDecision* p = resp.add_by_policy();
    p->set_policy(static_cast<v1::GateConfig::Policy>(kind));
    p->set_mode(spgate::ToProto(d.mode));
    p->set_reason(spgate::ToProto(d.reason));
  }
  return resp;
}

}  // namespace spgate::server
