#!/usr/bin/env python3
"""The benchmark binaries, run for a moment each: does every benchmark measure the path it
claims, and does every driver measure what it reports?

A Google Benchmark whose set-up check fails calls SkipWithError: the run prints ERROR
OCCURRED, times nothing and still exits 0, so a benchmark can stop measuring without
anyone noticing. The drivers have the same shape of failure: decision_roundtrip_bench
counts failed round trips in its JSON's `errors` and exits 0; client_step_bench counts
the decisions that came from the local policy instead of the daemon (`not_from_daemon`)
and exits 0. This runs each binary it is given with a tiny run and fails, naming the
benchmark and its message, on any of those; with client_step_bench it also runs
bench/client/step_compare.py over it twice (one round) and checks its table has every
variant timed for both. (state_memory_bench and kernels_cpu_bench
exit non-zero on a failed check already; kernels_gpu_bench needs a GPU.)

A smoke run checks that each path works, not how fast it is, and it shares a loaded machine
with other tests (ctest -j2 on 2 cores):
- the binaries run one after another, never together;
- client_step_bench has no flag for the client's decision deadline (20 ms), so a decision
  that missed it under load falls back to the local policy: a variant fails only when more
  than half its measured steps were not from the daemon (a broken daemon path makes all of
  them so), or when more than 2 steps waited out the loop's second for an answer
  (`stalled`). A failed round trip has a 10 s RPC deadline and is always a failure;
- each binary gets at most PER_BINARY_S, and all of them together DEADLINE_S, which is
  well under the test's ctest TIMEOUT (bench/CMakeLists.txt): a binary that hangs is
  killed and named, and those not started by the deadline are named too.

With spgated, bench/server/stop_time.py runs one round and a stop with /metrics on must
take under a second.

Usage: smoke_test.py [--gbench=BIN]... [--client_step=BIN] [--roundtrip=BIN] [--spgated=BIN]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

# All jobs together; the test's ctest TIMEOUT (bench/CMakeLists.txt) is 120 s. A quiet
# run of them takes about 7 s in all, one after another (ctest, this machine).
DEADLINE_S = 75
PER_BINARY_S = 30


def run_one(argv, out_dir, name, timeout_s):
    """Runs argv with stdout and stderr to a file in out_dir, killing it after timeout_s.
    Returns (exit status or a sentence saying it was killed, log path)."""
    log = os.path.join(out_dir, name + ".log")
    with open(log, "w") as f:
        # A session of its own: a job killed for its time takes what it started with it
        # (stop_time.py's spgated, a driver's daemon).
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=out_dir,
                             start_new_session=True)
        try:
            return p.wait(timeout=timeout_s), log
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return f"killed: still running after {timeout_s:.0f} s (it hung or the machine " \
                   "is overloaded)", log


def tail(path, n=20):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"{what}: no JSON results ({e})"


def check_gbench(path):
    """Google Benchmark's JSON: every benchmark ran and none has error_occurred."""
    data, err = load(path, "google benchmark")
    if err:
        return [err]
    runs = data.get("benchmarks", [])
    if not runs:
        return ["no benchmarks in the JSON"]
    problems = []
    for b in runs:
        # 1.7 writes error_occurred/error_message; later versions may write `skipped`.
        if b.get("error_occurred") or b.get("skipped"):
            message = b.get("error_message") or b.get("skip_message") or "(no message)"
            problems.append(f"{b.get('name', '?')}: {message}")
        elif not b.get("iterations"):
            problems.append(f"{b.get('name', '?')}: no iterations timed")
    return problems


def check_client_step(path):
    data, err = load(path, "client_step_bench")
    if err:
        return [err]
    results = data.get("results", [])
    steps = data.get("steps", 0)
    problems = [] if len(results) == 4 else [f"expected 4 variants, got {len(results)}"]
    if not steps > 0:
        problems.append(f"no measured steps in the JSON (steps {steps})")
    for r in results:
        if not r.get("median_ns", 0) > 0:
            problems.append(f"{r.get('name')}: no steps timed (median_ns {r.get('median_ns')})")
        # A few late decisions are load, not a broken path (the module's docstring).
        missed = r.get("not_from_daemon", 0)
        if 2 * missed > steps:
            problems.append(f"{r.get('name')}: {missed} of {steps} decisions came from the "
                            "local policy, not the daemon")
        # A step that waited out its second for an answer: the loop lost track of the
        # daemon's answers (or the daemon stopped answering); a couple is load.
        stalled = r.get("stalled")
        if stalled is None:
            problems.append(f"{r.get('name')}: no `stalled` in the JSON")
        elif stalled > 2:
            problems.append(f"{r.get('name')}: {stalled} steps waited a second for an answer "
                            "that never came")
    return problems


def check_step_compare(path):
    data, err = load(path, "step_compare.py")
    if err:
        return [err]
    problems = []
    for v in ("local_only", "gate_client", "gate_client_group8"):
        for build in ("a", "b"):
            s = data.get("table", {}).get(v, {}).get(build)
            if not s or s.get("runs") != 1 or not s.get("median_ns", 0) > 0:
                problems.append(f"step_compare.py: no timed run of {v} for build {build}: {s}")
    return problems


