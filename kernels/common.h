// Types shared by every kernel header: the bf16 storage type, and forward
// declarations of the two CUDA handle types the launchers take, so that code
// that only uses the CPU paths (and the worker's memory accounting) can include
// any kernel header without CUDA headers or a CUDA toolkit. The invariant that
// matters: `Bfloat16` has exactly the layout of CUDA's `__nv_bfloat16` (one
// uint16 holding the top half of an IEEE float), so host buffers of it can be
// copied to and from the device byte for byte.
//
//   std::vector<Bfloat16> h(n);
//   for (size_t i = 0; i < n; ++i) h[i] = ToBfloat16(x[i]);  // round to nearest even
//   float back = ToFloat(h[0]);                              // exact
#ifndef SPGATE_KERNELS_COMMON_H_
#define SPGATE_KERNELS_COMMON_H_

#include <cstdint>
#include <cstring>

// Identical to the CUDA runtime's and cuBLAS's own typedefs (repeating a typedef
// of the same type is legal C++), so these coexist with the real headers.
typedef struct CUstream_st* cudaStream_t;
typedef struct cublasContext* cublasHandle_t;

namespace spgate::kernels {

// bfloat16 storage: 1 sign, 8 exponent, 7 mantissa bits. Arithmetic always
// happens in float; this type only stores.
struct Bfloat16 {
  uint16_t bits = 0;
};
static_assert(sizeof(Bfloat16) == 2, "Bfloat16 must match __nv_bfloat16");

// Round to nearest, ties to even (what __float2bfloat16 does); NaN stays NaN.
inline Bfloat16 ToBfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  Bfloat16 b;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    b.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    return b;
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  b.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return b;
}

inline float ToFloat(Bfloat16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float ToFloat(float f) { return f; }

}  // namespace spgate::kernels

#endif  // SPGATE_KERNELS_COMMON_H_
