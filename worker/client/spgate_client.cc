// The C API over GateClient / GroupDecider; see spgate_client.h. Every entry point
// catches nothing (the C++ layer does not throw) and turns absl::Status into a code plus
// a thread-local message.
#include "worker/client/spgate_client.h"

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "policy/gate_config.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "policy/types.h"
#include "worker/client/client_options.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"
#include "worker/client/identity.h"
#include "worker/client/tls.h"

struct spgate_options {
  spgate::client::GateClientOptions opts;
  spgate::client::TlsClientOptions tls;  // files are read by spgate_client_create
};
struct spgate_client {
  std::unique_ptr<spgate::client::GateClient> client;
};
struct spgate_decider {
  std::unique_ptr<spgate::client::GroupDecider> decider;
};

namespace {

// Report returns an absl::StatusCode as is: the header's names are those codes.
#define SPGATE_SAME_CODE(name, code) \
  static_assert(name == static_cast<int>(absl::StatusCode::code), #name)
SPGATE_SAME_CODE(SPGATE_INVALID_ARGUMENT, kInvalidArgument);
SPGATE_SAME_CODE(SPGATE_DEADLINE_EXCEEDED, kDeadlineExceeded);
SPGATE_SAME_CODE(SPGATE_NOT_FOUND, kNotFound);
SPGATE_SAME_CODE(SPGATE_ALREADY_EXISTS, kAlreadyExists);
SPGATE_SAME_CODE(SPGATE_PERMISSION_DENIED, kPermissionDenied);
SPGATE_SAME_CODE(SPGATE_FAILED_PRECONDITION, kFailedPrecondition);
SPGATE_SAME_CODE(SPGATE_UNIMPLEMENTED, kUnimplemented);
SPGATE_SAME_CODE(SPGATE_INTERNAL, kInternal);
SPGATE_SAME_CODE(SPGATE_UNAVAILABLE, kUnavailable);
SPGATE_SAME_CODE(SPGATE_UNAUTHENTICATED, kUnauthenticated);
#undef SPGATE_SAME_CODE

thread_local std::string last_error;

spgate_status Report(const absl::Status& s) {
  if (s.ok()) {
    last_error.clear();
    return SPGATE_OK;
  }
  last_error = std::string(s.message());
  return static_cast<spgate_status>(s.code());
}

spgate_status Null(const char* what) {
  return Report(absl::InvalidArgumentError(absl::StrCat(what, " is NULL")));
}

// A micro-batch count no step plan can have (a layout has at most kMaxStepPlanChunks).
absl::Status TooManyMicrobatchesStatus(size_t count) {
  return absl::InvalidArgumentError(absl::StrCat("count: ", count, " micro-batches, at most ",
                                                 spgate::kMaxStepPlanChunks));
}
spgate_status TooManyMicrobatches(size_t count) {
  return Report(TooManyMicrobatchesStatus(count));
}

// By name: the TLS settings, then the client's option table (client_options.h), then the
// initial config's fields by their names in the gate field table.
absl::Status SetOption(spgate::client::GateClientOptions& o,
                       spgate::client::TlsClientOptions& tls, const std::string& name,
                       const std::string& value) {
  if (name == "tls_ca") { tls.ca = value; return absl::OkStatus(); }
  if (name == "tls_cert") { tls.cert = value; return absl::OkStatus(); }
  if (name == "tls_key") { tls.key = value; return absl::OkStatus(); }
  if (name == "tls_server_name") { tls.server_name = value; return absl::OkStatus(); }
  if (const spgate::client::ClientOption* row = spgate::client::FindCApiOption(name)) {
    return spgate::client::SetClientOptionFromText(o, *row, value);
  }
  if (const spgate::GateField* f = spgate::FindGateField(name)) {
    return spgate::SetGateFieldFromText(o.initial_config, *f, value);  // "adaptive" too
  }
  // A name it does not take, in one shape: option "NAME": why (a value's error is the
  // option's name and what is wrong with the value, as above).
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("option \"", name, "\": ", why));
  };
  if (name == "link_gbps" || name == "link_latency_us") {  // documented until 0.1.0
    return refused(
        "removed: ADAPTIVE's prior no longer takes declared hardware (docs/client.md); drop "
        "the call");
  }
  if (const spgate::client::ClientOption* row = spgate::client::FindClientOption(name)) {
    // A duration's C++ name (the C API's carries its unit), or an option C++ alone sets.
    return refused(row->in_c_api()
                       ? absl::StrCat("unknown; the C API names it \"",
                                      spgate::client::CApiOptionName(*row), "\"")
                       : absl::StrCat("not in the C API (GateClientOptions::", name,
                                      ", C++ only)"));
  }
  return refused("unknown (docs/client.md, \"Options worth knowing\", lists them)");
}

