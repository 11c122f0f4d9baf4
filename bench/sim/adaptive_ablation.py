#!/usr/bin/env python3
"""Where ADAPTIVE's misses in the decision-quality grid come from (docs/benchmarks.md,
"Where the misses come from"): the same 40 cells, same batches and noise, with ADAPTIVE's
tuning changed one knob at a time. Only the ADAPTIVE column moves between variants (the
knobs are ADAPTIVE-only fields), so each line says what that knob costs or buys.

Per variant: cells where ADAPTIVE is below the static gates and the worst of them;
cells where its step p95 is over 1.02x static's; ADAPTIVE's mean and worst ratio to the
oracle; its worst ratio to the best fixed choice; probe steps; the changes its detector
found (each re-bases a cell, boosts the band's exploration and holds its departures for a
while); and the share of its steps that ran TP-only (the margin's purpose is to keep SP, which holds less memory, on
near-ties). Every cell runs once per seed (--seeds, default 11 12 13 14 15); the per-cell
figures are the medians over the seeds, totals (probe steps, changes, TP-only share) the median of
the seeds' totals, and each variant also names its cells below static in any seed and its
worst single seed. Writes OUT/adaptive_ablation.{md,json} (the JSON also has each seed's
summary alone).

Usage: adaptive_ablation.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
                            [--seeds='11 12 13 14 15']
"""
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decision_quality as dq  # noqa: E402
import seeds as seedlib  # noqa: E402

# (label, GateConfig text-format lines layered over the defaults)
VARIANTS = [
    ("defaults (margin 1 %, exploration 3 %, floor 0.25 %)", ""),
    ("margin 0.0001 % (no preference for SP)", "adaptive_margin: 0.000001"),
    ("margin 3 %", "adaptive_margin: 0.03"),
    ("exploration 1 %", "adaptive_explore_share: 0.01"),
    ("margin 0.0001 %, exploration 1 %", "adaptive_margin: 0.000001\nadaptive_explore_share: 0.01"),
    # The exploration floor before it was lowered to 0.25 % (docs/benchmarks.md).
    ("floor 0.4 %", "adaptive_explore_floor: 0.004"),
    # The change detector off: a threshold of 100 %, its largest (only a rate that doubles
    # reaches it; a band back after a half-life without samples is still marked changed).
    ("no change detection", "adaptive_change_threshold: 1"),
]


def cell_figures(c):
    """One seed's figures of ADAPTIVE in a cell."""
    tps = {p: c[p]["effective_tokens_per_s"] for p in ("sp", "tp_only", "static", "adaptive")}
    ad = c["adaptive"]
    return {"vs_static": tps["adaptive"] / tps["static"],
            "p95_vs_static": ad["step_time_p95_s"] / c["static"]["step_time_p95_s"],
            "to_oracle": ad["ratio_to_oracle"],
            "vs_best_fixed": tps["adaptive"] / max(tps["sp"], tps["tp_only"], tps["static"]),
            "probe_steps": ad["probe_steps"], "tp_only_steps": ad["tp_only_steps"],
            "changes": ad["changes_detected"], "steps": ad["sp_steps"] + ad["tp_only_steps"]}


def summarize(cells):
    """A variant's line over the grid; each cell its compare JSON or a list of them, one per
    seed (the same number for every cell). Per-cell figures are medians over the seeds."""
    per_cell = [[cell_figures(c) for c in dq.compares(cell)] for cell in cells]
    med = [seedlib.Spread(fs).median for fs in per_cell]
    n = len(per_cell[0])
    total = lambda key: [sum(fs[i][key] for fs in per_cell) for i in range(n)]
    seeds_all = [f for fs in per_cell for f in fs]
    return {
        "cells_below_static": sum(m["vs_static"] < 1.0 for m in med),
        "worst_vs_static": min(m["vs_static"] for m in med),
        "cells_p95_over_1.02_static": sum(m["p95_vs_static"] > 1.02 for m in med),
        "mean_ratio_to_oracle": statistics.mean(m["to_oracle"] for m in med),
        "worst_ratio_to_oracle": min(m["to_oracle"] for m in med),
        "worst_vs_best_fixed": min(m["vs_best_fixed"] for m in med),
        "probe_steps": statistics.median(total("probe_steps")),
        "changes_detected": statistics.median(total("changes")),
        "tp_only_share": statistics.median(
            t / s for t, s in zip(total("tp_only_steps"), total("steps"))),
        "cells_below_static_any_seed": sum(any(f["vs_static"] < 1.0 for f in fs)
                                           for fs in per_cell),
        "worst_seed_vs_static": min(f["vs_static"] for f in seeds_all),
        "worst_seed_vs_best_fixed": min(f["vs_best_fixed"] for f in seeds_all),
        # Not shown: the other policies' figures, which the knobs must leave alone.
        "others": [[{p: c[p]["effective_tokens_per_s"] for p in ("sp", "tp_only", "static", "oracle")}
                    for c in dq.compares(cell)] for cell in cells],
    }


def main():
    a, _ = dq.grid_args(with_seeds=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="spgate-ablation-") as tmp:
        for label, text in VARIANTS:
            flags = []
            if text:
                path = os.path.join(tmp, f"variant{len(results)}.txtpb")
                with open(path, "w") as f:
                    f.write(text + "\n")
                flags = [f"--config={path}"]
            cells = [[r["compare"] for r in dq.run_seeds(a.sim, cell_flags + flags, a.steps,
                                                          a.groups, a.seeds)]
                     for _, _, _, cell_flags in dq.grid()]
            by_seed = [{"seed": seed, **{k: v for k, v in summarize([c[i] for c in cells]).items()
                                         if k != "others"}} for i, seed in enumerate(a.seeds)]
            results.append({"variant": label, "config": text, **summarize(cells),
                            "by_seed": by_seed})
            print(label, {k: v for k, v in results[-1].items() if k not in ("others", "by_seed")},
                  file=sys.stderr, flush=True)

    md = [f"ADAPTIVE with one knob changed, over the {len(list(dq.grid()))} cells of the "
          f"decision-quality grid ({a.groups} groups x {a.steps} steps per cell, "
          f"{dq.seeds_text(a.seeds)}): per-cell figures are medians over the seeds; probe "
          "steps and TP-only share the median of the seeds' totals.", "",
          "| ADAPTIVE variant | cells below static (worst) | cells below static in any seed "
          "(worst seed) | cells p95 > 1.02x static | mean / worst ratio to oracle | worst vs "
          "best fixed (worst seed) | probe steps | changes detected | TP-only share |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        md.append(f"| {r['variant']} | {r['cells_below_static']} ({r['worst_vs_static']:.5f}) | "
                  f"{r['cells_below_static_any_seed']} ({r['worst_seed_vs_static']:.5f}) | "
                  f"{r['cells_p95_over_1.02_static']} | {r['mean_ratio_to_oracle']:.5f} / "
                  f"{r['worst_ratio_to_oracle']:.4f} | {r['worst_vs_best_fixed']:.5f} "
                  f"({r['worst_seed_vs_best_fixed']:.5f}) | {r['probe_steps']:.0f} | "
                  f"{r['changes_detected']:.0f} | {r['tp_only_share']:.3f} |")
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(a.out, "adaptive_ablation.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "adaptive_ablation.json"), "w") as f:
        json.dump({"steps": a.steps, "groups": a.groups, "seeds": a.seeds, "variants": results},
                  f, indent=1)


if __name__ == "__main__":
    main()
