#!/usr/bin/env python3
"""ADAPTIVE against the rule it replaces (docs/benchmarks.md, "ADAPTIVE against the static
gates"): every cell of the decision-quality grid, its PP and stress cells, and cells that
are in none of them (a Megatron-style lognormal length mix without bucketing under five
cost regimes, TP 4), each with switching free and with a switch cost, checked against the
targets:

- ADAPTIVE >= 0.998 x the static gates and >= 0.995 x the best fixed choice (sp, tp_only);
- with a switch cost: ADAPTIVE above every fixed choice and flipping less than the oracle;
- ADAPTIVE's windowed regret against the expected-value oracle: median <= 0.5 %,
  p95 <= 1.5 %; exploration <= 0.5 % of decisions in stationary cells.

Each cell is the same batches and noise for every policy, run once per seed (--seeds,
default 11 12 13 14 15); each figure is reported as its median over the seeds with its
range, and the targets are checked on the medians. Writes OUT/adaptive_incumbent.{md,json};
the JSON names the commit it was measured at, and per cell the medians ("figures"), their
ranges ("figures_min", "figures_max") and every seed's command and figures.

Usage: adaptive_incumbent.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
                             [--switch_costs=0,0.01] [--sets=grid,pp,stress,unseen]
                             [--seeds='11 12 13 14 15'] [--hardware=h100-sxm|h200-sxm]
                             [--cells='NAME|NAME'] [--config=FILE]
--hardware is passed to every cell (the simulator's preset; a regime's explicit flags,
such as slow_links' --link_gbps, still override it). --cells reruns only the cells named
(as the table names them); the outputs then say which. --config is a GateConfig text file
(spgate-sim --config) every run takes, e.g. other ADAPTIVE settings.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decision_quality as dq  # noqa: E402
import seeds as seedlib  # noqa: E402

# Cells in none of the grid's sets, not tuned to: a Megatron-style packed lognormal mix
# (no length bucketing) under five regimes, and the grid's packed traces at TP 4.
MEGATRON = ["--lengths=lognormal:mean=2048,sigma=1.0", "--bucketing=false"]
UNSEEN_REGIMES = dict(dq.REGIMES, jitter_10pct=["--jitter=0.1"])


def cell_sets(steps, sets):
    """(set, name, flags, steps, regret_window, stationary) of every cell asked for."""
    dq.set_shift(steps)
    out = []
    if "grid" in sets:
        for bname, tname, rname, flags in dq.grid():
            out.append(("grid", f"{bname} {tname} {rname}", flags, steps, 1000,
                        tname in dq.STATIONARY_TRACES))
    if "pp" in sets:
        for name, (flags, _) in dq.PP_CELLS.items():
            m = int(next(f for f in flags if f.startswith("--microbatches=")).split("=")[1])
            out.append(("pp", name, flags, max(1, steps // m), max(1, 1000 // m), True))
    if "stress" in sets:
        for name, (flags, _) in dq.STRESS.items():
            out.append(("stress", name, flags + dq.BATCHING["packed"], steps, 1000, True))
    if "unseen" in sets:
        for rname, rflags in UNSEEN_REGIMES.items():
            out.append(("unseen", f"megatron lognormal {rname}", dq.merge_flags(MEGATRON, rflags),
                        steps, 1000, True))
        for tname in ("lognormal", "bimodal", "straggler_bursts"):
            flags = dq.merge_flags(dq.TRACES[tname][0], ["--tp=4"]) + dq.BATCHING["packed"]
            out.append(("unseen", f"tp4 packed {tname}", flags, steps, 1000,
                        tname in dq.STATIONARY_TRACES))
    return out


def figures(cmp):
    """One seed's figures of a cell."""
    tps = {p: cmp[p]["effective_tokens_per_s"] for p in
           ("sp", "tp_only", "static", "adaptive", "oracle", "expected_oracle")}
    ad = cmp["adaptive"]
    fixed = max(tps["sp"], tps["tp_only"])
    return {
        "vs_static": tps["adaptive"] / tps["static"],
        "vs_best_fixed": tps["adaptive"] / fixed,
        "static_vs_best_fixed": tps["static"] / fixed,
        "flips_adaptive": ad["flips_per_1000_steps"],
        "flips_static": cmp["static"]["flips_per_1000_steps"],
        "flips_oracle": cmp["oracle"]["flips_per_1000_steps"],
        "expected_median": ad["expected_regret_window_median"],
        "expected_p95": ad["expected_regret_window_p95"],
        "static_expected_median": cmp["static"]["expected_regret_window_median"],
        "explore": ad["explore_share"],
        "expected_oracle_vs_oracle": tps["expected_oracle"] / tps["oracle"],
    }


