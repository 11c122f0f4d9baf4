// GroupDecider: the leader decides, everyone receives the same bytes; see
// group_decider.h.
#include "worker/client/group_decider.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/telemetry.h"

namespace spgate::client {
namespace {

// TelemetryWire's slots. Each is reduced with MAX; a value whose smallest over the ranks
// matters too is also sent negated.
enum TelemetrySlot : int {
  kStep, kNegStep, kMode, kNegMode, kReason, kNegReason, kRefused,
  kStepTime, kRsShare, kAllGather, kNormShare, kAllReduceShare, kTokens, kPadding,
  kPeakKey,      // peak_memory_bytes with the rank in its low bits
  kBusyKey,      // BusySeconds with the rank in its low bits: the slowest rank
};
static_assert(kBusyKey + 1 == TelemetryWire::kSlots);

// A rank rides in the low mantissa bits of a non-negative value: for such doubles the
// bit pattern orders as the value does, so the maximum of the keys is the largest value
// (to 2^-40 of itself) and, among equal ones, the highest rank. Integers below 2^40
// (peak bytes under 1 TiB) come back exactly after rounding.
constexpr int kRankBits = 12;
static_assert((1 << kRankBits) == kMaxTelemetryWireRanks);
constexpr uint64_t kRankMask = (uint64_t{1} << kRankBits) - 1;

double WithRank(double value, int rank) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits = (bits & ~kRankMask) | static_cast<uint64_t>(rank);
  std::memcpy(&value, &bits, sizeof(bits));
  return value;
}

std::pair<double, int> SplitRank(double key) {
  uint64_t bits;
  std::memcpy(&bits, &key, sizeof(bits));
  const int rank = static_cast<int>(bits & kRankMask);
  bits &= ~kRankMask;
  double value;
  std::memcpy(&value, &bits, sizeof(bits));
  return {value, rank};
}

double Share(double part_s, double step_s) {
  return step_s > 0 ? std::clamp(part_s / step_s, 0.0, 1.0) : 0.0;
}

}  // namespace

TelemetryWire ToTelemetryWire(const StepTelemetryInput& t, int rank_in_group, bool valid) {
  TelemetryWire w;
  const double step = static_cast<double>(t.step);
  const double mode = static_cast<double>(t.mode);
  const double reason = static_cast<double>(t.reason);
  w.v[kStep] = step;
  w.v[kNegStep] = -step;
  w.v[kMode] = mode;
  w.v[kNegMode] = -mode;
  w.v[kReason] = reason;
  w.v[kNegReason] = -reason;
  w.v[kRefused] = valid ? 0 : 1;
  if (!valid) return w;  // only the step and the refusal are read
  const int rank = std::clamp(rank_in_group, 0, kMaxTelemetryWireRanks - 1);
  w.v[kStepTime] = t.step_time_s;
  w.v[kRsShare] = Share(t.rs_wait_s, t.step_time_s);
  w.v[kAllGather] = t.all_gather_s;
  w.v[kNormShare] = Share(t.norm_stall_s, t.step_time_s);
  w.v[kAllReduceShare] = Share(t.all_reduce_s, t.step_time_s);
  w.v[kTokens] = static_cast<double>(t.effective_tokens);
  w.v[kPadding] = static_cast<double>(t.padding_tokens);
  w.v[kPeakKey] = WithRank(static_cast<double>(t.peak_memory_bytes), rank);
  w.v[kBusyKey] = WithRank(
      BusySeconds(t.step_time_s, t.rs_wait_s, t.all_gather_s, t.norm_stall_s, t.all_reduce_s),
      rank);
  return w;
}

