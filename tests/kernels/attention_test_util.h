// Helpers shared by the CPU (tests/kernels/attention_test.cc) and GPU
// (tests/gpu/attention_gpu_test.cc) attention tests: packed offsets, the
// parameterised batch cases, their seeded inputs, a run of the CPU production
// path (forward then backward) and the comparison with the double reference.
#ifndef SPGATE_TESTS_KERNELS_ATTENTION_TEST_UTIL_H_
#define SPGATE_TESTS_KERNELS_ATTENTION_TEST_UTIL_H_

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels::testing {

// cu_seqlens for sequences of these lengths.
inline std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

struct AttnCase {
  std::string name;
  std::vector<int64_t> lengths;
  int64_t heads;
  int64_t head_dim;
  int64_t query_block;
};

inline void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

// The batches both paths are checked on against the reference (each test
// appends its own).
inline std::vector<AttnCase> CommonAttnCases() {
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
  };
}

// A case's shape, offsets and seeded inputs.
struct AttnInputs {
  AttentionShape shape;
  std::vector<int64_t> cu;
  std::vector<float> qkv, dout;
};

inline AttnInputs MakeAttnInputs(const AttnCase& c) {
  AttnInputs in;
  in.cu = Offsets(c.lengths);
  in.shape.heads = c.heads;
  in.shape.head_dim = c.head_dim;
  in.shape.query_block = c.query_block;
  const int64_t tokens = in.cu.back(), hd = c.heads * c.head_dim;
  // Scaled up so softmax rows are peaked, not uniform.
  in.qkv = RandomVector(tokens * 3 * hd, 21, -2.0f, 2.0f);
  in.dout = RandomVector(tokens * hd, 22);
  return in;
}

struct AttnRun {
  std::vector<float> out, lse, dqkv;
};

// The CPU production path, forward then backward.
inline absl::StatusOr<AttnRun> RunAttentionCpu(const AttentionShape& shape,
                                               const std::vector<int64_t>& cu,
                                               const std::vector<float>& qkv,
                                               const std::vector<float>& dout) {
  const int64_t tokens = cu.back(), hd = shape.heads * shape.head_dim;
  AttnRun r;
  r.out.resize(tokens * hd);
  r.lse.resize(tokens * shape.heads);
  r.dqkv.assign(tokens * 3 * hd, 99.0f);  // must be overwritten
  std::vector<float> ws(AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu)) / sizeof(float) + 1);
  AttentionFwdArgs f;
  f.shape = shape;
  f.cu_seqlens = cu;
  f.qkv = qkv.data();
  f.out = r.out.data();
  f.lse = r.lse.data();
  f.workspace = ws.data();
  f.workspace_bytes = AttentionFwdWorkspaceBytes(shape, MaxSeqLen(cu));
  absl::Status s = AttentionFwdCpu(f);
  if (!s.ok()) return s;
  AttentionBwdArgs b;
  b.shape = shape;
  b.cu_seqlens = cu;
  b.qkv = qkv.data();
  b.out = r.out.data();
  b.dout = dout.data();
  b.lse = r.lse.data();
  b.dqkv = r.dqkv.data();
  b.workspace = ws.data();
  b.workspace_bytes = AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu));
  s = AttentionBwdCpu(b);
  if (!s.ok()) return s;
  return r;
}

// got against the double reference: lse first (the softmax statistics), then
// out, then dqkv.
inline void ExpectMatchesAttentionRef(const AttnInputs& in, const AttnRun& got) {
  ASSERT_OK_AND_ASSIGN(AttentionFwdRefResult want,
                       AttentionFwdRef(in.shape, in.cu, ToDouble(in.qkv)));
  EXPECT_TRUE(AllClose(got.lse, want.lse, 2e-5, 2e-6)) << "lse";
  EXPECT_TRUE(AllClose(got.out, want.out, 2e-5, 2e-5)) << "out";
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_dqkv,
                       AttentionBwdRef(in.shape, in.cu, ToDouble(in.qkv), ToDouble(in.dout)));
  EXPECT_TRUE(AllClose(got.dqkv, want_dqkv, 1e-4, 1e-4)) << "dqkv";
}

}  // namespace spgate::kernels::testing

#endif  // SPGATE_TESTS_KERNELS_ATTENTION_TEST_UTIL_H_
