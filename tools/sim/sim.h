// spgate-sim: simulated TP groups that speak the real protocol. `RunLive` drives G groups × t
// ranks, each rank with its own GateClient (telemetry on every rank, decisions on the
// leader) and GroupDecider over an in-memory broadcast, at --steps_per_s per group, with
// telemetry from the cost model (cost_model.h). Ranks are state machines driven by a
// bounded pool of threads (a thread owns whole groups and steps their ranks in turn), so
// 1,024 ranks do not mean 1,024 threads; each rank still takes its own GroupDecider
// receive path. `Replay` runs the same policy offline over a length trace (no daemon),
// and `Sweep` replays a grid of gate settings on the same batches for tuning.
#ifndef SPGATE_TOOLS_SIM_SIM_H_
#define SPGATE_TOOLS_SIM_SIM_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/progress.h"
#include "policy/adaptive_policy.h"
#include "policy/cost_prior.h"
#include "policy/pipeline_memory.h"
#include "policy/types.h"
#include "tools/sim/cost_model.h"
#include "tools/sim/summary.h"
#include "worker/client/client_options.h"
#include "worker/client/tls.h"
#include "worker/runtime/batching.h"

namespace spgate::sim {

struct SimOptions {
  std::string controller;  // empty: local policy only
  // With a controller: required (no default job id, docs/design.md §10).
  std::string job_id;
  // This launch; empty: the launcher's (IncarnationFromEnvironment), else a new one (the
  // simulator is one process, so it is its own world rank 0).
  std::string incarnation;
  // The launch's secret (docs/design.md §10), one per run, shared by every simulated rank;
  // empty: SPGATE_LAUNCH_CREDENTIAL, else a new one (never a flag: a command line is
  // visible to other users).
  std::string launch_credential;
  client::TlsClientOptions tls;  // --tls_ca, --tls_cert, --tls_key, --tls_server_name
  // The daemon's shared worker token, read by client::ReadWorkerTokenFile; empty: none.
  std::string worker_token_file;
  std::string lengths = "lognormal:mean=4096,sigma=0.8";
  int64_t tokens_per_batch = 16384;
  bool bucketing = true;
  int64_t steps = 0;  // per group; 0: duration × steps_per_s
  absl::Duration duration = absl::Seconds(30);
  uint64_t seed = 1;
  int groups = 4;
  double steps_per_s = 10;
  int threads = 0;  // 0: min(groups, 2 × cores, 16)
  // When in the step period each group ticks. kRandom: every group at its own seeded
  // phase, as independent jobs or pipeline stages would — plans reach the daemon spread
  // over the period. kAligned: every group at the same instant, as the groups of one
  // data-parallel job after each gradient all-reduce — the daemon gets all G plans in one
  // burst (the worst case for decision latency).
  enum class GroupPhase { kRandom, kAligned };
  GroupPhase group_phase = GroupPhase::kRandom;
  absl::Duration deadline = client::GateClientOptions{}.decision_deadline;
  // GateClientOptions::telemetry_flush_interval: > 0 moves telemetry writes off the
  // moment plans go out (every rank reports right after the decision).
  absl::Duration telemetry_flush = absl::Milliseconds(250);
  // The leader feeds its fallback's rolling wait share with the group max (true, as a
  // trainer that all-reduces it would) or with its own rank's share.
  bool leader_group_rs_wait = true;
  // The leader's session speaks for its group, the group's telemetry reduced in the group
  // (docs/design.md §2); false: every simulated rank holds its own session and reports its
  // own telemetry (kept to measure the difference).
  bool group_session = true;
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration flush_timeout = absl::Seconds(30);
  GateConfig initial_config;  // before the daemon's arrives (and for replay)
  CostParams cost;            // cost.tp is the group size
  // Pipelines (`replay --compare` only; pipeline.h): stages, model chunks per stage, micro-
  // batches per optimizer step and the schedule; --groups are then pipeline replicas and
  // cost.layers the layers of one stage. All 1: no pipeline, one batch a step.
  int pp = 1;
  int vp = 1;
  int microbatches = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  // ADAPTIVE's physics prior: false leaves the tables without its inputs and collective
  // telemetry, so the static gates decide every band without samples (the ablation).
  bool adaptive_prior = true;
  // A progress line on stderr at a steady interval (common/progress.h; --progress).
  bool progress = false;

