// Residual-add + LayerNorm on the CPU: the production path against the double
// reference on awkward shapes (forward, backward, gradient accumulation), the
// reference backward against central finite differences in double, and the
// property sequence parallelism rests on: LayerNorm of a row shard is bitwise
// the shard of the full LayerNorm, and the shards' dgamma/dbeta add up to the
// full ones.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/layernorm.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;
using testing::AllClose;
using testing::BitwiseEqual;
using testing::RandomVector;
using testing::ToDouble;

struct LnCase {
  std::string name;
  int64_t rows;
  int64_t hidden;
  bool residual;
};

void PrintTo(const LnCase& c, std::ostream* os) { *os << c.name; }

// Inputs with a large common offset, so a one-pass variance would cancel.
struct LnInputs {
  std::vector<float> x, residual, gamma, beta, dy, dresidual;
};

LnInputs MakeInputs(int64_t rows, int64_t hidden, uint32_t seed) {
  LnInputs in;
  in.x = RandomVector(rows * hidden, seed, 2.0f, 8.0f);
  in.residual = RandomVector(rows * hidden, seed + 1);
  in.gamma = RandomVector(hidden, seed + 2, 0.5f, 1.5f);
  in.beta = RandomVector(hidden, seed + 3, -0.5f, 0.5f);
  in.dy = RandomVector(rows * hidden, seed + 4);
  in.dresidual = RandomVector(rows * hidden, seed + 5);
  return in;
}

struct LnOutputs {
  std::vector<float> residual_out, y, mean, rstd;
};

absl::StatusOr<LnOutputs> RunFwdCpu(int64_t rows, int64_t hidden, bool residual,
                                    const LnInputs& in) {
  LnOutputs out;
  out.residual_out.resize(rows * hidden);
  out.y.resize(rows * hidden);
  out.mean.resize(rows);
  out.rstd.resize(rows);
  LayerNormFwdArgs<float> a;
  a.rows = rows;
  a.hidden = hidden;
  a.x = in.x.data();
  a.residual = residual ? in.residual.data() : nullptr;
  a.gamma = in.gamma.data();
  a.beta = in.beta.data();
  a.residual_out = residual ? out.residual_out.data() : nullptr;
  a.y = out.y.data();
  a.mean = out.mean.data();
  a.rstd = out.rstd.data();
  absl::Status s = LayerNormFwdCpu(a);
  if (!s.ok()) return s;
  if (!residual) out.residual_out = in.x;
  return out;
}

class LayerNormCpuTest : public ::testing::TestWithParam<LnCase> {};

TEST_P(LayerNormCpuTest, ForwardMatchesReference) {
  const LnCase& c = GetParam();
  const LnInputs in = MakeInputs(c.rows, c.hidden, 11);
  ASSERT_OK_AND_ASSIGN(LnOutputs got, RunFwdCpu(c.rows, c.hidden, c.residual, in));
  ASSERT_OK_AND_ASSIGN(
      LayerNormFwdRefResult want,
      LayerNormFwdRef(c.rows, c.hidden, 1e-5, ToDouble(in.x),
                      c.residual ? ToDouble(in.residual) : std::vector<double>{},
                      ToDouble(in.gamma), ToDouble(in.beta)));
  // Statistics first (tight), then outputs.
  EXPECT_TRUE(AllClose(got.mean, want.mean, 1e-6, 1e-6)) << "mean";
  EXPECT_TRUE(AllClose(got.rstd, want.rstd, 0, 2e-5)) << "rstd";
  EXPECT_TRUE(AllClose(got.residual_out, want.residual_out, 0, 1.2e-7)) << "residual_out";
  EXPECT_TRUE(AllClose(got.y, want.y, 2e-5, 2e-5)) << "y";
}

