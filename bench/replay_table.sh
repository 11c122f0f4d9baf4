#!/usr/bin/env bash
# Reproduces the replay table of docs/design.md §1 on this machine with the reference
# worker: 4 ranks (one TP group of 4) on the CPU backend, the same seeded length stream
# for every row,
#   pure TP | SP always (gather LN, no bucketing) | SP + bucketing (gather LN) |
#   SP + bucketing + shard LN | spgate auto (spgated decides, bucketing, shard LN) |
#   spgate adaptive (policy ADAPTIVE) | spgate adaptive with a memory budget at SP's peak
# with peak memory, effective tokens/s and step-time p95 relative to pure TP, all rows
# measured in the same run (ROUNDS rounds, row order rotated each round; the figures are
# medians over rounds, with the best round beside them). Writes OUTDIR/replay_table.md and OUTDIR/replay_table.json and
# prints the table, tokens/s paired with pure TP by round (median and 95 % interval) and
# the worker targets. See docs/benchmarks.md ("Worker replay table").
#
# Usage: bench/replay_table.sh [BUILD_DIR] [OUTDIR]
# Environment: ROUNDS (5), STEPS (30), MPIRUN (mpirun), WORKER_ARGS (extra worker flags),
# ADAPTIVE_ARGS (extra gate flags for the ADAPTIVE rows' jobs, which otherwise run every
# ADAPTIVE setting at its default; the report names them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-bench/results}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
exec /usr/bin/env python3 "$root/bench/worker/replay_table.py" --build="$build" --out="$out" \
  --rounds="${ROUNDS:-5}" --steps="${STEPS:-30}" --mpirun="${MPIRUN:-mpirun}" \
  --extra="${WORKER_ARGS:-}" --adaptive_flags="${ADAPTIVE_ARGS:-}"
