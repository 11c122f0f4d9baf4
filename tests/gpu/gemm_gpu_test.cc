// cuBLAS GEMM wrappers and Linear products against the double reference: the
// row-major <-> column-major mapping for every transpose combination with
// padded leading dimensions, strided batches, the Linear layer's three
// products with bias, accumulation and a deterministic dbias.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "kernels/gemm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/gemm_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using testing::AllClose;
using testing::BitwiseEqual;
using testing::GpuTest;
using testing::RandomVector;
using testing::ToDouble;

class GemmGpuTest : public GpuTest {};

TEST_F(GemmGpuTest, AllTransposesMatchReference) {
  constexpr int64_t kM = 71, kN = 229, kK = 13, kPad = 3;
  for (Trans ta : {Trans::kNo, Trans::kYes}) {
    for (Trans tb : {Trans::kNo, Trans::kYes}) {
      const bool tra = ta == Trans::kYes, trb = tb == Trans::kYes;
      const int64_t lda = (tra ? kM : kK) + kPad, ldb = (trb ? kK : kN) + kPad, ldc = kN + kPad;
      const std::vector<float> a = RandomVector((tra ? kK : kM) * lda, 1);
      const std::vector<float> b = RandomVector((trb ? kN : kK) * ldb, 2);
      const std::vector<float> c0 = RandomVector(kM * ldc, 3);
      ASSERT_OK_AND_ASSIGN(auto d_a, Upload(a));
      ASSERT_OK_AND_ASSIGN(auto d_b, Upload(b));
      ASSERT_OK_AND_ASSIGN(auto d_c, Upload(c0));
      GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.m = kM;
      g.n = kN;
      g.k = kK;
      g.alpha = 0.5f;
      g.a = d_a.data();
      g.lda = lda;
      g.b = d_b.data();
      g.ldb = ldb;
      g.beta = 1.5f;
      g.c = d_c.data();
      g.ldc = ldc;
      ASSERT_OK(Gemm(g, blas_.get(), stream_));
      ASSERT_OK_AND_ASSIGN(std::vector<float> c, Download(d_c));
      const std::vector<double> ad = ToDouble(a), bd = ToDouble(b), cd = ToDouble(c0);
      const GemmRefArgs r = testing::RefArgsLike(g, ad, bd, cd);
      ASSERT_OK_AND_ASSIGN(std::vector<double> want, GemmRef(r));
      std::vector<float> got(c.begin(), c.begin() + want.size());
      EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5)) << "ta=" << tra << " tb=" << trb;
    }
  }
}

