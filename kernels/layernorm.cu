// CUDA residual-add + LayerNorm, forward and backward, fp32 or bf16 storage
// with fp32 arithmetic. One thread block per row: each thread holds its columns
// of the row in registers (internal/row_plan.h), so forward reads x (+ residual)
// once and writes y (+ residual_out) once; mean and variance are two exact block
// reductions over the registers (no E[x^2] - E[x]^2 cancellation). Backward
// blocks walk rows b, b + G, ... keeping their columns' dgamma/dbeta partials in
// registers, write one partial row per block, and a second kernel adds the G
// partials in order: deterministic, no atomics. With a fused residual in bf16,
// the sum is rounded to bf16 before the statistics, so forward normalises
// exactly the residual_out that backward will read back.
//
// Byte counts (used by the benchmarks): forward moves (2 + 2 * has_residual)
// * rows * hidden * sizeof(T) bytes, backward (3 + has_dresidual) * rows *
// hidden * sizeof(T), plus O(rows + hidden) floats.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/internal/check.h"
#include "kernels/internal/cuda_common.cuh"
#include "kernels/internal/launch_plan.h"
#include "kernels/internal/row_plan.h"
#include "kernels/layernorm.h"

namespace spgate::kernels {
namespace {

using internal::BlockSum2;
using internal::DevT;
using internal::LoadWiden;
using internal::NarrowStore;

// gamma/beta are fp32: load kVec of them, 16 bytes at a time when kVec allows.
template <int kVec>
__device__ __forceinline__ void LoadParams(const float* p, float (&out)[kVec]) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + i);
      out[i] = f.x;
      out[i + 1] = f.y;
      out[i + 2] = f.z;
      out[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = p[i];
  }
}

template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(1024)
    LayerNormFwdKernel(LayerNormFwdArgs<T> a) {
  using D = DevT<T>;
  __shared__ float scratch[64];
  const int h = static_cast<int>(a.hidden);
  const float inv_h = 1.0f / static_cast<float>(h);
  const D* x = reinterpret_cast<const D*>(a.x);
  const D* res = reinterpret_cast<const D*>(a.residual);
  D* res_out = reinterpret_cast<D*>(a.residual_out);
  D* y = reinterpret_cast<D*>(a.y);

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * h;
    float v[kItems][kVec];
    float sum = 0.0f, unused = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int col = (k * blockDim.x + threadIdx.x) * kVec;
      if (col < h) {
        LoadWiden<D, kVec>(x + base + col, v[k]);
        if (res != nullptr) {
          float r[kVec];
          LoadWiden<D, kVec>(res + base + col, r);
#pragma unroll
          for (int i = 0; i < kVec; ++i) v[k][i] += r[i];
          NarrowStore<D, kVec>(res_out + base + col, v[k]);
          if constexpr (!std::is_same_v<D, float>) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) v[k][i] = internal::Widen(internal::Narrow<D>(v[k][i]));
          }
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += v[k][i];
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[k][i] = 0.0f;
      }
    }
    BlockSum2(sum, unused, scratch);
    const float mean = sum * inv_h;

    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int col = (k * blockDim.x + threadIdx.x) * kVec;
      if (col < h) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float d = v[k][i] - mean;
          sq += d * d;
        }
      }
    }
    unused = 0.0f;
    BlockSum2(sq, unused, scratch);
    const float rstd = rsqrtf(sq * inv_h + a.eps);

#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int col = (k * blockDim.x + threadIdx.x) * kVec;
      if (col < h) {
        float g[kVec], b[kVec], out[kVec];
        LoadParams<kVec>(a.gamma + col, g);
        LoadParams<kVec>(a.beta + col, b);
#pragma unroll
        for (int i = 0; i < kVec; ++i) out[i] = (v[k][i] - mean) * rstd * g[i] + b[i];
        NarrowStore<D, kVec>(y + base + col, out);
      }
    }
    if (threadIdx.x == 0) {
      a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
}