absl::StatusOr<StepTelemetryInput> GroupTelemetryFromWire(const TelemetryWire& r,
                                                          int group_size) {
  const int64_t step = static_cast<int64_t>(r.v[kStep]);
  if (r.v[kRefused] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group telemetry: a rank's record for step %d was refused (see that rank's error); "
        "the group's record was not sent",
        step));
  }
  if (r.v[kStep] != -r.v[kNegStep]) {
    return absl::InternalError(absl::StrFormat(
        "group telemetry: the ranks reported steps %d to %d at once: the group's ranks are out "
        "of step",
        static_cast<int64_t>(-r.v[kNegStep]), step));
  }
  if (r.v[kMode] != -r.v[kNegMode] || r.v[kReason] != -r.v[kNegReason]) {
    return absl::InternalError(absl::StrFormat(
        "group telemetry: the ranks ran step %d in different modes or for different reasons "
        "(modes %g to %g): the group's decision did not reach every rank alike",
        step, -r.v[kNegMode], r.v[kMode]));
  }
  const double step_time = r.v[kStepTime];
  const auto [peak, peak_rank] = SplitRank(r.v[kPeakKey]);
  const int slowest = SplitRank(r.v[kBusyKey]).second;
  StepTelemetryInput t;
  t.step = step;
  t.mode = static_cast<Mode>(static_cast<int>(r.v[kMode]));
  t.reason = static_cast<Reason>(static_cast<int>(r.v[kReason]));
  t.step_time_s = step_time;
  t.rs_wait_s = r.v[kRsShare] * step_time;
  t.all_gather_s = r.v[kAllGather];
  t.norm_stall_s = r.v[kNormShare] * step_time;
  t.all_reduce_s = r.v[kAllReduceShare] * step_time;
  t.effective_tokens = static_cast<int64_t>(r.v[kTokens]);
  t.padding_tokens = static_cast<int64_t>(r.v[kPadding]);
  t.peak_memory_bytes = static_cast<uint64_t>(std::round(peak));
  t.ranks = group_size;
  t.slowest_rank = std::min(slowest, group_size - 1);
  t.peak_memory_rank = std::min(peak_rank, group_size - 1);
  return t;
}

DecisionWire ToWire(const GateDecision& d) {
  DecisionWire w;
  w.step = d.step;
  w.config_version = d.config_version;
  w.mode = static_cast<uint8_t>(d.mode);
  w.reason = static_cast<uint8_t>(d.reason);
  w.policy_reason = static_cast<uint8_t>(d.policy_reason);
  w.source = static_cast<uint8_t>(d.source);
  return w;
}

absl::Status LeaderFailure(int32_t status_code, int64_t step) {
  const auto code = static_cast<absl::StatusCode>(status_code);
  return absl::Status(code, absl::StrFormat(
                                "the group leader could not decide step %d (%s there: the "
                                "leader's own error says why%s)",
                                step, absl::StatusCodeToString(code),
                                code == absl::StatusCode::kFailedPrecondition
                                    ? ", e.g. no plan submitted for the step"
                                    : ""));
}

absl::StatusOr<GateDecision> FromWire(const DecisionWire& w) {
  auto valid_reason = [](uint8_t r) { return r >= 1 && r < kNumReasons; };
  if ((w.mode != 1 && w.mode != 2) || !valid_reason(w.reason) || !valid_reason(w.policy_reason) ||
      w.source < static_cast<uint8_t>(DecisionSource::kDaemon) ||
      w.source > static_cast<uint8_t>(DecisionSource::kMemoryOverride)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast payload for step %d is not a decision (mode %d, reason %d, source %d)",
        w.step, w.mode, w.reason, w.source));
  }
  GateDecision d;
  d.step = w.step;
  d.config_version = w.config_version;
  d.mode = static_cast<Mode>(w.mode);
  d.reason = static_cast<Reason>(w.reason);
  d.policy_reason = static_cast<Reason>(w.policy_reason);
  d.source = static_cast<DecisionSource>(w.source);
  return d;
}

// Per micro-batch id: mode, 3 - mode (the maximum of each catches ranks that ran it in
// different modes), forward, backward, reduce-scatter, all-gather, tokens, all-reduce.
void PackMicrobatchTelemetry(std::span<const MicrobatchTelemetryValues> records,
                             std::span<double> slots) {
  std::fill(slots.begin(), slots.end(), 0.0);
  for (const MicrobatchTelemetryValues& m : records) {
    double* v = slots.data() + kMicrobatchTelemetrySlots * m.id;
    v[0] = static_cast<double>(m.mode);
    v[1] = 3.0 - static_cast<double>(m.mode);
    v[2] = m.forward_s;
    v[3] = m.backward_s;
    v[4] = m.rs_wait_s;
    v[5] = m.all_gather_s;
    v[6] = static_cast<double>(m.effective_tokens);
    v[7] = m.all_reduce_s;
  }
}