absl::Time Deadline(spgate::client::GateClient* client, int64_t timeout_us) {
  return absl::Now() + (timeout_us < 0 ? client->options().decision_deadline
                                       : absl::Microseconds(timeout_us));
}

void Fill(const spgate::client::GateDecision& d, spgate_decision* out) {
  out->step = d.step;
  out->config_version = d.config_version;
  out->mode = static_cast<int32_t>(d.mode);
  out->reason = static_cast<int32_t>(d.reason);
  out->policy_reason = static_cast<int32_t>(d.policy_reason);
  out->source = static_cast<int32_t>(d.source);
}

spgate::client::BatchPlanInput Plan(int64_t step, const int64_t* lengths, size_t count,
                                    uint64_t sp, uint64_t tp, uint64_t budget) {
  spgate::client::BatchPlanInput p;
  p.step = step;
  p.lengths = std::span<const int64_t>(lengths, count);
  p.predicted_peak_bytes_sp = sp;
  p.predicted_peak_bytes_tp = tp;
  p.memory_budget_bytes = budget;
  return p;
}

// A step plan's micro-batches as C++ takes them (spans into the caller's arrays).
absl::StatusOr<std::vector<spgate::client::MicrobatchPlanInput>> Microbatches(
    const spgate_microbatch_plan* mbs, size_t count) {
  if (mbs == nullptr && count > 0) return absl::InvalidArgumentError("mbs is NULL");
  if (count > static_cast<size_t>(spgate::kMaxStepPlanChunks)) {
    return TooManyMicrobatchesStatus(count);
  }
  std::vector<spgate::client::MicrobatchPlanInput> out(count);
  for (size_t i = 0; i < count; ++i) {
    const spgate_microbatch_plan& m = mbs[i];
    if (m.lengths == nullptr && m.count > 0) {
      return absl::InvalidArgumentError(absl::StrCat("mbs[", i, "].lengths is NULL"));
    }
    out[i] = {.id = m.id,
              .lengths = std::span<const int64_t>(m.lengths, m.count),
              .memory = {.activation_sp = m.activation_sp, .activation_tp = m.activation_tp,
                         .workspace_sp = m.workspace_sp, .workspace_tp = m.workspace_tp}};
  }
  return out;
}

// A step plan's micro-batches to `target` (a GateClient or a GroupDecider).
template <typename Target>
spgate_status SubmitStepPlan(Target& target, int64_t step, const spgate_microbatch_plan* mbs,
                             size_t count, uint64_t resident, uint64_t budget) {
  auto in = Microbatches(mbs, count);
  if (!in.ok()) return Report(in.status());
  spgate::client::BatchPlanInput p;
  p.step = step;
  p.memory_budget_bytes = budget;
  p.microbatches = *in;
  p.resident_bytes = resident;
  return Report(target.SubmitPlan(p));
}

// A decision into the caller's head, and a step plan's micro-batches into its arrays
// (count 0: the head only, a plain plan's answer); INVALID_ARGUMENT when `count` is neither
// 0 nor the number of micro-batches the step was decided for.
spgate_status FillAnswer(const absl::StatusOr<spgate::client::GateDecision>& d,
                         spgate_decision* out, spgate_microbatch_decision* mbs, size_t count,
                         uint64_t* stage_peak_bytes) {
  if (!d.ok()) return Report(d.status());
  if (count > 0 && d->microbatches.size() != count) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("count: step ", d->step, " was decided for ", d->microbatches.size(),
                     " micro-batches, not ", count)));
  }
  for (size_t i = 0; i < count; ++i) {
    mbs[i].mode = static_cast<int32_t>(d->microbatches[i].mode);
    mbs[i].reason = static_cast<int32_t>(d->microbatches[i].reason);
  }
  Fill(*d, out);
  if (stage_peak_bytes != nullptr) *stage_peak_bytes = d->stage_peak_bytes;
  return Report(absl::OkStatus());
}