// partial: [2][gridDim.x][hidden] (dgamma plane, then dbeta plane).
template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(1024)
    LayerNormBwdKernel(LayerNormBwdArgs<T> a, float* __restrict__ partial) {
  using D = DevT<T>;
  __shared__ float scratch[64];
  const int h = static_cast<int>(a.hidden);
  const float inv_h = 1.0f / static_cast<float>(h);
  const D* dy_p = reinterpret_cast<const D*>(a.dy);
  const D* x_p = reinterpret_cast<const D*>(a.x);
  const D* dres_p = reinterpret_cast<const D*>(a.dresidual);
  D* dx_p = reinterpret_cast<D*>(a.dx);

  float dgamma[kItems][kVec];
  float dbeta[kItems][kVec];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dgamma[k][i] = dbeta[k][i] = 0.0f;
  }

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * h;
    const float mean = a.mean[row];
    const float rstd = a.rstd[row];
    float xhat[kItems][kVec];
    float g[kItems][kVec];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int col = (k * blockDim.x + threadIdx.x) * kVec;
      if (col < h) {
        float xv[kVec], dy[kVec], gm[kVec];
        LoadWiden<D, kVec>(x_p + base + col, xv);
        LoadWiden<D, kVec>(dy_p + base + col, dy);
        LoadParams<kVec>(a.gamma + col, gm);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          xhat[k][i] = (xv[i] - mean) * rstd;
          g[k][i] = dy[i] * gm[i];
          sum_g += g[k][i];
          sum_gx += g[k][i] * xhat[k][i];
          dgamma[k][i] += dy[i] * xhat[k][i];
          dbeta[k][i] += dy[i];
        }
      }
    }
    BlockSum2(sum_g, sum_gx, scratch);
    const float mean_g = sum_g * inv_h;
    const float mean_gx = sum_gx * inv_h;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int col = (k * blockDim.x + threadIdx.x) * kVec;
      if (col < h) {
        float dx[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) dx[i] = rstd * (g[k][i] - mean_g - xhat[k][i] * mean_gx);
        if (dres_p != nullptr) {
          float dr[kVec];
          LoadWiden<D, kVec>(dres_p + base + col, dr);
#pragma unroll
          for (int i = 0; i < kVec; ++i) dx[i] += dr[i];
        }
        NarrowStore<D, kVec>(dx_p + base + col, dx);
      }
    }
  }

  float* pg = partial + static_cast<int64_t>(blockIdx.x) * h;
  float* pb = partial + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * h;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int col = (k * blockDim.x + threadIdx.x) * kVec;
    if (col < h) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        pg[col + i] = dgamma[k][i];
        pb[col + i] = dbeta[k][i];
      }
    }
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
constexpr int kWideVec = 16 / sizeof(T);

// The 16-byte path needs every row to start 16-byte aligned.
template <typename T>
int ChooseVec(int64_t hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % kWideVec<T> != 0) return 1;
  for (const void* p : ptrs) {
    if (p != nullptr && !Aligned16(p)) return 1;
  }
  return kWideVec<T>;
}

// Calls launch.template Run<kVec, kItems>() for the plan's (vec, items); only
// combinations within the register budget are instantiated.
template <typename T, int kVec, typename Launch>
absl::Status DispatchItems(const internal::RowPlan& plan, const Launch& launch) {
  switch (plan.items) {
    case 1: return launch.template Run<kVec, 1>();
    case 2: return launch.template Run<kVec, 2>();
    case 4: return launch.template Run<kVec, 4>();
    case 8:
      if constexpr (kVec * 8 <= internal::kRowMaxElementsPerThread) {
        return launch.template Run<kVec, 8>();
      }
      break;
    case 16:
      if constexpr (kVec * 16 <= internal::kRowMaxElementsPerThread) {
        return launch.template Run<kVec, 16>();
      }
      break;
    case 32:
      if constexpr (kVec * 32 <= internal::kRowMaxElementsPerThread) {
        return launch.template Run<kVec, 32>();
      }
      break;
  }
  return absl::InternalError(
      absl::StrCat("no LayerNorm kernel for vec=", plan.vec, " items=", plan.items));
}

template <typename T, typename Launch>
absl::Status DispatchRowPlan(const internal::RowPlan& plan, const Launch& launch) {
  if (plan.vec == kWideVec<T>) return DispatchItems<T, kWideVec<T>>(plan, launch);
  return DispatchItems<T, 1>(plan, launch);
}