TEST_P(LayerNormCpuTest, BackwardMatchesReference) {
  const LnCase& c = GetParam();
  const LnInputs in = MakeInputs(c.rows, c.hidden, 23);
  ASSERT_OK_AND_ASSIGN(LnOutputs fwd, RunFwdCpu(c.rows, c.hidden, c.residual, in));

  std::vector<float> dx(c.rows * c.hidden), dgamma(c.hidden, 123.0f), dbeta(c.hidden, 123.0f);
  LayerNormBwdArgs<float> b;
  b.rows = c.rows;
  b.hidden = c.hidden;
  b.dy = in.dy.data();
  b.x = fwd.residual_out.data();
  b.gamma = in.gamma.data();
  b.mean = fwd.mean.data();
  b.rstd = fwd.rstd.data();
  b.dresidual = c.residual ? in.dresidual.data() : nullptr;
  b.dx = dx.data();
  b.dgamma = dgamma.data();
  b.dbeta = dbeta.data();
  ASSERT_OK(LayerNormBwdCpu(b));

  ASSERT_OK_AND_ASSIGN(
      LayerNormBwdRefResult want,
      LayerNormBwdRef(c.rows, c.hidden, ToDouble(in.dy), ToDouble(fwd.residual_out),
                      ToDouble(in.gamma), ToDouble(fwd.mean), ToDouble(fwd.rstd),
                      c.residual ? ToDouble(in.dresidual) : std::vector<double>{}));
  EXPECT_TRUE(AllClose(dx, want.dx, 5e-5, 5e-5)) << "dx";
  // Row sums in float: tolerance grows with sqrt(rows).
  const double sum_tol = 2e-5 * std::sqrt(static_cast<double>(c.rows) + 1);
  EXPECT_TRUE(AllClose(dgamma, want.dgamma, sum_tol, 1e-5)) << "dgamma";
  EXPECT_TRUE(AllClose(dbeta, want.dbeta, sum_tol, 1e-5)) << "dbeta";

  // accumulate_param_grads adds to what is there.
  b.accumulate_param_grads = true;
  ASSERT_OK(LayerNormBwdCpu(b));
  std::vector<double> twice_g(want.dgamma), twice_b(want.dbeta);
  for (double& v : twice_g) v *= 2;
  for (double& v : twice_b) v *= 2;
  EXPECT_TRUE(AllClose(dgamma, twice_g, 2 * sum_tol, 1e-5)) << "dgamma accumulated";
  EXPECT_TRUE(AllClose(dbeta, twice_b, 2 * sum_tol, 1e-5)) << "dbeta accumulated";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LayerNormCpuTest,
    ::testing::Values(LnCase{"r71_h229_residual", 71, 229, true},
                      LnCase{"r71_h229_plain", 71, 229, false},
                      LnCase{"r1_h1", 1, 1, true},
                      LnCase{"r1_h4096", 1, 4096, true},
                      LnCase{"r257_h64", 257, 64, true},
                      LnCase{"r16_h1023_plain", 16, 1023, false},
                      LnCase{"r3_h32768", 3, 32768, true},
                      LnCase{"r0_h8", 0, 8, true}),
    [](const ::testing::TestParamInfo<LnCase>& i) { return i.param.name; });

// Loss = sum(wy * y) + sum(wr * residual_out); its gradients by the reference
// backward (dy = wy, dresidual = wr) against central differences, in double.
TEST(LayerNormRefTest, BackwardMatchesFiniteDifferences) {
  constexpr int64_t kRows = 3, kHidden = 7;
  constexpr double kEps = 1e-5, kStep = 1e-6;
  std::vector<double> x = ToDouble(RandomVector(kRows * kHidden, 1, -2, 2));
  std::vector<double> res = ToDouble(RandomVector(kRows * kHidden, 2));
  std::vector<double> gamma = ToDouble(RandomVector(kHidden, 3, 0.5, 1.5));
  std::vector<double> beta = ToDouble(RandomVector(kHidden, 4));
  const std::vector<double> wy = ToDouble(RandomVector(kRows * kHidden, 5));
  const std::vector<double> wr = ToDouble(RandomVector(kRows * kHidden, 6));

  auto loss = [&]() {
    auto f = LayerNormFwdRef(kRows, kHidden, kEps, x, res, gamma, beta);
    EXPECT_TRUE(f.ok());
    double l = 0;
    for (size_t i = 0; i < wy.size(); ++i) l += wy[i] * f->y[i] + wr[i] * f->residual_out[i];
    return l;
  };

  ASSERT_OK_AND_ASSIGN(LayerNormFwdRefResult f,
                       LayerNormFwdRef(kRows, kHidden, kEps, x, res, gamma, beta));
  ASSERT_OK_AND_ASSIGN(LayerNormBwdRefResult g,
                       LayerNormBwdRef(kRows, kHidden, wy, f.residual_out, gamma, f.mean,
                                       f.rstd, wr));
  const std::vector<double> fd_x = testing::FiniteDifferenceGradient(x, loss, kStep);
  const std::vector<double> fd_res = testing::FiniteDifferenceGradient(res, loss, kStep);
  const std::vector<double> fd_gamma = testing::FiniteDifferenceGradient(gamma, loss, kStep);
  const std::vector<double> fd_beta = testing::FiniteDifferenceGradient(beta, loss, kStep);
  // dx is the gradient of both addends of the residual sum.
  EXPECT_TRUE(AllClose(g.dx, fd_x, 1e-7, 1e-6)) << "dx vs d/dx";
  EXPECT_TRUE(AllClose(g.dx, fd_res, 1e-7, 1e-6)) << "dx vs d/dresidual";
  EXPECT_TRUE(AllClose(g.dgamma, fd_gamma, 1e-7, 1e-6)) << "dgamma";
  EXPECT_TRUE(AllClose(g.dbeta, fd_beta, 1e-7, 1e-6)) << "dbeta";
}

