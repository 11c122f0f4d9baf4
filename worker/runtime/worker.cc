// The step loop, its per-step measurements, --verify, the decision log, and the gather
// of every rank's records for the summary.
#include "worker/runtime/worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policy/gate_policy.h"
#include "worker/client/gate_client.h"
#include "worker/client/identity.h"
#include "worker/client/group_decider.h"
#include "worker/client/tls.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/lengths.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/memory_model.h"
#include "common/status_macros.h"
#include "worker/runtime/transformer_stack.h"

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
  if (!o.controller.empty() && o.job_id.empty()) {
    return absl::InvalidArgumentError(
        "--job_id: required with --controller (or set SPGATE_JOB_ID, or run under Slurm "
        "with a job name); the daemon keys decisions by job");
  }
  if (o.decision_deadline <= absl::ZeroDuration() || o.decision_deadline > absl::Seconds(60)) {
    return absl::InvalidArgumentError("--decision_deadline must be in (0, 60s]");
  }
  if (o.grad_accum_steps < 1 || o.grad_accum_steps > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad_accum_steps=", o.grad_accum_steps, " must be >= 1"));
  }
  if (o.attention_query_block < 1) {
    return absl::InvalidArgumentError("--attention_query_block must be >= 1");
  }
  if (absl::Status s = ValidateGateConfig(o.initial_config); !s.ok()) return s;
  // The TLS files are read (and refused naming --tls_*) before any rank dials.
  RETURN_IF_ERROR(client::ReadTlsFiles(o.tls, client::kTlsFlagNames).status());
  RETURN_IF_ERROR(client::ReadWorkerTokenFile(o.worker_token_file).status());
  // The length spec is parsed (and refused naming --lengths) here too.
  return ParseLengthSource(o.lengths, o.seed, o.tokens_per_batch).status();
}

RunDescription DescribeRun(const WorkerOptions& o, int world_size) {
  RunDescription r;
  r.world_size = world_size;
  r.tp = o.tp;
  r.dp = world_size / std::max(o.tp, 1);
  r.backend = o.backend == Backend::kCpu ? "cpu" : "nccl";
  r.lengths = o.lengths;
  r.mode = ModeChoiceName(o.mode);
  r.norm_boundary = std::string(NormBoundaryName(o.norm_boundary));
  r.controller = o.controller;
  r.job_id = o.job_id;
  r.layers = o.shape.layers;
  r.hidden = o.shape.hidden;
  r.heads = o.shape.heads;
  r.ffn_hidden = o.shape.ffn_hidden;
  r.tokens_per_batch = o.tokens_per_batch;
  r.bucketing = o.bucketing;
  r.verify = o.verify;
  return r;
}

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Decision log: one CSV per global rank, a line per step, flushed as written so a
// killed run leaves every step it finished.
class DecisionLog {
 public:
  static absl::StatusOr<std::unique_ptr<DecisionLog>> Open(const std::string& prefix, int rank) {
    if (prefix.empty()) return std::unique_ptr<DecisionLog>();
    const std::string path = absl::StrCat(prefix, ".rank", rank, ".csv");
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--decision_log: cannot write ", path));
    }
    std::fputs("step,mode,reason,source\n", f);
    std::fflush(f);
    return std::unique_ptr<DecisionLog>(new DecisionLog(f));
  }
  ~DecisionLog() { std::fclose(f_); }
  void Write(int64_t step, Mode mode, Reason reason, StepSource source) {
    const std::string line = absl::StrCat(step, ",", std::string(ModeLabel(mode)), ",",
                                          std::string(ReasonLabel(reason)), ",",
                                          StepSourceLabel(source), "\n");
    std::fputs(line.c_str(), f_);
    std::fflush(f_);
  }

 private:
  explicit DecisionLog(std::FILE* f) : f_(f) {}
  std::FILE* f_;
};

struct RankContext {
  const WorkerOptions& o;
  const ProcessGrid& grid;
  Device* device;
  Communicator* tp;
  Communicator* dp;
  std::string incarnation;  // the same on every rank (see AgreeOnIncarnation)
};

