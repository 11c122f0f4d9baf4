#!/usr/bin/env python3
"""SP vs TP-only by sequence length (docs/benchmarks.md, "SP vs TP-only by sequence
length"): the cost model's tokens/s ratio of SP (LayerNorm in the shard) over TP-only and
whether each mode's predicted peak fits the memory gate, for one sequence of 2K-128K tokens per
micro-batch, TP 4 and 8, on both hardware presets, for a 70B-class shape: hidden 8,192,
64 heads, 80 layers, one pipeline stage of 10 of them (PP 8) per TP group.

Per point, `spgate-sim replay --compare` with no noise (--jitter=0, no stragglers) and no
memory limit (so both modes run and report their predicted peaks); every sequence has the
same length, so nothing is drawn and a point does not depend on the seed: one run, not a
median over seeds (bench_drivers_test checks that two seeds give the same figures). `fits`
is the memory gate's rule: each peak at most the preset's device memory
(policy/hardware/presets.csv) times the gates' default memory_headroom
(policy/gate_config.h), the share of the device spgate lets a mode use. The ratio with
Megatron's --tp-comm-overlap (--tp_comm_overlap) is reported beside it.

Writes OUT/sp_crossover.json ({"rows": [{hardware, tp, seq_len,
sp_over_tp_only_tokens_per_s, tp_only_fits, sp_fits, ...}]}), OUT/sp_crossover.md and,
with matplotlib, OUT/sp_crossover.png.

Usage: sp_crossover.py --sim=BUILD/bin/spgate-sim --out=DIR [--seq_lens=2048,...] [--no_figure]
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PRESETS_CSV = os.path.join(ROOT, "policy", "hardware", "presets.csv")
HARDWARE = ["h100-sxm", "h200-sxm"]
TPS = [4, 8]
SEQ_LENS = [2048, 4096, 8192, 16384, 32768, 65536, 131072]
SHAPE = ["--layers=10", "--hidden=8192", "--heads=64"]
STEPS = 4


def device_memory_gib():
    """The presets' device memory, read from the committed table."""
    mem = {}
    with open(PRESETS_CSV) as f:
        rows = csv.reader(line for line in f if not line.startswith("#"))
        next(rows)
        for row in rows:
            if len(row) >= 3 and row[1] == "device_memory_gib":
                mem[row[0]] = float(row[2])
    return mem


def memory_headroom():
    """The gates' default memory_headroom, read from the one field table."""
    with open(os.path.join(ROOT, "policy", "gate_config.h")) as f:
        m = re.search(r"X\(double, memory_headroom, ([0-9.]+),", f.read())
    if m is None:
        sys.exit("sp_crossover.py: no memory_headroom default in policy/gate_config.h")
    return float(m.group(1))


def run_point(sim, hardware, tp, seq, extra=()):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        cmd = [sim, "replay", "--compare", f"--hardware={hardware}", f"--tp={tp}",
               f"--lengths=uniform:min={seq},max={seq}", f"--tokens_per_batch={seq}",
               f"--steps={STEPS}", "--groups=1", "--jitter=0", "--device_memory_gib=1000000",
               f"--summary_json={path}"] + SHAPE + list(extra)
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)["compare"]


def point(sim, hardware, tp, seq, memory_gib, headroom):
    c = run_point(sim, hardware, tp, seq)
    o = run_point(sim, hardware, tp, seq, ["--tp_comm_overlap"])
    tps = lambda cmp, p: cmp[p]["effective_tokens_per_s"]
    budget = memory_gib * 2 ** 30 * headroom
    return {
        "hardware": hardware, "tp": tp, "seq_len": seq,
        "sp_over_tp_only_tokens_per_s": round(tps(c, "sp") / tps(c, "tp_only"), 4),
        "tp_only_fits": c["tp_only"]["peak_memory_bytes"] <= budget,
        "sp_fits": c["sp"]["peak_memory_bytes"] <= budget,
        "sp_overlap_over_tp_only_tokens_per_s": round(tps(o, "sp") / tps(o, "tp_only"), 4),
        "tp_only_peak_gib": round(c["tp_only"]["peak_memory_bytes"] / 2 ** 30, 1),
        "sp_peak_gib": round(c["sp"]["peak_memory_bytes"] / 2 ** 30, 1),
        "device_memory_gib": memory_gib,
        "memory_headroom": headroom,
    }