// Sequence parallelism keeps LayerNorm inside the shard: each rank normalises
// its own rows. That is exact, not approximate: the shard's rows are bitwise
// the full batch's rows, and the per-shard parameter gradients sum (over the
// TP group, in the worker) to the full gradient.
TEST(LayerNormCpuTest, ShardEqualsShardOfFullLayerNorm) {
  constexpr int64_t kRows = 64, kHidden = 96;
  const LnInputs in = MakeInputs(kRows, kHidden, 99);
  ASSERT_OK_AND_ASSIGN(LnOutputs full, RunFwdCpu(kRows, kHidden, true, in));
  std::vector<float> full_dx(kRows * kHidden), full_dg(kHidden), full_db(kHidden);
  {
    LayerNormBwdArgs<float> b;
    b.rows = kRows;
    b.hidden = kHidden;
    b.dy = in.dy.data();
    b.x = full.residual_out.data();
    b.gamma = in.gamma.data();
    b.mean = full.mean.data();
    b.rstd = full.rstd.data();
    b.dresidual = in.dresidual.data();
    b.dx = full_dx.data();
    b.dgamma = full_dg.data();
    b.dbeta = full_db.data();
    ASSERT_OK(LayerNormBwdCpu(b));
  }

  // Uneven shards, one of them empty (a rank with no tokens of this batch).
  const std::vector<int64_t> cuts = {0, 10, 33, 33, 64};
  std::vector<float> sum_dg(kHidden, 0.0f), sum_db(kHidden, 0.0f);
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    const int64_t r0 = cuts[s], n = cuts[s + 1] - cuts[s];
    const int64_t e0 = r0 * kHidden, e1 = (r0 + n) * kHidden;
    LnInputs shard = in;
    shard.x.assign(in.x.begin() + e0, in.x.begin() + e1);
    shard.residual.assign(in.residual.begin() + e0, in.residual.begin() + e1);
    ASSERT_OK_AND_ASSIGN(LnOutputs part, RunFwdCpu(n, kHidden, true, shard));
    auto slice = [&](const std::vector<float>& v, int64_t a, int64_t b) {
      return absl::MakeConstSpan(v.data() + a, b - a);
    };
    EXPECT_TRUE(BitwiseEqual(part.y, slice(full.y, e0, e1))) << "shard " << s << " y";
    EXPECT_TRUE(BitwiseEqual(part.residual_out, slice(full.residual_out, e0, e1)))
        << "shard " << s << " residual_out";
    EXPECT_TRUE(BitwiseEqual(part.mean, slice(full.mean, r0, r0 + n))) << "shard " << s;
    EXPECT_TRUE(BitwiseEqual(part.rstd, slice(full.rstd, r0, r0 + n))) << "shard " << s;

    std::vector<float> dx(n * kHidden), dg(kHidden), db(kHidden);
    LayerNormBwdArgs<float> b;
    b.rows = n;
    b.hidden = kHidden;
    b.dy = in.dy.data() + e0;
    b.x = part.residual_out.data();
    b.gamma = in.gamma.data();
    b.mean = part.mean.data();
    b.rstd = part.rstd.data();
    b.dresidual = in.dresidual.data() + e0;
    b.dx = dx.data();
    b.dgamma = dg.data();
    b.dbeta = db.data();
    ASSERT_OK(LayerNormBwdCpu(b));
    EXPECT_TRUE(BitwiseEqual(dx, slice(full_dx, e0, e1))) << "shard " << s << " dx";
    for (int64_t j = 0; j < kHidden; ++j) {
      sum_dg[j] += dg[j];
      sum_db[j] += db[j];
    }
  }
  EXPECT_TRUE(AllClose(sum_dg, ToDouble(full_dg), 1e-5, 1e-5)) << "sum of shard dgamma";
  EXPECT_TRUE(AllClose(sum_db, ToDouble(full_db), 1e-5, 1e-5)) << "sum of shard dbeta";
}

