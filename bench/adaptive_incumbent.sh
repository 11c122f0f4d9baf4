#!/usr/bin/env bash
# ADAPTIVE against the rule it replaces: the decision-quality grid, its PP and stress cells
# and cells in none of them (a Megatron-style packed lognormal mix under five regimes, TP 4),
# switching free and at SWITCH_COSTS, each run once per seed of SEEDS: every figure's median
# over the seeds and its range, the targets checked on the medians
# (bench/sim/adaptive_incumbent.py; docs/benchmarks.md, "ADAPTIVE against the static gates").
# Usage: bench/adaptive_incumbent.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8), SWITCH_COSTS (0,0.01), SETS (grid,pp,stress,unseen),
# SEEDS ("11 12 13 14 15"), HARDWARE (h100-sxm; the simulator's preset for every cell),
# CELLS (all; or '|'-separated cell names, e.g. "heavy_stragglers", to rerun a few),
# CONFIG (none; a GateConfig text file every run takes, e.g. other ADAPTIVE settings).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec python3 "$root/bench/sim/adaptive_incumbent.py" --sim="$build/bin/spgate-sim" --out="$out" \
  --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}" --switch_costs="${SWITCH_COSTS:-0,0.01}" \
  --sets="${SETS:-grid,pp,stress,unseen}" --seeds="${SEEDS:-11 12 13 14 15}" \
  --hardware="${HARDWARE:-h100-sxm}" --cells="${CELLS:-}" --config="${CONFIG:-}"
