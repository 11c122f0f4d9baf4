// Causal packed-varlen attention on the CPU: the production path (blocked
// OpenBLAS GEMMs + vectorised softmax) against the double reference for single
// tokens, one long sequence, many short ones, empty sequences and several query
// block sizes, forward (lse first, then out) and backward; the reference
// backward against central finite differences; and the two properties packing
// relies on: a packed batch gives each sequence exactly its solo attention, and
// no token sees a later token of its own sequence.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "tests/kernels/attention_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;
using testing::AllClose;
using testing::BitwiseEqual;
using testing::RandomVector;
using testing::ToDouble;
using testing::AttnCase;
using testing::AttnInputs;
using testing::AttnRun;
using testing::Offsets;
using testing::RunAttentionCpu;

class AttentionCpuTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionCpuTest, MatchesReference) {
  const AttnInputs in = testing::MakeAttnInputs(GetParam());
  ASSERT_OK_AND_ASSIGN(AttnRun got, RunAttentionCpu(in.shape, in.cu, in.qkv, in.dout));
  testing::ExpectMatchesAttentionRef(in, got);
}

std::vector<AttnCase> Cases() {
  std::vector<AttnCase> cases = testing::CommonAttnCases();
  cases.push_back({"query_block_1", {17, 9}, 2, 5, 1});
  cases.push_back({"head_dim_1", {6, 3}, 4, 1, 4});
  cases.push_back({"no_tokens", {}, 2, 8, 16});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Batches, AttentionCpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                           return i.param.name;
                         });

// Loss = sum(w * out): reference gradients w.r.t. every element of qkv against
// central differences in double, on a packed batch of three sequences.
TEST(AttentionRefTest, BackwardMatchesFiniteDifferences) {
  const std::vector<int64_t> cu = Offsets({3, 1, 4});
  AttentionShape shape;
  shape.heads = 2;
  shape.head_dim = 3;
  constexpr double kStep = 1e-6;
  std::vector<double> qkv = ToDouble(RandomVector(cu.back() * 18, 31, -1.5f, 1.5f));
  const std::vector<double> w = ToDouble(RandomVector(cu.back() * 6, 32));
  auto loss = [&]() {
    auto f = AttentionFwdRef(shape, cu, qkv);
    EXPECT_TRUE(f.ok());
    double l = 0;
    for (size_t i = 0; i < w.size(); ++i) l += w[i] * f->out[i];
    return l;
  };
  ASSERT_OK_AND_ASSIGN(std::vector<double> g, AttentionBwdRef(shape, cu, qkv, w));
  const std::vector<double> fd = testing::FiniteDifferenceGradient(qkv, loss, kStep);
  EXPECT_TRUE(AllClose(g, fd, 1e-8, 1e-6));
}

// Packing must not change anything: each sequence's rows of the packed result
// equal the result of running that sequence alone (same blocks, same BLAS
// calls, so bitwise up to BLAS's alignment-dependent kernels: tight tolerance).
TEST(AttentionCpuTest, PackedBatchEqualsEachSequenceAlone) {
  const std::vector<int64_t> lengths = {7, 1, 40, 0, 13};
  const std::vector<int64_t> cu = Offsets(lengths);
  AttentionShape shape;
  shape.heads = 3;
  shape.head_dim = 8;
  shape.query_block = 16;
  const int64_t hd = 24, ld = 72;
  const std::vector<float> qkv = RandomVector(cu.back() * ld, 41, -2.0f, 2.0f);
  const std::vector<float> dout = RandomVector(cu.back() * hd, 42);
  ASSERT_OK_AND_ASSIGN(AttnRun packed, RunAttentionCpu(shape, cu, qkv, dout));
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t t0 = cu[s], len = lengths[s];
    const std::vector<float> q1(qkv.begin() + t0 * ld, qkv.begin() + (t0 + len) * ld);
    const std::vector<float> d1(dout.begin() + t0 * hd, dout.begin() + (t0 + len) * hd);
    ASSERT_OK_AND_ASSIGN(AttnRun alone, RunAttentionCpu(shape, {0, len}, q1, d1));
    auto slice = [](const std::vector<float>& v, int64_t a, int64_t n) {
      return std::vector<double>(v.begin() + a, v.begin() + a + n);
    };
    EXPECT_TRUE(AllClose(alone.out, slice(packed.out, t0 * hd, len * hd), 1e-6, 1e-6))
        << "sequence " << s << " out";
    EXPECT_TRUE(AllClose(alone.lse, slice(packed.lse, t0 * 3, len * 3), 1e-6, 1e-6))
        << "sequence " << s << " lse";
    EXPECT_TRUE(AllClose(alone.dqkv, slice(packed.dqkv, t0 * ld, len * ld), 1e-6, 1e-6))
        << "sequence " << s << " dqkv";
  }
}

