// MemoryArena: live-byte accounting with a peak, in front of an exact-size block cache.
#include "worker/runtime/memory_arena.h"

#include <cassert>

namespace spgate::runtime {

std::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kWorkspace: return "workspace";
  }
  return "unknown";
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    category_ = other.category_;
  }
  return *this;
}

void Buffer::Reset() {
  if (arena_ != nullptr) arena_->Release(*this);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

MemoryArena::~MemoryArena() {
  assert(live_.total == 0 && "a Buffer outlived its MemoryArena");
  for (auto& [bytes, blocks] : cache_) {
    for (const CachedBlock& b : blocks) device_->Free(b.ptr, bytes);
  }
}

absl::StatusOr<Buffer> MemoryArena::Allocate(int64_t count, MemoryCategory category) {
  Buffer buffer;
  if (count <= 0) return buffer;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  void* ptr = nullptr;
  auto it = cache_.find(bytes);
  if (it != cache_.end() && !it->second.empty()) {
    ptr = it->second.back().ptr;
    it->second.pop_back();
    cached_bytes_ -= bytes;
  } else {
    absl::StatusOr<void*> fresh = device_->Allocate(bytes);
    if (!fresh.ok() && cached_bytes_ > 0) {
      // Out of memory with blocks parked in the cache: give them back and retry once.
      epoch_ += 2;
      TrimCache();
      fresh = device_->Allocate(bytes);
    }
    if (!fresh.ok()) return fresh.status();
    ptr = *fresh;
  }
  buffer.arena_ = this;
  buffer.data_ = static_cast<float*>(ptr);
  buffer.size_ = count;
  buffer.category_ = category;
  live_.total += bytes;
  live_.by_category[static_cast<int>(category)] += bytes;
  if (live_.total > peak_.total) peak_ = live_;
  return buffer;
}

void MemoryArena::Release(Buffer& buffer) {
  const size_t bytes = buffer.bytes();
  live_.total -= bytes;
  live_.by_category[static_cast<int>(buffer.category_)] -= bytes;
  cache_[bytes].push_back({buffer.data_, epoch_});
  cached_bytes_ += bytes;
}

void MemoryArena::TrimCache() {
  for (auto it = cache_.begin(); it != cache_.end();) {
    std::vector<CachedBlock>& blocks = it->second;
    size_t kept = 0;
    for (const CachedBlock& b : blocks) {
      if (b.epoch == epoch_) {  // released since the last trim
        blocks[kept++] = b;
      } else {
        device_->Free(b.ptr, it->first);
        cached_bytes_ -= it->first;
      }
    }
    blocks.resize(kept);
    it = blocks.empty() ? cache_.erase(it) : std::next(it);
  }
  ++epoch_;
}

}  // namespace spgate::runtime
