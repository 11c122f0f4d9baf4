// How the row kernels (LayerNorm forward/backward) map a row of `hidden`
// elements onto one thread block: each thread owns `items` packs of `vec`
// consecutive elements, at columns (item * threads + thread) * vec, and keeps
// them in registers for the whole row, so a row is read from memory once.
// Host-only; shared by the launchers and by tests of the plan itself.
#ifndef SPGATE_KERNELS_INTERNAL_ROW_PLAN_H_
#define SPGATE_KERNELS_INTERNAL_ROW_PLAN_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace spgate::kernels::internal {

// At most this many elements per thread live in registers (backward keeps four
// float arrays of that length).
inline constexpr int kRowMaxElementsPerThread = 32;
// The forward kernel keeps blocks to kRowFwdMaxThreads while that takes at most
// kRowCappedMaxElementsPerThread elements per thread. Measured on an H200
// (docs/benchmarks.md): a bf16 row of 8192 ran at 0.54x a copy's bandwidth as one
// 1024-thread block of 8 elements per thread and at 0.83x as 512 threads of 16.
// The kernels are built for 1024-thread blocks (64 registers a thread), and
// ptxas -v (sm_90) reports the forward kernel spilling beyond 16 (68 bytes for
// bf16 packs at 32, about 1 KB on the scalar path at 32), so wider rows keep
// the uncapped plan. The backward kernel holds four values per element and
// spills already at 16 (280-392 bytes); the same cap took it from 0.67x to 0.53x:
// it stays uncapped.
inline constexpr int kRowFwdMaxThreads = 512;
inline constexpr int kRowCappedMaxElementsPerThread = 16;
inline constexpr int kRowMaxThreads = 1024;

struct RowPlan {
  int vec = 1;      // elements per pack (1, or 16 bytes' worth)
  int items = 1;    // packs per thread, a power of two
  int threads = 32; // multiple of 32, <= 1024
};

// `max_threads` (a multiple of 32, at most kRowMaxThreads) is where blocks stop
// growing while items * vec stays within kRowCappedMaxElementsPerThread; a row
// wider than that is planned as if max_threads were kRowMaxThreads. The final
// thread count is what the chosen items need (a multiple of 32).
inline absl::StatusOr<RowPlan> PlanRow(int64_t hidden, int vec,
                                       int max_threads = kRowMaxThreads) {
  auto round32 = [](int64_t v) { return (v + 31) / 32 * 32; };
  const int64_t packs = (hidden + vec - 1) / vec;
  // Aim for ~8 elements per thread: enough bytes in flight, few registers; wide
  // rows take more per thread rather than blocks over max_threads.
  auto items_for = [&](int64_t threads) {
    const int64_t need = (packs + threads - 1) / threads;
    int64_t items = 1;
    while (items < need) items *= 2;
    return items;
  };
  int64_t threads =
      std::clamp<int64_t>(round32((hidden + 7) / 8), 32, max_threads);
  int64_t items = items_for(threads);
  if (max_threads < kRowMaxThreads && items * vec > kRowCappedMaxElementsPerThread) {
    threads = std::clamp<int64_t>(round32((hidden + 7) / 8), 32, kRowMaxThreads);
    items = items_for(threads);
  }
  if (items * vec > kRowMaxElementsPerThread) {
    return absl::UnimplementedError(
        absl::StrCat("hidden = ", hidden, " exceeds the GPU row kernels' limit of ",
                     kRowMaxThreads * kRowMaxElementsPerThread));
  }
  threads = std::clamp<int64_t>(round32((packs + items - 1) / items), 32, kRowMaxThreads);
  RowPlan plan;
  plan.vec = vec;
  plan.items = static_cast<int>(items);
  plan.threads = static_cast<int>(threads);
  return plan;
}

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_ROW_PLAN_H_
