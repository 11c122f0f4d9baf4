#!/usr/bin/env python3
"""Driver of bench/switch_cost.sh: runs spgate-worker --mode=alternate:TURN under mpirun
with each arena cache (--arena_cache=exact, the baseline, and classes), interleaved and
on the same seed in every round, and reports medians over rounds of what the worker's
summary measures about switching:

  switch_cost_ratio          median s/token of first steps after a switch over the rest
  switch_device_alloc_bytes  bytes taken from the device by first steps after a switch
  steady_device_alloc_bytes  the same for the mode's other steps

and, per round, the classes cache's effective tokens/s over the baseline's.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

COMMON = ["--tp=4", "--layers=2", "--hidden=64", "--heads=4", "--ffn_hidden=256",
          "--lengths=lognormal:mean=384,sigma=1.0", "--tokens_per_batch=2048",
          "--attention_query_block=128", "--norm_boundary=shard", "--bucketing"]
CACHES = ["exact", "classes"]
MODES = ["sp", "tp_only"]


def run(args, cache, seed, tmp):
    path = os.path.join(tmp, f"{cache}-{seed}.json")
    cmd = [args.mpirun, "--oversubscribe", "-np", "4",
           os.path.join(args.build, "bin", "spgate-worker")] + COMMON + [
        f"--mode=alternate:{args.turn}", f"--steps={args.steps}", f"--seed={seed}",
        f"--arena_cache={cache}", f"--summary_json={path}"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"switch_cost: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--turn", type=int, default=8)
    ap.add_argument("--mpirun", default="mpirun")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 4 * args.turn:
        sys.exit("switch_cost: need --rounds >= 1 and --steps >= 4 * --turn")

    per = {c: [] for c in CACHES}
    speedup = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            seed = 100 + r
            order = CACHES if r % 2 == 0 else CACHES[::-1]
            got = {c: run(args, c, seed, tmp) for c in order}
            for c in CACHES:
                per[c].append(got[c])
            speedup.append(got["classes"]["effective_tokens_per_s"]["all"] /
                           got["exact"]["effective_tokens_per_s"]["all"])
            print(f"round {r + 1}/{args.rounds}: classes/exact tokens/s {speedup[-1]:.3f}",
                  file=sys.stderr)

    def med(cache, key, mode):
        vals = [s[key][mode] for s in per[cache] if mode in s.get(key, {})]
        return statistics.median(vals) if vals else float("nan")

    rows = []
    for c in CACHES:
        for m in MODES:
            rows.append({
                "cache": c, "mode": m,
                "switch_cost_ratio": med(c, "switch_cost_ratio", m),
                "switch_device_alloc_bytes": med(c, "switch_device_alloc_bytes", m),
                "steady_device_alloc_bytes": med(c, "steady_device_alloc_bytes", m),
                # A run with turns of one step has no steady steps, hence no ratio.
                "switch_cost_ratio_range": [
                    min((s["switch_cost_ratio"][m] for s in per[c] if m in s["switch_cost_ratio"]),
                        default=float("nan")),
                    max((s["switch_cost_ratio"][m] for s in per[c] if m in s["switch_cost_ratio"]),
                        default=float("nan"))],
            })
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rounds": args.rounds, "steps": args.steps, "turn": args.turn,
        "rows": rows,
        "classes_over_exact_tokens_per_s": {
            "median": statistics.median(speedup), "min": min(speedup), "max": max(speedup),
            "rounds": speedup},
    }
    lines = [f"{args.rounds} rounds x {args.steps} steps, turns of {args.turn} "
             f"(load average at the end {result['load_average'][0]:.1f})", "",
             "| cache | switched to | switch_cost_ratio (median, range) | device MiB/step "
             "after a switch | device MiB/step otherwise |",
             "|---|---|---:|---:|---:|"]
    for row in rows:
        lo, hi = row["switch_cost_ratio_range"]
        lines.append(f"| {row['cache']} | {row['mode']} | {row['switch_cost_ratio']:.2f} "
                     f"({lo:.2f}–{hi:.2f}) | {row['switch_device_alloc_bytes'] / 2**20:.2f} | "
                     f"{row['steady_device_alloc_bytes'] / 2**20:.2f} |")
    sp = result["classes_over_exact_tokens_per_s"]
    lines += ["", f"classes / exact effective tokens/s, same round: median {sp['median']:.3f} "
              f"(range {sp['min']:.3f}–{sp['max']:.3f})"]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "switch_cost.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "switch_cost.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(text)


if __name__ == "__main__":
    main()
