// Sequence-length sources for worker and simulator (--lengths=DIST, docs/design.md §5):
//   lognormal:mean=4096,sigma=0.8            arithmetic mean and log-space sigma
//   bimodal:short=512,long=16384,p_long=0.2  two modes, each with +-jitter (default 0.1)
//   uniform:min=128,max=8192                 integers, both ends included
//   file:PATH                                one length per line, replayed in order, cycled
//   shift:after=N|FIRST|THEN                 N lengths from FIRST, then THEN's (a mix that
//                                            shifts), e.g. shift:after=20000|lognormal:
//                                            mean=4096,sigma=0.3|bimodal:short=512,...
// Every source is a pure function of its spec and seed (its own generator, no
// std::*_distribution, whose output differs between standard libraries), so ranks and
// reruns see the same stream. Lengths are clamped to [1, max_length].
//
// Usage:
//   ASSIGN_OR_RETURN(auto source, ParseLengthSource("bimodal:short=512,long=8192,p_long=0.3",
//                                                   /*seed=*/7, /*max_length=*/16384));
//   int64_t len = source->Next();
#ifndef SPGATE_WORKER_RUNTIME_LENGTHS_H_
#define SPGATE_WORKER_RUNTIME_LENGTHS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace spgate::runtime {

class LengthSource {
 public:
  virtual ~LengthSource() = default;
  virtual int64_t Next() = 0;
  // The spec in canonical form, for logs and summaries.
  virtual std::string Describe() const = 0;
  // A file replays a cycle of this many lengths; 0 for the (endless) distributions.
  virtual int64_t cycle_length() const { return 0; }
};

// INVALID_ARGUMENT naming --lengths and the bad part; NOT_FOUND for a missing file.
absl::StatusOr<std::unique_ptr<LengthSource>> ParseLengthSource(std::string_view spec,
                                                                uint64_t seed,
                                                                int64_t max_length);

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_LENGTHS_H_
