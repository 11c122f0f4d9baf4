// The leader's decision book: the plans it submitted and not yet decided, the daemon's
// answers and refusals as they arrive, and the commit of each step in step order — the
// daemon's answer when it is there, otherwise the local fail-static policy's
// (local_policy.h). No lock, no gRPC, no clock: GateClient guards it with its mutex and
// feeds it; tests drive it directly (tests/worker/client/decision_book_test.cc).
//
// Invariants (docs/design.md §4):
//  - steps are committed in increasing order, each exactly once; committing advances the
//    fallback's group state with the decision actually run, so a later local decision
//    is the one the daemon would make;
//  - asking again for the last committed step returns the same decision;
//  - an answer for a step already committed is counted as late and changes nothing;
//  - the group never runs TP-only for a plan (or a micro-batch of a step plan) whose
//    TP-only peak the worker's own memory gate says does not fit (TpOnlyOverBudget, or
//    the stage's StageMemoryGate, under the config in force for the step), whoever
//    answered, unless an operator forced it (PINNED with pin_forced): such a daemon
//    answer runs SP with the memory gate's reason instead, source kMemoryOverride, and is
//    counted (memory_overrides). A daemon that is wrong, or not the daemon, can then cost
//    throughput but never an out-of-memory;
//  - one shape and one commit path: a plain plan is the one-micro-batch case of a step
//    plan (PlanRecord); only the policy's rules for it (DecideOrAdmit, by the book's
//    layout, as the daemon's PolicyStep) differ.
//
// Usage:
//   DecisionBook book(GateConfig{}, /*max_pending_plans=*/1024, DecisionSource::kFallback);
//   RETURN_IF_ERROR(book.AddPlan(std::move(plan)));        // step 7
//   book.OnDaemonDecision(daemon_answer);                  // maybe, from the stream
//   ASSIGN_OR_RETURN(auto committed, book.Lookup(7));      // nullopt: not committed yet
//   GateDecision d = book.Commit(7);                       // daemon's or local
#ifndef SPGATE_WORKER_CLIENT_DECISION_BOOK_H_
#define SPGATE_WORKER_CLIENT_DECISION_BOOK_H_

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/telemetry.h"
#include "policy/types.h"
#include "worker/client/client_types.h"
#include "worker/client/local_policy.h"

namespace spgate::client {

// One submitted plan, in the one shape the client keeps (docs/design.md §12): a step plan's
// micro-batches by id, each with its lengths (kept for re-sends) and summary, and the
// stage's resident bytes. A plain plan (a client without a layout) is the one-stage,
// one-micro-batch case: micro-batch 0 has its lengths and, as its activations, its two
// predicted peaks (a one-stage, one-micro-batch step peaks at resident + activation +
// workspace, both 0 here). MakePlanRecord converts either from BatchPlanInput; the wire
// (wire.cc) converts back. The transport fields (sent_on_stream, taken) belong to the
// client's writer; the book only keeps them with the plan. The book holds each plan by
// shared_ptr so the writer takes it over without a copy under the client's lock: once
// added only the transport fields change (under that lock), and the writer reads only the
// others (outside it, serialising) and lets go of it under the lock again; a record is
// refilled for a later plan only after that (DecisionBook::NewRecord).
struct PlanRecord {
  int64_t step = 0;
  uint64_t budget = 0;
  uint64_t resident = 0;
  absl::InlinedVector<MicrobatchFacts, 1> microbatches;  // index = id
  // Index = id; empty when the client sends nothing (no controller).
  absl::InlinedVector<std::vector<int64_t>, 1> lengths;
  uint64_t sent_on_stream = 0;  // stream id it was last written on; 0: never
  absl::Time submitted;
  absl::Time taken = absl::InfinitePast();  // by the writer, for the last stream it went on
  // Every field: a refilled spare must equal a new record (decision_book_test).
  friend bool operator==(const PlanRecord&, const PlanRecord&) = default;
};

struct DecisionBookCounters {
  int64_t plans_submitted = 0;
  int64_t plans_dropped = 0;       // over max_pending_plans
  int64_t plans_rejected = 0;      // refused by the daemon
  int64_t decisions_received = 0;  // daemon answers for pending plans
  int64_t daemon_decisions = 0;    // commits that ran the daemon's answer
  int64_t late_decisions = 0;      // daemon answers for steps already committed
  int64_t local_decisions = 0;     // commits decided by the local policy
  // Commits whose daemon answer (TP-only) the memory gate forbade; SP ran instead. Every
  // commit is exactly one of daemon, local, memory override.
  int64_t memory_overrides = 0;
  // The local policy's decisions by reason: one per plain plan, one per micro-batch of a
  // step plan (so a step plan's local commit adds its micro-batches here, 1 above).
  std::array<int64_t, kNumReasons> local_decisions_by_reason{};
};

// `plan` as a record (the one shape above) for a client with `layout` (null: none, plain
// plans), its budget `default_budget` when the plan gives none, its lengths kept when
// `keep_lengths` (a client that sends its plans). On success every field of `rec` is set,
// so a spare (DecisionBook::NewRecord) carries nothing of its last plan but its buffers'
// capacity; on an error `rec` is partly filled and must not be used.
// INVALID_ARGUMENT naming the field: micro-batches without a layout, or with one a
// repeated, missing or out-of-range id, bad lengths, byte counts of 2^40 or more, or
// lengths / predicted peaks given at the top
// (CheckPlanShape, SummarizeMicrobatch); a plain plan's bad lengths (ComputeLengthStats).
absl::Status MakePlanRecord(const JobLayout* layout, const BatchPlanInput& plan,
                            uint64_t default_budget, PlanRecord* rec, bool keep_lengths = true);

// Where the book's group sits in a pipelined job, for its step plans' fallback.
struct BookLayout {
  std::optional<JobLayout> layout;  // none: plain plans
  int stage = 0;
  bool sp_required = false;  // this rank declared a feature that needs SP throughout
};

class DecisionBook {
 public:
  static constexpr int64_t kNoStep = std::numeric_limits<int64_t>::min();

