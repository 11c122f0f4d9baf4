#!/usr/bin/python3
"""A live job under attack from someone who knows its job id and launch name.

The launch-takeover attack (docs/security.md), replayed: a victim job whose TP-only peak
never fits its memory budget (spgate-sim --tp=8 --tokens_per_batch=65536 --layers=20 --device_memory_gib=72,
so every correct decision is SP, MEMORY_REQUIRES_SP) runs against spgated with a worker
token. The attacker holds the same worker token, reads the job's launch name from the
admin API (as any cluster user reads a Slurm job id), and for the whole run tries what
worked before: a new launch under the job id, a seat in the running launch as rank 0 and
as a follower (no credential, a guessed one), streams and decisions on made-up sessions.

Checked: every attack is refused with the documented status, and no refusal names the
running launch; the victim gets not one TP-only decision (from the daemon, from its
fallback or run by a worker), keeps its daemon decisions (local ones at most
--max_local_share), and no worker had to override the daemon (memory_overrides 0). Then
ownership across a crash: spgated is killed (-9) and restarted on the same state dir;
the victim's launch still needs its credential, and no new launch takes the job while
the victim's ranks may be coming back (a replaced launch staying replaced across a
restart: gate_state_test LaunchesAndTheirCredentialsSurviveARestart).

Run: /usr/bin/python3 launch_attack_test.py --spgated=BIN --sim=BIN   (ctest does this)
Loopback only; bounded in time; every process is killed on exit.
"""
import argparse
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "demo"))
import spgate_reflect as sr  # noqa: E402

C = grpc.StatusCode
WORKER_TOKEN = "shared-worker-token-the-attacker-holds-too"
JOB = "victim"
INCARNATION = "slurm-4711.0"   # public: the cluster's job list shows it
CALL_TIMEOUT = 10.0


def auth(token):
    return (("authorization", f"Bearer {token}"),)


class Attacker:
    """Repeats the attacks until stopped; every status is recorded against the expected."""

    def __init__(self, daemon):
        self.gate = sr.connect(daemon.worker_address, "spgate.v1.GateService", CALL_TIMEOUT)
        self.admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        self.results = []   # (case, expected, got, details)
        self.stop = threading.Event()
        self.victim_alive_at_end = False

    def call(self, case, expected, method, **fields):
        try:
            self.gate.call(method, metadata=auth(WORKER_TOKEN), **fields)
            got, details = C.OK, ""
        except grpc.RpcError as e:
            got, details = e.code(), e.details() or ""
        self.results.append((case, expected, got, details))
        return details

    def register(self, case, expected, **fields):
        f = dict(job_id=JOB, incarnation=INCARNATION, group=0, rank_in_group=0, group_size=8,
                 global_rank=0, host="attacker", launch_credential="guessed-guessed-guessed-1")
        f.update(fields)
        return self.call(case, expected, "Register", **f)

    def round(self, launch):
        d = self.register("a new launch under the job id", C.FAILED_PRECONDITION,
                          incarnation="made-up-launch")
        self.results.append(("the refusal does not name the running launch", C.OK,
                             C.OK if launch not in d else C.UNKNOWN, d))
        self.register("rank 0 of the running launch, no credential", C.UNAUTHENTICATED,
                      incarnation=launch, launch_credential="")
        self.register("rank 0 of the running launch, a guessed credential",
                      C.PERMISSION_DENIED, incarnation=launch)
        self.register("rank 1 of the running launch, a guessed credential",
                      C.PERMISSION_DENIED, incarnation=launch, rank_in_group=1, global_rank=1)
        plan = self.gate.new("BatchPlan", job_id=JOB, group=0, step=10**6, lengths=[64])
        self.call("Decide on a made-up session", C.NOT_FOUND, "Decide",
                  request=self.gate.new("DecideRequest", session_id="0" * 32, plan=plan))
        stream = self.gate.bidi("Connect", timeout=5, metadata=auth(WORKER_TOKEN))
        stream.send(self.gate.new("WorkerMessage", session_id="1" * 32, telemetry=[
            self.gate.new("StepTelemetry", job_id=JOB, group=0, rank_in_group=1, step=s,
                          mode=1, step_time_s=1.0, rs_wait_s=0.99, effective_tokens=1)
            for s in range(10**6, 10**6 + 100)]))
        try:
            stream.recv(timeout=5)
            got = C.OK
        except grpc.RpcError as e:
            got = e.code()
        except TimeoutError:
            got = None
        self.results.append(("future telemetry on a made-up session", C.NOT_FOUND, got, ""))

    def run(self, seconds, victim):
        """Attacks for `seconds` from the moment the victim's launch is visible. The
        victim must outlive the attack: once its ranks are gone a new launch of the job
        is (rightly) accepted, so an attack round after its end would test nothing."""
        launch = ""
        while not launch and not self.stop.is_set():
            try:
                launch = self.admin.call("GetJob", job_id=JOB).summary.incarnation
            except grpc.RpcError:
                time.sleep(0.05)
        end = time.monotonic() + seconds
        while not self.stop.is_set() and time.monotonic() < end:
            self.round(launch)
            self.stop.wait(0.1)
        self.victim_alive_at_end = victim.poll() is None

    def mismatches(self):
        return [f"{case}: expected {want.name}, got {got.name if got else None}: {details}"
                for case, want, got, details in self.results if got != want]


