// GPU kernel benchmarks, each against a baseline measured in the same run on
// the same stream (CUDA events, median of 5 batches of back-to-back launches):
//   LayerNorm forward and backward (fp32 and bf16 storage) bandwidth vs a
//     device-to-device cudaMemcpyAsync of the same bytes (target >= 0.8x).
//     Bytes: forward reads x, residual, writes residual_out, y; backward reads
//     dy, x, dresidual, writes dx: 4 * rows * hidden * sizeof(T) each (the
//     per-block dgamma/dbeta partials and O(rows) stats are not counted). A copy
//     of N bytes counts 2N.
//   GeLU forward / backward bandwidth vs the same copy.
//   Causal attention forward / backward TFLOP/s (useful causal FLOPs) vs a
//     cuBLAS sgemm with the same FLOPs (square, m = n = k = cbrt(flops / 2)),
//     once with plain fp32 and once with TF32 allowed on both sides.
//   Linear forward vs a bare cublasSgemm of the same shape.
// LayerNorm and attention outputs are checked against the CPU path on a sample
// before timing. Exits 3 (and writes nothing) when no device is present.
//
// Usage: kernels_gpu_bench [--json=kernels_gpu_bench.json] [--quick]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "bench/kernels/bench_util.h"
#include "kernels/attention.h"
#include "kernels/device_memory.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"