size_t StragglerSlots(int group_size, int microbatches) {
  const auto n = static_cast<size_t>(std::max(group_size, 0));
  const size_t per_microbatch = static_cast<size_t>(std::max(microbatches, 0)) * n;
  return n + (per_microbatch <= kMaxStragglerBusyValues ? per_microbatch : 0);
}

void PackStragglerSlots(const StepTelemetryInput& t, int rank_in_group, int group_size,
                        std::span<double> slots) {
  std::fill(slots.begin(), slots.end(), 0.0);
  const auto n = static_cast<size_t>(group_size), rank = static_cast<size_t>(rank_in_group);
  if (rank >= n || slots.size() < n) return;
  slots[rank] = BusySeconds(t.step_time_s, t.rs_wait_s, t.all_gather_s, t.norm_stall_s,
                            t.all_reduce_s);
  if (slots.size() < n * (1 + t.microbatches.size())) return;  // past the bound: none
  for (const MicrobatchTelemetryValues& m : t.microbatches) {
    slots[n * (1 + static_cast<size_t>(m.id)) + rank] =
        BusySeconds(m.compute_s(), m.rs_wait_s, m.all_gather_s, 0, m.all_reduce_s);
  }
}

void StragglersFromReduced(std::span<double> slots, int group_size, StepTelemetryInput& group) {
  const auto n = static_cast<size_t>(group_size);
  if (n == 0 || slots.size() < n) return;
  group.straggler_s = StragglerSeconds(slots.first(n));
  if (slots.size() < n * (1 + group.microbatches.size())) return;
  for (MicrobatchTelemetryValues& m : group.microbatches) {
    m.straggler_s = StragglerSeconds(slots.subspan(n * (1 + static_cast<size_t>(m.id)), n));
  }
}

absl::StatusOr<std::vector<MicrobatchTelemetryValues>> MicrobatchesFromReduced(
    std::span<const double> slots, int microbatches, int64_t step) {
  if (static_cast<int64_t>(slots.size()) != int64_t{kMicrobatchTelemetrySlots} * microbatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d reduced values for %d micro-batches", slots.size(), microbatches));
  }
  std::vector<MicrobatchTelemetryValues> out(static_cast<size_t>(microbatches));
  for (int id = 0; id < microbatches; ++id) {
    const double* v = slots.data() + kMicrobatchTelemetrySlots * id;
    if (v[0] + v[1] != 3.0) {
      return absl::InternalError(absl::StrFormat(
          "step %d: the group's ranks ran micro-batch %d in different modes", step, id));
    }
    out[static_cast<size_t>(id)] = {.id = id,
                                    .mode = static_cast<Mode>(static_cast<int>(v[0])),
                                    .forward_s = v[2],
                                    .backward_s = v[3],
                                    .rs_wait_s = v[4],
                                    .all_gather_s = v[5],
                                    .effective_tokens = static_cast<int64_t>(v[6]),
                                    .all_reduce_s = v[7]};
  }
  return out;
}

namespace {

constexpr size_t kHeadBytes = sizeof(DecisionWire);

// The leader's broadcast: its decision and its micro-batches', or its failure's code, so
// that peers (which are, or will be, inside the broadcast) learn of it rather than wait
// forever. `out` holds the head and one byte per micro-batch.
void PackDecision(const absl::StatusOr<GateDecision>& d, int64_t step, std::span<uint8_t> out) {
  DecisionWire head;
  if (d.ok()) {
    head = ToWire(*d);
  } else {
    head.step = step;
    head.status_code = static_cast<int32_t>(d.status().code());
  }
  std::memcpy(out.data(), &head, kHeadBytes);
  if (!d.ok()) return;
  for (size_t i = kHeadBytes; i < out.size(); ++i) {
    out[i] = PackModeReason(d->microbatches[i - kHeadBytes]);
  }
}

// A receiving rank's decision from the leader's bytes.
absl::StatusOr<GateDecision> UnpackDecision(std::span<const uint8_t> in, int64_t step, int rank) {
  DecisionWire head;
  std::memcpy(&head, in.data(), kHeadBytes);
  if (head.step != step) {
    return absl::InternalError(absl::StrFormat(
        "rank %d expected the decision for step %d but the leader broadcast step %d: the "
        "group's ranks are out of step",
        rank, step, head.step));
  }
  if (head.status_code != 0) return LeaderFailure(head.status_code, step);
  ASSIGN_OR_RETURN(GateDecision d, FromWire(head));
  d.microbatches.reserve(in.size() - kHeadBytes);
  for (uint8_t b : in.subspan(kHeadBytes)) {
    const std::optional<Decision> m = UnpackModeReason(b);
    if (!m.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "broadcast micro-batch decisions for step %d are not decisions (byte %d)", step, b));
    }
    d.microbatches.push_back(*m);
  }
  return d;
}

}  // namespace

