// Channel and messages of the worker client; see wire.h.
#include "worker/client/wire.h"

#include <unistd.h>

#include <algorithm>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/host_port.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "worker/client/channel.h"

namespace spgate::client {
namespace {

int ToMillis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

std::string DefaultHost() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

absl::Status ValidateControllerAddress(std::string_view controller) {
  if (controller.empty()) return absl::OkStatus();
  auto bad = [controller](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "controller: \"%s\" is not host:port (%s)",
        absl::CHexEscape(absl::string_view(controller.data(), controller.size())), why));
  };
  for (char c : controller) {
    if (c <= 0x20 || c > 0x7e) return bad("printable ASCII without spaces only");
  }
  std::string_view target = controller;
  if (target.starts_with("dns:///")) target.remove_prefix(7);
  const AddressParts p = SplitAddress(absl::string_view(target.data(), target.size()));
  if (p.unix) {
    const bool named = target != "unix:" && target != "unix-abstract:";
    return named ? absl::OkStatus() : bad(std::string(target) + " needs a name");
  }
  if (!p.has_colon || target.back() == ']') return bad("no port: e.g. 127.0.0.1:50061");
  if (p.host.empty()) return bad("no host: e.g. 127.0.0.1:50061");
  // A colon in the host is an IPv6 address's, which gRPC takes only in brackets.
  if (p.host.find_first_of(p.bracketed ? "[]/" : ":[]/") != std::string::npos) {
    return bad("a host name, an IPv4 address, or an IPv6 address in brackets: [::1]:50061");
  }
  if (PortNumber(p) < 1) {
    return bad(absl::StrFormat("the port must be a number in [1, 65535], got \"%s\"", p.port));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> CreateGateChannel(const GateClientOptions& o, bool own_connection) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ToMillis(o.keepalive_time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ToMillis(o.keepalive_timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // No bandwidth-delay probes: the stream carries a few hundred bytes a step, and each
  // probe is a PING and its ACK, i.e. two more packets (and wake-ups at both ends) per
  // message at the daemon that a per-step message does not need.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The channel's own connect backoff (default up to 120 s) must not outlast ours, or a
  // restarted daemon would wait for the channel rather than for the client.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ToMillis(o.initial_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(1000, ToMillis(o.initial_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ToMillis(o.max_backoff));
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  return grpc::CreateCustomChannel(
      o.controller, o.credentials != nullptr ? o.credentials : grpc::InsecureChannelCredentials(),
      args);
}

v1::RegisterRequest BuildRegisterRequest(const GateClientOptions& o) {
  v1::RegisterRequest req;
  req.set_job_id(o.job_id);
  req.set_incarnation(o.incarnation);
  req.set_launch_credential(o.launch_credential);
  req.set_group(o.group);
  req.set_rank_in_group(o.rank_in_group);
  req.set_group_size(o.group_size);
  req.set_global_rank(o.global_rank);
  req.set_host(o.host.empty() ? DefaultHost() : o.host);
  req.set_hardware_id(o.hardware_id);
  v1::ModelShape* m = req.mutable_model();
  m->set_layers(o.model.layers);
  m->set_hidden(o.model.hidden);
  m->set_heads(o.model.heads);
  m->set_ffn_hidden(o.model.ffn_hidden);
  m->set_tp(o.group_size);
  req.set_memory_budget_bytes(o.memory_budget_bytes);
  req.set_group_session(o.group_session && o.rank_in_group == 0);
  if (o.layout.has_value()) {
    ToProto(*o.layout, req.mutable_layout());
    ToProto(o.coordinates, req.mutable_coordinates());
  }
  for (const std::string& f : o.sp_required) req.add_sp_required(f);
  return req;
}

void BuildWorkerMessage(const GateClientOptions& o, const Outgoing& out, v1::WorkerMessage* msg) {
  msg->Clear();
  if (!out.session_id.empty()) msg->set_session_id(out.session_id);
  for (const std::shared_ptr<const PlanRecord>& plan : out.plans) {
    const PlanRecord& p = *plan;
    v1::BatchPlan* bp = msg->add_plans();
    bp->set_job_id(o.job_id);
    bp->set_group(o.group);
    bp->set_step(p.step);
    bp->set_memory_budget_bytes(p.budget);
    if (!o.layout.has_value()) {
      // A plain plan, on the wire as it has always gone: its one micro-batch's lengths and,
      // as the batch's predicted peaks, that micro-batch's activations (decision_book.h).
      const MicrobatchFacts& m = p.microbatches.front();
      if (!p.lengths.empty()) {
        bp->mutable_lengths()->Add(p.lengths.front().begin(), p.lengths.front().end());
      }
      bp->set_predicted_peak_bytes_sp(m.memory.activation_sp);
      bp->set_predicted_peak_bytes_tp(m.memory.activation_tp);
      continue;
    }
    bp->set_resident_bytes(p.resident);
    for (size_t id = 0; id < p.microbatches.size(); ++id) {
      const MicrobatchFacts& m = p.microbatches[id];
      v1::MicroBatchPlan* mb = bp->add_micro_batches();
      mb->set_id(m.id);
      if (id < p.lengths.size()) {
        mb->mutable_lengths()->Add(p.lengths[id].begin(), p.lengths[id].end());
      }
      mb->set_activation_bytes_sp(m.memory.activation_sp);
      mb->set_activation_bytes_tp(m.memory.activation_tp);
      mb->set_workspace_bytes_sp(m.memory.workspace_sp);
      mb->set_workspace_bytes_tp(m.memory.workspace_tp);
    }
  }
  for (const StepTelemetryInput& t : out.telemetry) {
    v1::StepTelemetry* st = msg->add_telemetry();
    st->set_job_id(o.job_id);
    st->set_group(o.group);
    st->set_rank_in_group(o.rank_in_group);
    st->set_step(t.step);
    st->set_mode(ToProto(t.mode));
    st->set_reason(ToProto(t.reason));
    st->set_step_time_s(t.step_time_s);
    st->set_rs_wait_s(t.rs_wait_s);
    st->set_all_gather_s(t.all_gather_s);
    st->set_norm_stall_s(t.norm_stall_s);
    st->set_effective_tokens(t.effective_tokens);
    st->set_padding_tokens(t.padding_tokens);
    st->set_peak_memory_bytes(t.peak_memory_bytes);
    st->set_all_reduce_s(t.all_reduce_s);
    if (t.ranks > 1) {
      st->set_ranks(t.ranks);
      st->set_slowest_rank(t.slowest_rank);
      st->set_peak_memory_rank(t.peak_memory_rank);
      st->set_straggler_s(t.straggler_s);
    }
    st->mutable_micro_batches()->Reserve(static_cast<int>(t.microbatches.size()));
    for (const MicrobatchTelemetryValues& m : t.microbatches) {
      v1::MicroBatchTelemetry* mb = st->add_micro_batches();
      mb->set_id(m.id);
      mb->set_mode(ToProto(m.mode));
      mb->set_forward_s(m.forward_s);
      mb->set_backward_s(m.backward_s);
      mb->set_rs_wait_s(m.rs_wait_s);
      mb->set_all_gather_s(m.all_gather_s);
      mb->set_effective_tokens(m.effective_tokens);
      mb->set_all_reduce_s(m.all_reduce_s);
      if (t.ranks > 1) mb->set_straggler_s(m.straggler_s);
    }
  }
  if (out.heartbeat) {
    v1::Heartbeat* hb = msg->mutable_heartbeat();
    for (int r = 1; r < kNumReasons; ++r) {
      if (out.counts.local_decisions[r] == 0) continue;
      v1::LocalDecisionCount* c = hb->add_local_decisions();
      c->set_reason(static_cast<v1::Reason>(r));
      c->set_count(out.counts.local_decisions[r]);
    }
    hb->set_telemetry_sent(out.telemetry_sent);
    hb->set_seq(out.heartbeat_seq);
    hb->set_memory_overrides(out.counts.memory_overrides);
  }
}

std::optional<GateDecision> DecisionFromProto(const v1::Decision& d) {
  if (!IsValidMode(d.mode()) || !IsValidReason(d.reason())) return std::nullopt;
  GateDecision g;
  g.step = d.step();
  g.mode = FromProto(d.mode());
  g.reason = FromProto(d.reason());
  g.policy_reason = g.reason;
  g.source = DecisionSource::kDaemon;
  g.config_version = d.config_version();
  if (d.has_pin_expire_time()) {
    g.pin_expire = FromTimestamp(d.pin_expire_time());
  }
  g.pin_forced = d.pin_forced();
  // One decision per micro-batch, in id order (anything else is not an answer): a step
  // plan's as sent. A plain plan's one is mode and reason, with no vector: this runs on the
  // gRPC thread and the training thread commits the answer, so a vector here would be a
  // heap allocation freed on the other thread every step (DecisionBook::Commit reads it).
  for (int i = 0; i < d.micro_batches_size(); ++i) {
    const v1::MicroBatchDecision& m = d.micro_batches(i);
    if (m.id() != i || !IsValidMode(m.mode()) || !IsValidReason(m.reason())) return std::nullopt;
    g.microbatches.push_back({FromProto(m.mode()), FromProto(m.reason())});
  }
  g.stage_peak_bytes = d.predicted_stage_peak_bytes();
  return g;
}

}  // namespace spgate::client
