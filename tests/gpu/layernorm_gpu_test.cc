// CUDA residual-add + LayerNorm against the double reference, fp32 and bf16
// storage, TransformerEngine style: the statistics (mean, rstd) first with a
// tight tolerance, then y computed on the host from the GPU's own statistics,
// then backward from the GPU's own saved tensors. Shapes cover the scalar
// (odd hidden, misaligned pointers) and the 16-byte paths, the forward plans
// on both sides of its 512-thread cap, the 32768 limit, and backward
// determinism (two runs, same bits).
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "kernels/layernorm.h"
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

struct LnGpuCase {
  std::string name;
  int64_t rows;
  int64_t hidden;
  bool residual;
  int64_t offset;  // elements added to every activation pointer (misalignment)
};
void PrintTo(const LnGpuCase& c, std::ostream* os) { *os << c.name; }

// A device copy of `host` starting `off` elements into its allocation.
template <typename T>
struct OffsetBuffer {
  DeviceBuffer<T> buf;
  int64_t off = 0;
  T* get() { return buf.data() + off; }
};

template <typename T>
absl::StatusOr<OffsetBuffer<T>> UploadAt(const std::vector<T>& host, int64_t off,
                                         cudaStream_t stream) {
  std::vector<T> padded(off, T{});
  padded.insert(padded.end(), host.begin(), host.end());
  auto b = DeviceBuffer<T>::FromHost(padded, stream);
  if (!b.ok()) return b.status();
  return OffsetBuffer<T>{std::move(b).value(), off};
}

template <typename T>
absl::StatusOr<std::vector<T>> DownloadAt(const OffsetBuffer<T>& d, cudaStream_t stream) {
  auto h = d.buf.ToHost(stream);
  if (!h.ok()) return h.status();
  return std::vector<T>(h->begin() + d.off, h->end());
}

class LayerNormGpuTest : public GpuTest, public ::testing::WithParamInterface<LnGpuCase> {
 protected:
  template <typename T>
  void Run();
};

