// CpuDevice: the kernels' CPU paths on host memory, single-threaded apart from
// OpenBLAS (whose thread count is set once per process). Memory is 64-byte aligned so
// the vectorised row loops see aligned rows when hidden is a multiple of 16.
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "worker/runtime/device.h"

namespace spgate::runtime {
namespace {

class CpuDevice final : public Device {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "cpu"; }
  absl::StatusOr<uint64_t> TotalMemoryBytes() const override {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) {
      return absl::UnavailableError("cannot read the host's physical memory size (sysconf)");
    }
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError("cpu: out of host memory allocating " +
                                          std::to_string(bytes) + " bytes");
    }
    return p;
  }
  void Free(void* ptr, size_t) override { std::free(ptr); }

  absl::Status Upload(float* dst, const float* src, int64_t n) override {
    return Copy(dst, src, n);
  }
  absl::Status Download(float* dst, const float* src, int64_t n) override {
    return Copy(dst, src, n);
  }
  absl::Status Copy(float* dst, const float* src, int64_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Fill(float* dst, float value, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] = value;
    return absl::OkStatus();
  }
  absl::Status Axpy(float alpha, const float* x, float* y, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
    return absl::OkStatus();
  }
  absl::Status Scale(float alpha, float* x, int64_t n) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status LayerNormFwd(const kernels::LayerNormFwdArgs<float>& a) override {
    return kernels::LayerNormFwdCpu(a);
  }
  absl::Status LayerNormBwd(const kernels::LayerNormBwdArgs<float>& a, void*, size_t) override {
    return kernels::LayerNormBwdCpu(a);
  }
  absl::Status GeluFwd(const kernels::GeluFwdArgs<float>& a) override {
    return kernels::GeluFwdCpu(a);
  }
  absl::Status GeluBwd(const kernels::GeluBwdArgs<float>& a, void*, size_t) override {
    return kernels::GeluBwdCpu(a);
  }
  absl::Status Gemm(const kernels::GemmArgs& a) override { return kernels::GemmCpu(a); }
  absl::Status LinearFwd(const kernels::LinearFwdArgs& a) override {
    return kernels::LinearFwdCpu(a);
  }
  absl::Status LinearBwdData(const kernels::LinearBwdDataArgs& a) override {
    return kernels::LinearBwdDataCpu(a);
  }
  absl::Status LinearBwdWeight(const kernels::LinearBwdWeightArgs& a, void*, size_t) override {
    return kernels::LinearBwdWeightCpu(a);
  }
  absl::Status BiasAdd(const kernels::BiasAddArgs& a) override {
    return kernels::BiasAddCpu(a);
  }
  absl::Status AttentionFwd(const kernels::AttentionFwdArgs& a) override {
    return kernels::AttentionFwdCpu(a);
  }
  absl::Status AttentionBwd(const kernels::AttentionBwdArgs& a) override {
    return kernels::AttentionBwdCpu(a);
  }
};

}  // namespace

size_t LayerNormBwdScratchBytes(MemorySpace space, int64_t rows, int64_t hidden) {
  return space == MemorySpace::kHost ? 0 : kernels::LayerNormBwdWorkspaceBytes(rows, hidden);
}
size_t GeluBwdScratchBytes(MemorySpace space, int64_t rows, int64_t cols) {
  return space == MemorySpace::kHost ? 0 : kernels::GeluBwdWorkspaceBytes(rows, cols);
}
size_t LinearBwdWeightScratchBytes(MemorySpace space, const kernels::LinearShape& shape) {
  return space == MemorySpace::kHost ? 0 : kernels::LinearBwdWeightWorkspaceBytes(shape);
}

std::unique_ptr<Device> CreateCpuDevice(int blas_threads) {
  kernels::SetCpuBlasThreads(blas_threads);
  return std::make_unique<CpuDevice>();
}

}  // namespace spgate::runtime
