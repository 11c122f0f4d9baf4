#!/usr/bin/env bash
# Per-step client cost (SubmitPlan + AwaitDecision with the decision there +
# ReportTelemetry) vs the hand-off baseline; see client_step_bench.cc.
# Usage: bench/client/run.sh BUILD_DIR OUTDIR
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
# Cold (a 1 ms step between the calls, as in training) and hot (back to back).
for step_us in 1000 0; do
  "$build/bench/client_step_bench" --steps="${STEPS:-5000}" --step_us=$step_us \
    --sequences="${SEQUENCES:-16}" --out="$out/client_step_${step_us}us.json" \
    2> >(grep -v '^spgated' >&2) | tee "$out/client_step_${step_us}us.md"
done
# The group session's telemetry on MPI ranks, collective included (group_reduce_bench.cc):
# 2 ranks (one a core) and 8 (a TP group, oversubscribed on a small machine).
if [ -x "$build/bench/group_reduce_bench" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
  for np in 2 8; do
    mpirun --oversubscribe -np $np "$build/bench/group_reduce_bench" --steps="${REDUCE_STEPS:-2000}" \
      --rounds=5 --out="$out/group_reduce_${np}.json" | tee "$out/group_reduce_${np}.md"
  done
fi
