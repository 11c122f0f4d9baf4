// The live state's private parts, shared by its implementation files: gate_state.cc (the
// decision and telemetry paths, operator changes), gate_state_sessions.cc (sessions,
// launches, housekeeping), gate_state_learned.cc (the learned tables) and
// gate_state_views.cc (the admin views and what-if). Not for other users: everything
// here is guarded by GateState's mutex (docs/design.md §4, §8).
#ifndef SPGATE_SERVER_GATE_STATE_INTERNAL_H_
#define SPGATE_SERVER_GATE_STATE_INTERNAL_H_

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "policy/config_schedule.h"
#include "policy/group_state.h"
#include "policy/rolling_window.h"
#include "server/gate_state.h"
#include "server/learned_store.h"
#include "server/metrics.h"

namespace spgate::server {
namespace gate_state_internal {

constexpr int64_t kNoStep = std::numeric_limits<int64_t>::min();
constexpr int kPendingSlots = 16;
// Each mode's MODES window holds its last 512 micro-batches (a plain plan's step is its
// one micro-batch).
constexpr int64_t kModeWindowSamples = 512;
// A group's cached step-plan answers keep at most this many micro-batch bytes (and at
// least the two newest steps), whatever --decision_cache_steps says: 128 steps of 4,096
// micro-batches would otherwise be 512 KiB a group.
constexpr size_t kMaxStepPlanCacheBytes = 64 * 1024;
static_assert(kNumReasons <= 16, "a cached micro-batch decision packs the reason in 4 bits");

// One step's telemetry while the group's ranks report it (max over ranks, docs/design.md
// §2); finalized once every rank reported or a newer step needs the slot.
// What the leaders were last told of one learned table (docs/design.md §11, "The
// fallback"): its preference bits, its detected changes (counted and pushed), and the
// prior's choices for the bands without samples, checked at most once per push interval.
struct LearnedTold {
  uint64_t bits = 0;
  int64_t changes = 0;
  uint64_t prior_bits = 0;
  absl::Time prior_checked = absl::InfinitePast();
};

struct PendingStep {
  int64_t step = kNoStep;
  bool finalized = false;
  int reported = 0;
  Mode mode = Mode::kSequenceParallel;
  double step_time = 0, rs_share = 0, all_gather = 0, norm_share = 0;
  int64_t tokens = 0, padding = 0;
  uint64_t peak = 0;
  // rank_in_group of the slowest rank (the most BusySeconds, which slowest_busy holds) and
  // of the highest peak memory.
  int slowest_rank = -1, peak_rank = -1;
  double slowest_busy = 0;
  bool fallback = false;  // a rank ran its fallback's decision, not the daemon's
  // A step plan's micro-batches (index = id), each value the largest over the ranks so
  // far; empty for plain plans, and released when the step is finalized.
  std::vector<MicrobatchTelemetryValues> microbatches;
  // The step's straggler delay (StragglerSeconds): a group record's own, or the ranks'
  // BusySeconds as their records arrive; per micro-batch, [id * group size + arrival],
  // while that is within kMaxStragglerBusyValues (beyond, the micro-batches' is not known).
  double all_reduce = 0;  // the largest all_reduce_s: TP-only's collectives were timed
  double straggler = -1;
  absl::InlinedVector<double, 8> busy;
  std::vector<double> microbatch_busy;
  size_t microbatch_columns = 0;  // rank records whose micro-batches it holds

  // Folds a record's micro-batches in: each value the largest so far; a group record's
  // delays as sent, a rank's compute (BusySeconds) into the column of its busy time, the
  // newest in `busy` (gate_state_learned.cc).
  void FoldMicrobatches(std::span<const MicrobatchTelemetryValues> records, bool group_record,
                        size_t group_size);
  // microbatch_busy's ranks per micro-batch: the group's size when it was filled; 0 empty.
  size_t BusyStride() const {
    return microbatches.empty() ? 0 : microbatch_busy.size() / microbatches.size();
  }
};


// The rolling wait share a decision and a group's status report: none while the window
// holds no SP step (a job's start, after every RS_WAIT trip).
inline std::optional<double> RollingValue(const RsWaitObservation& rs) {
  return rs.samples > 0 ? std::optional<double>(rs.mean) : std::nullopt;
}

// A decision as the group's cache keeps it: 72 bytes where a DecisionRecord is 232 and
// the job id's copy (the cache is the largest item of a group, docs/benchmarks.md). The
// job and group come from the group that holds it; Expand gives back the record exactly
// as it was made, so a retry's answer is the same bytes.
struct CachedDecision {
  int64_t step = 0;
  uint64_t plan_digest = 0;
  int64_t config_version = 0;
  double length_cv = 0;
  double rolling_rs_wait_share = 0;
  int64_t time_ns = 0;                  // absl::ToUnixNanos of the decision's time
  int64_t pin_expire_ns = 0;            // PINNED: the pin's end; has_pin_expire says
  int64_t plan_tokens = -1;             // the bound on the step's telemetry's tokens
  uint8_t mode = 0, reason = 0;
  int8_t band = -1;
  bool pin_forced = false, has_pin_expire = false;
  bool has_rs_wait = false;  // rolling_rs_wait_share is set: the window had an SP step

