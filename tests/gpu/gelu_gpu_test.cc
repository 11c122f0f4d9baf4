// CUDA bias + GeLU against the double reference, fp32 and bf16 storage:
// forward on the 16-byte and scalar paths, backward dpre, and dbias checked
// first against the column sums of the GPU's own dpre (the reduction itself,
// tight) and then against the reference; dbias must be deterministic.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "kernels/gelu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using testing::AllClose;
using testing::BitwiseEqual;
using testing::GpuTest;
using testing::kBf16Rtol;
using testing::Load;
using testing::RandomVector;
using testing::Store;
using testing::ToDouble;

struct GeluGpuCase {
  std::string name;
  int64_t rows, cols;
  bool bias;
};
void PrintTo(const GeluGpuCase& c, std::ostream* os) { *os << c.name; }

class GeluGpuTest : public GpuTest, public ::testing::WithParamInterface<GeluGpuCase> {
 protected:
  template <typename T>
  void Run();
};

template <typename T>
void GeluGpuTest::Run() {
  const GeluGpuCase& c = GetParam();
  constexpr bool kFp32 = std::is_same_v<T, float>;
  const double rtol = kFp32 ? 1e-5 : kBf16Rtol;
  const int64_t n = c.rows * c.cols;
  const std::vector<T> pre = Store<T>(RandomVector(n, 1, -6.0f, 6.0f));
  const std::vector<float> bias = RandomVector(c.cols, 2);
  const std::vector<T> dy = Store<T>(RandomVector(n, 3));
  const std::vector<double> bias_d = c.bias ? ToDouble(bias) : std::vector<double>{};

  ASSERT_OK_AND_ASSIGN(auto d_pre, Upload(pre));
  ASSERT_OK_AND_ASSIGN(auto d_bias, Upload(bias));
  ASSERT_OK_AND_ASSIGN(auto d_y, DeviceBuffer<T>::Allocate(n));
  GeluFwdArgs<T> f;
  f.rows = c.rows;
  f.cols = c.cols;
  f.pre = d_pre.data();
  f.bias = c.bias ? d_bias.data() : nullptr;
  f.y = d_y.data();
  ASSERT_OK(GeluFwd(f, stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<T> y, Download(d_y));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_y,
                       GeluFwdRef(c.rows, c.cols, ToDouble(Load(pre)), bias_d));
  EXPECT_TRUE(AllClose(Load(y), want_y, 1e-6, rtol)) << "y";

  ASSERT_OK_AND_ASSIGN(auto d_dy, Upload(dy));
  ASSERT_OK_AND_ASSIGN(auto d_dpre, DeviceBuffer<T>::Allocate(n));
  ASSERT_OK_AND_ASSIGN(auto d_dbias, DeviceBuffer<float>::Allocate(c.cols));
  ASSERT_OK_AND_ASSIGN(auto d_ws, DeviceAllocation::Allocate(GeluBwdWorkspaceBytes(c.rows, c.cols)));
  GeluBwdArgs<T> b;
  b.rows = c.rows;
  b.cols = c.cols;
  b.dy = d_dy.data();
  b.pre = d_pre.data();
  b.bias = f.bias;
  b.dpre = d_dpre.data();
  b.dbias = c.bias ? d_dbias.data() : nullptr;
  ASSERT_OK(GeluBwd(b, d_ws.data(), d_ws.bytes(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<T> dpre, Download(d_dpre));
  ASSERT_OK_AND_ASSIGN(GeluBwdRefResult want,
                       GeluBwdRef(c.rows, c.cols, ToDouble(Load(dy)), ToDouble(Load(pre)), bias_d));
  EXPECT_TRUE(AllClose(Load(dpre), want.dpre, 1e-6, rtol)) << "dpre";
  if (!c.bias) return;

  ASSERT_OK_AND_ASSIGN(std::vector<float> dbias, Download(d_dbias));
  // The reduction: column sums of exactly what the GPU stored.
  const std::vector<float> dpre_f = Load(dpre);
  std::vector<double> colsum(c.cols, 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.cols; ++j) colsum[j] += dpre_f[r * c.cols + j];
  }
  const double sum_tol = 1e-6 * std::sqrt(static_cast<double>(c.rows) + 1);
  EXPECT_TRUE(AllClose(dbias, colsum, sum_tol, 1e-6)) << "dbias vs sum of GPU dpre";
  // bf16: each stored dpre carries its own rounding, so the sum's error grows
  // like sqrt(rows) bf16 roundings.
  const double ref_tol = (kFp32 ? 2e-5 : kBf16Rtol) * std::sqrt(c.rows + 1.0);
  EXPECT_TRUE(AllClose(dbias, want.dbias, ref_tol, rtol)) << "dbias vs reference";
  ASSERT_OK(GeluBwd(b, d_ws.data(), d_ws.bytes(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> dbias2, Download(d_dbias));
  EXPECT_TRUE(BitwiseEqual(dbias2, dbias)) << "dbias must be deterministic";
}

TEST_P(GeluGpuTest, Fp32MatchesReference) { Run<float>(); }
TEST_P(GeluGpuTest, Bf16MatchesReference) { Run<Bfloat16>(); }

INSTANTIATE_TEST_SUITE_P(Shapes, GeluGpuTest,
                         ::testing::Values(GeluGpuCase{"r71_c229_bias", 71, 229, true},
                                           GeluGpuCase{"r71_c229_plain", 71, 229, false},
                                           GeluGpuCase{"r1_c1", 1, 1, true},
                                           GeluGpuCase{"r1000_c3", 1000, 3, true},
                                           GeluGpuCase{"r4099_c1024", 4099, 1024, true},
                                           GeluGpuCase{"r0_c5", 0, 5, true}),
                         [](const ::testing::TestParamInfo<GeluGpuCase>& i) {
                           return i.param.name;
                         });

}  // namespace
}  // namespace spgate::kernels
