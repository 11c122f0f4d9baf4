#!/usr/bin/env bash
# What ADAPTIVE's flip cap and learned switch cost buy: the decision-quality grid, stress
# and PP cells under adaptive_flip_interval_steps {1, 50} x --switch_cost_s {0, 0.01, 0.03}
# (bench/sim/adaptive_flips.py; docs/benchmarks.md, "The flip cap and switch cost").
# Usage: bench/adaptive_flips.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec python3 "$root/bench/sim/adaptive_flips.py" --sim="$build/bin/spgate-sim" --out="$out" \
  --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}"