  static CachedDecision Of(const DecisionRecord& d) {
    CachedDecision c;
    c.step = d.step;
    c.plan_digest = d.plan_digest;
    c.config_version = d.config_version;
    c.length_cv = d.length_cv;
    c.has_rs_wait = d.rolling_rs_wait_share.has_value();
    c.rolling_rs_wait_share = d.rolling_rs_wait_share.value_or(0.0);
    c.time_ns = absl::ToUnixNanos(d.time);
    c.has_pin_expire = d.pin_expire.has_value();
    c.pin_expire_ns = d.pin_expire ? absl::ToUnixNanos(*d.pin_expire) : 0;
    c.plan_tokens = d.plan_tokens;
    c.mode = static_cast<uint8_t>(d.mode);
    c.reason = static_cast<uint8_t>(d.reason);
    c.band = static_cast<int8_t>(d.band);
    c.pin_forced = d.pin_forced;
    return c;
  }
  DecisionRecord Expand(const std::string& job_id, int group) const {
    DecisionRecord d;
    d.job_id = job_id;
    d.group = group;
    d.step = step;
    d.mode = static_cast<Mode>(mode);
    d.reason = static_cast<Reason>(reason);
    d.config_version = config_version;
    d.length_cv = length_cv;
    if (has_rs_wait) d.rolling_rs_wait_share = rolling_rs_wait_share;
    d.time = absl::FromUnixNanos(time_ns);
    if (has_pin_expire) d.pin_expire = absl::FromUnixNanos(pin_expire_ns);
    d.pin_forced = pin_forced;
    d.band = band;
    d.plan_digest = plan_digest;
    d.plan_tokens = plan_tokens;
    return d;
  }
};
static_assert(sizeof(CachedDecision) == 72);

// A step plan's per-micro-batch answer beside its CachedDecision (same step): a byte per
// micro-batch (PackModeReason), the stage's predicted peak and ADAPTIVE's counts (a CP
// peer's answer carries them to the metrics of the group that adopts it).
struct CachedStepPlan {
  int64_t step = 0;
  uint64_t stage_peak_bytes = 0;
  int explored = 0, flips_held = 0;
  std::vector<uint8_t> packed;
  // Each micro-batch's band (-1: none), for learning its telemetry when it arrives, and
  // its plan's tokens (-1: not given), the bound on its telemetry's.
  std::vector<int8_t> bands;
  std::vector<int64_t> tokens;

  size_t bytes() const { return packed.size() + bands.size() + tokens.size() * sizeof(int64_t); }

