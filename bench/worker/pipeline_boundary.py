#!/usr/bin/env python3
"""What the stage-boundary contract costs on the CPU worker (docs/design.md §12).

spgate-worker runs a TP2 x PP2 job (4 ranks, 1F1B over 4 micro-batches a step) under
mpirun, once per row and round, rows in a rotated order each round so machine noise hits
all of them, and reads each run's --summary_json. Every figure is a ratio to the SP row
of the same round (SP's native layout is the sharded one, so it is the same under both
formats); the table shows the median ratio over the rounds and the rounds' spread.

Rows: SP; TP-only with the sharded boundary (the contract: t x smaller messages, an
all-gather at each TP-only stage's entry and in its backward); TP-only with each mode's
native boundary (the whole sequence crosses, no gather; only safe when every stage runs
the same mode); the static gates deciding per stage and micro-batch (spgated's STATIC,
sharded boundary); ADAPTIVE per stage and micro-batch (spgated, learning each stage from
its micro-batches' telemetry, every ADAPTIVE setting at its default: what a job that sets
policy ADAPTIVE gets). Every row's ranks talk to the same spgated (the forced rows only
report telemetry), so every row carries the same client threads.

--adaptive_flags adds gate flags to the ADAPTIVE row's job (e.g. "--adaptive_min_samples=2
--adaptive_explore_share=0.15" to watch a short run learn); the row is then labelled with
them, since it is no longer ADAPTIVE as shipped. --rows=sp,static,adaptive runs only those
rows (SP, the baseline, always runs), for a longer run of the policies alone.

Each row also records what the daemon spent on it (spgated's CPU seconds over the row's
run, from /proc) and the workers' decision wait (the p95 over steps of the first stage's
slowest rank's wait for its group's decision): what a policy's learning costs on the
decision's path.

Usage: bench/worker/pipeline_boundary.py --build=BUILD_DIR [--rounds=3] [--steps=12]
       [--adaptive_flags=FLAGS] [--rows=KEYS] [--out=FILE.json]
"""
import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

# The same spgated on loopback (port 0), and the paired ratio's interval and verdict.
from replay_table import median_ci, start_daemon, tie_verdict

COMMON = ["--tp=2", "--pp=2", "--microbatches=4", "--layers=4", "--hidden=128", "--heads=4",
          "--ffn_hidden=512", "--lengths=lognormal:mean=384,sigma=1.0",
          "--tokens_per_batch=2048", "--seed=11", "--attention_query_block=128"]
ROWS = [
    ("SP", ["--mode=sp"]),
    ("TP-only, sharded boundary (the contract)", ["--mode=tp"]),
    ("TP-only, native boundary (whole sequence)", ["--mode=tp", "--stage_boundary=native"]),
    ("static gates per stage and micro-batch", ["--mode=auto"]),
    ("ADAPTIVE per stage and micro-batch", ["--mode=auto"]),
]
ROW_KEYS = ["sp", "tp_sharded", "tp_native", "static", "adaptive"]  # --rows, ROWS' order
assert len(ROW_KEYS) == len(ROWS)
ADAPTIVE_ROW = ROWS[-1][0]
# The ADAPTIVE row's job config (bench/worker/replay_table.py's), set on the daemon: the
# policy alone, every ADAPTIVE setting at its default.
ADAPTIVE_FLAGS = ["--policy=adaptive"]
BASE = "SP"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")