  bool pipelined() const {
    return pp != 1 || vp != 1 || microbatches != 1 || schedule != PipelineSchedule::k1F1B;
  }
};

int64_t StepsFor(const SimOptions& o);

// Each group's tick offset within the step period, per options.group_phase: all zero when
// aligned; otherwise seeded uniform draws in [0, period).
std::vector<absl::Duration> GroupPhases(const SimOptions& options);

// "random" or "aligned"; INVALID_ARGUMENT names --group_phase.
absl::StatusOr<SimOptions::GroupPhase> ParseGroupPhase(const std::string& value);
const char* GroupPhaseName(SimOptions::GroupPhase phase);

// "1f1b", or "interleaved" (also its canonical name, "interleaved_1f1b": policy's
// ScheduleName, what the output prints); INVALID_ARGUMENT names --schedule.
absl::StatusOr<PipelineSchedule> ParseSchedule(const std::string& value);

// The run's shape, for every command: --groups >= 1, --tp in [1, 1024], --tokens_per_batch
// >= 1, --steps >= 0; INVALID_ARGUMENT names the flag and the value.
absl::Status ValidateRunShape(const SimOptions& options);

// The seed of TP group `group`'s length stream — spgate-worker's (worker/runtime/worker.cc),
// so for one --seed and --lengths both tools draw the same lengths for the same group.
uint64_t GroupLengthSeed(uint64_t seed, int group);

// Group `group`'s batches: the worker's length source and BatchBuilder (packing, or
// bucket_by_tokens with --bucketing), lengths clamped to --tokens_per_batch. A file trace
// is replayed by every group from its own offset (group / groups of the way in), wrapping.
absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> GroupBatches(const SimOptions& options,
                                                                    int group);

// Replay's ADAPTIVE learning sees a step's telemetry this many steps after the step (in
// a live job it arrives after the next plans went out).
inline constexpr int64_t kReplayLearnLagSteps = 2;

// What a table has learned by step `k`: folds in and drops the samples at the front of
// `pending` (in step order) from steps k − kReplayLearnLagSteps and before, each through
// ObserveGroupStep (`prior`: the physics prior's too). Replay's loop and the compare
// harness learn through it.
void ShowDueSamples(const GateConfig& config, ThroughputTable& table,
                    std::deque<GroupStepSample>& pending, int64_t k, bool prior);

// What the simulated worker declares at Register: its model shape (tp, hidden, layers).
PriorInputs DeclaredPriorInputs(const SimOptions& options);

// The hardware id the simulated ranks declare at Register (RegisterRequest.hardware_id, a
// key of ADAPTIVE's persisted learned tables), unless SPGATE_HARDWARE_ID is set: "sim:" and
// the --hardware preset, then every device constant that differs from the preset's as
// flag=value, and a flat --link_gbps always ("sim:h200-sxm mfu=0.5 hbm_gbps=3000"), so runs
// of one job under different simulated hardware never share a table. Longer than 128
// characters, it is cut after a whole constant and ends in a hash of the whole. The host's
// CPU, which the client library would declare, is not what the steps were costed on.
std::string SimulatedHardwareId(const CostParams& cost);

// The seed of group `group`'s cost-model noise in replay (and --compare).
uint64_t GroupNoiseSeed(uint64_t seed, int group);
// Steps per group that replay runs: --steps, else once through a file trace, else 1,000.
absl::StatusOr<int64_t> ReplaySteps(const SimOptions& options, const GateConfig& config);

// The run's progress reporter, or null without options.progress: `total_steps` steps of
// `parts_per_step` group-steps each, the clock read every `check_every` Adds.
std::unique_ptr<ProgressReporter> MakeProgress(const SimOptions& options, std::string label,
                                               int64_t total_steps, int64_t parts_per_step,
                                               int64_t check_every = 1);

absl::StatusOr<Summary> RunLive(const SimOptions& options);
absl::StatusOr<Summary> Replay(const SimOptions& options, const GateConfig& config);

struct SweepAxis {
  double lo = 0, hi = 0, step = 0;  // inclusive range
  std::string flag;                 // "--sweep_max_length_cv=0.05:0.5:0.05", for messages
};
// "lo:hi:step". INVALID_ARGUMENT names the flag.
absl::StatusOr<SweepAxis> ParseSweepAxis(const std::string& flag, const std::string& value);

// One axis of the sweep's grid: lo, lo + step, ... up to hi (rounded to 1e-6), keeping the
// values that make a valid config with `base`'s other fields (`field`: the axis's gate
// field). The others are skipped, and `skipped` says which and why (empty when none is):
// e.g. a max_rs_wait_share at or below rs_wait_reenable_margin. INVALID_ARGUMENT naming the
// axis's flag and the reason when no value is valid.
struct SweepValues {
  std::vector<double> values;
  std::string skipped;
};
absl::StatusOr<SweepValues> SweepAxisValues(const SweepAxis& axis, const GateConfig& base,
                                            double GateConfig::*field);

struct SweepPoint {
  GateConfig config;
  Summary summary;
};
// Every valid (max_length_cv, max_rs_wait_share) on the grid (SweepAxisValues of each
// axis; the skipped values are said on stderr), other fields from `base`, replayed over
// the same batches and the same noise. Sorted by effective tokens/s.
absl::StatusOr<std::vector<SweepPoint>> Sweep(const SimOptions& options, const GateConfig& base,
                                              const SweepAxis& length_cv,
                                              const SweepAxis& rs_wait);
std::string SweepTable(const std::vector<SweepPoint>& points, int groups);
std::string SweepJson(const std::vector<SweepPoint>& points, int groups);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_SIM_H_
