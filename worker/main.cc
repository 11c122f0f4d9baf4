// spgate-worker: the reference worker. Under mpirun, every rank runs L pre-LN GPT
// blocks forward and backward on the CPU (MPI collectives) or a GPU (NCCL), in
// sequence-parallel or tensor-parallel-only mode per batch as spgated (or the local
// fail-static policy) decides, and world rank 0 prints a summary table and writes
// --summary_json. See docs/worker.md.
//
//   mpirun -np 4 build/bin/spgate-worker --tp=4 --controller=127.0.0.1:50061
//       --lengths=bimodal:short=256,long=2048,p_long=0.3 --tokens_per_batch=4096 --steps=50
//
// Exit status: 0 done; 2 bad flags or an impossible shape (the message names the flag);
// 1 a runtime failure (the job is aborted so no rank is left waiting in a collective).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/cli.h"
#include "common/mutex.h"
#include "common/progress.h"
#include "common/status_macros.h"
#include "worker/client/client_options.h"
#include "worker/client/tls_flags.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/device.h"
#include "worker/runtime/mpi_communicator.h"
#include "worker/client/identity.h"
#include "worker/runtime/worker.h"

ABSL_FLAG(std::string, backend, "cpu", "cpu (MPI collectives on host memory) or nccl (CUDA + NCCL)");
// The flags that hand a client option on take its default and help from the option table
// (worker/client/client_options.h), adding only what the worker does with them.
const spgate::client::GateClientOptions kClientDefaults;
ABSL_FLAG(std::string, controller, kClientDefaults.controller,
          spgate::client::ClientOptionHelp("controller"));
ABSL_FLAG(std::string, job_id, kClientDefaults.job_id,
          absl::StrCat(spgate::client::ClientOptionHelp("job_id"),
                       "; required with --controller unless the environment has "
                       "SPGATE_JOB_ID (or Slurm's SLURM_JOB_NAME)"));
ABSL_FLAG(std::string, incarnation, kClientDefaults.incarnation,
          absl::StrCat(spgate::client::ClientOptionHelp("incarnation"),
                       "; empty: the launcher's (SPGATE_INCARNATION, TORCHELASTIC_RUN_ID+restart "
                       "count, SLURM_JOB_ID+restart count, the MPI job), else one made by "
                       "world rank 0"));
ABSL_FLAG(int, tp, 0, "Tensor-parallel group size; 0: all ranks form one group (of one stage)");
ABSL_FLAG(int, pp, 1, "Pipeline stages (world = tp x pp x dp; each stage runs layers / pp; "
          "1F1B over --microbatches, one decision per micro-batch and stage)");
ABSL_FLAG(std::string, stage_boundary, "sharded",
          "sharded: the sequence-sharded layout at stage boundaries in both modes (the "
          "contract); native: each mode's own (measurement only: needs --mode=sp|tp)");
ABSL_FLAG(bool, recompute, false,
          "Activation recompute: keep only each in-flight micro-batch's input rows and "
          "recompute its layers' activations in the backward (the memory model follows)");
ABSL_FLAG(int, microbatches, 1, "Micro-batches per optimizer step, each of "
          "--tokens_per_batch tokens, their gradients accumulated (every step is a loop over "
          "them; 1 with --pp=1: one batch per step; --grad_accum_steps is an alias)");
ABSL_FLAG(int, layers, 2, "Transformer blocks");
ABSL_FLAG(int, hidden, 128, "Hidden size");
ABSL_FLAG(int, heads, 4, "Attention heads (divisible by --tp)");
ABSL_FLAG(int, ffn_hidden, 512, "MLP hidden size (divisible by --tp)");
ABSL_FLAG(std::string, lengths, "lognormal:mean=1024,sigma=0.8",
          "Sequence lengths: lognormal:mean=M,sigma=S | bimodal:short=A,long=B,p_long=P"
          "[,jitter=J] | uniform:min=A,max=B | file:PATH");
