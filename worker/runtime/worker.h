// The reference worker's step loop: on every rank of a dp x tp job,
//   prefetch batch N+1 (the TP leader builds it and broadcasts its lengths over the TP
//   communicator) and submit its plan with the predicted peak memory of both modes;
//   get step N's decision through GroupDecider (the leader asks spgated or decides
//   locally, fail-static; the decision is broadcast over the TP communicator before
//   the batch's first collective); run forward + backward in that mode; measure
//   reduce-scatter, all-gather and norm-stall time, step time, tokens, padding and peak
//   memory; report telemetry; log the decision.
// The invariant that matters (docs/design.md §4): every rank of a TP group runs the mode
// the leader broadcast for that step, so collectives always match; training never waits on
// the daemon longer than the decision deadline.
//
// Usage (spgate-worker's main, after MPI_Init):
//   ASSIGN_OR_RETURN(auto grid, ProcessGrid::Create(MPI_COMM_WORLD, options.tp));
//   ASSIGN_OR_RETURN(RankResult result, RunWorkerRank(options, *grid, device, tp, dp));
//   ASSIGN_OR_RETURN(std::optional<RunSummary> summary, GatherSummary(options, *grid, result));
#ifndef SPGATE_WORKER_RUNTIME_WORKER_H_
#define SPGATE_WORKER_RUNTIME_WORKER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/types.h"
#include "worker/client/client_options.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/device.h"
#include "worker/runtime/model.h"
#include "worker/runtime/mpi_communicator.h"
#include "worker/runtime/summary.h"

namespace spgate::runtime {

enum class Backend : uint8_t { kCpu, kNccl };
// kAlternate: SP and TP-only in turns of alternate_steps steps (forced, like kSp/kTp):
// measures what a mode switch itself costs (the summary's switch_cost_ratio).
enum class ModeChoice : uint8_t { kAuto, kSp, kTp, kAlternate };

struct WorkerOptions {
  Backend backend = Backend::kCpu;
  // The gate client's options as the flags and the launcher give them (spgate-worker's
  // main): controller (empty: local policy only), job_id (required with a controller),
  // incarnation (empty: the launcher's, else one world rank 0 makes), launch_credential
  // (SPGATE_LAUNCH_CREDENTIAL, never a flag: a command line is visible to other users;
  // empty: one world rank 0 makes), credentials and tls_server_name (--tls_*),
  // worker_token (--worker_token_file), decision_deadline, group_session (the leader's
  // session speaks for its TP group, docs/design.md §2) and initial_config (until the
  // daemon's arrives, and without one). Every rank uses world rank 0's incarnation and
  // credential (AgreeOnLaunch, docs/design.md §10); the worker fills in each rank's place
  // in the job, its model, budget, layout and seed.
  client::GateClientOptions client;
  ModelShape shape;
  int tp = 1;
  // Pipelines (docs/design.md §12): pipeline stages (world = tp x pp x dp; each stage runs
  // layers / pp of the model) and micro-batches per optimizer step (each of
  // tokens_per_batch tokens), 1F1B. Every step is a loop over its micro-batches, their
  // gradients accumulated into one optimizer step (--grad_accum_steps is an alias of
  // --microbatches). pp = 1 and microbatches = 1: one batch per step.
  int pp = 1;
  int microbatches = 1;
  // The stage boundary in each mode's native layout instead of the sequence-sharded one:
  // only with a forced --mode (every stage the same), to measure the contract's cost.
  bool native_stage_boundary = false;
  // Activation recompute (StackOptions::recompute): every stage keeps only its in-flight
  // micro-batches' input rows and recomputes their activations in the backward; the
  // memory model and the plans' bytes follow.
  bool recompute = false;
  std::string lengths = "lognormal:mean=1024,sigma=0.8";
  int64_t tokens_per_batch = 8192;
  int64_t steps = 20;
  absl::Duration duration = absl::ZeroDuration();  // > 0: run this long instead of `steps`
  uint64_t seed = 1;
  bool bucketing = false;
  ModeChoice mode = ModeChoice::kAuto;
  int64_t alternate_steps = 0;  // kAlternate: steps per turn (>= 1)
  NormBoundary norm_boundary = NormBoundary::kShard;
  std::string decision_log;  // PREFIX: PREFIX.rank<N>.csv per global rank
  bool verify = false;
  // Before the first step the leader waits this long for the daemon's stream (once).
  absl::Duration connect_timeout = absl::Seconds(5);
  uint64_t memory_budget_bytes = 0;  // 0: no memory gate
  int64_t attention_query_block = 1024;
  ArenaOptions arena;  // --arena_cache
  // World rank 0 prints a progress line of its TP group on stderr (common/progress.h).
  bool progress = false;
};

// Whether the run has pipeline stages or micro-batches (step plans, a decision each).
inline bool Pipelined(const WorkerOptions& o) { return o.pp > 1 || o.microbatches > 1; }

// Checks that need no MPI; INVALID_ARGUMENT names the flag.
absl::Status ValidateWorkerOptions(const WorkerOptions& options);
const char* ModeChoiceName(ModeChoice mode);  // auto, sp, tp

// The launch as the daemon knows it, besides the job id (docs/design.md §10).
struct LaunchIdentity {
  std::string incarnation;
  std::string launch_credential;
};

// Collective over the job's world: world rank 0's incarnation (the option's, else the
// launcher's, else a new one) and credential (the option's, else a new one from the
// kernel's random source), broadcast over the job's own communicator, which only this
// launch's processes share; every rank returns the same, including rank 0's error. The
// launcher's variables are never the credential: other users can read them. Without a
// controller nothing is broadcast: the incarnation is the option's or the launcher's and
// the credential is empty.
absl::StatusOr<LaunchIdentity> AgreeOnLaunch(const WorkerOptions& options, const ProcessGrid& grid);

struct RankResult {
  std::vector<StepRecord> steps;
  RankCounters counters;
  // Pipelined runs: each step's micro-batch decisions as run, a byte each (mode << 4 |
  // reason), steps x microbatches.
  std::vector<uint8_t> microbatch_decisions;
};

// The step loop on this rank. Collective over the job's world: every rank calls it with
// the same options. `tp` / `dp` are this rank's TP- and DP-group communicators on
// `device`'s memory. With pipeline stages (Pipelined) each step is a 1F1B schedule over
// the stage's micro-batches (pipeline.h), one decision per micro-batch.
absl::StatusOr<RankResult> RunWorkerRank(const WorkerOptions& options, const ProcessGrid& grid,
                                         Device* device, Communicator* tp, Communicator* dp);

// Collective: gathers every rank's result on world rank 0 and summarises it there
// (nullopt elsewhere).
absl::StatusOr<std::optional<RunSummary>> GatherSummary(const WorkerOptions& options,
                                                        const ProcessGrid& grid,
                                                        const RankResult& result);

RunDescription DescribeRun(const WorkerOptions& options, int world_size);

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_WORKER_H_