// The launch's incarnation, equal on every rank: the option, else the launcher's, else one
// world rank 0 makes and broadcasts (docs/design.md §10).
absl::StatusOr<std::string> AgreeOnIncarnation(const WorkerOptions& o, const ProcessGrid& grid) {
  if (!o.incarnation.empty()) return o.incarnation;
  std::string mine = client::IncarnationFromEnvironment();
  if (o.controller.empty()) return mine;
  char buf[129] = {};
  if (grid.world_rank() == 0) {
    if (mine.empty()) mine = client::NewIncarnation();
    mine.copy(buf, sizeof(buf) - 1);
  }
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, grid.world()));
  return std::string(buf);
}

// The leader's batch (lengths) reaches every rank of the TP group.
absl::Status BroadcastBatch(Communicator* tp, Batch& batch) {
  int64_t n = static_cast<int64_t>(batch.lengths.size());
  RETURN_IF_ERROR(tp->BroadcastHost(&n, sizeof(n), 0));
  batch.lengths.resize(n);
  RETURN_IF_ERROR(tp->BroadcastHost(batch.lengths.data(), n * sizeof(int64_t), 0));
  batch.tokens = 0;
  for (int64_t l : batch.lengths) batch.tokens += l;
  batch.length_cv = LengthCv(batch.lengths);
  return absl::OkStatus();
}

uint64_t Predict(const WorkerOptions& o, Mode mode, MemorySpace space,
                 const std::vector<int64_t>& lengths) {
  return PredictPeak({.shape = o.shape, .tp = o.tp, .mode = mode,
                      .norm_boundary = o.norm_boundary, .space = space,
                      .attention_query_block = o.attention_query_block},
                     lengths)
      .peak_bytes;
}

// --verify: the batch in both modes; the largest difference of outputs, input
// gradients and (TP-finished) parameter gradients on this rank. Leaves the gradients
// zeroed.
absl::StatusOr<double> VerifyBatch(TransformerStack& stack, const MicroBatch& mb) {
  StackCapture cap[2];
  std::vector<float> grads[2];
  const Mode modes[2] = {Mode::kSequenceParallel, Mode::kTensorParallelOnly};
  for (int m = 0; m < 2; ++m) {
    RETURN_IF_ERROR(stack.ZeroGrads());
    RETURN_IF_ERROR(stack.ForwardBackward(mb, modes[m], &cap[m]));
    RETURN_IF_ERROR(stack.FinishGradients(nullptr));
    ASSIGN_OR_RETURN(grads[m], stack.DownloadGrads());
  }
  RETURN_IF_ERROR(stack.ZeroGrads());
  double diff = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(grads[0][i] - grads[1][i])));
  }
  const int64_t h = stack.layout().hidden();
  const BatchGeometry& g = cap[0].geometry;
  for (int64_t i = 0; i < g.rows_local; ++i) {
    const int64_t token = g.row_offset + i;
    if (token >= g.tokens) break;
    for (int64_t c = 0; c < h; ++c) {
      diff = std::max(diff, static_cast<double>(std::fabs(cap[0].output[i * h + c] -
                                                          cap[1].output[token * h + c])));
      diff = std::max(diff, static_cast<double>(std::fabs(cap[0].input_grad[i * h + c] -
                                                          cap[1].input_grad[token * h + c])));
    }
  }
  return diff;
}