ABSL_FLAG(int64_t, tokens_per_batch, 8192, "Token budget of a batch (per TP group)");
ABSL_FLAG(int64_t, steps, 20, "Steps to run (ignored when --duration is set)");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(), "Run this long instead of --steps, e.g. 30s");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the length stream, the weights and the data");
ABSL_FLAG(bool, bucketing, false, "bucket_by_tokens: keep each batch's length CV under the "
                                  "daemon's bucket_target_cv");
ABSL_FLAG(std::string, mode, "auto",
          "auto (spgated / local policy decides), sp or tp (forced), or alternate:N (forced, "
          "SP and TP-only in turns of N steps: what a switch costs)");
ABSL_FLAG(std::string, norm_boundary, "shard", "shard (LayerNorm inside the sequence shard) or "
                                               "gather (legacy: gather the sequence for LayerNorm)");
ABSL_FLAG(std::string, decision_log, "",
          "PREFIX: write PREFIX.rank<N>.csv (step,mode,reason,source,stage,micro_batch: a row "
          "per micro-batch of each step) per rank");
ABSL_FLAG(std::string, summary_json, "", "Write the run summary (world rank 0) to this file");
ABSL_FLAG(bool, progress, false,
          "World rank 0: a progress line on stderr every 2 s (default: when stderr is a "
          "terminal)");
ABSL_FLAG(bool, verify, false, "Also run every batch in both modes and report the largest "
                               "difference of outputs and gradients (verify_max_abs_diff)");
ABSL_FLAG(absl::Duration, decision_deadline, kClientDefaults.decision_deadline,
          spgate::client::ClientOptionHelp("decision_deadline"));
ABSL_FLAG(bool, group_session, kClientDefaults.group_session,
          spgate::client::ClientOptionHelp("group_session"));
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(5),
          "Before the first step, how long the group leader waits for the daemon's stream");
ABSL_FLAG(uint64_t, memory_budget, 0,
          "Memory budget in bytes for the memory gate; 0: the device's (a CUDA device's total "
          "memory; on CPU the host's physical memory shared by the node's ranks)");
ABSL_FLAG(int, grad_accum_steps, 0,
          "Alias of --microbatches (llm.c's name; warns when used): micro-batches per "
          "optimizer step, their gradients accumulated; 0: not given");
ABSL_FLAG(std::string, arena_cache, "classes",
          "How freed blocks are reused: classes (size classes, kept 64 unused steps) or exact "
          "(exact sizes, kept one step: the baseline of bench/switch_cost.sh)");
ABSL_FLAG(int64_t, attention_query_block, 1024,
          "Query rows whose attention scores are materialised at once (bounds the attention "
          "workspace to heads/tp * block * max_len floats)");

namespace {

using spgate::runtime::Backend;
using spgate::runtime::ModeChoice;
using spgate::runtime::NormBoundary;

// Before MPI_Init the rank is only known from the launcher's environment.
bool IsFirstRank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(var)) return std::string(v) == "0";
  }
  return true;
}

int Refuse(const std::string& message, bool print) {
  if (print) std::cerr << "spgate-worker: " << message << "\n";
  return 2;
}

// The gate client's options the flags and the launcher give (WorkerOptions::client); the
// launch's secret from a wrapper, never from a flag (a command line is visible to other
// users): without one world rank 0 makes it and broadcasts it (worker.h).
spgate::client::GateClientOptions ClientOptionsFromFlags() {
  spgate::client::GateClientOptions c;
  c.controller = absl::GetFlag(FLAGS_controller);
  c.job_id = absl::GetFlag(FLAGS_job_id);
  if (c.job_id.empty()) c.job_id = spgate::client::JobIdFromEnvironment();
  c.incarnation = absl::GetFlag(FLAGS_incarnation);
  c.launch_credential = spgate::client::LaunchCredentialFromEnvironment();
  c.decision_deadline = absl::GetFlag(FLAGS_decision_deadline);
  c.group_session = absl::GetFlag(FLAGS_group_session);
  return c;
}