template <typename T>
struct FwdLaunch {
  const LayerNormFwdArgs<T>& args;
  int grid;
  int threads;
  cudaStream_t stream;
  template <int kVec, int kItems>
  absl::Status Run() const {
    LayerNormFwdKernel<T, kVec, kItems><<<grid, threads, 0, stream>>>(args);
    SPGATE_CUDA_CHECK_LAUNCH(LayerNormFwdKernel);
    return absl::OkStatus();
  }
};

template <typename T>
struct BwdLaunch {
  const LayerNormBwdArgs<T>& args;
  float* partial;
  int grid;
  int threads;
  cudaStream_t stream;
  template <int kVec, int kItems>
  absl::Status Run() const {
    LayerNormBwdKernel<T, kVec, kItems><<<grid, threads, 0, stream>>>(args, partial);
    SPGATE_CUDA_CHECK_LAUNCH(LayerNormBwdKernel);
    return absl::OkStatus();
  }
};

absl::Status WithOp(const char* op, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(op, ": ", s.message()));
}

template <typename T>
absl::Status LayerNormFwdImpl(const LayerNormFwdArgs<T>& a, cudaStream_t stream) {
  constexpr char kOp[] = "LayerNormFwd";
  RETURN_IF_ERROR(ValidateLayerNormFwdArgs(kOp, a));
  RETURN_IF_ERROR(internal::CheckFitsInt32(kOp, "hidden", a.hidden));
  if (a.rows == 0) return absl::OkStatus();
  const int vec =
      ChooseVec<T>(a.hidden, {a.x, a.residual, a.residual_out, a.y, a.gamma, a.beta});
  absl::StatusOr<internal::RowPlan> plan =
      internal::PlanRow(a.hidden, vec, internal::kRowFwdMaxThreads);
  if (!plan.ok()) return WithOp(kOp, plan.status());
  const int grid = static_cast<int>(std::min<int64_t>(a.rows, int64_t{1} << 20));
  return DispatchRowPlan<T>(*plan, FwdLaunch<T>{a, grid, plan->threads, stream});
}

template <typename T>
absl::Status LayerNormBwdImpl(const LayerNormBwdArgs<T>& a, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  constexpr char kOp[] = "LayerNormBwd";
  RETURN_IF_ERROR(ValidateLayerNormBwdArgs(kOp, a));
  RETURN_IF_ERROR(internal::CheckFitsInt32(kOp, "hidden", a.hidden));
  const size_t need = LayerNormBwdWorkspaceBytes(a.rows, a.hidden);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return internal::Invalid(kOp, absl::StrCat("workspace has ", workspace_bytes,
                                               " bytes, LayerNormBwdWorkspaceBytes = ", need));
  }
  const int blocks = static_cast<int>(internal::LayerNormBwdBlocks(a.rows));
  float* partial = static_cast<float*>(workspace);
  if (a.rows > 0) {
    const int vec = ChooseVec<T>(a.hidden, {a.dy, a.x, a.dresidual, a.dx, a.gamma});
    absl::StatusOr<internal::RowPlan> plan = internal::PlanRow(a.hidden, vec);
    if (!plan.ok()) return WithOp(kOp, plan.status());
    RETURN_IF_ERROR(DispatchRowPlan<T>(
        *plan, BwdLaunch<T>{a, partial, blocks, plan->threads, stream}));
  }
  return internal::FinalizeColumnPartials(partial, blocks, static_cast<int>(a.hidden), 2,
                                          a.dgamma, a.dbeta, a.accumulate_param_grads,
                                          stream);
}

}  // namespace

absl::Status LayerNormFwd(const LayerNormFwdArgs<float>& args, cudaStream_t stream) {
  return LayerNormFwdImpl(args, stream);
}
absl::Status LayerNormFwd(const LayerNormFwdArgs<Bfloat16>& args, cudaStream_t stream) {
  return LayerNormFwdImpl(args, stream);
}
absl::Status LayerNormBwd(const LayerNormBwdArgs<float>& args, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  return LayerNormBwdImpl(args, workspace, workspace_bytes, stream);
}
absl::Status LayerNormBwd(const LayerNormBwdArgs<Bfloat16>& args, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  return LayerNormBwdImpl(args, workspace, workspace_bytes, stream);
}

}  // namespace spgate::kernels
