// CPU kernel benchmarks, each against a baseline measured in the same run:
//   LayerNorm (residual-add fused) forward + backward bandwidth vs memcpy of
//     the same number of bytes (target >= 0.5x). Bytes counted: forward reads
//     x, residual, writes residual_out, y; backward reads dy, x, dresidual,
//     writes dx: 8 * rows * hidden * 4 bytes (stats and params are O(rows +
//     hidden) and not counted). memcpy of N bytes counts 2N (read + write).
//   Linear forward / backward-data / backward-weight GFLOP/s vs a bare
//     OpenBLAS sgemm of the same m, n, k.
//   Causal attention forward / backward GFLOP/s (useful causal FLOPs: 2 GEMMs
//     x 2 * head_dim * L(L+1)/2 per head forward, twice that backward) vs
//     sgemm of the QK^T shape (m = n = L, k = head_dim, all heads).
// Every timed kernel is checked once against the reference on a sample.
// Defaults match the worker's CPU backend (one rank per core): one OpenBLAS
// thread, and times are the calling thread's CPU time, so other processes on a
// shared machine do not skew the ratios. --blas_threads=N (N > 1) switches to
// wall-clock time, which multi-threaded BLAS needs.
//
// Usage: kernels_cpu_bench [--json=kernels_cpu_bench.json] [--quick]
//                          [--blas_threads=N] [--timer=cpu|wall]
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "bench/kernels/bench_util.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"

namespace spgate::bench {
namespace {

using namespace spgate::kernels;  // NOLINT: benchmark driver

bool CheckClose(const char* what, const float* got, const std::vector<double>& want,
                double tol) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
      std::fprintf(stderr, "%s: verification failed at %zu: %g vs %g\n", what, i, got[i],
                   want[i]);
      return false;
    }
  }
  return true;
}

void BenchLayerNorm(int64_t rows, int64_t hidden, const TimingOptions& t, std::vector<Row>* out) {
  const int64_t n = rows * hidden;
  std::vector<float> x = Fill(n, 1, 2, 8), res = Fill(n, 2), gamma = Fill(hidden, 3, 0.5f, 1.5f),
                     beta = Fill(hidden, 4), dy = Fill(n, 5), dres = Fill(n, 6);
  std::vector<float> sum(n), y(n), dx(n), mean(rows), rstd(rows), dg(hidden), db(hidden);
  LayerNormFwdArgs<float> f;
  f.rows = rows;
  f.hidden = hidden;
  f.x = x.data();
  f.residual = res.data();
  f.gamma = gamma.data();
  f.beta = beta.data();
  f.residual_out = sum.data();
  f.y = y.data();
  f.mean = mean.data();
  f.rstd = rstd.data();
  LayerNormBwdArgs<float> b;
  b.rows = rows;
  b.hidden = hidden;
  b.dy = dy.data();
  b.x = sum.data();
  b.gamma = gamma.data();
  b.mean = mean.data();
  b.rstd = rstd.data();
  b.dresidual = dres.data();
  b.dx = dx.data();
  b.dgamma = dg.data();
  b.dbeta = db.data();

  // Verify a sample of rows against the reference.
  Check(LayerNormFwdCpu(f), "LayerNormFwdCpu");
  const int64_t sample = std::min<int64_t>(rows, 4);
  std::vector<double> xs(x.begin(), x.begin() + sample * hidden),
      rs(res.begin(), res.begin() + sample * hidden), gs(gamma.begin(), gamma.end()),
      bs(beta.begin(), beta.end());
  auto ref = LayerNormFwdRef(sample, hidden, 1e-5, xs, rs, gs, bs);
  Check(ref.status(), "LayerNormFwdRef");
  if (!CheckClose("layernorm y", y.data(), ref->y, 1e-4)) std::exit(1);

  const double fwd_bytes = 4.0 * n * sizeof(float), bwd_bytes = 4.0 * n * sizeof(float);
  // memcpy moving the same bytes as each pass: copy bytes / 2 (read + write).
  const size_t copy_bytes = static_cast<size_t>(fwd_bytes / 2);
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  auto copy = [&] { std::memcpy(dst.data(), src.data(), copy_bytes); };
  const auto [t_fwd, t_copy1] =
      MedianSecondsPair([&] { Check(LayerNormFwdCpu(f), "fwd"); }, copy, t);
  const auto [t_bwd, t_copy2] =
      MedianSecondsPair([&] { Check(LayerNormBwdCpu(b), "bwd"); }, copy, t);
  const double copy_gbps = 2.0 * copy_bytes / std::min(t_copy1, t_copy2) / 1e9;
  const double copy_half_gbps = copy_gbps;

  const std::string shape = Shape({{"rows", rows}, {"hidden", hidden}});
  out->push_back({"layernorm_fwd+bwd_fp32", shape, t_fwd + t_bwd,
                  (fwd_bytes + bwd_bytes) / (t_fwd + t_bwd) / 1e9, "GB/s", "memcpy same bytes",
                  copy_gbps, 0.5});
  out->push_back({"layernorm_fwd_fp32", shape, t_fwd, fwd_bytes / t_fwd / 1e9, "GB/s",
                  "memcpy same bytes", copy_half_gbps, 0});
  out->push_back({"layernorm_bwd_fp32", shape, t_bwd, bwd_bytes / t_bwd / 1e9, "GB/s",
                  "memcpy same bytes", copy_half_gbps, 0});
}