// Before MPI starts: the TLS files checked and the worker token read into `c`, refused
// naming the flag, so no rank dials with a bad one.
absl::Status ReadClientFiles(const spgate::client::TlsClientOptions& tls,
                             spgate::client::GateClientOptions& c) {
  RETURN_IF_ERROR(spgate::client::ReadTlsFiles(tls, spgate::client::kTlsFlagNames).status());
  ASSIGN_OR_RETURN(c.worker_token, spgate::client::ReadWorkerTokenFile(
                                       spgate::client::WorkerTokenFileFromFlags()));
  return absl::OkStatus();
}

// Once MPI runs, with a controller: the credentials the ranks' gate clients dial with.
absl::Status SetClientCredentials(const spgate::client::TlsClientOptions& tls,
                                  spgate::client::GateClientOptions& c) {
  if (c.controller.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(c.credentials,
                   spgate::client::TlsChannelCredentials(tls, spgate::client::kTlsFlagNames));
  c.tls_server_name = tls.server_name;
  return absl::OkStatus();
}

// The flags that choose among named values (--backend, --mode, --arena_cache,
// --norm_boundary, --stage_boundary) into `o`; INVALID_ARGUMENT names the flag.
absl::Status ParseChoiceFlags(spgate::runtime::WorkerOptions& o) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cpu") {
    o.backend = Backend::kCpu;
  } else if (backend == "nccl") {
    o.backend = Backend::kNccl;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", backend, ": expected cpu or nccl"));
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "auto") {
    o.mode = ModeChoice::kAuto;
  } else if (mode == "sp") {
    o.mode = ModeChoice::kSp;
  } else if (mode == "tp") {
    o.mode = ModeChoice::kTp;
  } else if (absl::StartsWith(mode, "alternate:") &&
             absl::SimpleAtoi(mode.substr(strlen("alternate:")), &o.alternate_steps) &&
             o.alternate_steps >= 1) {
    o.mode = ModeChoice::kAlternate;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode=", mode, ": expected auto, sp, tp or alternate:N (N >= 1)"));
  }
  if (const std::string cache = absl::GetFlag(FLAGS_arena_cache); cache == "exact") {
    o.arena = spgate::runtime::ArenaOptions::Exact();
  } else if (cache != "classes") {
    return absl::InvalidArgumentError(
        absl::StrCat("--arena_cache=", cache, ": expected classes or exact"));
  }
  const std::string boundary = absl::GetFlag(FLAGS_norm_boundary);
  if (boundary == "shard") {
    o.norm_boundary = NormBoundary::kShard;
  } else if (boundary == "gather") {
    o.norm_boundary = NormBoundary::kGather;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--norm_boundary=", boundary, ": expected shard or gather"));
  }
  if (const std::string b = absl::GetFlag(FLAGS_stage_boundary); b == "native") {
    o.native_stage_boundary = true;
  } else if (b != "sharded") {
    return absl::InvalidArgumentError(
        absl::StrCat("--stage_boundary=", b, ": must be sharded or native"));
  }
  return absl::OkStatus();
}

// --grad_accum_steps, the alias of --microbatches, into `o` (a warning on world rank 0
// when `first`); refused when the two disagree.
absl::Status ApplyGradAccumAlias(spgate::runtime::WorkerOptions& o, bool first) {
  const int g = absl::GetFlag(FLAGS_grad_accum_steps);
  if (g == 0) return absl::OkStatus();
  // One flag, one meaning: a step is a loop over its micro-batches (llm.c's micro_step
  // loop, Megatron's num_microbatches); gradient accumulation is that loop.
  if (o.microbatches != 1 && o.microbatches != g) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad_accum_steps=", g, " is an alias of --microbatches, which says ",
                     o.microbatches, ": give one"));
  }
  if (first) {
    std::fprintf(stderr, "spgate-worker: --grad_accum_steps is an alias of --microbatches; use "
                         "--microbatches=%d\n", g);
  }
  o.microbatches = g;
  return absl::OkStatus();
}

