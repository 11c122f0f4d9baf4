#!/usr/bin/env bash
# CPU kernel benchmarks (ratios to memcpy / sgemm measured in the same run); the GPU
# benchmark runs too when it was built and a device is present.
# Usage: bench/kernels/run.sh BUILD_DIR OUTDIR
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
"$build/bin/kernels_cpu_bench" --json="$out/kernels_cpu_bench.json"
if [ -x "$build/bin/kernels_gpu_bench" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  "$build/bin/kernels_gpu_bench" --json="$out/kernels_gpu_bench.json"
fi
