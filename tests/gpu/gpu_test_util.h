// Fixture and helpers for the GPU kernel tests: every test that needs a device
// derives from GpuTest, which GTEST_SKIPs with the CUDA runtime's reason when
// cudaGetDeviceCount finds none (ctest then reports the binary as skipped, see
// tests/gpu/CMakeLists.txt), and otherwise hands the test its own stream.
//
// Tolerances used across the GPU tests (also in docs/kernels.md):
//   fp32 statistics (mean, rstd, lse)  atol 1e-6..1e-5, rtol 1e-6..1e-5
//   fp32 outputs                        atol 1e-5..1e-4, rtol 1e-5..1e-4
//   bf16 outputs                        rtol 4e-3 (one bf16 rounding, 2^-8)
//   column sums (dgamma, dbeta, dbias)  atol 2e-5 * sqrt(rows)
#ifndef SPGATE_TESTS_GPU_GPU_TEST_UTIL_H_
#define SPGATE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "kernels/gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels::testing {

// One bf16 rounding: half an ulp of an 8-bit significand, plus slack.
inline constexpr double kBf16Rtol = 4e-3;

// Host data as a kernel of storage type T (float or Bfloat16) reads it, and
// back to float for the comparisons.
template <typename T>
std::vector<T> Store(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return ToBf16(v);
  }
}
template <typename T>
std::vector<float> Load(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return ToFloat(v);
  }
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (CudaDeviceCount(&reason) == 0) {
      GTEST_SKIP() << "no CUDA device (" << reason << ")";
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    auto blas = CublasHandle::Create(/*allow_tf32=*/false);
    ASSERT_TRUE(blas.ok()) << blas.status();
    blas_ = std::move(blas).value();
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }

  template <typename T>
  absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
    return DeviceBuffer<T>::FromHost(host, stream_);
  }
  template <typename T>
  absl::StatusOr<std::vector<T>> Download(const DeviceBuffer<T>& dev) {
    return dev.ToHost(stream_);
  }

  cudaStream_t stream_ = nullptr;
  CublasHandle blas_;
};

}  // namespace spgate::kernels::testing

#endif  // SPGATE_TESTS_GPU_GPU_TEST_UTIL_H_
