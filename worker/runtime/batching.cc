// Packing and bucket_by_tokens.
#include "worker/runtime/batching.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace spgate::runtime {

double LengthCv(const std::vector<int64_t>& lengths) {
  if (lengths.size() < 2) return 0.0;
  long double sum = 0, sum_sq = 0;
  for (int64_t l : lengths) {
    sum += l;
    sum_sq += static_cast<long double>(l) * l;
  }
  const long double n = lengths.size();
  const long double mean = sum / n;
  const long double var = std::max<long double>(0, sum_sq / n - mean * mean);
  return mean > 0 ? static_cast<double>(std::sqrt(var) / mean) : 0.0;
}

int64_t TokenCount(std::span<const int64_t> lengths) {
  int64_t tokens = 0;
  for (int64_t l : lengths) tokens += l;
  return tokens;
}

Batch MakeBatch(std::vector<int64_t> lengths) {
  Batch b;
  b.tokens = TokenCount(lengths);
  b.length_cv = LengthCv(lengths);
  b.lengths = std::move(lengths);
  return b;
}

int64_t SpPaddedTokens(int64_t tokens, int tp) { return (tokens + tp - 1) / tp * tp; }

double BucketRatio(double target_cv) {
  const double c = std::max(target_cv, 1e-3);
  const double s = c + std::sqrt(c * c + 1.0);
  return s * s;
}

BatchBuilder::BatchBuilder(std::unique_ptr<LengthSource> source, BatchBuilderOptions options)
    : source_(std::move(source)), options_(options) {}

void BatchBuilder::Insert(int64_t len) {
  // Bucket of [r^k, r^(k+1)); a small epsilon keeps exact powers in their own bucket.
  const int64_t k = static_cast<int64_t>(std::floor(std::log(static_cast<double>(len)) /
                                                    log_ratio_ + 1e-9));
  Bucket& b = buckets_[k];
  if (b.tokens + len > options_.tokens_per_batch && !b.lengths.empty()) {
    pool_tokens_ -= b.tokens;
    ready_.push_back(MakeBatch(std::move(b.lengths)));
    b = Bucket{};
  }
  b.lengths.push_back(len);
  b.tokens += len;
  pool_tokens_ += len;
  if (b.tokens >= options_.tokens_per_batch) {
    pool_tokens_ -= b.tokens;
    ready_.push_back(MakeBatch(std::move(b.lengths)));
    buckets_.erase(k);
  }
}

void BatchBuilder::FlushFullest() {
  auto fullest = buckets_.end();
  for (auto it = buckets_.begin(); it != buckets_.end(); ++it) {
    if (fullest == buckets_.end() || it->second.tokens > fullest->second.tokens) fullest = it;
  }
  if (fullest == buckets_.end()) return;
  pool_tokens_ -= fullest->second.tokens;
  ready_.push_back(MakeBatch(std::move(fullest->second.lengths)));
  buckets_.erase(fullest);
}

Batch BatchBuilder::Next(double target_cv) {
  const int64_t budget = options_.tokens_per_batch;
  if (!options_.bucketing) {
    std::vector<int64_t> lengths;
    int64_t tokens = 0;
    for (;;) {
      const int64_t len = carry_ > 0 ? std::exchange(carry_, 0) : source_->Next();
      if (!lengths.empty() && tokens + len > budget) {
        carry_ = len;
        break;
      }
      lengths.push_back(len);
      tokens += len;
      if (tokens >= budget) break;
    }
    return MakeBatch(std::move(lengths));
  }
  if (target_cv != target_cv_) {
    // New target: re-bucket whatever waits (ready batches were cut under the old one
    // and are kept).
    target_cv_ = target_cv;
    log_ratio_ = std::log(BucketRatio(target_cv));
    std::vector<int64_t> waiting;
    for (auto& [k, b] : buckets_) waiting.insert(waiting.end(), b.lengths.begin(), b.lengths.end());
    buckets_.clear();
    pool_tokens_ = 0;
    for (int64_t l : waiting) Insert(l);
  }
  while (ready_.empty()) {
    Insert(source_->Next());
    if (ready_.empty() && pool_tokens_ > options_.pool_batches * budget) FlushFullest();
  }
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  return b;
}

}  // namespace spgate::runtime