// Outputs of 16 MiB and more are streamed past the cache (non-temporal
// stores); the values must be bitwise those of the cached path, which small
// shards of the same rows take. The output pointers are offset by one float so
// the streaming store's unaligned head is exercised too.
TEST(LayerNormCpuTest, StreamedLargeOutputsEqualCachedPath) {
  constexpr int64_t kRows = 1024, kHidden = 4096, kShard = 8;
  const LnInputs in = MakeInputs(kRows, kHidden, 31);
  const int64_t n = kRows * kHidden;
  std::vector<float> sum(n + 1), y(n + 1), mean(kRows), rstd(kRows);
  LayerNormFwdArgs<float> f;
  f.rows = kRows;
  f.hidden = kHidden;
  f.x = in.x.data();
  f.residual = in.residual.data();
  f.gamma = in.gamma.data();
  f.beta = in.beta.data();
  f.residual_out = sum.data() + 1;
  f.y = y.data() + 1;
  f.mean = mean.data();
  f.rstd = rstd.data();
  ASSERT_OK(LayerNormFwdCpu(f));
  std::vector<float> dx(n + 1), dg(kHidden), db(kHidden);
  LayerNormBwdArgs<float> b;
  b.rows = kRows;
  b.hidden = kHidden;
  b.dy = in.dy.data();
  b.x = sum.data() + 1;
  b.gamma = in.gamma.data();
  b.mean = mean.data();
  b.rstd = rstd.data();
  b.dresidual = in.dresidual.data();
  b.dx = dx.data() + 1;
  b.dgamma = dg.data();
  b.dbeta = db.data();
  ASSERT_OK(LayerNormBwdCpu(b));

  for (int64_t r0 : {int64_t{0}, kRows / 2 + 3, kRows - kShard}) {
    const int64_t e0 = r0 * kHidden, m = kShard * kHidden;
    std::vector<float> s_sum(m), s_y(m), s_mean(kShard), s_rstd(kShard), s_dx(m), s_dg(kHidden),
        s_db(kHidden);
    LayerNormFwdArgs<float> sf = f;
    sf.rows = kShard;
    sf.x = in.x.data() + e0;
    sf.residual = in.residual.data() + e0;
    sf.residual_out = s_sum.data();
    sf.y = s_y.data();
    sf.mean = s_mean.data();
    sf.rstd = s_rstd.data();
    ASSERT_OK(LayerNormFwdCpu(sf));
    LayerNormBwdArgs<float> sb = b;
    sb.rows = kShard;
    sb.dy = in.dy.data() + e0;
    sb.x = s_sum.data();
    sb.mean = s_mean.data();
    sb.rstd = s_rstd.data();
    sb.dresidual = in.dresidual.data() + e0;
    sb.dx = s_dx.data();
    sb.dgamma = s_dg.data();
    sb.dbeta = s_db.data();
    ASSERT_OK(LayerNormBwdCpu(sb));
    EXPECT_TRUE(BitwiseEqual(s_sum, absl::MakeConstSpan(sum).subspan(1 + e0, m))) << r0;
    EXPECT_TRUE(BitwiseEqual(s_y, absl::MakeConstSpan(y).subspan(1 + e0, m))) << r0;
    EXPECT_TRUE(BitwiseEqual(s_dx, absl::MakeConstSpan(dx).subspan(1 + e0, m))) << r0;
  }
  // And a sample of rows against the reference.
  const int64_t m = 4 * kHidden;
  ASSERT_OK_AND_ASSIGN(
      LayerNormFwdRefResult want,
      LayerNormFwdRef(4, kHidden, 1e-5, ToDouble(absl::MakeConstSpan(in.x).subspan(0, m)),
                      ToDouble(absl::MakeConstSpan(in.residual).subspan(0, m)),
                      ToDouble(in.gamma), ToDouble(in.beta)));
  EXPECT_TRUE(AllClose(std::vector<float>(y.begin() + 1, y.begin() + 1 + m), want.y, 2e-5, 2e-5));
}

