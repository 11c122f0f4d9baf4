#!/usr/bin/env bash
# What a kill -9 of spgated costs ADAPTIVE in exploration (docs/benchmarks.md, "Learning
# across a kill -9"): tests/integration/learned_restart_test.py, once per length-stream
# seed. Each run counts the PROBE steps of a cold start's first 500 steps, of the first 500
# steps the restarted daemon decides for a job that had learned, and of the same job over
# the same steps on a daemon never killed; it fails when the restart adds more than 10 % of
# the cold start's.
#
# Usage: bench/learned_restart.sh [BUILD_DIR] [OUTDIR]
#   SEEDS="1 2 3 4 5" bench/learned_restart.sh build bench/results
# Writes OUTDIR/learned_restart.json (each seed's figures, and the medians with their
# range) and prints its table; exits 1 if a run failed.
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
for b in spgated spgatectl spgate-sim; do
  [ -x "$build/bin/$b" ] || { echo "missing $build/bin/$b (build it first)" >&2; exit 2; }
done
runs=()
for seed in ${SEEDS:-1 2 3 4 5}; do
  f="$out/learned_restart_seed$seed.json"
  rm -f "$f"
  /usr/bin/python3 "$root/tests/integration/learned_restart_test.py" \
    --spgated="$build/bin/spgated" --spgatectl="$build/bin/spgatectl" \
    --sim="$build/bin/spgate-sim" --seed="$seed" --json_out="$f" >&2 ||
    { echo "learned_restart_test failed for seed $seed" >&2; exit 1; }
  runs+=("$seed=$f")
done
/usr/bin/python3 - "$out/learned_restart.json" "${runs[@]}" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], sys.argv[2:]
per = {}
for r in runs:
    seed, path = r.split("=", 1)
    with open(path) as f:
        per[seed] = json.load(f)
fields = {
    "cold_probe_steps": lambda d: d["cold_first_500_steps"]["probe_steps"],
    "after_restart_probe_steps": lambda d: d["after_restart_first_500_steps"]["probe_steps"],
    "never_restarted_probe_steps": lambda d: d["never_restarted_same_steps"]["probe_steps"],
    "ratio_to_cold": lambda d: d["ratio_to_cold"],
    "ratio_to_cold_beyond_never_restarted":
        lambda d: d["ratio_to_cold_beyond_never_restarted"],
}
summary = {}
for name, get in fields.items():
    v = [get(d) for d in per.values()]
    summary[name] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
with open(out, "w") as f:
    json.dump({"seeds": per, "summary": summary}, f, indent=2)
print("| figure | median (range) over seeds " + " ".join(per) + " |")
print("|---|---:|")
for name, s in summary.items():
    print(f"| {name} | {s['median']:g} ({s['min']:g}–{s['max']:g}) |")
PY