  static CachedStepPlan Of(const DecisionRecord& d) {
    CachedStepPlan c;
    c.step = d.step;
    c.stage_peak_bytes = d.stage_peak_bytes;
    c.explored = d.explored;
    c.flips_held = d.flips_held;
    c.bands = d.microbatch_bands;
    c.tokens = d.microbatch_tokens;
    c.packed.reserve(d.microbatches.size());
    for (const Decision& m : d.microbatches) c.packed.push_back(PackModeReason(m));
    return c;
  }
  void ExpandInto(DecisionRecord& d) const {
    d.stage_peak_bytes = stage_peak_bytes;
    d.explored = explored;
    d.flips_held = flips_held;
    d.microbatch_tokens = tokens;
    d.microbatches.clear();
    d.microbatches.reserve(packed.size());
    for (uint8_t b : packed) d.microbatches.push_back(UnpackModeReason(b).value());
  }
};

struct Rank {
  int global_rank = 0;
  std::string host;
  absl::Time last_seen;
  int streams = 0;
  bool streamed = false;   // has attached a Connect stream (else a unary-only client)
  std::string session_id;  // its newest session; registering again replaces it
  // Ranks this one's session stands for: the group's size for a leader's group session
  // (its followers never register), else 1.
  int covers = 1;
  // The newest step this rank reported: a record for it or an older step again is a
  // duplicate and counts once (a step is final once every rank reported).
  int64_t last_telemetry_step = kNoStep;
};

// One mode's rolling window for GetJob's MODES table (docs/design.md §12): a sample per
// micro-batch that ran the mode — its tokens and its compute seconds on the stage — or, for
// a plain plan, per group-step (its one micro-batch: the group's tokens and step time). A
// step's samples are pushed together, so the oldest step is the first to leave.
struct ModeWindow {
  RollingWindow seconds{kModeWindowSamples};
  RollingWindow tokens{kModeWindowSamples};
  // The group-step's peak memory on its last sample of the mode, -1 on its others: the
  // samples >= 0 count the group-steps the window holds samples of, their max is the
  // peak of those group-steps.
  RollingWindow peak{kModeWindowSamples};
  // The launch's group-steps whose record ran this mode (a step plan's: SP when any of
  // its micro-batches did) and their step seconds: the job's mean step time.
  int64_t group_steps = 0;
  double step_seconds = 0;

  void Push(double sample_seconds, double sample_tokens, bool step_end, double step_peak) {
    seconds.Push(sample_seconds);
    tokens.Push(sample_tokens);
    peak.Push(step_end ? step_peak : -1.0);
  }
  int64_t StepsInWindow() const {
    int64_t n = 0;
    for (double v : peak.Samples()) n += v >= 0 ? 1 : 0;
    return n;
  }
};

// A group's ranks seen within `stale_after` of `now` and the others, each session counting
// the ranks it covers (a leader's group session: the whole group), capped at the group's
// size (a group session and per-rank sessions of the same group may overlap).
struct RankCounts {
  int active = 0, stale = 0;
};
template <typename Ranks>
RankCounts CountRanks(const Ranks& ranks, int size, absl::Time now, absl::Duration stale_after) {
  RankCounts c;
  for (const auto& [r, rank] : ranks) {
    (now - rank.last_seen > stale_after ? c.stale : c.active) += rank.covers;
  }
  c.active = std::min(c.active, size);
  c.stale = std::min(c.stale, size - c.active);
  return c;
}

inline bool Active(const std::optional<PinState>& pin, absl::Time now) {
  return pin.has_value() && pin->expire > now;
}

inline std::optional<PinDirective> AsDirective(const std::optional<PinState>& pin) {
  if (!pin) return std::nullopt;
  return PinDirective(pin->mode, pin->force);
}

}  // namespace gate_state_internal

struct GateState::Group {
  int index = 0;
  int size = 1;
  GroupPolicyState policy;
  ConfigSchedule schedule;
  RollingWindow all_gather{50}, norm_stall{50};
  // The newest decisions, ascending by step (steps strictly increase per group), so a
  // retry is a binary search. Grows with use up to decision_cache_steps entries.
  std::deque<gate_state_internal::CachedDecision> cache;
  gate_state_internal::PendingStep pending[gate_state_internal::kPendingSlots];
  std::map<int, gate_state_internal::Rank> ranks;
  absl::Time last_activity;
  // The step window (docs/design.md §10): a plan may resume further than
  // max_plan_lead_steps ahead only as the first after its leader (re)attached, or after
  // the group sent no plan for stale_after.
  bool resume_allowed = true;
  absl::Time last_plan_time = absl::InfinitePast();
  std::unique_ptr<GroupMetrics> metrics;  // never null
  // The newest step learned from, the mode it ran (a switch's cost is measured on the
  // first step after the mode that ran changed) and whether it ran as a probe.
  int64_t learned_step = gate_state_internal::kNoStep;
  Mode learned_mode = Mode::kSequenceParallel;
  bool learned_probe = false;
  // The last complete step's slowest rank, its step time, and its peak-memory rank.
  int64_t slowest_step = gate_state_internal::kNoStep;
  int slowest_rank = -1;
  double slowest_step_time = 0;
  int peak_rank = -1;
  bool group_session = false;  // its leader registered for the whole group
  // Step plans (a job with a layout): the micro-batch answers of the cached steps (the
  // same steps as `cache`), and the last one's stage peak and TP-only micro-batches.
  std::deque<gate_state_internal::CachedStepPlan> step_plans;
  size_t step_plan_bytes = 0;  // of the packed decisions in step_plans
  uint64_t stage_peak = 0;
  int last_tp_microbatches = 0;

