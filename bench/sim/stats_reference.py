#!/usr/bin/env python3
"""What a plan's length statistics allow: the expected-value oracle against a chooser that
reads only the statistics a plan carries (docs/benchmarks.md, "What the length statistics
allow").

The expected-value oracle (`expected_oracle`, docs/sim.md) picks each batch's mode from
the noise-free cost of its lengths, sequence by sequence. A daemon sees less: a plan
carries the batch's length statistics (sequences, tokens, longest sequence, length CV),
and ADAPTIVE's bands key on two of them (CV and tokens). For each cell and seed this runs
`spgate-sim replay --compare --compare_batches`, then chooses every batch's mode with a
k-nearest-neighbour vote over batches of the other half of the run (two folds, split by
step: the first half's batches decide the second's and the other way round), reading
one set of statistics, each batch labelled with its faster mode under the noise-free
costs (a label no deployed policy has: the figure estimates what those statistics
determine, not what a learner reaches). Beside them, the best a policy that runs one mode
per ADAPTIVE band (the CSV's `band`) over the run could do: each band's mode the one whose
drawn seconds over the run are fewer, with hindsight. Every choice runs on the drawn
(noisy) seconds, as the sim's policies do; regret is 1 − its effective tokens/s over the
expected-value oracle's, over the whole run. The sim's own whole-run figures for the gates and ADAPTIVE
stand beside it, and the script checks its recomputed fixed choices and expected oracle
against the sim's.

Cells without a pipeline only (one batch per group-step), where the memory gate binds on
no batch (the check above fails otherwise).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # main() says so; importing the module for its names still works
    np = None
NEEDS_NUMPY = "stats_reference.py needs numpy (Debian's python3-numpy; make deps installs it)"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adaptive_incumbent as ai  # noqa: E402
import seeds as seedlib  # noqa: E402

# The statistics a plan carries, by the names of --compare_batches's columns.
FEATURES = {
    "cv, tokens (ADAPTIVE's band axes)": ["length_cv", "tokens"],
    "longest sequence": ["max_length"],
    "every statistic": ["sequences", "tokens", "max_length", "length_cv"],
}
NEIGHBOURS = 25
COLUMNS_CSV = ["group", "step", "stage", "microbatch", "sequences", "tokens", "max_length",
               "length_cv", "band", "sp_expected_s", "tp_only_expected_s", "sp_s", "tp_only_s"]
BAND_HINDSIGHT = "one mode per ADAPTIVE band (hindsight)"


def cells():
    """{name: spgate-sim flags}: the Megatron-style mix under each regime of the incumbent
    table's unseen set."""
    return {f"megatron lognormal {r}": ai.dq.merge_flags(ai.MEGATRON, f)
            for r, f in ai.UNSEEN_REGIMES.items()}


def load_batches(path):
    """The CSV's columns (--compare_batches's) as float arrays."""
    with open(path) as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS_CSV:
            raise ValueError(f"{path}: columns {reader.fieldnames}, want {COLUMNS_CSV}")
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no batches")
    try:
        return {k: np.array([float(r[k]) for r in rows]) for k in COLUMNS_CSV}
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a number in a row: {e}") from None


def throughput(b, tp_only):
    """Σ tokens / Σ drawn seconds with TP-only where `tp_only` (a bool array)."""
    return b["tokens"].sum() / np.where(tp_only, b["tp_only_s"], b["sp_s"]).sum()


def knn_choice(b, features, k=NEIGHBOURS):
    """TP-only where most of a batch's k nearest batches of the other fold have the shorter
    noise-free TP-only step (features standardized on the fold that votes)."""
    x = np.column_stack([b[f] for f in features])
    faster = (b["sp_expected_s"] - b["tp_only_expected_s"]) > 0
    first = b["step"] < np.median(b["step"])
    if min(first.sum(), (~first).sum()) <= k:
        raise ValueError(f"{len(faster)} batches: each half of the run needs more than {k} "
                         "(give more --steps or --groups)")
    choice = np.zeros(len(faster), bool)
    for train, test in ((first, ~first), (~first, first)):
        mu, sd = x[train].mean(0), x[train].std(0)
        sd[sd == 0] = 1
        a, labels = (x[train] - mu) / sd, faster[train]
        idx = np.flatnonzero(test)
        for lo in range(0, len(idx), 512):
            q = (x[idx[lo:lo + 512]] - mu) / sd
            d = (q * q).sum(1)[:, None] + (a * a).sum(1)[None, :] - 2 * q @ a.T
            near = np.argpartition(d, k, axis=1)[:, :k]
            choice[idx[lo:lo + 512]] = labels[near].mean(1) > 0.5
    return choice


def band_hindsight(b):
    """TP-only in every batch of a band where TP-only's drawn seconds over the run are fewer
    (what the regret is scored on: the noise is not the same in both modes, so noise-free
    labels would not give the best one mode per band)."""
    saving = b["sp_s"] - b["tp_only_s"]
    choice = np.zeros(len(saving), bool)
    for band in np.unique(b["band"]):
        in_band = b["band"] == band
        choice[in_band] = saving[in_band].sum() > 0
    return choice


