// CUDA causal packed-varlen attention (cuBLAS strided-batched over heads + the
// fused mask-softmax kernels) against the double reference: lse first (the
// softmax statistics), then out, then dqkv, on the same awkward batches as the
// CPU tests; then a larger batch against the CPU production path, and the
// packing property (each sequence's rows equal its solo run).
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/device_memory.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using testing::AllClose;
using testing::GpuTest;
using testing::RandomVector;
using testing::ToDouble;

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

struct AttnGpuCase {
  std::string name;
  std::vector<int64_t> lengths;
  int64_t heads, head_dim, query_block;
};
void PrintTo(const AttnGpuCase& c, std::ostream* os) { *os << c.name; }

struct AttnResult {
  std::vector<float> out, lse, dqkv;
};

class AttentionGpuTest : public GpuTest {
 protected:
  absl::StatusOr<AttnResult> RunGpu(const AttentionShape& shape, const std::vector<int64_t>& cu,
                                    const std::vector<float>& qkv,
                                    const std::vector<float>& dout) {
    const int64_t tokens = cu.back(), hd = shape.heads * shape.head_dim;
    const int64_t max_len = MaxSeqLen(cu);
    auto d_qkv = Upload(qkv);
    auto d_dout = Upload(dout);
    auto d_out = DeviceBuffer<float>::Allocate(tokens * hd);
    auto d_lse = DeviceBuffer<float>::Allocate(tokens * shape.heads);
    auto d_dqkv = DeviceBuffer<float>::Allocate(tokens * 3 * hd);
    auto d_ws = DeviceAllocation::Allocate(AttentionBwdWorkspaceBytes(shape, max_len));
    for (absl::Status s : {d_qkv.status(), d_dout.status(), d_out.status(), d_lse.status(),
                           d_dqkv.status(), d_ws.status()}) {
      if (!s.ok()) return s;
    }
    AttentionFwdArgs f;
    f.shape = shape;
    f.cu_seqlens = cu;
    f.qkv = d_qkv->data();
    f.out = d_out->data();
    f.lse = d_lse->data();
    f.workspace = d_ws->data();
    f.workspace_bytes = d_ws->bytes();
    absl::Status s = AttentionFwd(f, blas_.get(), stream_);
    if (!s.ok()) return s;
    AttentionBwdArgs b;
    b.shape = shape;
    b.cu_seqlens = cu;
    b.qkv = d_qkv->data();
    b.out = d_out->data();
    b.dout = d_dout->data();
    b.lse = d_lse->data();
    b.dqkv = d_dqkv->data();
    b.workspace = d_ws->data();
    b.workspace_bytes = d_ws->bytes();
    s = AttentionBwd(b, blas_.get(), stream_);
    if (!s.ok()) return s;
    AttnResult r;
    auto out = Download(*d_out);
    auto lse = Download(*d_lse);
    auto dqkv = Download(*d_dqkv);
    if (!out.ok()) return out.status();
    if (!lse.ok()) return lse.status();
    if (!dqkv.ok()) return dqkv.status();
    r.out = *std::move(out);
    r.lse = *std::move(lse);
    r.dqkv = *std::move(dqkv);
    return r;
  }
};

class AttentionGpuRefTest : public AttentionGpuTest,
                            public ::testing::WithParamInterface<AttnGpuCase> {};

TEST_P(AttentionGpuRefTest, MatchesReference) {
  const AttnGpuCase& c = GetParam();
  const std::vector<int64_t> cu = Offsets(c.lengths);
  AttentionShape shape;
  shape.heads = c.heads;
  shape.head_dim = c.head_dim;
  shape.query_block = c.query_block;
  const int64_t hd = c.heads * c.head_dim;
  const std::vector<float> qkv = RandomVector(cu.back() * 3 * hd, 21, -2.0f, 2.0f);
  const std::vector<float> dout = RandomVector(cu.back() * hd, 22);
  ASSERT_OK_AND_ASSIGN(AttnResult got, RunGpu(shape, cu, qkv, dout));
  ASSERT_OK_AND_ASSIGN(AttentionFwdRefResult want, AttentionFwdRef(shape, cu, ToDouble(qkv)));
  EXPECT_TRUE(AllClose(got.lse, want.lse, 2e-5, 2e-6)) << "lse";
  EXPECT_TRUE(AllClose(got.out, want.out, 2e-5, 2e-5)) << "out";
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_dqkv,
                       AttentionBwdRef(shape, cu, ToDouble(qkv), ToDouble(dout)));
  EXPECT_TRUE(AllClose(got.dqkv, want_dqkv, 1e-4, 1e-4)) << "dqkv";
}