  const gate_state_internal::CachedStepPlan* CachedPlan(int64_t step) const {
    auto it = std::lower_bound(
        step_plans.begin(), step_plans.end(), step,
        [](const gate_state_internal::CachedStepPlan& d, int64_t s) { return d.step < s; });
    return it != step_plans.end() && it->step == step ? &*it : nullptr;
  }
  // The cached answer for `step` as it was sent, if still cached. A step plan's answer
  // needs its micro-batch part too (`step_plan`: the job has a layout); the step-plan
  // cache may keep fewer steps than `cache` (at most kMaxStepPlanCacheBytes).
  std::optional<DecisionRecord> Answer(const std::string& job_id, int64_t step,
                                       bool step_plan) const {
    const gate_state_internal::CachedDecision* c = Cached(step);
    if (c == nullptr) return std::nullopt;
    DecisionRecord d = c->Expand(job_id, index);
    if (const gate_state_internal::CachedStepPlan* p = CachedPlan(step)) {
      p->ExpandInto(d);
    } else if (step_plan) {
      return std::nullopt;
    }
    return d;
  }

  const gate_state_internal::CachedDecision* Cached(int64_t step) const {
    auto it = std::lower_bound(
        cache.begin(), cache.end(), step,
        [](const gate_state_internal::CachedDecision& d, int64_t s) { return d.step < s; });
    return it != cache.end() && it->step == step ? &*it : nullptr;
  }
};

struct GateState::Job {
  std::string id;
  // The launch whose live state this is: its lease's in the LaunchBook, set with it
  // (empty: none), so that the decision path checks a session's launch without the
  // book's lock.
  std::string incarnation;
  JobOperatorView op;  // effective config and pins, from the operator store
  std::map<int, std::unique_ptr<Group>> groups;
  gate_state_internal::ModeWindow modes[kModeSlots];
  // Decisions by (mode, reason): one per micro-batch (a plain plan's step is one).
  int64_t decisions[kModeSlots][kNumReasons] = {};
  int64_t group_steps_decided = 0;  // one per (group, step) decided
  int64_t local_decisions = 0;
  int64_t memory_overrides = 0;  // daemon answers its workers' memory gates refused
  absl::flat_hash_map<std::string, std::weak_ptr<SessionSink>> sinks;
  uint64_t memory_budget = 0;
  int sessions = 0;  // entries of GateState::sessions_ for this job
  absl::Time last_activity;
  std::unique_ptr<JobMetrics> metrics;  // never null
  // The ADAPTIVE policy's learned table, pooled over the groups (docs/design.md §11),
  // the band edges it was learned with, and what was last told to the leaders.
  ThroughputTable learned;
  double learned_cv_band_width = GateConfig{}.adaptive_cv_band_width;
  int64_t learned_tokens_band_base = GateConfig{}.adaptive_tokens_band_base;
  gate_state_internal::LearnedTold learned_told;
  bool learned_push_due = false;
  absl::Time learned_pushed = absl::InfinitePast();
  AdaptiveGainLedger gain;  // ADAPTIVE's learned gain over the STATIC gates
  int64_t exploration_steps = 0;
  // Its launch's layout, set by the first rank that registers with one, and the union of
  // its ranks' SP-required features (docs/design.md §12); both reset with the launch.
  std::optional<JobLayout> layout;
  std::vector<std::string> sp_required;
  // A job with a layout learns per pipeline stage (docs/design.md §12), from each
  // micro-batch's compute on the stage: one table per stage (index = stage) and what was
  // last told to that stage's leaders; `learned` above then stays empty.
  std::vector<ThroughputTable> stage_learned;
  std::vector<gate_state_internal::LearnedTold> stage_learned_told;
  // The tables on disk (server/learned_store.h): what the launch's first registrant
  // declared (none yet: nothing is written), when a step was last folded in, the job's
  // mean step time then, whether that is not on disk yet and when it last went there; and
  // whether the tables came from an earlier launch, to be restamped at its first step.
  std::optional<LearnedKey> learned_key;
  bool hardware_mismatch_logged = false;  // a rank declared another hardware id
  absl::Time learned_fold_time = absl::InfinitePast();
  double learned_step_seconds = 0;
  bool learned_dirty = false;
  absl::Time learned_saved = absl::InfinitePast();
  bool learned_restamp = false;
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_GATE_STATE_INTERNAL_H_
