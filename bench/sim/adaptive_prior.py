#!/usr/bin/env python3
"""What ADAPTIVE's physics prior buys (docs/benchmarks.md, "The physics prior"): every cell
of bench/sim/adaptive_flips.py (the decision-quality grid, its stress and PP cells) at the
default flip interval, switching free and at 0.01 s, under two priors for the bands
without samples — the static gates (--adaptive_prior=false, ADAPTIVE before the prior)
and the physics prior calibrated from the job's telemetry (the default). Same batches,
noise and seed (11) for both.

Per (prior, switch cost): the summary line of adaptive_flips.py; the steps after the
shifting trace's change of length mix until a 200-step window's regret is back under 1 %;
the cold start over the 24 stationary grid cells. Then, switching free, ADAPTIVE's
tokens/s over the oracle's per cell under each prior, marking the cells where the prior
is more than 0.1 % below the gates. Writes OUT/adaptive_prior.md and .json.

Usage: adaptive_prior.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adaptive_flips as af  # noqa: E402
import decision_quality as dq  # noqa: E402

PRIORS = [("static gates", ["--adaptive_prior=false"]), ("physics prior", [])]
SWITCH_COSTS = [0.0, 0.01]
INTERVAL = 50


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--groups", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    head = ("| prior | switch cost s | cells | adaptive < static | adaptive < 0.99 x best fixed "
            "| windowed regret median: median / worst cell % | lowest window / best fixed "
            "| flips / 1000 steps: median / max | shifting trace: steps back under 1 % "
            "| cold start: first 500 steps' regret, median / worst; cells > 2x steady |\n"
            "|---|---:|---:|---:|---:|---|---:|---|---|---|")
    print(head, flush=True)
    rows, everything, per_cell = [], [], {}
    dq.set_shift(a.steps)
    shift_flags = dq.merge_flags(dq.TRACES["shift"][0], []) + dq.BATCHING["packed"]
    stationary = [(f"{b} {t} {r}", dq.merge_flags(dq.TRACES[t][0], dq.REGIMES[r]) + bf)
                  for b, bf in dq.BATCHING.items() for t in sorted(dq.STATIONARY_TRACES)
                  for r in dq.REGIMES]
    with tempfile.TemporaryDirectory() as tmp:
        for sc in SWITCH_COSTS:
            for name, extra in PRIORS:
                results = []
                for cell, flags, steps, window, stat in af.cells(a.steps):
                    results.append({"cell": cell, "stationary": stat,
                                    "compare": af.run(a.sim, flags + extra, steps, a.groups, window,
                                                      INTERVAL, sc, tmp)})
                s = af.summarize(results)
                if sc == 0:
                    per_cell[name] = {r["cell"]: r["compare"] for r in results}
                path = os.path.join(tmp, "series.csv")
                af.run(a.sim, shift_flags + extra, a.steps, a.groups, 1000, INTERVAL, sc, tmp,
                       series=path)
                ser = af.read_series(path)
                back, _ = af.recovery(ser, "adaptive", af.shift_window(ser))
                colds, bad = [], 0
                for _, flags in stationary:
                    af.run(a.sim, flags + extra, a.steps, a.groups, 1000, INTERVAL, sc, tmp,
                           series=path)
                    ser = af.read_series(path)
                    cold = af.regret(ser, "adaptive", 0, 50)
                    steady = af.regret(ser, "adaptive", 100, len(ser["adaptive"]))
                    colds.append(cold)
                    bad += cold > 2 * max(steady, 0) and cold > 0.005
                row = ("| %s | %g | %d | %d | %d | %.2f / %.2f | %.4f | %.1f / %.1f | %s | "
                       "%.2f %% / %.2f %%; %d of %d |" % (
                           name, sc, s["cells"], s["adaptive_below_static"],
                           s["adaptive_below_best_fixed_1pct"], 100 * s["regret_median_median"],
                           100 * s["regret_median_worst"], s["lowest_window_vs_best_fixed"],
                           s["flips_per_1000_median"], s["flips_per_1000_max"],
                           "never" if back is None else "%d steps" % (10 * back),
                           100 * statistics.median(colds), 100 * max(colds), bad,
                           len(stationary)))
                rows.append(row)
                everything.append({"prior": name, "switch_cost_s": sc, "summary": s,
                                   "shift_recovery_steps": None if back is None else 10 * back,
                                   "cold_start_first_500": colds, "cells": results})
                print(row, flush=True)
    names = [n for n, _ in PRIORS]
    head2 = ("| cell | " + " | ".join(f"adaptive / oracle, {n}" for n in names) +
             " | static / oracle |\n|---|" + "---:|" * (len(names) + 1))
    rows2 = []
    for cell in per_cell[names[0]]:
        def ratio(n, policy="adaptive"):
            c = per_cell[n][cell]
            return c[policy]["effective_tokens_per_s"] / c["oracle"]["effective_tokens_per_s"]
        worse = ratio(names[-1]) < ratio(names[0]) * (1 - 0.001)
        rows2.append("| %s%s | %s | %.4f |" % (
            cell, " (prior worse)" if worse else "",
            " | ".join("%.4f" % ratio(n) for n in names), ratio(names[0], "static")))
    print(head2 + "\n" + "\n".join(rows2))
    with open(os.path.join(a.out, "adaptive_prior.md"), "w") as f:
        f.write(head + "\n" + "\n".join(rows) + "\n\n" + head2 + "\n" + "\n".join(rows2) + "\n")
    with open(os.path.join(a.out, "adaptive_prior.json"), "w") as f:
        json.dump(everything, f)


if __name__ == "__main__":
    main()
