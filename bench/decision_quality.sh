#!/usr/bin/env bash
# The decision-quality grid of docs/benchmarks.md: `spgate-sim replay --compare` over length
# traces x cost-model regimes (sp, tp_only, static, adaptive and the per-batch oracle on
# the same batches and noise), the table with each target checked per cell, and a PNG of
# tokens/s over time on the shifting trace; then the pipeline (PP) cells, decided per (stage,
# micro-batch). CELLS=pp runs only the PP cells, CELLS=grid only the rest. Every cell runs once
# per seed of SEEDS; the tables give each figure's median over the seeds and its range, and
# check the targets on the medians.
# Usage: bench/decision_quality.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8; GROUPS is bash's own), CELLS (all | grid | pp),
# REGRET_WINDOW (1000 steps), SWITCH_COST_S (0: switching is free), SEEDS ("11 12 13 14 15")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec python3 "$root/bench/sim/decision_quality.py" --sim="$build/bin/spgate-sim" --out="$out" \
  --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}" --cells="${CELLS:-all}" \
  --regret_window="${REGRET_WINDOW:-1000}" --switch_cost_s="${SWITCH_COST_S:-0}" \
  --seeds="${SEEDS:-11 12 13 14 15}"
