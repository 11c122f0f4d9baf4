#!/usr/bin/env bash
# Where ADAPTIVE's misses in the decision-quality grid come from: the grid of
# bench/decision_quality.sh again, once per ADAPTIVE variant (margin, exploration share).
# Every cell runs once per seed of SEEDS; per-cell figures are medians over the seeds.
# Usage: bench/adaptive_ablation.sh [BUILD_DIR] [OUTDIR]
# Environment: STEPS (4000), SIM_GROUPS (8), SEEDS ("11 12 13 14 15")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec python3 "$root/bench/sim/adaptive_ablation.py" --sim="${1:-build}/bin/spgate-sim" \
  --out="${2:-bench/results}" --steps="${STEPS:-4000}" --groups="${SIM_GROUPS:-8}" \
  --seeds="${SEEDS:-11 12 13 14 15}"