bool ValidModeAndReason(const spgate_telemetry& t) {
  return (t.mode == 1 || t.mode == 2) && t.reason >= 1 && t.reason < spgate::kNumReasons;
}

absl::Status BadModeOrReason(const spgate_telemetry& t) {
  return absl::InvalidArgumentError(
      absl::StrCat("telemetry: invalid mode ", t.mode, " or reason ", t.reason));
}

// The record as C++ takes it. Only a record whose mode and reason are valid
// (ValidModeAndReason) can be accepted; mode 0 is one that is refused.
spgate::client::StepTelemetryInput Telemetry(const spgate_telemetry& t) {
  spgate::client::StepTelemetryInput in;
  in.step = t.step;
  in.mode = static_cast<spgate::Mode>(t.mode);
  in.reason = static_cast<spgate::Reason>(t.reason);
  in.step_time_s = t.step_time_s;
  in.rs_wait_s = t.rs_wait_s;
  in.all_gather_s = t.all_gather_s;
  in.norm_stall_s = t.norm_stall_s;
  in.effective_tokens = t.effective_tokens;
  in.padding_tokens = t.padding_tokens;
  in.peak_memory_bytes = t.peak_memory_bytes;
  in.all_reduce_s = t.all_reduce_s;
  return in;
}

// The record with its micro-batches; a micro-batch's unknown mode is kept as 0, which
// the telemetry rules refuse naming it.
spgate::client::StepTelemetryInput StepTelemetry(const spgate_telemetry& t,
                                                 const spgate_microbatch_telemetry* mbs,
                                                 size_t count) {
  spgate::client::StepTelemetryInput in = Telemetry(t);
  in.microbatches.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const spgate_microbatch_telemetry& m = mbs[i];
    in.microbatches.push_back(
        {.id = m.id,
         .mode = static_cast<spgate::Mode>(m.mode == 1 || m.mode == 2 ? m.mode : 0),
         .forward_s = m.forward_s,
         .backward_s = m.backward_s,
         .rs_wait_s = m.rs_wait_s,
         .all_gather_s = m.all_gather_s,
         .effective_tokens = m.effective_tokens,
         .all_reduce_s = m.all_reduce_s});
  }
  return in;
}

}  // namespace

extern "C" {

const char* spgate_last_error(void) { return last_error.c_str(); }
const char* spgate_version(void) { return spgate::kVersion.data(); }

const char* spgate_mode_name(int32_t mode) {
  if (mode != 1 && mode != 2) return "unspecified";
  return spgate::ModeLabel(static_cast<spgate::Mode>(mode)).data();
}

const char* spgate_reason_name(int32_t reason) {
  if (reason < 1 || reason >= spgate::kNumReasons) return "unspecified";
  return spgate::ReasonLabel(static_cast<spgate::Reason>(reason)).data();
}

spgate_status spgate_new_launch_credential(char* buf, size_t size) {
  if (buf == nullptr) return Null("buf");
  if (size < SPGATE_LAUNCH_CREDENTIAL_BUFFER) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "size: need ", static_cast<int>(SPGATE_LAUNCH_CREDENTIAL_BUFFER), " bytes, got ", size)));
  }
  absl::StatusOr<std::string> credential = spgate::client::NewLaunchCredential();
  if (!credential.ok()) return Report(credential.status());
  std::memcpy(buf, credential->c_str(), credential->size() + 1);
  return Report(absl::OkStatus());
}

