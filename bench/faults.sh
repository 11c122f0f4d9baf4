#!/usr/bin/env bash
# The long fault campaign (docs/reliability.md, "Fault campaign"): while a 4-rank
# spgate-worker job and a 1,024-rank spgate-sim job run against one spgated on loopback,
# the daemon is killed and restarted, frozen past the decision deadline, denied its state
# dir during config writes, and killed at random moments inside >= 1,000 `spgatectl gates
# set` calls. tests/integration/fault_campaign.py holds the assertions (the short profile
# of the same script is the ctest fault_campaign_test).
#
# Usage: bench/faults.sh [BUILD_DIR] [OUTDIR]
#   FAULT_WRITES=1000 FAULT_DURATION=900 FAULT_SEED=13 bench/faults.sh build bench/results
# Writes OUTDIR/faults.json (faults by kind and count, reconnect times, both jobs'
# figures) and prints it; exits 1 if any assertion failed (the temp dir is then kept and
# named on stderr).
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
for b in spgated spgatectl spgate-worker spgate-sim; do
  [ -x "$build/bin/$b" ] || { echo "missing $build/bin/$b (build it first)" >&2; exit 2; }
done
mpirun=$(command -v mpirun) || { echo "mpirun not found (openmpi-bin)" >&2; exit 2; }
extra=()
[ -n "${FAULT_WRITES:-}" ] && extra+=("--writes=$FAULT_WRITES")
[ -n "${FAULT_DURATION:-}" ] && extra+=("--duration_s=$FAULT_DURATION")
/usr/bin/python3 "$root/tests/integration/fault_campaign.py" \
  --spgated="$build/bin/spgated" --spgatectl="$build/bin/spgatectl" \
  --worker="$build/bin/spgate-worker" --sim="$build/bin/spgate-sim" --mpirun="$mpirun" \
  --profile=long --seed="${FAULT_SEED:-13}" --report="$out/faults.json" "${extra[@]}"
