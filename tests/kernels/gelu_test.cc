// Bias + GeLU (tanh form) on the CPU: the production path (vectorised FastTanh)
// against the double reference on awkward shapes and saturating inputs, the
// reference derivative and backward against central finite differences, and
// dbias of row shards adding up to the full dbias.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gelu.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;
using testing::AllClose;
using testing::RandomVector;
using testing::ToDouble;

struct GeluCase {
  std::string name;
  int64_t rows;
  int64_t cols;
  bool bias;
};

void PrintTo(const GeluCase& c, std::ostream* os) { *os << c.name; }

class GeluCpuTest : public ::testing::TestWithParam<GeluCase> {};

TEST_P(GeluCpuTest, ForwardAndBackwardMatchReference) {
  const GeluCase& c = GetParam();
  // Wide range: both tails (saturation) and the curved middle.
  const std::vector<float> pre = RandomVector(c.rows * c.cols, 3, -8.0f, 8.0f);
  const std::vector<float> bias = RandomVector(c.cols, 4, -1.0f, 1.0f);
  const std::vector<float> dy = RandomVector(c.rows * c.cols, 5);

  std::vector<float> y(c.rows * c.cols);
  GeluFwdArgs<float> f;
  f.rows = c.rows;
  f.cols = c.cols;
  f.pre = pre.data();
  f.bias = c.bias ? bias.data() : nullptr;
  f.y = y.data();
  ASSERT_OK(GeluFwdCpu(f));
  const std::vector<double> bias_d = c.bias ? ToDouble(bias) : std::vector<double>{};
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_y,
                       GeluFwdRef(c.rows, c.cols, ToDouble(pre), bias_d));
  EXPECT_TRUE(AllClose(y, want_y, 2e-6, 2e-6)) << "y";

  std::vector<float> dpre(c.rows * c.cols), dbias(c.cols, 7.0f);
  GeluBwdArgs<float> b;
  b.rows = c.rows;
  b.cols = c.cols;
  b.dy = dy.data();
  b.pre = pre.data();
  b.bias = f.bias;
  b.dpre = dpre.data();
  b.dbias = c.bias ? dbias.data() : nullptr;
  ASSERT_OK(GeluBwdCpu(b));
  ASSERT_OK_AND_ASSIGN(GeluBwdRefResult want,
                       GeluBwdRef(c.rows, c.cols, ToDouble(dy), ToDouble(pre), bias_d));
  EXPECT_TRUE(AllClose(dpre, want.dpre, 2e-6, 2e-6)) << "dpre";
  if (c.bias) {
    const double tol = 4e-6 * std::sqrt(static_cast<double>(c.rows) + 1);
    EXPECT_TRUE(AllClose(dbias, want.dbias, tol, 1e-5)) << "dbias";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GeluCpuTest,
                         ::testing::Values(GeluCase{"r71_c229_bias", 71, 229, true},
                                           GeluCase{"r71_c229_plain", 71, 229, false},
                                           GeluCase{"r1_c1", 1, 1, true},
                                           GeluCase{"r1000_c3", 1000, 3, true},
                                           GeluCase{"r4_c4096", 4, 4096, true},
                                           GeluCase{"r0_c5", 0, 5, true}),
                         [](const ::testing::TestParamInfo<GeluCase>& i) {
                           return i.param.name;
                         });

TEST(GeluCpuTest, SaturatesWithoutNaN) {
  const std::vector<float> pre = {-1e30f, -100.0f, -10.0f, 0.0f, 10.0f, 100.0f, 1e30f};
  std::vector<float> y(pre.size());
  GeluFwdArgs<float> f;
  f.rows = 1;
  f.cols = static_cast<int64_t>(pre.size());
  f.pre = pre.data();
  f.y = y.data();
  ASSERT_OK(GeluFwdCpu(f));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[2], 0.0f, 1e-6f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_NEAR(y[4], 10.0f, 1e-5f);
  EXPECT_EQ(y[5], 100.0f);
  EXPECT_EQ(y[6], 1e30f);
}

TEST(GeluRefTest, GradientMatchesFiniteDifferences) {
  constexpr double kStep = 1e-6;
  for (double u = -6.0; u <= 6.0; u += 0.37) {
    const double fd = (GeluTanhRef(u + kStep) - GeluTanhRef(u - kStep)) / (2 * kStep);
    EXPECT_NEAR(GeluTanhGradRef(u), fd, 1e-8) << "u = " << u;
  }
}

