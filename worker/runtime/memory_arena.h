// MemoryArena: every tensor the worker runtime holds comes from here, so the arena's
// byte count is the runtime's memory: parameters and their gradients, activations kept
// for backward, and transient workspaces (docs/design.md §2 peak_memory). It records the
// peak of live bytes since the last ResetPeak, overall and by category at that moment.
//
// Freed blocks are cached by size class and reused. Batches differ in length, so the
// same tensor has a slightly different size every step: classes (eight per doubling, at
// most 12.5 % slack) and a best fit up to a quarter above the class let one step's
// blocks serve the next. Cached bytes are not live and
// are not counted, as with a framework's caching allocator's "allocated" (not
// "reserved") figure; live bytes are the bytes asked for, without the class slack, so
// they stay comparable with the memory model's prediction. A cached block unused for
// ArenaOptions::trim_after_steps steps goes back to the device, and all of them do when
// the device is out of memory. Keeping a mode's blocks across a run of the other mode's steps is what
// makes a switch back cheap (docs/benchmarks.md, "What a mode switch costs").
//
// Not thread-safe: one arena per rank, used by the training thread.
//
// Usage:
//   MemoryArena arena(device);
//   ASSIGN_OR_RETURN(Buffer x, arena.Allocate(rows * hidden, MemoryCategory::kActivations));
//   ... x.data() ...                       // freed when x goes out of scope
//   arena.ResetPeak();  ... step ...  uint64_t peak = arena.peak_bytes();
//   arena.TrimCache();                     // once per step
#ifndef SPGATE_WORKER_RUNTIME_MEMORY_ARENA_H_
#define SPGATE_WORKER_RUNTIME_MEMORY_ARENA_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/runtime/device.h"

namespace spgate::runtime {

enum class MemoryCategory : uint8_t { kParameters, kGradients, kActivations, kWorkspace };
inline constexpr int kNumMemoryCategories = 4;
std::string_view MemoryCategoryName(MemoryCategory category);

class MemoryArena;

// A block of floats owned by an arena; move-only, returned to the arena on destruction.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(float); }
  bool empty() const { return size_ == 0; }
  void Reset();  // returns the block to the arena now

 private:
  friend class MemoryArena;
  MemoryArena* arena_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
  size_t block_bytes_ = 0;  // the cached block's size (>= bytes())
  MemoryCategory category_ = MemoryCategory::kWorkspace;
};

struct MemorySnapshot {
  uint64_t total = 0;
  std::array<uint64_t, kNumMemoryCategories> by_category{};
};

// How freed blocks are cached.
struct ArenaOptions {
  // true: size classes with a best fit; false: only a block of the exact size is reused.
  bool size_classes = true;
  // Steps a cached block may stay unused before TrimCache returns it to the device.
  uint64_t trim_after_steps = 64;
  // The cache before size classes: exact sizes, trimmed after one unused step. Kept as
  // the baseline of bench/switch_cost.sh.
  static ArenaOptions Exact() { return {.size_classes = false, .trim_after_steps = 1}; }
};

class MemoryArena {
 public:
  explicit MemoryArena(Device* device, ArenaOptions options = {})
      : device_(device), options_(options) {}
  ~MemoryArena();  // every Buffer must have been released
  MemoryArena(const MemoryArena&) = delete;
  MemoryArena& operator=(const MemoryArena&) = delete;

  // `count` floats (0 gives an empty buffer). RESOURCE_EXHAUSTED when the device is out
  // of memory.
  absl::StatusOr<Buffer> Allocate(int64_t count, MemoryCategory category);

  Device* device() const { return device_; }
  const MemorySnapshot& live() const { return live_; }
  // The largest live total since the last ResetPeak, with its breakdown.
  const MemorySnapshot& peak() const { return peak_; }
  uint64_t peak_bytes() const { return peak_.total; }
  void ResetPeak() { peak_ = live_; }

  // Ends a step: returns to the device the cached blocks that no step used in the last
  // options.trim_after_steps calls.
  void TrimCache();
  // Returns every cached block to the device now.
  void ReleaseCache();
  // The size class a request of `bytes` is served from (>= bytes, at most 12.5 % more,
  // 256 at least).
  static size_t SizeClass(size_t bytes);
  uint64_t cached_bytes() const { return cached_bytes_; }
  // Bytes taken from the device (cache misses) since construction: a step that reuses
  // the cache adds nothing; one whose shapes are new to the cache adds their size.
  uint64_t device_allocated_bytes() const { return device_allocated_bytes_; }

 private:
  friend class Buffer;
  void Release(Buffer& buffer);

  struct CachedBlock {
    void* ptr;
    uint64_t epoch;  // the step it was last released in
  };
  Device* device_;
  ArenaOptions options_;
  MemorySnapshot live_;
  MemorySnapshot peak_;
  std::map<size_t, std::vector<CachedBlock>> cache_;  // by size class
  uint64_t cached_bytes_ = 0;
  uint64_t device_allocated_bytes_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_MEMORY_ARENA_H_