def misses(f, switch_cost, stationary):
    """The targets ADAPTIVE misses on a cell's figures (one seed's, or the medians)."""
    checks = {">= 0.998 static": f["vs_static"] >= 0.998,
              "expected median <= 0.5 %": f["expected_median"] <= 0.005,
              "expected p95 <= 1.5 %": f["expected_p95"] <= 0.015,
              "explore <= 0.5 %": not stationary or f["explore"] <= 0.005}
    if switch_cost > 0:
        checks["above every fixed choice"] = f["vs_best_fixed"] > 1.0
        checks["flips < oracle's"] = f["flips_adaptive"] < f["flips_oracle"]
    else:
        checks[">= 0.995 best fixed"] = f["vs_best_fixed"] >= 0.995
    return [k for k, ok in checks.items() if not ok]


def check(cmp, switch_cost, stationary):
    """A cell's figures and the targets ADAPTIVE misses, from its compare JSON or a list of
    them (one per seed): (Spread of the figures over the seeds, the targets the medians
    miss, the seeds whose own figures miss one)."""
    per_seed = [figures(c) for c in dq.compares(cmp)]
    sp = seedlib.Spread(per_seed)
    return (sp, misses(sp.median, switch_cost, stationary),
            sum(bool(misses(f, switch_cost, stationary)) for f in per_seed))


HEAD = ("| set | cell | switch cost s | adaptive / static | adaptive / best fixed | "
        "static / best fixed | flips / 1000: static / adaptive / oracle | expected regret % "
        "median: static / adaptive | adaptive p95 | explore % | seeds missing a target | "
        "targets (medians) |\n"
        "|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|")


def row(s, name, cost, sp, miss, seed_misses):
    pct = lambda k: sp.fmt(k, "%.2f", 100)
    return ("| %s | %s | %g | %s | %s | %s | %s / %s / %s | %s / %s | %s | %s | %d of %d | %s |"
            % (s, name, cost, sp.fmt("vs_static"), sp.fmt("vs_best_fixed"),
               sp.fmt("static_vs_best_fixed"),
               *(sp.fmt(k, "%.1f") for k in ("flips_static", "flips_adaptive", "flips_oracle")),
               pct("static_expected_median"), pct("expected_median"), pct("expected_p95"),
               sp.fmt("explore", "%.3f", 100), seed_misses, sp.n,
               "all met" if not miss else "MISSED: " + ", ".join(miss)))


def summary_lines(results):
    """Per switch cost: cells missing a target on the medians and in any seed; the worst
    median and the worst single seed of ADAPTIVE / static and / best fixed."""
    out = []
    for cost in sorted({r["switch_cost_s"] for r in results}):
        rs = [r for r in results if r["switch_cost_s"] == cost]
        worst = lambda key: min(rs, key=lambda r: r["figures"][key])
        seed_worst = lambda key: min(((s["figures"][key], r["cell"], s["seed"])
                                      for r in rs for s in r["seeds"]), key=lambda t: t[0])
        ws, wf = worst("vs_static"), worst("vs_best_fixed")
        out.append(
            "Switch cost %g s: %d of %d cells miss a target on the medians, %d in at least one "
            "seed; ADAPTIVE / static worst median %.4f (%s), worst single seed %.4f (%s, seed "
            "%d); ADAPTIVE / best fixed worst median %.4f (%s), worst single seed %.4f (%s, "
            "seed %d)." % (cost, sum(bool(r["missed"]) for r in rs), len(rs),
                           sum(r["seeds_missing_a_target"] > 0 for r in rs),
                           ws["figures"]["vs_static"], ws["cell"], *seed_worst("vs_static"),
                           wf["figures"]["vs_best_fixed"], wf["cell"],
                           *seed_worst("vs_best_fixed")))
    return out


