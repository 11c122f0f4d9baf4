#!/usr/bin/env python3
"""The seeds' 8xH100 32K table (docs/benchmarks.md, "The seed table"), from the cost model
on the h100-sxm preset: a 13B shape (hidden 5,120, 40 heads; one 8-layer stage of its 40
layers: every term of the model and both memory counts are proportional to the layers, so
the ratios are the whole model's), one TP group of 8 ranks, 32K-token batches.

The length trace is fixed here, before any run, and not chosen to fit: lognormal lengths
with a mean of 8,192 tokens (a quarter of the 32K context) and sigma 1.0 of their log,
clamped to the 32K context, drawn by spgate-sim's seeded generator (--lengths, --seed).

Rows, each `spgate-sim replay --compare` on the same seed's stream:
  tp_only                    TP-only, batches packed as they come (--bucketing=false)
  sp_default                 SP, packed, LayerNorm on the gathered sequence (--norm_boundary=gather)
  sp_bucketed                SP, length-bucketed batches, LayerNorm gathered
  sp_bucketed_norm_in_shard  SP, length-bucketed, LayerNorm inside the shard (--norm_boundary=shard)
Each figure is a ratio over tp_only of the same seed; the table gives the median over the
seeds and their range, beside the seeds' figure and its tolerance (0.04 for memory and
tokens/s, 0.08 for step-time p95).

Writes OUT/seed_table.json ({"rows": {row: {peak_memory_ratio, tokens_per_s_ratio,
step_time_p95_ratio, range, target, within_target}}, "config": ...}) and OUT/seed_table.md.

Usage: seed_table.py --sim=BUILD/bin/spgate-sim --out=DIR [--seeds='1 2 3 4 5'] [--steps=1000]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seeds as seedlib  # noqa: E402

HARDWARE = "h100-sxm"
SHAPE = ["--tp=8", "--layers=8", "--hidden=5120", "--heads=40"]
TRACE = ["--lengths=lognormal:mean=8192,sigma=1.0", "--tokens_per_batch=32768"]
# row: (flags of its run, the compare policy that is the row)
ROWS = {
    "tp_only": (["--bucketing=false", "--norm_boundary=gather"], "tp_only"),
    "sp_default": (["--bucketing=false", "--norm_boundary=gather"], "sp"),
    "sp_bucketed": (["--bucketing=true", "--norm_boundary=gather"], "sp"),
    "sp_bucketed_norm_in_shard": (["--bucketing=true", "--norm_boundary=shard"], "sp"),
}
# The seeds' table (8xH100, 13B, 32K; docs/design.md §1) and the tolerance per figure.
TARGETS = {
    "tp_only": (1.00, 1.00, 1.00),
    "sp_default": (0.82, 0.91, 1.19),
    "sp_bucketed": (0.82, 0.97, 1.08),
    "sp_bucketed_norm_in_shard": (0.81, 1.04, 0.98),
}
KEYS = ("peak_memory_ratio", "tokens_per_s_ratio", "step_time_p95_ratio")
TOLERANCE = dict(zip(KEYS, (0.04, 0.04, 0.08)))


def run_compare(sim, flags, seed, steps):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        cmd = [sim, "replay", "--compare", f"--hardware={HARDWARE}", f"--seed={seed}",
               f"--steps={steps}", "--groups=1", f"--summary_json={path}"] + SHAPE + TRACE + flags
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)["compare"]


def figures(policy):
    return (policy["peak_memory_bytes"], policy["effective_tokens_per_s"],
            policy["step_time_p95_s"])


def seed_ratios(sim, seed, steps):
    """Each row's (memory, tokens/s, p95) over tp_only's, one seed; runs shared by rows."""
    runs = {}
    rows = {}
    for name, (flags, policy) in ROWS.items():
        key = tuple(flags)
        if key not in runs:
            runs[key] = run_compare(sim, flags, seed, steps)
        rows[name] = figures(runs[key][policy])
    base = rows["tp_only"]
    return {name: tuple(v / b for v, b in zip(vals, base)) for name, vals in rows.items()}


def summarize(per_seed):
    """Medians and ranges over the seeds, each checked against the seeds' figure."""
    out = {}
    for name in ROWS:
        row = {"range": {}, "target": {}, "within_target": {}}
        for i, key in enumerate(KEYS):
            vals = [s[name][i] for s in per_seed]
            med = statistics.median(vals)
            row[key] = round(med, 4)
            row["range"][key] = [round(min(vals), 4), round(max(vals), 4)]
            row["target"][key] = TARGETS[name][i]
            row["within_target"][key] = abs(med - TARGETS[name][i]) <= TOLERANCE[key] + 1e-9
        out[name] = row
    return out


def markdown(rows, seeds, steps):
    lines = [f"Cost model, `--hardware={HARDWARE}`; median over {seeds} seeds (range), "
             f"{steps} steps each; the seeds' figure in brackets, ✓ within "
             "±0.04 (memory, tokens/s) / ±0.08 (p95), ✗ outside.", "",
             "| configuration | peak memory | effective tokens/s | step time p95 |",
             "|---|---:|---:|---:|"]
    for name, row in rows.items():
        cells = []
        for key in KEYS:
            lo, hi = row["range"][key]
            mark = "✓" if row["within_target"][key] else "✗"
            cells.append(f"{row[key]:.3f} ({lo:.3f}–{hi:.3f}) [{row['target'][key]:.2f}] {mark}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="1 2 3 4 5")
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args()
    seeds = seedlib.parse(args.seeds)
    if args.steps < 1:
        sys.exit("seed_table.py: --steps must be >= 1")
    os.makedirs(args.out, exist_ok=True)
    per_seed = [seed_ratios(args.sim, seed, args.steps) for seed in seeds]
    rows = summarize(per_seed)
    result = {"rows": rows,
              "config": {"hardware": HARDWARE, "flags": SHAPE + TRACE, "seeds": seeds,
                         "steps": args.steps,
                         "row_flags": {n: f for n, (f, _) in ROWS.items()}}}
    with open(os.path.join(args.out, "seed_table.json"), "w") as f:
        json.dump(result, f, indent=2)
    md = markdown(rows, len(seeds), args.steps)
    with open(os.path.join(args.out, "seed_table.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
