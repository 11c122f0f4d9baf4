// Step plans for pipelined jobs (docs/design.md §12): a job's layout (tensor,
// pipeline, virtual-pipeline, context and data parallel sizes, micro-batches per step,
// schedule), where a TP group sits in it, and the one function that decides every
// micro-batch of one step of one pipeline stage. Pure like the rest of policy/: the daemon
// and the worker's fallback call DecideStagePlan, so the same inputs give the same
// decisions on both sides.
//
// A stage's TP group decides on its own: the boundary between stages is the
// sequence-sharded layout in both modes (§12), so no p2p shape depends on a mode and two
// stages may run one micro-batch in different modes. Micro-batches are decided in id
// order, each advancing the group's policy state once at the optimizer step (so
// probe_interval_steps, min_dwell_steps and window_steps keep counting optimizer steps,
// and "the group's last decided step" means the same with and without step plans); the
// memory gate is the schedule-aware one (pipeline_memory.h), over the stage's whole step,
// and where it cannot hold every TP-only micro-batch it admits those expected to gain most.
//
// Usage:
//   JobLayout layout{.tp = 2, .pp = 4, .microbatches = 8};
//   StagePlanFacts plan{.step = 7, .stage = 0, .resident_bytes = r,
//                       .memory_budget_bytes = budget, .microbatches = facts};
//   StagePlanOutcome out = DecideStagePlan(group, config, layout, plan, pin, table, {});
//   // out.decisions[id] for every micro-batch id
#ifndef SPGATE_POLICY_STEP_PLAN_H_
#define SPGATE_POLICY_STEP_PLAN_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/adaptive_policy.h"
#include "policy/group_state.h"
#include "policy/pipeline_memory.h"
#include "policy/types.h"

namespace spgate {

// The job's shape, the same on every rank (the daemon refuses a rank whose layout
// differs). tp × pp × cp × dp ranks; a TP group per (dp_index, stage, cp_rank).
struct JobLayout {
  int tp = 1;
  int pp = 1;
  int vp = 1;  // model chunks per stage: 1 for 1F1B, >= 2 for interleaved 1F1B
  int cp = 1;
  int dp = 1;
  int microbatches = 1;  // per optimizer step
  PipelineSchedule schedule = PipelineSchedule::k1F1B;

