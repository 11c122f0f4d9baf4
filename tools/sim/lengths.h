// Batches for spgate-sim: sequence lengths drawn from a distribution (SPEC §5 --lengths:
// lognormal, bimodal, uniform, or a file of lengths) and packed into batches of about
// --tokens_per_batch tokens, optionally bucketed (a pool of sequences sorted by length
// and cut into batches, so lengths inside a batch are similar — the worker-side
// bucket_by_tokens of SPEC §1). Deterministic for a seed.
//
// Usage:
//   ASSIGN_OR_RETURN(auto dist, spgate::sim::ParseLengths("lognormal:mean=4096,sigma=0.8"));
//   spgate::sim::BatchSource src(std::move(dist), {.tokens_per_batch = 65536}, /*seed=*/1);
//   std::vector<int64_t> batch = src.Next();
#ifndef SPGATE_TOOLS_SIM_LENGTHS_H_
#define SPGATE_TOOLS_SIM_LENGTHS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace spgate::sim {

// Not thread-safe (samplers keep state): one instance per simulated group.
class LengthDistribution {
 public:
  virtual ~LengthDistribution() = default;
  // One sequence length in [1, max_length].
  virtual int64_t Sample(std::mt19937_64& rng) = 0;
  // A file trace is replayed in order (and wraps); distributions are i.i.d.
  virtual bool is_trace() const { return false; }
  virtual size_t trace_size() const { return 0; }
  // Traces: continue from `position` (mod size). Distributions: no effect.
  virtual void Seek(size_t position) {}
};

// "lognormal:mean=M,sigma=S" (mean of the lengths, sigma of the log),
// "bimodal:short=A,long=B,p_long=P" (each mode ±10%), "uniform:min=A,max=B",
// "file:PATH" (one length per line; blank lines and # comments skipped).
// INVALID_ARGUMENT names the bad part.
absl::StatusOr<std::unique_ptr<LengthDistribution>> ParseLengths(const std::string& spec,
                                                                  int64_t max_length = 1 << 20);

struct BatchOptions {
  int64_t tokens_per_batch = 65536;
  bool bucketing = true;
  int bucket_pool_batches = 32;  // batches' worth of sequences sorted per bucket pool
};

class BatchSource {
 public:
  BatchSource(std::shared_ptr<LengthDistribution> dist, BatchOptions options, uint64_t seed);
  // The next batch: lengths summing to <= tokens_per_batch (a longer sequence is cut to
  // tokens_per_batch); never empty.
  std::vector<int64_t> Next();

 private:
  std::vector<int64_t> Pack(std::vector<int64_t>& pool, size_t& pos);
  void Refill();

  std::shared_ptr<LengthDistribution> dist_;
  BatchOptions options_;
  std::mt19937_64 rng_;
  std::deque<std::vector<int64_t>> ready_;
  std::vector<int64_t> carry_;  // drawn sequences that did not fit earlier batches
};

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_LENGTHS_H_