spgate_status spgate_options_set_layout(spgate_options* options, const spgate_layout* layout,
                                        const spgate_stage_coordinates* at) {
  if (options == nullptr) return Null("options");
  if (layout == nullptr) return Null("layout");
  if (at == nullptr) return Null("at");
  if (layout->schedule != SPGATE_SCHEDULE_1F1B &&
      layout->schedule != SPGATE_SCHEDULE_INTERLEAVED_1F1B) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("layout.schedule: ", layout->schedule, " is neither SPGATE_SCHEDULE_1F1B (0) "
                     "nor SPGATE_SCHEDULE_INTERLEAVED_1F1B (1)")));
  }
  spgate::JobLayout l{.tp = layout->tp, .pp = layout->pp, .vp = layout->vp, .cp = layout->cp,
                      .dp = layout->dp, .microbatches = layout->microbatches,
                      .schedule = static_cast<spgate::PipelineSchedule>(layout->schedule)};
  // Checked here too, so the caller learns of a bad layout where it set it.
  if (absl::Status s = spgate::ValidateJobLayout(l); !s.ok()) return Report(s);
  const spgate::StageCoordinates c{.dp_index = at->dp_index, .stage = at->stage,
                                   .cp_rank = at->cp_rank};
  if (absl::Status s = spgate::ValidateCoordinates(l, c); !s.ok()) return Report(s);
  options->opts.layout = l;
  options->opts.coordinates = c;
  return Report(absl::OkStatus());
}

spgate_status spgate_options_add_sp_required(spgate_options* options, const char* feature) {
  if (options == nullptr) return Null("options");
  if (feature == nullptr) return Null("feature");
  if (absl::Status s = spgate::ValidateSpRequiredFeature(feature); !s.ok()) return Report(s);
  options->opts.sp_required.emplace_back(feature);
  return Report(absl::OkStatus());
}

spgate_options* spgate_options_create(void) { return new spgate_options(); }
void spgate_options_destroy(spgate_options* options) { delete options; }

spgate_status spgate_options_set(spgate_options* options, const char* name, const char* value) {
  if (options == nullptr) return Null("options");
  if (name == nullptr || value == nullptr) return Null("name or value");
  return Report(SetOption(options->opts, options->tls, name, value));
}

spgate_status spgate_client_create(const spgate_options* options, spgate_client** out) {
  if (out == nullptr) return Null("out");
  *out = nullptr;
  spgate::client::GateClientOptions opts;
  if (options != nullptr) {
    opts = options->opts;
    auto credentials =
        spgate::client::TlsChannelCredentials(options->tls, spgate::client::kTlsOptionNames);
    if (!credentials.ok()) return Report(credentials.status());
    opts.credentials = *std::move(credentials);
    opts.tls_server_name = options->tls.server_name;
  }
  auto client = spgate::client::GateClient::Create(std::move(opts));
  if (!client.ok()) return Report(client.status());
  *out = new spgate_client{std::move(*client)};
  return Report(absl::OkStatus());
}

void spgate_client_destroy(spgate_client* client) { delete client; }

spgate_status spgate_client_submit_plan(spgate_client* client, int64_t step,
                                        const int64_t* lengths, size_t count, uint64_t sp,
                                        uint64_t tp, uint64_t budget) {
  if (client == nullptr) return Null("client");
  if (lengths == nullptr && count > 0) return Null("lengths");
  return Report(client->client->SubmitPlan(Plan(step, lengths, count, sp, tp, budget)));
}

spgate_status spgate_client_submit_step_plan(spgate_client* client, int64_t step,
                                             const spgate_microbatch_plan* mbs, size_t count,
                                             uint64_t resident_bytes,
                                             uint64_t memory_budget_bytes) {
  if (client == nullptr) return Null("client");
  return SubmitStepPlan(*client->client, step, mbs, count, resident_bytes, memory_budget_bytes);
}

spgate_status spgate_client_await_decision(spgate_client* client, int64_t step,
                                           int64_t timeout_us, spgate_decision* out) {
  return spgate_client_await_microbatches(client, step, timeout_us, out, nullptr, 0, nullptr);
}

spgate_status spgate_client_await_microbatches(spgate_client* client, int64_t step,
                                               int64_t timeout_us, spgate_decision* out,
                                               spgate_microbatch_decision* mbs, size_t count,
                                               uint64_t* stage_peak_bytes) {
  if (client == nullptr) return Null("client");
  if (out == nullptr) return Null("out");
  if (mbs == nullptr && count > 0) return Null("mbs");
  return FillAnswer(
      client->client->AwaitDecision(step, Deadline(client->client.get(), timeout_us)), out, mbs,
      count, stage_peak_bytes);
}

