#!/usr/bin/env python3
"""Driver of bench/replay_table.sh: runs spgate-worker under mpirun once per row and
round, reads each run's --summary_json, and prints the table of docs/design.md §1 with
every figure relative to the pure-TP row of the same round set.

Every row sees the same length stream (--seed, --lengths): rows without bucketing pack
it in arrival order, rows with bucketing regroup it with bucket_by_tokens, so they run
the same sequences in different batches.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading

COMMON = ["--tp=4", "--layers=2", "--hidden=64", "--heads=4", "--ffn_hidden=256",
          "--lengths=lognormal:mean=384,sigma=1.0", "--tokens_per_batch=2048", "--seed=11",
          # 128-row score blocks: attention scratch stays small next to the activations,
          # as with a fused (flash) kernel, so peak memory shows what SP changes.
          "--attention_query_block=128"]

ADAPTIVE_SP_MEMORY = "spgate adaptive, memory budget at SP's peak"
# The gate lets a mode use this share of the budget; set on that row's job explicitly, so
# a daemon default elsewhere cannot change what the budget means.
MEMORY_HEADROOM = 0.90

ROWS = [
    ("pure TP", ["--mode=tp", "--bucketing=false"]),
    ("SP always (gather LN, no bucketing)", ["--mode=sp", "--norm_boundary=gather",
                                             "--bucketing=false"]),
    ("SP + bucketing", ["--mode=sp", "--norm_boundary=gather", "--bucketing=true"]),
    ("SP + bucketing + LayerNorm kept in shard", ["--mode=sp", "--norm_boundary=shard",
                                                  "--bucketing=true"]),
    ("spgate auto", ["--mode=auto", "--norm_boundary=shard", "--bucketing=true"]),
    ("spgate adaptive", ["--mode=auto", "--norm_boundary=shard", "--bucketing=true"]),
    # The same, with the memory gate's budget where SP's largest step just fits: TP-only
    # runs (learned, probe or prior) only on batches small enough that it needs no more
    # than that. The budget comes from a sizing run before the rounds (SP_BUDGET_ROW).
    (ADAPTIVE_SP_MEMORY, ["--mode=auto", "--norm_boundary=shard", "--bucketing=true"]),
]
ADAPTIVE_ROWS = ("spgate adaptive", ADAPTIVE_SP_MEMORY)
SP_BUDGET_ROW = "SP + bucketing + LayerNorm kept in shard"
# The ADAPTIVE rows' job config, set on the daemon (spgatectl gates set --job_id=...)
# before their runs: the policy alone, every ADAPTIVE setting at its default (what a job
# that sets policy ADAPTIVE gets). --adaptive_flags adds gate flags (e.g.
# "--adaptive_min_samples=2 --adaptive_explore_share=0.15" to watch a short run learn);
# the report then names them, since the rows are no longer ADAPTIVE as shipped.
ADAPTIVE_FLAGS = ["--policy=adaptive"]


def start_daemon(build, state_dir):
    proc = subprocess.Popen(
        [os.path.join(build, "bin", "spgated"), "--listen=127.0.0.1:0",
         "--admin_listen=127.0.0.1:0", "--metrics_listen=", f"--state_dir={state_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"worker API on port (\d+), admin API on port (\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1)), int(m.group(2))
    proc.kill()
    sys.exit("replay_table: spgated did not start")


def median_ci(values):
    """The median of `values` and a distribution-free confidence interval for it: the
    order statistics x(k), x(n+1-k) with the largest k whose binomial coverage is at
    least 95 % (for 12 values: x(3) and x(10), 96 %). None when n < 6 (no k qualifies)."""
    xs = sorted(values)
    n = len(xs)
    best = None
    for k in range(1, n // 2 + 1):
        # P(x(k) <= median <= x(n+1-k)) = 1 - 2 * P(Binomial(n, 1/2) < k)
        tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if 1 - 2 * tail >= 0.95:
            best = (xs[k - 1], xs[n - k], 1 - 2 * tail)
    return statistics.median(xs), best


def tie_verdict(ci, band=0.03):
    """What a paired ratio's interval shows against 1 +- band: a tie (inside the band), apart
    (outside it), slower or faster (on one side of 1, not clear of the band), or not
    separated (it spans 1 and leaves the band)."""
    if ci is None:
        return "too few rounds"
    lo, hi, _ = ci
    if lo >= 1 - band and hi <= 1 + band:
        return f"tie (within +-{band:.0%})"
    if hi < 1 - band or lo > 1 + band:
        return f"apart (by more than {band:.0%})"
    if hi < 1:
        return "slower (not shown to be by more than %.0f%%)" % (100 * band)
    if lo > 1:
        return "faster (not shown to be by more than %.0f%%)" % (100 * band)
    return "not separated"


def build_table(results):
    """The table's rows, in ROWS order, from results[name][round] (each run's summary
    JSON). Rounds pair across rows by index: every row ran once per round."""
    # Two estimators per row: the median over rounds (what a run here typically sees,
    # other tenants of the machine included) and the best round (highest tokens/s,
    # lowest p95: interference only ever slows a run down, so the best round is the
    # closest to what the configuration itself costs).
    def stats(name, key, best):
        vals = [s[key]["all"] for s in results[name]]
        return statistics.median(vals), best(vals), vals

    base = ROWS[0][0]
    base_peak = max(s["peak_memory_bytes"]["all"] for s in results[base])
    base_tps, base_tps_best, _ = stats(base, "effective_tokens_per_s", max)
    base_p95, base_p95_best, _ = stats(base, "step_time_p95_s", min)
    base_all = [s["effective_tokens_per_s"]["all"] for s in results[base]]
    table = []
    for name, _ in ROWS:
        runs = results[name]
        peak = max(s["peak_memory_bytes"]["all"] for s in runs)
        tps, tps_best, tps_all = stats(name, "effective_tokens_per_s", max)
        p95, p95_best, p95_all = stats(name, "step_time_p95_s", min)
        paired, ci = median_ci([x / b for x, b in zip(tps_all, base_all)])
        modes = {}
        for s in runs:
            for mode, reasons in s["decisions"].items():
                for reason, n in reasons.items():
                    key = f"{mode}/{reason}"
                    modes[key] = modes.get(key, 0) + n
        table.append({
            "configuration": name,
            "peak_memory_bytes": peak,
            "effective_tokens_per_s": tps,
            "effective_tokens_per_s_best": tps_best,
            "step_time_p95_s": p95,
            "step_time_p95_s_best": p95_best,
            "peak_memory_rel": peak / base_peak,
            "effective_tokens_per_s_rel": tps / base_tps,
            "effective_tokens_per_s_best_rel": tps_best / base_tps_best,
            "step_time_p95_rel": p95 / base_p95,
            "step_time_p95_best_rel": p95_best / base_p95_best,
            "rs_wait_share_mean": statistics.median(s["rs_wait_share_mean"] for s in runs),
            "norm_stall_ratio_mean": statistics.median(s["norm_stall_ratio_mean"] for s in runs),
            "mean_length_cv": statistics.median(s["mean_length_cv"]["all"] for s in runs),
            "decisions": modes,
            "tokens_per_s_by_round": tps_all,
            # Paired by round (this row over pure TP in the same round, rows rotated), so
            # load that moves a whole round cancels; median and its 95 % interval.
            "tokens_per_s_paired_ratio": paired,
            "tokens_per_s_paired_ratio_ci": ci,
            "tokens_per_s_vs_pure_tp": tie_verdict(ci),
            "step_time_p95_s_by_round": p95_all,
        })
    return table


def report_lines(table):
    """The paired-ratio table and the worker targets, as markdown lines."""
    lines = ["", "Tokens/s paired by round (each row over pure TP in the same round): median, "
             "then its distribution-free 95 % interval.", "",
             "| configuration | paired ratio to pure TP | 95 % interval | vs pure TP |",
             "|---|---:|---|---|"]
    for row in table[1:]:
        ci = row["tokens_per_s_paired_ratio_ci"]
        interval = f"[{ci[0]:.3f}x, {ci[1]:.3f}x] ({ci[2]:.0%})" if ci else "-"
        lines.append(f"| {row['configuration']} | {row['tokens_per_s_paired_ratio']:.3f}x | "
                     f"{interval} | {row['tokens_per_s_vs_pure_tp']} |")
    # The worker targets: ADAPTIVE's median tokens/s at least 0.97x the best static row's;
    # and, where its SP mode (bucketing, LayerNorm in the shard) ties pure TP on
    # throughput, its peak at most 0.75x pure TP's.
    by_name = {row["configuration"]: row for row in table}
    adaptive = by_name["spgate adaptive"]
    static_rows = [r for r in table if r["configuration"] not in ADAPTIVE_ROWS]
    best = max(static_rows, key=lambda r: r["effective_tokens_per_s"])
    sp_mode = by_name[SP_BUDGET_ROW]
    verdict = sp_mode["tokens_per_s_vs_pure_tp"]
    ratio = adaptive["effective_tokens_per_s"] / best["effective_tokens_per_s"]
    lines += ["", f"Targets: ADAPTIVE's median tokens/s is {ratio:.2f}x the best static row's "
              f"({best['configuration']}): {'met' if ratio >= 0.97 else 'MISSED'} (>= 0.97x). "
              f"Its SP mode (bucketing, LayerNorm in the shard) against pure TP: {verdict}. "
              f"Peak {adaptive['peak_memory_rel']:.2f}x pure TP's: "
              f"{'met' if adaptive['peak_memory_rel'] <= 0.75 else 'MISSED'} (<= 0.75x), "
              + ("and the modes tie, so the target applies." if verdict.startswith("tie") else
                 "a target that applies where the modes tie, which this run does not show.")]
    # ADAPTIVE against the rule it replaces (spgate auto, STATIC), paired by round.
    static = by_name["spgate auto"]
    over = [x / b for x, b in zip(adaptive["tokens_per_s_by_round"],
                                  static["tokens_per_s_by_round"])]
    med, ci = median_ci(over)
    interval = f", 95 % interval [{ci[0]:.3f}x, {ci[1]:.3f}x]" if ci else ""
    lines.append(f"ADAPTIVE over the static gates (spgate auto), tokens/s paired by round: "
                 f"median {med:.3f}x{interval}, range {min(over):.3f}x-{max(over):.3f}x.")
    capped = by_name[ADAPTIVE_SP_MEMORY]
    lines.append(f"With the memory budget at SP's peak: peak {capped['peak_memory_rel']:.2f}x "
                 f"pure TP's, median tokens/s "
                 f"{capped['effective_tokens_per_s'] / best['effective_tokens_per_s']:.2f}x the "
                 f"best static row's and "
                 f"{capped['effective_tokens_per_s'] / sp_mode['effective_tokens_per_s']:.2f}x "
                 f"SP's with the same memory ({SP_BUDGET_ROW}).")
    return lines


def load_average():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--extra", default="")
    ap.add_argument("--adaptive_flags", default="",
                    help="extra gate flags for the ADAPTIVE rows' jobs (named in the report)")
    a = ap.parse_args()
    adaptive_flags = ADAPTIVE_FLAGS + shlex.split(a.adaptive_flags)
    worker = os.path.join(a.build, "bin", "spgate-worker")
    if not os.access(worker, os.X_OK):
        sys.exit(f"replay_table: {worker} not found; build first")
    os.makedirs(a.out, exist_ok=True)
    runs_dir = os.path.join(a.out, "replay_runs")
    os.makedirs(runs_dir, exist_ok=True)
    common = COMMON + [f"--steps={a.steps}"] + shlex.split(a.extra)

    with tempfile.TemporaryDirectory(prefix="spgate-replay-") as tmp:
        daemon, port, admin_port = start_daemon(a.build, tmp)
        spgatectl = os.path.join(a.build, "bin", "spgatectl")
        results = {name: [] for name, _ in ROWS}
        commands = {}
        load_before = load_average()

        def run(name, flags, extra, summary):
            cmd = [a.mpirun, "--oversubscribe", "-np", "4", worker] + common + flags + \
                extra + [f"--summary_json={summary}"]
            # The command without the per-run parts (controller, job id, summary path).
            commands[name] = " ".join(shlex.quote(c) for c in cmd[:5] + common + flags + extra[2:])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"replay_table: {name} failed:\n{r.stdout}\n{r.stderr}")
            with open(summary) as f:
                return json.load(f)

        try:
            # Sizing: SP's largest step on this stream as the worker predicts it (the
            # figure the memory gate compares with the budget), then the budget at which
            # the gate lets a mode use exactly that much.
            print("[sizing] " + SP_BUDGET_ROW, file=sys.stderr, flush=True)
            sizing = run("sizing", dict(ROWS)[SP_BUDGET_ROW],
                         [f"--controller=127.0.0.1:{port}", "--job_id=replay-sizing"],
                         os.path.join(runs_dir, "sizing.json"))
            sp_peak = sizing["predicted_peak_memory_bytes"]["sp"]
            sp_budget = math.ceil(sp_peak / MEMORY_HEADROOM)
            for rnd in range(a.rounds):
                order = ROWS[rnd % len(ROWS):] + ROWS[:rnd % len(ROWS)]
                for name, flags in order:
                    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
                    summary = os.path.join(runs_dir, f"{slug}.round{rnd}.json")
                    # Every row talks to the daemon (forced rows only report telemetry),
                    # so every row's ranks have the same threads: with 4 ranks on fewer
                    # cores, the client's timer wake-ups change how fast a rank spinning
                    # in MPI gives its core back, worth up to 2x in step time here.
                    job = f"replay-{slug}-{rnd}"
                    extra = [f"--controller=127.0.0.1:{port}", f"--job_id={job}"]
                    if name == ADAPTIVE_SP_MEMORY:
                        extra.append(f"--memory_budget={sp_budget}")
                    if name in ADAPTIVE_ROWS:
                        job_flags = adaptive_flags + (
                            [f"--memory_headroom={MEMORY_HEADROOM}"]
                            if name == ADAPTIVE_SP_MEMORY else [])
                        subprocess.run([spgatectl, f"--admin=127.0.0.1:{admin_port}", "gates",
                                        "set", f"--job_id={job}"] + job_flags,
                                       check=True, capture_output=True, timeout=30)
                    print(f"[round {rnd + 1}/{a.rounds}] {name}", file=sys.stderr, flush=True)
                    results[name].append(run(name, flags, extra, summary))
        finally:
            daemon.terminate()
            daemon.wait()
        load_after = load_average()

    table = build_table(results)
    lines = [
        f"spgate-worker replay: 4 ranks (tp=4), CPU backend, {a.steps} steps x {a.rounds} "
        f"rounds per row, rows rotated each round; relative to pure TP. Median over rounds, "
        f"then [best round] (max tokens/s, min p95).",
        f"{' '.join(COMMON)}",
        f"ADAPTIVE rows' job config: {' '.join(adaptive_flags)}"
        + ("" if not a.adaptive_flags.strip() else " (not ADAPTIVE's defaults)"),
        f"host {platform.node()}, {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.1f} before / {load_after[0]:.1f} after",
        "",
        "| configuration | peak memory | effective tokens/s | step time p95 | "
        "rs_wait share | norm stall | batch CV | decisions |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in table:
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(row["decisions"].items()))
        lines.append(
            f"| {row['configuration']} | {row['peak_memory_rel']:.2f}x "
            f"({row['peak_memory_bytes'] / 2**20:.1f} MiB) | "
            f"{row['effective_tokens_per_s_rel']:.2f}x [{row['effective_tokens_per_s_best_rel']:.2f}x] "
            f"({row['effective_tokens_per_s']:.0f}) | "
            f"{row['step_time_p95_rel']:.2f}x [{row['step_time_p95_best_rel']:.2f}x] "
            f"({1e3 * row['step_time_p95_s']:.0f} ms) | "
            f"{row['rs_wait_share_mean']:.2f} | {row['norm_stall_ratio_mean']:.2f} | "
            f"{row['mean_length_cv']:.2f} | {decisions} |")
    lines += report_lines(table)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(a.out, "replay_table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "replay_table.json"), "w") as f:
        json.dump({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                   "common_flags": COMMON, "adaptive_job_flags": adaptive_flags,
                   "steps": a.steps, "rounds": a.rounds, "sp_peak_bytes": sp_peak,
                   "sp_memory_budget": sp_budget,
                   "load_average": [load_before, load_after], "commands": commands,
                   "rows": table}, f, indent=2)


if __name__ == "__main__":
    main()
