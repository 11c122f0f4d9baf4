// CUDA bias + GeLU (tanh form), fp32 or bf16 storage, fp32 arithmetic (tanhf,
// not the approximate instruction, so fp32 results match the reference to a few
// ulp). Forward is a grid-stride elementwise kernel over 16-byte packs when the
// row length and pointers allow, else single elements. Backward launches a 2-D
// grid: x over columns (one column per thread, so a warp reads a contiguous
// 32-element run of a row), y over fixed row chunks; each thread writes dpre
// for its column's rows in the chunk and one dbias partial, and the ordered
// second stage (FinalizeColumnPartials) adds the chunks: deterministic dbias.
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gelu.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cuda_common.cuh"
#include "kernels/internal/launch_plan.h"

namespace spgate::kernels {
namespace {

using internal::DevT;

constexpr float kSqrt2OverPi = static_cast<float>(kGeluSqrt2OverPi);
constexpr float kCubic = static_cast<float>(kGeluCubic);

__device__ __forceinline__ float GeluTanh(float u) {
  return 0.5f * u * (1.0f + tanhf(kSqrt2OverPi * (u + kCubic * u * u * u)));
}

__device__ __forceinline__ float GeluTanhGrad(float u) {
  const float t = tanhf(kSqrt2OverPi * (u + kCubic * u * u * u));
  const float da = kSqrt2OverPi * (1.0f + 3.0f * kCubic * u * u);
  return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * da;
}

// Packs of kVec elements never straddle rows (cols % kVec == 0 when kVec > 1).
template <typename T, int kVec>
__global__ void GeluFwdKernel(GeluFwdArgs<T> a) {
  using D = DevT<T>;
  const D* pre = reinterpret_cast<const D*>(a.pre);
  D* y = reinterpret_cast<D*>(a.y);
  const int64_t packs = a.rows * a.cols / kVec;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = p * kVec;
    const int64_t col = e % a.cols;
    float v[kVec];
    internal::LoadWiden<D, kVec>(pre + e, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float u = v[i] + (a.bias != nullptr ? a.bias[col + i] : 0.0f);
      v[i] = GeluTanh(u);
    }
    internal::NarrowStore<D, kVec>(y + e, v);
  }
}

// grid.x: column tiles of blockDim.x; grid.y: row chunks of `chunk_rows`.
// partial: [gridDim.y][cols] when dbias is requested.
template <typename T>
__global__ void GeluBwdKernel(GeluBwdArgs<T> a, int64_t chunk_rows, float* partial) {
  using D = DevT<T>;
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= a.cols) return;
  const D* dy = reinterpret_cast<const D*>(a.dy);
  const D* pre = reinterpret_cast<const D*>(a.pre);
  D* dpre = reinterpret_cast<D*>(a.dpre);
  const float b = a.bias != nullptr ? a.bias[col] : 0.0f;
  const int64_t r0 = blockIdx.y * chunk_rows;
  const int64_t r1 = min(a.rows, r0 + chunk_rows);
  float acc = 0.0f;
  // kRows rows' loads are issued before any store. dpre may alias dy (in place
  // is allowed, gelu.h), so the pointers cannot be __restrict__ and a plain loop
  // waits out each row's loads in turn (0.55x a copy's bandwidth on an H200,
  // 0.74x this way). Same index per element, so in place stays exact; dbias
  // still adds the rows in order.
  constexpr int kRows = 4;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    float d[kRows], u[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t i = (r + k) * a.cols + col;
      d[k] = internal::Widen(dy[i]);
      u[k] = internal::Widen(pre[i]);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const D stored = internal::Narrow<D>(d[k] * GeluTanhGrad(u[k] + b));
      dpre[(r + k) * a.cols + col] = stored;
      // dbias sums what was stored, so it equals the column sum of dpre exactly
      // as the next layer sees it.
      acc += internal::Widen(stored);
    }
  }
  for (; r < r1; ++r) {
    const int64_t i = r * a.cols + col;
    const D stored = internal::Narrow<D>(internal::Widen(dy[i]) *
                                         GeluTanhGrad(internal::Widen(pre[i]) + b));
    dpre[i] = stored;
    acc += internal::Widen(stored);
  }
  if (partial != nullptr) partial[blockIdx.y * a.cols + col] = acc;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
absl::Status GeluFwdImpl(const GeluFwdArgs<T>& a, cudaStream_t stream) {
  constexpr char kOp[] = "GeluFwd";
  RETURN_IF_ERROR(ValidateGeluFwdArgs(kOp, a));
  if (a.rows == 0) return absl::OkStatus();
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = a.cols % kWide == 0 && Aligned16(a.pre) && Aligned16(a.y) &&
                    (a.bias == nullptr || Aligned16(a.bias));
  constexpr int kThreads = 256;
  const int64_t packs = a.rows * a.cols / (wide ? kWide : 1);
  const int grid = static_cast<int>(std::min<int64_t>((packs + kThreads - 1) / kThreads, 65536));
  if (wide) {
    GeluFwdKernel<T, kWide><<<grid, kThreads, 0, stream>>>(a);
  } else {
    GeluFwdKernel<T, 1><<<grid, kThreads, 0, stream>>>(a);
  }
  SPGATE_CUDA_CHECK_LAUNCH(GeluFwdKernel);
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBwdImpl(const GeluBwdArgs<T>& a, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  constexpr char kOp[] = "GeluBwd";
  RETURN_IF_ERROR(ValidateGeluBwdArgs(kOp, a));
  RETURN_IF_ERROR(internal::CheckFitsInt32(kOp, "cols", a.cols));
  float* partial = nullptr;
  if (a.dbias != nullptr) {
    const size_t need = GeluBwdWorkspaceBytes(a.rows, a.cols);
    if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
      return internal::Invalid(kOp, absl::StrCat("workspace has ", workspace_bytes,
                                                 " bytes, GeluBwdWorkspaceBytes = ", need));
    }
    partial = static_cast<float*>(workspace);
  }
  const int64_t chunks = internal::ColumnReduceChunks(a.rows);
  if (a.rows > 0) {
    constexpr int kThreads = 256;
    const int64_t chunk_rows = internal::ColumnChunkRows(a.rows);
    const dim3 grid(internal::CeilDiv(a.cols, kThreads), static_cast<unsigned>(chunks));
    GeluBwdKernel<T><<<grid, kThreads, 0, stream>>>(a, chunk_rows, partial);
    SPGATE_CUDA_CHECK_LAUNCH(GeluBwdKernel);
  }
  if (a.dbias == nullptr) return absl::OkStatus();
  return internal::FinalizeColumnPartials(partial, static_cast<int>(chunks),
                                          static_cast<int>(a.cols), 1, a.dbias, nullptr,
                                          a.accumulate_bias_grad, stream);
}

}  // namespace

absl::Status GeluFwd(const GeluFwdArgs<float>& args, cudaStream_t stream) {
  return GeluFwdImpl(args, stream);
}
absl::Status GeluFwd(const GeluFwdArgs<Bfloat16>& args, cudaStream_t stream) {
  return GeluFwdImpl(args, stream);
}
absl::Status GeluBwd(const GeluBwdArgs<float>& args, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  return GeluBwdImpl(args, workspace, workspace_bytes, stream);
}
absl::Status GeluBwd(const GeluBwdArgs<Bfloat16>& args, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  return GeluBwdImpl(args, workspace, workspace_bytes, stream);
}

}  // namespace spgate::kernels