def check_roundtrip(path):
    data, err = load(path, "decision_roundtrip_bench")
    if err:
        return [err]
    results = data.get("results", [])
    problems = [] if results else ["no results"]
    for r in results:
        case = f"groups {r.get('groups')} microbatches {r.get('microbatches')}"
        if r.get("errors", 0) != 0:
            problems.append(f"{case}: {r['errors']} failed round trips")
        for server in ("echo", "spgated"):
            s = r.get(server, {})
            if not (s.get("decisions_per_s", 0) > 0 and s.get("p50_us", 0) > 0):
                problems.append(f"{case}: {server} measured nothing ({s})")
    return problems


def check_stop_time(path):
    data, err = load(path, "stop_time.py")
    if err:
        return [err]
    problems = []
    for v in ("metrics_on", "metrics_off"):
        if not (data.get(v, {}).get("median_s", 0) > 0):
            problems.append(f"{v}: measured nothing ({data.get(v)})")
    # The /metrics server's two-second accept poll is not waited out (one run, a loaded
    # machine: a bound far above the ~20 ms a stop takes, far below the poll).
    if data.get("metrics_on", {}).get("median_s", 0) > 1.0:
        problems.append(f"a stop with /metrics on took {data['metrics_on']['median_s']:.2f} s")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gbench", action="append", default=[],
                    help="a Google Benchmark binary (repeatable)")
    ap.add_argument("--client_step", help="client_step_bench")
    ap.add_argument("--roundtrip", help="decision_roundtrip_bench")
    ap.add_argument("--spgated", help="spgated, for bench/server/stop_time.py")
    args = ap.parse_args()
    # The binaries run in a scratch folder: a relative path is taken from here.
    args.gbench = [os.path.abspath(b) for b in args.gbench]
    for b in (args.gbench + [args.client_step, args.roundtrip, args.spgated]):
        if b is not None and not os.access(b, os.X_OK):
            ap.error(f"{b}: not an executable file")
    args.client_step = args.client_step and os.path.abspath(args.client_step)
    args.roundtrip = args.roundtrip and os.path.abspath(args.roundtrip)
    args.spgated = args.spgated and os.path.abspath(args.spgated)
    if not (args.gbench or args.client_step or args.roundtrip or args.spgated):
        ap.error("no binary to run")

    with tempfile.TemporaryDirectory(prefix="spgate-bench-smoke-") as out:
        return run(args, out)


def run(args, out):
    jobs = []  # (name, argv, log name, JSON path, check)
    for i, b in enumerate(args.gbench):
        name = f"{os.path.basename(b)}.{i}"
        j = os.path.join(out, name + ".json")
        # 0.001 s: the smallest minimum time Google Benchmark 1.7 takes as a number.
        jobs.append((name, [b, "--benchmark_min_time=0.001", "--benchmark_format=console",
                            f"--benchmark_out={j}", "--benchmark_out_format=json"],
                     name, j, check_gbench))
    if args.client_step:
        j = os.path.join(out, "client_step.json")
        jobs.append(("client_step_bench", [args.client_step, "--steps=50", "--warmup=5",
                                           "--step_us=0", f"--out={j}"],
                     "client_step", j, check_client_step))
    if args.client_step:
        # bench/client/step_compare.py over two builds (the same binary twice here).
        j = os.path.join(out, "step_compare.json")
        compare = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client",
                               "step_compare.py")
        jobs.append(("step_compare.py", [sys.executable, compare, f"a={args.client_step}",
                                         f"b={args.client_step}", "--rounds=1", "--steps=50",
                                         f"--out={j}"],
                     "step_compare", j, check_step_compare))
    if args.roundtrip:
        # A plain plan, and a pipelined job's step plans (docs/design.md §12).
        for name, extra in (("roundtrip", ["--groups=1"]),
                            ("roundtrip_step_plans",
                             ["--groups=4", "--microbatches=4", "--sequences=8"])):
            j = os.path.join(out, name + ".json")
            jobs.append((f"decision_roundtrip_bench ({name})",
                         [args.roundtrip, "--seconds=0.1", "--rounds=1", f"--out={j}"] + extra,
                         name, j, check_roundtrip))

    if args.spgated:
        j = os.path.join(out, "stop_time.json")
        stop_time = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server",
                                 "stop_time.py")
        jobs.append(("stop_time.py", [sys.executable, stop_time, f"--spgated={args.spgated}",
                                      "--rounds=1", f"--out={j}"],
                     "stop_time", j, check_stop_time))

    end = time.monotonic() + DEADLINE_S
    failed = False
    for k, (name, argv, log_name, j, check) in enumerate(jobs):
        left = end - time.monotonic()
        if left < 1:
            failed = True
            print(f"FAIL not run, the {DEADLINE_S} s deadline for all of them was reached: "
                  + ", ".join(x[0] for x in jobs[k:]), flush=True)
            break
        print(f"run  {name}", flush=True)  # named before it starts, in case it hangs
        rc, log = run_one(argv, out, log_name, min(PER_BINARY_S, left))
        problems = [] if rc == 0 else [rc if isinstance(rc, str) else f"exit status {rc}"]
        problems += check(j)
        if problems:
            failed = True
            print(f"FAIL {name}:")
            for x in problems:
                print(f"  {x}")
            last = tail(log)
            if last.strip():
                print(f"  its output's last lines:\n{last}", end="")
            sys.stdout.flush()
        else:
            print(f"ok   {name}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
