// Defaults shared by the daemon's options, its flags and its live state, so each is
// written once.
#ifndef SPGATE_SERVER_DEFAULTS_H_
#define SPGATE_SERVER_DEFAULTS_H_

#include <cstdint>

namespace spgate::server {

// Decisions each TP group keeps for idempotent retries (the newest ones; a retry of an
// older step is refused). A worker re-sends a plan only while that step is undecided on
// its side, i.e. within its pipelining depth, so this is generous. The cache grows with
// use up to this size (about 80 bytes a decision).
inline constexpr int64_t kDefaultDecisionCacheSteps = 512;

}  // namespace spgate::server

#endif  // SPGATE_SERVER_DEFAULTS_H_
