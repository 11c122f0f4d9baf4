// The step loop, its per-step measurements, --verify, the decision log, and the gather
// of every rank's records for the summary. The options' checks are in worker_options.cc,
// the launch's identity in launch_agreement.cc.
#include "worker/runtime/worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <span>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hardware_id.h"
#include "common/progress.h"
#include "policy/gate_policy.h"
#include "policy/step_plan.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"
#include "worker/client/identity.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/lengths.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/memory_model.h"
#include "worker/runtime/pipeline.h"
#include "common/status_macros.h"
#include "worker/runtime/transformer_stack.h"

namespace spgate::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Decision log: one CSV per global rank with a header row, a line per micro-batch of each
// step (one per step without micro-batches: micro_batch 0), flushed as written so a killed
// run leaves every step it finished. Columns: step,mode,reason,source,stage,micro_batch.
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
    std::fputs("step,mode,reason,source,stage,micro_batch\n", f);
    std::fflush(f);
    return std::unique_ptr<DecisionLog>(new DecisionLog(f));
  }
  ~DecisionLog() { std::fclose(f_); }
  void Write(int64_t step, Mode mode, Reason reason, StepSource source, int stage = 0,
             int micro_batch = 0) {
    const std::string line = absl::StrCat(step, ",", std::string(ModeLabel(mode)), ",",
                                          std::string(ReasonLabel(reason)), ",",
                                          StepSourceLabel(source), ",", stage, ",", micro_batch,
                                          "\n");
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
  LaunchIdentity launch;  // the same on every rank (see AgreeOnLaunch)
};

// The leader's batch (lengths) reaches every rank of the TP group.
absl::Status BroadcastBatch(Communicator* tp, Batch& batch) {
  int64_t n = static_cast<int64_t>(batch.lengths.size());
  RETURN_IF_ERROR(tp->BroadcastHost(&n, sizeof(n), 0));
  batch.lengths.resize(n);
  RETURN_IF_ERROR(tp->BroadcastHost(batch.lengths.data(), n * sizeof(int64_t), 0));
  batch = MakeBatch(std::move(batch.lengths));
  return absl::OkStatus();
}

