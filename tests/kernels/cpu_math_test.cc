// The CPU paths' vectorisable exp/tanh (kernels/internal/cpu_math.h) against
// libm over their whole domain, including the clamps: softmax and GeLU
// accuracy rest on these bounds.
#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/internal/cpu_math.h"

namespace spgate::kernels::internal {
namespace {

TEST(FastExpTest, WithinTwoUlpOnTheUnclampedRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const double want = std::exp(static_cast<double>(x));
    const double rel = std::abs(FastExp(x) - want) / want;
    worst = std::max(worst, rel);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of float is ~2.4e-7 relative
}

TEST(FastExpTest, ClampsInsteadOfOverflowing) {
  EXPECT_TRUE(std::isfinite(FastExp(1000.0f)));
  EXPECT_GT(FastExp(1000.0f), 1e38f);
  EXPECT_GE(FastExp(-1000.0f), 0.0f);
  EXPECT_LT(FastExp(-1000.0f), 1e-37f);
  EXPECT_LT(FastExp(-INFINITY), 1e-37f);
  EXPECT_EQ(FastExp(0.0f), 1.0f);
}

TEST(FastTanhTest, AbsoluteErrorBound) {
  double worst = 0;
  for (float a = -20.0f; a <= 20.0f; a += 0.0009765625f) {
    worst = std::max(worst, std::abs(FastTanh(a) - std::tanh(static_cast<double>(a))));
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(FastTanh(100.0f), 1.0f);
  EXPECT_EQ(FastTanh(-100.0f), -1.0f);
  EXPECT_EQ(FastTanh(INFINITY), 1.0f);
  EXPECT_EQ(FastTanh(-INFINITY), -1.0f);
}

}  // namespace
}  // namespace spgate::kernels::internal
