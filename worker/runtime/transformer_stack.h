// TransformerStack: L pre-LN GPT blocks (model.h) on one TP rank, forward and backward
// with activations kept for backward, in either mode for the same weights:
//   TP-only: every rank holds the full sequence; an all-reduce follows each row-parallel
//     GEMM in forward and each column-parallel GEMM's input gradient in backward.
//   SP: the residual stream, LayerNorm and biases work on this rank's block of
//     padded_tokens / t rows; an all-gather enters each column-parallel GEMM and a
//     reduce-scatter leaves each row-parallel one (their conjugates in backward), and
//     LayerNorm outputs are kept as shards and re-gathered in backward (Megatron's
//     choice: activation memory of the non-GEMM parts drops by t).
// With NormBoundary::kGather, SP runs LayerNorm the legacy way - all-gather its input,
// normalise the full sequence, keep this rank's rows - so the extra collectives
// (CollectivePurpose::kNormBoundary) measure the norm stall.
//
// Gradients accumulate across ForwardBackward calls until FinishGradients
// (docs/design.md §4): sharded parameters get full-sequence gradients in both modes;
// replicated parameters (LN gamma/beta, row-parallel output biases) get this rank's
// partial sum under SP and the full gradient times 1/t under TP-only (and under the gather
// boundary, for LN), so the one SUM all-reduce in FinishGradients is right for any mix of
// modes in a window.
//
// Usage:
//   ASSIGN_OR_RETURN(auto stack, TransformerStack::Create(opts, &arena, tp_comm.get()));
//   RETURN_IF_ERROR(stack->ZeroGrads());
//   RETURN_IF_ERROR(stack->ForwardBackward({.lengths = lengths, .data_seed = 7},
//                                          Mode::kSequenceParallel));
//   RETURN_IF_ERROR(stack->FinishGradients(dp_comm.get()));
#ifndef SPGATE_WORKER_RUNTIME_TRANSFORMER_STACK_H_
#define SPGATE_WORKER_RUNTIME_TRANSFORMER_STACK_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policy/types.h"
#include "worker/runtime/communicator.h"
#include "worker/runtime/memory_arena.h"
#include "worker/runtime/model.h"

namespace spgate::runtime {

// How a batch is laid out on one rank. Sequences are packed back to back; under SP the
// batch is padded to a multiple of t with one extra "sequence" of padding tokens (which
// attends only to itself and receives zero gradient, so it changes no real token).
struct BatchGeometry {
  int64_t tokens = 0;         // real tokens
  int64_t padded_tokens = 0;  // SP: tokens rounded up to a multiple of t; TP-only: tokens
  int64_t rows_local = 0;     // rows of the residual stream on this rank
  int64_t row_offset = 0;     // first of them, in the padded batch
  std::vector<int64_t> cu_seqlens;  // over padded_tokens, padding segment included
  int64_t padding_tokens() const { return padded_tokens - tokens; }
};
BatchGeometry MakeBatchGeometry(std::span<const int64_t> lengths, Mode mode, int tp,
                                int tp_rank);

struct StackOptions {
  ModelShape shape;
  int tp = 1;
  int tp_rank = 0;
  NormBoundary norm_boundary = NormBoundary::kShard;
  uint64_t param_seed = 1;
  int64_t attention_query_block = 1024;  // kernels::AttentionShape::query_block
  // A pipeline stage's share of a deeper model: shape.layers are the model's layers
  // layer_offset .. layer_offset + shape.layers - 1 (their parameters are those layers').
  int layer_offset = 0;
  // The stage boundary's format: false, the sequence-sharded rows in both modes (the
  // contract, docs/design.md §12); true, each mode's native layout (TP-only: every rank
  // the whole sequence), which only works when both sides of a boundary run the same
  // mode — kept to measure what the contract costs (bench/worker/pipeline_boundary.py).
  bool native_stage_boundary = false;
  // Activation recompute (full, per stage): Forward keeps only the micro-batch's input
  // rows and drops its layers' activations; Backward runs the layers' forward again from
  // those rows, then the backward. The same numbers, at the cost of a second forward; a
  // pipeline stage then holds only its in-flight micro-batches' inputs.
  bool recompute = false;
};

// Pipeline stages (docs/design.md §12): the activation (and its gradient) a stage hands
// the next is this rank's rows of the micro-batch padded to a multiple of t — SP's own
// layout — in both modes: BoundaryRows(lengths, t) rows of hidden floats, from row
// tp_rank * BoundaryRows. So no p2p size depends on a mode. A TP-only stage all-gathers
// its input at entry and keeps its own rows at exit (and the mirror in backward).
int64_t BoundaryRows(std::span<const int64_t> lengths, int tp);
// The floats of one boundary message for a micro-batch run in `mode`: BoundaryRows x
// hidden, or with the native format under TP-only the whole sequence's tokens x hidden.
int64_t BoundaryFloats(const StackOptions& options, std::span<const int64_t> lengths, Mode mode);

// A batch's data in host memory, [tokens, hidden] each: the stack input and the loss's
// gradient with respect to the output (InputValue / OutputGradValue). The worker makes
// it before a step's clock starts, as a data loader would, so both modes time the same
// work whatever share of the rows they use.
struct BatchData {
  std::vector<float> input;
  std::vector<float> output_grad;
};
BatchData MakeBatchData(std::span<const int64_t> lengths, uint64_t data_seed, int64_t hidden);

struct MicroBatch {
  std::span<const int64_t> lengths;  // tokens per sequence, each >= 1
  uint64_t data_seed = 0;            // InputValue / OutputGradValue seed
  // Optional: MakeBatchData(lengths, data_seed, hidden); when null, this rank's rows are
  // generated inside ForwardBackward.
  const BatchData* data = nullptr;
};

// Optional results of one ForwardBackward, in host memory, for this rank's rows.
struct StackCapture {
  BatchGeometry geometry;
  std::vector<float> output;      // [rows_local, hidden]
  std::vector<float> input_grad;  // [rows_local, hidden]
};

class TransformerStack {
 public:
  // Allocates and initialises this rank's parameters and gradients in `arena`.
  // `tp_comm` must have options.tp ranks with this rank at options.tp_rank.
  static absl::StatusOr<std::unique_ptr<TransformerStack>> Create(const StackOptions& options,
                                                                  MemoryArena* arena,
                                                                  Communicator* tp_comm);

