// Pipeline stages of the reference worker (docs/design.md §12): the p2p between one rank
// of a stage and the same TP rank of the neighbouring stages, and one optimizer step of a
// stage under the 1F1B schedule (policy/pipeline_memory.h's StageSchedule, the order the
// memory gate assumed), each micro-batch in its own decided mode.
//
// The boundary contract: what crosses a stage boundary is the micro-batch's sequence-
// sharded rows (TransformerStack's BoundaryRows: padded to a multiple of t, this rank's
// 1/t) in both modes, so no message size depends on a mode and each stage's TP group may
// decide on its own. Sends never block (MPI_Isend, completed by Finish); a receive checks
// the message's exact size first (MPI_Mprobe + MPI_Get_count) and fails naming both sizes
// when it differs: MPI accepts a larger receive where NCCL would hang, so only a size
// check catches a shape disagreement on CPU.
//
// Usage (every rank of a pp-stage job, once per step):
//   StageLink link(grid.world(), grid.prev_stage_rank(), grid.next_stage_rank());
//   RETURN_IF_ERROR(RunStageStep(stack, link, layout, grid.stage(), micro_batches, modes));
//   RETURN_IF_ERROR(link.Finish());
#ifndef SPGATE_WORKER_RUNTIME_PIPELINE_H_
#define SPGATE_WORKER_RUNTIME_PIPELINE_H_

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/pipeline_memory.h"
#include "policy/types.h"
#include "worker/runtime/transformer_stack.h"

namespace spgate::runtime {

class StageLink {
 public:
  // `prev` / `next`: the world ranks of this TP rank in the previous and next stage; -1
  // for none (the first and last stage).
  StageLink(MPI_Comm comm, int prev, int next) : comm_(comm), prev_(prev), next_(next) {}
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  enum class Direction : uint8_t { kForward, kBackward };
  // Forward: to the next stage; backward: to the previous one. Keeps `data` until Finish.
  absl::Status Send(Direction direction, int microbatch, std::vector<float> data);
  // Forward: from the previous stage; backward: from the next one. INTERNAL naming both
  // sizes (and counted) when the message is not `expected_floats` long.
  absl::StatusOr<std::vector<float>> Receive(Direction direction, int microbatch,
                                             int64_t expected_floats);
  // Waits for every send of the step.
  absl::Status Finish();

  int64_t size_mismatches() const { return size_mismatches_; }
  int64_t messages() const { return messages_; }
  int64_t bytes_sent() const { return bytes_sent_; }
  double wait_s() const { return wait_s_; }  // blocked in receives and Finish
  void ResetStats() { wait_s_ = 0; }

 private:
  MPI_Comm comm_;
  int prev_, next_;
  std::vector<MPI_Request> requests_;
  std::vector<std::vector<float>> in_flight_;  // send buffers, kept until Finish
  int64_t size_mismatches_ = 0, messages_ = 0, bytes_sent_ = 0;
  double wait_s_ = 0;
};

// One micro-batch's compute on a stage in one step (docs/design.md §12): the wall time of
// its forward and its backward calls — p2p waits and the bubble excluded, its TP
// collectives included — and of those, the time in layer reduce-scatters, all-gathers and
// all-reduces.
struct MicrobatchTimes {
  double forward_s = 0;
  double backward_s = 0;
  double rs_wait_s = 0;
  double all_gather_s = 0;
  double all_reduce_s = 0;
};

// One optimizer step of stage `stage`: StageSchedule(layout, stage)'s forwards and
// backwards in order, micro-batch i in modes[i], activations held from a forward to its
// backward; gradients accumulate in `stack` (the caller zeroes and finishes them). The
// first stage's input and the last stage's loss gradient are the micro-batches' data.
// Collective over the TP group (the layers) and the pipeline (p2p in schedule order).
// `times` (empty, or one per micro-batch): each micro-batch's compute, measured.
absl::Status RunStageStep(TransformerStack& stack, StageLink& link, const PipelineLayout& layout,
                          int stage, std::span<const MicroBatch> microbatches,
                          std::span<const Mode> modes, std::span<MicrobatchTimes> times = {});

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_PIPELINE_H_