namespace spgate::bench {
namespace {

using namespace spgate::kernels;  // NOLINT: benchmark driver

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
template <typename T>
T Value(absl::StatusOr<T> v, const char* what) {
  Check(v.status(), what);
  return *std::move(v);
}

template <typename T>
std::vector<T> As(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = ToBfloat16(v[i]);
    return out;
  }
}

// Median over 5 batches of `iters` calls of seconds per call.
double GpuSeconds(const std::function<void()>& fn, cudaStream_t stream, int iters) {
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "event");
  CheckCuda(cudaEventCreate(&stop), "event");
  fn();  // warm-up
  CheckCuda(cudaStreamSynchronize(stream), "sync");
  std::vector<double> times;
  for (int b = 0; b < 5; ++b) {
    CheckCuda(cudaEventRecord(start, stream), "record");
    for (int i = 0; i < iters; ++i) fn();
    CheckCuda(cudaEventRecord(stop, stream), "record");
    CheckCuda(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    CheckCuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms * 1e-3 / iters);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double CopyGbps(size_t bytes, cudaStream_t stream) {
  auto src = Value(DeviceAllocation::Allocate(bytes), "alloc");
  auto dst = Value(DeviceAllocation::Allocate(bytes), "alloc");
  const double s = GpuSeconds(
      [&] {
        CheckCuda(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream),
                  "copy");
      },
      stream, 20);
  return 2.0 * bytes / s / 1e9;
}

template <typename T>
void BenchLayerNorm(const char* dtype, int64_t rows, int64_t hidden, cudaStream_t stream,
                    std::vector<Row>* out) {
  const int64_t n = rows * hidden;
  const std::vector<float> xf = Fill(n, 1, 2, 8), rf = Fill(n, 2), g = Fill(hidden, 3, 0.5f, 1.5f),
                           b = Fill(hidden, 4), dyf = Fill(n, 5);
  auto d_x = Value(DeviceBuffer<T>::FromHost(As<T>(xf), stream), "x");
  auto d_r = Value(DeviceBuffer<T>::FromHost(As<T>(rf), stream), "r");
  auto d_dy = Value(DeviceBuffer<T>::FromHost(As<T>(dyf), stream), "dy");
  auto d_g = Value(DeviceBuffer<float>::FromHost(g, stream), "g");
  auto d_b = Value(DeviceBuffer<float>::FromHost(b, stream), "b");
  auto d_sum = Value(DeviceBuffer<T>::Allocate(n), "sum");
  auto d_y = Value(DeviceBuffer<T>::Allocate(n), "y");
  auto d_dx = Value(DeviceBuffer<T>::Allocate(n), "dx");
  auto d_mean = Value(DeviceBuffer<float>::Allocate(rows), "mean");
  auto d_rstd = Value(DeviceBuffer<float>::Allocate(rows), "rstd");
  auto d_dg = Value(DeviceBuffer<float>::Allocate(hidden), "dg");
  auto d_db = Value(DeviceBuffer<float>::Allocate(hidden), "db");
  auto d_ws = Value(DeviceAllocation::Allocate(LayerNormBwdWorkspaceBytes(rows, hidden)), "ws");

  LayerNormFwdArgs<T> f;
  f.rows = rows;
  f.hidden = hidden;
  f.x = d_x.data();
  f.residual = d_r.data();
  f.gamma = d_g.data();
  f.beta = d_b.data();
  f.residual_out = d_sum.data();
  f.y = d_y.data();
  f.mean = d_mean.data();
  f.rstd = d_rstd.data();
  LayerNormBwdArgs<T> bw;
  bw.rows = rows;
  bw.hidden = hidden;
  bw.dy = d_dy.data();
  bw.x = d_sum.data();
  bw.gamma = d_g.data();
  bw.mean = d_mean.data();
  bw.rstd = d_rstd.data();
  bw.dresidual = d_dy.data();
  bw.dx = d_dx.data();
  bw.dgamma = d_dg.data();
  bw.dbeta = d_db.data();

  // Check the first rows' statistics against the CPU path.
  Check(LayerNormFwd(f, stream), "LayerNormFwd");
  {
    const int64_t k = std::min<int64_t>(rows, 4);
    const std::vector<T> sum_h = Value(d_sum.ToHost(stream), "sum");
    const std::vector<float> mean_h = Value(d_mean.ToHost(stream), "mean");
    std::vector<float> s(k * hidden), y(k * hidden), m(k), r(k);
    for (int64_t i = 0; i < k * hidden; ++i) s[i] = ToFloat(sum_h[i]);
    LayerNormFwdArgs<float> c;
    c.rows = k;
    c.hidden = hidden;
    c.x = s.data();
    c.gamma = g.data();
    c.beta = b.data();
    c.y = y.data();
    c.mean = m.data();
    c.rstd = r.data();
    Check(LayerNormFwdCpu(c), "LayerNormFwdCpu");
    for (int64_t i = 0; i < k; ++i) {
      if (std::abs(m[i] - mean_h[i]) > 1e-4 * (1 + std::abs(m[i]))) {
        std::fprintf(stderr, "layernorm %s: mean mismatch row %ld: %g vs %g\n", dtype,
                     static_cast<long>(i), mean_h[i], m[i]);
        std::exit(1);
      }
    }
  }

  const double bytes = 4.0 * n * sizeof(T);
  const double t_fwd = GpuSeconds([&] { Check(LayerNormFwd(f, stream), "fwd"); }, stream, 20);
  const double t_bwd = GpuSeconds(
      [&] { Check(LayerNormBwd(bw, d_ws.data(), d_ws.bytes(), stream), "bwd"); }, stream, 20);
  const double copy = CopyGbps(static_cast<size_t>(bytes / 2), stream);
  const std::string shape = Shape({{"rows", rows}, {"hidden", hidden}});
  out->push_back({std::string("layernorm_fwd_") + dtype, shape, t_fwd, bytes / t_fwd / 1e9,
                  "GB/s", "D2D copy same bytes", copy, 0.8});
  out->push_back({std::string("layernorm_bwd_") + dtype, shape, t_bwd, bytes / t_bwd / 1e9,
                  "GB/s", "D2D copy same bytes", copy, 0.8});
}

template <typename T>
void BenchGelu(const char* dtype, int64_t rows, int64_t cols, cudaStream_t stream,
               std::vector<Row>* out) {
  const int64_t n = rows * cols;
  auto d_pre = Value(DeviceBuffer<T>::FromHost(As<T>(Fill(n, 6, -4, 4)), stream), "pre");
  auto d_dy = Value(DeviceBuffer<T>::FromHost(As<T>(Fill(n, 7)), stream), "dy");
  auto d_bias = Value(DeviceBuffer<float>::FromHost(Fill(cols, 8), stream), "bias");
  auto d_y = Value(DeviceBuffer<T>::Allocate(n), "y");
  auto d_dbias = Value(DeviceBuffer<float>::Allocate(cols), "dbias");
  auto d_ws = Value(DeviceAllocation::Allocate(GeluBwdWorkspaceBytes(rows, cols)), "ws");
  GeluFwdArgs<T> f{rows, cols, d_pre.data(), d_bias.data(), d_y.data()};
  GeluBwdArgs<T> b{rows, cols, d_dy.data(), d_pre.data(), d_bias.data(), d_y.data(),
                   d_dbias.data(), false};
  const double t_fwd = GpuSeconds([&] { Check(GeluFwd(f, stream), "gelu fwd"); }, stream, 20);
  const double t_bwd = GpuSeconds(
      [&] { Check(GeluBwd(b, d_ws.data(), d_ws.bytes(), stream), "gelu bwd"); }, stream, 20);
  const double fwd_bytes = 2.0 * n * sizeof(T), bwd_bytes = 3.0 * n * sizeof(T);
  const double copy = CopyGbps(static_cast<size_t>(bwd_bytes / 2), stream);
  const std::string shape = Shape({{"rows", rows}, {"cols", cols}});
  out->push_back({std::string("bias_gelu_fwd_") + dtype, shape, t_fwd, fwd_bytes / t_fwd / 1e9,
                  "GB/s", "D2D copy same bytes", copy, 0});
  out->push_back({std::string("bias_gelu_bwd_") + dtype, shape, t_bwd, bwd_bytes / t_bwd / 1e9,
                  "GB/s", "D2D copy same bytes", copy, 0});
}

// cuBLAS sgemm with (about) `flops` FLOPs: square m = n = k.
double SgemmTflops(double flops, const CublasHandle& blas, cudaStream_t stream) {
  int64_t s = static_cast<int64_t>(std::cbrt(flops / 2.0));
  s = std::max<int64_t>(64, s / 64 * 64);
  auto a = Value(DeviceBuffer<float>::FromHost(Fill(s * s, 9), stream), "a");
  auto b = Value(DeviceBuffer<float>::FromHost(Fill(s * s, 10), stream), "b");
  auto c = Value(DeviceBuffer<float>::Allocate(s * s), "c");
  GemmArgs g;
  g.m = g.n = g.k = s;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.lda = g.ldb = g.ldc = s;
  const double t = GpuSeconds([&] { Check(Gemm(g, blas.get(), stream), "sgemm"); }, stream, 5);
  return 2.0 * s * s * s / t / 1e12;
}

void BenchAttention(const std::string& name, const std::vector<int64_t>& lengths, int64_t heads,
                    int64_t dim, bool tf32, cudaStream_t stream, std::vector<Row>* out) {
  CublasHandle blas = Value(CublasHandle::Create(tf32), "cublas");
  const std::vector<int64_t> cu = Offsets(lengths);
  const int64_t tokens = cu.back(), hd = heads * dim;
  AttentionShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  const std::vector<float> qkv_h = Fill(tokens * 3 * hd, 11);
  auto qkv = Value(DeviceBuffer<float>::FromHost(qkv_h, stream), "qkv");
  auto dout = Value(DeviceBuffer<float>::FromHost(Fill(tokens * hd, 12), stream), "dout");
  auto o = Value(DeviceBuffer<float>::Allocate(tokens * hd), "out");
  auto lse = Value(DeviceBuffer<float>::Allocate(tokens * heads), "lse");
  auto dqkv = Value(DeviceBuffer<float>::Allocate(tokens * 3 * hd), "dqkv");
  auto ws = Value(DeviceAllocation::Allocate(AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu))),
                  "ws");
  AttentionFwdArgs f{shape, cu, qkv.data(), o.data(), lse.data(), ws.data(), ws.bytes()};
  AttentionBwdArgs b{shape,      cu,          qkv.data(), o.data(), dout.data(),
                     lse.data(), dqkv.data(), ws.data(),  ws.bytes()};
  Check(AttentionFwd(f, blas.get(), stream), "AttentionFwd");
  if (!tf32) {  // check the first sequence's lse against the CPU path
    const int64_t l0 = lengths[0];
    const std::vector<int64_t> one = {0, l0};
    std::vector<float> q1(qkv_h.begin(), qkv_h.begin() + l0 * 3 * hd), o1(l0 * hd),
        lse1(l0 * heads), w1(AttentionFwdWorkspaceBytes(shape, l0) / 4);
    Check(AttentionFwdCpu({shape, one, q1.data(), o1.data(), lse1.data(), w1.data(),
                           w1.size() * 4}),
          "AttentionFwdCpu");
    const std::vector<float> lse_h = Value(lse.ToHost(stream), "lse");
    for (int64_t i = 0; i < l0 * heads; ++i) {
      if (std::abs(lse_h[i] - lse1[i]) > 1e-3 * (1 + std::abs(lse1[i]))) {
        std::fprintf(stderr, "attention lse mismatch at %ld: %g vs %g\n", static_cast<long>(i),
                     lse_h[i], lse1[i]);
        std::exit(1);
      }
    }
  }
  const double ff = AttentionFwdFlops(shape, cu), bf = AttentionBwdFlops(shape, cu);
  const double t_fwd =
      GpuSeconds([&] { Check(AttentionFwd(f, blas.get(), stream), "fwd"); }, stream, 3);
  const double t_bwd =
      GpuSeconds([&] { Check(AttentionBwd(b, blas.get(), stream), "bwd"); }, stream, 3);
  const std::string math = tf32 ? " tf32" : " fp32";
  const std::string sh = Shape({{"tokens", tokens},
                                {"seqs", static_cast<int64_t>(lengths.size())},
                                {"heads", heads},
                                {"dim", dim}});
  out->push_back({"attention_fwd " + name + math, sh, t_fwd, ff / t_fwd / 1e12, "TF/s",
                  "sgemm same FLOPs" + math, SgemmTflops(ff, blas, stream), 0});
  out->push_back({"attention_bwd " + name + math, sh, t_bwd, bf / t_bwd / 1e12, "TF/s",
                  "sgemm same FLOPs" + math, SgemmTflops(bf, blas, stream), 0});
}

