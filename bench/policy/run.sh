#!/usr/bin/env bash
# Runs the policy benchmark and prints a table of medians with ratios to the baseline
# measured in the same run (BM_SumLengths: a plain summation of the same lengths).
#
#   bench/policy/run.sh BUILD_DIR OUTDIR
#
# Writes OUTDIR/policy_bench.json (Google Benchmark JSON, every repetition and the
# aggregates) and OUTDIR/policy_bench.md (the table printed below). Environment:
# REPS (repetitions, default 10), MIN_TIME (seconds per repetition, default 0.2),
# FILTER (benchmark regex, default all).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
build_dir=$1
out_dir=$2
bin=$build_dir/bench/policy_bench
if [[ ! -x $bin ]]; then
  echo "$bin not found; build it with: cmake --build $build_dir --target policy_bench" >&2
  exit 1
fi
mkdir -p "$out_dir"
json=$out_dir/policy_bench.json

"$bin" \
  --benchmark_repetitions="${REPS:-10}" \
  --benchmark_min_time="${MIN_TIME:-0.2}" \
  --benchmark_enable_random_interleaving=true \
  --benchmark_filter="${FILTER:-.}" \
  --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_display_aggregates_only=true >&2

python3 - "$json" <<'EOF' | tee "$out_dir/policy_bench.md"
import json, re, sys

doc = json.load(open(sys.argv[1]))
ctx = doc["context"]
rows = {}  # run_name -> {aggregate: bench}
for b in doc["benchmarks"]:
    if b.get("run_type") == "aggregate":
        rows.setdefault(b["run_name"], {})[b["aggregate_name"]] = b
if not rows:
    sys.exit("no aggregates in the JSON (run with --benchmark_repetitions > 1)")

def ns(b, key="cpu_time"):
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
    return b[key] * scale

def seqs(name):
    m = re.search(r"seqs:(\d+)", name)
    return int(m.group(1)) if m else None

baseline = {seqs(n): ns(a["median"]) for n, a in rows.items()
            if n.startswith("BM_SumLengths/") and "median" in a}

load = ", ".join(f"{x:.2f}" for x in ctx.get("load_avg", []))
reps = next(iter(rows.values()))["median"].get("repetitions", "?")
print(f"policy_bench: median of {reps} repetitions, CPU time per iteration; "
      f"{ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, load {load}; "
      f"baseline = BM_SumLengths at the same batch size")
print()
print("| benchmark | seqs | median ns | wall ns | cv % | ns / seq | × baseline |")
print("|---|---:|---:|---:|---:|---:|---:|")
order = ["BM_SumLengths", "BM_ComputeLengthStats", "BM_EvaluateGates", "BM_Decision",
         "BM_DecisionWithTrace"]
def key(name):
    base = name.split("/")[0]
    args = [int(x) for x in re.findall(r":(\d+)", name)]  # numerically: 8 before 64
    return (order.index(base) if base in order else len(order), base, seqs(name) or 0, args)
for name, a in sorted(rows.items(), key=lambda kv: key(kv[0])):
    med = a.get("median")
    if med is None:
        continue
    n = seqs(name)
    t = ns(med)
    cv = a.get("cv")
    cv_txt = f"{100 * cv['cpu_time']:.1f}" if cv else "-"
    per_seq = f"{t / n:.3f}" if n else "-"
    ratio = f"{t / baseline[n]:.2f}" if n in baseline else "-"
    # The batch size has its own column; any other argument stays in the name
    # (BM_EvaluateAdaptive/switching:1, BM_ValidateTelemetry/microbatches:8).
    base = re.sub(r"/seqs:\d+", "", name) + (
        " (baseline)" if name.startswith("BM_SumLengths/") else "")
    print(f"| {base} | {n if n else '-'} | {t:.1f} | {ns(med, 'real_time'):.1f} | {cv_txt} "
          f"| {per_seq} | {ratio} |")

target = rows.get("BM_Decision/seqs:1000", {}).get("median")
if target is not None:
    t = ns(target)
    verdict = "meets" if t < 1000 else "MISSES"
    print()
    print(f"Decision for a 1,000-sequence batch: {t:.0f} ns ({verdict} the < 1 µs target), "
          f"{t / baseline[1000]:.2f}× the plain summation of its lengths.")
EOF