uint64_t Predict(const WorkerOptions& o, Mode mode, MemorySpace space,
                 const std::vector<int64_t>& lengths) {
  return PredictPeak({.shape = o.shape, .tp = o.tp, .mode = mode,
                      .norm_boundary = o.norm_boundary, .space = space,
                      .attention_query_block = o.attention_query_block,
                      .recompute = o.recompute},
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

// One rank's run: what it sets up once (in SetUp's order) and the steps each iteration
// takes (in RunStep's order). Every rank of the job calls the same collectives in the same
// order: the node split in MemoryBudget and the first batch's broadcast, then per step the
// stop broadcast of a timed run, the next batch's broadcast, the decision broadcast, the
// layers' and the gradients' collectives, and the group's wait-share all-reduce.
class RankRun {
 public:
  explicit RankRun(RankContext cx)
      : cx_(std::move(cx)), o_(cx_.o), grid_(cx_.grid), leader_(cx_.grid.is_group_leader()),
        space_(cx_.device->space()) {}

  absl::StatusOr<RankResult> Run() {
    RETURN_IF_ERROR(SetUp());
    RankResult result;
    const auto start = Clock::now();
    std::vector<Batch> current, next;  // the step's micro-batches (one without pipelines)
    RETURN_IF_ERROR(Prefetch(0, current));
    const std::unique_ptr<ProgressReporter> progress = MakeProgress();
    for (int64_t n = 0;; ++n) {
      ASSIGN_OR_RETURN(const bool done, DoneBefore(n, start));
      if (done) break;
      const bool has_next = timed_run() || n + 1 < o_.steps;
      if (has_next) RETURN_IF_ERROR(Prefetch(n + 1, next));
      ASSIGN_OR_RETURN(const StepRecord rec, RunStep(n, current, result));
      result.steps.push_back(rec);
      if (progress) progress->Add(StepProgress(rec, result));
      arena_->TrimCache();
      if (has_next) current = std::move(next);
    }
    if (progress) progress->Finish();
    FinishGate(result.counters);
    if (link_) {
      result.counters.p2p_size_mismatches = link_->size_mismatches();
      result.counters.p2p_bytes_sent = link_->bytes_sent();
    }
    return result;
  }

 private:
  // Per step: the time a step's clock measured, and the arena before it started.
  struct StepClock {
    double decision_s = 0;
    double step_s = 0;
    uint64_t allocated_before = 0;
  };

  bool timed_run() const { return o_.duration > absl::ZeroDuration(); }

  // --progress: world rank 0's line, its own TP group's steps, tokens and decisions.
  std::unique_ptr<ProgressReporter> MakeProgress() const {
    if (!o_.progress || grid_.world_rank() != 0) return nullptr;
    ProgressReporter::Options po;
    po.label = "spgate-worker, TP group 0";
    po.rate_unit = "tok/s/group";
    po.total_steps = timed_run() ? 0 : o_.steps;
    po.total_duration = o_.duration;
    return std::make_unique<ProgressReporter>(std::move(po));
  }
  // A step's part of the line: its decisions (a pipeline's, one per micro-batch).
  ProgressDelta StepProgress(const StepRecord& rec, const RankResult& result) const {
    ProgressDelta d{.parts = 1, .tokens = static_cast<double>(rec.tokens)};
    const bool pipelined = Pipelined(o_);
    const size_t m = pipelined ? static_cast<size_t>(o_.microbatches) : 1;
    for (size_t i = 0; i < m; ++i) {
      Mode mode = static_cast<Mode>(rec.mode);
      if (pipelined && result.microbatch_decisions.size() >= m) {
        const std::vector<uint8_t>& b = result.microbatch_decisions;
        if (const std::optional<Decision> x = UnpackModeReason(b[b.size() - m + i])) mode = x->mode;
      }
      (mode == Mode::kSequenceParallel ? d.sp : d.tp) += 1;
    }
    return d;
  }
  bool auto_mode() const { return o_.mode == ModeChoice::kAuto; }

  // ---- Set-up ----

  absl::Status SetUp() {
    // Collective (node-local ranks): every rank computes it, before anything else.
    ASSIGN_OR_RETURN(budget_, MemoryBudget(cx_));
    // A step plan's byte counts stay below 2^40; a host-memory default above it (a large
    // host shared by few ranks) is capped there: no stage of this worker comes near it.
    if (Pipelined(o_)) budget_ = std::min(budget_, kMaxStepPlanBytes - 1);
    arena_ = std::make_unique<MemoryArena>(cx_.device, o_.arena);
    ASSIGN_OR_RETURN(stack_,
                     TransformerStack::Create({.shape = stage_shape(), .tp = o_.tp,
                                               .tp_rank = grid_.tp_rank(),
                                               .norm_boundary = o_.norm_boundary,
                                               .param_seed = o_.seed,
                                               .attention_query_block = o_.attention_query_block,
                                               .layer_offset = grid_.stage() * stage_shape().layers,
                                               .native_stage_boundary = o_.native_stage_boundary,
                                               .recompute = o_.recompute},
                                              arena_.get(), cx_.tp));
    if (Pipelined(o_)) {
      link_ = std::make_unique<StageLink>(grid_.world(), grid_.prev_stage_rank(),
                                          grid_.next_stage_rank());
    }
    RETURN_IF_ERROR(CreateGate());
    RETURN_IF_ERROR(CreateDecider());
    ASSIGN_OR_RETURN(log_, DecisionLog::Open(o_.decision_log, grid_.world_rank()));
    WaitForDaemon();
    return CreateBatchBuilder();
  }

  // The gate client: the leader's decides (daemon or local policy) and, in its group
  // session, reports the group's telemetry; with per-rank sessions every rank has one and
  // reports its own when there is a daemon.
  absl::Status CreateGate() {
    const bool remote = !o_.client.controller.empty();
    const bool needed = leader_ ? auto_mode() || remote : remote && !o_.client.group_session;
    if (!needed) return absl::OkStatus();
    client::GateClientOptions co = o_.client;  // the flags' (docs/design.md §10)
    co.incarnation = cx_.launch.incarnation;
    co.launch_credential = cx_.launch.launch_credential;
    co.group = grid_.group();
    co.rank_in_group = grid_.tp_rank();
    co.group_size = o_.tp;
    co.global_rank = grid_.world_rank();
    co.model = {o_.shape.layers, o_.shape.hidden, o_.shape.heads, o_.shape.ffn_hidden};
    co.memory_budget_bytes = budget_;
    // The option given, else SPGATE_HARDWARE_ID, else the device's (a CUDA device's GPU;
    // the host's CPU otherwise).
    if (co.hardware_id.empty() && !co.controller.empty()) {
      co.hardware_id = client::DefaultHardwareId(cx_.device->hardware_id());
      RETURN_IF_ERROR(ValidateHardwareId(co.hardware_id, "SPGATE_HARDWARE_ID"));
    }
    if (Pipelined(o_)) {
      co.layout = layout();
      co.coordinates = {.dp_index = grid_.dp_rank(), .stage = grid_.stage()};
    }
    co.seed = o_.seed * 7919 + grid_.world_rank() + 1;
    ASSIGN_OR_RETURN(gate_, client::GateClient::Create(co));
    return absl::OkStatus();
  }

  // With --mode=auto every rank takes the leader's decision through a GroupDecider; in a
  // group session it also carries each step's telemetry to the leader (one max-reduction
  // of 128 bytes and a double a rank over the TP group, the collective that already carried
  // the wait share).
  absl::Status CreateDecider() {
    if (!auto_mode() && (o_.client.controller.empty() || !o_.client.group_session)) {
      return absl::OkStatus();
    }
    Communicator* tp = cx_.tp;
    client::MaxReduceFn reduce;
    if (o_.client.group_session) {
      // A step's record, and a pipelined step's micro-batches', in one reduction.
      reduce = [tp](std::span<double> v, int /*root: every rank gets it*/) {
        return tp->AllReduceMaxHost(v.data(), static_cast<int>(v.size()));
      };
    }
    ASSIGN_OR_RETURN(decider_, client::GroupDecider::Create(
                                   gate_.get(), grid_.tp_rank(),
                                   [tp](std::span<uint8_t> bytes, int root) {
                                     return tp->BroadcastHost(bytes.data(), bytes.size(), root);
                                   },
                                   std::move(reduce)));
    return absl::OkStatus();
  }

  void WaitForDaemon() {
    if (!gate_ || !leader_ || o_.client.controller.empty() ||
        o_.connect_timeout <= absl::ZeroDuration()) {
      return;
    }
    // Start-up only: give the stream a moment so the first steps are the daemon's. A
    // daemon that is not there costs this once; every step after uses the deadline.
    if (absl::Status s = gate_->WaitUntilConnected(o_.connect_timeout); !s.ok()) {
      std::fprintf(stderr, "spgate-worker: group %d: %s not connected (waited at most %s: "
                           "%s); deciding locally until it answers\n",
                   grid_.group(), o_.client.controller.c_str(),
                   absl::FormatDuration(o_.connect_timeout).c_str(),
                   std::string(s.message()).c_str());
    }
  }

  // Data: the leader of each TP group draws its own stream (data parallel groups see
  // different data) and broadcasts each batch to its group.
  absl::Status CreateBatchBuilder() {
    if (!leader_ || grid_.stage() != 0) return absl::OkStatus();  // a replica's first leader
    ASSIGN_OR_RETURN(auto source,
                     ParseLengthSource(o_.lengths, o_.seed * 1000003 + grid_.dp_rank(),
                                       o_.tokens_per_batch));
    builder_ = std::make_unique<BatchBuilder>(
        std::move(source),
        BatchBuilderOptions{.tokens_per_batch = o_.tokens_per_batch, .bucketing = o_.bucketing});
    return absl::OkStatus();
  }

  // ---- The steps ----

  // Whether the run ends before step n. In a timed run world rank 0 decides for everyone
  // (collective), so all ranks run the same number of steps.
  absl::StatusOr<bool> DoneBefore(int64_t n, Clock::time_point start) const {
    if (!timed_run()) return n >= o_.steps;
    uint8_t stop = Since(start) >= absl::ToDoubleSeconds(o_.duration) ? 1 : 0;
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(&stop, 1, MPI_UINT8_T, 0, grid_.world()));
    return stop != 0;
  }

  // Batch `step` reaches every rank of the group, and its plan goes to the decider.
  absl::Status Prefetch(int64_t step, std::vector<Batch>& batches) {
    if (Pipelined(o_)) return PrefetchMicrobatches(step, batches);
    batches.resize(1);
    Batch& batch = batches[0];
    if (leader_) batch = builder_->Next(TargetCv(step));
    RETURN_IF_ERROR(BroadcastBatch(cx_.tp, batch));
    if (!decider_ || !auto_mode()) return absl::OkStatus();
    return decider_->SubmitPlan(
        {.step = step, .lengths = batch.lengths,
         .predicted_peak_bytes_sp = Predict(o_, Mode::kSequenceParallel, space_, batch.lengths),
         .predicted_peak_bytes_tp = Predict(o_, Mode::kTensorParallelOnly, space_, batch.lengths),
         .memory_budget_bytes = budget_});
  }

  // The bucketing target of the config in force at `step`.
  double TargetCv(int64_t step) const {
    return gate_ ? gate_->ConfigFor(step).config.bucket_target_cv
                 : o_.client.initial_config.bucket_target_cv;
  }

  // Step n, always a loop over its micro-batches (one without --microbatches; a stage's
  // 1F1B schedule with a pipeline, pp = 1 its warm-up 0): their data, the step's decision,
  // forward and backward, one optimizer step's gradients, the record (Measure), the report
  // (and --verify).
  absl::StatusOr<StepRecord> RunStep(int64_t n, const std::vector<Batch>& batches,
                                     RankResult& result) {
    const int m = static_cast<int>(batches.size());
    // The micro-batches' data, made before the clock starts (a data loader's job), from
    // the replica's seed (every stage of a pipeline draws alike; a plain step keeps its
    // group's). Only a pipeline's first stage reads the input and its last the loss's
    // gradient (a plain step's one stage is both).
    const bool ends = grid_.stage() == 0 || grid_.stage() == o_.pp - 1;
    const uint64_t replica = Pipelined(o_) ? static_cast<uint64_t>(grid_.dp_rank()) * 7919
                                           : static_cast<uint64_t>(grid_.group());
    std::vector<BatchData> data(m);
    std::vector<MicroBatch> mbs(m);
    for (int i = 0; i < m; ++i) {
      const uint64_t seed = o_.seed * 0x9e3779b9ull + static_cast<uint64_t>(n) * 131 + replica +
                            static_cast<uint64_t>(i) * 1000003;
      if (ends) data[i] = MakeBatchData(batches[i].lengths, seed, o_.shape.hidden);
      mbs[i] = {.lengths = batches[i].lengths, .data_seed = seed,
                .data = ends ? &data[i] : nullptr};
    }
    cx_.tp->ResetStats();
    cx_.dp->ResetStats();
    if (link_) link_->ResetStats();
    arena_->ResetPeak();
    StepClock clock;
    clock.allocated_before = arena_->device_allocated_bytes();
    const auto t0 = Clock::now();
    StepSource source = StepSource::kFlag;
    ASSIGN_OR_RETURN(client::GateDecision d, Decide(n, m, &source));
    clock.decision_s = Since(t0);
    std::vector<Mode> modes;
    for (const Decision& x : d.microbatches) modes.push_back(x.mode);
    if (modes.empty()) modes.push_back(d.mode);
    std::vector<MicrobatchTimes> times(static_cast<size_t>(m));
    RETURN_IF_ERROR(Train(mbs, modes, times));
    clock.step_s = Since(t0);

    StepRecord rec = Measure(n, batches, modes, d, source, clock);
    d.mode = static_cast<Mode>(rec.mode);
    RETURN_IF_ERROR(Report(n, d, source, rec, MicrobatchTelemetry(batches, modes, times, d)));
    if (o_.verify) {
      // Each micro-batch through this stage's layers alone in both modes (a stage's input
      // is the micro-batch's data where it has it, else its seeded input: the layers' SP ≡
      // TP-only equivalence does not depend on where the rows came from).
      for (int i = 0; i < m; ++i) {
        ASSIGN_OR_RETURN(const double diff, VerifyBatch(*stack_, mbs[i]));
        rec.verify_diff = i == 0 ? diff : std::max(rec.verify_diff, diff);
      }
    }
    for (const Decision& x : d.microbatches) {
      result.microbatch_decisions.push_back(PackModeReason(x));
    }
    return rec;
  }

  // The step's decision: a step plan's, one per micro-batch, from the decider (auto, with a
  // pipeline); else the leader's through the GroupDecider (auto) or the flag's mode — one,
  // copied to every micro-batch of a pipeline's step.
  absl::StatusOr<client::GateDecision> Decide(int64_t n, int m, StepSource* source) {
    const absl::Time deadline = absl::Now() + o_.client.decision_deadline;
    client::GateDecision d;
    if (decider_ && auto_mode()) {
      // A plain plan is the decider's step of no micro-batch list.
      ASSIGN_OR_RETURN(d, decider_->Decide(n, Pipelined(o_) ? m : 0, deadline));
      *source = static_cast<StepSource>(d.source);
      return d;
    }
    d.step = n;
    const bool sp = o_.mode == ModeChoice::kSp ||
                    (o_.mode == ModeChoice::kAlternate &&
                     (n / std::max<int64_t>(o_.alternate_steps, 1)) % 2 == 0);
    d.mode = sp ? Mode::kSequenceParallel : Mode::kTensorParallelOnly;
    d.reason = Reason::kPinned;
    if (Pipelined(o_)) d.microbatches.assign(m, {d.mode, d.reason});
    return d;
  }

  // The step's micro-batches forward and backward in their modes, gradients zeroed before
  // them and finished (over the DP group) after them: one optimizer step per step. A
  // pipeline's stage runs its schedule over the stage link, timing each micro-batch; a
  // plain step's micro-batch runs ForwardBackward. Returns when the device and both groups
  // are idle.
  absl::Status Train(std::span<const MicroBatch> mbs, std::span<const Mode> modes,
                     std::span<MicrobatchTimes> times) {
    RETURN_IF_ERROR(stack_->ZeroGrads());
    if (link_) {
      RETURN_IF_ERROR(
          RunStageStep(*stack_, *link_, layout().pipeline(), grid_.stage(), mbs, modes, times));
      RETURN_IF_ERROR(link_->Finish());
    } else {
      for (size_t i = 0; i < mbs.size(); ++i) {
        RETURN_IF_ERROR(stack_->ForwardBackward(mbs[i], modes[i]));
      }
    }
    RETURN_IF_ERROR(stack_->FinishGradients(cx_.dp));
    RETURN_IF_ERROR(cx_.device->Synchronize());
    RETURN_IF_ERROR(cx_.tp->Synchronize());
    return cx_.dp->Synchronize();
  }

  // The step's record, its micro-batches together: SP when any ran SP (their
  // reduce-scatters are the step's wait), so the group's ranks report one mode; the
  // clock's times, the collectives' since the stats were reset, and the memory (the
  // stage's schedule-aware prediction with a pipeline).
  StepRecord Measure(int64_t n, const std::vector<Batch>& batches, std::span<const Mode> modes,
                     const client::GateDecision& d, StepSource source,
                     const StepClock& clock) const {
    StepRecord rec;
    const bool any_sp = std::count(modes.begin(), modes.end(), Mode::kSequenceParallel) > 0;
    rec.step = n;
    rec.mode = static_cast<uint8_t>(any_sp ? Mode::kSequenceParallel : Mode::kTensorParallelOnly);
    rec.reason = static_cast<uint8_t>(d.reason);
    rec.source = static_cast<uint8_t>(source);
    double cv_sum = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      rec.sequences += static_cast<int32_t>(batches[i].lengths.size());
      rec.tokens += batches[i].tokens;
      if (modes[i] == Mode::kSequenceParallel) {
        rec.padding_tokens += SpPaddedTokens(batches[i].tokens, o_.tp) - batches[i].tokens;
      }
      cv_sum += batches[i].length_cv;
    }
    rec.length_cv = cv_sum / static_cast<double>(batches.size());
    const CollectiveStats& ts = cx_.tp->stats();
    rec.step_time_s = clock.step_s;
    rec.decision_s = clock.decision_s;
    rec.rs_wait_s = ts.Seconds(CollectiveOp::kReduceScatter, CollectivePurpose::kLayer);
    rec.all_gather_s = ts.Seconds(CollectiveOp::kAllGather, CollectivePurpose::kLayer);
    rec.all_reduce_s = ts.Seconds(CollectiveOp::kAllReduce, CollectivePurpose::kLayer);
    rec.norm_stall_s = ts.Seconds(CollectivePurpose::kNormBoundary);
    rec.grad_sync_s = ts.Seconds(CollectivePurpose::kGradSync) +
                      cx_.dp->stats().Seconds(CollectivePurpose::kGradSync);
    rec.peak_bytes = arena_->peak_bytes();
    rec.device_allocated_bytes = arena_->device_allocated_bytes() - clock.allocated_before;
    rec.predicted_peak_bytes = Pipelined(o_)
                                   ? PredictStage(batches, modes)
                                   : Predict(o_, modes[0], space_, batches[0].lengths);
    return rec;
  }

  // What a stage's ADAPTIVE learns from (a step plan's only): each micro-batch's own
  // compute and tokens.
  static std::vector<MicrobatchTelemetryValues> MicrobatchTelemetry(
      const std::vector<Batch>& batches, std::span<const Mode> modes,
      std::span<const MicrobatchTimes> times, const client::GateDecision& d) {
    std::vector<MicrobatchTelemetryValues> per_mb;
    if (d.microbatches.empty()) return per_mb;
    for (size_t i = 0; i < batches.size(); ++i) {
      // The range rules' floor and "a wait within its time" (docs/design.md §2): a
      // measurement's artefact (collective time summed over overlapping calls) is capped,
      // not sent to be refused.
      const double backward_s = std::max(times[i].backward_s, kMinTelemetrySeconds);
      const double compute_s = times[i].forward_s + backward_s;
      per_mb.push_back({.id = static_cast<int>(i),
                        .mode = modes[i],
                        .forward_s = times[i].forward_s,
                        .backward_s = backward_s,
                        .rs_wait_s = std::min(times[i].rs_wait_s, compute_s),
                        .all_gather_s = std::min(times[i].all_gather_s, compute_s),
                        .effective_tokens = batches[i].tokens,
                        .all_reduce_s = std::min(times[i].all_reduce_s, compute_s)});
    }
    return per_mb;
  }

  // The group's wait share to the leader's fallback, telemetry to the daemon, the log line.
  absl::Status Report(int64_t n, const client::GateDecision& d, StepSource source,
                      const StepRecord& rec,
                      std::vector<MicrobatchTelemetryValues> microbatches = {}) {
    const double step_s = std::max(rec.step_time_s, kMinTelemetrySeconds);  // as above
    client::StepTelemetryInput mine{.step = n, .mode = d.mode, .reason = d.reason,
                                    .step_time_s = step_s,
                                    .rs_wait_s = std::min(rec.rs_wait_s, step_s),
                                    .all_gather_s = std::min(rec.all_gather_s, step_s),
                                    .norm_stall_s = std::min(rec.norm_stall_s, step_s),
                                    .effective_tokens = rec.tokens,
                                    .padding_tokens = rec.padding_tokens,
                                    .peak_memory_bytes = rec.peak_bytes,
                                    .all_reduce_s = std::min(rec.all_reduce_s, step_s)};
    // Only a step plan's step (a decision with micro-batches) has micro-batch records.
    if (decider_ && auto_mode()) mine.microbatches = std::move(microbatches);
    if (decider_ && o_.client.group_session) {
      // One reduction brings the group's values to the leader, which feeds its fail-static
      // window the group's wait share and queues the group's record (never blocking). Not
      // fatal: only the leader and a refused rank see an error, and a rank that stopped
      // here would leave the others waiting in the group's next collective.
      if (absl::Status s = decider_->ReportTelemetry(mine); !s.ok() && telemetry_errors_++ == 0) {
        std::fprintf(stderr, "spgate-worker: group %d rank %d step %lld: telemetry: %s (further "
                             "telemetry errors are not shown)\n",
                     grid_.group(), grid_.tp_rank(), static_cast<long long>(n),
                     s.ToString().c_str());
      }
      WriteLog(n, d, source);
      return absl::OkStatus();
    }
    // Per-rank sessions: the group's reduce-scatter wait share (max over ranks,
    // docs/design.md §2) for the leader's fail-static window, and each rank's own record.
    if (decider_ && o_.tp > 1) {
      double share = mine.rs_wait_s / mine.step_time_s;  // in [0, 1]: both as sent
      RETURN_IF_ERROR(cx_.tp->AllReduceMaxHost(&share, 1));
      if (leader_) RETURN_IF_ERROR(gate_->ObserveGroupRsWaitShare(n, d.mode, share));
    }
    if (gate_ && !o_.client.controller.empty()) {
      // Telemetry never blocks; a refusal is a bug worth surfacing.
      RETURN_IF_ERROR(gate_->ReportTelemetry(mine));
    }
    WriteLog(n, d, source);
    return absl::OkStatus();
  }

  // A row per micro-batch (one for a step without them). A fallback's rows say
  // controller_unavailable, as its step does.
  void WriteLog(int64_t n, const client::GateDecision& d, StepSource source) {
    if (!log_) return;
    if (d.microbatches.empty()) {
      log_->Write(n, d.mode, d.reason, source);
      return;
    }
    for (size_t i = 0; i < d.microbatches.size(); ++i) {
      const Decision& x = d.microbatches[i];
      const Reason reason = source == StepSource::kFallback ? d.reason : x.reason;
      log_->Write(n, x.mode, reason, source, grid_.stage(), static_cast<int>(i));
    }
  }

  // ---- Pipeline stages (docs/design.md §12) ----

  // This stage's share of the model.
  ModelShape stage_shape() const {
    ModelShape s = o_.shape;
    s.layers = o_.shape.layers / o_.pp;
    return s;
  }
  JobLayout layout() const {
    return JobLayout{.tp = o_.tp, .pp = o_.pp, .dp = grid_.dp(), .microbatches = o_.microbatches};
  }

  // What micro-batch `lengths` costs this stage in each mode (the memory model's replay of
  // the stage's layers): activations kept for its backward, and the rest of its peak.
  MicrobatchMemory StageMemoryOf(const std::vector<int64_t>& lengths) const {
    MemoryModelInput in{.shape = stage_shape(), .tp = o_.tp, .norm_boundary = o_.norm_boundary,
                        .space = space_, .attention_query_block = o_.attention_query_block,
                        .recompute = o_.recompute};
    in.mode = Mode::kSequenceParallel;
    const MemoryPrediction sp = PredictPeak(in, lengths);
    in.mode = Mode::kTensorParallelOnly;
    const MemoryPrediction tp = PredictPeak(in, lengths);
    auto workspace = [](const MemoryPrediction& p) {
      const uint64_t kept = p.resident_bytes + p.activation_bytes;
      return p.peak_bytes > kept ? p.peak_bytes - kept : 0;
    };
    return {.activation_sp = sp.activation_bytes, .activation_tp = tp.activation_bytes,
            .workspace_sp = workspace(sp), .workspace_tp = workspace(tp)};
  }

  // The stage's predicted peak over a step run in `modes` (every rank computes it alike).
  uint64_t PredictStage(const std::vector<Batch>& batches, std::span<const Mode> modes) const {
    std::vector<MicrobatchMemory> memory;
    for (const Batch& b : batches) memory.push_back(StageMemoryOf(b.lengths));
    const std::vector<PipelineOp> ops = StageSchedule(layout().pipeline(), grid_.stage()).value();
    return StagePeakBytes(ops, stack_->resident_bytes(), memory, modes);
  }

  // Step `step`'s micro-batches: the replica's first leader draws them, every rank of the
  // replica receives them (the lengths for every stage, over the pipeline's own
  // communicator, before the step), and each stage's leader submits its step plan.
  absl::Status PrefetchMicrobatches(int64_t step, std::vector<Batch>& batches) {
    const int m = o_.microbatches;
    std::vector<int64_t> counts(m, 0), flat;
    if (builder_) {
      for (int i = 0; i < m; ++i) {
        Batch b = builder_->Next(TargetCv(step));
        counts[i] = static_cast<int64_t>(b.lengths.size());
        flat.insert(flat.end(), b.lengths.begin(), b.lengths.end());
      }
    }
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(counts.data(), m, MPI_INT64_T, 0, grid_.replica_comm()));
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    flat.resize(static_cast<size_t>(total));
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Bcast(flat.data(), static_cast<int>(total), MPI_INT64_T, 0,
                                         grid_.replica_comm()));
    batches.clear();
    int64_t at = 0;
    for (int i = 0; i < m; ++i) {
      batches.push_back(MakeBatch(std::vector<int64_t>(flat.begin() + at,
                                                       flat.begin() + at + counts[i])));
      at += counts[i];
    }
    if (!decider_ || !auto_mode()) return absl::OkStatus();
    std::vector<client::MicrobatchPlanInput> plan(m);
    for (int i = 0; i < m; ++i) {
      plan[i] = {.id = i, .lengths = batches[i].lengths, .memory = StageMemoryOf(batches[i].lengths)};
    }
    return decider_->SubmitPlan({.step = step, .memory_budget_bytes = budget_,
                                 .microbatches = plan, .resident_bytes = stack_->resident_bytes()});
  }

  // ---- After the last step ----

  void FinishGate(RankCounters& counters) {
    if (!gate_) return;
    // The counts say what was lost.
    if (!o_.client.controller.empty()) (void)gate_->Flush(absl::Seconds(2));
    const client::GateClientStats s = gate_->stats();
    counters.telemetry_sent = s.telemetry_sent;
    counters.telemetry_acked = s.telemetry_acked;
    counters.telemetry_dropped = s.telemetry_dropped;
    counters.daemon_decisions = s.daemon_decisions;
    counters.late_decisions = s.late_decisions;
    counters.memory_overrides = s.memory_overrides;
    if (s.session_replaced) {
      std::fprintf(stderr, "spgate-worker: group %d rank %d: %s\n", grid_.group(),
                   grid_.tp_rank(), s.last_error.c_str());
    }
  }

  const RankContext cx_;
  const WorkerOptions& o_;
  const ProcessGrid& grid_;
  const bool leader_;
  const MemorySpace space_;
  uint64_t budget_ = 0;
  // Made in this order by SetUp and destroyed in reverse: the stack's buffers go back to
  // the arena before it closes, and the decider lets go of the gate before it closes.
  std::unique_ptr<MemoryArena> arena_;
  std::unique_ptr<TransformerStack> stack_;
  std::unique_ptr<client::GateClient> gate_;
  std::unique_ptr<client::GroupDecider> decider_;
  std::unique_ptr<StageLink> link_;  // pipelined runs only
  int64_t telemetry_errors_ = 0;  // group telemetry refused (reported once on stderr)
  std::unique_ptr<DecisionLog> log_;
  std::unique_ptr<BatchBuilder> builder_;  // the leader's only
};

}  // namespace