spgate_status spgate_client_report_telemetry(spgate_client* client, const spgate_telemetry* t) {
  return spgate_client_report_step_telemetry(client, t, nullptr, 0);
}

spgate_status spgate_client_report_step_telemetry(spgate_client* client,
                                                  const spgate_telemetry* t,
                                                  const spgate_microbatch_telemetry* mbs,
                                                  size_t count) {
  if (client == nullptr) return Null("client");
  if (t == nullptr) return Null("telemetry");
  if (mbs == nullptr && count > 0) return Null("microbatches");
  if (count > static_cast<size_t>(spgate::kMaxStepPlanChunks)) return TooManyMicrobatches(count);
  if (!ValidModeAndReason(*t)) return Report(BadModeOrReason(*t));
  return Report(client->client->ReportTelemetry(StepTelemetry(*t, mbs, count)));
}

spgate_status spgate_client_observe_group_rs_wait(spgate_client* client, int64_t step,
                                                  int32_t mode, double share) {
  if (client == nullptr) return Null("client");
  if (mode != 1 && mode != 2) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("mode: must be 1 (SP) or 2 (TP-only), got ", mode)));
  }
  return Report(
      client->client->ObserveGroupRsWaitShare(step, static_cast<spgate::Mode>(mode), share));
}

spgate_status spgate_client_flush(spgate_client* client, int64_t timeout_ms) {
  if (client == nullptr) return Null("client");
  return Report(client->client->Flush(absl::Milliseconds(timeout_ms)));
}

spgate_status spgate_client_wait_connected(spgate_client* client, int64_t timeout_ms) {
  if (client == nullptr) return Null("client");
  return Report(client->client->WaitUntilConnected(absl::Milliseconds(timeout_ms)));
}

spgate_status spgate_client_get_stats(spgate_client* client, spgate_client_stats* out) {
  if (client == nullptr) return Null("client");
  if (out == nullptr) return Null("out");
  const spgate::client::GateClientStats s = client->client->stats();
  out->connected = s.connected ? 1 : 0;
  out->registrations = s.registrations;
  out->daemon_decisions = s.daemon_decisions;
  out->local_decisions = s.local_decisions;
  out->late_decisions = s.late_decisions;
  out->telemetry_reported = s.telemetry_reported;
  out->telemetry_sent = s.telemetry_sent;
  out->telemetry_acked = s.telemetry_acked;
  out->telemetry_dropped = s.telemetry_dropped;
  out->memory_overrides = s.memory_overrides;
  out->session_replaced = s.session_replaced ? 1 : 0;
  return Report(absl::OkStatus());
}

spgate_status spgate_decider_create(spgate_client* client, int32_t rank_in_group,
                                    spgate_broadcast_fn broadcast, void* user_data,
                                    spgate_decider** out) {
  return spgate_decider_create_group(client, rank_in_group, broadcast, nullptr, user_data, out);
}

spgate_status spgate_decider_create_group(spgate_client* client, int32_t rank_in_group,
                                          spgate_broadcast_fn broadcast,
                                          spgate_reduce_max_fn reduce, void* user_data,
                                          spgate_decider** out) {
  // A rank without a broadcast cannot take part in the group's agreement; one without `out`
  // takes part and fails, with every rank when it is the leader (GroupDecider::Create).
  if (broadcast == nullptr) return Null("broadcast");
  if (out != nullptr) *out = nullptr;
  const absl::Status refused =
      out == nullptr ? absl::InvalidArgumentError("out is NULL") : absl::OkStatus();
  // A decision's head and a step plan's micro-batch bytes, in one call.
  auto broadcast_fn = [broadcast, user_data](std::span<uint8_t> b, int root) -> absl::Status {
    const int32_t rc = broadcast(b.data(), b.size(), root, user_data);
    if (rc != 0) return absl::InternalError(absl::StrCat("broadcast callback returned ", rc));
    return absl::OkStatus();
  };
  spgate::client::MaxReduceFn reduce_fn;  // empty: per-rank sessions
  if (reduce != nullptr) {  // 16 doubles, 8 per micro-batch, the ranks' busy times (StragglerSlots)
    reduce_fn = [reduce, user_data](std::span<double> v, int root) -> absl::Status {
      const int32_t rc = reduce(v.data(), v.size(), root, user_data);
      if (rc != 0) return absl::InternalError(absl::StrCat("reduce callback returned ", rc));
      return absl::OkStatus();
    };
  }
  auto decider = spgate::client::GroupDecider::Create(
      client != nullptr ? client->client.get() : nullptr, rank_in_group, std::move(broadcast_fn),
      std::move(reduce_fn), refused);
  if (!decider.ok()) return Report(decider.status());
  *out = new spgate_decider{std::move(*decider)};
  return Report(absl::OkStatus());
}