TEST(LayerNormCpuTest, ResidualOutMayAliasX) {
  constexpr int64_t kRows = 5, kHidden = 33;
  const LnInputs in = MakeInputs(kRows, kHidden, 7);
  ASSERT_OK_AND_ASSIGN(LnOutputs separate, RunFwdCpu(kRows, kHidden, true, in));
  std::vector<float> stream = in.x;  // updated in place
  std::vector<float> y(kRows * kHidden), mean(kRows), rstd(kRows);
  LayerNormFwdArgs<float> a;
  a.rows = kRows;
  a.hidden = kHidden;
  a.x = stream.data();
  a.residual = in.residual.data();
  a.gamma = in.gamma.data();
  a.beta = in.beta.data();
  a.residual_out = stream.data();
  a.y = y.data();
  a.mean = mean.data();
  a.rstd = rstd.data();
  ASSERT_OK(LayerNormFwdCpu(a));
  EXPECT_TRUE(BitwiseEqual(stream, separate.residual_out));
  EXPECT_TRUE(BitwiseEqual(y, separate.y));
}

TEST(LayerNormCpuTest, RejectsBadArguments) {
  std::vector<float> buf(64, 1.0f);
  LayerNormFwdArgs<float> a;
  a.rows = 2;
  a.hidden = 8;
  a.x = a.gamma = a.beta = buf.data();
  a.y = a.mean = a.rstd = buf.data();

  LayerNormFwdArgs<float> bad = a;
  bad.hidden = 0;
  EXPECT_THAT(LayerNormFwdCpu(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden")));
  bad = a;
  bad.rows = -1;
  EXPECT_THAT(LayerNormFwdCpu(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
  bad = a;
  bad.residual = buf.data();
  EXPECT_THAT(LayerNormFwdCpu(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("residual_out")));
  bad = a;
  bad.y = nullptr;
  EXPECT_THAT(LayerNormFwdCpu(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("y must not be null")));
  bad = a;
  bad.eps = std::nanf("");
  EXPECT_THAT(LayerNormFwdCpu(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps")));

  LayerNormBwdArgs<float> b;
  b.rows = 2;
  b.hidden = 8;
  b.dy = b.x = b.gamma = b.mean = b.rstd = buf.data();
  b.dx = buf.data();
  b.dbeta = buf.data();
  EXPECT_THAT(LayerNormBwdCpu(b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dgamma")));

  EXPECT_THAT(LayerNormFwdRef(2, 3, 1e-5, std::vector<double>(5), {}, std::vector<double>(3),
                              std::vector<double>(3))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x has 5 elements")));
}

TEST(LayerNormCpuTest, NoRowsIsANoOpThatStillZeroesParamGrads) {
  std::vector<float> dg(4, 5.0f), db(4, 5.0f), gamma(4, 1.0f);
  LayerNormBwdArgs<float> b;
  b.rows = 0;
  b.hidden = 4;
  b.gamma = gamma.data();
  b.dgamma = dg.data();
  b.dbeta = db.data();
  ASSERT_OK(LayerNormBwdCpu(b));
  EXPECT_THAT(dg, ::testing::Each(0.0f));
  EXPECT_THAT(db, ::testing::Each(0.0f));
}

TEST(LayerNormWorkspaceTest, SizesFollowTheBlockPlan) {
  EXPECT_EQ(LayerNormBwdWorkspaceBytes(0, 1024), 0u);
  EXPECT_EQ(LayerNormBwdWorkspaceBytes(10, 1024), 2u * 10 * 1024 * 4);
  // Capped at 512 blocks however many rows.
  EXPECT_EQ(LayerNormBwdWorkspaceBytes(1 << 20, 4096), 2u * 512 * 4096 * 4);
}

}  // namespace
}  // namespace spgate::kernels
