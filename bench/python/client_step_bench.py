#!/usr/bin/env python3
"""Per-step cost of spgate's Python path on the training thread, against the C++
client's, measured in the same run on the same daemon (target: the Python Client path -
plan + decide + report - costs <= 30 us median on top of the C++ path; the GroupDecider
variant adds a torch.distributed broadcast and is reported, not held to that target).

Each variant runs bench/client/client_step_bench.cc's loop - SubmitPlan(n + 1) +
AwaitDecision(n) with the daemon's decision already there + ReportTelemetry(n), each call
timed - then, untimed, "runs the step" (a sleep of --step_us) and waits until decision
n + 1 has arrived, so the figure is the client's cost, not the daemon's latency:
  cxx             the C++ loop (spgate._spgate._cxx_step_loop) on a spgate.Client: the
                  baseline, GateClient's own cost;
  python          the same loop in Python: client.submit_plan(n + 1, lengths),
                  client.await_decision(n), client.report_telemetry(StepTelemetry(...));
  python_decider  as python, deciding through spgate.torch.GroupDecider over a 1-rank
                  gloo group (the torch.distributed broadcast of the 24 bytes included).
Each variant has its own client and job on one spgated (127.0.0.1, port 0).

    PYTHONPATH=build/python python3 bench/python/client_step_bench.py \
        --spgated=build/bin/spgated --steps=3000 --step_us=1000 --out=out/python_step
writes out/python_step.json and .md.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

import spgate  # noqa: E402
from spgate import _spgate  # noqa: E402
from daemon_util import Daemon  # noqa: E402


def quantile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def batch(n):
    import random
    rng = random.Random(1)
    return [min(32768, max(16, int(rng.lognormvariate(8.318 - 0.32, 0.8)))) for _ in range(n)]


def python_loop(client, decide, submit, warmup, steps, lengths, step_us):
    Tel, perf = spgate.StepTelemetry, time.perf_counter_ns
    out = {"submit_ns": [], "await_ns": [], "report_ns": [], "not_from_daemon": 0}
    # Every plan gets one answer, in step order: a decision, a late one (after the fallback
    # decided the step) or a refusal. Counting decisions alone would stay one short for good
    # after one late or refused plan, and every later step would wait out its second.
    def answered():
        s = client.stats()
        return s.decisions_received + s.late_decisions + s.plans_rejected

    base = answered()

    def ready(i):
        if step_us > 0:
            time.sleep(step_us / 1e6)
        give_up = time.monotonic() + 1
        while answered() < base + i + 1 and time.monotonic() < give_up:
            time.sleep(0)

    submit(0, lengths)
    ready(0)
    for n in range(warmup + steps):
        t0 = perf()
        submit(n + 1, lengths)
        t1 = perf()
        d = decide(n)
        t2 = perf()
        client.report_telemetry(Tel(step=n, mode=d.mode, reason=d.reason, step_time_s=0.1,
                                    rs_wait_s=0.004, all_gather_s=0.003,
                                    effective_tokens=sum(lengths), peak_memory_bytes=40 << 30))
        t3 = perf()
        if n >= warmup:
            out["submit_ns"].append(t1 - t0)
            out["await_ns"].append(t2 - t1)
            out["report_ns"].append(t3 - t2)
            if d.source != spgate.DecisionSource.DAEMON:
                out["not_from_daemon"] += 1
        ready(n + 1)
    return out


def run_variant(name, daemon, args, lengths):
    client = spgate.Client(controller=daemon.address, job_id=f"bench-{name}",
                           incarnation=f"bench-{name}-{os.getpid()}",
                           launch_credential=spgate.new_launch_credential())
    client.wait_until_connected(10)
    if name == "cxx":
        r = _spgate._cxx_step_loop(client, 0, args.warmup, args.steps, lengths, args.step_us)
    elif name == "python":
        r = python_loop(client, client.await_decision, client.submit_plan, args.warmup,
                        args.steps, lengths, args.step_us)
    else:
        from spgate.torch import GroupDecider
        decider = GroupDecider(client, None)
        r = python_loop(client, decider.decide, decider.submit_plan, args.warmup, args.steps,
                        lengths, args.step_us)
    client.flush(10)
    client.close()
    r["step_ns"] = [a + b + c for a, b, c in zip(r["submit_ns"], r["await_ns"], r["report_ns"])]
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spgated", default=os.path.join(HERE, "..", "..", "build", "bin", "spgated"))
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--step_us", type=int, default=1000)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--out", default="", help="PREFIX: writes PREFIX.json and PREFIX.md")
    args = p.parse_args()

    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # One rank: its group meets at an in-process store (no port to pick and lose).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    lengths = batch(args.sequences)
    # The client's path, not the daemon's limits: a hot loop asks for more plans a second
    # than --max_plans_per_second's default, and a refused plan would time the fallback.
    daemon = Daemon(args.spgated,
                    extra_args=("--max_plans_per_second=0", "--max_telemetry_per_second=0"))
    results = {}
    try:
        for name in ("cxx", "python", "python_decider"):
            results[name] = run_variant(name, daemon, args, lengths)
    finally:
        daemon.stop()
        dist.destroy_process_group()

    base = statistics.median(results["cxx"]["step_ns"])
    rows, summary = [], {}
    for name, r in results.items():
        med = statistics.median(r["step_ns"])
        summary[name] = {
            "median_ns": med, "p99_ns": quantile(r["step_ns"], 0.99),
            "p999_ns": quantile(r["step_ns"], 0.999),
            "submit_p50_ns": statistics.median(r["submit_ns"]),
            "await_p50_ns": statistics.median(r["await_ns"]),
            "report_p50_ns": statistics.median(r["report_ns"]),
            "over_cxx_median_ns": med - base, "x_cxx": med / base,
            "not_from_daemon": r["not_from_daemon"], "steps": len(r["step_ns"])}
        s = summary[name]
        rows.append(f"| {name} | {s['median_ns']:,.0f} | {s['p99_ns']:,.0f} | {s['p999_ns']:,.0f} | "
                    f"{s['submit_p50_ns']:,.0f} | {s['await_p50_ns']:,.0f} | "
                    f"{s['report_p50_ns']:,.0f} | {s['over_cxx_median_ns']:+,.0f} | "
                    f"{s['x_cxx']:.2f} | {s['not_from_daemon']} |")
    md = "\n".join([
        f"step_us={args.step_us}, {args.steps} steps after {args.warmup} warm-up, "
        f"{args.sequences} sequences per plan",
        "",
        "| variant | median ns | p99 ns | p99.9 ns | submit p50 | await p50 | report p50 | "
        "median over cxx ns | x cxx | not from daemon |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows])
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".json", "w") as f:
            json.dump({"args": vars(args), "results": summary}, f, indent=2)
        with open(args.out + ".md", "w") as f:
            f.write(md + "\n")
    over = summary["python"]["over_cxx_median_ns"]
    print(f"\npython path: {over / 1000:+.1f} us median over the C++ path (target <= 30 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
