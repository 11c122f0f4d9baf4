#!/usr/bin/env bash
# make torch-demo: starts spgated on loopback (temporary state dir, port 0), trains the
# small GPT of examples/torch/train.py with 4 CPU processes (2 TP groups of 2, gloo)
# under its decisions, prints the summary JSON, the daemon's spgate_decisions_total, and
# stops the daemon. Exits non-zero if the run fails, a group ever split, or the job did
# not run both modes. Like tools/demo.sh, for the PyTorch integration (docs/pytorch.md).
#
# Usage: examples/torch/demo.sh BUILD_DIR
# Environment: DEMO_STEPS (default 30), PYTHON (default /usr/bin/python3: Debian's
# python3-torch is installed for it).
set -euo pipefail

build_dir=${1:-build}
spgated=$build_dir/bin/spgated
python=${PYTHON:-/usr/bin/python3}
steps=${DEMO_STEPS:-30}
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -x "$spgated" ] || ! ls "$build_dir"/python/spgate/_spgate*.so >/dev/null 2>&1; then
  echo "torch-demo: $spgated or the spgate Python module not found; build first (make build)" >&2
  exit 2
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "torch-demo: $python cannot import torch; run make deps (python3-torch)" >&2
  exit 2
fi

source "$(dirname "$0")/../../tools/start_spgated.sh" torch-demo

echo "== starting spgated on loopback"
start_spgated "$spgated" "$tmp" "$tmp/spgated.log" torch-demo
echo "   $line"

echo
echo "== 4 processes (tp=2 x dp=2, gloo): a 2-layer GPT, hidden 64, $steps steps"
PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
  "$python" "$here/train.py" --controller="127.0.0.1:$port" --job_id=torch-demo \
  --steps="$steps" --decision_log="$tmp/decisions" --summary_json="$tmp/summary.json" >/dev/null
"$python" -c 'import json,sys; s=json.load(open(sys.argv[1])); s.pop("run"); print(json.dumps(s, indent=2, sort_keys=True))' "$tmp/summary.json"

echo
echo "== rank 0's decision log (first 8 steps; every rank of a group logs the same)"
head -9 "$tmp/decisions.rank0.csv" | awk -F, '{ printf "   %-5s %-8s %-24s %s\n", $1, $2, $3, $4 }'

if command -v curl >/dev/null; then
  echo
  echo "== spgated's view: spgate_decisions_total (http://127.0.0.1:$metrics_port/metrics)"
  curl -fsS "http://127.0.0.1:$metrics_port/metrics" | grep '^spgate_decisions_total' || true
fi

echo
echo "== stopping spgated (SIGTERM)"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""

"$python" - "$tmp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
problems = []
if set(s["decisions"]) != {"sp", "tp_only"}:
    problems.append(f"expected both modes, got {s['decisions']}")
if s["consistency_violations"]:
    problems.append(f"{s['consistency_violations']} consistency violations")
if problems:
    sys.exit("torch-demo: " + "; ".join(problems))
print(f"\ntorch-demo: ok - {s['steps']} steps per group, modes {sorted(s['decisions'])}, "
      f"{s['decision_sources']} decisions, loss {s['loss_first']:.2f} -> {s['loss_last']:.2f}, "
      f"no consistency violations")
PY
