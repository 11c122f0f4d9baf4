#!/usr/bin/env python3
"""Fault campaign: a real spgated on loopback is killed, frozen, denied its state dir and
killed again in the middle of config writes while a 4-rank spgate-worker job (mpirun,
2 TP groups of 2) and a 1,024-rank spgate-sim job (128 TP groups of 8) train against it
(docs/reliability.md, "Fault campaign"; docs/design.md §4 and §5).

Faults, in this order, all while both jobs run:
  kill     SIGKILL, a pause, and a restart on the same ports with the same --state_dir;
  freeze   SIGSTOP for longer than the decision deadline, then SIGCONT;
  readonly the state dir made unwritable (`chattr +i`, which holds for root too; where
           chattr is refused, the directory is swapped for a plain file, and a non-root
           run uses chmod 0500) during `spgatectl gates set`;
  writes   `spgatectl gates set` over and over on the worker job's scope, SIGKILL at a
           random moment inside a random share of them, and a restart.

What must hold (each one an assertion below):
  - no step waited for its decision longer than the deadline (+ a stated scheduling
    tolerance): the leaders' wait as the worker and the simulator report it;
  - every group's ranks ran the same decisions: the worker's per-rank decision logs are
    identical, and neither summary counts a consistency violation;
  - after every restart all ranks are registered again within --reconnect_bound;
  - local decisions are counted and reported after reconnect, once: the daemon's
    spgate_worker_local_decisions_total for the job, summed over its lives (scraped
    before each kill, and at the end), equals the job's own count within a few (a
    heartbeat counted in the instant between the scrape and the kill is missed, one
    unanswered at the kill is counted again by the next life; docs/client.md);
  - lost telemetry is counted exactly: every record the ranks produced is acknowledged
    or counted lost (reported = acknowledged + lost), nothing is dropped, and with the
    daemon alive no record is lost;
  - a refused write (state dir unwritable) is UNAVAILABLE, changes nothing, leaves no
    line in the audit log and is counted in spgate_state_persist_failures_total;
  - the state file parses (protoc, against the real PersistedState schema) after every
    kill, the restarted daemon loads it, and the restored config is the last
    acknowledged write (or the one in flight at the kill, which may have been persisted
    before its reply was lost, never anything else).

Usage: fault_campaign.py --spgated=BIN --spgatectl=BIN --worker=BIN --sim=BIN
         --mpirun=BIN [--profile=short|long] [--report=FILE.json] [--seed=N]
The short profile is the ctest (label integration); bench/faults.sh runs the long one.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "testing"))
import proc_util  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools", "demo"))
import spgate_reflect as sr  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")

PROFILES = {
    # ~60-75 s on a 2-core machine; ~10 kills in all.
    "short": dict(duration_s=55, kills=1, freezes=1, freeze_s=1.0, readonly_writes=2,
                  writes=60, kill_share=0.12, sim_groups=128, sim_tp=8, sim_steps_per_s=2),
    # bench/faults.sh: >= 1,000 config writes, ~100 kills inside them.
    "long": dict(duration_s=600, kills=5, freezes=5, freeze_s=2.0, readonly_writes=20,
                 writes=1000, kill_share=0.1, sim_groups=128, sim_tp=8, sim_steps_per_s=2),
}
WORKER_JOB = "faults-worker"
SIM_JOB = "faults-sim"
WORKER_RANKS = 4


class CampaignError(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise CampaignError(what)


def mentions(text, value):
    """Whether `text` holds `value` as a whole number (0.1001 is not in 0.10012)."""
    return re.search(re.escape(f"{value:g}") + r"(?![0-9])", text) is not None


data_lines = proc_util.data_lines


class Daemon:
    """spgated on loopback ports the kernel picks at its first start, kept for every
    restart, and a fixed state dir, so that a restart is the same daemon to its clients.
    (A port picked here and bound later by the daemon could be taken in between by a test
    running beside this one.)"""

    def __init__(self, spgated, state_dir, log_dir):
        self.spgated, self.state_dir, self.log_dir = spgated, state_dir, log_dir
        self.port = self.admin_port = self.metrics_port = 0
        self.proc = None
        self.starts = 0
        self.past_lives = ""  # the metrics of every killed daemon, scraped before the kill

    def start(self, timeout=30):
        self.starts += 1
        log = os.path.join(self.log_dir, f"spgated.{self.starts}.log")
        self.log_path = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                [self.spgated, f"--listen=127.0.0.1:{self.port}",
                 f"--admin_listen=127.0.0.1:{self.admin_port}",
                 f"--metrics_listen=127.0.0.1:{self.metrics_port}",
                 f"--state_dir={self.state_dir}", "--heartbeat_interval=250ms"],
                stdout=subprocess.DEVNULL, stderr=f)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log) as f:
                text = f.read()
            # The ports it serves on (port 0: the kernel's pick at the first start), read
            # from whole lines only (the file is being written).
            serving = sr.SERVING_LINE.search(text[:text.rfind("\n") + 1])
            if serving:
                self.port, self.admin_port, self.metrics_port = map(int, serving.groups()[:3])
                return time.monotonic()
            if self.proc.poll() is not None:
                raise CampaignError(f"spgated exited {self.proc.returncode} at start:\n{text}")
            time.sleep(0.02)
        self.proc.kill()
        raise CampaignError(f"spgated did not report serving within {timeout} s")

    def kill(self):
        # Its counters die with it: what it counted so far, for the sums over its lives.
        try:
            self.past_lives += self.metrics(timeout=5)
        except OSError:
            pass  # a daemon that cannot answer now: its counts are not summed
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def freeze(self):
        try:
            proc_util.freeze(self.proc)
        except RuntimeError as e:
            raise CampaignError(str(e)) from e

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc:
            proc_util.stop(self.proc)

    def metrics(self, timeout=10):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=timeout) as r:
            return r.read().decode()


def metric_sum(text, name, labels):
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    return total if found else None


class UnwritableDir:
    """Makes a directory refuse new entries and renames, for root as well: `chattr +i`
    (ext4, xfs, btrfs); where that is refused, the directory is moved aside and a plain
    file put at its path (every open under it then fails with ENOTDIR); without root,
    chmod 0500. The way used is recorded in the report."""

    def __init__(self, path, way="auto"):
        self.path, self.way = path, way
        self.how = None

    def __enter__(self):
        if self.way == "chmod" or (self.way == "auto" and os.geteuid() != 0):
            os.chmod(self.path, 0o500)
            self.how = "chmod 0500"
        elif self.way in ("auto", "chattr") and subprocess.run(
                ["chattr", "+i", self.path], capture_output=True).returncode == 0:
            self.how = "chattr +i"
        else:
            os.rename(self.path, self.path + ".away")
            with open(self.path, "w") as f:
                f.write("not a directory\n")
            self.how = "directory swapped for a file"
        probe = os.path.join(self.path, ".probe")
        try:
            open(probe, "w").close()
            os.unlink(probe)
            writable = True
        except OSError:
            writable = False
        if writable:
            self.__exit__(None, None, None)
            raise CampaignError(f"{self.how} left {self.path} writable")
        return self

    def __exit__(self, *exc):
        if self.how == "chmod 0500":
            os.chmod(self.path, 0o700)
        elif self.how == "chattr +i":
            subprocess.run(["chattr", "-i", self.path], check=True)
        elif self.how == "directory swapped for a file":
            os.unlink(self.path)
            os.rename(self.path + ".away", self.path)


class Campaign:
    def __init__(self, args, profile):
        self.a, self.p = args, profile
        self.rng = random.Random(args.seed)
        self.tmp = tempfile.mkdtemp(prefix="spgate-faults-")
        self.state_dir = os.path.join(self.tmp, "state")
        os.mkdir(self.state_dir)
        self.daemon = Daemon(args.spgated, self.state_dir, self.tmp)
        self.report = {"profile": args.profile, "seed": args.seed, "faults": {},
                       "reconnect_s": [], "freeze_recovery_s": [], "state_file_checks": 0,
                       "config_writes": {"acknowledged": 0, "refused": 0, "killed": 0},
                       "restored_in_flight_write": 0}
        self.acked = {}  # scope -> (value, version) of the last acknowledged write
        self.value_seq = 0
        self.write_s = []  # spgatectl gates set, start to exit, writes with no fault

    # ---- spgatectl -------------------------------------------------------------
    def ctl(self, *args):
        # A generous --timeout: on a saturated machine an fsync'd write can take seconds,
        # and a write the client gave up on is neither acknowledged nor refused.
        cmd = [self.a.spgatectl, f"--admin=127.0.0.1:{self.daemon.admin_port}",
               "--output=json", "--timeout=30s", *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def ctl_run(self, *args, timeout=30):
        p = self.ctl(*args)
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out

    def next_value(self):
        # A value no other write uses, so each write is recognisable in the state file,
        # the audit log and `gates get`.
        self.value_seq += 1
        return round(0.1 + self.value_seq / 1e5, 5)

    def served(self, job_id=None):
        args = ["gates", "get"] + ([f"--job_id={job_id}"] if job_id else [])
        rc, out = self.ctl_run(*args)
        check(rc == 0, f"gates get failed: {out}")
        c = json.loads(out)
        c = c.get("config", c)
        return float(c["max_length_cv"]), int(c.get("version", -1))

    # ---- the state file --------------------------------------------------------
    def parse_state_file(self):
        """Parses spgated-state.textproto with protoc against the real schema (a torn or
        corrupt file fails to parse) and returns its text."""
        path = os.path.join(self.state_dir, "spgated-state.textproto")
        if not os.path.exists(path):
            return {}
        with open(path, "rb") as f:
            text = f.read()
        r = subprocess.run(
            ["protoc", f"--proto_path={REPO}/proto", "--encode=spgate.v1.PersistedState",
             "spgate/v1/admin.proto"], input=text, capture_output=True)
        check(r.returncode == 0, "state file does not parse as PersistedState: "
              f"{r.stderr.decode()}\n{text.decode()}")
        self.report["state_file_checks"] += 1
        # The audit log is appended before the state file is written: every line whole.
        audit = os.path.join(self.state_dir, "audit.log")
        if os.path.exists(audit):
            with open(audit) as f:
                for n, line in enumerate(f, 1):
                    try:
                        json.loads(line)
                    except ValueError:
                        raise CampaignError(f"audit.log line {n} is torn: {line!r}")
        return text.decode()

    # ---- the jobs --------------------------------------------------------------
    def start_jobs(self):
        p = self.p
        self.prefix = os.path.join(self.tmp, "decisions")
        self.worker_summary = os.path.join(self.tmp, "worker.json")
        self.sim_summary = os.path.join(self.tmp, "sim.json")
        self.deadline_s = self.a.deadline_ms / 1000
        ctl = f"--controller=127.0.0.1:{self.daemon.port}"
        self.worker = subprocess.Popen(
            [self.a.mpirun, "--oversubscribe", "-np", str(WORKER_RANKS), self.a.worker,
             "--tp=2", ctl, f"--job_id={WORKER_JOB}", "--layers=1", "--hidden=64",
             "--heads=4", "--ffn_hidden=128", "--lengths=bimodal:short=64,long=512,p_long=0.3",
             "--tokens_per_batch=1024", f"--decision_deadline={self.a.deadline_ms}ms",
             f"--duration={p['duration_s']}s", f"--decision_log={self.prefix}",
             f"--summary_json={self.worker_summary}"],
            env=ENV, stdout=open(os.path.join(self.tmp, "worker.log"), "w"),
            stderr=subprocess.STDOUT)
        self.sim = subprocess.Popen(
            [self.a.sim, ctl, f"--job_id={SIM_JOB}", f"--groups={p['sim_groups']}",
             f"--tp={p['sim_tp']}", f"--steps_per_s={p['sim_steps_per_s']}",
             f"--duration={p['duration_s']}s", f"--deadline={self.a.deadline_ms}ms",
             "--connect_timeout=60s", f"--summary_json={self.sim_summary}"],
            stdout=open(os.path.join(self.tmp, "sim.log"), "w"), stderr=subprocess.STDOUT)
        self.sim_ranks = p["sim_groups"] * p["sim_tp"]
        self.t_jobs = time.monotonic()

    def jobs_alive(self):
        check(self.worker.poll() is None, f"the worker job ended early ({self.worker.returncode})")
        check(self.sim.poll() is None, f"the simulator ended early ({self.sim.returncode})")

    def wait_registered(self, since, what):
        """Waits until every rank of both jobs is registered with the (new) daemon and
        both jobs are getting daemon decisions; returns the seconds since `since`."""
        want = {WORKER_JOB: WORKER_RANKS, SIM_JOB: self.sim_ranks}
        base = None
        give_up = since + self.a.reconnect_bound
        while True:
            self.jobs_alive()
            try:
                text = self.daemon.metrics()
            except OSError:
                text = ""
            active = {j: metric_sum(text, "spgate_workers", {"job_id": j, "state": "active"})
                      for j in want}
            decided = {j: metric_sum(text, "spgate_decisions_total", {"job_id": j}) or 0
                       for j in want}
            if base is None:
                base = decided
            if all(active[j] == want[j] and decided[j] > base[j] for j in want):
                return time.monotonic() - since
            check(time.monotonic() < give_up,
                  f"{what}: ranks not back within {self.a.reconnect_bound} s: active {active}, "
                  f"want {want}")
            time.sleep(0.05)

    # ---- faults ----------------------------------------------------------------
    def count(self, kind):
        self.report["faults"][kind] = self.report["faults"].get(kind, 0) + 1

    def temp_files(self):
        return [n for n in os.listdir(self.state_dir)
                if n.startswith("spgated-state.textproto.tmp.")]

    def restart(self, what):
        self.parse_state_file()  # never torn, whatever the kill interrupted
        left = len(self.temp_files())
        up = self.daemon.start()
        # A kill between the temp file and the rename leaves the temp file; the next
        # daemon removes it (only a write of its own may be in flight now).
        mine = f"spgated-state.textproto.tmp.{self.daemon.proc.pid}"
        stale = [n for n in self.temp_files() if n != mine]
        check(not stale, f"temp files of killed daemons left after restart: {stale}")
        self.report["temp_files_removed"] = self.report.get("temp_files_removed", 0) + left
        self.report["reconnect_s"].append(round(self.wait_registered(up, what), 3))

    def fault_kill(self):
        self.daemon.kill()
        self.count("kill -9 and restart")
        time.sleep(1.0)  # the ranks decide alone meanwhile
        self.restart("kill")

    def fault_freeze(self):
        text = self.daemon.metrics()
        before = {j: metric_sum(text, "spgate_decisions_total", {"job_id": j}) or 0
                  for j in (WORKER_JOB, SIM_JOB)}
        self.daemon.freeze()
        time.sleep(self.p["freeze_s"])
        self.daemon.thaw()
        thawed = time.monotonic()
        self.count(f"SIGSTOP {self.p['freeze_s']:g} s (deadline {self.a.deadline_ms} ms), SIGCONT")
        while True:
            self.jobs_alive()
            text = self.daemon.metrics()
            now = {j: metric_sum(text, "spgate_decisions_total", {"job_id": j}) or 0
                   for j in before}
            if all(now[j] > before[j] for j in before):
                break
            check(time.monotonic() - thawed < self.a.reconnect_bound,
                  "decisions did not resume after SIGCONT")
            time.sleep(0.05)
        self.report["freeze_recovery_s"].append(round(time.monotonic() - thawed, 3))

    def fault_readonly(self):
        failures0 = metric_sum(self.daemon.metrics(), "spgate_state_persist_failures_total", {})
        value_before, version_before = self.served()
        value = self.next_value()
        with UnwritableDir(self.state_dir, self.a.unwritable) as u:
            self.report["unwritable_how"] = u.how
            rc, out = self.ctl_run("gates", "set", f"--max_length_cv={value}")
        self.count("state dir unwritable during gates set")
        check(rc == 1 and "UNAVAILABLE" in out, f"a write to an unwritable state dir: {rc} {out}")
        self.report["config_writes"]["refused"] += 1
        audit = os.path.join(self.state_dir, "audit.log")
        if os.path.exists(audit):
            check(not mentions(open(audit).read(), value), "a refused write left an audit line")
        check(self.served() == (value_before, version_before),
              "a refused write changed the served config")
        failures = metric_sum(self.daemon.metrics(), "spgate_state_persist_failures_total", {})
        check(failures == (failures0 or 0) + 1,
              f"spgate_state_persist_failures_total {failures0} -> {failures}")
        # Writable again: the next write goes through and is persisted.
        value = self.next_value()
        rc, out = self.ctl_run("gates", "set", f"--max_length_cv={value}")
        check(rc == 0, f"a write after the state dir recovered: {out}")
        self.note_acked("", value, out)
        check(mentions(self.parse_state_file(), value), "the recovered write is not persisted")

    def note_acked(self, scope, value, out):
        c = json.loads(out)
        c = c.get("config", c)
        check(abs(float(c["max_length_cv"]) - value) < 1e-12, f"set answered {out}")
        self.acked[scope] = (value, int(c.get("version", -1)))
        self.report["config_writes"]["acknowledged"] += 1

    def fault_writes(self):
        """Config writes on the worker job's scope; a random share of them has the daemon
        killed at a random moment while spgatectl is in flight."""
        scope = WORKER_JOB
        for i in range(self.p["writes"]):
            self.jobs_alive()
            value = self.next_value()
            kill = self.rng.random() < self.p["kill_share"]
            sent = time.monotonic()
            p = self.ctl("gates", "set", f"--job_id={scope}", f"--max_length_cv={value}")
            if kill:
                time.sleep(self.rng.uniform(0, 0.06))  # spgatectl's start-up to its reply
                self.daemon.kill()
                self.count("kill -9 during a config write, restart")
            out, _ = p.communicate(timeout=60)
            if p.returncode == 0:
                self.note_acked(scope, value, out)
                if not kill:
                    self.write_s.append(time.monotonic() - sent)
            else:
                check(kill, f"write {i} failed without a fault: {out}")
                self.report["config_writes"]["killed"] += 1
            if kill:
                restored_state = self.parse_state_file()
                self.restart("kill during writes")
                got, version = self.served(scope)
                last, last_version = self.acked.get(scope, (None, -1))
                if p.returncode == 0:
                    check(got == value, f"acknowledged write {value} restored as {got}")
                elif got == value:
                    # Persisted before the kill; its reply was lost. Allowed, counted.
                    self.report["restored_in_flight_write"] += 1
                    check(mentions(restored_state, value), "in-flight value served but not in the file")
                else:
                    check(got == last, f"restored {got}, last acknowledged {last}")
                check(version >= last_version, f"version went back: {version} < {last_version}")
                if got == value:
                    self.acked[scope] = (value, version)

    # ---- the run ---------------------------------------------------------------
    def run(self):
        p = self.p
        up = self.daemon.start()
        self.start_jobs()
        self.report["initial_connect_s"] = round(self.wait_registered(up, "start"), 3)
        time.sleep(2)
        for _ in range(p["kills"]):
            self.fault_kill()
            time.sleep(1)
        for _ in range(p["freezes"]):
            self.fault_freeze()
            time.sleep(1)
        for _ in range(p["readonly_writes"]):
            self.fault_readonly()
        self.fault_writes()
        w = sorted(self.write_s)
        self.report["write_s"] = {"samples": len(w), "p50": round(w[len(w) // 2], 3),
                                  "max": round(w[-1], 3)} if w else {}
        schedule_s = time.monotonic() - self.t_jobs
        self.report["schedule_s"] = round(schedule_s, 1)
        check(schedule_s < p["duration_s"] - 4,
              f"the fault schedule took {schedule_s:.0f} s of the jobs' {p['duration_s']} s")
        # The jobs run on past the last fault, so their last heartbeats reach this daemon.
        wrc = self.worker.wait(timeout=p["duration_s"] + 120)
        src = self.sim.wait(timeout=p["duration_s"] + 120)
        final = self.daemon.metrics()
        self.verify_jobs(wrc, src, final)
        # The daemon never failed on its own: every exit was one of ours.
        check(self.daemon.proc.poll() is None, "spgated died on its own")

    def verify_jobs(self, wrc, src, metrics):
        wlog = open(os.path.join(self.tmp, "worker.log")).read()
        check(wrc == 0, f"worker exited {wrc}:\n{wlog[-3000:]}")
        slog = open(os.path.join(self.tmp, "sim.log")).read()
        check(src == 0, f"spgate-sim exited {src}:\n{slog[-3000:]}")
        w = json.load(open(self.worker_summary))
        s = json.load(open(self.sim_summary))
        tol = self.a.wait_tolerance_ms / 1000
        # Waits.
        check(w["leader_decision_wait_max_s"] <= self.deadline_s + tol,
              f"a worker step waited {w['leader_decision_wait_max_s']:.3f} s for its decision")
        check(s["decide_wait_s"]["max"] <= self.deadline_s + tol,
              f"a simulated step waited {s['decide_wait_s']['max']:.3f} s for its decision")
        # Consistency: identical per-rank decision logs in each group.
        logs = [data_lines(f"{self.prefix}.rank{r}.csv") for r in range(WORKER_RANKS)]
        check(len(logs[0]) == w["steps"] and w["steps"] > 0, "rank 0's log length")
        for g in range(WORKER_RANKS // 2):
            check(logs[2 * g] == logs[2 * g + 1],
                  f"group {g}: ranks {2 * g} and {2 * g + 1} logged different decisions")
        check(w["consistency_violations"] == 0, "worker consistency violations")
        check(s["consistency_violations"] == 0, "sim consistency violations")
        check(s["decide_errors"] == 0, f"sim decide errors: {s.get('first_error')}")
        # The faults reached the jobs: both sources of decisions occur.
        for name, src_counts in (("worker", w["decision_sources"]), ("sim", s["decision_sources"])):
            check(src_counts.get("daemon", 0) > 0 and src_counts.get("fallback", 0) > 0,
                  f"{name}: decisions by source {src_counts}")
        # Local decisions reported after reconnect, each once: summed over the daemon's
        # lives (a new session reports what no daemon acknowledged; a restarted daemon that
        # counted a worker's whole history again made this sum several times the job's).
        lives = self.daemon.past_lives + metrics
        for job, n in ((WORKER_JOB, w["local_decisions"]), (SIM_JOB, s["local_decisions"])):
            got = metric_sum(lives, "spgate_worker_local_decisions_total", {"job_id": job}) or 0
            check(abs(got - n) <= max(3, 0.03 * n),
                  f"{job}: the daemon's lives counted {got} local decisions, the job made {n}")
        # Telemetry accounting: one record per group-step, from the group leader's session
        # (the ranks' values reduced in the group; docs/design.md §2).
        worker_groups = WORKER_RANKS // 2
        sim_groups = self.p["sim_groups"]
        check(w["telemetry_sent"] == worker_groups * w["steps"],
              f"worker: {w['telemetry_sent']} records written, {worker_groups * w['steps']} produced")
        check(w["lost_telemetry"] == w["telemetry_sent"] - w["telemetry_acked"], "worker lost")
        t = s["telemetry"]
        check(t["reported"] == sim_groups * s["steps"], f"sim: records produced {t}")
        check(s["sessions"] == sim_groups, f"sim: {s['sessions']} sessions, one per group expected")
        check(t["dropped"] == 0, f"sim: records dropped {t}")
        check(s["lost_telemetry"] == t["reported"] - t["acknowledged"], f"sim lost {t}")
        check(t["acknowledged"] <= t["sent"] <= t["reported"], f"sim telemetry {t}")
        # Lost records are only those written to a daemon that was killed before it
        # acknowledged them: at most the last ~2 s of each group's records per kill (acks
        # ride on the heartbeat replies). A freeze or a refused write loses nothing.
        kills = sum(n for k, n in self.report["faults"].items() if k.startswith("kill"))
        worker_rate = w["steps"] / self.p["duration_s"]
        check(w["lost_telemetry"] <= kills * worker_groups * max(2, 2 * worker_rate),
              f"worker: {w['lost_telemetry']} records lost over {kills} kills")
        check(s["lost_telemetry"] <= kills * sim_groups * max(2, 2 * self.p["sim_steps_per_s"]),
              f"sim: {s['lost_telemetry']} records lost over {kills} kills")
        # The restored config reached the ranks: the simulator ends under the global
        # config of the last acknowledged global write.
        check(abs(s["config"]["max_length_cv"] - self.acked[""][0]) < 1e-9,
              f"sim ends with {s['config']}, last acknowledged global write {self.acked['']}")
        self.report["worker"] = {k: w[k] for k in (
            "steps", "decision_sources", "local_decisions", "consistency_violations",
            "lost_telemetry", "telemetry_sent", "telemetry_acked", "leader_decision_wait_max_s")}
        self.report["sim"] = {
            "ranks": self.sim_ranks, "steps": s["steps"], "steps_per_s": self.p["sim_steps_per_s"],
            "decision_sources": s["decision_sources"], "local_decisions": s["local_decisions"],
            "consistency_violations": s["consistency_violations"],
            "lost_telemetry": s["lost_telemetry"], "telemetry": t,
            "decide_wait_s": s["decide_wait_s"], "late_steps": s["late_steps"]}
        self.report["kills"] = kills

    def cleanup(self):
        self.daemon.stop()
        for proc in (getattr(self, "worker", None), getattr(self, "sim", None)):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if os.path.isfile(self.state_dir) and os.path.isdir(self.state_dir + ".away"):
            os.unlink(self.state_dir)
            os.rename(self.state_dir + ".away", self.state_dir)
        subprocess.run(["chattr", "-i", self.state_dir], capture_output=True)
        if self.a.keep:
            print(f"fault campaign: kept {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    for flag in ("spgated", "spgatectl", "worker", "sim", "mpirun"):
        ap.add_argument(f"--{flag}", required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="short")
    ap.add_argument("--writes", type=int, help="override the profile's config writes")
    ap.add_argument("--duration_s", type=int, help="override the jobs' run time")
    ap.add_argument("--deadline_ms", type=int, default=100, help="decision deadline of both jobs")
    ap.add_argument("--wait_tolerance_ms", type=int, default=50,
                    help="scheduling allowance over the deadline on a loaded machine")
    ap.add_argument("--reconnect_bound", type=float, default=10.0,
                    help="seconds within which every rank must be registered again")
    ap.add_argument("--unwritable", choices=("auto", "chattr", "swap", "chmod"), default="auto",
                    help="how to make the state dir unwritable (auto: chattr +i as root, "
                         "else chmod 0500; swap: a plain file in its place)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--report", help="write the figures as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    a = ap.parse_args()
    profile = dict(PROFILES[a.profile])
    if a.writes:
        profile["writes"] = a.writes
    if a.duration_s:
        profile["duration_s"] = a.duration_s
    c = Campaign(a, profile)
    t0 = time.monotonic()
    ok = False
    try:
        c.run()
        ok = True
    except CampaignError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        a.keep = True
    finally:
        c.cleanup()
    c.report["wall_s"] = round(time.monotonic() - t0, 1)
    c.report["passed"] = ok
    text = json.dumps(c.report, indent=2, sort_keys=True)
    print(text)
    if a.report:
        with open(a.report, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
