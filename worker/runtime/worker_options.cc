// WorkerOptions' checks and description (worker.h): ValidateWorkerOptions refuses what no
// world size can fix, naming the flag, before MPI starts; DescribeRun is the summary's
// account of the options.
#include "worker/runtime/worker.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_id.h"
#include "common/launch_credential.h"
#include "common/status_macros.h"
#include "policy/gate_config.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "worker/client/channel.h"
#include "worker/runtime/lengths.h"
#include "worker/runtime/model.h"

namespace spgate::runtime {

const char* ModeChoiceName(ModeChoice mode) {
  switch (mode) {
    case ModeChoice::kAuto: return "auto";
    case ModeChoice::kSp: return "sp";
    case ModeChoice::kTp: return "tp";
    case ModeChoice::kAlternate: return "alternate";
  }
  return "unknown";
}

absl::Status ValidateWorkerOptions(const WorkerOptions& o) {
  RETURN_IF_ERROR(ValidateModelShape(o.shape, o.tp));
  if (o.tokens_per_batch < 1 || o.tokens_per_batch > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_per_batch=", o.tokens_per_batch, " is out of range [1, 16777216]"));
  }
  if (o.duration <= absl::ZeroDuration() && (o.steps < 1 || o.steps > 100000000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", o.steps, " must be >= 1 (or set --duration)"));
  }
  if (o.duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration must not be negative");
  }
  if (!o.client.controller.empty() && o.client.job_id.empty()) {
    return absl::InvalidArgumentError(
        "--job_id: required with --controller (or set SPGATE_JOB_ID, or run under Slurm "
        "with a job name); the daemon keys decisions by job");
  }
  // The client's own rules (which Create applies on every rank, after MPI started: a
  // refusal there aborted the job with a runtime error), named by flag here.
  if (absl::Status s = client::ValidateControllerAddress(o.client.controller); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  if (!o.client.job_id.empty()) {
    if (absl::Status s = ValidateJobId(o.client.job_id); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", s.message(), " (--job_id, else SPGATE_JOB_ID or SLURM_JOB_NAME)"));
    }
  }
  if (!o.client.controller.empty() && !o.client.launch_credential.empty()) {
    RETURN_IF_ERROR(
        CheckLaunchCredential(o.client.launch_credential, "SPGATE_LAUNCH_CREDENTIAL"));
  }
  if (const absl::Duration d = o.client.decision_deadline;
      d <= absl::ZeroDuration() || d > absl::Seconds(60)) {
    return absl::InvalidArgumentError("--decision_deadline must be in (0, 60s]");
  }
  if (o.attention_query_block < 1) {
    return absl::InvalidArgumentError("--attention_query_block must be >= 1");
  }
  if (o.pp < 1 || o.pp > kMaxPipelineStages) {
    return absl::InvalidArgumentError(absl::StrCat("--pp=", o.pp, " must be in [1, ",
                                                   kMaxPipelineStages, "]"));
  }
  if (o.microbatches < 1 || o.microbatches > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches=", o.microbatches, " must be in [1, 4096]"));
  }
  if (o.shape.layers % o.pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--layers=", o.shape.layers,
                                                   " must be a multiple of --pp=", o.pp,
                                                   " (each stage runs layers / pp)"));
  }
  if (Pipelined(o) && o.backend != Backend::kCpu) {
    return absl::InvalidArgumentError(
        "--pp / --microbatches: pipeline stages run on --backend=cpu (MPI p2p on host "
        "memory); the NCCL backend has no stage link yet");
  }
  if (o.native_stage_boundary &&
      (!Pipelined(o) || (o.mode != ModeChoice::kSp && o.mode != ModeChoice::kTp))) {
    return absl::InvalidArgumentError(
        "--stage_boundary=native: each mode's own layout at a stage boundary works only when "
        "every stage runs the same mode, so it needs --pp > 1 and a forced --mode=sp or tp "
        "(spgate decides per stage, which the sharded boundary makes safe; docs/design.md §12)");
  }
  if (Pipelined(o) && o.memory_budget_bytes >= kMaxStepPlanBytes) {
    return absl::InvalidArgumentError(
        "--memory_budget: step plans carry byte counts below 2^40 (1 TiB); a stage's budget "
        "is a device's");
  }
  if (absl::Status s = ValidateGateConfig(o.client.initial_config); !s.ok()) return s;
  // The length spec is parsed (and refused naming --lengths) here too.
  return ParseLengthSource(o.lengths, o.seed, o.tokens_per_batch).status();
}

RunDescription DescribeRun(const WorkerOptions& o, int world_size) {
  RunDescription r;
  r.world_size = world_size;
  r.tp = o.tp;
  r.pp = o.pp;
  r.microbatches = o.microbatches;
  r.stage_boundary = o.native_stage_boundary ? "native" : "sharded";
  r.recompute = o.recompute;
  r.dp = world_size / std::max(o.tp * o.pp, 1);
  r.backend = o.backend == Backend::kCpu ? "cpu" : "nccl";
  r.lengths = o.lengths;
  r.mode = ModeChoiceName(o.mode);
  r.norm_boundary = std::string(NormBoundaryName(o.norm_boundary));
  r.controller = o.client.controller;
  r.job_id = o.client.job_id;
  r.layers = o.shape.layers;
  r.hidden = o.shape.hidden;
  r.heads = o.shape.heads;
  r.ffn_hidden = o.shape.ffn_hidden;
  r.tokens_per_batch = o.tokens_per_batch;
  r.bucketing = o.bucketing;
  r.verify = o.verify;
  return r;
}

}  // namespace spgate::runtime
