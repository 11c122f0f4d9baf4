#!/usr/bin/env bash
# A change's cost on the hot paths, measured against the code before it in the same run:
# the policy's decision (policy_bench: BM_Decision/seqs:1000, BM_EvaluateGates and
# BM_EvaluateAdaptive, each over BM_SumLengths/seqs:1000 of the same binary), the client's
# per step (client_step_bench: the gate client's step over its hand-off baseline) and the
# decision round trip (decision_roundtrip_bench: spgated over the bare echo service), from two build trees, alternated ROUNDS times so
# machine noise hits both. Every figure is a ratio to the baseline its own binary measured
# in the same launch; the table gives each tree's median ratio over the rounds and new/old.
# The policy's figures come in nanoseconds too (their baseline is compiled by each tree),
# and a policy benchmark whose set-up check failed stops the table, naming it.
#
# Usage: bench/before_after.sh OLD_BUILD NEW_BUILD [OUTDIR]
#   (each BUILD a tree configured with -DSPGATE_BUILD_BENCH=ON and these targets built:
#    policy_bench client_step_bench decision_roundtrip_bench)
# Environment: ROUNDS (3), STEPS (client steps per run, 3000), RT_SECONDS (round-trip
# seconds per run, 2; SECONDS is bash's own).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 OLD_BUILD NEW_BUILD [OUTDIR]" >&2
  exit 2
fi
old=$1
new=$2
out=${3:-bench/results/before_after}
mkdir -p "$out"
for tree in "$old" "$new"; do
  for bin in bench/policy_bench bench/client_step_bench bin/decision_roundtrip_bench; do
    [[ -x $tree/$bin ]] || { echo "$tree/$bin not found; build it first" >&2; exit 1; }
  done
done
rounds=${ROUNDS:-3}
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    tree=$old
    [[ $side == new ]] && tree=$new
    "$tree/bench/policy_bench" --benchmark_filter='BM_(SumLengths|Decision)/seqs:1000$|BM_EvaluateGates$|BM_EvaluateAdaptive/switching:0$' \
      --benchmark_repetitions=3 --benchmark_min_time=0.1 --benchmark_format=json \
      > "$out/policy_${side}_$r.json" 2>/dev/null
    "$tree/bench/client_step_bench" --steps="${STEPS:-3000}" --step_us=0 --sequences=16 \
      --out="$out/client_${side}_$r.json" > /dev/null 2> >(grep -v '^spgated' >&2)
    "$tree/bin/decision_roundtrip_bench" --groups=1,16 --seconds="${RT_SECONDS:-2}" \
      --rounds=1 --out="$out/roundtrip_${side}_$r.json" > /dev/null 2> >(grep -v '^spgated' >&2)
  done
done
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def policy(side, r):
    d = json.load(open(f"{out}/policy_{side}_{r}.json"))
    med = {b["run_name"]: b["real_time"] for b in d["benchmarks"]
           if b.get("aggregate_name") == "median"}
    for b in d["benchmarks"]:  # a benchmark whose set-up check failed times nothing
        if b.get("error_occurred"):
            sys.exit(f"{out}/policy_{side}_{r}.json: {b['run_name']} failed: {b['error_message']}")
    base = med["BM_SumLengths/seqs:1000"]
    names = ("BM_Decision/seqs:1000", "BM_EvaluateGates", "BM_EvaluateAdaptive/switching:0")
    res = {f"{name} / BM_SumLengths/seqs:1000": med[name] / base for name in names}
    # The same in nanoseconds: the baseline is code each tree compiles, and a compiler
    # that vectorises one tree's summation and not the other's moves every ratio.
    res.update({f"{name}, ns": med[name] for name in names + ("BM_SumLengths/seqs:1000",)})
    return res

def client(side, r):
    d = json.load(open(f"{out}/client_{side}_{r}.json"))
    return {f"client step ({x['name']}) / handoff": x["ratio_to_baseline"]
            for x in d["results"] if x["name"] != "handoff"}

def roundtrip(side, r):
    d = json.load(open(f"{out}/roundtrip_{side}_{r}.json"))
    res = {}
    for x in d["results"]:
        res[f"round trip p50, {x['groups']} leaders / echo"] = x["ratio"]["p50"]
        res[f"round trip throughput, {x['groups']} leaders / echo"] = x["ratio"]["throughput"]
    return res

rows = {}
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        for f in (policy, client, roundtrip):
            for k, v in f(side, r).items():
                rows.setdefault(k, {"old": [], "new": []})[side].append(v)
table = {}
lines = ["| figure (ratio to its baseline) | old (median, range) | new (median, range) | new / old |",
         "|---|---:|---:|---:|"]
for k, v in rows.items():
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    table[k] = {"old": v["old"], "new": v["new"], "old_median": o, "new_median": n,
                "new_over_old": n / o}
    f = ".0f" if k.endswith(", ns") else ".2f"
    lines.append(f"| {k} | {o:{f}} ({min(v['old']):{f}}–{max(v['old']):{f}}) | "
                 f"{n:{f}} ({min(v['new']):{f}}–{max(v['new']):{f}}) | {n / o:.2f} |")
json.dump({"rounds": rounds, "figures": table}, open(f"{out}/before_after.json", "w"), indent=1)
open(f"{out}/before_after.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
