// When the CPU paths write their outputs with non-temporal (cache-bypassing)
// stores. A normal store to a line that is not cached first reads the line
// (read-for-ownership), so a kernel that writes two of its four streams moves
// six lines per four useful ones; x86 non-temporal stores skip that read, as
// glibc's memcpy does for large copies. Only worth it when the output cannot
// stay in cache anyway, hence the size gate; the streaming loops store 16
// aligned bytes at a time, hence the alignment gate. Streaming and cached paths
// compute the same expressions in the same order, so results are bitwise equal.
// A kernel that streamed calls StoreFence before returning.
#ifndef SPGATE_KERNELS_INTERNAL_CPU_STREAM_H_
#define SPGATE_KERNELS_INTERNAL_CPU_STREAM_H_

#include <cstdint>
#include <initializer_list>

#if defined(__SSE2__)
#include <emmintrin.h>
#define KERNELS_HAVE_STREAMING_STORES 1
#else
#define KERNELS_HAVE_STREAMING_STORES 0
#endif

namespace spgate::kernels::internal {

// Outputs at least this large are streamed (well past a core's L2 and its
// share of L3 on current server parts).
inline constexpr int64_t kStreamingThresholdBytes = int64_t{16} << 20;

// True when every row of every output (row_len floats apart, starting at the
// given pointers; null ones are ignored) can be streamed 4 floats at a time.
inline bool CanStream(int64_t output_bytes, int64_t row_len,
                      std::initializer_list<const void*> outputs) {
  if (!KERNELS_HAVE_STREAMING_STORES || output_bytes < kStreamingThresholdBytes ||
      row_len % 4 != 0) {
    return false;
  }
  for (const void* p : outputs) {
    if (p != nullptr && (reinterpret_cast<uintptr_t>(p) & 15u) != 0) return false;
  }
  return true;
}

inline void StoreFence(bool streamed) {
#if KERNELS_HAVE_STREAMING_STORES
  if (streamed) _mm_sfence();
#endif
}

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_CPU_STREAM_H_