// The memory budget every plan carries, so the memory gate always applies: the flag's,
// else the device's — a CUDA device's total memory, or the host's physical memory shared
// by the ranks on this node (docs/design.md §3: never TP-only when it does not fit).
absl::StatusOr<uint64_t> MemoryBudget(const RankContext& cx) {
  if (cx.o.memory_budget_bytes > 0) return cx.o.memory_budget_bytes;
  ASSIGN_OR_RETURN(const uint64_t total, cx.device->TotalMemoryBytes());
  if (cx.device->space() == MemorySpace::kCuda) return total;
  MPI_Comm node;
  SPGATE_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(cx.grid.world(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 1;
  const int rc = MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  SPGATE_MPI_RETURN_IF_ERROR(rc);
  return total / static_cast<uint64_t>(std::max(local, 1));
}

absl::StatusOr<RankResult> Run(const RankContext& cx) {
  const WorkerOptions& o = cx.o;
  const ProcessGrid& grid = cx.grid;
  const bool leader = grid.is_group_leader();
  const bool auto_mode = o.mode == ModeChoice::kAuto;
  const MemorySpace space = cx.device->space();

  // Collective (node-local ranks): every rank computes it, before anything else.
  ASSIGN_OR_RETURN(const uint64_t budget, MemoryBudget(cx));
  MemoryArena arena(cx.device, o.arena);
  ASSIGN_OR_RETURN(auto stack,
                   TransformerStack::Create({.shape = o.shape, .tp = o.tp,
                                             .tp_rank = grid.tp_rank(),
                                             .norm_boundary = o.norm_boundary,
                                             .param_seed = o.seed,
                                             .attention_query_block = o.attention_query_block},
                                            &arena, cx.tp));

  // The gate client: the leader's decides (daemon or local policy); every rank reports
  // telemetry when there is a daemon.
  std::unique_ptr<client::GateClient> gate;
  if ((auto_mode && leader) || !o.controller.empty()) {
    client::GateClientOptions co;
    co.controller = o.controller;
    co.job_id = o.job_id;
    co.incarnation = cx.incarnation;
    co.group = grid.group();
    co.rank_in_group = grid.tp_rank();
    co.group_size = o.tp;
    co.global_rank = grid.world_rank();
    co.model = {o.shape.layers, o.shape.hidden, o.shape.heads, o.shape.ffn_hidden};
    co.memory_budget_bytes = budget;
    co.initial_config = o.initial_config;
    co.decision_deadline = o.decision_deadline;
    co.seed = o.seed * 7919 + grid.world_rank() + 1;
    ASSIGN_OR_RETURN(co.credentials, client::TlsChannelCredentials(o.tls, client::kTlsFlagNames));
    co.tls_server_name = o.tls.server_name;
    ASSIGN_OR_RETURN(co.worker_token, client::ReadWorkerTokenFile(o.worker_token_file));
    ASSIGN_OR_RETURN(gate, client::GateClient::Create(co));
  }
  std::unique_ptr<client::GroupDecider> decider;
  if (auto_mode) {
    Communicator* tp = cx.tp;
    ASSIGN_OR_RETURN(decider, client::GroupDecider::Create(
                                  leader ? gate.get() : nullptr, grid.tp_rank(),
                                  [tp](client::DecisionWire& w, int root) {
                                    return tp->BroadcastHost(&w, sizeof(w), root);
                                  }));
  }
  ASSIGN_OR_RETURN(auto log, DecisionLog::Open(o.decision_log, grid.world_rank()));
  if (gate && leader && !o.controller.empty() && o.connect_timeout > absl::ZeroDuration()) {
    // Start-up only: give the stream a moment so the first steps are the daemon's. A
    // daemon that is not there costs this once; every step after uses the deadline.
    if (absl::Status s = gate->WaitUntilConnected(o.connect_timeout); !s.ok()) {
      std::fprintf(stderr, "spgate-worker: group %d: %s not connected after %s; deciding "
                           "locally until it answers\n",
                   grid.group(), o.controller.c_str(),
                   absl::FormatDuration(o.connect_timeout).c_str());
    }
  }

  // Data: the leader of each TP group draws its own stream (data parallel groups see
  // different data) and broadcasts each batch to its group.
  std::unique_ptr<BatchBuilder> builder;
  if (leader) {
    ASSIGN_OR_RETURN(auto source,
                     ParseLengthSource(o.lengths, o.seed * 1000003 + grid.group(),
                                       o.tokens_per_batch));
    builder = std::make_unique<BatchBuilder>(
        std::move(source),
        BatchBuilderOptions{.tokens_per_batch = o.tokens_per_batch, .bucketing = o.bucketing});
  }
  auto target_cv = [&](int64_t step) {
    return gate ? gate->ConfigFor(step).config.bucket_target_cv
                : o.initial_config.bucket_target_cv;
  };
  auto prefetch = [&](int64_t step, Batch& batch) -> absl::Status {
    if (leader) batch = builder->Next(target_cv(step));
    RETURN_IF_ERROR(BroadcastBatch(cx.tp, batch));
    if (decider) {
      RETURN_IF_ERROR(decider->SubmitPlan(
          {.step = step, .lengths = batch.lengths,
           .predicted_peak_bytes_sp = Predict(o, Mode::kSequenceParallel, space, batch.lengths),
           .predicted_peak_bytes_tp = Predict(o, Mode::kTensorParallelOnly, space, batch.lengths),
           .memory_budget_bytes = budget}));
    }
    return absl::OkStatus();
  };

  RankResult result;
  const auto start = Clock::now();
  const bool timed_run = o.duration > absl::ZeroDuration();
  Batch current, next;
  RETURN_IF_ERROR(prefetch(0, current));
  for (int64_t n = 0;; ++n) {
    if (timed_run) {
      // World rank 0 decides for everyone, so all ranks run the same number of steps.
      uint8_t stop = Since(start) >= absl::ToDoubleSeconds(o.duration) ? 1 : 0;
      SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(&stop, 1, MPI_UINT8_T, 0, grid.world()));
      if (stop) break;
    } else if (n >= o.steps) {
      break;
    }
    const bool has_next = timed_run || n + 1 < o.steps;
    if (has_next) RETURN_IF_ERROR(prefetch(n + 1, next));

    // The batch's data, made before the clock starts (a data loader's job).
    const uint64_t data_seed = o.seed * 0x9e3779b9ull + static_cast<uint64_t>(n) * 131 +
                               static_cast<uint64_t>(grid.group());
    const BatchData data = MakeBatchData(current.lengths, data_seed, o.shape.hidden);
    const MicroBatch mb{.lengths = current.lengths, .data_seed = data_seed, .data = &data};

    cx.tp->ResetStats();
    cx.dp->ResetStats();
    arena.ResetPeak();
    const uint64_t allocated_before = arena.device_allocated_bytes();
    const auto t0 = Clock::now();
    client::GateDecision d;
    StepSource source = StepSource::kFlag;
    if (decider) {
      ASSIGN_OR_RETURN(d, decider->Decide(n, absl::Now() + o.decision_deadline));
      source = static_cast<StepSource>(d.source);
    } else {
      d.step = n;
      const bool sp = o.mode == ModeChoice::kSp ||
                      (o.mode == ModeChoice::kAlternate &&
                       (n / std::max<int64_t>(o.alternate_steps, 1)) % 2 == 0);
      d.mode = sp ? Mode::kSequenceParallel : Mode::kTensorParallelOnly;
      d.reason = Reason::kPinned;
    }
    const double decision_s = Since(t0);
    const bool window_start = n % o.grad_accum_steps == 0;
    const bool window_end = (n + 1) % o.grad_accum_steps == 0 || !has_next;
    if (window_start) RETURN_IF_ERROR(stack->ZeroGrads());
    RETURN_IF_ERROR(stack->ForwardBackward(mb, d.mode));
    if (window_end) RETURN_IF_ERROR(stack->FinishGradients(cx.dp));
    RETURN_IF_ERROR(cx.device->Synchronize());
    RETURN_IF_ERROR(cx.tp->Synchronize());
    RETURN_IF_ERROR(cx.dp->Synchronize());
    const double step_s = Since(t0);

    StepRecord rec;
    const CollectiveStats& ts = cx.tp->stats();
    rec.step = n;
    rec.mode = static_cast<uint8_t>(d.mode);
    rec.reason = static_cast<uint8_t>(d.reason);
    rec.source = static_cast<uint8_t>(source);
    rec.sequences = static_cast<int32_t>(current.lengths.size());
    rec.tokens = current.tokens;
    const int64_t padded = d.mode == Mode::kSequenceParallel
                               ? (current.tokens + o.tp - 1) / o.tp * o.tp
                               : current.tokens;
    rec.padding_tokens = padded - current.tokens;
    rec.length_cv = current.length_cv;
    rec.step_time_s = step_s;
    rec.decision_s = decision_s;
    rec.rs_wait_s = ts.Seconds(CollectiveOp::kReduceScatter, CollectivePurpose::kLayer);
    rec.all_gather_s = ts.Seconds(CollectiveOp::kAllGather, CollectivePurpose::kLayer);
    rec.all_reduce_s = ts.Seconds(CollectiveOp::kAllReduce, CollectivePurpose::kLayer);
    rec.norm_stall_s = ts.Seconds(CollectivePurpose::kNormBoundary);
    rec.grad_sync_s = ts.Seconds(CollectivePurpose::kGradSync) +
                      cx.dp->stats().Seconds(CollectivePurpose::kGradSync);
    rec.peak_bytes = arena.peak_bytes();
    rec.predicted_peak_bytes = Predict(o, d.mode, space, current.lengths);
    rec.device_allocated_bytes = arena.device_allocated_bytes() - allocated_before;

    // The group's reduce-scatter wait share (max over ranks, docs/design.md §2) for the
    // leader's fail-static window; the daemon computes its own from telemetry.
    if (decider && o.tp > 1) {
      double share = step_s > 0 ? rec.rs_wait_s / step_s : 0;
      RETURN_IF_ERROR(cx.tp->AllReduceMaxHost(&share, 1));
      if (leader) gate->ObserveGroupRsWaitShare(n, d.mode, share);
    }
    if (gate && !o.controller.empty()) {
      // Telemetry never blocks; a refusal is a bug worth surfacing.
      RETURN_IF_ERROR(gate->ReportTelemetry({.step = n, .mode = d.mode, .reason = d.reason,
                                             .step_time_s = std::max(step_s, 1e-9),
                                             .rs_wait_s = rec.rs_wait_s,
                                             .all_gather_s = rec.all_gather_s,
                                             .norm_stall_s = rec.norm_stall_s,
                                             .effective_tokens = rec.tokens,
                                             .padding_tokens = rec.padding_tokens,
                                             .peak_memory_bytes = rec.peak_bytes}));
    }
    if (log) log->Write(n, d.mode, d.reason, source);
    if (o.verify && window_end) {
      ASSIGN_OR_RETURN(rec.verify_diff, VerifyBatch(*stack, mb));
    }
    result.steps.push_back(rec);
    arena.TrimCache();
    if (has_next) current = std::move(next);
  }

  if (gate) {
    if (!o.controller.empty()) (void)gate->Flush(absl::Seconds(2));  // counts say what was lost
    const client::GateClientStats s = gate->stats();
    result.counters.telemetry_sent = s.telemetry_sent;
    result.counters.telemetry_acked = s.telemetry_acked;
    result.counters.telemetry_dropped = s.telemetry_dropped;
    result.counters.daemon_decisions = s.daemon_decisions;
    result.counters.late_decisions = s.late_decisions;
  }
  return result;
}

}  // namespace

