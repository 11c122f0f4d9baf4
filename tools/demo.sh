#!/usr/bin/env bash
# make demo (docs/design.md §9): starts spgated on loopback (temporary state dir, port 0),
# runs a 4-rank CPU spgate-worker job under mpirun against it - 2 TP groups of 2 ranks
# running real transformer layers forward and backward - whose bimodal length mix makes the
# daemon choose both modes (mixed batches: TP-only for LENGTH_CV; uniform ones: SP), prints
# the worker's decision and throughput summary and the daemon's own decision counters, and
# stops the daemon with SIGTERM. Exits non-zero if any of that fails or the job did not run
# both modes. The API walkthrough (every gate reason, a live threshold change) is
# tools/demo_api.sh.
#
# Usage: tools/demo.sh BUILD_DIR [PATH/TO/spgated]
# Environment: DEMO_STEPS (default 30), MPIRUN (default mpirun).
set -euo pipefail

build_dir=${1:-build}
spgated=${2:-$build_dir/bin/spgated}
worker=$build_dir/bin/spgate-worker
mpirun=${MPIRUN:-mpirun}
steps=${DEMO_STEPS:-30}

for bin in "$spgated" "$worker"; do
  if [ ! -x "$bin" ]; then
    echo "demo: $bin not found; build first (make build)" >&2
    exit 2
  fi
done
if ! command -v "$mpirun" >/dev/null; then
  echo "demo: $mpirun not found; run make deps (openmpi-bin)" >&2
  exit 2
fi

source "$(dirname "$0")/start_spgated.sh" demo

echo "== starting spgated on loopback"
start_spgated "$spgated" "$tmp/state" "$tmp/spgated.log" demo
echo "   $line"

echo
echo "== 4 ranks (tp=2 x dp=2) under mpirun: 2-layer GPT blocks, hidden 64, $steps steps"
echo "   lengths bimodal 128 / 1024 tokens, 2048 tokens per batch, no bucketing"
# OpenMPI refuses root without these; --oversubscribe lets 4 ranks share fewer cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# In a sanitizer build (make test-asan runs this as demo_test), OpenMPI's own allocations
# that MPI_Finalize never frees would fail the job as leaks; the demo is not a leak test
# (worker_runtime_test is, without MPI).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
"$mpirun" --oversubscribe -np 4 "$worker" --backend=cpu --tp=2 \
  --controller="127.0.0.1:$port" --job_id=demo \
  --layers=2 --hidden=64 --heads=4 --ffn_hidden=256 \
  --lengths=bimodal:short=128,long=1024,p_long=0.3 --tokens_per_batch=2048 \
  --steps="$steps" --seed=7 --decision_log="$tmp/decisions" \
  --summary_json="$tmp/summary.json"

echo
echo "== rank 0's decision log (first 8 steps of $steps; every rank of a group logs the same)"
head -9 "$tmp/decisions.rank0.csv" | awk -F, '{ printf "   %-5s %-8s %-24s %s\n", $1, $2, $3, $4 }'

if [ -n "$metrics_port" ] && command -v curl >/dev/null; then
  echo
  echo "== spgated's view: spgate_decisions_total (http://127.0.0.1:$metrics_port/metrics)"
  curl -fsS "http://127.0.0.1:$metrics_port/metrics" | grep '^spgate_decisions_total' || true
fi

echo
echo "== stopping spgated (SIGTERM)"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""
tail -n 2 "$tmp/spgated.log" | sed 's/^/   /'

# The demo's promise: real layers under the daemon's decisions, both modes, no group
# ever split.
/usr/bin/env python3 - "$tmp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
problems = []
if set(s["decisions"]) != {"sp", "tp_only"}:
    problems.append(f"expected both modes, got {s['decisions']}")
if s["consistency_violations"]:
    problems.append(f"{s['consistency_violations']} consistency violations")
if problems:
    sys.exit("demo: " + "; ".join(problems))
print(f"\ndemo: ok - {s['steps']} steps per group, modes {sorted(s['decisions'])}, "
      f"{s['decision_sources']} decisions, no consistency violations")
PY
