#!/usr/bin/env bash
# The seeds' 8xH100 32K table from the cost model (docs/benchmarks.md, "The seed table"):
# tp_only, sp_default, sp_bucketed and sp_bucketed_norm_in_shard on the h100-sxm preset,
# medians over seeds with their range, each beside the seeds' figure.
# Usage: bench/seed_table.sh [BUILD_DIR] [OUTDIR]    -> OUTDIR/seed_table.{json,md}
# Environment: SEEDS ("1 2 3 4 5": the seeds of the length trace), STEPS (1000)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
exec python3 "$root/bench/sim/seed_table.py" --sim="$build/bin/spgate-sim" --out="$out" \
  --seeds="${SEEDS:-1 2 3 4 5}" --steps="${STEPS:-1000}"