namespace {

// This rank's own arguments (GroupDecider::Create).
absl::Status CheckCreateArguments(GateClient* client, int rank_in_group, bool has_reduce) {
  if (rank_in_group < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank_in_group must be >= 0, got %d", rank_in_group));
  }
  if (rank_in_group != 0) {
    if (client != nullptr && client->options().rank_in_group != rank_in_group) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank %d's GateClient was created for rank %d", rank_in_group,
          client->options().rank_in_group));
    }
    return absl::OkStatus();
  }
  if (client == nullptr) {
    return absl::InvalidArgumentError("the group leader (rank 0) needs a GateClient");
  }
  const GateClientOptions& o = client->options();
  if (o.rank_in_group != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the leader's GateClient was created for rank %d", o.rank_in_group));
  }
  if (o.group_session && o.group_size > 1 && !o.controller.empty() && !has_reduce) {
    return absl::InvalidArgumentError(
        "the leader's client speaks for its group (group_session): pass the group's "
        "max-reduce so that the group's telemetry reaches it, or set group_session=false");
  }
  if (!o.group_session && o.group_size > 1 && has_reduce) {
    return absl::InvalidArgumentError(
        "a max-reduce was given, but the leader's client has a session of its own "
        "(group_session=false): each rank reports through its own client then");
  }
  if (o.group_size > kMaxTelemetryWireRanks && has_reduce) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size %d: the in-group telemetry names at most %d ranks", o.group_size,
        kMaxTelemetryWireRanks));
  }
  return absl::OkStatus();
}

// The leader's outcome as Create broadcasts it: status code, the group's size, whether the
// leader has a max-reduce and the doubles of its telemetry payload, then its error's
// message (cut to fit, NUL-terminated). A build before the payload's size was sent sends 0
// there.
struct CreateVerdict {
  int32_t status_code = 0;
  int32_t group_size = 0;
  uint8_t has_reduce = 0;
  uint8_t telemetry_slots = 0;
  uint8_t padding[6] = {};
};
static_assert(TelemetryWire::kSlots < 256);
constexpr size_t kVerdictHead = sizeof(CreateVerdict);

}  // namespace

absl::StatusOr<std::unique_ptr<GroupDecider>> GroupDecider::CreateLocal(GateClient* client,
                                                                        int rank_in_group,
                                                                        BroadcastFn broadcast,
                                                                        MaxReduceFn reduce,
                                                                        int group_size) {
  if (!broadcast) return absl::InvalidArgumentError("broadcast function is empty");
  RETURN_IF_ERROR(CheckCreateArguments(client, rank_in_group, static_cast<bool>(reduce)));
  if (client != nullptr && group_size != 0 && group_size != client->options().group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size: %d, but the client's group_size is %d (each rank's slot among the "
        "group's busy times follows it: every rank must give the same)",
        group_size, client->options().group_size));
  }
  if (group_size == 0 && client != nullptr) group_size = client->options().group_size;
  if (reduce && (group_size < 1 || group_size > kMaxTelemetryWireRanks ||
                 rank_in_group >= group_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "group_size: a rank that reduces the group's telemetry needs the group's size, in "
        "[rank_in_group + 1, %d] (here %d; 0 takes the client's, and this rank has none), "
        "got %d",
        kMaxTelemetryWireRanks, rank_in_group + 1, group_size));
  }
  return std::unique_ptr<GroupDecider>(new GroupDecider(
      client, rank_in_group, group_size, std::move(broadcast), std::move(reduce)));
}

