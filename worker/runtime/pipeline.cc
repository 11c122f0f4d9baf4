// Pipeline stages: p2p with exact sizes and the 1F1B step; see pipeline.h.
#include "worker/runtime/pipeline.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/runtime/mpi_communicator.h"

namespace spgate::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Forward activations and backward gradients of micro-batch i use tags 2i and 2i + 1;
// within a step every message of a (sender, tag) is received before the next step's.
int Tag(StageLink::Direction d, int microbatch) {
  return 2 * microbatch + (d == StageLink::Direction::kBackward ? 1 : 0);
}

}  // namespace

StageLink::~StageLink() {
  // After a step that failed midway (the run ends with an error and the job is aborted),
  // a pending send may wait for a receive its peer will never post: do not wait for it
  // here. Its request is freed and its buffer deliberately kept alive (MPI may still read
  // it until the process ends).
  if (requests_.empty()) return;
  int done = 0;
  if (MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                  MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
      done) {
    return;
  }
  for (MPI_Request& r : requests_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  (void)new std::vector<std::vector<float>>(std::move(in_flight_));  // kept on purpose
}

absl::Status StageLink::Send(Direction d, int microbatch, std::vector<float> data) {
  const int peer = d == Direction::kForward ? next_ : prev_;
  if (peer < 0) {
    return absl::InternalError(absl::StrFormat(
        "stage link: no %s stage to send micro-batch %d to",
        d == Direction::kForward ? "next" : "previous", microbatch));
  }
  in_flight_.push_back(std::move(data));
  std::vector<float>& buf = in_flight_.back();
  MPI_Request req;
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, peer,
                                       Tag(d, microbatch), comm_, &req));
  requests_.push_back(req);
  ++messages_;
  bytes_sent_ += static_cast<int64_t>(buf.size() * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> StageLink::Receive(Direction d, int microbatch,
                                                      int64_t expected_floats) {
  const int peer = d == Direction::kForward ? prev_ : next_;
  if (peer < 0) {
    return absl::InternalError(absl::StrFormat(
        "stage link: no %s stage to receive micro-batch %d from",
        d == Direction::kForward ? "previous" : "next", microbatch));
  }
  const auto t0 = Clock::now();
  MPI_Message msg;
  MPI_Status status;
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Mprobe(peer, Tag(d, microbatch), comm_, &msg, &status));
  int count = 0;
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Get_count(&status, MPI_FLOAT, &count));
  std::vector<float> data(static_cast<size_t>(count));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Mrecv(data.data(), count, MPI_FLOAT, &msg, MPI_STATUS_IGNORE));
  wait_s_ += Since(t0);
  if (count != expected_floats) {
    ++size_mismatches_;
    return absl::InternalError(absl::StrFormat(
        "stage boundary: micro-batch %d's %s message from world rank %d has %d floats, this "
        "stage expected %d (the stages disagree on its shape; NCCL would hang here)",
        microbatch, d == Direction::kForward ? "activation" : "gradient", peer, count,
        expected_floats));
  }
  return data;
}

absl::Status StageLink::Finish() {
  if (requests_.empty()) return absl::OkStatus();
  const auto t0 = Clock::now();
  const int rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                             MPI_STATUSES_IGNORE);
  wait_s_ += Since(t0);
  requests_.clear();
  in_flight_.clear();
  SPGATE_MPI_RETURN_IF_ERROR(rc);
  return absl::OkStatus();
}

absl::Status RunStageStep(TransformerStack& stack, StageLink& link, const PipelineLayout& layout,
                          int stage, std::span<const MicroBatch> microbatches,
                          std::span<const Mode> modes, std::span<MicrobatchTimes> times) {
  if (static_cast<int>(microbatches.size()) != layout.microbatches ||
      modes.size() != microbatches.size() ||
      (!times.empty() && times.size() != microbatches.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RunStageStep: %d micro-batches, %d modes and %d times for a layout of %d",
        microbatches.size(), modes.size(), times.size(), layout.microbatches));
  }
  std::fill(times.begin(), times.end(), MicrobatchTimes{});
  // Adds the time since `start` and the collectives' since `before` to micro-batch i.
  const CollectiveStats& tp = stack.tp_stats();
  auto account = [&](int i, bool forward, Clock::time_point start, double rs0, double ag0,
                     double ar0) {
    if (times.empty()) return;
    MicrobatchTimes& t = times[static_cast<size_t>(i)];
    (forward ? t.forward_s : t.backward_s) += Since(start);
    t.rs_wait_s += tp.Seconds(CollectiveOp::kReduceScatter, CollectivePurpose::kLayer) - rs0;
    t.all_gather_s += tp.Seconds(CollectiveOp::kAllGather, CollectivePurpose::kLayer) - ag0;
    t.all_reduce_s += tp.Seconds(CollectiveOp::kAllReduce, CollectivePurpose::kLayer) - ar0;
  };
  if (layout.vp != 1) {
    return absl::UnimplementedError(
        "RunStageStep: the reference worker runs 1F1B (vp = 1); the interleaved schedule is "
        "modelled by the memory gate and the simulator only");
  }
  ASSIGN_OR_RETURN(const std::vector<PipelineOp> ops, StageSchedule(layout, stage));
  const bool first = stage == 0, last = stage == layout.pp - 1;
  std::vector<std::unique_ptr<TransformerStack::InFlight>> held(microbatches.size());
  for (const PipelineOp& op : ops) {
    const int i = op.microbatch;
    const MicroBatch& mb = microbatches[i];
    const int64_t boundary = BoundaryFloats(stack.options(), mb.lengths, modes[i]);
    if (op.forward) {
      std::vector<float> input;
      if (!first) {
        ASSIGN_OR_RETURN(input, link.Receive(StageLink::Direction::kForward, i, boundary));
      }
      std::vector<float> output;
      const auto start = Clock::now();
      const double rs0 = tp.Seconds(CollectiveOp::kReduceScatter, CollectivePurpose::kLayer);
      const double ag0 = tp.Seconds(CollectiveOp::kAllGather, CollectivePurpose::kLayer);
      const double ar0 = tp.Seconds(CollectiveOp::kAllReduce, CollectivePurpose::kLayer);
      ASSIGN_OR_RETURN(held[i], stack.Forward(mb, modes[i], input, last ? nullptr : &output));
      account(i, /*forward=*/true, start, rs0, ag0, ar0);
      if (!last) RETURN_IF_ERROR(link.Send(StageLink::Direction::kForward, i, std::move(output)));
    } else {
      if (held[i] == nullptr) {
        return absl::InternalError(absl::StrFormat(
            "RunStageStep: micro-batch %d's backward before its forward", i));
      }
      std::vector<float> grad;
      if (!last) {
        ASSIGN_OR_RETURN(grad, link.Receive(StageLink::Direction::kBackward, i, boundary));
      }
      std::vector<float> input_grad;
      const auto start = Clock::now();
      const double rs0 = tp.Seconds(CollectiveOp::kReduceScatter, CollectivePurpose::kLayer);
      const double ag0 = tp.Seconds(CollectiveOp::kAllGather, CollectivePurpose::kLayer);
      const double ar0 = tp.Seconds(CollectiveOp::kAllReduce, CollectivePurpose::kLayer);
      RETURN_IF_ERROR(stack.Backward(*held[i], grad, first ? nullptr : &input_grad));
      account(i, /*forward=*/false, start, rs0, ag0, ar0);
      held[i].reset();  // its activations go back to the arena
      if (!first) {
        RETURN_IF_ERROR(link.Send(StageLink::Direction::kBackward, i, std::move(input_grad)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace spgate::runtime