absl::StatusOr<RankResult> RunWorkerRank(const WorkerOptions& options, const ProcessGrid& grid,
                                         Device* device, Communicator* tp, Communicator* dp) {
  RETURN_IF_ERROR(ValidateWorkerOptions(options));
  if (tp == nullptr || dp == nullptr || tp->size() != grid.tp() || dp->size() != grid.dp()) {
    return absl::InvalidArgumentError("RunWorkerRank: communicators do not match the grid");
  }
  ASSIGN_OR_RETURN(LaunchIdentity launch, AgreeOnLaunch(options, grid));
  return RankRun({options, grid, device, tp, dp, std::move(launch)}).Run();
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
  // Pipelined runs: every rank's micro-batch decisions (steps x microbatches bytes).
  std::vector<std::vector<uint8_t>> microbatch_decisions;
  if (Pipelined(options)) {
    const int64_t mb_bytes64 = steps * options.microbatches;
    if (mb_bytes64 * size > std::numeric_limits<int>::max()) {
      return absl::OutOfRangeError(absl::StrCat(
          "GatherSummary: ", steps, " steps x ", options.microbatches,
          " micro-batches x ", size, " ranks is more than one MPI gather can carry"));
    }
    const int mb_bytes = static_cast<int>(mb_bytes64);
    if (static_cast<int>(result.microbatch_decisions.size()) != mb_bytes) {
      return absl::InternalError("GatherSummary: micro-batch decisions do not match the steps");
    }
    std::vector<uint8_t> all(root ? static_cast<size_t>(mb_bytes) * size : 0);
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Gather(result.microbatch_decisions.data(), mb_bytes, MPI_BYTE,
                                          all.data(), mb_bytes, MPI_BYTE, 0, grid.world()));
    if (root) {
      for (int r = 0; r < size; ++r) {
        microbatch_decisions.emplace_back(all.begin() + static_cast<int64_t>(r) * mb_bytes,
                                          all.begin() + static_cast<int64_t>(r + 1) * mb_bytes);
      }
    }
  }
  if (!root) return std::optional<RunSummary>();
  std::vector<std::vector<StepRecord>> per_rank(size);
  for (int r = 0; r < size; ++r) {
    per_rank[r].assign(gathered.begin() + r * steps, gathered.begin() + (r + 1) * steps);
  }
  return std::optional<RunSummary>(
      Summarize(DescribeRun(options, size), per_rank, counters, microbatch_decisions));
}

}  // namespace spgate::runtime
