#!/usr/bin/env bash
# What a plan's length statistics allow: the expected-value oracle against a chooser that
# reads only the statistics a plan carries, on the Megatron-style mix under every regime
# (bench/sim/stats_reference.py; docs/benchmarks.md, "What the length statistics allow").
# Usage: bench/stats_reference.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8), SEEDS ("11 12 13 14 15"), HARDWARE
# (h100-sxm), CELLS (|-separated cell names; default all), PYTHON (python3; needs numpy).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec "${PYTHON:-python3}" "$root/bench/sim/stats_reference.py" --sim="$build/bin/spgate-sim" \
  --out="$out" --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}" \
  --seeds="${SEEDS:-11 12 13 14 15}" --hardware="${HARDWARE:-h100-sxm}" --cells="${CELLS:-}"
