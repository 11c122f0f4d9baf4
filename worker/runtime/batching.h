// Batches from a length stream, on the TP group leader: plain packing (sequences in
// arrival order until the next one would pass the token budget) or bucket_by_tokens,
// which keeps every batch's length CV at or under a target (the daemon's
// bucket_target_cv, docs/design.md §1/§3) so the length-CV gate passes and SP runs.
//
// bucket_by_tokens puts each sequence in a geometric length bucket [r^k, r^(k+1)) and
// emits a bucket as a batch when the next sequence would not fit its budget. For values
// in [a, r a] the population CV is at most (r - 1) / (2 sqrt(r)) (two points, weight
// 1/(r + 1) on the top), so r = (c + sqrt(c^2 + 1))^2 guarantees CV <= c for target c.
// When more than `pool_batches` budgets' worth of tokens wait in buckets, the fullest
// bucket is emitted early (bounded delay, still within target).
//
// Usage:
//   BatchBuilder builder(std::move(source), {.tokens_per_batch = 16384, .bucketing = true});
//   Batch b = builder.Next(/*target_cv=*/0.15);   // b.length_cv <= 0.15
#ifndef SPGATE_WORKER_RUNTIME_BATCHING_H_
#define SPGATE_WORKER_RUNTIME_BATCHING_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "worker/runtime/lengths.h"

namespace spgate::runtime {

struct Batch {
  std::vector<int64_t> lengths;
  int64_t tokens = 0;
  double length_cv = 0.0;  // population stddev / mean (docs/design.md §2)
};

// docs/design.md §2 length CV (0 for one sequence or none).
double LengthCv(const std::vector<int64_t>& lengths);

// The batch's real tokens: the sum of its lengths.
int64_t TokenCount(std::span<const int64_t> lengths);

// A batch of these lengths, its tokens and length CV filled in.
Batch MakeBatch(std::vector<int64_t> lengths);

// The tokens a batch of `tokens` real ones occupies under SP on `tp` ranks: SP gives every
// rank an equal block of rows, so the batch is padded up to a multiple of tp (TP-only
// runs the batch as it is). The padding is SpPaddedTokens(tokens, tp) - tokens.
int64_t SpPaddedTokens(int64_t tokens, int tp);

// The bucket ratio r for a target CV (see above).
double BucketRatio(double target_cv);

struct BatchBuilderOptions {
  int64_t tokens_per_batch = 16384;
  bool bucketing = false;
  int pool_batches = 8;
};

class BatchBuilder {
 public:
  BatchBuilder(std::unique_ptr<LengthSource> source, BatchBuilderOptions options);

  // The next batch; `target_cv` is used with bucketing only (a change re-buckets the
  // waiting sequences).
  Batch Next(double target_cv);

  // Sequences drawn from the source but not yet in a returned batch.
  int64_t waiting_tokens() const { return pool_tokens_; }

 private:
  void Insert(int64_t len);
  void FlushFullest();

  struct Bucket {
    std::vector<int64_t> lengths;
    int64_t tokens = 0;
  };
  std::unique_ptr<LengthSource> source_;
  BatchBuilderOptions options_;
  double target_cv_ = -1;
  double log_ratio_ = 0;
  std::map<int64_t, Bucket> buckets_;
  std::deque<Batch> ready_;
  int64_t pool_tokens_ = 0;
  int64_t carry_ = 0;  // packing: a sequence that did not fit the previous batch
};

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_BATCHING_H_
