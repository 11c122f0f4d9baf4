#!/usr/bin/env bash
# Build spgate with CUDA for sm_90, run the `gpu`-labelled tests and the kernel
# benchmarks, and leave every log and result file in OUTDIR:
#   summary.txt              machine, toolchain, what ran and how it ended
#   build.log                configure + build output
#   ctest.log, ctest-gpu.xml ctest -L gpu (text and JUnit)
#   worker_gpu_test.log      the packed worker runtime gpu test (PREBUILT only)
#   kernels_gpu_bench.{txt,json}, kernels_cpu_bench.{txt,json}
# Usage: tests/gpu/run.sh OUTDIR
# Environment: BUILD_DIR (default build-gpu), CUDA_ARCH (default 90), JOBS,
# STEP_TIMEOUT (seconds each of ctest and the two benchmarks may run, default 900),
# PREBUILT=1 (BUILD_DIR was built elsewhere for this CUDA_ARCH, e.g. by
# tests/gpu/pack.sh on a machine with our dev packages: skip configure and build;
# a worker_runtime_gpu_test packed into BUILD_DIR/worker runs under the OpenMPI
# packed with it, its output in worker_gpu_test.log).
# Otherwise the full project is tried first; if it cannot be configured or built (e.g. a
# GPU box without gRPC), the kernels-only project in tests/gpu/standalone is
# used instead, and summary.txt says so. Exit status: 0 when the build, every
# gpu test (the packed worker test included) and both benchmarks succeeded and
# none was skipped; 1 otherwise.
set -u -o pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
BUILD=${BUILD_DIR:-build-gpu}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
SUMMARY="$OUT/summary.txt"
status=0

note() { echo "$*" | tee -a "$SUMMARY"; }

: > "$SUMMARY"
{
  echo "== spgate GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "host: $(uname -a)"
  echo "cpus: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  cmake --version | head -1
} >> "$SUMMARY" 2>&1

configure_and_build() {  # $1 = source dir
  cmake -S "$1" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DSPGATE_BUILD_BENCH=ON -DSPGATE_BUILD_TESTS=ON >> "$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j "$JOBS" >> "$OUT/build.log" 2>&1
}

: > "$OUT/build.log"
if [ "${PREBUILT:-0}" = 1 ]; then
  if [ ! -f "$BUILD/CTestTestfile.cmake" ]; then
    note "build: PREBUILT=1 but $BUILD holds no configured build"
    exit 1
  fi
  cp "$BUILD/build-info.txt" "$OUT/build.log" 2>/dev/null
  note "build: prebuilt ($BUILD), not rebuilt here"
elif configure_and_build "$ROOT"; then
  note "build: full project OK ($BUILD, sm_$ARCH)"
else
  note "build: full project failed (see build.log); falling back to tests/gpu/standalone"
  BUILD="$BUILD-kernels"
  if configure_and_build "$ROOT/tests/gpu/standalone"; then
    note "build: kernels-only project OK ($BUILD, sm_$ARCH)"
  else
    note "build: kernels-only project FAILED (see build.log)"
    exit 1
  fi
fi
if ! grep -q 'spgate.*: CUDA ON' "$OUT/build.log"; then
  note "warning: configure did not report CUDA ON; GPU tests may not exist"
fi

(cd "$BUILD" && timeout "$STEP_TIMEOUT" ctest -L gpu --no-tests=error --output-on-failure --output-junit "$OUT/ctest-gpu.xml") \
  > "$OUT/ctest.log" 2>&1
rc=$?
note "ctest -L gpu: exit $rc; $(grep -E 'tests passed|No tests were found' "$OUT/ctest.log" | tail -1)"
if grep -q '(Skipped)' "$OUT/ctest.log"; then
  note "warning: some gpu tests were SKIPPED (no usable device?)"
  status=1
fi
[ $rc -eq 0 ] || status=1

# The worker runtime's gpu test, when packed (tests/gpu/pack.sh WORKER_TEST=...);
# a full build ran it in ctest above.
W="$BUILD/worker"
if [ -x "$W/worker_runtime_gpu_test" ]; then
  lib_dir() {  # the folder of the first $1 found where CUDA images keep libraries
    local f
    f=$(find /usr/local/cuda/ /usr/local/cuda*/ /opt /usr/lib /usr/local/lib -name "$1" \
          2>/dev/null | head -1)
    [ -n "$f" ] && echo ":$(dirname "$f")"
  }
  (export OPAL_PREFIX="$W/ompi/usr" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
   ompi_libs=$(find "$W/ompi/usr/lib" -name 'lib*.so*' -printf '%h\n' | sort -u |
               sed 's/^/:/' | tr -d '\n')
   export LD_LIBRARY_PATH="$W/rt$ompi_libs$(lib_dir 'libnccl.so.2*')$(lib_dir 'libcublas.so.1*')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
   timeout "$STEP_TIMEOUT" "$W/ompi/usr/bin/orterun" -np 1 "$W/worker_runtime_gpu_test" \
     --gtest_color=no) > "$OUT/worker_gpu_test.log" 2>&1
  rc=$?
  note "worker_runtime_gpu_test: exit $rc; $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$OUT/worker_gpu_test.log" | tr '\n' ' ')"
  grep -q '^\[  SKIPPED' "$OUT/worker_gpu_test.log" && status=1
  [ $rc -eq 0 ] || status=1
fi

timeout "$STEP_TIMEOUT" "$BUILD/bin/kernels_gpu_bench" --json="$OUT/kernels_gpu_bench.json" \
  > "$OUT/kernels_gpu_bench.txt" 2>&1
rc=$?
note "kernels_gpu_bench: exit $rc"
[ $rc -eq 0 ] || status=1

timeout "$STEP_TIMEOUT" "$BUILD/bin/kernels_cpu_bench" --json="$OUT/kernels_cpu_bench.json" \
  > "$OUT/kernels_cpu_bench.txt" 2>&1
rc=$?
note "kernels_cpu_bench: exit $rc"
[ $rc -eq 0 ] || status=1

note "result: $([ $status -eq 0 ] && echo OK || echo FAILED)"
exit $status
