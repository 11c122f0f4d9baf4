#!/usr/bin/env python3
"""The client's per-step calls in instructions, not nanoseconds (docs/benchmarks.md, "Per-step
cost on the training thread").

This VM has no hardware counters and its timings swing 4-5x from run to run, so a difference
of a few hundred nanoseconds on the training thread cannot be attributed by timing alone.
Valgrind's callgrind counts instructions exactly: this script runs client_step_bench
(`--step_us=0`) under callgrind once per variant at two step counts, and reports each call's
inclusive instructions on the training thread (the main thread: callgrind's `-01` file) per
step, as the difference between the two runs over the difference in steps, so start-up and
the client's and daemon's set-up drop out (only the named calls are read: the loop's
untimed polling of the client's stats is not in them).
Instructions are not time (cache misses and lock hand-offs are not in them), but two builds
compared this way differ only by what their code executes.

The variants with a daemon vary by a few per cent from run to run (which thread takes a
lock first, how many wake-ups a hand-off needs), so each variant runs --runs times (3) and
the table gives the median (range); `local_only` counts the same on every run.

Usage: bench/client/step_instructions.py --bench=BUILD/bench/client_step_bench
       [--variants=local_only,gate_client,gate_client_group8] [--steps=2000] [--runs=3]
       [--out=FILE.json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# The training thread's calls, as callgrind_annotate names them (the group variant's leader
# reports through GroupDecider, which combines the group's payloads and calls
# GateClient::ReportTelemetry).
CALLS = {
    "submit": "spgate::client::GateClient::SubmitPlan(",
    "await": "spgate::client::GateClient::AwaitDecision(",
    "report": "spgate::client::GateClient::ReportTelemetry(",
    "group_report": "spgate::client::GroupDecider::ReportTelemetry(",
}
VARIANTS = ["local_only", "gate_client", "gate_client_group8"]
NEEDED = {"local_only": ("submit", "await", "report"), "gate_client": ("submit", "await", "report"),
          "gate_client_group8": ("submit", "await", "report", "group_report")}
WARMUP = 200


def inclusive(bench, variant, steps, tmp):
    """Each call's inclusive instructions on the training thread over one run."""
    out = os.path.join(tmp, f"cg.{variant}.{steps}")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no",
           f"--callgrind-out-file={out}", bench, f"--variants={variant}", f"--steps={steps}",
           f"--warmup={WARMUP}", "--step_us=0", "--sequences=16"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        sys.exit(f"{' '.join(cmd)}: no end within 30 minutes")
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    main_thread = out + "-01"
    if not os.path.exists(main_thread):
        sys.exit(f"callgrind wrote no {main_thread}")
    # Every function (--threshold=100: none cut off below the default 99 %), run from the
    # scratch folder: callgrind_annotate strips the working directory from some file names
    # and not others, and files a function's cost under each spelling.
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                          main_thread], capture_output=True, text=True, cwd=tmp)
    if ann.returncode != 0:
        sys.exit(f"callgrind_annotate {main_thread} failed:\n{ann.stderr[-2000:]}")
    got = {}
    for line in ann.stdout.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(\S.*)$", line)
        if not m:
            continue
        for key, name in CALLS.items():
            # The largest line naming the call is the call: any other (a lambda of it, a
            # part inlined from a header) is inside it.
            if name in m.group(2):
                got[key] = max(got.get(key, 0), int(m.group(1).replace(",", "")))
    missing = [k for k in NEEDED[variant] if k not in got]
    if missing:
        sys.exit(f"{variant}, {steps} steps: no {', '.join(missing)} in {main_thread}")
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path to client_step_bench")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if not variants or not set(variants) <= set(VARIANTS):
        sys.exit(f"--variants: of {','.join(VARIANTS)}, got {a.variants!r}")
    if not 200 <= a.steps <= 100000 or not 1 <= a.runs <= 20:
        sys.exit("--steps must be in [200, 100000] and --runs in [1, 20]")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian package valgrind)")
    half = a.steps // 2
    tmp = tempfile.mkdtemp(prefix="spgate-step-ir-")
    runs = {}
    try:
        for v in variants:
            runs[v] = []
            for _ in range(a.runs):
                short = inclusive(a.bench, v, half, tmp)
                full = inclusive(a.bench, v, a.steps, tmp)
                r = {k: (full[k] - short[k]) / (a.steps - half) for k in NEEDED[v]}
                # A step: submit, await and the report (the group's, which holds the client's).
                r["step"] = r["submit"] + r["await"] + r.get("group_report", r["report"])
                runs[v].append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| variant (instructions per step, training thread; {half} vs {a.steps} steps, "
          f"median of {a.runs} (range)) | " + " | ".join(CALLS) + " | per step |")
    print("|---|" + "---:|" * (len(CALLS) + 1))
    table = {}
    for v, rs in runs.items():
        table[v] = {k: {"median": statistics.median(r[k] for r in rs),
                        "min": min(r[k] for r in rs), "max": max(r[k] for r in rs)}
                    for k in rs[0]}
        cell = lambda k: (f"{table[v][k]['median']:,.0f} ({table[v][k]['min']:,.0f}–"
                          f"{table[v][k]['max']:,.0f})" if k in table[v] else "-")
        print(f"| {v} | " + " | ".join(cell(k) for k in CALLS) + f" | {cell('step')} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "client_step_instructions", "steps": [half, a.steps],
                       "warmup": WARMUP, "runs": a.runs, "instructions_per_step": table,
                       "raw": runs}, f, indent=2)


if __name__ == "__main__":
    main()
