// GEMM wrappers and Linear products on the CPU (OpenBLAS) against the double
// reference: every transpose combination on odd shapes with padded leading
// dimensions, alpha/beta semantics (beta = 0 must overwrite even NaN), k = 0,
// strided batches, the Linear layer's three products with accumulation, the
// reference Linear backward against finite differences, and argument checks
// that name the offending field.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gemm.h"
#include "tests/kernels/gemm_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;
using testing::AllClose;
using testing::RandomVector;
using testing::ToDouble;

struct GemmCase {
  int64_t m, n, k;
  Trans ta, tb;
  float alpha, beta;
  int64_t pad;  // extra columns in every leading dimension
};

std::string Name(const GemmCase& c) {
  auto t = [](Trans x) { return x == Trans::kYes ? "T" : "N"; };
  return "m" + std::to_string(c.m) + "n" + std::to_string(c.n) + "k" + std::to_string(c.k) +
         t(c.ta) + t(c.tb) + (c.beta != 0 ? "_beta" : "") + (c.pad ? "_pad" : "");
}

void PrintTo(const GemmCase& c, std::ostream* os) { *os << Name(c); }

class GemmCpuTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmCpuTest, MatchesReference) {
  const GemmCase& c = GetParam();
  const bool ta = c.ta == Trans::kYes, tb = c.tb == Trans::kYes;
  const int64_t a_rows = ta ? c.k : c.m, a_cols = ta ? c.m : c.k;
  const int64_t b_rows = tb ? c.n : c.k, b_cols = tb ? c.k : c.n;
  // BLAS wants ld >= max(1, columns) even for empty operands.
  const int64_t lda = std::max<int64_t>(1, a_cols) + c.pad;
  const int64_t ldb = std::max<int64_t>(1, b_cols) + c.pad;
  const int64_t ldc = std::max<int64_t>(1, c.n) + c.pad;
  const std::vector<float> a = RandomVector(std::max<int64_t>(1, a_rows * lda), 1);
  const std::vector<float> b = RandomVector(std::max<int64_t>(1, b_rows * ldb), 2);
  std::vector<float> cm = RandomVector(std::max<int64_t>(1, c.m * ldc), 3);
  if (c.beta == 0 && !cm.empty()) cm[0] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> c0 = cm;

  GemmArgs g;
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.alpha = c.alpha;
  g.a = a.data();
  g.lda = lda;
  g.b = b.data();
  g.ldb = ldb;
  g.beta = c.beta;
  g.c = cm.data();
  g.ldc = ldc;
  ASSERT_OK(GemmCpu(g));

  const std::vector<double> ad = ToDouble(a), bd = ToDouble(b), cd = ToDouble(c0);
  const GemmRefArgs r = testing::RefArgsLike(g, ad, bd, cd);
  ASSERT_OK_AND_ASSIGN(std::vector<double> want, GemmRef(r));
  // Only the [m, n] block is defined; padding columns are left alone.
  std::vector<float> got_block;
  std::vector<double> want_block;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      got_block.push_back(cm[i * ldc + j]);
      want_block.push_back(want[i * ldc + j]);
    }
    for (int64_t j = c.n; j < ldc && c.pad > 0; ++j) {
      EXPECT_EQ(cm[i * ldc + j], c0[i * ldc + j]) << "padding touched at " << i << "," << j;
    }
  }
  EXPECT_TRUE(AllClose(got_block, want_block, 1e-5 * std::sqrt(c.k + 1.0), 1e-5));
}

