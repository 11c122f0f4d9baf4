#!/usr/bin/python3
"""The dashboards and rules against the real thing: spgated scraped by a real Prometheus
while spgate-sim drives a job through the real protocol.

Everything runs on 127.0.0.1 in a temporary directory:
  1. spgated with deploy/k8s/base/gates.textproto (the shipped config), a state dir, an
     admin token and a health port, ports picked by the daemon (port 0);
  2. Prometheus with deploy/prometheus/prometheus.yml (scrape interval cut to 1 s) and
     deploy/prometheus/spgate-rules.yml;
  3. spgatectl shortens the rolling windows (so RS_WAIT, PROBE and the hysteresis happen
     within seconds), then spgate-sim runs a two-group job with bimodal lengths;
  4. while it runs: an operator pin (PINNED), a 1.5 s SIGSTOP of the daemon (the workers'
     deadline passes: local decisions, reported after), a SIGHUP (config reload);
  5. then every panel query of both dashboards (variables substituted as Grafana does:
     All, one job, one group; $__rate_interval = 1m) must return data, every template
     variable must list the job and its groups, every rule must evaluate cleanly and every
     recording rule return data; `promtool check metrics` on a live scrape prints nothing;
     and the traffic must have fired every reason (ADAPTIVE excepted; CONTROLLER_UNAVAILABLE
     counts through spgate_worker_local_decisions_total).
A failure names the dashboard, the panel, the variables and the query.

Usage: live_dashboards_test.py BUILD_DIR [--sim_arg=--flag=value ...] [--duration=40]
       [--allow_missing_reasons=a,b] [--keep]
"""
import argparse
import json
import os
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
GROUPS = ["0", "1"]
CHECK_TIMEOUT_S = 60
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
    fired = {s["metric"]["reason"] for s in prom.Query(
        f'sum by (reason) (spgate_decisions_total{{job_id="{JOB}"}}) > 0')}
    if prom.Query(f'sum(spgate_worker_local_decisions_total{{job_id="{JOB}"}}) > 0'):
        fired.add("controller_unavailable")
    modes = {s["metric"]["mode"] for s in prom.Query(
        f'sum by (mode) (spgate_decisions_total{{job_id="{JOB}"}}) > 0')}
    want = set(contract.REASONS) - {"adaptive"} - set(allowed_missing)
    problems = [f"the traffic never fired reason {r}" for r in sorted(want - fired)]
    problems += [f"the traffic never ran mode {m}" for m in sorted(set(contract.MODES) - modes)]
    return problems, fired


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--sim_arg", action="append", default=[],
                    help="extra spgate-sim flag, e.g. --sim_arg=--tp=4 (repeatable)")
    ap.add_argument("--duration", type=int, default=40, help="simulated run, seconds")
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
    daemon = prom = sim = None
    problems = []
    try:
        daemon = sr.SpgatedProcess(
            bins["spgated"], state_dir=os.path.join(tmp, "state"),
            config=os.path.join(REPO, "deploy", "k8s", "base", "gates.textproto"),
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
        summary = os.path.join(tmp, "summary.json")
        sim_cmd = [bins["spgate-sim"], f"--controller={daemon.worker_address}", f"--job_id={JOB}",
                   f"--groups={len(GROUPS)}", "--tp=2",
                   "--lengths=bimodal:short=512,long=16384,p_long=0.3", "--steps_per_s=20",
                   f"--duration={args.duration}s", "--seed=7", f"--summary_json={summary}",
                   *args.sim_arg]
        Log("starting " + " ".join(sim_cmd))
        sim_log = open(os.path.join(tmp, "sim.log"), "w")
        sim = subprocess.Popen(sim_cmd, stdout=sim_log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
        start = time.monotonic()

        def at(seconds):
            time.sleep(max(0.0, start + seconds - time.monotonic()))
            if sim.poll() is not None:
                raise RuntimeError(f"spgate-sim exited early with {sim.returncode}; see sim.log")

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
        at(min(25, args.duration - 5))

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
            problems.append(f"promtool check metrics on a live scrape (SPEC §7: must be silent):\n{lint}")
        allowed = [r for r in args.allow_missing_reasons.split(",") if r]
        reason_problems, fired = MissingReasons(prom, allowed)
        problems += reason_problems
        Log(f"reasons fired: {sorted(fired)}")

        try:
            rc = sim.wait(timeout=args.duration + 60)
        except subprocess.TimeoutExpired:
            problems.append("spgate-sim did not finish")
            rc = None
        if rc not in (0, None):
            problems.append(f"spgate-sim exited with {rc}")
        if os.path.exists(summary):
            with open(summary) as f:
                s = json.load(f)
            Log(f"sim summary: steps {s.get('steps')}, decisions {s.get('decisions')}, "
                f"local {s.get('local_decisions')}, violations {s.get('consistency_violations')}")
    except (RuntimeError, TimeoutError, OSError) as e:
        problems.append(str(e))
    finally:
        if sim and sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        if daemon and daemon.proc and daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGCONT)
            daemon.kill()
        if prom:
            prom.Stop()
        if problems:
            for name in ("sim.log",):
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
