// Rolling statistics over the last N samples (docs/design.md §2: rolling rs_wait_share is a mean
// over the last window_steps SP steps, all_gather_tail and step_time are p95s).
// A fixed ring: Push is O(1) and allocation-free once the window is full; Mean is O(1)
// (a running sum, re-summed once per lap so rounding cannot accumulate); Quantile is
// O(N) and meant for metrics and admin views, not the decision path.
//
// Usage:
//   spgate::RollingWindow w(50);
//   w.Push(0.12);
//   double m = w.Mean();            // 0 when empty
//   double p95 = w.Quantile(0.95);  // nearest-rank
#ifndef SPGATE_POLICY_ROLLING_WINDOW_H_
#define SPGATE_POLICY_ROLLING_WINDOW_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace spgate {

class RollingWindow {
 public:
  explicit RollingWindow(int64_t capacity = 1) { Resize(capacity); }

  // Keeps the newest min(size, capacity) samples.
  void Resize(int64_t capacity) {
    capacity = std::max<int64_t>(1, capacity);
    if (capacity == capacity_) return;
    std::vector<double> kept = Samples();
    if (static_cast<int64_t>(kept.size()) > capacity) {
      kept.erase(kept.begin(), kept.end() - capacity);
    }
    capacity_ = capacity;
    ring_.assign(kept.begin(), kept.end());
    ring_.reserve(static_cast<size_t>(std::min<int64_t>(capacity_, 4096)));
    next_ = 0;
    Resum();
  }

  void Push(double value) {
    if (static_cast<int64_t>(ring_.size()) < capacity_) {
      ring_.push_back(value);
      sum_ += value;
      return;
    }
    sum_ += value - ring_[next_];
    ring_[next_] = value;
    if (++next_ == ring_.size()) {
      next_ = 0;
      Resum();
    }
  }

  void Clear() {
    ring_.clear();
    next_ = 0;
    sum_ = 0.0;
  }

  int64_t size() const { return static_cast<int64_t>(ring_.size()); }
  int64_t capacity() const { return capacity_; }
  bool empty() const { return ring_.empty(); }
  double Mean() const { return ring_.empty() ? 0.0 : sum_ / static_cast<double>(ring_.size()); }
  double Sum() const { return sum_; }

  // Nearest-rank quantile, q in [0, 1]; 0 when empty.
  double Quantile(double q) const {
    if (ring_.empty()) return 0.0;
    std::vector<double> v(ring_);
    const size_t rank = static_cast<size_t>(
        std::clamp<double>(std::ceil(q * static_cast<double>(v.size())), 1.0,
                           static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + (rank - 1), v.end());
    return v[rank - 1];
  }

  double Max() const {
    return ring_.empty() ? 0.0 : *std::max_element(ring_.begin(), ring_.end());
  }

  // Oldest first.
  std::vector<double> Samples() const {
    std::vector<double> out;
    out.reserve(ring_.size());
    for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
    return out;
  }

 private:
  void Resum() {
    sum_ = 0.0;
    for (double v : ring_) sum_ += v;
  }

  int64_t capacity_ = 0;
  std::vector<double> ring_;
  size_t next_ = 0;  // oldest sample once the ring is full
  double sum_ = 0.0;
};

}  // namespace spgate

#endif  // SPGATE_POLICY_ROLLING_WINDOW_H_
