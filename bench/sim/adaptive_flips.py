#!/usr/bin/env python3
"""What ADAPTIVE's flip cap and learned switch cost buy (docs/benchmarks.md, "Flip cap and
switch cost"): every cell of the decision-quality grid, its stress cells and its PP cells
(bench/sim/decision_quality.py), run under a matrix of adaptive_flip_interval_steps (1: no
cap; 50: the default) x the simulator's --switch_cost_s (0: switching is free; 0.01 s,
about a tenth of a step; 0.03 s). Each cell is the same batches and noise for every
policy and configuration (seed 11), so the ratios compare like with like.

Per configuration it prints and writes OUT/adaptive_flips.md and .json: over the cells,
how many have ADAPTIVE below STATIC (ties within 0.05 % count as ties) and below the best
fixed choice by more than 1 % over the run; the median and worst of ADAPTIVE's windowed
regret medians; the lowest window of ADAPTIVE over the best fixed choice; ADAPTIVE's
flips per 1,000 steps (median, max) and its exploration share in stationary cells (max).

Usage: adaptive_flips.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decision_quality as dq  # noqa: E402

INTERVALS = [1, 50]
SWITCH_COSTS = [0.0, 0.01, 0.03]


def cells(steps):
    """(name, flags, steps, regret_window, stationary) of every grid, stress and PP cell."""
    dq.set_shift(steps)
    out = []
    for bname, bflags in dq.BATCHING.items():
        for tname, (tflags, _) in dq.TRACES.items():
            for rname, rflags in dq.REGIMES.items():
                out.append((f"{bname} {tname} {rname}", dq.merge_flags(tflags, rflags) + bflags,
                            steps, 1000, tname in dq.STATIONARY_TRACES))
    for name, (flags, _) in dq.STRESS.items():
        out.append((name, flags + ["--bucketing=false"], steps, 1000, True))
    for name, (flags, _) in dq.PP_CELLS.items():
        m = int(next(f for f in flags if f.startswith("--microbatches=")).split("=")[1])
        out.append((name, flags, max(1, steps // m), max(1, 1000 // m), True))
    return out


def run(sim, flags, steps, groups, window, interval, switch_cost, config_dir):
    config = os.path.join(config_dir, f"interval{interval}.textproto")
    with open(config, "w") as f:
        f.write(f"adaptive_flip_interval_steps: {interval}\n")
    cmd = [sim, "replay", "--compare", f"--steps={steps}", f"--groups={groups}", "--seed=11",
           "--summary_json=/dev/stdout", f"--regret_window={window}", f"--config={config}",
           f"--switch_cost_s={switch_cost}"] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)["compare"]


def summarize(results):
    """One configuration's line over its cells."""
    below_static = below_fixed = 0
    medians, lowest, flips, explore = [], [], [], []
    for r in results:
        c = r["compare"]
        tps = {p: c[p]["effective_tokens_per_s"] for p in ("sp", "tp_only", "static", "adaptive")}
        fixed = max(tps["sp"], tps["tp_only"])
        below_static += tps["adaptive"] < tps["static"] * (1 - 0.0005)
        below_fixed += tps["adaptive"] < 0.99 * fixed
        medians.append(c["adaptive"]["regret_window_median"])
        lowest.append(c["adaptive"]["min_window_vs_best_fixed"])
        flips.append(c["adaptive"]["flips_per_1000_steps"])
        if r["stationary"]:
            explore.append(c["adaptive"]["explore_share"])
    return {"cells": len(results), "adaptive_below_static": below_static,
            "adaptive_below_best_fixed_1pct": below_fixed,
            "regret_median_median": statistics.median(medians), "regret_median_worst": max(medians),
            "lowest_window_vs_best_fixed": min(lowest),
            "flips_per_1000_median": statistics.median(flips), "flips_per_1000_max": max(flips),
            "explore_stationary_max": max(explore)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--groups", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, everything = [], []
    head = ("| flip interval | switch cost s | cells | adaptive < static | adaptive < 0.99 x best "
            "fixed | windowed regret median: median / worst cell % | lowest window / best fixed "
            "| flips / 1000 steps: median / max | explore % in stationary cells, max |\n"
            "|---:|---:|---:|---:|---:|---|---:|---|---:|")
    print(head, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for sc in SWITCH_COSTS:
            for interval in INTERVALS:
                results = []
                for name, flags, steps, window, stationary in cells(a.steps):
                    results.append({"cell": name, "stationary": stationary,
                                    "compare": run(a.sim, flags, steps, a.groups, window, interval,
                                                   sc, tmp)})
                s = summarize(results)
                everything.append({"flip_interval": interval, "switch_cost_s": sc, "summary": s,
                                   "cells": results})
                row = ("| %d | %g | %d | %d | %d | %.2f / %.2f | %.4f | %.1f / %.1f | %.3f |" % (
                    interval, sc, s["cells"], s["adaptive_below_static"],
                    s["adaptive_below_best_fixed_1pct"], 100 * s["regret_median_median"],
                    100 * s["regret_median_worst"], s["lowest_window_vs_best_fixed"],
                    s["flips_per_1000_median"], s["flips_per_1000_max"],
                    100 * s["explore_stationary_max"]))
                rows.append(row)
                print(row, flush=True)
    with open(os.path.join(a.out, "adaptive_flips.md"), "w") as f:
        f.write(head + "\n" + "\n".join(rows) + "\n")
    with open(os.path.join(a.out, "adaptive_flips.json"), "w") as f:
        json.dump(everything, f)


if __name__ == "__main__":
    main()