  absl::Status ZeroGrads();
  // One micro-batch forward and backward in `mode`; gradients accumulate. Every rank of
  // the TP group must call it with the same batch and mode.
  absl::Status ForwardBackward(const MicroBatch& batch, Mode mode,
                               StackCapture* capture = nullptr);
  // The same split in two, for pipeline schedules that keep several micro-batches in
  // flight. Forward's input is the batch's data on the first stage (`input` empty), else
  // the previous stage's boundary rows; its output goes to `output` (boundary rows; null:
  // the last stage). Backward takes the next stage's boundary gradient (`output_grad`
  // empty: the last stage, which uses the batch's data) and writes the boundary gradient
  // of its input to `input_grad` (null: the first stage). The handle holds the
  // micro-batch's activations until its Backward; its lengths are copied.
  class InFlight {
   public:
    InFlight();
    ~InFlight();

   private:
    friend class TransformerStack;
    struct State;
    std::unique_ptr<State> state_;
  };
  absl::StatusOr<std::unique_ptr<InFlight>> Forward(const MicroBatch& batch, Mode mode,
                                                    std::span<const float> input,
                                                    std::vector<float>* output,
                                                    StackCapture* capture = nullptr);
  absl::Status Backward(InFlight& in_flight, std::span<const float> output_grad,
                        std::vector<float>* input_grad, StackCapture* capture = nullptr);

  // Ends an accumulation window: SUM all-reduce of the replicated gradients over the TP
  // group, then the mean of all gradients over `dp_comm` (may be null or of size 1).
  absl::Status FinishGradients(Communicator* dp_comm);

  absl::StatusOr<std::vector<float>> DownloadGrads() const;
  absl::StatusOr<std::vector<float>> DownloadParams() const;

  const ParamLayout& layout() const { return layout_; }
  const StackOptions& options() const { return options_; }
  // The TP group's collective times so far (what the layers spent in each collective).
  const CollectiveStats& tp_stats() const { return tp_comm_->stats(); }
  void set_norm_boundary(NormBoundary b) { options_.norm_boundary = b; }
  // Bytes of parameters plus gradients (the part of the peak every step starts with).
  uint64_t resident_bytes() const { return params_.bytes() + grads_.bytes(); }

 private:
  struct Activations;
  struct Step;
  TransformerStack(const StackOptions& options, MemoryArena* arena, Communicator* tp_comm);
  absl::Status InitParams();
  absl::Status LayerForward(Step& st, int layer, Buffer& z, const float* residual,
                            Activations& act);
  absl::Status LayerBackward(Step& st, int layer, Buffer& g, Activations& act);
  // LayerBackward's two halves: `g` (the gradient of z and s2) to `ds2`, then `ds2` to
  // `ds1` (the gradient of s1); each frees its input and its half's activations.
  absl::Status MlpBackward(Step& st, int layer, Buffer& g, Activations& act, Buffer& ds2);
  absl::Status AttentionBackward(Step& st, int layer, Buffer& ds2, Activations& act,
                                 Buffer& ds1);
  // Every layer's forward over `z` (the stage's input rows, consumed); returns the last
  // layer's residual (its s2 rows) and leaves `z` the last block's output partial.
  absl::StatusOr<const float*> LayersForward(Step& st, Buffer& z, std::vector<Activations>& acts);
  absl::Status LayerNormForward(Step& st, const float* gamma, const float* beta, Buffer& x,
                                const float* residual, Buffer& s, Buffer& mean, Buffer& rstd,
                                Buffer& y);
  absl::Status LayerNormBackward(Step& st, const float* gamma, float* dgamma, float* dbeta,
                                 const Buffer& dy, const Buffer& s, const Buffer& mean,
                                 const Buffer& rstd, const float* dresidual, Buffer& dx);
  absl::Status ColumnSum(Step& st, const float* x, int64_t rows, float alpha, float* acc);
  // A stage boundary's rows to the stack's rows (`in`: boundary rows; TP-only gathers
  // them and keeps the real tokens) and back (own rows of the full output).
  absl::StatusOr<Buffer> FromBoundary(Step& st, std::span<const float> in, int64_t boundary_rows);
  absl::Status ToBoundary(const Step& st, const float* rows, int64_t boundary_rows,
                          std::vector<float>* out);
  // Allocates the full-sequence buffer and all-gathers `shard` into it (SP only).
  absl::StatusOr<Buffer> Gather(Step& st, const float* shard, int64_t cols,
                                CollectivePurpose purpose);
  // Row-parallel output: TP-only all-reduces `partial` in place and returns it; SP
  // reduce-scatters it into a new shard buffer and frees it.
  absl::StatusOr<Buffer> ReduceOut(Step& st, Buffer partial, int64_t cols);

  StackOptions options_;
  ParamLayout layout_;
  MemoryArena* arena_;
  Device* device_;
  Communicator* tp_comm_;
  Buffer params_;
  Buffer grads_;
};

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_TRANSFORMER_STACK_H_
