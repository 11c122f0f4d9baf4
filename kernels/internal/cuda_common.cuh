// Device-side building blocks shared by the .cu files: storage-type mapping
// (the public Bfloat16 is __nv_bfloat16 on the device), vectorised loads that
// widen to float, warp/block sums, the ordered column-partial reduction, and the
// kernel-launch error check (the cuBLAS one is kernels/cublas_status.h). The
// invariant that matters: all arithmetic is fp32 whatever the storage type, and
// every reduction adds in an order fixed by the launch plan, so results are
// identical run to run.
#ifndef SPGATE_KERNELS_INTERNAL_CUDA_COMMON_CUH_
#define SPGATE_KERNELS_INTERNAL_CUDA_COMMON_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "kernels/cublas_status.h"  // SPGATE_CUBLAS_RETURN_IF_ERROR
#include "kernels/device_memory.h"

namespace spgate::kernels::internal {

// After a <<<...>>> launch: configuration errors surface here, at the launcher.
#define SPGATE_CUDA_CHECK_LAUNCH(kernel_name) \
  SPGATE_CUDA_RETURN_IF_ERROR(cudaGetLastError())

template <typename T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<Bfloat16> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(__nv_bfloat16) == sizeof(Bfloat16));

template <typename T>
using DevT = typename DeviceType<T>::type;

template <typename T>
const DevT<T>* Dev(const T* p) {
  return reinterpret_cast<const DevT<T>*>(p);
}
template <typename T>
DevT<T>* Dev(T* p) {
  return reinterpret_cast<DevT<T>*>(p);
}

__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T Narrow(float v);
template <>
__device__ __forceinline__ float Narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// kVec consecutive elements moved as one aligned access (16 bytes for kVec =
// 16 / sizeof(T)); kVec = 1 is the unaligned fallback.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ void LoadWiden(const T* p, float (&out)[kVec]) {
  const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = Widen(pk.v[i]);
}

template <typename T, int kVec>
__device__ __forceinline__ void NarrowStore(T* p, const float (&in)[kVec]) {
  Pack<T, kVec> pk;
#pragma unroll
  for (int i = 0; i < kVec; ++i) pk.v[i] = Narrow<T>(in[i]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = pk;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum of two values over the whole block (blockDim.x a multiple of 32, at most
// 1024), broadcast to every thread. `scratch` holds 2 * 32 floats; the trailing
// barrier makes back-to-back calls with the same scratch safe.
__device__ __forceinline__ void BlockSum2(float& a, float& b, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  a = WarpSum(a);
  b = WarpSum(b);
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  float ta = lane < warps ? scratch[lane] : 0.0f;
  float tb = lane < warps ? scratch[32 + lane] : 0.0f;
  a = WarpSum(ta);
  b = WarpSum(tb);
  __syncthreads();
}

// Enqueue the second stage of a column reduction: out_p[c] (+)= sum over chunks
// k, ascending, of partial[(p * chunks + k) * cols + c], for planes p = 0 (out0)
// and, when planes == 2, p = 1 (out1).
absl::Status FinalizeColumnPartials(const float* partial, int chunks, int cols,
                                    int planes, float* out0, float* out1,
                                    bool accumulate, cudaStream_t stream);

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_CUDA_COMMON_CUH_