absl::StatusOr<std::unique_ptr<GroupDecider>> GroupDecider::Create(GateClient* client,
                                                                   int rank_in_group,
                                                                   BroadcastFn broadcast,
                                                                   MaxReduceFn reduce,
                                                                   absl::Status refused) {
  if (!broadcast) {
    return absl::InvalidArgumentError(
        "broadcast function is empty: this rank cannot take part in the group's agreement");
  }
  const bool has_reduce = static_cast<bool>(reduce);
  const absl::Status own =
      refused.ok() ? CheckCreateArguments(client, rank_in_group, has_reduce) : refused;
  std::vector<uint8_t> bytes(kCreateVerdictBytes, 0);
  CreateVerdict v;
  if (rank_in_group == 0) {
    v = {.status_code = static_cast<int32_t>(own.code()),
         .group_size = client != nullptr ? client->options().group_size : 0,
         .has_reduce = has_reduce,
         .telemetry_slots = static_cast<uint8_t>(TelemetryWire::kSlots)};
    std::memcpy(bytes.data(), &v, kVerdictHead);
    // An OK status's message may be a null view: copy only what is there.
    const absl::string_view message = own.message();
    const size_t n = std::min(message.size(), kCreateVerdictBytes - kVerdictHead - 1);
    if (n > 0) std::memcpy(bytes.data() + kVerdictHead, message.data(), n);
  }
  RETURN_IF_ERROR(broadcast(std::span<uint8_t>(bytes), 0));
  if (rank_in_group != 0) {
    std::memcpy(&v, bytes.data(), kVerdictHead);
    bytes.back() = 0;
    if (own.ok() && v.status_code != 0) {
      return absl::Status(
          static_cast<absl::StatusCode>(v.status_code),
          absl::StrCat("the group's leader refused its GroupDecider: ",
                       reinterpret_cast<const char*>(bytes.data() + kVerdictHead)));
    }
    if (own.ok() && rank_in_group >= v.group_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank_in_group %d: the leader's group has %d ranks", rank_in_group, v.group_size));
    }
    if (own.ok() && (v.has_reduce != 0) != has_reduce) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "this rank was %s a max-reduce and the leader %s: every rank of a group passes one, "
          "or none",
          has_reduce ? "given" : "not given", v.has_reduce != 0 ? "was" : "was not"));
    }
    // Ranks of one build reduce payloads of one size: another size would reduce two
    // different counts, which the collective does not catch (it hangs or misreads).
    if (own.ok() && has_reduce && v.telemetry_slots != TelemetryWire::kSlots) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the group's leader runs another spgate client build (its telemetry payload is %d "
          "doubles, this rank's %d): every rank of a group must run the same one",
          v.telemetry_slots, TelemetryWire::kSlots));
    }
  }
  RETURN_IF_ERROR(own);
  return std::unique_ptr<GroupDecider>(new GroupDecider(
      client, rank_in_group, v.group_size, std::move(broadcast), std::move(reduce)));
}