def measure(b, cmp):
    """One seed's figures: regret (%) against the expected-value oracle over the run."""
    if np.any(b["stage"] != 0) or np.any(b["microbatch"] != 0):
        raise ValueError("a pipelined cell: this script takes one batch per group-step")
    expected = b["sp_expected_s"] - b["tp_only_expected_s"] > 0
    eo = throughput(b, expected)
    # The sim's figures are groups × Σ tokens / Σ step time: the ratios are this script's.
    sim = {p: cmp[p]["effective_tokens_per_s"] for p in
           ("sp", "tp_only", "static", "adaptive", "expected_oracle")}
    for name, mine in (("sp", throughput(b, np.zeros_like(expected))),
                       ("tp_only", throughput(b, np.ones_like(expected)))):
        if abs(mine / eo - sim[name] / sim["expected_oracle"]) > 1e-6:
            raise ValueError(f"{name} over expected_oracle: {mine / eo:.8f} here, "
                             f"{sim[name] / sim['expected_oracle']:.8f} in the sim (the memory "
                             "gate binds, or the CSV does not match the run)")
    out = {f"{p}": 100 * (1 - sim[p] / sim["expected_oracle"])
           for p in ("sp", "tp_only", "static", "adaptive")}
    out["adaptive_window_median"] = 100 * cmp["adaptive"]["expected_regret_window_median"]
    out["tp_only_share_expected_oracle"] = float(expected.mean())
    ad = cmp["adaptive"]
    out["tp_only_share_adaptive"] = ad["tp_only_steps"] / (ad["tp_only_steps"] + ad["sp_steps"])
    out[BAND_HINDSIGHT] = 100 * (1 - throughput(b, band_hindsight(b)) / eo)
    for label, feats in FEATURES.items():
        out[label] = 100 * (1 - throughput(b, knn_choice(b, feats)) / eo)
    return out


def run_cell(sim, flags, seed, steps, groups, hardware, tmp):
    path = os.path.join(tmp, "batches.csv")
    cmd = [sim, "replay", "--compare", f"--steps={steps}", f"--groups={groups}",
           f"--seed={seed}", "--summary_json=/dev/stdout", f"--compare_batches={path}",
           *flags, f"--hardware={hardware}"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {run.returncode}: {run.stderr[-2000:]}")
    return cmd, measure(load_batches(path), json.loads(run.stdout)["compare"])


COLUMNS = ["sp", "tp_only", "static", "adaptive", BAND_HINDSIGHT, *FEATURES]


def report(result):
    head = ["cell", "TP-only share: expected oracle / ADAPTIVE",
            *[f"{c} %" for c in ("SP", "TP-only", "static gates", "ADAPTIVE", BAND_HINDSIGHT)],
            *[f"statistics: {c} %" for c in FEATURES]]
    md = [f"Regret against the expected-value oracle over the run, median over seeds "
          f"{', '.join(map(str, result['seeds']))} (range); {result['steps']} steps × "
          f"{result['groups']} groups, `{result['hardware']}`, k = {NEIGHBOURS}:", "",
          "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for c in result["cells"]:
        spread = seedlib.Spread([r["figures"] for r in c["runs"]])
        cols = [c["name"], spread.fmt("tp_only_share_expected_oracle", "%.3f") + " / "
                + spread.fmt("tp_only_share_adaptive", "%.3f")]
        cols += [spread.fmt(k, "%.2f") for k in COLUMNS]
        md.append("| " + " | ".join(cols) + " |")
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--seeds", default=ai.dq.DEFAULT_SEEDS)
    ap.add_argument("--cells", default="", help="|-separated cell names (default: all)")
    a = ap.parse_args()
    if np is None:
        sys.exit(NEEDS_NUMPY)
    seeds = seedlib.parse(a.seeds)
    chosen = cells()
    if a.cells:
        wanted = a.cells.split("|")
        unknown = [w for w in wanted if w not in chosen]
        if unknown:
            sys.exit(f"--cells: unknown {unknown}; known: {sorted(chosen)}")
        chosen = {w: chosen[w] for w in wanted}
    os.makedirs(a.out, exist_ok=True)
    result = {"seeds": seeds, "steps": a.steps, "groups": a.groups, "hardware": a.hardware,
              "neighbours": NEIGHBOURS, "features": FEATURES, "cells": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in chosen.items():
            runs = []
            for seed in seeds:
                cmd, figures = run_cell(a.sim, flags, seed, a.steps, a.groups, a.hardware, tmp)
                runs.append({"seed": seed, "command": " ".join(cmd), "figures": figures})
            per_seed = [r["figures"] for r in runs]
            result["cells"].append({"name": name, "runs": runs,
                                    **seedlib.Spread(per_seed).to_json()})
    with open(os.path.join(a.out, "stats_reference.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = report(result)
    with open(os.path.join(a.out, "stats_reference.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
