// CPU references for the GEMM wrappers and the Linear layer products: triple
// loops in double over row-major operands, indexed exactly as the header
// documents, so a layout mistake in the OpenBLAS/cuBLAS mapping shows up as a
// mismatch here rather than as a silently transposed weight.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/gemm.h"
#include "kernels/internal/check.h"

namespace spgate::kernels {
namespace {

absl::Status CheckSize(const char* op, const char* field, absl::Span<const double> v,
                       int64_t want) {
  if (static_cast<int64_t>(v.size()) >= want) return absl::OkStatus();
  return internal::Invalid(op, absl::StrCat(field, " has ", v.size(),
                                            " elements, need ", want));
}

// Elements a row-major [rows, cols] matrix with leading dimension ld spans.
int64_t Extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

}  // namespace

absl::StatusOr<std::vector<double>> GemmRef(const GemmRefArgs& g) {
  constexpr char kOp[] = "GemmRef";
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "m", g.m));
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "n", g.n));
  RETURN_IF_ERROR(internal::CheckNonNegative(kOp, "k", g.k));
  const bool ta = g.trans_a == Trans::kYes;
  const bool tb = g.trans_b == Trans::kYes;
  RETURN_IF_ERROR(
      CheckSize(kOp, "a", g.a, ta ? Extent(g.k, g.m, g.lda) : Extent(g.m, g.k, g.lda)));
  RETURN_IF_ERROR(
      CheckSize(kOp, "b", g.b, tb ? Extent(g.n, g.k, g.ldb) : Extent(g.k, g.n, g.ldb)));
  if (g.beta != 0.0) RETURN_IF_ERROR(CheckSize(kOp, "c", g.c, Extent(g.m, g.n, g.ldc)));

  std::vector<double> c(Extent(g.m, g.n, g.ldc), 0.0);
  if (!g.c.empty()) {
    for (size_t i = 0; i < c.size() && i < g.c.size(); ++i) c[i] = g.c[i];
  }
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double a = ta ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        const double b = tb ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc += a * b;
      }
      double& out = c[i * g.ldc + j];
      out = g.alpha * acc + (g.beta == 0.0 ? 0.0 : g.beta * out);
    }
  }
  return c;
}

absl::StatusOr<std::vector<double>> LinearFwdRef(const LinearShape& s,
                                                 absl::Span<const double> x,
                                                 absl::Span<const double> weight,
                                                 absl::Span<const double> bias) {
  constexpr char kOp[] = "LinearFwdRef";
  RETURN_IF_ERROR(ValidateLinearShape(kOp, s));
  RETURN_IF_ERROR(CheckSize(kOp, "x", x, s.rows * s.in_features));
  RETURN_IF_ERROR(CheckSize(kOp, "weight", weight, s.out_features * s.in_features));
  if (!bias.empty()) RETURN_IF_ERROR(CheckSize(kOp, "bias", bias, s.out_features));
  std::vector<double> y(s.rows * s.out_features);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.out_features; ++o) {
      double acc = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < s.in_features; ++i) {
        acc += x[r * s.in_features + i] * weight[o * s.in_features + i];
      }
      y[r * s.out_features + o] = acc;
    }
  }
  return y;
}

absl::StatusOr<LinearBwdRefResult> LinearBwdRef(const LinearShape& s,
                                                absl::Span<const double> dy,
                                                absl::Span<const double> x,
                                                absl::Span<const double> weight) {
  constexpr char kOp[] = "LinearBwdRef";
  RETURN_IF_ERROR(ValidateLinearShape(kOp, s));
  RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, s.rows * s.out_features));
  RETURN_IF_ERROR(CheckSize(kOp, "x", x, s.rows * s.in_features));
  RETURN_IF_ERROR(CheckSize(kOp, "weight", weight, s.out_features * s.in_features));
  const int64_t in = s.in_features, out = s.out_features;
  LinearBwdRefResult r;
  r.dx.assign(s.rows * in, 0.0);
  r.dweight.assign(out * in, 0.0);
  r.dbias.assign(out, 0.0);
  for (int64_t t = 0; t < s.rows; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      const double g = dy[t * out + o];
      r.dbias[o] += g;
      for (int64_t i = 0; i < in; ++i) {
        r.dx[t * in + i] += g * weight[o * in + i];
        r.dweight[o * in + i] += g * x[t * in + i];
      }
    }
  }
  return r;
}

}  // namespace spgate::kernels
