// The device-memory helper on a real device: host round trips, size checks,
// zero-sized buffers, moves, and an impossible allocation surfacing as
// RESOURCE_EXHAUSTED with file:line of the cudaMalloc call (not an abort).
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;
using testing::GpuTest;

class DeviceMemoryGpuTest : public GpuTest {};

TEST_F(DeviceMemoryGpuTest, RoundTripsAndZeroes) {
  const std::vector<float> host = {1.5f, -2.0f, 3.25f};
  ASSERT_OK_AND_ASSIGN(auto buf, DeviceBuffer<float>::FromHost(host, stream_));
  EXPECT_EQ(buf.size(), 3u);
  EXPECT_EQ(buf.bytes(), 12u);
  ASSERT_OK_AND_ASSIGN(std::vector<float> back, buf.ToHost(stream_));
  EXPECT_EQ(back, host);
  ASSERT_OK(buf.SetZero(stream_));
  ASSERT_OK_AND_ASSIGN(back, buf.ToHost(stream_));
  EXPECT_THAT(back, ::testing::Each(0.0f));

  DeviceBuffer<float> moved = std::move(buf);
  EXPECT_EQ(moved.size(), 3u);
  EXPECT_EQ(buf.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(buf.data(), nullptr);
}

TEST_F(DeviceMemoryGpuTest, SizeMismatchIsInvalidArgument) {
  ASSERT_OK_AND_ASSIGN(auto buf, DeviceBuffer<int32_t>::Allocate(4));
  std::vector<int32_t> wrong(5);
  EXPECT_THAT(buf.CopyFromHost(wrong, stream_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("5 elements")));
}

TEST_F(DeviceMemoryGpuTest, ZeroSizedBufferNeedsNoDeviceMemory) {
  ASSERT_OK_AND_ASSIGN(auto buf, DeviceBuffer<float>::Allocate(0));
  EXPECT_EQ(buf.data(), nullptr);
  ASSERT_OK(buf.SetZero(stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> back, buf.ToHost(stream_));
  EXPECT_TRUE(back.empty());
}

TEST_F(DeviceMemoryGpuTest, ImpossibleAllocationIsResourceExhaustedWithLocation) {
  auto huge = DeviceAllocation::Allocate(size_t{1} << 52);  // 4 PiB
  EXPECT_THAT(huge.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                      ::testing::AllOf(HasSubstr("device_memory.cc:"),
                                                       HasSubstr("cudaMalloc"))));
  // The failure is not left behind in the runtime's last-error slot, which every
  // launcher reads after its launch (a later, healthy launch would report it).
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  // The error is not sticky: the device still works.
  ASSERT_OK_AND_ASSIGN(auto ok, DeviceBuffer<float>::Allocate(16));
  ASSERT_OK(ok.SetZero(stream_));
}

}  // namespace
}  // namespace spgate::kernels