def commit():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True,
                                    text=True).stdout.strip()
    return run("rev-parse", "--short", "HEAD") + (" (+ uncommitted changes)"
                                                  if run("status", "--porcelain", "-uno") else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--switch_costs", default="0,0.01")
    ap.add_argument("--sets", default="grid,pp,stress,unseen")
    ap.add_argument("--seeds", default=dq.DEFAULT_SEEDS)
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--config", default="",
                    help="a GateConfig in protobuf text format (spgate-sim --config) for every "
                         "run, e.g. other ADAPTIVE settings; the outputs name it")
    ap.add_argument("--cells", default="",
                    help="only these cells of the sets, '|'-separated names as the table gives "
                         "them (e.g. 'heavy_stragglers|bucketed lognormal stragglers')")
    a = ap.parse_args()
    seeds = seedlib.parse(a.seeds)
    sets = set(a.sets.split(","))
    only = set(filter(None, a.cells.split("|")))
    unknown = only - {name for _, name, *_ in cell_sets(a.steps, sets)}
    if unknown:
        sys.exit("--cells: no cell named %s in the sets %s" % (", ".join(sorted(unknown)), a.sets))
    config_flags = []
    if a.config:
        if not os.path.isfile(a.config):
            sys.exit("--config: no file %s" % a.config)
        config_flags = ["--config=" + os.path.abspath(a.config)]
    os.makedirs(a.out, exist_ok=True)
    rows, results = [], []
    for cost in (float(c) for c in a.switch_costs.split(",")):
        dq.REGRET["switch_cost_s"] = cost
        for s, name, flags, steps, window, stationary in cell_sets(a.steps, sets):
            if only and name not in only:
                continue
            runs = dq.run_seeds(a.sim, flags + ["--hardware=" + a.hardware] + config_flags,
                                steps, a.groups,
                                seeds, regret_window=window)
            sp, miss, seed_misses = check([r["compare"] for r in runs], cost, stationary)
            rows.append(row(s, name, cost, sp, miss, seed_misses))
            spread = sp.to_json()
            results.append({"set": s, "cell": name, "switch_cost_s": cost,
                            "figures": spread["median"], "figures_min": spread["min"],
                            "figures_max": spread["max"], "missed": miss,
                            "seeds_missing_a_target": seed_misses,
                            "seeds": [{"seed": r["seed"], "command": r["command"],
                                       "figures": figures(r["compare"])} for r in runs]})
            print(rows[-1], flush=True)
    summary = summary_lines(results)
    at = commit()
    seeds_text = ("seed %d" % seeds[0] if len(seeds) == 1 else
                  "median over seeds %s (range)" % ", ".join(str(x) for x in seeds))
    md = ["ADAPTIVE against the static gates, the fixed choices and the expected-value oracle; "
          "%d groups x %d steps a cell (PP: steps / micro-batches optimizer steps), %s, targets "
          "checked on the medians; hardware preset %s; measured at %s.%s"
          % (a.groups, a.steps, seeds_text, a.hardware, at,
             " Only the cells %s." % ", ".join(sorted(only)) if only else "")
          + (" Config %s: %s." % (a.config, open(a.config).read().strip().replace("\n", "; "))
             if a.config else ""), "",
          HEAD] + rows + [line for l in summary for line in ("", l)]
    with open(os.path.join(a.out, "adaptive_incumbent.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "adaptive_incumbent.json"), "w") as f:
        json.dump({"commit": at, "hardware": a.hardware, "steps": a.steps, "groups": a.groups,
                   "config": open(a.config).read() if a.config else "",
                   "seeds": seeds, "only_cells": sorted(only),
                   "cells": results}, f, indent=1)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
