#!/usr/bin/env bash
# Decision round trip vs a bare echo of the same stream shape (see the .cc header).
# Usage: bench/server/run.sh BUILD_DIR OUTDIR
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
"$build/bin/decision_roundtrip_bench" --groups=1,16,128 --seconds=3 --rounds=3 \
  --out="$out/decision_roundtrip.json" 2> >(grep -v '^spgated' >&2)
# Step plans of a pipelined job: 1, 8 and 64 micro-batches of 8 sequences (docs/design.md §12).
"$build/bin/decision_roundtrip_bench" --groups=16 --microbatches=1,8,64 --sequences=8 \
  --seconds=3 --rounds=3 --out="$out/decision_roundtrip_step_plans.json" \
  2> >(grep -v '^spgated' >&2)
# SIGTERM to exit with the /metrics endpoint on and off (docs/benchmarks.md, "Daemon stop").
python3 "$(dirname "$0")/stop_time.py" --spgated="$build/bin/spgated" --rounds=5 \
  --out="$out/stop_time.json"
