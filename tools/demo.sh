#!/usr/bin/env bash
# make demo (docs/design.md §9): starts spgated on loopback (temporary state dir, port 0),
# runs a 4-rank CPU spgate-worker job under mpirun against it - 2 TP groups of 2 ranks
# running real transformer layers forward and backward - whose bimodal length mix makes the
# daemon choose both modes (mixed batches: TP-only for LENGTH_CV; uniform ones: SP), prints
# the worker's decision and throughput summary, then a pipelined job (tp=2 x pp=2, 4
# micro-batches a step) whose first stage runs SP and last stage TP-only under one memory
# budget (docs/design.md §12), and the daemon's own decision counters, and
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

echo
echo "== a pipelined job: 4 ranks (tp=2 x pp=2), 1F1B over 4 micro-batches a step"
# The length CV as the gate computes it (population standard deviation / mean), from
# the same lengths the micro-batches are made of.
pipe_lengths=(64 64 512)
cv=$(/usr/bin/env python3 -c 'import statistics as s, sys; l = [int(a) for a in sys.argv[1:]]
print(f"{s.pstdev(l) / s.mean(l):.2f}")' "${pipe_lengths[@]}")
echo "   every micro-batch $(IFS=+; echo "${pipe_lengths[*]}") tokens (length CV $cv: TP-only wanted), one memory budget"
# The budget: what the first stage holds with all its micro-batches SP (it holds two at
# once), or the last stage TP-only (it holds one) if more - measured by two short forced
# runs. Under it the first stage must run SP and the last may run TP-only (docs/design.md §12).
printf '%s\n' "${pipe_lengths[@]}" > "$tmp/pipe_lengths.txt"
pipe=(--backend=cpu --tp=2 --pp=2 --microbatches=4 --layers=2 --hidden=64 --heads=4
      --ffn_hidden=128 --tokens_per_batch=640 --lengths="file:$tmp/pipe_lengths.txt" --seed=7)
for m in sp tp; do
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
  "$mpirun" --oversubscribe -np 4 "$worker" "${pipe[@]}" --mode=$m --steps=2 \
    --summary_json="$tmp/pipe_$m.json" > /dev/null
done
budget=$(/usr/bin/env python3 - "$tmp/pipe_sp.json" "$tmp/pipe_tp.json" <<'PY'
import json, math, sys
sp, tp = (json.load(open(p))["stages"] for p in sys.argv[1:3])
print(math.ceil(max(sp[0]["peak_memory_bytes"], tp[1]["peak_memory_bytes"]) / 0.9))
PY
)
echo "   budget $budget bytes (x memory_headroom 0.9)"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
"$mpirun" --oversubscribe -np 4 "$worker" "${pipe[@]}" --controller="127.0.0.1:$port" \
  --job_id=demo-pipeline --memory_budget="$budget" --steps=6 --decision_deadline=2s \
  --decision_log="$tmp/pipe" --summary_json="$tmp/pipe.json" > /dev/null
echo "   step 0 on each stage (rank 0: stage 0, rank 2: stage 1):"
for r in 0 2; do
  sed -n '2,5p' "$tmp/pipe.rank$r.csv" |
    awk -F, '{ printf "   step %s stage %s micro-batch %s: %-8s %-20s %s\n", $1, $5, $6, $2, $3, $4 }'
done
/usr/bin/env python3 - "$tmp/pipe.json" "$budget" <<'PY'
import json, sys
s, budget = json.load(open(sys.argv[1])), int(sys.argv[2])
for st in s["stages"]:
    print(f"   stage {st['stage']}: decisions {st['decisions']}, peak {st['peak_memory_bytes']} "
          f"bytes ({st['peak_memory_bytes'] / budget:.0%} of the budget)")
problems = []
if s["stages"][0]["decisions"] != {"sp": {"memory_requires_sp": 24}}:
    problems.append(f"stage 0 should run SP for memory: {s['stages'][0]['decisions']}")
if "tp_only" not in s["stages"][1]["decisions"]:
    problems.append(f"stage 1 should run TP-only: {s['stages'][1]['decisions']}")
if s["p2p_size_mismatches"] or s["consistency_violations"]:
    problems.append("p2p size mismatches or consistency violations")
if any(st["peak_memory_bytes"] > budget for st in s["stages"]):
    problems.append("a stage's measured peak is over the budget")
if problems:
    sys.exit("demo: " + "; ".join(problems))
PY

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
