#!/usr/bin/env python3
"""A 4-rank spgate-worker job (one TP group of 4) under spgated; the daemon is killed
with SIGKILL mid-run. The run must finish, every rank's decision log must be identical
step by step (docs/design.md §4: all ranks of a group run the mode the leader
broadcast), the decisions before the kill come from the daemon and those after it from
the fail-static fallback (reason controller_unavailable), and the summary reports no
consistency violation. With the daemon up, no telemetry is lost. Against a scripted
daemon (fake_gated) that answers TP-only to every plan whose TP-only peak does not fit the
budget, every group runs SP instead (source memory_override), the summary counts it, and
the groups' leaders (each group's one session) registered with the one launch credential
world rank 0 made and broadcast.

Usage: worker_daemon_kill_test.py --worker=BIN --spgated=BIN --mpirun=BIN --fake_gated=BIN
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
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing"))
import proc_util  # noqa: E402

ARGS = None


def start_daemon(spgated, state_dir):
    proc = subprocess.Popen(
        [spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
         "--metrics_listen=127.0.0.1:0", f"--state_dir={state_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"worker API on port (\d+).*metrics on port (\d+)", line)
        if m:
            # Keep draining its log so the daemon never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1)), int(m.group(2))
    proc.kill()
    raise RuntimeError("spgated did not report its port")


data_lines = proc_util.data_lines


ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1")
# A small 4-rank job: 1 layer, hidden 64, a bimodal length mix (both modes).
SMALL_JOB = ["--layers=1", "--hidden=64", "--heads=4", "--ffn_hidden=128",
             "--lengths=bimodal:short=64,long=512,p_long=0.3", "--tokens_per_batch=1024",
             "--decision_deadline=200ms"]


class DaemonTestCase(unittest.TestCase):
    """A spgated on loopback for each test, killed and cleaned up after it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-worker-daemon-")
        self.daemon, self.port, self.metrics_port = start_daemon(ARGS.spgated, self.tmp)

    def tearDown(self):
        if self.daemon.poll() is None:
            self.daemon.kill()
        self.daemon.wait()
        self.daemon.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class DaemonKilledMidRunTest(DaemonTestCase):

    def test_logs_identical_and_run_finishes(self):
        steps = 80
        prefix = os.path.join(self.tmp, "decisions")
        summary = os.path.join(self.tmp, "summary.json")
        env = ENV
        cmd = [ARGS.mpirun, "--oversubscribe", "-np", "4", ARGS.worker, "--tp=4",
               f"--controller=127.0.0.1:{self.port}", "--job_id=kill-test", *SMALL_JOB,
               f"--steps={steps}", f"--decision_log={prefix}", f"--summary_json={summary}"]
        job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        # Kill the daemon once the job is well under way.
        deadline = time.time() + 120
        while len(data_lines(prefix + ".rank0.csv")) < 10:
            self.assertIsNone(job.poll(), "the job ended before the daemon was killed")
            self.assertLess(time.time(), deadline, "the job made no progress")
            time.sleep(0.01)
        killed_at = len(data_lines(prefix + ".rank0.csv"))
        self.daemon.send_signal(signal.SIGKILL)
        self.daemon.wait()
        out, _ = job.communicate(timeout=240)
        self.assertEqual(job.returncode, 0, out)
        self.assertLess(killed_at, steps, "the daemon was not killed mid-run")

        logs = [data_lines(f"{prefix}.rank{r}.csv") for r in range(4)]
        self.assertEqual(len(logs[0]), steps)
        for r in range(1, 4):
            self.assertEqual(logs[r], logs[0], f"rank {r}'s decision log differs from rank 0's")
        rows = [line.split(",") for line in logs[0]]
        self.assertEqual([int(r[0]) for r in rows], list(range(steps)))
        for step, mode, reason, source, stage, micro_batch in rows:
            self.assertEqual((stage, micro_batch), ("0", "0"))  # no pipeline stages here
            self.assertIn(mode, ("sp", "tp_only"))
            self.assertIn(source, ("daemon", "fallback"))
            self.assertEqual(source == "fallback", reason == "controller_unavailable", rows)
        self.assertEqual(rows[0][3], "daemon", "the first decision should be the daemon's")
        # Once the daemon is dead it never answers again. Answers already on the wire when
        # it died (plans go out a step ahead) may still be used for the next couple of
        # steps; from then on every step is the fail-static fallback.
        for step, _, _, source, _, _ in rows[killed_at + 3:]:
            self.assertEqual(source, "fallback", f"step {step} after the kill: {rows}")
        fallbacks = sum(1 for r in rows if r[3] == "fallback")
        first_fallback = next(i for i, r in enumerate(rows) if r[3] == "fallback")
        print(f"daemon killed after {killed_at} logged steps; first fallback at step "
              f"{first_fallback}; {fallbacks} fallback steps", file=sys.stderr)

        with open(summary) as f:
            s = json.load(f)
        self.assertEqual(s["steps"], steps)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["local_decisions"], fallbacks)
        self.assertEqual(sum(n for reasons in s["decisions"].values() for n in reasons.values()),
                         steps)
        # Lost telemetry: records written to the daemon's stream and never acknowledged.
        # The daemon acknowledges what it has received with each heartbeat, so what was
        # written since the last acknowledged heartbeat was in flight when it died. That
        # can only be what went out before the worker saw the stream close: one record per
        # step for the group (its leader's group session; the ranks' values are reduced in
        # the group), for the steps up to the kill plus the few (<= 3, as for the
        # decisions above) run before the stream's end was noticed. Every later record stays
        # in the client's buffer (GateClientOptions::telemetry_buffer = 4096 records, more
        # than the 80 this run makes, so none is dropped either), is never written and
        # so is never lost. A worker that kept "sending" into the dead stream, or counted
        # buffered records as lost, breaks these bounds.
        in_flight_bound = killed_at + 3
        print(f"telemetry: sent {s['telemetry_sent']}, acked {s['telemetry_acked']}, lost "
              f"{s['lost_telemetry']}; in-flight bound {in_flight_bound}", file=sys.stderr)
        self.assertLessEqual(s["telemetry_sent"], in_flight_bound, s)
        self.assertLessEqual(s["lost_telemetry"], in_flight_bound, s)
        self.assertLessEqual(s["lost_telemetry"], s["telemetry_sent"] - s["telemetry_acked"], s)
        # And the records of every step the daemon lived through were written.
        self.assertGreaterEqual(s["telemetry_sent"], killed_at - 3, s)
        self.assertLessEqual(s["telemetry_acked"], s["telemetry_sent"], s)

