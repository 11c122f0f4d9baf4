// Helpers shared by the kernel tests (CPU here, GPU in tests/gpu): Status
// assertions, seeded random inputs, float <-> double <-> bf16 conversion, and an
// all-close check that reports the worst element rather than the first, so a
// failing comparison says how wrong and where.
#ifndef SPGATE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define SPGATE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common.h"

#define ASSERT_OK(expr)                                  \
  do {                                                   \
    const ::absl::Status assert_ok_status_ = (expr);     \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

#define EXPECT_OK(expr)                                  \
  do {                                                   \
    const ::absl::Status expect_ok_status_ = (expr);     \
    EXPECT_TRUE(expect_ok_status_.ok()) << expect_ok_status_; \
  } while (0)

#define KT_CONCAT_INNER_(a, b) a##b
#define KT_CONCAT_(a, b) KT_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                   \
  auto KT_CONCAT_(kt_or_, __LINE__) = (expr);                             \
  ASSERT_TRUE(KT_CONCAT_(kt_or_, __LINE__).ok())                          \
      << KT_CONCAT_(kt_or_, __LINE__).status();                           \
  lhs = std::move(KT_CONCAT_(kt_or_, __LINE__)).value()

// EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x")))
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = arg;
  if (s.code() != code) {
    *result_listener << "code is " << absl::StatusCodeToString(s.code()) << ": " << s.message();
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

namespace spgate::kernels::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> ToDouble(absl::Span<const float> v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<Bfloat16> ToBf16(absl::Span<const float> v) {
  std::vector<Bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToBfloat16(v[i]);
  return out;
}

inline std::vector<float> ToFloat(absl::Span<const Bfloat16> v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = spgate::kernels::ToFloat(v[i]);
  return out;
}

// Rounds every value through bf16 (what a bf16 buffer of it holds).
inline std::vector<float> RoundBf16(absl::Span<const float> v) {
  return ToFloat(ToBf16(v));
}

// |got - want| <= atol + rtol * |want| for every element; on failure, reports
// the number of violations and the worst one.
template <typename G>
::testing::AssertionResult AllClose(absl::Span<const G> got, absl::Span<const double> want,
                                    double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != expected " << want.size();
  }
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::abs(g - want[i]);
    const double tol = atol + rtol * std::abs(want[i]);
    if (!(err <= tol)) {  // catches NaN
      ++bad;
      const double excess = std::isnan(err) ? 1e300 : err - tol;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; worst at [" << worst
         << "]: got " << static_cast<double>(got[worst]) << ", want " << want[worst]
         << " (atol " << atol << ", rtol " << rtol << ")";
}

inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<double>& want, double atol,
                                           double rtol) {
  return AllClose<float>(absl::MakeConstSpan(got), absl::MakeConstSpan(want), atol, rtol);
}

inline ::testing::AssertionResult AllClose(const std::vector<double>& got,
                                           const std::vector<double>& want, double atol,
                                           double rtol) {
  return AllClose<double>(absl::MakeConstSpan(got), absl::MakeConstSpan(want), atol, rtol);
}

// Central finite differences of loss() with respect to every element of v:
// each is moved by +step and -step in place (and restored), loss() re-evaluated.
template <typename Loss>
std::vector<double> FiniteDifferenceGradient(std::vector<double>& v, Loss&& loss,
                                             double step) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + step;
    const double up = loss();
    v[i] = keep - step;
    const double down = loss();
    v[i] = keep;
    g[i] = (up - down) / (2 * step);
  }
  return g;
}

// Bitwise equality of two float ranges (same rows computed in two ways that
// must not differ at all).
inline ::testing::AssertionResult BitwiseEqual(absl::Span<const float> got,
                                               absl::Span<const float> want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b) {
      return ::testing::AssertionFailure()
             << "first difference at [" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace spgate::kernels::testing

#endif  // SPGATE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
