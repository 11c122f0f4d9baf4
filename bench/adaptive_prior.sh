#!/usr/bin/env bash
# What ADAPTIVE's physics prior buys: every adaptive_flips cell at the default flip interval,
# switching free and at 0.01 s, with the static gates or the physics prior deciding the
# bands without samples (bench/sim/adaptive_prior.py; docs/benchmarks.md, "The physics
# prior").
# Usage: bench/adaptive_prior.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec python3 "$root/bench/sim/adaptive_prior.py" --sim="$build/bin/spgate-sim" --out="$out" \
  --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}"
