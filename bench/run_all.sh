#!/usr/bin/env bash
# Runs every benchmark that was built, writing JSON results under bench/results/.
# Usage: bench/run_all.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
out=${OUT:-bench/results}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
for script in "$root"/bench/*/run.sh; do
  [ -x "$script" ] || continue
  echo "== $(basename "$(dirname "$script")") =="
  bash "$script" "$build" "$out"
done
