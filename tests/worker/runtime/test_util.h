// Helpers for the worker runtime tests: ASSERT_OK_AND_ASSIGN, Draw (the next n lengths of
// a source), PredictionCovers (the memory model's one-sided bound), and an all-close check
// that reports the worst element (index, both values, the bound) rather than the first.
//
// Tolerance used against the double reference: |got - want| <= kAtol + kRtol * |want|.
// The stack runs in fp32 with fp32 accumulation (OpenBLAS sgemm, fp32 reductions); at
// the test shapes (hidden <= 64, <= 2 layers, <= 64 tokens) its observed error is a
// few 1e-6, so the bound below leaves an order of magnitude of margin while still
// catching any real mistake (a missing 1/t, a wrong shard, a dropped padding row each
// cost 1e-2 or more).
#ifndef SPGATE_TESTS_WORKER_RUNTIME_TEST_UTIL_H_
#define SPGATE_TESTS_WORKER_RUNTIME_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

#define WR_CONCAT_INNER_(a, b) a##b
#define WR_CONCAT_(a, b) WR_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                               \
  auto WR_CONCAT_(wr_or_, __LINE__) = (expr);                         \
  ASSERT_TRUE(WR_CONCAT_(wr_or_, __LINE__).ok())                      \
      << WR_CONCAT_(wr_or_, __LINE__).status();                       \
  lhs = std::move(WR_CONCAT_(wr_or_, __LINE__)).value()

namespace spgate::runtime {

// The next `n` lengths of a LengthSource (worker/runtime/lengths.h).
template <typename Source>
std::vector<int64_t> Draw(Source& source, int n) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = source.Next();
  return v;
}

// The memory model's predicted peak against the arena's measured one, one-sided
// (docs/design.md §12): the gate's only margin is memory_headroom, so an under-prediction
// is an out-of-memory the gate let through and is held to kMaxUnderPrediction; an
// over-prediction only keeps a micro-batch SP that would have fit, and may be looser.
inline constexpr double kMaxUnderPrediction = 0.01;
inline constexpr double kMaxOverPrediction = 0.05;

inline ::testing::AssertionResult PredictionCovers(uint64_t predicted, uint64_t measured) {
  const double p = static_cast<double>(predicted), m = static_cast<double>(measured);
  const double rel = (p - m) / m;  // < 0: under-predicted
  if (measured > 0 && rel >= -kMaxUnderPrediction && rel <= kMaxOverPrediction) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << absl::StrFormat(
             "predicted %d bytes, measured %d: %+.3f%% (allowed %.0f%% under, %.0f%% over)",
             predicted, measured, 100 * rel, 100 * kMaxUnderPrediction,
             100 * kMaxOverPrediction);
}

}  // namespace spgate::runtime

namespace spgate::runtime::reference {

inline constexpr double kAtol = 5e-5;
inline constexpr double kRtol = 1e-3;

struct CloseResult {
  bool ok = true;
  double max_abs_diff = 0;
  std::string worst;
};

template <typename A, typename B>
CloseResult AllClose(const A& got, const B& want, double atol = kAtol, double rtol = kRtol) {
  CloseResult r;
  if (got.size() != want.size()) {
    r.ok = false;
    r.worst = absl::StrFormat("size %d vs %d", got.size(), want.size());
    return r;
  }
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double diff = std::fabs(g - w);
    r.max_abs_diff = std::max(r.max_abs_diff, diff);
    const double bound = atol + rtol * std::fabs(w);
    if (!(diff <= bound)) r.ok = false;
    if (diff - bound > worst_excess) {
      worst_excess = diff - bound;
      r.worst = absl::StrFormat("[%d] got %.9g want %.9g (|diff| %.3g, bound %.3g)", i, g, w,
                                diff, bound);
    }
  }
  return r;
}

}  // namespace spgate::runtime::reference

#define EXPECT_ALL_CLOSE(got, want, what)                                          \
  do {                                                                             \
    const auto wr_close_ = ::spgate::runtime::reference::AllClose((got), (want));  \
    EXPECT_TRUE(wr_close_.ok) << (what) << ": worst " << wr_close_.worst;          \
  } while (0)

#endif  // SPGATE_TESTS_WORKER_RUNTIME_TEST_UTIL_H_
