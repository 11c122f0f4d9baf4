// MemoryArena: every tensor the worker runtime holds comes from here, so the arena's
// byte count is the runtime's memory: parameters and their gradients, activations kept
// for backward, and transient workspaces (docs/design.md §2 peak_memory). It records the
// peak of live bytes since the last ResetPeak, overall and by category at that moment.
// Freed blocks are cached by exact size and reused (the same shapes recur every step);
// cached bytes are not live and are not counted, as with a framework's caching allocator's
// "allocated" (not "reserved") figure.
//
// Not thread-safe: one arena per rank, used by the training thread.
//
// Usage:
//   MemoryArena arena(device);
//   ASSIGN_OR_RETURN(Buffer x, arena.Allocate(rows * hidden, MemoryCategory::kActivations));
//   ... x.data() ...                       // freed when x goes out of scope
//   arena.ResetPeak();  ... step ...  uint64_t peak = arena.peak_bytes();
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
  MemoryCategory category_ = MemoryCategory::kWorkspace;
};

struct MemorySnapshot {
  uint64_t total = 0;
  std::array<uint64_t, kNumMemoryCategories> by_category{};
};

class MemoryArena {
 public:
  explicit MemoryArena(Device* device) : device_(device) {}
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

  // Returns cached blocks that were not reused since the previous call to the device
  // (call once per step: a shape that did not recur in a whole step is released).
  void TrimCache();
  uint64_t cached_bytes() const { return cached_bytes_; }

 private:
  friend class Buffer;
  void Release(Buffer& buffer);

  struct CachedBlock {
    void* ptr;
    uint64_t epoch;
  };
  Device* device_;
  MemorySnapshot live_;
  MemorySnapshot peak_;
  std::map<size_t, std::vector<CachedBlock>> cache_;  // by exact byte size
  uint64_t cached_bytes_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_MEMORY_ARENA_H_