def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text, name, labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


class LiveDaemonTelemetryTest(DaemonTestCase):
    """With the daemon up for the whole run, no telemetry is lost, and the worker's
    count of it agrees with the daemon's own."""

    def run_job(self, steps, job_id, *flags):
        summary = os.path.join(self.tmp, f"{job_id}.json")
        cmd = [ARGS.mpirun, "--oversubscribe", "-np", "4", ARGS.worker, "--tp=2",
               f"--controller=127.0.0.1:{self.port}", f"--job_id={job_id}", *SMALL_JOB,
               f"--steps={steps}", f"--summary_json={summary}", *flags]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(summary) as f:
            return json.load(f)

    def test_no_telemetry_lost(self):
        steps = 30
        s = self.run_job(steps, "live-telemetry")
        # Two groups (tp=2 of 4 ranks), one record a step each from the leader's group
        # session (the ranks' values reduced in the group), all written and acknowledged.
        self.assertEqual(s["telemetry_sent"], 2 * steps, s)
        self.assertEqual(s["telemetry_acked"], 2 * steps, s)
        self.assertEqual(s["lost_telemetry"], 0, s)
        text = scrape(self.metrics_port)
        self.assertEqual(metric(text, "spgate_telemetry_records_total", {"result": "accepted"}),
                         2 * steps, "the daemon's count of accepted records")
        # The group's slowest rank is named (rank 0 or 1 of its group).
        self.assertIn(metric(text, "spgate_slowest_rank", {"job_id": "live-telemetry", "group": "0"}),
                      (0.0, 1.0))
        # Two TP groups (tp=2 of 4 ranks) decide every step, all from the daemon, and the
        # daemon counted the same decisions.
        decided = sum(n for reasons in s["decisions"].values() for n in reasons.values())
        self.assertEqual(decided, 2 * steps, s["decisions"])
        self.assertEqual(s["local_decisions"], 0, s)
        # Per-rank sessions (--group_session=false): every rank's own record, none lost.
        s = self.run_job(steps, "live-per-rank", "--group_session=false")
        self.assertEqual(s["telemetry_sent"], 4 * steps, s)
        self.assertEqual(s["telemetry_acked"], 4 * steps, s)
        self.assertEqual(s["lost_telemetry"], 0, s)
        text = scrape(self.metrics_port)
        self.assertEqual(metric(text, "spgate_telemetry_records_total", {"result": "accepted"}),
                         6 * steps, "both runs' records")
        daemon_decided = sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("spgate_decisions_total{") and 'job_id="live-telemetry"' in line)
        self.assertEqual(daemon_decided, 2 * steps)


