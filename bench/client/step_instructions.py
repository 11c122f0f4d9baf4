#!/usr/bin/env python3
"""The client's per-step calls in instructions, not nanoseconds (docs/benchmarks.md, "Per-step
cost on the training thread").

This VM has no hardware counters and its timings swing 4-5x from run to run, so a difference
of a few hundred nanoseconds on the training thread cannot be attributed by timing alone.
Valgrind's callgrind counts instructions exactly: this script runs client_step_bench
(`--step_us=0`) under callgrind once per variant at two step counts, and reports each call's
inclusive instructions on the training thread (the main thread: callgrind's `-01` file) per
step, as the difference between the two runs over the difference in steps, so start-up,
the daemon's set-up and the loop's untimed polling of the client's stats are not counted.
Instructions are not time (cache misses and lock hand-offs are not in them), but two builds
compared this way differ only by what their code executes.

Usage: bench/client/step_instructions.py --bench=BUILD/bench/client_step_bench
       [--variants=local_only,gate_client,gate_client_group8] [--steps=2000] [--out=FILE.json]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The training thread's calls, as callgrind_annotate names them (the group variant's leader
# reports through GroupDecider, which calls GateClient::ReportTelemetry).
CALLS = {
    "submit": "spgate::client::GateClient::SubmitPlan(",
    "await": "spgate::client::GateClient::AwaitDecision(",
    "report": "spgate::client::GateClient::ReportTelemetry(",
    "group_report": "spgate::client::GroupDecider::ReportTelemetry(",
}
VARIANTS = ["local_only", "gate_client", "gate_client_group8"]
WARMUP = 200


def inclusive(bench, variant, steps, tmp):
    """Each call's inclusive instructions on the training thread over one run."""
    out = os.path.join(tmp, f"cg.{variant}.{steps}")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no",
           f"--callgrind-out-file={out}", bench, f"--variants={variant}", f"--steps={steps}",
           f"--warmup={WARMUP}", "--step_us=0", "--sequences=16"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    main_thread = out + "-01"
    if not os.path.exists(main_thread):
        sys.exit(f"callgrind wrote no {main_thread}")
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", main_thread],
                         capture_output=True, text=True, check=True).stdout
    got = {}
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(\S.*)$", line)
        if not m:
            continue
        for key, name in CALLS.items():
            # The call's own line (file:function [binary]), not a line of its inlined parts.
            if name in m.group(2) and "[" in m.group(2) and key not in got:
                got[key] = int(m.group(1).replace(",", ""))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path to client_step_bench")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if not variants or not set(variants) <= set(VARIANTS):
        sys.exit(f"--variants: of {','.join(VARIANTS)}, got {a.variants!r}")
    if not 200 <= a.steps <= 100000:
        sys.exit("--steps must be in [200, 100000]")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian package valgrind)")
    half = a.steps // 2
    tmp = tempfile.mkdtemp(prefix="spgate-step-ir-")
    rows = {}
    try:
        for v in variants:
            short, full = inclusive(a.bench, v, half, tmp), inclusive(a.bench, v, a.steps, tmp)
            rows[v] = {k: (full[k] - short.get(k, 0)) / (a.steps - half)
                       for k in CALLS if k in full}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| variant (instructions per step, training thread; {half} vs {a.steps} steps) | "
          + " | ".join(CALLS) + " | submit + await + report |")
    print("|---|" + "---:|" * (len(CALLS) + 1))
    for v, r in rows.items():
        total = sum(r.get(k, 0) for k in ("submit", "await")) + r.get(
            "group_report", r.get("report", 0))
        rows[v]["step"] = total
        print(f"| {v} | " + " | ".join(f"{r[k]:,.0f}" if k in r else "-" for k in CALLS)
              + f" | {total:,.0f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "client_step_instructions", "steps": [half, a.steps],
                       "warmup": WARMUP, "instructions_per_step": rows}, f, indent=2)


if __name__ == "__main__":
    main()