TEST_F(GemmGpuTest, StridedBatchMatchesLoop) {
  constexpr int64_t kM = 7, kN = 5, kK = 3, kCount = 4;
  const int64_t lda = kCount * kK, ldb = kCount * kK;
  const std::vector<float> a = RandomVector(kM * lda, 4), b = RandomVector(kN * ldb, 5);
  ASSERT_OK_AND_ASSIGN(auto d_a, Upload(a));
  ASSERT_OK_AND_ASSIGN(auto d_b, Upload(b));
  ASSERT_OK_AND_ASSIGN(auto d_c, DeviceBuffer<float>::Allocate(kCount * kM * kN));
  GemmArgs g;
  g.trans_b = Trans::kYes;
  g.m = kM;
  g.n = kN;
  g.k = kK;
  g.a = d_a.data();
  g.lda = lda;
  g.b = d_b.data();
  g.ldb = ldb;
  g.c = d_c.data();
  g.ldc = kN;
  const GemmBatch batch{kCount, kK, kK, kM * kN};
  ASSERT_OK(GemmStridedBatched(g, batch, blas_.get(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> c, Download(d_c));
  testing::ExpectStridedBatchMatchesRef(g, batch, a, b, c);
}

TEST_F(GemmGpuTest, LinearMatchesReference) {
  const LinearShape s{1031, 229, 96};
  const std::vector<float> x = RandomVector(s.rows * s.in_features, 6);
  const std::vector<float> w = RandomVector(s.out_features * s.in_features, 7);
  const std::vector<float> bias = RandomVector(s.out_features, 8);
  const std::vector<float> dy = RandomVector(s.rows * s.out_features, 9);
  ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x));
  ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w));
  ASSERT_OK_AND_ASSIGN(auto d_bias, Upload(bias));
  ASSERT_OK_AND_ASSIGN(auto d_dy, Upload(dy));
  ASSERT_OK_AND_ASSIGN(auto d_y, DeviceBuffer<float>::Allocate(s.rows * s.out_features));
  ASSERT_OK_AND_ASSIGN(auto d_dx, DeviceBuffer<float>::Allocate(s.rows * s.in_features));
  ASSERT_OK_AND_ASSIGN(auto d_dw, DeviceBuffer<float>::Allocate(s.out_features * s.in_features));
  ASSERT_OK_AND_ASSIGN(auto d_db, DeviceBuffer<float>::Allocate(s.out_features));
  ASSERT_OK_AND_ASSIGN(auto d_ws, DeviceAllocation::Allocate(LinearBwdWeightWorkspaceBytes(s)));

  ASSERT_OK(LinearFwd({s, d_x.data(), d_w.data(), d_bias.data(), d_y.data()}, blas_.get(), stream_));
  ASSERT_OK(LinearBwdData({s, d_dy.data(), d_w.data(), d_dx.data(), false}, blas_.get(), stream_));
  const LinearBwdWeightArgs bw{s, d_dy.data(), d_x.data(), d_dw.data(), d_db.data(), false};
  ASSERT_OK(LinearBwdWeight(bw, d_ws.data(), d_ws.bytes(), blas_.get(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> y, Download(d_y));
  ASSERT_OK_AND_ASSIGN(std::vector<float> dx, Download(d_dx));
  ASSERT_OK_AND_ASSIGN(std::vector<float> dw, Download(d_dw));
  ASSERT_OK_AND_ASSIGN(std::vector<float> db, Download(d_db));

  ASSERT_OK_AND_ASSIGN(std::vector<double> want_y,
                       LinearFwdRef(s, ToDouble(x), ToDouble(w), ToDouble(bias)));
  ASSERT_OK_AND_ASSIGN(LinearBwdRefResult want,
                       LinearBwdRef(s, ToDouble(dy), ToDouble(x), ToDouble(w)));
  EXPECT_TRUE(AllClose(y, want_y, 1e-4, 1e-5)) << "y";
  EXPECT_TRUE(AllClose(dx, want.dx, 1e-4, 1e-5)) << "dx";
  EXPECT_TRUE(AllClose(dw, want.dweight, 5e-4, 1e-5)) << "dweight";
  EXPECT_TRUE(AllClose(db, want.dbias, 5e-4, 1e-5)) << "dbias";

  // Accumulate, and the bias gradient is deterministic.
  LinearBwdWeightArgs acc = bw;
  acc.accumulate = true;
  ASSERT_OK(LinearBwdWeight(acc, d_ws.data(), d_ws.bytes(), blas_.get(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> db2, Download(d_db));
  std::vector<float> twice(db);
  for (float& v : twice) v *= 2;  // exact: x + x == 2x in fp32
  EXPECT_TRUE(BitwiseEqual(db2, twice)) << "dbias accumulate / determinism";
}

TEST_F(GemmGpuTest, BiasGradMatchesColumnSums) {
  constexpr int64_t kRows = 4099, kCols = 229;
  const std::vector<float> dy = RandomVector(kRows * kCols, 16);
  std::vector<double> want(kCols, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) want[c] += dy[r * kCols + c];
  }
  ASSERT_OK_AND_ASSIGN(auto d_dy, Upload(dy));
  ASSERT_OK_AND_ASSIGN(auto d_db, DeviceBuffer<float>::Allocate(kCols));
  ASSERT_OK_AND_ASSIGN(auto d_ws, DeviceAllocation::Allocate(BiasGradWorkspaceBytes(kRows, kCols)));
  ASSERT_OK(BiasGrad({kRows, kCols, d_dy.data(), d_db.data(), false}, d_ws.data(), d_ws.bytes(),
                     stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> db, Download(d_db));
  EXPECT_TRUE(AllClose(db, want, 2e-5 * std::sqrt(kRows + 1.0), 1e-5));
}

TEST_F(GemmGpuTest, BiasAddAddsPerColumn) {
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {10, 20, 30};
  ASSERT_OK_AND_ASSIGN(auto d_y, Upload(y));
  ASSERT_OK_AND_ASSIGN(auto d_b, Upload(b));
  ASSERT_OK(BiasAdd({2, 3, d_b.data(), d_y.data()}, stream_));
  ASSERT_OK_AND_ASSIGN(y, Download(d_y));
  EXPECT_THAT(y, ::testing::ElementsAre(11, 22, 33, 14, 25, 36));
}

}  // namespace
}  // namespace spgate::kernels