absl::StatusOr<RankResult> RunWorkerRank(const WorkerOptions& options, const ProcessGrid& grid,
                                         Device* device, Communicator* tp, Communicator* dp) {
  RETURN_IF_ERROR(ValidateWorkerOptions(options));
  if (tp == nullptr || dp == nullptr || tp->size() != grid.tp() || dp->size() != grid.dp()) {
    return absl::InvalidArgumentError("RunWorkerRank: communicators do not match the grid");
  }
  ASSIGN_OR_RETURN(std::string incarnation, AgreeOnIncarnation(options, grid));
  return Run({options, grid, device, tp, dp, std::move(incarnation)});
}

absl::StatusOr<std::optional<RunSummary>> GatherSummary(const WorkerOptions& options,
                                                        const ProcessGrid& grid,
                                                        const RankResult& result) {
  const int size = grid.world_size();
  const bool root = grid.world_rank() == 0;
  int64_t steps = static_cast<int64_t>(result.steps.size());
  std::vector<int64_t> all_steps(root ? size : 0);
  SPGATE_MPI_RETURN_IF_ERROR(
      MPI_Gather(&steps, 1, MPI_INT64_T, all_steps.data(), 1, MPI_INT64_T, 0, grid.world()));
  if (root) {
    for (int64_t s : all_steps) {
      if (s != steps) return absl::InternalError("GatherSummary: ranks ran different step counts");
    }
  }
  const int bytes = static_cast<int>(steps * sizeof(StepRecord));
  std::vector<StepRecord> gathered(root ? steps * size : 0);
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Gather(result.steps.data(), bytes, MPI_BYTE, gathered.data(),
                                        bytes, MPI_BYTE, 0, grid.world()));
  std::vector<RankCounters> counters(root ? size : 0);
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Gather(&result.counters, sizeof(RankCounters), MPI_BYTE,
                                        counters.data(), sizeof(RankCounters), MPI_BYTE, 0,
                                        grid.world()));
  if (!root) return std::optional<RunSummary>();
  std::vector<std::vector<StepRecord>> per_rank(size);
  for (int r = 0; r < size; ++r) {
    per_rank[r].assign(gathered.begin() + r * steps, gathered.begin() + (r + 1) * steps);
  }
  return std::optional<RunSummary>(Summarize(DescribeRun(options, size), per_rank, counters));
}

}  // namespace spgate::runtime
