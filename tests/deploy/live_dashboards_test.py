#!/usr/bin/python3
"""The dashboards and rules against the real thing: spgated scraped by a real Prometheus
while spgate-sim drives a job through the real protocol.

Everything runs on 127.0.0.1 in a temporary directory:
  1. spgated with deploy/k8s/components/sidecar/gates.textproto (the shipped config), a
     state dir, an admin token and a health port, ports picked by the daemon (port 0);
  2. Prometheus with deploy/prometheus/prometheus.yml (scrape interval cut to 1 s) and
     deploy/prometheus/spgate-rules.yml;
  3. spgatectl shortens the rolling windows (so RS_WAIT, PROBE and the hysteresis happen
     within seconds), then two spgate-sim processes run two jobs against it: the
     dashboards' job (two groups, bimodal lengths, bucketed so SP passes the gates, and
     stragglers so the wait-share gate trips and probes), and a memory job (one group,
     unbucketed mixed lengths on a small device, so batches fit TP-only, need SP or fit
     neither: LENGTH_CV, MEMORY_REQUIRES_SP, MEMORY_OVER_BUDGET);
  4. while it runs: an operator pin (PINNED), a 1.5 s SIGSTOP of the daemon (the workers'
     deadline passes: local decisions, reported after), a SIGHUP (config reload);
  5. then every panel query of both dashboards (variables substituted as Grafana does:
     All, one job, one group; $__rate_interval = 1m) must return data, every template
     variable must list the job and its groups, every rule must evaluate cleanly and every
     recording rule return data; `promtool check metrics` on a live scrape prints nothing;
     and the traffic of the two jobs must have fired every reason (ADAPTIVE excepted;
     CONTROLLER_UNAVAILABLE counts through spgate_worker_local_decisions_total).
A failure names the dashboard, the panel, the variables and the query.

Usage: live_dashboards_test.py BUILD_DIR [--sim_arg=--flag=value ...] [--duration=30]
       [--allow_missing_reasons=a,b] [--keep]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools", "demo"))
import promlive  # noqa: E402
import spgate_contract as contract  # noqa: E402
import spgate_reflect as sr  # noqa: E402  (starts spgated on port 0, reads its ports)
import yaml  # noqa: E402

JOB = "live-dash"
MEMORY_JOB = "live-dash-memory"
# spgate-sim's cost model (docs/sim.md) at t = 2 and the default 8 layers of h = 5120:
# 20.1 GB of weights and optimizer state, 0.90 MB a token under TP-only, 0.70 MB under SP.
# With 31 GiB x 0.9 TP-only fits up to ~10,900 tokens and SP up to ~14,100, and unbucketed
# uniform 1,000..12,000 lengths packed into 16,384 tokens give batches on all three sides
# (in 600 steps of `spgate-sim replay`: ~160 fit and pass or trip LENGTH_CV (~40), ~230
# need SP, ~170 fit neither).
SIM_FLAGS = {
    JOB: ["--groups=2", "--tp=2", "--lengths=bimodal:short=512,long=16384,p_long=0.3",
          "--straggler_prob=0.3", "--straggler_slowdown=0.6"],
    MEMORY_JOB: ["--groups=1", "--tp=2", "--lengths=uniform:min=1000,max=12000",
                 "--bucketing=false", "--tokens_per_batch=16384", "--device_memory_gib=31"],
}
GROUPS = ["0", "1"]
CHECK_TIMEOUT_S = 45
TOKEN = "live-dashboards-test-token"


def Log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def PrometheusConfig(metrics_port):
    with open(os.path.join(REPO, "deploy", "prometheus", "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [promlive.RULES_FILE]
    jobs = [j for j in config["scrape_configs"] if j["job_name"] == contract.SCRAPE_JOB]
    assert len(jobs) == 1, "prometheus.yml must have one job named spgated"
    jobs[0]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    return config


def MissingReasons(prom, allowed_missing):
    jobs = f'job_id=~"{JOB}|{MEMORY_JOB}"'
    fired = {s["metric"]["reason"] for s in prom.Query(
        f'sum by (reason) (spgate_decisions_total{{{jobs}}}) > 0')}
    if prom.Query(f'sum(spgate_worker_local_decisions_total{{{jobs}}}) > 0'):
        fired.add("controller_unavailable")
    modes = {s["metric"]["mode"] for s in prom.Query(
        f'sum by (mode) (spgate_decisions_total{{{jobs}}}) > 0')}
    # LENGTHS_UNKNOWN and SP_REQUIRED come only from pipelined jobs (step plans) and jobs
    # that declare SP-only features; spgate-sim's live mode drives neither
    # (its pipeline cells are replay-only), so their counters are checked by tests/server/gate_state_pipeline_test.cc.
    want = (set(contract.REASONS) - {"adaptive", "lengths_unknown", "sp_required"} -
            set(allowed_missing))
    problems = [f"the traffic never fired reason {r}" for r in sorted(want - fired)]
    problems += [f"the traffic never ran mode {m}" for m in sorted(set(contract.MODES) - modes)]
    return problems, fired


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--sim_arg", action="append", default=[],
                    help="extra flag for both spgate-sim runs, e.g. --sim_arg=--seed=3 (repeatable)")
    ap.add_argument("--duration", type=int, default=30, help="simulated run, seconds (>= 20)")
    ap.add_argument("--allow_missing_reasons", default="",
                    help="comma-separated reasons the traffic may leave out")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    bins = {b: os.path.join(args.build_dir, "bin", b) for b in ("spgated", "spgate-sim", "spgatectl")}
    missing = [p for p in bins.values() if not os.access(p, os.X_OK)]
    if missing:
        print(f"SKIP: not built: {missing}")
        return 77

    tmp = tempfile.mkdtemp(prefix="spgate-live-dash-")
    token_file = os.path.join(tmp, "admin-token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    daemon = prom = None
    sims = {}  # job -> Popen
    problems = []
    try:
        daemon = sr.SpgatedProcess(
            bins["spgated"], state_dir=os.path.join(tmp, "state"),
            config=os.path.join(REPO, "deploy", "k8s", "components", "sidecar", "gates.textproto"),
            extra_args=[f"--admin_token_file={token_file}", "--health_listen=127.0.0.1:0",
                        "--stale_after=3s"]).start()
        Log(f"spgated: worker {daemon.worker_address}, admin {daemon.admin_address}, "
            f"metrics 127.0.0.1:{daemon.metrics_port}")
        prom = promlive.Prometheus(tmp, PrometheusConfig(daemon.metrics_port)).Start()
        promlive.WaitFor("Prometheus's first scrape of spgated",
                         lambda: promlive.ScrapedOnce(prom, contract.SCRAPE_JOB), 30)

        def ctl(*argv):
            r = subprocess.run([bins["spgatectl"], f"--admin={daemon.admin_address}",
                                f"--token_file={token_file}", *argv],
                               capture_output=True, text=True, timeout=30)
            Log(f"spgatectl {' '.join(argv)} -> {r.returncode}")
            if r.returncode != 0:
                problems.append(f"spgatectl {' '.join(argv)} failed: {r.stdout}{r.stderr}")
            return r

        # Short windows so the RS_WAIT fallback, its probes and recovery fit in the run.
        ctl("gates", "set", "--window_steps=5", "--probe_interval_steps=10", "--min_dwell_steps=2")
        for job, flags in SIM_FLAGS.items():
            sim_cmd = [bins["spgate-sim"], f"--controller={daemon.worker_address}",
                       f"--job_id={job}", *flags, "--steps_per_s=20",
                       f"--duration={args.duration}s", "--seed=7",
                       f"--summary_json={os.path.join(tmp, job + '.summary.json')}",
                       *args.sim_arg]
            Log("starting " + " ".join(sim_cmd))
            with open(os.path.join(tmp, job + ".sim.log"), "w") as sim_log:
                sims[job] = subprocess.Popen(sim_cmd, stdout=sim_log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        start = time.monotonic()

        def at(seconds):
            time.sleep(max(0.0, start + seconds - time.monotonic()))
            for job, sim in sims.items():
                if sim.poll() is not None:
                    raise RuntimeError(f"spgate-sim for {job} exited early with "
                                       f"{sim.returncode}; see {job}.sim.log")

        at(4)
        ctl("gates", "set", f"--job_id={JOB}", "--max_length_cv=0.18")  # a per-job override
        ctl("pin", JOB, "--group=1", "--mode=tp", "--for=4s")
        at(9)
        Log("SIGSTOP spgated for 1.5 s: the workers' step deadline passes")
        daemon.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        daemon.proc.send_signal(signal.SIGCONT)
        at(13)
        Log("SIGHUP spgated: reload --config")
        daemon.proc.send_signal(signal.SIGHUP)
        at(min(20, args.duration - 5))

        Log("checking every panel, variable and rule (the sim is still running)")
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while True:
            pending = (promlive.EmptyPanels(prom, JOB, GROUPS)
                       + promlive.EmptyVariables(prom, JOB, GROUPS)
                       + promlive.RuleProblems(prom))
            if not pending or time.monotonic() > deadline or any(
                    "query error" in p or "evaluation error" in p for p in pending):
                break
            time.sleep(2)
        problems += pending
        text = urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics",
                                      timeout=5).read().decode()
        lint = promlive.PromtoolCheckMetrics(text)
        if lint:
            problems.append(f"promtool check metrics on a live scrape (docs/design.md §7: must be silent):\n{lint}")
        # The daemon exports a threshold for every field of SPGATE_GATE_FIELDS but the policy
        # (what spgate_contract.GATES derives from the table), and nothing else.
        live_gates = set(re.findall(
            r'^spgate_gate_threshold\{[^}]*job_id="' + re.escape(contract.GLOBAL_JOB_ID)
            + r'"[^}]*gate="(\w+)"', text, re.M) + re.findall(
            r'^spgate_gate_threshold\{[^}]*gate="(\w+)"[^}]*job_id="'
            + re.escape(contract.GLOBAL_JOB_ID) + r'"', text, re.M))
        if live_gates != set(contract.GATES):
            problems.append(f"spgated's global spgate_gate_threshold gates {sorted(live_gates)} "
                            f"are not policy/gate_config.h's thresholds {sorted(contract.GATES)}")
        allowed = [r for r in args.allow_missing_reasons.split(",") if r]
        reason_problems, fired = MissingReasons(prom, allowed)
        problems += reason_problems
        Log(f"reasons fired: {sorted(fired)}")

        for job, sim in sims.items():
            try:
                rc = sim.wait(timeout=max(5, start + args.duration + 30 - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"spgate-sim for {job} did not finish")
                rc = None
            if rc not in (0, None):
                problems.append(f"spgate-sim for {job} exited with {rc}")
            summary = os.path.join(tmp, job + ".summary.json")
            if os.path.exists(summary):
                with open(summary) as f:
                    s = json.load(f)
                Log(f"{job} summary: steps {s.get('steps')}, decisions {s.get('decisions')}, "
                    f"local {s.get('local_decisions')}, "
                    f"violations {s.get('consistency_violations')}")
    except (RuntimeError, TimeoutError, OSError) as e:
        problems.append(str(e))
    finally:
        for sim in sims.values():
            if sim.poll() is None:
                sim.kill()
                sim.wait(timeout=10)
        if daemon and daemon.proc and daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGCONT)
            daemon.kill()
        if prom:
            prom.Stop()
        if problems:
            for name in (f"{job}.sim.log" for job in SIM_FLAGS):
                path = os.path.join(tmp, name)
                if os.path.exists(path):
                    with open(path) as f:
                        print(f"--- {name} (tail) ---\n" + "".join(f.readlines()[-30:]))
            if daemon:
                print("--- spgated stderr (tail) ---\n" + daemon.stderr_text[-3000:])
            if prom:
                print("--- prometheus log (tail) ---\n" + prom.LogTail())
        if args.keep:
            Log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if problems:
        print(f"FAIL: {len(problems)} problem(s)")
        for p in problems:
            print("  " + p)
        return 1
    print("PASS: every panel, variable and rule returned data from spgated under spgate-sim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