def main():
    faulthandler.enable()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spgated", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--steps", type=int, default=400, help="the victim's steps, at 40 a second")
    p.add_argument("--attack_seconds", type=float, default=6.0,
                   help="how long the attacker keeps at it (within the victim's run)")
    p.add_argument("--max_local_share", type=float, default=0.10)
    args = p.parse_args()
    faulthandler.dump_traceback_later(150, exit=True)
    tmp = tempfile.mkdtemp(prefix="spgate-attack-")
    state = os.path.join(tmp, "state")
    token_file = os.path.join(tmp, "worker-token")
    with open(token_file, "w") as f:
        f.write(WORKER_TOKEN + "\n")
    daemon_args = [f"--worker_token_file={token_file}", "--stale_after=2s"]
    failures = []
    daemon = sim = None
    try:
        daemon = sr.SpgatedProcess(args.spgated, state_dir=state, extra_args=daemon_args).start()
        summary_path = os.path.join(tmp, "victim.json")
        sim = subprocess.Popen(
            [args.sim, f"--controller={daemon.worker_address}", f"--job_id={JOB}",
             f"--incarnation={INCARNATION}", f"--worker_token_file={token_file}",
             "--groups=1", "--tp=8", "--tokens_per_batch=65536", "--layers=20",
             "--device_memory_gib=72", f"--steps={args.steps}", "--steps_per_s=40",
             "--deadline=100ms", f"--summary_json={summary_path}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        attacker = Attacker(daemon)
        thread = threading.Thread(target=attacker.run, args=(args.attack_seconds, sim))
        thread.start()
        try:
            _, sim_err = sim.communicate(timeout=90)
        finally:
            attacker.stop.set()
            thread.join(30)
        if sim.returncode != 0:
            failures.append(f"the victim exited {sim.returncode}: {sim_err[-2000:]}")
        with open(summary_path) as f:
            victim = json.load(f)
        rounds = sum(1 for r in attacker.results if r[0] == "a new launch under the job id")
        if not attacker.victim_alive_at_end:
            failures.append("the victim ended before the attack did: raise --steps")
        if rounds < 5:
            failures.append(f"only {rounds} attack rounds ran during the victim's run")
        failures += attacker.mismatches()

        steps = int(victim["steps"])
        decisions = victim["decisions"]
        tp_only = sum(decisions.get("tp_only", {}).values())
        memory_sp = decisions.get("sp", {}).get("memory_requires_sp", 0)
        if steps != args.steps:
            failures.append(f"the victim ran {steps} of {args.steps} steps")
        if tp_only != 0:
            failures.append(f"the victim ran {tp_only} TP-only steps over its budget: {decisions}")
        if memory_sp < 0.9 * steps:
            failures.append(f"only {memory_sp} of {steps} steps were MEMORY_REQUIRES_SP: the "
                            f"victim is not the memory-bound job this test needs: {decisions}")
        if int(victim["local_decisions"]) > args.max_local_share * steps:
            failures.append(f"the victim lost its daemon decisions: {victim['local_decisions']} "
                            f"of {steps} steps decided locally")
        if int(victim.get("memory_overrides", -1)) != 0:
            failures.append(f"memory_overrides is {victim.get('memory_overrides')}: the daemon "
                            "answered TP-only for a plan that did not fit")
        daemon_tp = sum(v for n, lb, v in sr.scrape(daemon.metrics_port)
                        if n == "spgate_decisions_total" and lb.get("job_id") == JOB
                        and lb.get("mode") == "tp_only")
        if daemon_tp != 0:
            failures.append(f"spgated decided TP-only {daemon_tp} times for the victim")

        # Ownership across crashes.
        daemon.kill()
        daemon = sr.SpgatedProcess(args.spgated, state_dir=state, extra_args=daemon_args).start()
        after = Attacker(daemon)
        after.register("after kill -9: rank 0 of the launch, a guessed credential",
                       C.PERMISSION_DENIED)
        after.register("after kill -9: a new launch while the restored one's ranks may be "
                       "coming back", C.FAILED_PRECONDITION, incarnation="attacker-launch")
        failures += after.mismatches()
        print(json.dumps({"attack_rounds": rounds, "attack_calls": len(attacker.results),
                          "victim_steps": steps, "victim_decisions": decisions,
                          "victim_local_decisions": victim["local_decisions"],
                          "victim_memory_overrides": victim.get("memory_overrides")}, indent=2))
    except Exception as e:  # noqa: BLE001 - reported as a failure
        import traceback
        traceback.print_exc()
        failures.append(f"error: {e!r}")
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        if daemon is not None:
            if failures:
                failures.append("spgated's stderr (tail):\n" + daemon.stderr_text[-3000:])
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("FAIL:\n" + "\n".join(failures[:40]), file=sys.stderr)
        return 1
    print("PASS: every attack refused; the victim ran SP throughout on its daemon's decisions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
