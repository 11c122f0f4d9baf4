// PredictPeak: the peak bytes a rank's MemoryArena will hold while running one batch in
// a mode, computed from the batch's lengths and the model shape before the batch runs.
// The leader puts the SP and TP-only predictions in the batch plan, so the daemon's
// memory gate (docs/design.md §3) can refuse TP-only where it would not fit.
//
// The model replays TransformerStack's buffer schedule (what is allocated and freed, in
// order) on a counter, so it is exact by construction as long as the two agree; the test
// in tests/worker/runtime holds them to within 5%. In closed form, per layer, with
// T = tokens, t = tp, H = hidden, F = ffn_hidden, a = heads / t, and T' = T / t under SP
// (T' = T under TP-only), the floats kept for backward are
//   4 T' H + 4 T'  (LN inputs and outputs, statistics)  +  T (4 H/t + 2 F/t + a)
// so SP divides the first term by t; with the gather boundary the LN inputs and
// statistics are full-sequence again (2 T H + 2 T' H + 4 T). Workspaces add at most a
// few [T, H] buffers plus attention's heads * min(1024, L) * L floats.
//
// Usage:
//   MemoryPrediction p = PredictPeak({.shape = shape, .tp = 4, .mode = Mode::kSequenceParallel,
//                                     .norm_boundary = NormBoundary::kShard}, lengths);
//   plan.predicted_peak_bytes_sp = p.peak_bytes;
#ifndef SPGATE_WORKER_RUNTIME_MEMORY_MODEL_H_
#define SPGATE_WORKER_RUNTIME_MEMORY_MODEL_H_

#include <cstdint>
#include <span>

#include "policy/types.h"
#include "worker/runtime/device.h"
#include "worker/runtime/model.h"

namespace spgate::runtime {

struct MemoryModelInput {
  ModelShape shape;
  int tp = 1;
  Mode mode = Mode::kSequenceParallel;
  NormBoundary norm_boundary = NormBoundary::kShard;
  MemorySpace space = MemorySpace::kHost;
  int64_t attention_query_block = 1024;
  // StackOptions::recompute: the forward keeps only the input rows, and the backward runs
  // the layers' forward again first (activation_bytes is then those rows).
  bool recompute = false;
};

struct MemoryPrediction {
  uint64_t peak_bytes = 0;
  uint64_t resident_bytes = 0;        // parameters + gradients
  uint64_t activation_bytes = 0;      // kept for backward, all layers, at the end of forward
                                      // (recompute: the input rows kept instead)
};

// `lengths` as given to TransformerStack::ForwardBackward (each >= 1).
MemoryPrediction PredictPeak(const MemoryModelInput& input, std::span<const int64_t> lengths);

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_MEMORY_MODEL_H_