def cpu_seconds(pid):
    """A process's user + system CPU seconds so far (/proc/PID/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(build, mpirun, flags, steps, tmp):
    path = os.path.join(tmp, "summary.json")
    cmd = [mpirun, "--oversubscribe", "-np", "4", os.path.join(build, "bin", "spgate-worker"),
           *COMMON, *flags, f"--steps={steps}", f"--summary_json={path}",
           "--decision_deadline=2s", "--connect_timeout=30s"]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    with open(path) as f:
        s = json.load(f)
    if s["p2p_size_mismatches"] or s["consistency_violations"]:
        sys.exit(f"{cmd}: p2p size mismatches or consistency violations")
    return {"tokens_per_s": s["effective_tokens_per_s"]["all"],
            "step_time_mean_s": s["step_time_mean_s"]["all"],
            "p2p_bytes_per_step": s["p2p_bytes_sent"] / s["steps"],
            "peak_memory_bytes": s["peak_memory_bytes"]["all"],
            "decision_wait_p95_s": s["decision_wait_p95_s"],
            "decisions": s["decisions"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--adaptive_flags", default="",
                    help="extra gate flags for the ADAPTIVE row's job (labelled in the table)")
    ap.add_argument("--rows", default=",".join(ROW_KEYS),
                    help="comma-separated rows to run, of " + ",".join(ROW_KEYS))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not 1 <= a.rounds <= 20 or not 2 <= a.steps <= 1000:
        sys.exit("--rounds must be in [1, 20] and --steps in [2, 1000]")
    wanted = set(filter(None, a.rows.split(","))) or set(ROW_KEYS)  # empty: every row
    if not wanted <= set(ROW_KEYS):
        sys.exit(f"--rows: unknown {','.join(sorted(wanted - set(ROW_KEYS)))} "
                 f"(known: {','.join(ROW_KEYS)})")
    if not wanted - {"sp"}:
        sys.exit("--rows: name at least one row besides sp (the baseline, which always runs)")
    rows = [row for key, row in zip(ROW_KEYS, ROWS) if key in wanted or row[0] == BASE]
    names = [name for name, _ in rows]
    adaptive_flags = ADAPTIVE_FLAGS + shlex.split(a.adaptive_flags)
    label = {ADAPTIVE_ROW: ADAPTIVE_ROW + (f" ({a.adaptive_flags.strip()})"
                                           if a.adaptive_flags.strip() else "")}
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="spgate-boundary-")
    ratios = {name: {"tokens_per_s": [], "step_time_mean_s": [], "p2p_bytes_per_step": [],
                     "peak_memory_bytes": []} for name in names}
    raw = []
    daemon, port, admin_port = start_daemon(a.build, tmp)
    spgatectl = os.path.join(a.build, "bin", "spgatectl")
    try:
        for rnd in range(a.rounds):
            order = rows[rnd % len(rows):] + rows[:rnd % len(rows)]
            got = {}
            for name, flags in order:
                job = "boundary-%s-%d" % (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"),
                                          rnd)
                if name == ADAPTIVE_ROW:
                    subprocess.run([spgatectl, f"--admin=127.0.0.1:{admin_port}", "gates", "set",
                                    f"--job_id={job}"] + adaptive_flags,
                                   check=True, capture_output=True, timeout=30)
                cpu_before = cpu_seconds(daemon.pid)
                got[name] = run(a.build, a.mpirun,
                                [*flags, f"--controller=127.0.0.1:{port}", f"--job_id={job}"],
                                a.steps, tmp)
                got[name]["daemon_cpu_s"] = cpu_seconds(daemon.pid) - cpu_before
            raw.append(got)
            base = got[BASE]
            for name in names:
                for key in ratios[name]:
                    ratios[name][key].append(got[name][key] / base[key] if base[key] else 0.0)
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"load average (1 min) {load_before[0]:.1f} before / {load_after[0]:.1f} after",
          file=sys.stderr)
    print(f"| row (TP2 x PP2, 4 micro-batches, {a.steps} steps, {a.rounds} rounds) | tokens/s vs SP "
          "| step time vs SP | p2p bytes/step vs SP | peak memory vs SP |")
    print("|---|---|---|---|---|")
    table = []
    for name in names:
        r = ratios[name]
        cells = []
        for key in ("tokens_per_s", "step_time_mean_s", "p2p_bytes_per_step", "peak_memory_bytes"):
            v = r[key]
            cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})")
        print(f"| {label.get(name, name)} | " + " | ".join(cells) + " |")
        table.append({"row": label.get(name, name), **{k: statistics.median(v) for k, v in r.items()},
                      "range": {k: [min(v), max(v)] for k, v in r.items()}})
    print("\n| row | spgated CPU s per run | decision wait p95 s |\n|---|---|---|")
    for name in names:
        cpu = [r[name]["daemon_cpu_s"] for r in raw]
        wait = [r[name]["decision_wait_p95_s"] for r in raw]
        print(f"| {label.get(name, name)} | {statistics.median(cpu):.2f} ({min(cpu):.2f}–"
              f"{max(cpu):.2f}) | {statistics.median(wait):.4f} ({min(wait):.4f}–{max(wait):.4f}) |")
    static, sharded, native = ROWS[3][0], ROWS[1][0], ROWS[2][0]
    for name in (static, ADAPTIVE_ROW):
        if name in names:
            print(f"\n{label.get(name, name)}, decisions per round (mode -> reason -> "
                  "micro-batches): "
                  + "; ".join(json.dumps(r[name]["decisions"], sort_keys=True) for r in raw))
    # The contract's own cost, paired by round: TP-only with the native boundary over
    # TP-only with the sharded one (> 1: the sharded boundary is slower).
    paired = []
    if sharded in names and native in names:
        paired = [r[native]["step_time_mean_s"] / r[sharded]["step_time_mean_s"] for r in raw]
        print(f"\nTP-only step time, native over sharded boundary, per round: "
              f"{', '.join(f'{x:.3f}' for x in paired)} (median {statistics.median(paired):.3f})")
    # ADAPTIVE against the rule it replaces, paired by round (>= 1: at least the static row),
    # with the median's distribution-free 95 % interval where there are rounds enough.
    over_static, ci = [], None
    if static in names and ADAPTIVE_ROW in names:
        over_static = [r[ADAPTIVE_ROW]["tokens_per_s"] / r[static]["tokens_per_s"] for r in raw]
        median, ci = median_ci(over_static)
        print(f"\nADAPTIVE tokens/s over the static gates', per round: "
              f"{', '.join(f'{x:.3f}' for x in over_static)} (median {median:.3f}, range "
              f"{min(over_static):.3f}-{max(over_static):.3f}, 95 % interval of the median "
              + (f"{ci[0]:.3f}-{ci[1]:.3f}: {tie_verdict(ci)})" if ci else "n/a: < 6 rounds)"))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "pipeline_boundary", "baseline": BASE, "common": COMMON,
                       "adaptive_job_flags": adaptive_flags, "load_average": [load_before, load_after],
                       "steps": a.steps, "rounds": a.rounds, "table": table,
                       "native_over_sharded_step_time": paired,
                       "adaptive_over_static_tokens_per_s": over_static,
                       "adaptive_over_static_ci": (
                           {"lo": ci[0], "hi": ci[1], "coverage": ci[2]} if ci else None),
                       "raw": raw}, f,
                      indent=2)


if __name__ == "__main__":
    main()