// Loss = sum(w * gelu(pre + bias)); dpre and dbias of the reference backward
// against central differences.
TEST(GeluRefTest, BackwardMatchesFiniteDifferences) {
  constexpr int64_t kRows = 4, kCols = 5;
  constexpr double kStep = 1e-6;
  std::vector<double> pre = ToDouble(RandomVector(kRows * kCols, 8, -3, 3));
  std::vector<double> bias = ToDouble(RandomVector(kCols, 9));
  const std::vector<double> w = ToDouble(RandomVector(kRows * kCols, 10));
  auto loss = [&]() {
    auto y = GeluFwdRef(kRows, kCols, pre, bias);
    EXPECT_TRUE(y.ok());
    double l = 0;
    for (size_t i = 0; i < w.size(); ++i) l += w[i] * (*y)[i];
    return l;
  };
  ASSERT_OK_AND_ASSIGN(GeluBwdRefResult g, GeluBwdRef(kRows, kCols, w, pre, bias));
  const std::vector<double> fd_pre = testing::FiniteDifferenceGradient(pre, loss, kStep);
  const std::vector<double> fd_bias = testing::FiniteDifferenceGradient(bias, loss, kStep);
  EXPECT_TRUE(AllClose(g.dpre, fd_pre, 1e-8, 1e-6)) << "dpre";
  EXPECT_TRUE(AllClose(g.dbias, fd_bias, 1e-8, 1e-6)) << "dbias";
}

TEST(GeluCpuTest, ShardBiasGradsAddUpAndAccumulate) {
  constexpr int64_t kRows = 50, kCols = 37;
  const std::vector<float> pre = RandomVector(kRows * kCols, 12, -4, 4);
  const std::vector<float> bias = RandomVector(kCols, 13);
  const std::vector<float> dy = RandomVector(kRows * kCols, 14);
  std::vector<float> dpre(kRows * kCols), full(kCols), acc(kCols);
  GeluBwdArgs<float> b;
  b.rows = kRows;
  b.cols = kCols;
  b.dy = dy.data();
  b.pre = pre.data();
  b.bias = bias.data();
  b.dpre = dpre.data();
  b.dbias = full.data();
  ASSERT_OK(GeluBwdCpu(b));
  for (int64_t r0 : {0, 17, 40}) {
    const int64_t r1 = r0 == 0 ? 17 : (r0 == 17 ? 40 : kRows);
    GeluBwdArgs<float> s = b;
    s.rows = r1 - r0;
    s.dy = dy.data() + r0 * kCols;
    s.pre = pre.data() + r0 * kCols;
    s.dpre = dpre.data() + r0 * kCols;
    s.dbias = acc.data();
    s.accumulate_bias_grad = r0 != 0;
    ASSERT_OK(GeluBwdCpu(s));
  }
  EXPECT_TRUE(AllClose(acc, ToDouble(full), 1e-5, 1e-5));
}

TEST(GeluCpuTest, DpreMayAliasDy) {
  constexpr int64_t kRows = 3, kCols = 17;
  const std::vector<float> pre = RandomVector(kRows * kCols, 15, -3, 3);
  const std::vector<float> dy = RandomVector(kRows * kCols, 16);
  std::vector<float> separate(kRows * kCols), inplace = dy;
  GeluBwdArgs<float> b;
  b.rows = kRows;
  b.cols = kCols;
  b.dy = dy.data();
  b.pre = pre.data();
  b.dpre = separate.data();
  ASSERT_OK(GeluBwdCpu(b));
  b.dy = inplace.data();
  b.dpre = inplace.data();
  ASSERT_OK(GeluBwdCpu(b));
  EXPECT_TRUE(testing::BitwiseEqual(inplace, separate));
}

TEST(GeluCpuTest, RejectsBadArguments) {
  std::vector<float> buf(16);
  GeluFwdArgs<float> f;
  f.rows = 2;
  f.cols = 0;
  f.pre = f.y = nullptr;
  EXPECT_THAT(GeluFwdCpu(f), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cols")));
  f.cols = 4;
  EXPECT_THAT(GeluFwdCpu(f), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pre")));

  GeluBwdArgs<float> b;
  b.rows = 2;
  b.cols = 4;
  b.dy = b.pre = buf.data();
  b.dpre = buf.data();
  b.dbias = buf.data();  // but no bias
  EXPECT_THAT(GeluBwdCpu(b), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bias")));
}

TEST(GeluWorkspaceTest, ChunkedColumnPartials) {
  EXPECT_EQ(GeluBwdWorkspaceBytes(0, 100), 0u);
  EXPECT_EQ(GeluBwdWorkspaceBytes(1, 100), 1u * 100 * 4);
  EXPECT_EQ(GeluBwdWorkspaceBytes(33, 100), 2u * 100 * 4);
  EXPECT_EQ(GeluBwdWorkspaceBytes(1 << 20, 100), 128u * 100 * 4);
}

}  // namespace
}  // namespace spgate::kernels