absl::Status GroupDecider::ReportTelemetry(const StepTelemetryInput& t) {
  if (!reduce_) {
    if (client_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d has neither the group's max-reduce nor a client of its own to report "
          "telemetry with",
          rank_in_group_));
    }
    return client_->ReportTelemetry(t);
  }
  // A refused record still takes part in the reduction: the others are (or will be) in it.
  const int m = microbatches_;
  absl::Status valid = t.ranks > 1
                           ? absl::InvalidArgumentError(
                                 "telemetry: give GroupDecider each rank's own record (ranks 0 "
                                 "or 1); it makes the group's")
                           : ValidateStepTelemetry(TelemetryValues(t));
  if (valid.ok() && m > 0) valid = ValidateMicrobatchTelemetry(t.microbatches, m);
  if (valid.ok() && m > 0 && t.microbatches.empty()) {
    valid = absl::InvalidArgumentError(absl::StrFormat(
        "telemetry.micro_batches: a step plan's step needs one record per micro-batch (%d), "
        "got none",
        m));
  }
  if (valid.ok() && m == 0 && !t.microbatches.empty()) {
    valid = absl::InvalidArgumentError(
        "telemetry.micro_batches: only a step plan's step (Decide with micro-batches) has "
        "micro-batch records");
  }
  constexpr int kHead = TelemetryWire::kSlots;
  const size_t records = static_cast<size_t>(kMicrobatchTelemetrySlots) * static_cast<size_t>(m);
  reduce_buffer_.assign(kHead + records + StragglerSlots(group_size_, m), 0.0);
  const TelemetryWire head = ToTelemetryWire(t, rank_in_group_, valid.ok());
  std::copy(std::begin(head.v), std::end(head.v), reduce_buffer_.begin());
  const std::span<double> tail = std::span<double>(reduce_buffer_).subspan(kHead, records);
  const std::span<double> busy = std::span<double>(reduce_buffer_).subspan(kHead + records);
  if (valid.ok()) {
    PackMicrobatchTelemetry(t.microbatches, tail);
    PackStragglerSlots(t, rank_in_group_, group_size_, busy);
  }
  if (absl::Status s = reduce_(std::span<double>(reduce_buffer_), 0); !s.ok()) return s;
  if (!valid.ok() || !is_leader()) return valid;
  TelemetryWire reduced;
  std::copy_n(reduce_buffer_.begin(), kHead, std::begin(reduced.v));
  absl::StatusOr<StepTelemetryInput> group =
      GroupTelemetryFromWire(reduced, client_->options().group_size);
  if (!group.ok()) return group.status();
  if (m > 0) {
    ASSIGN_OR_RETURN(group->microbatches, MicrobatchesFromReduced(tail, m, group->step));
  }
  StragglersFromReduced(busy, group_size_, *group);
  return SendGroupRecord(*std::move(group));
}

absl::Status GroupDecider::SendGroupRecord(StepTelemetryInput group) {
  // The group's wait share for the fallback's window (what ObserveGroupRsWaitShare takes).
  RETURN_IF_ERROR(client_->ObserveGroupRsWaitShare(group.step, group.mode,
                                                   Share(group.rs_wait_s, group.step_time_s)));
  if (group.ranks <= 1) group.ranks = 0;  // a group of one: the leader's own record
  return client_->ReportTelemetry(group);
}

absl::Status GroupDecider::SubmitPlan(const BatchPlanInput& plan) {
  if (!is_leader()) return absl::OkStatus();
  return client_->SubmitPlan(plan);
}

absl::StatusOr<GateDecision> GroupDecider::Decide(int64_t step, int microbatches) {
  if (!is_leader()) return Decide(step, microbatches, absl::InfiniteFuture());
  return Decide(step, microbatches, absl::Now() + client_->options().decision_deadline);
}

absl::StatusOr<GateDecision> GroupDecider::Decide(int64_t step, int microbatches,
                                                  absl::Time deadline) {
  // Every rank passes the same count, so a bad one fails every rank before the broadcast.
  if (microbatches < 0 || microbatches > kMaxMicrobatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "microbatches: must be 0 (a plain plan) or in [1, %d] (a step plan's), got %d",
        kMaxMicrobatches, microbatches));
  }
  microbatches_ = microbatches;  // the step's telemetry has this many records
  decision_buffer_.assign(kHeadBytes + static_cast<size_t>(microbatches), 0);
  absl::StatusOr<GateDecision> d = absl::UnknownError("unset");
  if (is_leader()) {
    d = client_->AwaitDecision(step, deadline);
    // Whatever the count, the leader's answer must be what the others unpack: a step plan's
    // decision for a plain plan's call would leave the followers without its micro-batches.
    if (d.ok() && d->microbatches.size() != static_cast<size_t>(microbatches)) {
      d = absl::FailedPreconditionError(absl::StrFormat(
          "step %d was decided for %d micro-batches, not %d (is the client's layout the job's?)",
          step, d->microbatches.size(), microbatches));
    }
    PackDecision(d, step, decision_buffer_);
  }
  if (absl::Status s = broadcast_(std::span<uint8_t>(decision_buffer_), 0); !s.ok()) return s;
  if (is_leader()) return d;
  return UnpackDecision(decision_buffer_, step, rank_in_group_);
}

}  // namespace spgate::client
