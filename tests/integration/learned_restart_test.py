#!/usr/bin/python3
"""ADAPTIVE's learning survives a kill -9 of spgated (docs/operations.md, "What persists").

Two spgate-sim jobs run under ADAPTIVE against one spgated with a --state_dir: `cold`,
whose exploration over its first steps from an empty table is the baseline, and `warm`,
which runs long. Once warm has learned, spgated is killed (-9) and restarted at once on
the same state dir; warm's clients reconnect and the restarted daemon decides the rest
of its steps. Checked: right after the restart `spgatectl --output=json jobs show warm`
has `learned.cells` (the cells of the file written before the kill), and over the first
500 steps the restarted daemon decides (`spgatectl watch`, reason PROBE: ADAPTIVE's
exploration and any wait-share probe of the gates it keeps, counted alike for all three
jobs) warm explores
at most 10 % of what cold did over its first 500 (--max_ratio) more than `steady` — the
same job (same seed, so the same batches step by step) run on a second spgated that is
never killed — explores over the same steps. What a table that has learned explores
anyway (the 4-step run in every 1,000 steps of the floor the jobs set, bands still
seldom seen) is not the restart's cost; the figures printed say how much of it there was.

Run: /usr/bin/python3 learned_restart_test.py --spgated=BIN --sim=BIN --spgatectl=BIN
(`--seed` picks the jobs' length stream; bench/learned_restart.sh runs it over five.)
Loopback only; bounded in time; every process is killed on exit.
"""
import argparse
import faulthandler
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "demo"))
import spgate_reflect as sr  # noqa: E402

CREDENTIAL = "learned-restart-test-credential-0001"
# Steps a second of each simulated job, and the steps of each run: the cold baseline,
# and warm's whole run (killed at --kill_at_step, the rest decided after the restart).
RATE = 250
WINDOW = 500
# The adaptive_explore_floor the jobs set (not the default: a period that fits the run),
# and its probe period: a 4-step run every 1,000 steps.
FLOOR_SHARE = 0.004
FLOOR_PERIOD = 1000