  // `local_source`: how a local decision is labelled (kFallback with a daemon, reason
  // CONTROLLER_UNAVAILABLE; kLocalOnly without one, the gate's own reason).
  DecisionBook(const GateConfig& initial, int max_pending_plans, DecisionSource local_source,
               BookLayout layout = {});

  // A record for the next plan, for MakePlanRecord to fill: one of the book's spares when
  // it has one (its buffers keep their capacity), else a new one. A committed or dropped
  // plan's record becomes a spare when the book holds its last reference (GateClient's
  // writer lets go of the records it sent under the client's lock, so a count of one seen
  // under that lock is final) and its lengths' capacity is at most kMaxSpareLengths, and
  // its map node too: a steady run of plans of one shape allocates nothing per step for
  // them.
  std::shared_ptr<PlanRecord> NewRecord();

  // FAILED_PRECONDITION for a step at or below the last committed one, ALREADY_EXISTS
  // for a step already submitted. Over max_pending_plans the oldest plan is dropped.
  absl::Status AddPlan(std::shared_ptr<PlanRecord> plan);
  absl::Status AddPlan(PlanRecord plan) {
    return AddPlan(std::make_shared<PlanRecord>(std::move(plan)));
  }

  // The daemon's answer for d.step, kept by move (the stream's thread hands it over:
  // nothing is copied under the client's lock). Returns the plan it answers (e.g. for
  // latency), or null when the step is already committed (counted late) or has no plan.
  const PlanRecord* OnDaemonDecision(GateDecision d);
  // The daemon refused the plan for `step`: it will be decided locally without waiting.
  // False when the step is already committed.
  bool OnRejection(int64_t step);

  // Whether Commit(step) would use an answer from the daemon side (decision or refusal),
  // i.e. there is nothing left to wait for.
  bool Answered(int64_t step) const {
    return daemon_.contains(step) || rejected_.contains(step);
  }

  // The committed decision when `step` is the last committed step; nullopt when `step`
  // has a plan and is not committed yet; FAILED_PRECONDITION for an older step or a step
  // without a plan.
  absl::StatusOr<std::optional<GateDecision>> Lookup(int64_t step) const;

  // Commits `step` (Lookup returned nullopt): the daemon's answer if there is one for this
  // plan (one decision per micro-batch of it; a plain plan's one in its mode and reason)
  // past the memory gate
  // (a decision it forbids runs SP, source kMemoryOverride, without the pin when no PINNED
  // decision runs), otherwise the local policy's, with pins judged at `now`. Forgets
  // everything at or below `step`.
  GateDecision Commit(int64_t step, absl::Time now);

