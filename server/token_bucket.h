// A token bucket: at most `rate` events a second on average, bursts of up to `burst`.
// Time is an argument (the live state passes its injected clock), so tests step it; no
// allocation, no lock (the owner holds one). Used for the per-session plan and telemetry
// rate limits (docs/design.md §10).
//
// Usage:
//   TokenBucket plans(/*rate=*/1000, /*burst=*/2000, now);
//   if (!plans.TryTake(now)) return absl::ResourceExhaustedError(...);
#ifndef SPGATE_SERVER_TOKEN_BUCKET_H_
#define SPGATE_SERVER_TOKEN_BUCKET_H_

#include <algorithm>

#include "absl/time/time.h"

namespace spgate::server {

class TokenBucket {
 public:
  TokenBucket() = default;
  // Starts full. rate <= 0 means no limit.
  TokenBucket(double rate, double burst, absl::Time now)
      : rate_(rate), burst_(std::max(1.0, burst)), tokens_(burst_), last_(now) {}

  // Takes `n` tokens if there are that many; false (and nothing taken) otherwise. A clock
  // that steps backwards adds nothing.
  bool TryTake(absl::Time now, double n = 1) {
    if (rate_ <= 0) return true;
    if (now > last_) {
      tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * rate_);
      last_ = now;
    }
    if (tokens_ < n) return false;
    tokens_ -= n;
    return true;
  }

  double tokens() const { return tokens_; }

 private:
  double rate_ = 0;
  double burst_ = 1;
  double tokens_ = 1;
  absl::Time last_;
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_TOKEN_BUCKET_H_
