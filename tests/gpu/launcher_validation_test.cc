// The CUDA launchers' host-side checks, which run before any CUDA call and so
// need no device: this binary is part of the normal (CPU) suite wherever the
// CUDA kernels are built, so a machine without a GPU still proves that bad
// shapes, short workspaces, missing handles and oversized rows come back as
// Status values naming the field, never as a launch.
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/device_memory.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "tests/kernels/kernel_test_util.h"

namespace spgate::kernels {
namespace {

using ::testing::HasSubstr;

// Never dereferenced: every call below fails validation first.
float* FakeDevicePtr() {
  static float sentinel[8];
  return sentinel;
}

TEST(LauncherValidationTest, LayerNorm) {
  LayerNormFwdArgs<float> f;
  f.rows = 4;
  f.hidden = 0;
  f.x = f.gamma = f.beta = FakeDevicePtr();
  f.y = f.mean = f.rstd = FakeDevicePtr();
  EXPECT_THAT(LayerNormFwd(f, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LayerNormFwd: hidden")));
  f.hidden = kLayerNormMaxHiddenGpu + 1;
  EXPECT_THAT(LayerNormFwd(f, nullptr),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("32768")));

  LayerNormBwdArgs<Bfloat16> b;
  b.rows = 4;
  b.hidden = 64;
  b.dy = b.x = b.dx = reinterpret_cast<Bfloat16*>(FakeDevicePtr());
  b.gamma = b.mean = b.rstd = FakeDevicePtr();
  b.dgamma = b.dbeta = FakeDevicePtr();
  EXPECT_THAT(LayerNormBwd(b, FakeDevicePtr(), LayerNormBwdWorkspaceBytes(4, 64) - 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  EXPECT_THAT(LayerNormBwd(b, nullptr, LayerNormBwdWorkspaceBytes(4, 64), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
}

TEST(LauncherValidationTest, Gelu) {
  GeluBwdArgs<float> b;
  b.rows = 100;
  b.cols = 10;
  b.dy = b.pre = b.bias = FakeDevicePtr();
  b.dpre = b.dbias = FakeDevicePtr();
  EXPECT_THAT(GeluBwd(b, FakeDevicePtr(), 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("GeluBwdWorkspaceBytes")));
  GeluFwdArgs<Bfloat16> f;
  f.rows = -1;
  f.cols = 3;
  EXPECT_THAT(GeluFwd(f, nullptr), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows")));
}

TEST(LauncherValidationTest, GemmAndLinear) {
  GemmArgs g;
  g.m = g.n = g.k = 4;
  g.a = g.b = g.c = FakeDevicePtr();
  g.lda = g.ldb = g.ldc = 4;
  EXPECT_THAT(Gemm(g, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cublas handle")));
  LinearBwdWeightArgs w{{8, 4, 4}, FakeDevicePtr(), FakeDevicePtr(), FakeDevicePtr(),
                        FakeDevicePtr(), false};
  // Workspace is checked before the handle is used.
  EXPECT_THAT(LinearBwdWeight(w, nullptr, 0, reinterpret_cast<cublasHandle_t>(FakeDevicePtr()),
                              nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
}

TEST(LauncherValidationTest, BiasGrad) {
  EXPECT_THAT(BiasGrad({100, 8, FakeDevicePtr(), FakeDevicePtr(), false}, FakeDevicePtr(),
                       BiasGradWorkspaceBytes(100, 8) - 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("BiasGradWorkspaceBytes")));
}

TEST(LauncherValidationTest, Attention) {
  const std::vector<int64_t> cu = {0, 5, 3};
  AttentionFwdArgs f;
  f.shape.heads = 2;
  f.shape.head_dim = 8;
  f.cu_seqlens = cu;
  f.qkv = f.out = f.lse = FakeDevicePtr();
  EXPECT_THAT(AttentionFwd(f, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-decreasing")));
  const std::vector<int64_t> ok = {0, 5};
  f.cu_seqlens = ok;
  f.workspace = FakeDevicePtr();
  f.workspace_bytes = AttentionFwdWorkspaceBytes(f.shape, 5);
  EXPECT_THAT(AttentionFwd(f, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cublas handle")));
}

TEST(CudaDeviceCountTest, ReportsAReasonWhenThereIsNoDevice) {
  std::string reason;
  const int n = CudaDeviceCount(&reason);
  if (n == 0) {
    EXPECT_FALSE(reason.empty());
  } else {
    EXPECT_GT(n, 0);
  }
}

}  // namespace
}  // namespace spgate::kernels