void BenchLinear(int64_t rows, int64_t in, int64_t out_f, const TimingOptions& t,
                 std::vector<Row>* out) {
  const LinearShape s{rows, in, out_f};
  std::vector<float> x = Fill(rows * in, 9), w = Fill(out_f * in, 10), bias = Fill(out_f, 11),
                     dy = Fill(rows * out_f, 12);
  std::vector<float> y(rows * out_f), dx(rows * in), dw(out_f * in), db(out_f);
  // Verify one output row.
  Check(LinearFwdCpu({s, x.data(), w.data(), bias.data(), y.data()}), "LinearFwdCpu");
  {
    std::vector<double> xr(x.begin(), x.begin() + in), wr(w.begin(), w.end()),
        br(bias.begin(), bias.end());
    auto ref = LinearFwdRef({1, in, out_f}, xr, wr, br);
    Check(ref.status(), "LinearFwdRef");
    if (!CheckClose("linear y", y.data(), *ref, 1e-4)) std::exit(1);
  }
  const double flops = 2.0 * rows * in * out_f;
  const std::string shape = Shape({{"rows", rows}, {"in", in}, {"out", out_f}});
  // The baseline: the same product as a bare sgemm (same operands, same layout).
  auto sgemm = [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const std::vector<float>& a,
                  const std::vector<float>& b, std::vector<float>& c) {
    return [&, ta, tb, m, n, k] {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0f, c.data(), n);
    };
  };
  std::vector<float> c_fwd(rows * out_f), c_bd(rows * in), c_bw(out_f * in);
  const auto [t_fwd, g_fwd] = MedianSecondsPair(
      [&] { Check(LinearFwdCpu({s, x.data(), w.data(), bias.data(), y.data()}), "f"); },
      sgemm(false, true, rows, out_f, in, x, w, c_fwd), t);
  const auto [t_bd, g_bd] = MedianSecondsPair(
      [&] { Check(LinearBwdDataCpu({s, dy.data(), w.data(), dx.data(), false}), "d"); },
      sgemm(false, false, rows, in, out_f, dy, w, c_bd), t);
  const auto [t_bw, g_bw] = MedianSecondsPair(
      [&] { Check(LinearBwdWeightCpu({s, dy.data(), x.data(), dw.data(), db.data(), false}), "w"); },
      sgemm(true, false, out_f, in, rows, dy, x, c_bw), t);
  out->push_back({"linear_fwd (+bias)", shape, t_fwd, flops / t_fwd / 1e9, "GF/s",
                  "sgemm NT same m,n,k", flops / g_fwd / 1e9, 0});
  out->push_back({"linear_bwd_data", shape, t_bd, flops / t_bd / 1e9, "GF/s",
                  "sgemm NN same m,n,k", flops / g_bd / 1e9, 0});
  out->push_back({"linear_bwd_weight (+dbias)", shape, t_bw, flops / t_bw / 1e9, "GF/s",
                  "sgemm TN same m,n,k", flops / g_bw / 1e9, 0});
}