  PipelineLayout pipeline() const { return {pp, vp, microbatches, schedule}; }
  int64_t groups() const { return int64_t{dp} * pp * cp; }
  friend bool operator==(const JobLayout&, const JobLayout&) = default;
};

inline constexpr int kMaxTensorParallel = 1024;
inline constexpr int kMaxContextParallel = 1024;
inline constexpr int64_t kMaxLayoutRanks = int64_t{1} << 24;
// Model-chunk passes a stage makes per step (microbatches x vp): what one step plan's
// decision walks, twice (forward and backward), under the daemon's lock.
inline constexpr int64_t kMaxStepPlanChunks = 4096;

// INVALID_ARGUMENT naming the field: every size in range, the pipeline layout valid
// (ValidatePipelineLayout), tp × pp × cp × dp ranks at most kMaxLayoutRanks, microbatches
// × vp at most kMaxStepPlanChunks.
absl::Status ValidateJobLayout(const JobLayout& layout);

// "" when equal, else the first differing field as "pp: the job's ranks registered 4,
// this rank 2".
std::string JobLayoutMismatch(const JobLayout& job, const JobLayout& rank);

// "tp=8 pp=4 vp=1 cp=1 dp=2 microbatches=8 schedule=1f1b" (logs, spgatectl).
std::string FormatJobLayout(const JobLayout& layout);
std::string_view ScheduleName(PipelineSchedule schedule);  // "1f1b", "interleaved_1f1b"

// Where a TP group sits. Its group index is (dp_index × pp + stage) × cp + cp_rank: the
// CP ranks of one (replica, stage) are neighbours, so they share one decision unit
// (GroupOf / cp), and they must: their ring exchanges are shaped by the mode.
struct StageCoordinates {
  int dp_index = 0;
  int stage = 0;
  int cp_rank = 0;
  friend bool operator==(const StageCoordinates&, const StageCoordinates&) = default;
};
absl::Status ValidateCoordinates(const JobLayout& layout, const StageCoordinates& at);
int64_t GroupOf(const JobLayout& layout, const StageCoordinates& at);
StageCoordinates CoordinatesOf(const JobLayout& layout, int64_t group);

// A feature that needs SP for the whole job (MoE with expert × tensor parallelism,
// overlap buffers sized at start-up, CUDA graphs captured for one mode): a name of 1 to
// 32 characters from [a-z0-9_]; at most kMaxSpRequiredFeatures per job.
inline constexpr int kMaxSpRequiredFeatures = 8;
absl::Status ValidateSpRequiredFeature(std::string_view name);
// A rank's list: at most kMaxSpRequiredFeatures names, each valid. INVALID_ARGUMENT
// naming sp_required otherwise.
absl::Status ValidateSpRequiredFeatures(std::span<const std::string> names);

// One micro-batch of a stage's step plan. lengths_known false: the stage did not learn
// its lengths in time (it decides SP, reason kLengthsUnknown).
struct MicrobatchFacts {
  int id = 0;
  bool lengths_known = true;
  double length_cv = 0.0;
  int64_t tokens = 0;
  MicrobatchMemory memory;  // this stage's bytes for it in each mode
  friend bool operator==(const MicrobatchFacts&, const MicrobatchFacts&) = default;
};

struct StagePlanFacts {
  int64_t step = 0;
  int stage = 0;
  uint64_t resident_bytes = 0;       // parameters, gradients, optimizer state
  uint64_t memory_budget_bytes = 0;  // 0: the memory gate is not applied
  std::span<const MicrobatchFacts> microbatches;  // index = id, 0 .. microbatches - 1
};

// The ids of a step plan's micro-batches, in the order sent: each of 0 .. microbatches-1
// exactly once, else INVALID_ARGUMENT naming the id (outside the range, repeated, missing).
absl::Status CheckMicrobatchIds(std::span<const int> ids, int microbatches);

// One micro-batch of a step plan as sent to the daemon or the client (docs/design.md §12):
// its id, its lengths (empty: the stage does not know them, and runs it SP with reason
// LENGTHS_UNKNOWN) and what it costs the stage in each mode.
struct MicrobatchPlanInput {
  int id = 0;
  std::span<const int64_t> lengths;
  MicrobatchMemory memory;
};

// A step plan's byte counts (resident, budget, each micro-batch's) are below this, so
// their sum over a step fits in 63 bits.
inline constexpr uint64_t kMaxStepPlanBytes = uint64_t{1} << 40;

// Whose layout a plan is checked against, as an error names it: "job j1" (`kind` "job",
// `id` "j1") or "this client" (no id). Formatted only for an error.
struct PlanOwner {
  std::string_view kind;
  std::string_view id;
};

// What CheckPlanShape reads of a plan.
struct PlanShape {
  bool batch_lengths = false;           // lengths or predicted peaks of the whole batch
  std::span<const MicrobatchPlanInput> microbatches;  // a step plan's, in the order sent
  uint64_t resident_bytes = 0, memory_budget_bytes = 0;
};

// Micro-batches need a layout (docs/design.md §12): without one (`layout` null) a plan
// carries lengths and no micro-batches; with one it is a step plan: no batch lengths or
// peaks, CheckMicrobatchIds, resident and budget below kMaxStepPlanBytes. INVALID_ARGUMENT
// naming the field; `whose` names the layout's owner and `field` the micro-batches
// ("micro_batches" on the wire, "microbatches" in the client's API).
absl::Status CheckPlanShape(const JobLayout* layout, const PlanShape& plan, PlanOwner whose,
                            std::string_view field);

// A step plan's micro-batch as the policy reads it: its byte counts below
// kMaxStepPlanBytes and its lengths, if any, valid (ComputeLengthStats). INVALID_ARGUMENT
// naming "<field>[id=N]".
absl::StatusOr<MicrobatchFacts> SummarizeMicrobatch(const MicrobatchPlanInput& m,
                                                    std::string_view field);

struct StagePlanOutcome {
  std::vector<Decision> decisions;  // index = micro-batch id
  // Each micro-batch's ADAPTIVE band (BandOf its length CV and tokens), whatever the
  // policy, so its telemetry is learned where it belongs; -1 when its lengths are unknown.
  std::vector<int8_t> bands;
  uint64_t peak_bytes = 0;          // the stage's predicted peak with these modes
  bool over_budget = false;         // even every micro-batch SP does not fit
  int explored = 0;                 // ADAPTIVE exploration micro-batches
  int flips_held = 0;               // ADAPTIVE micro-batches that held the group's mode
};

// How DecideStagePlan may read the group's learned inputs.
struct StagePlanOptions {
  // The decision must be the same for every CP rank's TP group of one (replica, stage)
  // without them talking (the fallback with cp > 1): decide from the plan, the config,
  // the pin and the group's decided history only, without the group's own wait-share
  // window or learned table, which differ between those groups.
  bool plan_only = false;
};

// Decides every micro-batch of `plan` in id order and advances `group` once per
// micro-batch. Per micro-batch: an SP-required job runs SP (kSpRequired; the policy's
// directive, JobDirective, before pins and unknown lengths: a TP-only step would break it);
// else a micro-batch without lengths runs SP (kLengthsUnknown); else the policy's answer
// under the pin, and a TP-only answer then passes the stage's schedule-aware memory gate
// over the whole step (StageMemoryGate::Admit) unless it is a forced pin. Where the gate
// cannot hold every TP-only answer, the micro-batches expected to gain most get it, as
// many as fit together (forced pins, then ADAPTIVE's exploration, then its learned
// estimates, else CV x tokens; ties in id order; id order where ADAPTIVE measured a
// switch's cost): the plan is decided again from `group` as it was, with that set
// (docs/design.md §12); `group` advances once either way. Preconditions:
// ValidateJobLayout(layout), plan.stage in [0, pp), CheckMicrobatchIds, plan.step after the
// group's last decided step, the byte counts below kMaxStepPlanBytes each.
StagePlanOutcome DecideStagePlan(GroupPolicyState& group, const GateConfig& config,
                                 const JobLayout& layout, const StagePlanFacts& plan,
                                 std::optional<PinDirective> pin, const ThroughputTable* table,
                                 bool sp_required, StagePlanOptions options = {});

}  // namespace spgate

#endif  // SPGATE_POLICY_STEP_PLAN_H_