template <typename T>
void LayerNormGpuTest::Run() {
  const LnGpuCase& c = GetParam();
  constexpr bool kFp32 = std::is_same_v<T, float>;
  const double out_rtol = kFp32 ? 1e-5 : kBf16Rtol;
  const double out_atol = kFp32 ? 1e-5 : 1e-4;
  const int64_t n = c.rows * c.hidden;

  // Stored inputs (bf16-rounded for bf16) and the floats they hold.
  const std::vector<T> x = Store<T>(RandomVector(n, 1, 2.0f, 8.0f));
  const std::vector<T> res = Store<T>(RandomVector(n, 2));
  const std::vector<float> gamma = RandomVector(c.hidden, 3, 0.5f, 1.5f);
  const std::vector<float> beta = RandomVector(c.hidden, 4, -0.5f, 0.5f);
  const std::vector<T> dy = Store<T>(RandomVector(n, 5));
  const std::vector<T> dres = Store<T>(RandomVector(n, 6));

  ASSERT_OK_AND_ASSIGN(auto d_x, UploadAt(x, c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_res, UploadAt(res, c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_gamma, Upload(gamma));
  ASSERT_OK_AND_ASSIGN(auto d_beta, Upload(beta));
  ASSERT_OK_AND_ASSIGN(auto d_sum, UploadAt(std::vector<T>(n), c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_y, UploadAt(std::vector<T>(n), c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_mean, DeviceBuffer<float>::Allocate(c.rows));
  ASSERT_OK_AND_ASSIGN(auto d_rstd, DeviceBuffer<float>::Allocate(c.rows));

  LayerNormFwdArgs<T> f;
  f.rows = c.rows;
  f.hidden = c.hidden;
  f.x = d_x.get();
  f.residual = c.residual ? d_res.get() : nullptr;
  f.gamma = d_gamma.data();
  f.beta = d_beta.data();
  f.residual_out = c.residual ? d_sum.get() : nullptr;
  f.y = d_y.get();
  f.mean = d_mean.data();
  f.rstd = d_rstd.data();
  ASSERT_OK(LayerNormFwd(f, stream_));

  ASSERT_OK_AND_ASSIGN(std::vector<T> sum, DownloadAt(d_sum, stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<T> y, DownloadAt(d_y, stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> mean, Download(d_mean));
  ASSERT_OK_AND_ASSIGN(std::vector<float> rstd, Download(d_rstd));

  // The LayerNorm input: x + residual, summed in fp32 and stored as T.
  std::vector<float> s = Load(x);
  if (c.residual) {
    const std::vector<float> xf = Load(x), rf = Load(res);
    std::vector<float> want_sum(n);
    for (int64_t i = 0; i < n; ++i) want_sum[i] = xf[i] + rf[i];
    EXPECT_TRUE(BitwiseEqual(Load(sum), Load(Store<T>(want_sum)))) << "residual_out";
    s = Load(sum);
  }

  // 1. Statistics, tight.
  ASSERT_OK_AND_ASSIGN(LayerNormFwdRefResult ref,
                       LayerNormFwdRef(c.rows, c.hidden, 1e-5, ToDouble(s), {}, ToDouble(gamma),
                                       ToDouble(beta)));
  EXPECT_TRUE(AllClose(mean, ref.mean, 1e-6, 2e-6)) << "mean";
  EXPECT_TRUE(AllClose(rstd, ref.rstd, 0, 2e-5)) << "rstd";

  // 2. Outputs from the GPU's own statistics.
  std::vector<double> want_y(n);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.hidden; ++j) {
      const int64_t i = r * c.hidden + j;
      want_y[i] = (s[i] - static_cast<double>(mean[r])) * rstd[r] * gamma[j] + beta[j];
    }
  }
  EXPECT_TRUE(AllClose(Load(y), want_y, out_atol, out_rtol)) << "y";

  // 3. Backward from the GPU's saved tensors, twice (determinism).
  ASSERT_OK_AND_ASSIGN(auto d_dy, UploadAt(dy, c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_dres, UploadAt(dres, c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_dx, UploadAt(std::vector<T>(n), c.offset, stream_));
  ASSERT_OK_AND_ASSIGN(auto d_dg, DeviceBuffer<float>::Allocate(c.hidden));
  ASSERT_OK_AND_ASSIGN(auto d_db, DeviceBuffer<float>::Allocate(c.hidden));
  ASSERT_OK_AND_ASSIGN(auto d_ws, DeviceAllocation::Allocate(
                                      LayerNormBwdWorkspaceBytes(c.rows, c.hidden)));
  LayerNormBwdArgs<T> b;
  b.rows = c.rows;
  b.hidden = c.hidden;
  b.dy = d_dy.get();
  b.x = c.residual ? d_sum.get() : d_x.get();
  b.gamma = d_gamma.data();
  b.mean = d_mean.data();
  b.rstd = d_rstd.data();
  b.dresidual = c.residual ? d_dres.get() : nullptr;
  b.dx = d_dx.get();
  b.dgamma = d_dg.data();
  b.dbeta = d_db.data();
  ASSERT_OK(LayerNormBwd(b, d_ws.data(), d_ws.bytes(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<T> dx, DownloadAt(d_dx, stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> dg, Download(d_dg));
  ASSERT_OK_AND_ASSIGN(std::vector<float> db, Download(d_db));

  ASSERT_OK_AND_ASSIGN(
      LayerNormBwdRefResult want,
      LayerNormBwdRef(c.rows, c.hidden, ToDouble(Load(dy)), ToDouble(s), ToDouble(gamma),
                      ToDouble(mean), ToDouble(rstd),
                      c.residual ? ToDouble(Load(dres)) : std::vector<double>{}));
  EXPECT_TRUE(AllClose(Load(dx), want.dx, kFp32 ? 5e-5 : 1e-4, kFp32 ? 5e-5 : kBf16Rtol))
      << "dx";
  const double sum_tol = 2e-5 * std::sqrt(static_cast<double>(c.rows) + 1);
  EXPECT_TRUE(AllClose(dg, want.dgamma, sum_tol, 1e-5)) << "dgamma";
  EXPECT_TRUE(AllClose(db, want.dbeta, sum_tol, 1e-5)) << "dbeta";

  ASSERT_OK(LayerNormBwd(b, d_ws.data(), d_ws.bytes(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> dg2, Download(d_dg));
  EXPECT_TRUE(BitwiseEqual(dg2, dg)) << "dgamma must be run-to-run deterministic";

  // Accumulation adds onto what is there.
  b.accumulate_param_grads = true;
  ASSERT_OK(LayerNormBwd(b, d_ws.data(), d_ws.bytes(), stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> db2, Download(d_db));
  std::vector<double> twice(want.dbeta);
  for (double& v : twice) v *= 2;
  EXPECT_TRUE(AllClose(db2, twice, 2 * sum_tol, 1e-5)) << "dbeta accumulated";
}

TEST_P(LayerNormGpuTest, Fp32MatchesReference) { Run<float>(); }
TEST_P(LayerNormGpuTest, Bf16MatchesReference) { Run<Bfloat16>(); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, LayerNormGpuTest,
    ::testing::Values(LnGpuCase{"r71_h229_residual", 71, 229, true, 0},
                      LnGpuCase{"r71_h229_plain", 71, 229, false, 0},
                      LnGpuCase{"r1_h1", 1, 1, true, 0},
                      LnGpuCase{"r4_h4096", 4, 4096, true, 0},
                      LnGpuCase{"r4_h4096_misaligned", 4, 4096, true, 1},
                      LnGpuCase{"r1000_h768", 1000, 768, true, 0},
                      LnGpuCase{"r2048_h1024_plain", 2048, 1024, false, 0},
                      // Forward's capped plans (512 threads, 16 per thread) and the
                      // first rows past them, aligned and on the scalar path.
                      LnGpuCase{"r5_h8192", 5, 8192, true, 0},
                      LnGpuCase{"r5_h8192_misaligned", 5, 8192, true, 1},
                      LnGpuCase{"r3_h16384", 3, 16384, true, 0},
                      LnGpuCase{"r3_h16384_misaligned", 3, 16384, true, 1},
                      LnGpuCase{"r3_h32768", 3, 32768, true, 0},
                      LnGpuCase{"r2_h32767_scalar", 2, 32767, true, 0},
                      LnGpuCase{"r0_h8", 0, 8, true, 0}),
    [](const ::testing::TestParamInfo<LnGpuCase>& i) { return i.param.name; });

// Row shard on the GPU: same bits as the full batch's rows.
class LayerNormGpuShardTest : public GpuTest {};

TEST_F(LayerNormGpuShardTest, ShardEqualsShardOfFull) {
  constexpr int64_t kRows = 96, kHidden = 1024, kShard0 = 40, kShardRows = 33;
  const std::vector<float> x = RandomVector(kRows * kHidden, 7, 2.0f, 8.0f);
  const std::vector<float> gamma = RandomVector(kHidden, 8, 0.5f, 1.5f);
  const std::vector<float> beta = RandomVector(kHidden, 9);
  ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x));
  ASSERT_OK_AND_ASSIGN(auto d_g, Upload(gamma));
  ASSERT_OK_AND_ASSIGN(auto d_b, Upload(beta));
  ASSERT_OK_AND_ASSIGN(auto d_y, DeviceBuffer<float>::Allocate(kRows * kHidden));
  ASSERT_OK_AND_ASSIGN(auto d_ys, DeviceBuffer<float>::Allocate(kShardRows * kHidden));
  ASSERT_OK_AND_ASSIGN(auto d_m, DeviceBuffer<float>::Allocate(kRows));
  ASSERT_OK_AND_ASSIGN(auto d_r, DeviceBuffer<float>::Allocate(kRows));
  LayerNormFwdArgs<float> f;
  f.rows = kRows;
  f.hidden = kHidden;
  f.x = d_x.data();
  f.gamma = d_g.data();
  f.beta = d_b.data();
  f.y = d_y.data();
  f.mean = d_m.data();
  f.rstd = d_r.data();
  ASSERT_OK(LayerNormFwd(f, stream_));
  f.rows = kShardRows;
  f.x = d_x.data() + kShard0 * kHidden;
  f.y = d_ys.data();
  ASSERT_OK(LayerNormFwd(f, stream_));
  ASSERT_OK_AND_ASSIGN(std::vector<float> full, Download(d_y));
  ASSERT_OK_AND_ASSIGN(std::vector<float> shard, Download(d_ys));
  EXPECT_TRUE(BitwiseEqual(
      shard, absl::MakeConstSpan(full).subspan(kShard0 * kHidden, kShardRows * kHidden)));
}

}  // namespace
}  // namespace spgate::kernels