void BenchAttention(const std::string& name, const std::vector<int64_t>& lengths, int64_t heads,
                    int64_t dim, int64_t query_block, const TimingOptions& t,
                    std::vector<Row>* out) {
  const std::vector<int64_t> cu = Offsets(lengths);
  const int64_t tokens = cu.back(), hd = heads * dim;
  AttentionShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  shape.query_block = query_block;
  std::vector<float> qkv = Fill(tokens * 3 * hd, 13), dout = Fill(tokens * hd, 14);
  std::vector<float> o(tokens * hd), lse(tokens * heads), dqkv(tokens * 3 * hd);
  std::vector<float> ws(AttentionBwdWorkspaceBytes(shape, MaxSeqLen(cu)) / sizeof(float));
  AttentionFwdArgs f;
  f.shape = shape;
  f.cu_seqlens = cu;
  f.qkv = qkv.data();
  f.out = o.data();
  f.lse = lse.data();
  f.workspace = ws.data();
  f.workspace_bytes = ws.size() * sizeof(float);
  AttentionBwdArgs b;
  b.shape = shape;
  b.cu_seqlens = cu;
  b.qkv = qkv.data();
  b.out = o.data();
  b.dout = dout.data();
  b.lse = lse.data();
  b.dqkv = dqkv.data();
  b.workspace = ws.data();
  b.workspace_bytes = ws.size() * sizeof(float);
  // Verify: the shortest sequence against the reference.
  Check(AttentionFwdCpu(f), "AttentionFwdCpu");
  {
    size_t s = 0;
    for (size_t i = 1; i < lengths.size(); ++i) {
      if (lengths[i] < lengths[s]) s = i;
    }
    const std::vector<int64_t> one = {0, lengths[s]};
    std::vector<double> q(qkv.begin() + cu[s] * 3 * hd, qkv.begin() + cu[s + 1] * 3 * hd);
    auto ref = AttentionFwdRef(shape, one, q);
    Check(ref.status(), "AttentionFwdRef");
    if (!CheckClose("attention out", o.data() + cu[s] * hd, ref->out, 1e-4)) std::exit(1);
  }
  const double fwd_flops = AttentionFwdFlops(shape, cu), bwd_flops = AttentionBwdFlops(shape, cu);
  // Baseline: the QK^T product of the longest sequence without the causal
  // mask, as a plain sgemm (m = n = L, k = head_dim), timed alternately.
  const int64_t lmax = MaxSeqLen(cu);
  std::vector<float> ga = Fill(lmax * dim, 15), gb = Fill(lmax * dim, 16), gc(lmax * lmax);
  auto qk = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, lmax, lmax, dim, 1.0f, ga.data(), dim,
                gb.data(), dim, 0.0f, gc.data(), lmax);
  };
  const auto [t_fwd, g1] = MedianSecondsPair([&] { Check(AttentionFwdCpu(f), "fwd"); }, qk, t);
  const auto [t_bwd, g2] = MedianSecondsPair([&] { Check(AttentionBwdCpu(b), "bwd"); }, qk, t);
  const double g_rate = 2.0 * lmax * lmax * dim / std::min(g1, g2) / 1e9;
  std::string sh = Shape({{"tokens", tokens}, {"seqs", static_cast<int64_t>(lengths.size())},
                          {"heads", heads}, {"dim", dim}, {"qblock", query_block}});
  out->push_back({"attention_fwd " + name, sh, t_fwd, fwd_flops / t_fwd / 1e9, "GF/s",
                  "sgemm NT m=n=Lmax k=dim", g_rate, 0});
  out->push_back({"attention_bwd " + name, sh, t_bwd, bwd_flops / t_bwd / 1e9, "GF/s",
                  "sgemm NT m=n=Lmax k=dim", g_rate, 0});
}

}  // namespace
}  // namespace spgate::bench

int main(int argc, char** argv) {
  using namespace spgate::bench;  // NOLINT
  std::string json = "kernels_cpu_bench.json", threads_flag = "1", timer;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (ParseFlag(argv[i], "--json", &v)) {
      json = v;
    } else if (ParseFlag(argv[i], "--blas_threads", &v)) {
      threads_flag = v;
    } else if (ParseFlag(argv[i], "--timer", &v) && (v == "cpu" || v == "wall")) {
      timer = v;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json=PATH] [--quick] [--blas_threads=N] [--timer=cpu|wall]\n",
                   argv[0]);
      return 2;
    }
  }
  const int blas_threads = std::max(1, std::atoi(threads_flag.c_str()));
  spgate::kernels::SetCpuBlasThreads(blas_threads);
  if (timer.empty()) timer = blas_threads == 1 ? "cpu" : "wall";
  if (timer == "cpu" && blas_threads > 1) {
    std::fprintf(stderr, "--timer=cpu needs --blas_threads=1 (thread CPU time)\n");
    return 2;
  }
  TimingOptions t;
  t.clock = timer == "cpu" ? Clock::kThreadCpu : Clock::kWall;
  if (quick) t.min_seconds = 0.05;

  std::vector<Row> rows;
  BenchLayerNorm(quick ? 1024 : 4096, quick ? 1024 : 4096, t, &rows);
  if (!quick) BenchLayerNorm(2048, 1024, t, &rows);
  BenchLinear(quick ? 512 : 2048, 1024, quick ? 1024 : 4096, t, &rows);
  BenchAttention("one_seq", {quick ? 1024 : 4096}, 8, 64, 1024, t, &rows);
  if (!quick) {
    // A bucketed batch of mixed lengths (what the worker packs).
    BenchAttention("mixed", {2048, 1024, 1024, 512, 512, 256, 256, 128, 128, 64, 33, 17, 1}, 8,
                   64, 1024, t, &rows);
  }

  const std::vector<std::pair<std::string, std::string>> context = {
      {"blas_threads", std::to_string(spgate::kernels::CpuBlasThreads())},
      {"hardware_threads", std::to_string(std::thread::hardware_concurrency())},
      {"timer", timer == "cpu" ? "thread_cpu_time" : "wall_clock"},
      {"quick", quick ? "true" : "false"}};
  return Report(json, "kernels_cpu", context, rows);
}