void BenchLinear(int64_t rows, int64_t in, int64_t out_f, cudaStream_t stream,
                 std::vector<Row>* out) {
  CublasHandle blas = Value(CublasHandle::Create(false), "cublas");
  auto x = Value(DeviceBuffer<float>::FromHost(Fill(rows * in, 13), stream), "x");
  auto w = Value(DeviceBuffer<float>::FromHost(Fill(out_f * in, 14), stream), "w");
  auto bias = Value(DeviceBuffer<float>::FromHost(Fill(out_f, 15), stream), "bias");
  auto y = Value(DeviceBuffer<float>::Allocate(rows * out_f), "y");
  const LinearFwdArgs f{{rows, in, out_f}, x.data(), w.data(), bias.data(), y.data()};
  const double t = GpuSeconds([&] { Check(LinearFwd(f, blas.get(), stream), "linear"); }, stream, 5);
  const float one = 1, zero = 0;
  const double tg = GpuSeconds(
      [&] {
        cublasSetStream(blas.get(), stream);
        cublasSgemm(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, out_f, rows, in, &one, w.data(), in,
                    x.data(), in, &zero, y.data(), out_f);
      },
      stream, 5);
  const double flops = 2.0 * rows * in * out_f;
  out->push_back({"linear_fwd (+bias) fp32",
                  Shape({{"rows", rows}, {"in", in}, {"out", out_f}}), t, flops / t / 1e12,
                  "TF/s", "cublasSgemm same shape", flops / tg / 1e12, 0});
}

}  // namespace
}  // namespace spgate::bench