// The worker's options from its flags (the world size not yet known: --tp=0 stays 0).
absl::StatusOr<spgate::runtime::WorkerOptions> WorkerOptionsFromFlags(bool first) {
  spgate::runtime::WorkerOptions o;
  RETURN_IF_ERROR(ParseChoiceFlags(o));
  o.client = ClientOptionsFromFlags();
  o.tp = absl::GetFlag(FLAGS_tp);
  o.pp = absl::GetFlag(FLAGS_pp);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.recompute = absl::GetFlag(FLAGS_recompute);
  o.shape = {.layers = absl::GetFlag(FLAGS_layers), .hidden = absl::GetFlag(FLAGS_hidden),
             .heads = absl::GetFlag(FLAGS_heads), .ffn_hidden = absl::GetFlag(FLAGS_ffn_hidden)};
  o.lengths = absl::GetFlag(FLAGS_lengths);
  o.tokens_per_batch = absl::GetFlag(FLAGS_tokens_per_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.bucketing = absl::GetFlag(FLAGS_bucketing);
  o.decision_log = absl::GetFlag(FLAGS_decision_log);
  o.verify = absl::GetFlag(FLAGS_verify);
  o.progress = spgate::ProgressWanted(absl::GetFlag(FLAGS_progress),
                                      absl::flags_internal::WasPresentOnCommandLine("progress"));
  o.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget);
  o.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  RETURN_IF_ERROR(ApplyGradAccumAlias(o, first));
  o.attention_query_block = absl::GetFlag(FLAGS_attention_query_block);
  return o;
}

// Everything that does not depend on the world size, before MPI starts; reads the client's
// files into `o.client`.
absl::Status CheckBeforeMpi(const spgate::client::TlsClientOptions& tls,
                            spgate::runtime::WorkerOptions& o) {
  if (o.tp < 0) return absl::InvalidArgumentError(absl::StrCat("--tp=", o.tp, " must be >= 0"));
  spgate::runtime::WorkerOptions check = o;
  if (check.tp == 0) check.tp = 1;
  RETURN_IF_ERROR(spgate::runtime::ValidateWorkerOptions(check));
  RETURN_IF_ERROR(ReadClientFiles(tls, o.client));
  if (o.backend == Backend::kNccl && !spgate::runtime::HaveNccl()) {
    return absl::FailedPreconditionError(
        "--backend=nccl: this build has no NCCL backend (built without CUDA/NCCL)");
  }
  return absl::OkStatus();
}

// Once MPI runs and --tp is resolved: the options against the world, the client's
// credentials into `o.client`, a CUDA device for --backend=nccl.
absl::Status CheckAfterMpiInit(const spgate::client::TlsClientOptions& tls,
                               spgate::runtime::WorkerOptions& o) {
  RETURN_IF_ERROR(spgate::runtime::ValidateWorkerOptions(o));
  RETURN_IF_ERROR(SetClientCredentials(tls, o.client));
  if (o.backend == Backend::kNccl && spgate::runtime::CudaDevices() == 0) {
    return absl::FailedPreconditionError("--backend=nccl: no CUDA device is visible");
  }
  return absl::OkStatus();
}

