// The memory arena (worker/runtime/memory_arena.h): live and peak bytes by category,
// size classes, block reuse and trimming.
#include <algorithm>
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/device.h"
#include "worker/runtime/memory_arena.h"

namespace spgate::runtime {
namespace {

TEST(MemoryArenaTest, RecordsLiveAndPeakBytesByCategoryAndReusesBlocks) {
  auto device = CreateCpuDevice();
  MemoryArena arena(device.get());
  {
    ASSERT_OK_AND_ASSIGN(Buffer p, arena.Allocate(100, MemoryCategory::kParameters));
    ASSERT_OK_AND_ASSIGN(Buffer a, arena.Allocate(50, MemoryCategory::kActivations));
    EXPECT_EQ(arena.live().total, 600u);  // bytes asked for, not the class slack
    {
      ASSERT_OK_AND_ASSIGN(Buffer w, arena.Allocate(25, MemoryCategory::kWorkspace));
      EXPECT_EQ(arena.peak_bytes(), 700u);
    }
    EXPECT_EQ(arena.live().total, 600u);
    EXPECT_EQ(arena.peak().by_category[static_cast<int>(MemoryCategory::kWorkspace)], 100u);
    arena.ResetPeak();
    EXPECT_EQ(arena.peak_bytes(), 600u);
    EXPECT_EQ(arena.cached_bytes(), 256u);  // 100 bytes come from the 256-byte class
    const uint64_t taken = arena.device_allocated_bytes();
    ASSERT_OK_AND_ASSIGN(Buffer again, arena.Allocate(25, MemoryCategory::kWorkspace));
    EXPECT_EQ(arena.cached_bytes(), 0u);  // the cached block came back
    EXPECT_EQ(arena.device_allocated_bytes(), taken);
    ASSERT_OK_AND_ASSIGN(Buffer none, arena.Allocate(0, MemoryCategory::kWorkspace));
    EXPECT_TRUE(none.empty());
  }
  EXPECT_EQ(arena.live().total, 0u);
  EXPECT_EQ(arena.cached_bytes(), 416u + 256 + 256);  // 400 bytes: the 416-byte class
  arena.TrimCache();  // the end of the step that released them
  for (uint64_t i = 0; i + 1 < ArenaOptions{}.trim_after_steps; ++i) arena.TrimCache();
  EXPECT_EQ(arena.cached_bytes(), 416u + 256 + 256);  // unused for trim_after_steps - 1 steps
  arena.TrimCache();  // unused for trim_after_steps steps: back to the device
  EXPECT_EQ(arena.cached_bytes(), 0u);
}

TEST(MemoryArenaTest, SizeClassesAreAtMostAnEighthLargerAndServeNearbySizes) {
  EXPECT_EQ(MemoryArena::SizeClass(1), 256u);
  EXPECT_EQ(MemoryArena::SizeClass(256), 256u);
  EXPECT_EQ(MemoryArena::SizeClass(257), 288u);
  EXPECT_EQ(MemoryArena::SizeClass(4096), 4096u);
  EXPECT_EQ(MemoryArena::SizeClass(4097), 4608u);
  for (size_t bytes = 1; bytes < (size_t{1} << 26); bytes = bytes * 3 / 2 + 7) {
    const size_t c = MemoryArena::SizeClass(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(static_cast<double>(c), std::max(256.0, 1.125 * static_cast<double>(bytes)));
    EXPECT_EQ(MemoryArena::SizeClass(c), c) << "a class is its own class";
  }
  // A batch a little shorter than the last one reuses its block: no device allocation.
  auto device = CreateCpuDevice();
  MemoryArena arena(device.get());
  { ASSERT_OK_AND_ASSIGN(Buffer x, arena.Allocate(1000 * 64, MemoryCategory::kActivations)); }
  arena.TrimCache();
  const uint64_t taken = arena.device_allocated_bytes();
  { ASSERT_OK_AND_ASSIGN(Buffer y, arena.Allocate(960 * 64, MemoryCategory::kActivations)); }
  EXPECT_EQ(arena.device_allocated_bytes(), taken);
  // The exact-size cache (the baseline) cannot: a new size is a new block.
  MemoryArena exact(device.get(), ArenaOptions::Exact());
  { ASSERT_OK_AND_ASSIGN(Buffer x, exact.Allocate(1000 * 64, MemoryCategory::kActivations)); }
  exact.TrimCache();
  const uint64_t exact_taken = exact.device_allocated_bytes();
  { ASSERT_OK_AND_ASSIGN(Buffer y, exact.Allocate(960 * 64, MemoryCategory::kActivations)); }
  EXPECT_EQ(exact.device_allocated_bytes(), exact_taken + 960 * 64 * sizeof(float));
}

}  // namespace
}  // namespace spgate::runtime
