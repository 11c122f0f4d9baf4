// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a 64-bit mix whose outputs for consecutive inputs pass BigCrush. Small,
// fast and the same on every platform, so a value drawn from it is a pure function of
// its input: the reference worker's weights and lengths, and ADAPTIVE's probe schedule,
// which the daemon and every worker's fallback must compute alike.
#ifndef SPGATE_COMMON_SPLIT_MIX_H_
#define SPGATE_COMMON_SPLIT_MIX_H_

#include <cstdint>

namespace spgate {

inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

// The mix of x + kSplitMixGamma: the generator's output for state x.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += kSplitMixGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace spgate

#endif  // SPGATE_COMMON_SPLIT_MIX_H_