void spgate_decider_destroy(spgate_decider* decider) { delete decider; }

spgate_status spgate_decider_submit_plan(spgate_decider* decider, int64_t step,
                                         const int64_t* lengths, size_t count, uint64_t sp,
                                         uint64_t tp, uint64_t budget) {
  if (decider == nullptr) return Null("decider");
  if (lengths == nullptr && count > 0) return Null("lengths");
  return Report(decider->decider->SubmitPlan(Plan(step, lengths, count, sp, tp, budget)));
}

spgate_status spgate_decider_decide(spgate_decider* decider, int64_t step, int64_t timeout_us,
                                    spgate_decision* out) {
  return spgate_decider_decide_microbatches(decider, step, timeout_us, out, nullptr, 0, nullptr);
}

spgate_status spgate_decider_submit_step_plan(spgate_decider* decider, int64_t step,
                                              const spgate_microbatch_plan* mbs, size_t count,
                                              uint64_t resident_bytes,
                                              uint64_t memory_budget_bytes) {
  if (decider == nullptr) return Null("decider");
  return SubmitStepPlan(*decider->decider, step, mbs, count, resident_bytes, memory_budget_bytes);
}

spgate_status spgate_decider_decide_microbatches(spgate_decider* decider, int64_t step,
                                                 int64_t timeout_us, spgate_decision* out,
                                                 spgate_microbatch_decision* mbs, size_t count,
                                                 uint64_t* stage_peak_bytes) {
  if (decider == nullptr) return Null("decider");
  if (out == nullptr) return Null("out");
  if (mbs == nullptr && count > 0) return Null("mbs");
  // Every rank enters the collective with the same count (an int here, as C++ takes it;
  // GroupDecider refuses one over kMaxMicrobatches on every rank alike; 0: a plain plan).
  const int m =
      count > static_cast<size_t>(spgate::kMaxMicrobatches) ? -1 : static_cast<int>(count);
  spgate::client::GroupDecider& g = *decider->decider;
  return FillAnswer(
      timeout_us < 0 ? g.Decide(step, m)
                     : g.Decide(step, m, absl::Now() + absl::Microseconds(timeout_us)),
      out, mbs, count, stage_peak_bytes);
}

spgate_status spgate_decider_report_telemetry(spgate_decider* decider,
                                              const spgate_telemetry* t) {
  return spgate_decider_report_step_telemetry(decider, t, nullptr, 0);
}

spgate_status spgate_decider_report_step_telemetry(spgate_decider* decider,
                                                   const spgate_telemetry* t,
                                                   const spgate_microbatch_telemetry* mbs,
                                                   size_t count) {
  if (decider == nullptr) return Null("decider");
  if (t == nullptr) return Null("telemetry");
  // A null list, or a count over the limit, is taken as none: the rank still takes part
  // (the others are, or will be, in the reduction) and is refused there. So is a record
  // whose mode or reason is unknown, sent as one the decider refuses (mode 0).
  const bool too_many = count > static_cast<size_t>(spgate::kMaxStepPlanChunks);
  if (too_many) mbs = nullptr;
  spgate_telemetry record = *t;
  const bool valid = ValidModeAndReason(*t);
  if (!valid) {
    record.mode = 0;
    record.reason = SPGATE_REASON_GATES_PASSED;
  }
  const absl::Status s = decider->decider->ReportTelemetry(
      StepTelemetry(record, mbs, mbs == nullptr ? 0 : count));
  if (too_many) return TooManyMicrobatches(count);
  return Report(valid ? s : BadModeOrReason(*t));
}

}  // extern "C"
