#!/usr/bin/env bash
# The API walkthrough (make demo's first version): starts spgated on loopback with a
# temporary state dir, drives a scripted job through the real gRPC API until every gate
# reason (except CONTROLLER_UNAVAILABLE and ADAPTIVE) has fired, changes a threshold and
# shows it take effect, prints the decision counts from /metrics and stops the daemon
# with SIGTERM. Exits non-zero if any of that did not happen. The driver is
# tools/demo/demo.py (no generated stubs: it uses server reflection, like grpcurl).
#
# Usage: tools/demo_api.sh BUILD_DIR [PATH/TO/spgated]
# (make demo runs tools/demo.sh, the workers demo; this is the API walkthrough.)
set -euo pipefail

build_dir=${1:-build}
spgated=${2:-$build_dir/bin/spgated}
# Debian's interpreter: python3-grpcio and python3-protobuf install there (a pyenv or
# venv python3 earlier on PATH usually lacks them).
python=/usr/bin/python3

if [ ! -x "$spgated" ]; then
  echo "demo: $spgated not found; build first (make build)" >&2
  exit 2
fi
if ! "$python" -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "demo: $python cannot import grpc and google.protobuf; run make deps" \
       "(python3-grpcio, python3-protobuf)" >&2
  exit 2
fi
exec "$python" "$(dirname "$0")/demo/demo.py" --spgated="$spgated"
