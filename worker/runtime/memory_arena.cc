// MemoryArena: live-byte accounting with a peak, in front of a size-class block cache.
#include "worker/runtime/memory_arena.h"

#include <bit>
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
    block_bytes_ = std::exchange(other.block_bytes_, 0);
    category_ = other.category_;
  }
  return *this;
}

void Buffer::Reset() {
  if (arena_ != nullptr) arena_->Release(*this);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  block_bytes_ = 0;
}

MemoryArena::~MemoryArena() {
  assert(live_.total == 0 && "a Buffer outlived its MemoryArena");
  ReleaseCache();
}

size_t MemoryArena::SizeClass(size_t bytes) {
  constexpr size_t kMinClass = 256;  // also keeps every block 256-byte aligned in size
  if (bytes <= kMinClass) return kMinClass;
  // Eight classes per power of two: round up to a multiple of 2^(floor(log2 bytes) - 3).
  const size_t step = std::bit_floor(bytes) >> 3;
  return (bytes + step - 1) / step * step;
}

absl::StatusOr<Buffer> MemoryArena::Allocate(int64_t count, MemoryCategory category) {
  Buffer buffer;
  if (count <= 0) return buffer;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  size_t block = options_.size_classes ? SizeClass(bytes) : bytes;
  void* ptr = nullptr;
  // Best fit: the smallest cached block of this class or one up to a quarter larger.
  auto it = cache_.lower_bound(block);
  const size_t largest = options_.size_classes ? block + block / 4 : block;
  if (it != cache_.end() && it->first <= largest) {
    ptr = it->second.back().ptr;
    it->second.pop_back();
    cached_bytes_ -= it->first;
    block = it->first;
    if (it->second.empty()) cache_.erase(it);
  } else {
    absl::StatusOr<void*> fresh = device_->Allocate(block);
    if (!fresh.ok() && cached_bytes_ > 0) {
      // Out of memory with blocks parked in the cache: give them back and retry once.
      ReleaseCache();
      fresh = device_->Allocate(block);
    }
    if (!fresh.ok()) return fresh.status();
    ptr = *fresh;
    device_allocated_bytes_ += block;
  }
  buffer.arena_ = this;
  buffer.data_ = static_cast<float*>(ptr);
  buffer.size_ = count;
  buffer.block_bytes_ = block;
  buffer.category_ = category;
  live_.total += bytes;
  live_.by_category[static_cast<int>(category)] += bytes;
  if (live_.total > peak_.total) peak_ = live_;
  return buffer;
}

void MemoryArena::Release(Buffer& buffer) {
  const size_t bytes = buffer.bytes();
  const size_t block = buffer.block_bytes_;
  live_.total -= bytes;
  live_.by_category[static_cast<int>(buffer.category_)] -= bytes;
  cache_[block].push_back({buffer.data_, epoch_});
  cached_bytes_ += block;
}

void MemoryArena::TrimCache() {
  for (auto it = cache_.begin(); it != cache_.end();) {
    std::vector<CachedBlock>& blocks = it->second;
    size_t kept = 0;
    for (const CachedBlock& b : blocks) {
      if (epoch_ - b.epoch < options_.trim_after_steps) {  // used lately
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

void MemoryArena::ReleaseCache() {
  for (auto& [block, blocks] : cache_) {
    for (const CachedBlock& b : blocks) device_->Free(b.ptr, block);
  }
  cache_.clear();
  cached_bytes_ = 0;
}

}  // namespace spgate::runtime
