#!/usr/bin/env bash
# SP vs TP-only by sequence length from the cost model (docs/benchmarks.md, "SP vs TP-only
# by sequence length"): 2K-128K tokens, TP 4 and 8, h100-sxm and h200-sxm, a 70B-class
# stage; the ratio, whether each mode fits, and a figure (matplotlib). No SEEDS: each point
# is one sequence length with no noise, so no figure depends on the seed (one run).
# Usage: bench/sp_crossover.sh [BUILD_DIR] [OUTDIR]  -> OUTDIR/sp_crossover.{json,md,png}
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
# The figure needs matplotlib: SPGATE_PLOT_PYTHON (as spgate-sim --plot), else python3, else
# Debian's /usr/bin/python3 where python3 (a pyenv one, say) lacks it.
py=${SPGATE_PLOT_PYTHON:-python3}
if ! "$py" -c 'import matplotlib' 2>/dev/null && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  py=/usr/bin/python3
fi
exec "$py" "$root/bench/sim/sp_crossover.py" --sim="$build/bin/spgate-sim" --out="$out"
