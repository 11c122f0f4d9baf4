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

Then, on the shifting trace (packed, default regime) and on every stationary grid cell,
from a series of 10-step windows: ADAPTIVE's regret against the oracle over the first 500
steps against its regret from step 1,000 on (the cold start), and after the shift of the
length mix, how many steps until a 200-step window's regret is back under 1 %, and the
worst 200-step window after that (the re-learning); and OUT/shift_reconvergence.{csv,png}
(gnuplot): STATIC's and ADAPTIVE's (capped and not) tokens/s over the oracle's per 50 steps
around the shift, switching free.

Usage: adaptive_flips.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
"""
import argparse
import json
import os
import shutil
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


def run(sim, flags, steps, groups, window, interval, switch_cost, config_dir, series=None):
    config = os.path.join(config_dir, f"interval{interval}.textproto")
    with open(config, "w") as f:
        f.write(f"adaptive_flip_interval_steps: {interval}\n")
    cmd = [sim, "replay", "--compare", f"--steps={steps}", f"--groups={groups}", "--seed=11",
           "--summary_json=/dev/stdout", f"--regret_window={window}", f"--config={config}",
           f"--switch_cost_s={switch_cost}"] + flags
    if series:
        cmd += [f"--compare_series={series}", "--compare_window=10"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    cmp = json.loads(out.stdout)["compare"]
    # A line per cell on a terminal or with BENCH_PROGRESS=1 (decision_quality.py).
    dq.CELL_PROGRESS.add(sp=cmp["adaptive"]["sp_steps"], tp=cmp["adaptive"]["tp_only_steps"])
    return cmp


def read_series(path):
    """{policy: [tokens/s of each 10-step window]} from --compare_series."""
    with open(path) as f:
        head = f.readline().strip().split(",")
        rows = [list(map(float, line.split(","))) for line in f if line.strip()]
    return {name: [r[i] for r in rows] for i, name in enumerate(head) if name != "step"}


def regret(series, policy, lo, hi):
    """1 − T_oracle / T_policy over windows [lo, hi): every window holds the same batches
    under every policy, so its time is proportional to 1 / tokens/s."""
    t_oracle = sum(1 / x for x in series["oracle"][lo:hi])
    t_policy = sum(1 / x for x in series[policy][lo:hi])
    return 1 - t_oracle / t_policy


def recovery(series, policy, shift_window, span=20):
    """Windows (of 10 steps) from the shift until a `span`-window (200-step) regret is
    under 1 %; the worst such span after that; None when it never is."""
    n = len(series[policy])
    for k in range(shift_window, n - span + 1):
        if regret(series, policy, k, k + span) <= 0.01:
            worst = max(regret(series, policy, j, j + span) for j in range(k, n - span + 1))
            return k - shift_window, worst
    return None, None


def shift_window(series):
    """The window where the length mix changes: the largest jump of SP's tokens/s (the same
    batches for every policy) in the middle half of the run."""
    sp = series["sp"]
    n = len(sp)
    return max(range(n // 4, 3 * n // 4), key=lambda k: abs(sp[k] - sp[k - 1]))


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


def plot_reconvergence(series, out):
    """OUT/shift_reconvergence.csv and .png: per 50 steps (5 series windows), each policy's
    tokens/s over the oracle's, from 1,000 steps before the shift to the end."""
    base = series[INTERVALS[0]]
    k0 = shift_window(base)
    n = len(base["oracle"])
    rows = []
    for k in range(max(0, k0 - 100), n - 4, 5):
        def ratio(ser, p):
            return 1 - regret(ser, p, k, k + 5)
        rows.append((10 * (k - k0), ratio(base, "static"),
                     *(ratio(series[i], "adaptive") for i in INTERVALS)))
    csv = os.path.join(out, "shift_reconvergence.csv")
    with open(csv, "w") as f:
        f.write("steps_after_shift,static," +
                ",".join(f"adaptive_flip_interval_{i}" for i in INTERVALS) + "\n")
        for r in rows:
            f.write(",".join("%g" % x for x in r) + "\n")
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("adaptive_flips: gnuplot not found; no plot", file=sys.stderr)
        return
    png = os.path.join(out, "shift_reconvergence.png")
    script = f"""
set terminal pngcairo size 1000,480 noenhanced
set output '{png}'
set datafile separator ','
set key bottom right
set title 'Shifting trace (packed, default cost model, switching free): tokens/s over the oracle per 50 steps'
set xlabel 'steps after the length mix shifts'
set ylabel 'tokens/s / oracle'
set yrange [0.94:1.005]
set arrow from 0, graph 0 to 0, graph 1 nohead dt 2
set arrow from 200, graph 0 to 200, graph 1 nohead dt 3 lc rgb 'gray'
plot for [i=2:{1 + 1 + len(INTERVALS)}] '{csv}' using 1:i with lines lw 2 title columnheader(i)
"""
    subprocess.run([gnuplot], input=script, text=True, check=True)
    print(f"plot: {png}")


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
        # Cold start and re-learning, from 10-step series.
        head2 = ("| flip interval | switch cost s | shifting trace: steps to a 200-step window "
                 "under 1 % regret after the shift (worst such window after) | cold start: "
                 "regret first 500 steps / from step 1,000, stationary grid cells: median, "
                 "worst | cells where the first 500 steps' regret > 2x the steady one and > 0.5 % |\n"
                 "|---:|---:|---|---|---:|")
        print(head2, flush=True)
        rows2 = []
        shift_flags = dq.merge_flags(dq.TRACES["shift"][0], []) + dq.BATCHING["packed"]
        stationary = [(f"{b} {t} {r}", dq.merge_flags(dq.TRACES[t][0], dq.REGIMES[r]) + bf)
                      for b, bf in dq.BATCHING.items() for t in sorted(dq.STATIONARY_TRACES)
                      for r in dq.REGIMES]
        reconverge = {}
        for sc in SWITCH_COSTS:
            for interval in INTERVALS:
                path = os.path.join(tmp, "series.csv")
                run(a.sim, shift_flags, a.steps, a.groups, 1000, interval, sc, tmp, series=path)
                ser = read_series(path)
                if sc == 0:
                    reconverge[interval] = ser
                k0 = shift_window(ser)
                steps_back, worst_after = recovery(ser, "adaptive", k0)
                ratios, bad = [], []
                for name, flags in stationary:
                    run(a.sim, flags, a.steps, a.groups, 1000, interval, sc, tmp, series=path)
                    ser = read_series(path)
                    cold = regret(ser, "adaptive", 0, 50)
                    steady = regret(ser, "adaptive", 100, len(ser["adaptive"]))
                    ratios.append((cold, steady))
                    if cold > 2 * max(steady, 0) and cold > 0.005:
                        bad.append(name)
                colds = sorted(100 * c for c, _ in ratios)
                steadies = sorted(100 * st for _, st in ratios)
                row = "| %d | %g | %s | %.2f %% / %.2f %%, %.2f %% / %.2f %% | %d of %d |" % (
                    interval, sc,
                    "never" if steps_back is None else "%d steps (worst %.2f %%)" % (
                        10 * steps_back, 100 * worst_after),
                    statistics.median(colds), statistics.median(steadies), colds[-1], steadies[-1],
                    len(bad), len(stationary))
                rows2.append(row)
                everything.append({"flip_interval": interval, "switch_cost_s": sc,
                                   "shift_recovery_steps": None if steps_back is None else 10 * steps_back,
                                   "shift_worst_200_after": worst_after,
                                   "cold_start": [{"cell": n, "first_500": c, "from_1000": st}
                                                  for (n, _), (c, st) in zip(stationary, ratios)]})
                print(row, flush=True)
    plot_reconvergence(reconverge, a.out)
    with open(os.path.join(a.out, "adaptive_flips.md"), "w") as f:
        f.write(head + "\n" + "\n".join(rows) + "\n\n" + head2 + "\n" + "\n".join(rows2) + "\n")
    with open(os.path.join(a.out, "adaptive_flips.json"), "w") as f:
        json.dump(everything, f)


if __name__ == "__main__":
    main()
