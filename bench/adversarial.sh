#!/usr/bin/env bash
# The adversarial campaign, long form: tests/integration/adversarial_test.py with more
# requests, more client threads and a longer run than ctest's short form (10,000
# requests, 3 threads, at most 40 s). Hostile requests on every RPC of GateService and
# AdminService, each status checked against its documented code, while a real
# spgate-sim job runs against the same spgated; the daemon must not crash, health must
# stay SERVING, its RSS must stay under ADV_RSS_LIMIT_MB, and the job must keep getting
# the daemon's decisions. docs/reliability.md ("Adversarial campaign") has the figures.
#
# Usage: bench/adversarial.sh [BUILD_DIR] [OUTDIR]
#   ADV_REQUESTS=100000 ADV_SECONDS=300 ADV_THREADS=4 ADV_RSS_LIMIT_MB=256 \
#     bench/adversarial.sh build out/bench-adversarial
# Writes OUTDIR/adversarial.json (requests by expected code, RSS, limit refusals, the
# real job's summary) and prints the same. Loopback only; exits non-zero on any failure.
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
requests=${ADV_REQUESTS:-100000}
seconds=${ADV_SECONDS:-300}
threads=${ADV_THREADS:-4}
rss=${ADV_RSS_LIMIT_MB:-256}
here=$(cd "$(dirname "$0")" && pwd)
for b in "$build/bin/spgated" "$build/bin/spgate-sim"; do
  [ -x "$b" ] || { echo "missing $b (build it first)" >&2; exit 2; }
done
mkdir -p "$out"
exec /usr/bin/python3 "$here/../tests/integration/adversarial_test.py" \
  --spgated="$build/bin/spgated" --sim="$build/bin/spgate-sim" \
  --requests="$requests" --max_seconds="$seconds" --threads="$threads" \
  --rss_limit_mb="$rss" --sim_seconds="$seconds" --summary_json="$out/adversarial.json"