std::vector<GemmCase> AllCases() {
  std::vector<GemmCase> cases;
  for (Trans ta : {Trans::kNo, Trans::kYes}) {
    for (Trans tb : {Trans::kNo, Trans::kYes}) {
      cases.push_back({71, 229, 13, ta, tb, 1.0f, 0.0f, 0});
      cases.push_back({71, 229, 13, ta, tb, 0.5f, 1.5f, 3});
      cases.push_back({1, 1, 1, ta, tb, 1.0f, 0.0f, 0});
      cases.push_back({5, 3, 0, ta, tb, 1.0f, 0.5f, 1});
      cases.push_back({0, 4, 4, ta, tb, 1.0f, 0.0f, 0});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmCpuTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<GemmCase>& i) {
                           return Name(i.param);
                         });

TEST(GemmCpuTest, StridedBatchMatchesLoop) {
  constexpr int64_t kM = 7, kN = 5, kK = 3, kCount = 4;
  // Operands interleaved like attention heads: stride smaller than the ld.
  const int64_t lda = kCount * kK, ldb = kCount * kK, ldc = kN;
  const std::vector<float> a = RandomVector(kM * lda, 4), b = RandomVector(kN * ldb, 5);
  std::vector<float> c(kCount * kM * kN);
  GemmArgs g;
  g.trans_b = Trans::kYes;
  g.m = kM;
  g.n = kN;
  g.k = kK;
  g.a = a.data();
  g.lda = lda;
  g.b = b.data();
  g.ldb = ldb;
  g.c = c.data();
  g.ldc = ldc;
  GemmBatch batch{kCount, kK, kK, kM * kN};
  ASSERT_OK(GemmStridedBatchedCpu(g, batch));
  testing::ExpectStridedBatchMatchesRef(g, batch, a, b, c);
}

TEST(LinearCpuTest, ForwardAndBackwardMatchReference) {
  const LinearShape s{71, 229, 37};
  const std::vector<float> x = RandomVector(s.rows * s.in_features, 6);
  const std::vector<float> w = RandomVector(s.out_features * s.in_features, 7);
  const std::vector<float> bias = RandomVector(s.out_features, 8);
  const std::vector<float> dy = RandomVector(s.rows * s.out_features, 9);

  std::vector<float> y(s.rows * s.out_features);
  ASSERT_OK(LinearFwdCpu({s, x.data(), w.data(), bias.data(), y.data()}));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_y,
                       LinearFwdRef(s, ToDouble(x), ToDouble(w), ToDouble(bias)));
  EXPECT_TRUE(AllClose(y, want_y, 1e-4, 1e-5)) << "y";

  ASSERT_OK_AND_ASSIGN(LinearBwdRefResult want,
                       LinearBwdRef(s, ToDouble(dy), ToDouble(x), ToDouble(w)));
  std::vector<float> dx(s.rows * s.in_features), dw(s.out_features * s.in_features),
      db(s.out_features);
  ASSERT_OK(LinearBwdDataCpu({s, dy.data(), w.data(), dx.data(), false}));
  EXPECT_TRUE(AllClose(dx, want.dx, 1e-4, 1e-5)) << "dx";
  ASSERT_OK(LinearBwdWeightCpu({s, dy.data(), x.data(), dw.data(), db.data(), false}));
  EXPECT_TRUE(AllClose(dw, want.dweight, 1e-4, 1e-5)) << "dweight";
  EXPECT_TRUE(AllClose(db, want.dbias, 1e-4, 1e-5)) << "dbias";

  // Accumulation doubles everything.
  ASSERT_OK(LinearBwdDataCpu({s, dy.data(), w.data(), dx.data(), true}));
  ASSERT_OK(LinearBwdWeightCpu({s, dy.data(), x.data(), dw.data(), db.data(), true}));
  for (auto* v : {&want.dx, &want.dweight, &want.dbias}) {
    for (double& e : *v) e *= 2;
  }
  EXPECT_TRUE(AllClose(dx, want.dx, 2e-4, 1e-5)) << "dx accumulated";
  EXPECT_TRUE(AllClose(dw, want.dweight, 2e-4, 1e-5)) << "dweight accumulated";
  EXPECT_TRUE(AllClose(db, want.dbias, 2e-4, 1e-5)) << "dbias accumulated";
}

TEST(LinearCpuTest, ZeroRowsZeroesWeightGradsUnlessAccumulating) {
  const LinearShape s{0, 3, 2};
  std::vector<float> dw(6, 4.0f), db(2, 4.0f);
  ASSERT_OK(LinearBwdWeightCpu({s, nullptr, nullptr, dw.data(), db.data(), true}));
  EXPECT_THAT(dw, ::testing::Each(4.0f));
  ASSERT_OK(LinearBwdWeightCpu({s, nullptr, nullptr, dw.data(), db.data(), false}));
  EXPECT_THAT(dw, ::testing::Each(0.0f));
  EXPECT_THAT(db, ::testing::Each(0.0f));
}