std::vector<AttnGpuCase> Cases() {
  std::mt19937 gen(5);
  std::uniform_int_distribution<int64_t> len(1, 12);
  std::vector<int64_t> many_short(40);
  for (int64_t& l : many_short) l = len(gen);
  return {
      {"one_token", {1}, 2, 4, 1024},
      {"single_tokens", {1, 1, 1, 1, 1}, 3, 8, 1024},
      {"one_long", {300}, 2, 16, 1024},
      {"one_long_blocked", {300}, 2, 16, 64},
      {"many_short", many_short, 3, 8, 5},
      {"mixed_with_empty", {5, 0, 130, 1, 64, 0}, 2, 8, 32},
      {"head_dim_64_long", {700}, 2, 64, 256},
      {"no_tokens", {}, 2, 8, 16},
  };
}

INSTANTIATE_TEST_SUITE_P(Batches, AttentionGpuRefTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttnGpuCase>& i) {
                           return i.param.name;
                         });

// A layer-sized batch is too slow for the double reference; the CPU production
// path (itself checked against the reference) is the oracle.
TEST_F(AttentionGpuTest, LargeBatchMatchesCpuPath) {
  const std::vector<int64_t> cu = Offsets({1500, 300, 7, 1, 2100});
  AttentionShape shape;
  shape.heads = 4;
  shape.head_dim = 64;
  shape.query_block = 512;
  const int64_t hd = 256;
  const std::vector<float> qkv = RandomVector(cu.back() * 3 * hd, 31, -1.0f, 1.0f);
  const std::vector<float> dout = RandomVector(cu.back() * hd, 32);
  ASSERT_OK_AND_ASSIGN(AttnResult gpu, RunGpu(shape, cu, qkv, dout));

  std::vector<float> out(cu.back() * hd), lse(cu.back() * 4), dqkv(cu.back() * 3 * hd);
  std::vector<float> ws(AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu)) / 4);
  AttentionFwdArgs f;
  f.shape = shape;
  f.cu_seqlens = cu;
  f.qkv = qkv.data();
  f.out = out.data();
  f.lse = lse.data();
  f.workspace = ws.data();
  f.workspace_bytes = ws.size() * 4;
  ASSERT_OK(AttentionFwdCpu(f));
  AttentionBwdArgs b;
  b.shape = shape;
  b.cu_seqlens = cu;
  b.qkv = qkv.data();
  b.out = out.data();
  b.dout = dout.data();
  b.lse = lse.data();
  b.dqkv = dqkv.data();
  b.workspace = ws.data();
  b.workspace_bytes = ws.size() * 4;
  ASSERT_OK(AttentionBwdCpu(b));
  EXPECT_TRUE(AllClose(gpu.lse, ToDouble(lse), 2e-5, 2e-6)) << "lse";
  EXPECT_TRUE(AllClose(gpu.out, ToDouble(out), 2e-5, 1e-4)) << "out";
  EXPECT_TRUE(AllClose(gpu.dqkv, ToDouble(dqkv), 2e-4, 1e-3)) << "dqkv";
}

TEST_F(AttentionGpuTest, PackedBatchEqualsEachSequenceAlone) {
  const std::vector<int64_t> lengths = {7, 1, 40, 0, 13};
  const std::vector<int64_t> cu = Offsets(lengths);
  AttentionShape shape;
  shape.heads = 3;
  shape.head_dim = 8;
  shape.query_block = 16;
  const int64_t hd = 24, ld = 72;
  const std::vector<float> qkv = RandomVector(cu.back() * ld, 41, -2.0f, 2.0f);
  const std::vector<float> dout = RandomVector(cu.back() * hd, 42);
  ASSERT_OK_AND_ASSIGN(AttnResult packed, RunGpu(shape, cu, qkv, dout));
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t t0 = cu[s], len = lengths[s];
    if (len == 0) continue;
    const std::vector<float> q1(qkv.begin() + t0 * ld, qkv.begin() + (t0 + len) * ld);
    const std::vector<float> d1(dout.begin() + t0 * hd, dout.begin() + (t0 + len) * hd);
    ASSERT_OK_AND_ASSIGN(AttnResult alone, RunGpu(shape, {0, len}, q1, d1));
    auto slice = [](const std::vector<float>& v, int64_t a, int64_t n) {
      return std::vector<double>(v.begin() + a, v.begin() + a + n);
    };
    EXPECT_TRUE(AllClose(alone.out, slice(packed.out, t0 * hd, len * hd), 1e-6, 1e-6)) << s;
    EXPECT_TRUE(AllClose(alone.dqkv, slice(packed.dqkv, t0 * ld, len * ld), 1e-6, 1e-6)) << s;
  }
}

}  // namespace
}  // namespace spgate::kernels
