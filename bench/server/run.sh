#!/usr/bin/env bash
# Decision round trip vs a bare echo of the same stream shape (see the .cc header).
# Usage: bench/server/run.sh BUILD_DIR OUTDIR
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
"$build/bin/decision_roundtrip_bench" --groups=1,16,128 --seconds=3 --rounds=3 \
  --out="$out/decision_roundtrip.json" 2> >(grep -v '^spgated' >&2)
