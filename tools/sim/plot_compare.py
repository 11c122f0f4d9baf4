#!/usr/bin/env python3
"""Draws `spgate-sim replay --compare --plot=FILE` (tools/sim/compare_plot.h).

spgate-sim writes two CSVs and runs this script on them:
  --series  step,<policy>,...          effective tokens/s per window for every policy
                                       (the --compare_series file);
  --modes   step,policy,group,tp_only_share
                                       each group's share of TP-only decisions per window.
The figure: tokens/s per window of every policy on top, then a panel per deciding policy
(every one but `sp`, which is SP by definition) with a row per group, each window coloured
from SP (0) to TP-only (1). The format follows --out's extension (png, svg, pdf).

`--check` only imports matplotlib and exits 0; without it (Debian: python3-matplotlib) the
script names the package and exits 3, so spgate-sim can fail before a long run.
"""

import argparse
import csv
import sys
from collections import defaultdict


def import_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.stderr.write(
            f"plot_compare.py: matplotlib is not importable by {sys.executable} ({e}); "
            "install it (Debian: apt-get install python3-matplotlib) or set "
            "SPGATE_PLOT_PYTHON to a python3 that has it\n")
        sys.exit(3)
    return plt


def read_series(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][0] != "step":
        raise ValueError(f"{path}: want a header step,<policy>,...")
    policies = rows[0][1:]
    steps = [int(r[0]) for r in rows[1:]]
    values = {p: [float(r[i + 1]) for r in rows[1:]] for i, p in enumerate(policies)}
    return steps, policies, values


def read_modes(path):
    """{policy: (steps, groups, grid[group][window])} in the file's order."""
    shares = defaultdict(dict)  # policy -> {(step, group): share}
    order = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        want = {"step", "policy", "group", "tp_only_share"}
        if reader.fieldnames is None or set(reader.fieldnames) != want:
            raise ValueError(f"{path}: want a header step,policy,group,tp_only_share")
        for row in reader:
            p = row["policy"]
            if p not in shares:
                order.append(p)
            shares[p][(int(row["step"]), int(row["group"]))] = float(row["tp_only_share"])
    out = {}
    for p in order:
        steps = sorted({s for s, _ in shares[p]})
        groups = sorted({g for _, g in shares[p]})
        grid = [[shares[p].get((s, g), 0.0) for s in steps] for g in groups]
        out[p] = (steps, groups, grid)
    return out


def draw(args, plt):
    steps, policies, values = read_series(args.series)
    modes = read_modes(args.modes)
    panels = [p for p in modes if p != "sp"]
    fig, axes = plt.subplots(
        1 + len(panels), 1, sharex=True,
        figsize=(10, 3.2 + 1.0 * len(panels)),
        gridspec_kw={"height_ratios": [3] + [1] * len(panels)}, squeeze=False)
    axes = [a[0] for a in axes]
    top = axes[0]
    for p in policies:
        style = "--" if "oracle" in p else "-"
        top.plot(steps, [v / 1e3 for v in values[p]], style, label=p, linewidth=1.4)
    top.set_ylabel("effective tokens/s (k)\nper window")
    top.set_title(args.title, fontsize=10)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    image = None
    for ax, p in zip(axes[1:], panels):
        wsteps, groups, grid = modes[p]
        # Each window spans (its end - window, its end]; the last may be shorter.
        left = max(0, wsteps[0] - args.window) if wsteps else 0
        edges = [left] + wsteps
        ygrid = list(range(len(groups) + 1))
        image = ax.pcolormesh(edges, ygrid, grid, cmap="coolwarm", vmin=0, vmax=1,
                              shading="flat")
        ax.set_ylabel(p, rotation=0, ha="right", va="center", fontsize=9)
        ax.set_yticks([0.5, len(groups) - 0.5] if len(groups) > 1 else [0.5])
        ax.set_yticklabels([f"g{groups[0]}", f"g{groups[-1]}"] if len(groups) > 1
                           else [f"g{groups[0]}"], fontsize=7)
    axes[-1].set_xlabel("step")
    if image is not None:
        bar = fig.colorbar(image, ax=axes[1:], fraction=0.02, pad=0.01)
        bar.set_label("TP-only share\n(0 SP, 1 TP-only)", fontsize=8)
    fig.savefig(args.out, dpi=110, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that matplotlib imports")
    ap.add_argument("--series", help="step,<policy>,... tokens/s per window")
    ap.add_argument("--modes", help="step,policy,group,tp_only_share")
    ap.add_argument("--window", type=int, default=1, help="steps per window")
    ap.add_argument("--title", default="spgate-sim replay --compare")
    ap.add_argument("--out", help="the figure (.png, .svg, .pdf)")
    args = ap.parse_args()
    plt = import_pyplot()
    if args.check:
        return 0
    if not (args.series and args.modes and args.out):
        ap.error("--series, --modes and --out are required without --check")
    try:
        draw(args, plt)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"plot_compare.py: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
