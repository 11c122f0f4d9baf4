#!/usr/bin/env python3
"""Where ADAPTIVE's misses in the decision-quality grid come from (docs/benchmarks.md,
"Where the misses come from"): the same 40 cells, same batches and noise, with ADAPTIVE's
tuning changed one knob at a time. Only the ADAPTIVE column moves between variants (the
knobs are ADAPTIVE-only fields), so each line says what that knob costs or buys.

Per variant: cells where ADAPTIVE is below the static gates and the worst of them;
cells where its step p95 is over 1.02x static's; ADAPTIVE's mean and worst ratio to the
oracle; its worst ratio to the best fixed choice; probe steps; and the share of its steps
that ran TP-only (the margin's purpose is to keep SP, which holds less memory, on
near-ties). Writes OUT/adaptive_ablation.{md,json}.

Usage: adaptive_ablation.py --sim=BUILD/bin/spgate-sim --out=DIR [--steps=N] [--groups=G]
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decision_quality as dq  # noqa: E402

# (label, GateConfig text-format lines layered over the defaults)
VARIANTS = [
    ("defaults (margin 1 %, exploration 3 %)", ""),
    ("margin 0.0001 % (no preference for SP)", "adaptive_margin: 0.000001"),
    ("margin 3 %", "adaptive_margin: 0.03"),
    ("exploration 1 %", "adaptive_explore_share: 0.01"),
    ("margin 0.0001 %, exploration 1 %", "adaptive_margin: 0.000001\nadaptive_explore_share: 0.01"),
]


def summarize(cells):
    below = [c for c in cells if c["adaptive"]["effective_tokens_per_s"] < c["static"]["effective_tokens_per_s"]]
    ratio_static = [c["adaptive"]["effective_tokens_per_s"] / c["static"]["effective_tokens_per_s"] for c in cells]
    best_fixed = [c["adaptive"]["effective_tokens_per_s"] /
                  max(c[p]["effective_tokens_per_s"] for p in ("sp", "tp_only", "static")) for c in cells]
    to_oracle = [c["adaptive"]["ratio_to_oracle"] for c in cells]
    steps = sum(c["adaptive"]["sp_steps"] + c["adaptive"]["tp_only_steps"] for c in cells)
    return {
        "cells_below_static": len(below),
        "worst_vs_static": min(ratio_static),
        "cells_p95_over_1.02_static": sum(
            c["adaptive"]["step_time_p95_s"] > 1.02 * c["static"]["step_time_p95_s"] for c in cells),
        "mean_ratio_to_oracle": sum(to_oracle) / len(to_oracle),
        "worst_ratio_to_oracle": min(to_oracle),
        "worst_vs_best_fixed": min(best_fixed),
        "probe_steps": sum(c["adaptive"]["probe_steps"] for c in cells),
        "tp_only_share": sum(c["adaptive"]["tp_only_steps"] for c in cells) / steps,
        # Not shown: the other policies' figures, which the knobs must leave alone.
        "others": [{p: c[p]["effective_tokens_per_s"] for p in ("sp", "tp_only", "static", "oracle")}
                   for c in cells],
    }


def main():
    a, _ = dq.grid_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="spgate-ablation-") as tmp:
        for label, text in VARIANTS:
            flags = []
            if text:
                path = os.path.join(tmp, f"variant{len(results)}.txtpb")
                with open(path, "w") as f:
                    f.write(text + "\n")
                flags = [f"--config={path}"]
            cells = [dq.run_cell(a.sim, cell_flags + flags, a.steps, a.groups)[0]
                     for _, _, _, cell_flags in dq.grid()]
            results.append({"variant": label, "config": text, **summarize(cells)})
            print(label, results[-1], file=sys.stderr, flush=True)

    md = [f"ADAPTIVE with one knob changed, over the {len(list(dq.grid()))} cells of the "
          f"decision-quality grid ({a.groups} groups x {a.steps} steps per cell, seed 11).", "",
          "| ADAPTIVE variant | cells below static (worst) | cells p95 > 1.02x static | "
          "mean / worst ratio to oracle | worst vs best fixed | probe steps | TP-only share |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        md.append(f"| {r['variant']} | {r['cells_below_static']} ({r['worst_vs_static']:.5f}) | "
                  f"{r['cells_p95_over_1.02_static']} | {r['mean_ratio_to_oracle']:.5f} / "
                  f"{r['worst_ratio_to_oracle']:.4f} | {r['worst_vs_best_fixed']:.5f} | "
                  f"{r['probe_steps']} | {r['tp_only_share']:.3f} |")
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(a.out, "adaptive_ablation.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "adaptive_ablation.json"), "w") as f:
        json.dump({"steps": a.steps, "groups": a.groups, "variants": results}, f, indent=1)


if __name__ == "__main__":
    main()