int main(int argc, char** argv) {
  using namespace spgate::bench;  // NOLINT
  std::string json = "kernels_gpu_bench.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (ParseFlag(argv[i], "--json", &v)) {
      json = v;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json=PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  std::string reason;
  if (spgate::kernels::CudaDeviceCount(&reason) == 0) {
    std::fprintf(stderr, "kernels_gpu_bench: no CUDA device (%s)\n", reason.c_str());
    return 3;
  }
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "properties");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreate(&stream), "stream");

  std::vector<Row> rows;
  const int64_t tokens = quick ? 4096 : 16384;
  BenchLayerNorm<float>("fp32", tokens, 4096, stream, &rows);
  BenchLayerNorm<spgate::kernels::Bfloat16>("bf16", tokens, 4096, stream, &rows);
  BenchLayerNorm<spgate::kernels::Bfloat16>("bf16", tokens, 8192, stream, &rows);
  BenchGelu<spgate::kernels::Bfloat16>("bf16", tokens, 16384, stream, &rows);
  for (bool tf32 : {false, true}) {
    BenchAttention("one_seq", {quick ? 2048 : 8192}, 16, 128, tf32, stream, &rows);
    if (!quick) {
      BenchAttention("mixed", {4096, 2048, 1024, 512, 512, 256, 128, 64, 33, 1}, 16, 128, tf32,
                     stream, &rows);
    }
  }
  BenchLinear(tokens, 4096, 4096, stream, &rows);

  const std::vector<std::pair<std::string, std::string>> context = {
      {"device", prop.name},
      {"sm", std::to_string(prop.major) + std::to_string(prop.minor)},
      {"quick", quick ? "true" : "false"}};
  const int rc = Report(json, "kernels_gpu", context, rows);
  cudaStreamDestroy(stream);
  return rc;
}
