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
#include "tests/kernels/attention_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using testing::AllClose;
using testing::GpuTest;
using testing::RandomVector;
using testing::ToDouble;
using testing::Offsets;

using AttnGpuCase = testing::AttnCase;
using AttnResult = testing::AttnRun;

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
  const testing::AttnInputs in = testing::MakeAttnInputs(GetParam());
  ASSERT_OK_AND_ASSIGN(AttnResult got, RunGpu(in.shape, in.cu, in.qkv, in.dout));
  testing::ExpectMatchesAttentionRef(in, got);
}

std::vector<AttnGpuCase> Cases() {
  std::vector<AttnGpuCase> cases = testing::CommonAttnCases();
  cases.push_back({"head_dim_64_long", {700}, 2, 64, 256});
  cases.push_back({"no_tokens", {}, 2, 8, 16});
  return cases;
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

  ASSERT_OK_AND_ASSIGN(AttnResult cpu, testing::RunAttentionCpu(shape, cu, qkv, dout));
  EXPECT_TRUE(AllClose(gpu.lse, ToDouble(cpu.lse), 2e-5, 2e-6)) << "lse";
  EXPECT_TRUE(AllClose(gpu.out, ToDouble(cpu.out), 2e-5, 1e-4)) << "out";
  EXPECT_TRUE(AllClose(gpu.dqkv, ToDouble(cpu.dqkv), 2e-4, 1e-3)) << "dqkv";
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