def markdown(rows):
    lines = ["| hardware | TP | sequence | SP / TP-only tokens/s | with --tp_comm_overlap | "
             "TP-only peak GiB (fits) | SP peak GiB (fits) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    yes = lambda b: "yes" if b else "**no**"
    for r in rows:
        lines.append(f"| {r['hardware']} | {r['tp']} | {r['seq_len'] // 1024}K | "
                     f"{r['sp_over_tp_only_tokens_per_s']:.3f} | "
                     f"{r['sp_overlap_over_tp_only_tokens_per_s']:.3f} | "
                     f"{r['tp_only_peak_gib']:.1f} ({yes(r['tp_only_fits'])}) | "
                     f"{r['sp_peak_gib']:.1f} ({yes(r['sp_fits'])}) |")
    return "\n".join(lines) + "\n"


def figure(rows, path):
    import matplotlib  # noqa: PLC0415 (optional: the table does not need it)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = {"h100-sxm": "-", "h200-sxm": "--"}
    colors = {4: "tab:blue", 8: "tab:red"}
    for hw in HARDWARE:
        for tp in TPS:
            pts = [r for r in rows if r["hardware"] == hw and r["tp"] == tp]
            xs = [r["seq_len"] for r in pts]
            ax.plot(xs, [r["sp_over_tp_only_tokens_per_s"] for r in pts], styles[hw],
                    color=colors[tp], marker="o", label=f"{hw}, TP {tp}")
            # TP-only does not fit: SP is the only mode that runs there.
            no_tp = [r for r in pts if not r["tp_only_fits"]]
            ax.scatter([r["seq_len"] for r in no_tp],
                       [r["sp_over_tp_only_tokens_per_s"] for r in no_tp], s=120,
                       facecolors="none", edgecolors=colors[tp])
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(SEQ_LENS, [f"{s // 1024}K" for s in SEQ_LENS])
    ax.set_xlabel("tokens per sequence (one sequence per micro-batch)")
    ax.set_ylabel("SP tokens/s over TP-only")
    ax.set_title("70B-class stage (h 8192, 10 layers): SP over TP-only\n"
                 "open circle: TP-only does not fit the device")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq_lens", default=",".join(str(s) for s in SEQ_LENS))
    ap.add_argument("--no_figure", action="store_true")
    args = ap.parse_args()
    seqs = [int(s) for s in args.seq_lens.split(",")]
    if not seqs or min(seqs) < 1:
        sys.exit("sp_crossover.py: --seq_lens must be positive token counts")
    memory = device_memory_gib()
    headroom = memory_headroom()
    os.makedirs(args.out, exist_ok=True)
    rows = [point(args.sim, hw, tp, seq, memory[hw], headroom)
            for hw in HARDWARE for tp in TPS for seq in seqs]
    with open(os.path.join(args.out, "sp_crossover.json"), "w") as f:
        json.dump({"rows": rows, "config": {"flags": SHAPE, "steps": STEPS}}, f, indent=2)
    md = markdown(rows)
    with open(os.path.join(args.out, "sp_crossover.md"), "w") as f:
        f.write(md)
    print(md)
    if not args.no_figure:
        try:
            figure(rows, os.path.join(args.out, "sp_crossover.png"))
        except ImportError:
            sys.exit("sp_crossover.py: %s has no matplotlib (apt-get install "
                     "python3-matplotlib, or SPGATE_PLOT_PYTHON=a python3 with it); the table "
                     "is written, the figure is not (--no_figure: no figure asked)"
                     % sys.executable)


if __name__ == "__main__":
    main()