// The rank's device and its TP and DP communicators on the chosen backend.
absl::Status CreateBackend(const spgate::runtime::WorkerOptions& o,
                           const spgate::runtime::ProcessGrid& grid,
                           std::unique_ptr<spgate::runtime::Device>& device,
                           std::unique_ptr<spgate::runtime::Communicator>& tp,
                           std::unique_ptr<spgate::runtime::Communicator>& dp) {
  if (o.backend == Backend::kCpu) {
    device = spgate::runtime::CreateCpuDevice(/*blas_threads=*/1);
    ASSIGN_OR_RETURN(tp, spgate::runtime::CreateMpiCommunicator(grid.tp_comm()));
    ASSIGN_OR_RETURN(dp, spgate::runtime::CreateMpiCommunicator(grid.dp_comm()));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(device, spgate::runtime::CreateCudaDevice(grid.local_rank() %
                                                             spgate::runtime::CudaDevices()));
  ASSIGN_OR_RETURN(tp, spgate::runtime::CreateNcclCommunicator(grid.tp_comm(), device.get()));
  ASSIGN_OR_RETURN(dp, spgate::runtime::CreateNcclCommunicator(grid.dp_comm(), device.get()));
  return absl::OkStatus();
}

// World rank 0's summary table on stdout and --summary_json; 1 if the file cannot be
// written, else 0.
int ReportSummary(const spgate::runtime::RunSummary& summary) {
  std::cout << spgate::runtime::SummaryTable(summary) << std::flush;
  const std::string summary_json = absl::GetFlag(FLAGS_summary_json);
  if (summary_json.empty()) return 0;
  // 0666 before the umask, like any file the user asks for (not the daemon's 0640).
  if (absl::Status s = spgate::WriteFileAtomically(
          summary_json, spgate::runtime::SummaryJson(summary), 0666);
      !s.ok()) {
    std::cerr << "spgate-worker: --summary_json: cannot write " << summary_json << ": "
              << s.message() << "\n";
    return 1;
  }
  return 0;
}

// This rank's run on `grid` (reset here, after the communicators, before MPI_Finalize);
// a failure aborts the whole job, so no rank is left waiting in a collective.
int RunRank(const spgate::runtime::WorkerOptions& o, int world_rank,
            std::unique_ptr<spgate::runtime::ProcessGrid>& grid) {
  auto fail = [&](const absl::Status& s) {
    std::cerr << "spgate-worker: rank " << world_rank << ": " << s << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  };
  int rc = 0;
  std::unique_ptr<spgate::runtime::Device> device;
  std::unique_ptr<spgate::runtime::Communicator> tp, dp;
  if (absl::Status s = CreateBackend(o, *grid, device, tp, dp); !s.ok()) return fail(s);
  auto result = spgate::runtime::RunWorkerRank(o, *grid, device.get(), tp.get(), dp.get());
  if (!result.ok()) return fail(result.status());
  auto summary = spgate::runtime::GatherSummary(o, *grid, *result);
  if (!summary.ok()) return fail(summary.status());
  if (world_rank == 0 && summary->has_value()) rc = ReportSummary(**summary);
  tp.reset();
  dp.reset();
  grid.reset();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  spgate::DisableMutexDeadlockDetection();
  spgate::InitFlagsUsage("spgate-worker");
  absl::SetProgramUsageMessage(
      "reference SP / TP-only transformer worker; run under mpirun (see docs/worker.md)");
  std::vector<char*> rest = spgate::ParseFlags(argc, argv);
  const bool first = IsFirstRank();
  if (rest.size() > 1) {
    return Refuse(absl::StrCat("unexpected argument '", rest[1],
                               "' (flags take the form --name=value)"),
                  first);
  }
  absl::StatusOr<spgate::runtime::WorkerOptions> options = WorkerOptionsFromFlags(first);
  if (!options.ok()) return Refuse(std::string(options.status().message()), first);
  spgate::runtime::WorkerOptions& o = *options;
  const spgate::client::TlsClientOptions tls = spgate::client::TlsOptionsFromFlags();
  if (absl::Status s = CheckBeforeMpi(tls, o); !s.ok()) {
    return Refuse(std::string(s.message()), first);
  }

  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (o.tp == 0) o.tp = world_size / std::max(o.pp, 1);
  auto finish_refused = [&](const absl::Status& s) {
    Refuse(std::string(s.message()), world_rank == 0);
    MPI_Finalize();
    return 2;
  };
  if (absl::Status s = CheckAfterMpiInit(tls, o); !s.ok()) return finish_refused(s);
  // Owns MPI communicators: it must be gone before MPI_Finalize on every path below.
  auto grid = spgate::runtime::ProcessGrid::Create(MPI_COMM_WORLD, o.tp, o.pp);
  if (!grid.ok()) return finish_refused(grid.status());
  const int rc = RunRank(o, world_rank, *grid);
  MPI_Finalize();
  return rc;
}
