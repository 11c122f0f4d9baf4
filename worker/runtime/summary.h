// What a worker run measured, per step and rank, and the run summary built from it on
// world rank 0 (docs/design.md §5 --summary_json keys, plus more). Summarize is a pure
// function of the records, so the aggregation rules are testable without MPI. Counts are
// steps (per group: `steps`), group-steps (a TP group's step: the per-mode keys, sources)
// or micro-batches (a pipeline's decisions); tokens/s is the job's:
//   - a group step's time is the slowest rank's (the step ends when every rank is done);
//   - effective_tokens_per_s (alias job_effective_tokens_per_s): per TP group, effective
//     tokens / summed step time, then summed over the data-parallel groups (they run
//     concurrently): the job's tokens/s, not one group's;
//   - step_time_p95_s: p95 (nearest rank) of group step times;
//   - peak_memory_bytes: max over ranks and steps; decisions: the group leaders' counts,
//     one per group-step, or with pipelines one per micro-batch of each stage;
//   - memory_overrides: summed over ranks (only group leaders decide, so over groups);
//   - consistency_violations: (group, step) pairs whose ranks ran different modes.
//
// Usage (world rank 0, after gathering):
//   RunSummary s = Summarize(DescribeRun(options, world_size), records_by_rank, counters);
//   std::cout << SummaryTable(s);
//   WriteFile(path, SummaryJson(s));
#ifndef SPGATE_WORKER_RUNTIME_SUMMARY_H_
#define SPGATE_WORKER_RUNTIME_SUMMARY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace spgate::runtime {

// Where a step's mode came from: the client's DecisionSource values, plus the
// --mode=sp|tp flag.
enum class StepSource : uint8_t {
  kDaemon = 1,
  kFallback = 2,
  kLocalOnly = 3,
  kMemoryOverride = 4,
  kFlag = 5,
};
// daemon, fallback, local, memory_override, flag
const char* StepSourceLabel(StepSource source);

// One rank's record of one step; trivially copyable so ranks can MPI_Gather it.
struct StepRecord {
  int64_t step = 0;
  uint8_t mode = 0;    // spgate::Mode
  uint8_t reason = 0;  // spgate::Reason as run
  uint8_t source = 0;  // StepSource
  uint8_t pad_ = 0;
  int32_t sequences = 0;
  int64_t tokens = 0;          // effective (non-padding)
  int64_t padding_tokens = 0;  // SP padding to a multiple of t
  double length_cv = 0;
  double step_time_s = 0;
  double decision_s = 0;       // waiting for the group's decision
  double rs_wait_s = 0;        // reduce-scatter (layer)
  double all_gather_s = 0;     // all-gather (layer)
  double all_reduce_s = 0;     // all-reduce (layer, TP-only)
  double norm_stall_s = 0;     // norm-boundary collectives
  double grad_sync_s = 0;
  uint64_t peak_bytes = 0;
  uint64_t predicted_peak_bytes = 0;
  uint64_t device_allocated_bytes = 0;  // arena cache misses during the step
  double verify_diff = -1;     // < 0: not verified
};
static_assert(std::is_trivially_copyable_v<StepRecord>);

// Per rank, besides the steps.
struct RankCounters {
  int64_t telemetry_sent = 0;
  int64_t telemetry_acked = 0;
  int64_t telemetry_dropped = 0;
  int64_t daemon_decisions = 0;
  int64_t late_decisions = 0;
  int64_t memory_overrides = 0;  // the leader's: daemon TP-only answers its memory gate forbade
  int64_t p2p_size_mismatches = 0;  // pipeline messages whose size was not the expected one
  int64_t p2p_bytes_sent = 0;       // pipeline messages' bytes this rank sent
};
static_assert(std::is_trivially_copyable_v<RankCounters>);

struct RunDescription {
  int world_size = 1, tp = 1, dp = 1;
  int pp = 1, microbatches = 1;  // pipeline stages, micro-batches per step (1F1B)
  std::string stage_boundary = "sharded";  // or "native" (measurement only)
  bool recompute = false;                  // activation recompute
  std::string backend, lengths, mode, norm_boundary, controller, job_id;
  int layers = 0, hidden = 0, heads = 0, ffn_hidden = 0;
  int64_t tokens_per_batch = 0;
  bool bucketing = false;
  bool verify = false;
};

