#!/usr/bin/env bash
# What a mode switch costs on the CPU worker, with the arena's block cache as it is
# (size classes, blocks kept 64 unused steps) against the exact-size cache kept one
# step (the baseline), in the same run: 4 ranks, one TP group, SP and TP-only in turns
# of N steps (spgate-worker --mode=alternate:N), the two caches interleaved round by
# round on the same seeds. Prints and writes OUTDIR/switch_cost.md and .json: per cache,
# the medians over rounds of switch_cost_ratio and of the bytes a step took from the
# device (first steps after a switch and the others), and the tokens/s of the classes
# cache over the baseline's in the same round. See docs/benchmarks.md ("What a mode
# switch costs").
#
# Usage: bench/switch_cost.sh [BUILD_DIR] [OUTDIR]
# Environment: ROUNDS (8), STEPS (160), TURN (8), MPIRUN (mpirun).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
exec /usr/bin/env python3 "$root/bench/worker/switch_cost.py" --build="$build" --out="$out" \
  --rounds="${ROUNDS:-8}" --steps="${STEPS:-160}" --turn="${TURN:-8}" --mpirun="${MPIRUN:-mpirun}"
