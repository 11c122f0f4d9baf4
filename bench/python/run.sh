#!/usr/bin/env bash
# Per-step cost of the Python path (spgate.Client / spgate.torch.GroupDecider) vs the C++
# client's loop, same run, same daemon; see client_step_bench.py. Skips (exit 0) when the
# spgate module or PyTorch is missing.
# Usage: bench/python/run.sh BUILD_DIR OUTDIR   (PYTHON, STEPS, SEQUENCES override)
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
python=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" GLOO_SOCKET_IFNAME=lo
if ! "$python" -c 'import torch, spgate._spgate' 2>/dev/null; then
  echo "bench/python: spgate._spgate or torch not importable from $build/python; skipped" >&2
  exit 0
fi
mkdir -p "$out"
# Cold (a 1 ms step between the calls, as in training) and hot (back to back).
for step_us in 1000 0; do
  "$python" "$here/client_step_bench.py" --spgated="$build/bin/spgated" \
    --steps="${STEPS:-5000}" --step_us=$step_us --sequences="${SEQUENCES:-16}" \
    --out="$out/python_step_${step_us}us"
done
