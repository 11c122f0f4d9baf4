#!/usr/bin/env python3
"""The client's step in nanoseconds, two or more builds in one run: each round runs every
build's client_step_bench once, in a shuffled order (seeded by the round), so the machine's
drift hits them alike; the table gives, per variant and build, the median of the runs'
median ns per step with its range, the median of the fastest quarter of runs, and that
quarter's submit / await / report, and the steps over all runs whose answer stalled or did
not come from the daemon (in the daemon variants), which then time something else.
(docs/benchmarks.md, "One plan, one path: the hot paths before and after";
bench/before_after.sh gives the ratios to each binary's own baseline instead.)

Usage: bench/client/step_compare.py NAME=BENCH_BINARY NAME=BENCH_BINARY [...]
         [--rounds=20] [--steps=3000] [--step_us=0] [--sequences=16] [--out=FILE.json]
  e.g. bench/client/step_compare.py old=../old/build/bench/client_step_bench \
         new=build/bench/client_step_bench --rounds=10 --step_us=1000
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

VARIANTS = ("local_only", "gate_client", "gate_client_group8")


def run_once(binary, args, out_json):
    cmd = [binary, f"--steps={args.steps}", f"--step_us={args.step_us}",
           f"--sequences={args.sequences}", f"--out={out_json}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    with open(out_json, encoding="utf-8") as f:
        return {r["name"]: r for r in json.load(f)["results"]}


def summarize(runs):
    """runs: the variant's per-run result dicts -> the table's figures."""
    medians = sorted(r["median_ns"] for r in runs)
    fastest = sorted(runs, key=lambda r: r["median_ns"])[:max(1, len(runs) // 4)]
    return {
        "median_ns": statistics.median(medians), "min_ns": medians[0], "max_ns": medians[-1],
        "fastest_quarter_ns": statistics.median(r["median_ns"] for r in fastest),
        "fastest_quarter_submit_ns": statistics.median(r["submit_p50_ns"] for r in fastest),
        "fastest_quarter_await_ns": statistics.median(r["await_p50_ns"] for r in fastest),
        "fastest_quarter_report_ns": statistics.median(r["report_p50_ns"] for r in fastest),
        "runs": len(runs),
        "stalled": sum(r["stalled"] for r in runs),
        "not_from_daemon": sum(r["not_from_daemon"] for r in runs),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="+", help="NAME=path/to/client_step_bench")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--step_us", type=int, default=0)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--out", default="")
    args = p.parse_args()
    builds = {}
    for b in args.builds:
        name, sep, path = b.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            sys.exit(f"step_compare: {b!r}: give NAME=an executable client_step_bench")
        if name in builds:
            sys.exit(f"step_compare: the name {name!r} is given twice")
        builds[name] = path
    if len(builds) < 2 or args.rounds < 1:
        sys.exit("step_compare: give at least two builds and --rounds >= 1")
    runs = {name: {v: [] for v in VARIANTS} for name in builds}
    with tempfile.TemporaryDirectory(prefix="step-compare-") as tmp:
        for r in range(args.rounds):
            order = list(builds)
            random.Random(r).shuffle(order)
            for name in order:
                results = run_once(builds[name], args, os.path.join(tmp, f"{name}.json"))
                for v in VARIANTS:
                    runs[name][v].append(results[v])
    table = {v: {name: summarize(runs[name][v]) for name in builds} for v in VARIANTS}
    print(f"client_step_bench --steps={args.steps} --step_us={args.step_us} "
          f"--sequences={args.sequences}, {args.rounds} rounds, order shuffled per round; "
          "median ns per step")
    print("| variant | build | median (range) | fastest quarter of runs "
          "(submit / await / report) | stalled / not from daemon |")
    print("|---|---|---:|---:|---:|")
    for v in VARIANTS:
        for name in builds:
            s = table[v][name]
            print(f"| `{v}` | {name} | {s['median_ns']:,.0f} ({s['min_ns']:,.0f}–"
                  f"{s['max_ns']:,.0f}) | {s['fastest_quarter_ns']:,.0f} "
                  f"({s['fastest_quarter_submit_ns']:,.0f} / {s['fastest_quarter_await_ns']:,.0f}"
                  f" / {s['fastest_quarter_report_ns']:,.0f}) | {s['stalled']} / "
                  f"{s['not_from_daemon'] if v != 'local_only' else '-'} |")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rounds": args.rounds, "steps": args.steps, "step_us": args.step_us,
                       "sequences": args.sequences, "builds": builds, "table": table}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