struct RunSummary {
  RunDescription run;
  int64_t steps = 0;
  std::map<std::string, std::map<std::string, int64_t>> decisions;  // mode -> reason -> n
  std::map<std::string, int64_t> decision_sources;
  int64_t local_decisions = 0;
  // Daemon TP-only answers the group leaders' memory gate forbade (SP ran), over all ranks.
  int64_t memory_overrides = 0;
  int64_t consistency_violations = 0;
  int64_t lost_telemetry = 0;
  int64_t telemetry_sent = 0, telemetry_acked = 0;
  // mode ("sp", "tp_only", and "all" where noted) -> value
  std::map<std::string, double> effective_tokens_per_s;  // + all
  std::map<std::string, double> step_time_p95_s;         // + all
  std::map<std::string, double> step_time_mean_s;        // + all
  std::map<std::string, uint64_t> peak_memory_bytes;     // + all
  std::map<std::string, uint64_t> predicted_peak_memory_bytes;
  std::map<std::string, int64_t> steps_by_mode;  // group-steps (JSON: also group_steps_by_mode)
  // Whether `decisions` counts micro-batches (a pipeline's stages) rather than group-steps.
  bool microbatch_decisions = false;
  // What switching costs, by the mode switched to: the median step time per token of the
  // first steps after a switch over that of the mode's other steps (1: free; 0: no
  // switch, or no steady step), and how many switch steps there were. Medians, because
  // one preempted step on a shared machine would otherwise decide a mean of ten.
  std::map<std::string, double> switch_cost_ratio;
  std::map<std::string, int64_t> switch_steps;
  // Mean bytes a step took from the device (arena cache misses, max over the group's
  // ranks): first steps after a switch to the mode, and the mode's other steps.
  std::map<std::string, double> switch_device_alloc_bytes;
  std::map<std::string, double> steady_device_alloc_bytes;
  std::map<std::string, int64_t> effective_tokens;       // + all
  std::map<std::string, int64_t> padding_tokens;         // + all
  std::map<std::string, double> mean_length_cv;          // + all
  double memory_prediction_max_rel_error = 0;  // max |predicted - measured| / measured
  double rs_wait_share_mean = 0;      // SP steps, group max per step
  double all_gather_tail_p95_s = 0;   // SP steps, group max per step
  double norm_stall_ratio_mean = 0;   // SP steps, group max per step
  double decision_wait_p95_s = 0;
  // The longest any group leader waited for a step's decision: what --decision_deadline
  // bounds (the other ranks' waits also include reaching the leader's broadcast).
  double leader_decision_wait_max_s = 0;
  std::optional<double> verify_max_abs_diff;
  // Per pipeline stage (one without pipelines): its micro-batch decisions (the stage's
  // group leaders', mode -> reason -> count) and its ranks' peak memory.
  struct Stage {
    int stage = 0;
    std::map<std::string, std::map<std::string, int64_t>> decisions;
    uint64_t peak_memory_bytes = 0;
    uint64_t predicted_peak_memory_bytes = 0;
    std::optional<double> verify_max_abs_diff;  // --verify: over this stage's ranks
  };
  std::vector<Stage> stages;
  int64_t p2p_size_mismatches = 0;
  int64_t p2p_bytes_sent = 0;  // over every rank and step
};

// records[world_rank] = that rank's steps (every rank the same count, in step order);
// ranks of TP group g are g * tp .. g * tp + tp - 1, and group g is stage g % pp of
// replica g / pp. With pipeline stages a replica's tokens and step times are its first
// stage's (every stage runs the same micro-batches), and `microbatch_decisions` (per
// rank: steps x microbatches bytes, mode << 4 | reason; may be empty without pipelines)
// give the decision counts, one per micro-batch per stage.
RunSummary Summarize(const RunDescription& run,
                     const std::vector<std::vector<StepRecord>>& records,
                     const std::vector<RankCounters>& counters,
                     const std::vector<std::vector<uint8_t>>& microbatch_decisions = {});

std::string SummaryJson(const RunSummary& summary);
// The human table printed at the end of a run.
std::string SummaryTable(const RunSummary& summary);

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_SUMMARY_H_
