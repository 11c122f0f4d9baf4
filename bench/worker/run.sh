#!/usr/bin/env bash
# bench/run_all.sh hook: the worker replay table (bench/replay_table.sh).
#   bench/worker/run.sh BUILD_DIR OUTDIR
set -euo pipefail
exec bash "$(dirname "$0")/../replay_table.sh" "$@"