def ctl(args, daemon, *rest):
    out = subprocess.run([args.spgatectl, f"--admin={daemon.admin_address}", "--output=json",
                          "--timeout=10s", *rest], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"spgatectl {' '.join(rest)}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def show(args, daemon, job):
    return ctl(args, daemon, "jobs", "show", job)


def cells_of(job_json):
    cells = job_json.get("learned", {}).get("cells", [])
    return {(c.get("band", 0), c.get("mode", "")) for c in cells}


def sim(args, daemon, job, steps, tmp, summary=None):
    env = dict(os.environ, SPGATE_LAUNCH_CREDENTIAL=CREDENTIAL)
    return subprocess.Popen(
        [args.sim, f"--controller={daemon.worker_address}", f"--job_id={job}",
         f"--incarnation={job}-launch", "--groups=1", "--tp=2", f"--steps={steps}",
         f"--steps_per_s={RATE}", "--deadline=100ms", f"--seed={args.seed}",
         f"--summary_json={os.path.join(tmp, (summary or job) + '.json')}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def watch(args, daemon, job, count):
    """`spgatectl watch JOB --count=N -o json`, started now: the job's next N decisions."""
    return subprocess.Popen([args.spgatectl, f"--admin={daemon.admin_address}", "--output=json",
                             "--timeout=10s", "watch", job, f"--count={count}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def probes(proc, count, exact=True):
    """(steps, PROBE steps) of a watch's decisions; `exact`: it must have seen `count` (else
    it is stopped after a grace and what it saw is used: its job ended with fewer daemon
    decisions, some steps decided locally)."""
    try:
        out, err = proc.communicate(timeout=60 if exact else 3)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    decisions = [json.loads(line) for line in out.splitlines() if line.strip()]
    if exact and len(decisions) != count:
        raise RuntimeError(f"watch saw {len(decisions)} of {count} decisions: {err[-500:]}")
    steps = [int(d.get("step", 0)) for d in decisions]
    return steps, [int(d.get("step", 0)) for d in decisions if d.get("reason") == "PROBE"]


def main():
    faulthandler.enable()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spgated", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--spgatectl", required=True)
    p.add_argument("--cold_steps", type=int, default=600)
    p.add_argument("--warm_steps", type=int, default=3000)
    p.add_argument("--kill_at_step", type=int, default=1500)
    p.add_argument("--max_ratio", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=7, help="the jobs' length stream")
    p.add_argument("--json_out", default="", help="also write the figures printed here")
    args = p.parse_args()
    faulthandler.dump_traceback_later(100, exit=True)
    tmp = tempfile.mkdtemp(prefix="spgate-learned-")
    state = os.path.join(tmp, "state")
    config = os.path.join(tmp, "gates.txtpb")
    with open(config, "w") as f:
        f.write(f"policy: ADAPTIVE\nadaptive_explore_floor: {FLOOR_SHARE}\n")
    daemon_args = ["--learned_persist_interval=0s", "--stale_after=2s"]
    failures, procs = [], []
    daemon = control = None
    try:
        daemon = sr.SpgatedProcess(args.spgated, state_dir=state, config=config,
                                   extra_args=daemon_args).start()
        control = sr.SpgatedProcess(args.spgated, config=config).start()
        cold_watch = watch(args, daemon, "cold", WINDOW)
        steady_watch = watch(args, control, "warm", args.warm_steps)
        procs += [cold_watch, steady_watch]
        time.sleep(0.5)  # the watches are attached before the jobs' first plans
        warm = sim(args, daemon, "warm", args.warm_steps, tmp)
        steady = sim(args, control, "warm", args.warm_steps, tmp, summary="steady")
        cold = sim(args, daemon, "cold", args.cold_steps, tmp)
        procs += [warm, steady, cold]
        _, cold_err = cold.communicate(timeout=60)
        if cold.returncode != 0:
            raise RuntimeError(f"spgate-sim (cold) exited {cold.returncode}: {cold_err[-500:]}")
        _, cold_probes = probes(cold_watch, WINDOW)
        # Kill once warm has learned, and once a write of its tables since then is on disk.
        path = os.path.join(state, "learned", "warm.textproto")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            groups = show(args, daemon, "warm").get("groups", [])
            if groups and int(groups[0].get("last_step", 0)) >= args.kill_at_step:
                break
            time.sleep(0.05)
        written = time.time()
        while time.monotonic() < deadline and (
                not os.path.exists(path) or os.path.getmtime(path) < written):
            time.sleep(0.05)
        daemon.kill()
        with open(path) as f:
            text = f.read()
        file_cells = {(int(b), m) for b, m in re.findall(
            r"cells \{\s*band: (\d+)\s*mode: (\w+)", text.split("\nstage_tables")[0])}
        file_cells |= {(0, m) for m in re.findall(r"cells \{\s*mode: (\w+)", text)}
        # The restarted daemon must be where warm's clients reconnect: the worker port the
        # kernel gave the first one (a port picked here and bound later could be taken in
        # between by a test running beside this one).
        daemon = sr.SpgatedProcess(
            args.spgated, state_dir=state, config=config,
            extra_args=daemon_args + [f"--listen=127.0.0.1:{daemon.worker_port}"]).start()
        warm_watch = watch(args, daemon, "warm", WINDOW)
        procs.append(warm_watch)
        after_restart = show(args, daemon, "warm")
        shown = cells_of(after_restart)
        if not shown:
            failures.append("jobs show after the restart has no learned.cells")
        if not file_cells or not file_cells <= shown:
            failures.append(f"learned.cells after the restart {sorted(shown)} lack the written "
                            f"file's {sorted(file_cells)}")
        _, warm_err = warm.communicate(timeout=60)
        if warm.returncode != 0:
            failures.append(f"warm exited {warm.returncode}: {warm_err[-2000:]}")
        warm_steps, warm_probes = probes(warm_watch, WINDOW)
        steady.communicate(timeout=60)
        steady_steps, steady_all = probes(steady_watch, args.warm_steps, exact=False)
        # Compared over the steps both daemons decided (a loaded machine may leave a few to
        # the clients' fallback, which the watches do not see).
        window = set(warm_steps) & set(steady_steps)
        if len(window) < 0.8 * WINDOW:
            failures.append(f"the two daemons decided only {len(window)} of the window's "
                            "steps in common (the machine is too loaded to compare)")
        warm_probes = [p for p in warm_probes if p in window]
        steady_probes = [p for p in steady_all if p in window]
        beyond = len(warm_probes) - len(steady_probes)
        result = {"cold_first_500_steps": {"probe_steps": len(cold_probes)},
                  "after_restart_first_500_steps": {
                      "steps": [warm_steps[0], warm_steps[-1]],
                      "probe_steps": len(warm_probes),
                      "in_the_floor_run": sum(p % FLOOR_PERIOD < 4 for p in warm_probes)},
                  "never_restarted_same_steps": {"steps": len(window),
                                                 "probe_steps": len(steady_probes)},
                  "learned_cells_after_restart": len(shown),
                  "ratio_to_cold": round(len(warm_probes) / max(len(cold_probes), 1), 3),
                  "ratio_to_cold_beyond_never_restarted":
                      round(beyond / max(len(cold_probes), 1), 3)}
        print(json.dumps(result, indent=2))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        if not cold_probes:
            failures.append("the cold start explored no step: nothing to compare with")
        if beyond > args.max_ratio * len(cold_probes):
            failures.append(f"after the restart warm explored {len(warm_probes)} of {WINDOW} "
                            f"steps, {beyond} more than the never-restarted job over the same "
                            f"steps: more than {args.max_ratio:.0%} of the cold start's "
                            f"{len(cold_probes)}")
    except Exception as e:  # noqa: BLE001 - reported as a failure
        import traceback
        traceback.print_exc()
        failures.append(f"error: {e!r}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if control is not None:
            control.kill()
        if daemon is not None:
            if failures:
                failures.append("spgated's stderr (tail):\n" + daemon.stderr_text[-3000:])
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