// Changing a token's K and V must not change any earlier token's output, nor
// anything in other sequences.
TEST(AttentionCpuTest, NoTokenSeesTheFuture) {
  const std::vector<int64_t> cu = Offsets({20, 11});
  AttentionShape shape;
  shape.heads = 2;
  shape.head_dim = 4;
  shape.query_block = 8;
  const int64_t hd = 8, ld = 24;
  const std::vector<float> qkv = RandomVector(cu.back() * ld, 51, -2.0f, 2.0f);
  const std::vector<float> dout = RandomVector(cu.back() * hd, 52);
  ASSERT_OK_AND_ASSIGN(AttnRun base, RunAttentionCpu(shape, cu, qkv, dout));
  constexpr int64_t kChanged = 13;  // in the first sequence
  std::vector<float> changed = qkv;
  for (int64_t c = hd; c < ld; ++c) changed[kChanged * ld + c] += 5.0f;  // its K and V
  ASSERT_OK_AND_ASSIGN(AttnRun after, RunAttentionCpu(shape, cu, changed, dout));
  const std::vector<float> before_out(base.out.begin(), base.out.begin() + kChanged * hd);
  const std::vector<float> after_out(after.out.begin(), after.out.begin() + kChanged * hd);
  EXPECT_TRUE(BitwiseEqual(after_out, before_out)) << "earlier tokens of the sequence";
  const std::vector<float> other_before(base.out.begin() + 20 * hd, base.out.end());
  const std::vector<float> other_after(after.out.begin() + 20 * hd, after.out.end());
  EXPECT_TRUE(BitwiseEqual(other_after, other_before)) << "the other sequence";
  // And the token itself does see the change.
  EXPECT_NE(after.out[kChanged * hd], base.out[kChanged * hd]);
}

TEST(AttentionCpuTest, RejectsBadArguments) {
  AttentionShape shape;
  shape.heads = 2;
  shape.head_dim = 4;
  const std::vector<int64_t> cu = {0, 3, 5};
  std::vector<float> buf(1000);
  AttentionFwdArgs f;
  f.shape = shape;
  f.cu_seqlens = cu;
  f.qkv = f.out = f.lse = buf.data();
  f.workspace = buf.data();
  f.workspace_bytes = AttentionFwdWorkspaceBytes(shape, 3) - 1;
  EXPECT_THAT(AttentionFwdCpu(f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  f.workspace_bytes = AttentionFwdWorkspaceBytes(shape, 3);
  EXPECT_OK(AttentionFwdCpu(f));

  const std::vector<int64_t> decreasing = {0, 3, 2};
  f.cu_seqlens = decreasing;
  EXPECT_THAT(AttentionFwdCpu(f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-decreasing")));
  const std::vector<int64_t> not_zero = {1, 3};
  f.cu_seqlens = not_zero;
  EXPECT_THAT(AttentionFwdCpu(f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cu_seqlens[0]")));
  f.cu_seqlens = {};
  EXPECT_THAT(AttentionFwdCpu(f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cu_seqlens")));
  f.cu_seqlens = cu;
  f.shape.heads = 0;
  EXPECT_THAT(AttentionFwdCpu(f), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heads")));
  f.shape = shape;
  f.shape.query_block = 0;
  EXPECT_THAT(AttentionFwdCpu(f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_block")));

  AttentionBwdArgs b;
  b.shape = shape;
  b.cu_seqlens = cu;
  b.qkv = b.out = b.lse = buf.data();
  b.dqkv = buf.data();
  b.workspace = buf.data();
  b.workspace_bytes = AttentionBwdWorkspaceBytes(shape, 3);
  EXPECT_THAT(AttentionBwdCpu(b), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dout")));
}

TEST(AttentionShapeTest, WorkspaceAndFlops) {
  AttentionShape shape;
  shape.heads = 4;
  shape.head_dim = 64;
  shape.query_block = 256;
  EXPECT_EQ(MaxSeqLen(std::vector<int64_t>{0, 5, 105, 110}), 100);
  EXPECT_EQ(MaxSeqLen(std::vector<int64_t>{0}), 0);
  // Short batches: the block is the sequence.
  EXPECT_EQ(AttentionFwdWorkspaceBytes(shape, 100), 4u * 100 * 100 * 4);
  // Long ones: linear in the length beyond query_block.
  EXPECT_EQ(AttentionFwdWorkspaceBytes(shape, 32768), 4u * 256 * 32768 * 4);
  EXPECT_EQ(AttentionBwdWorkspaceBytes(shape, 32768), 2 * 4u * 256 * 32768 * 4);
  EXPECT_EQ(AttentionFwdWorkspaceBytes(shape, 0), 0u);
  // 2 GEMMs * 2 flops * head_dim * L(L+1)/2 * heads.
  EXPECT_DOUBLE_EQ(AttentionFwdFlops(shape, std::vector<int64_t>{0, 3}), 2.0 * 64 * 3 * 4 * 4);
  EXPECT_FLOAT_EQ(ResolvedSoftmaxScale(shape), 0.125f);
}

}  // namespace
}  // namespace spgate::kernels