  // The fallback's inputs.
  void ScheduleConfig(const GateConfig& config, int64_t version, int64_t effective_from_step) {
    policy_.ScheduleConfig(config, version, effective_from_step);
  }
  void ObserveRsWaitShare(int64_t step, Mode mode, double share) {
    policy_.ObserveRsWaitShare(step, mode, share);
  }
  // The learned throughput the daemon last sent (ADAPTIVE's fallback uses it).
  void SetLearnedTable(const ThroughputTable& table) { policy_.SetLearnedTable(table); }
  const ThroughputTable& learned_table() const { return policy_.learned_table(); }
  const ScheduledConfig& ConfigFor(int64_t step) const { return policy_.ConfigFor(step); }

  // Undecided plans by step (the writer marks what it sent).
  using PlanMap = std::map<int64_t, std::shared_ptr<PlanRecord>>;
  PlanMap& plans() { return plans_; }
  const PlanMap& plans() const { return plans_; }
  // Spare records and map nodes held (tests).
  size_t spare_records() const { return spares_.records.size(); }
  size_t spare_nodes() const { return spares_.nodes.size(); }
  const DecisionBookCounters& counters() const { return counters_; }
  int64_t last_committed_step() const { return last_step_; }
  // What the last committed step's plan bounds its telemetry by (docs/design.md §2,
  // "Range rules"): nothing for another step. Valid until the next Commit.
  TelemetryBounds TelemetryBoundsFor(int64_t step) const {
    if (step != last_step_) return {};
    return {.plan_tokens = last_tokens_, .microbatch_tokens = last_microbatch_tokens_};
  }

 private:
  struct Admitted {
    uint64_t stage_peak_bytes = 0;  // a step plan's; 0 for a plain plan
    int overridden = 0;             // the daemon's decisions the memory gate made SP
  };
  // The plan's decisions into decisions_: the local policy's (`answer` null, advancing its
  // state) or `answer`'s past the plan's memory gate under `config`.
  Admitted DecideOrAdmit(const PlanRecord& plan, const GateConfig& config,
                         const GateDecision* answer, absl::Time now);

  static constexpr size_t kSpares = 4;
  // A spare keeps its buffers: one whose lengths hold room for more sequences than this
  // (512 KiB of them) is freed instead, so four spares never pin more than 2 MiB.
  static constexpr size_t kMaxSpareLengths = size_t{1} << 16;
  // Spare records (each the only reference to it) and map nodes (empty values), at most
  // kSpares of each, reserved up front. A cache, not state: a copy of the book (a test's
  // shadow) starts without any, and the records it shares with this one are not spares
  // for either while both hold them.
  struct Spares {
    std::vector<std::shared_ptr<PlanRecord>> records;
    std::vector<PlanMap::node_type> nodes;
    Spares() {
      records.reserve(kSpares);
      nodes.reserve(kSpares);
    }
    Spares(const Spares&) : Spares() {}
    Spares& operator=(const Spares&) {
      records.clear();
      nodes.clear();
      return *this;
    }
  };
  // Takes `it` out of plans_ and keeps its node and, if no one else holds it, its record
  // as spares; returns the next entry.
  PlanMap::iterator Retire(PlanMap::iterator it);

  LocalGatePolicy policy_;
  const BookLayout layout_;
  const int max_pending_plans_;
  const DecisionSource local_source_;
  PlanMap plans_;
  Spares spares_;
  absl::flat_hash_map<int64_t, GateDecision> daemon_;
  absl::flat_hash_set<int64_t> rejected_;
  int64_t last_step_ = kNoStep;
  // The last committed plan's tokens (-1: not known) and its micro-batches', by id.
  int64_t last_tokens_ = -1;
  std::vector<int64_t> last_microbatch_tokens_;
  // The stage's ops under its schedule (a layout's only), computed once.
  std::vector<PipelineOp> ops_;
  // A commit's decisions, one per micro-batch, and the stage gate's bytes per micro-batch:
  // kept between commits so that a step allocates nothing for them.
  std::vector<Decision> decisions_;
  std::vector<MicrobatchMemory> memory_;
  GateDecision last_;
  DecisionBookCounters counters_;
};

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_DECISION_BOOK_H_