// Loss = sum(w_y * (x W^T + b)); reference gradients against central
// differences in double.
TEST(LinearRefTest, BackwardMatchesFiniteDifferences) {
  const LinearShape s{3, 4, 2};
  constexpr double kStep = 1e-6;
  std::vector<double> x = ToDouble(RandomVector(s.rows * s.in_features, 10));
  std::vector<double> w = ToDouble(RandomVector(s.out_features * s.in_features, 11));
  std::vector<double> b = ToDouble(RandomVector(s.out_features, 12));
  const std::vector<double> wy = ToDouble(RandomVector(s.rows * s.out_features, 13));
  auto loss = [&]() {
    auto y = LinearFwdRef(s, x, w, b);
    EXPECT_TRUE(y.ok());
    double l = 0;
    for (size_t i = 0; i < wy.size(); ++i) l += wy[i] * (*y)[i];
    return l;
  };
  auto fd = [&](std::vector<double>& v) {
    return testing::FiniteDifferenceGradient(v, loss, kStep);
  };
  ASSERT_OK_AND_ASSIGN(LinearBwdRefResult g, LinearBwdRef(s, wy, x, w));
  EXPECT_TRUE(AllClose(g.dx, fd(x), 1e-8, 1e-6)) << "dx";
  EXPECT_TRUE(AllClose(g.dweight, fd(w), 1e-8, 1e-6)) << "dweight";
  EXPECT_TRUE(AllClose(g.dbias, fd(b), 1e-8, 1e-6)) << "dbias";
}

TEST(GemmCpuTest, RejectsBadArguments) {
  std::vector<float> buf(64);
  GemmArgs g;
  g.m = 4;
  g.n = 4;
  g.k = 4;
  g.a = g.b = buf.data();
  g.c = buf.data();
  g.lda = 3;  // < k
  g.ldb = 4;
  g.ldc = 4;
  EXPECT_THAT(GemmCpu(g), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lda")));
  g.lda = 4;
  g.trans_b = Trans::kYes;
  g.n = 5;  // B^T is [k, n]: B is [5, 4], ldb 4 fine; C needs ldc >= 5
  EXPECT_THAT(GemmCpu(g), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ldc")));
  g.n = 4;
  g.m = -1;
  EXPECT_THAT(GemmCpu(g), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("m must")));
  g.m = 4;
  g.c = nullptr;
  EXPECT_THAT(GemmCpu(g), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("c must")));
  g.c = buf.data();
  g.k = int64_t{1} << 33;
  EXPECT_THAT(GemmCpu(g), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("k =")));
  g.k = 4;
  EXPECT_THAT(GemmStridedBatchedCpu(g, GemmBatch{-2, 0, 0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch.count")));
  EXPECT_THAT(LinearFwdCpu({LinearShape{2, 3, 0}, buf.data(), buf.data(), nullptr, buf.data()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_features")));
  EXPECT_THAT(LinearBwdDataCpu({LinearShape{2, 3, 4}, buf.data(), nullptr, buf.data(), false}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight")));
}

TEST(BiasAddCpuTest, AddsPerColumn) {
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {10, 20, 30};
  ASSERT_OK(BiasAddCpu({2, 3, b.data(), y.data()}));
  EXPECT_THAT(y, ::testing::ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST(BiasGradCpuTest, ColumnSumsAndAccumulate) {
  constexpr int64_t kRows = 71, kCols = 229;
  const std::vector<float> dy = RandomVector(kRows * kCols, 17);
  std::vector<double> want(kCols, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) want[c] += dy[r * kCols + c];
  }
  std::vector<float> db(kCols, 5.0f);
  ASSERT_OK(BiasGradCpu({kRows, kCols, dy.data(), db.data(), false}));
  EXPECT_TRUE(AllClose(db, want, 1e-5, 1e-5));
  ASSERT_OK(BiasGradCpu({kRows, kCols, dy.data(), db.data(), true}));
  for (double& v : want) v *= 2;
  EXPECT_TRUE(AllClose(db, want, 2e-5, 1e-5));
  EXPECT_THAT(BiasGradCpu({kRows, kCols, dy.data(), nullptr, false}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dbias")));
}

TEST(CpuBlasThreadsTest, SetAndGet) {
  const int before = CpuBlasThreads();
  SetCpuBlasThreads(1);
  EXPECT_EQ(CpuBlasThreads(), 1);
  SetCpuBlasThreads(before);
}

}  // namespace
}  // namespace spgate::kernels