class ScriptedDaemonMemoryTest(unittest.TestCase):
    """fake_gated answers TP-only to every plan, whatever it costs; the worker's budget
    lies between the plans' predicted SP and TP-only peaks."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-worker-memory-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def worker(self, np, *args):
        cmd = [ARGS.mpirun, "--oversubscribe", "-np", str(np), ARGS.worker, "--tp=2",
               "--layers=1", "--hidden=64", "--heads=4", "--ffn_hidden=128",
               # Every batch the same, so are its predicted peaks.
               "--lengths=uniform:min=1024,max=1024", "--tokens_per_batch=4096",
               "--decision_deadline=500ms", *args]
        env = {k: v for k, v in ENV.items() if k != "SPGATE_LAUNCH_CREDENTIAL"}
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def summary(self, name, np, *args):
        path = os.path.join(self.tmp, name + ".json")
        self.worker(np, f"--summary_json={path}", *args)
        with open(path) as f:
            return json.load(f)

    def test_tp_only_answers_that_do_not_fit_run_sp(self):
        predicted = "predicted_peak_memory_bytes"
        sp = self.summary("sp", 2, "--mode=sp", "--steps=2")[predicted]["sp"]
        tp = self.summary("tp", 2, "--mode=tp", "--steps=2")[predicted]["tp_only"]
        self.assertLess(sp, tp)
        budget = int((sp + tp) / 2 / 0.9)  # budget x memory_headroom (0.9) between the two
        fake = subprocess.Popen([ARGS.fake_gated, "--answer=tp_only"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            address = fake.stdout.readline().split()[1]
            steps = 12
            prefix = os.path.join(self.tmp, "decisions")
            s = self.summary("run", 4, f"--controller={address}", "--job_id=memory",
                             f"--memory_budget={budget}", f"--steps={steps}",
                             f"--decision_log={prefix}")
            fake.stdin.write("stats\n")
            fake.stdin.flush()
            stats = fake.stdout.readline().split()
        finally:
            fake.stdin.close()
            fake.wait(timeout=30)
        # Two groups, every step SP: the daemon's TP-only refused by the leaders' memory
        # gate (or, had an answer been late, decided locally by the same gate).
        self.assertEqual(s["consistency_violations"], 0, s)
        self.assertEqual(s["steps_by_mode"], {"sp": 2 * steps, "all": 2 * steps}, s)
        self.assertEqual(s["memory_overrides"] + s["local_decisions"], 2 * steps, s)
        self.assertGreaterEqual(s["memory_overrides"], 2 * steps - 2, s)
        self.assertEqual(s["decision_sources"].get("memory_override", 0), s["memory_overrides"])
        self.assertNotIn("daemon", s["decision_sources"])
        reasons = {"memory_requires_sp": s["memory_overrides"]}
        if s["local_decisions"]:
            reasons["controller_unavailable"] = s["local_decisions"]
        self.assertEqual(s["decisions"], {"sp": reasons}, s)
        for r in range(4):
            rows = [line.split(",") for line in data_lines(f"{prefix}.rank{r}.csv")]
            self.assertEqual(len(rows), steps)
            for step, mode, reason, source, _stage, _micro_batch in rows:
                self.assertEqual(mode, "sp", rows)
                if source == "memory_override":
                    self.assertEqual(reason, "memory_requires_sp", rows)
        # registrations N memory_overrides M streams S credentials C1,...: the two groups'
        # leaders (a group session each; the other ranks do not register).
        self.assertEqual(stats[1], "2", stats)
        credentials = stats[7].split(",")
        self.assertEqual(len(credentials), 2, stats)
        self.assertEqual(len(set(credentials)), 1, "the ranks registered with other credentials")
        self.assertRegex(credentials[0], r"^[0-9a-f]{32}$")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--spgated", required=True)
    parser.add_argument("--mpirun", required=True)
    parser.add_argument("--fake_gated", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
