// Helpers shared by the CPU (tests/kernels/gemm_test.cc) and GPU
// (tests/gpu/gemm_gpu_test.cc) GEMM tests.
#ifndef SPGATE_TESTS_KERNELS_GEMM_TEST_UTIL_H_
#define SPGATE_TESTS_KERNELS_GEMM_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels::testing {

// The GemmRefArgs of g (transposes, sizes, alpha, beta, leading dimensions)
// over the host operands a, b and the initial c, in double.
inline GemmRefArgs RefArgsLike(const GemmArgs& g, absl::Span<const double> a,
                               absl::Span<const double> b, absl::Span<const double> c) {
  GemmRefArgs r;
  r.trans_a = g.trans_a;
  r.trans_b = g.trans_b;
  r.m = g.m;
  r.n = g.n;
  r.k = g.k;
  r.alpha = g.alpha;
  r.a = a;
  r.lda = g.lda;
  r.b = b;
  r.ldb = g.ldb;
  r.beta = g.beta;
  r.c = c;
  r.ldc = g.ldc;
  return r;
}

// Checks every [m, n] block of a strided batch (c holds the host copy of g.c,
// whose blocks are batch.stride_c apart with ldc == n, g.beta == 0) against
// GemmRef on the matching slices of the host operands a and b.
inline void ExpectStridedBatchMatchesRef(const GemmArgs& g, const GemmBatch& batch,
                                         const std::vector<float>& a,
                                         const std::vector<float>& b,
                                         const std::vector<float>& c) {
  const std::vector<double> ad = ToDouble(a), bd = ToDouble(b);
  for (int64_t i = 0; i < batch.count; ++i) {
    const GemmRefArgs r = RefArgsLike(g, absl::MakeConstSpan(ad).subspan(i * batch.stride_a),
                                      absl::MakeConstSpan(bd).subspan(i * batch.stride_b), {});
    ASSERT_OK_AND_ASSIGN(std::vector<double> want, GemmRef(r));
    std::vector<float> got(c.begin() + i * batch.stride_c,
                           c.begin() + i * batch.stride_c + g.m * g.n);
    EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5)) << "batch " << i;
  }
}

}  // namespace spgate::kernels::testing

#endif  // SPGATE_TESTS_KERNELS_GEMM_TEST_UTIL_H_
