#!/usr/bin/python3
"""`make demo`: spgated's gates firing, driven through the real API by a scripted job.

Starts the real spgated on loopback (port 0, a temporary --state_dir, a small --config so
the rolling windows are a few steps long), then plays one job with four TP groups:

  group 0  two ranks on the Connect stream; well-bucketed batches pass (GATES_PASSED),
           a badly bucketed one falls back to TP-only (LENGTH_CV); the operator raises
           max_length_cv over the admin API and the same batch runs SP from the
           announced effective_from_step on;
  group 1  two ranks whose telemetry shows reduce-scatter exposed: RS_WAIT, a PROBE
           every probe_interval_steps, SP again once the probes measure a wait share
           below max_rs_wait_share - margin;
  group 2  unary Decide with memory predictions: MEMORY_REQUIRES_SP, MEMORY_OVER_BUDGET;
  group 3  an operator pin to TP-only (PINNED), then unpinned.

It prints what happens, the decision counts scraped from /metrics, and stops the daemon
with SIGTERM. Exit status 0 only if every reason of EXPECTED fired (all but
CONTROLLER_UNAVAILABLE, ADAPTIVE and the pipeline reasons LENGTHS_UNKNOWN, SP_REQUIRED), /metrics agrees with the decisions the job received, the threshold
change took effect where announced, and spgated exited 0.

The client has no generated stubs: it learns the API through server reflection
(spgate_reflect.py, shared with tests/integration). Every wait is on a reply, bounded.

Run: /usr/bin/python3 tools/demo/demo.py --spgated=build/bin/spgated
"""
import argparse
import collections
import faulthandler
import os
import secrets
import shutil
import sys
import tempfile
import traceback
import uuid

import grpc

import spgate_reflect as sr

JOB = "demo-job"
# One launch of the demo job (the daemon keys live state by job and launch).
INCARNATION = uuid.uuid4().hex
# The launch's secret, the same on every rank of this launch (docs/security.md).
LAUNCH_CREDENTIAL = secrets.token_hex(16)
GIB = 1 << 30
RECV_TIMEOUT = 5.0
EXPECTED = ["GATES_PASSED", "LENGTH_CV", "RS_WAIT", "PROBE", "MEMORY_REQUIRES_SP",
            "MEMORY_OVER_BUDGET", "PINNED"]

# Short windows so the reduce-scatter story fits in a dozen steps (defaults: 50/200/20).
DEMO_CONFIG = """\
# spgate demo: the gate thresholds are the defaults; the windows are short.
window_steps: 3          # rolling rs_wait_share = mean over the last 3 SP steps
probe_interval_steps: 4  # in the RS_WAIT fallback, one SP probe every 4 steps
min_dwell_steps: 2
"""

UNIFORM = [4096, 4032, 4160, 4096, 4000, 4192, 4096, 4064]   # length CV ~0.01
MIXED = [2600, 4096, 5600, 3000, 5200, 4096, 3400, 4800]     # length CV ~0.24
RAGGED = [512, 16384, 1024, 8192, 2048, 4096, 768, 12288]    # length CV ~0.99


class DemoError(RuntimeError):
    pass


class Demo:
    def __init__(self, daemon):
        self.daemon = daemon
        self.gate = sr.connect(daemon.worker_address, "spgate.v1.GateService", RECV_TIMEOUT)
        self.admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", RECV_TIMEOUT)
        self.seen = collections.Counter()   # (mode, reason) of every decision received
        self.failures = []
        self.ranks = []

    # --- output ----------------------------------------------------------------------

    def mode(self, number):
        return {"SEQUENCE_PARALLEL": "SP", "TENSOR_PARALLEL_ONLY": "TP-only"}.get(
            self.gate.enum_name("Mode", number), "?")

    def reason(self, number):
        return self.gate.enum_name("Reason", number)

    def show(self, decision, note=""):
        self.seen[(self.mode(decision.mode), self.reason(decision.reason))] += 1
        # Unset while the group's window holds no SP step (after a trip empties it).
        rs = (f"{decision.rolling_rs_wait_share:4.2f}"
              if decision.HasField("rolling_rs_wait_share") else "   -")
        print(f"    step {decision.step:2d}  length cv {decision.length_cv:4.2f}  "
              f"rs_wait {rs}  config v{decision.config_version}"
              f"  ->  {self.mode(decision.mode):7s} {self.reason(decision.reason):18s} {note}")

    def expect(self, decision, reason, what):
        if self.reason(decision.reason) != reason:
            self.failures.append(f"{what}: expected {reason}, got "
                                 f"{self.reason(decision.reason)} at step {decision.step}")

    # --- the API ---------------------------------------------------------------------

    def decide(self, group, step, lengths, **memory):
        """Unary Decide as the group's leader (its session from Register, made once)."""
        sessions = self.__dict__.setdefault("leader_sessions", {})
        if group not in sessions:
            sessions[group] = self.gate.call(
                "Register", job_id=JOB, incarnation=INCARNATION, launch_credential=LAUNCH_CREDENTIAL, group=group, rank_in_group=0,
                group_size=1, global_rank=0, host="demo-host").session_id
        plan = self.gate.new("BatchPlan", job_id=JOB, group=group, step=step, lengths=lengths,
                             **memory)
        return self.gate.call("Decide", self.gate.new("DecideRequest", plan=plan,
                                                      session_id=sessions[group]))

    def config(self):
        return self.admin.call("GetGateConfig").config

    # --- scenes ----------------------------------------------------------------------

    def bucketing_and_threshold_change(self):
        print("\n1. Batch length spread (TP group 0: two ranks on the Connect stream)")
        group = TpGroup(self, group=0, size=2)
        for step in range(3):
            self.show(group.step(step, UNIFORM, rs_shares=(0.03, 0.05)), "well bucketed")
        d = group.step(3, MIXED, rs_shares=(0.03, 0.05))
        self.show(d, "badly bucketed: SP would wait on the longest shard")
        self.expect(d, "LENGTH_CV", "a CV-0.24 batch under max_length_cv 0.18")

        print("\n2. The operator raises max_length_cv to 0.30 through the admin API")
        whatif = self.admin.call("EvaluateGates", self.admin.new(
            "EvaluateGatesRequest", job_id=JOB, lengths=MIXED,
            config=self.admin.new("GateConfig", max_length_cv=0.30)))
        print(f"    what-if first (EvaluateGates, changes nothing): that batch would run "
              f"{self.mode(whatif.decision.mode)} ({self.reason(whatif.decision.reason)})")
        current = self.admin.call("GetGateConfig")
        request = self.admin.new("UpdateGateConfigRequest",
                                 config=self.admin.new("GateConfig", max_length_cv=0.30),
                                 expected_version=current.version)
        request.update_mask.paths.append("max_length_cv")
        updated = self.admin.call("UpdateGateConfig", request)
        update = group.leader.await_config(updated.effective_version)
        print(f"    UpdateGateConfig: version {current.version} -> {updated.version}; the daemon "
              f"pushed it to the group's ranks, effective from step "
              f"{update.effective_from_step}")
        print("    (a change never lands on a step already decided or in flight)")
        step = 4
        while step < update.effective_from_step:
            d = group.step(step, MIXED, rs_shares=(0.03, 0.05))
            self.show(d, "still under the old config")
            self.expect(d, "LENGTH_CV", "a step before effective_from_step")
            step += 1
        d = group.step(step, MIXED, rs_shares=(0.03, 0.05))
        self.show(d, "the same batch, now within max_length_cv")
        self.expect(d, "GATES_PASSED", "the first step under max_length_cv 0.30")
        if d.config_version != updated.effective_version:
            self.failures.append(f"step {step} decided under config v{d.config_version}, "
                                 f"expected v{updated.effective_version}")

    def reduce_scatter_wait(self):
        cfg = self.config()
        print(f"\n3. Reduce-scatter exposed (TP group 1: two ranks report telemetry; "
              f"max_rs_wait_share {cfg.max_rs_wait_share:.2f}, SP resumes below "
              f"{cfg.max_rs_wait_share - cfg.rs_wait_reenable_margin:.2f})")
        group = TpGroup(self, group=1, size=2)
        # The wait share each SP step measures (rank 0, rank 1): rank 1 waits for a slow
        # peer at first; later the network is fine again. Only SP steps measure it.
        measured = iter([(0.04, 0.35), (0.05, 0.30), (0.03, 0.06), (0.03, 0.05),
                         (0.03, 0.05)])
        sp_shares = next(measured)
        fired = []
        for step in range(16):
            d = group.step(step, UNIFORM, rs_shares=sp_shares)
            reason = self.reason(d.reason)
            rolling = d.rolling_rs_wait_share
            if reason == "RS_WAIT" and "RS_WAIT" not in fired:
                note = f"rolling {rolling:.2f} > {cfg.max_rs_wait_share:.2f}: TP-only"
            elif reason == "RS_WAIT" and d.HasField("rolling_rs_wait_share"):
                note = "the probe did not measure low enough: still TP-only"
            elif reason == "RS_WAIT":
                note = "TP-only measures no wait share; waiting for a probe"
            elif reason == "PROBE":
                note = "one SP step to measure again"
            else:
                note = "SP again, below the re-enable level" if "PROBE" in fired else "SP"
            if self.mode(d.mode) == "SP":
                note += f"; ranks measure rs_wait {max(sp_shares):.2f}"
                sp_shares = next(measured, sp_shares)
            self.show(d, note)
            fired.append(reason)
            if reason == "GATES_PASSED" and "PROBE" in fired:
                break
        if "PROBE" not in fired or fired[-1] != "GATES_PASSED":
            self.failures.append(f"RS_WAIT story: reasons were {fired}")

    def memory(self):
        headroom = self.config().memory_headroom
        budget = 80 * GIB
        print(f"\n4. Memory (TP group 2, unary Decide; budget 80 GiB x headroom {headroom:.2f} = "
              f"{80 * headroom:.0f} GiB)")
        cases = [
            (RAGGED, 76, 61, "MEMORY_REQUIRES_SP",
             "TP-only 76 GiB would not fit, SP 61 GiB does: SP despite the spread"),
            (UNIFORM, 98, 75, "MEMORY_OVER_BUDGET",
             "neither fits (TP 98, SP 75 GiB): SP, the smaller, and an alert"),
            (UNIFORM, 60, 50, "GATES_PASSED", "both fit: the other gates decide"),
        ]
        for step, (lengths, tp, sp, reason, note) in enumerate(cases):
            d = self.decide(2, step, lengths, memory_budget_bytes=budget,
                            predicted_peak_bytes_tp=tp * GIB, predicted_peak_bytes_sp=sp * GIB)
            self.show(d, note)
            self.expect(d, reason, f"memory case {note!r}")

    def pin(self):
        print("\n5. Operator pin (TP group 3)")
        self.show(self.decide(3, 0, UNIFORM))
        duration = self.admin.new("google.protobuf.Duration", seconds=600)
        self.admin.call("PinMode", self.admin.new("PinModeRequest", job_id=JOB, group=3,
                                                  mode="TENSOR_PARALLEL_ONLY",
                                                  duration=duration))
        print("    PinMode: group 3 -> TP-only for 10 min")
        for step in (1, 2):
            d = self.decide(3, step, UNIFORM)
            self.show(d, "pinned")
            self.expect(d, "PINNED", "a pinned group")
        removed = self.admin.call("Unpin", self.admin.new("UnpinRequest", job_id=JOB, group=3))
        print(f"    Unpin: {removed.removed} pin removed")
        d = self.decide(3, 3, UNIFORM)
        self.show(d, "the gates decide again")
        self.expect(d, "GATES_PASSED", "after Unpin")

    def job_view(self):
        job = self.admin.call("GetJob", job_id=JOB)
        print(f"\nGetJob {JOB}: {job.summary.group_steps_decided} group-steps decided, "
              f"{job.summary.sp_groups} group(s) now SP, {job.summary.tp_groups} TP-only, "
              f"config v{job.summary.config_version}")
        print("    group  ranks  last step  mode     reason              rolling rs_wait  switches")
        for g in job.groups:
            print(f"    {g.group:5d}  {g.ranks_active:5d}  {g.last_step:9d}  {self.mode(g.mode):7s}  "
                  f"{self.reason(g.reason):18s}  "
                  f"{(f'{g.rolling_rs_wait_share:.2f}' if g.HasField('rolling_rs_wait_share') else '-'):>15s}  "
                  f"{g.mode_switches:8d}")

    def metrics(self):
        samples = sr.scrape(self.daemon.metrics_port)
        counts = {(s[1]["mode"], s[1]["reason"]): int(s[2]) for s in samples
                  if s[0] == "spgate_decisions_total" and s[1].get("job_id") == JOB}
        print(f"\nspgate_decisions_total{{job_id=\"{JOB}\"}} from "
              f"http://127.0.0.1:{self.daemon.metrics_port}/metrics")
        print("    reason               sp  tp_only")
        reasons = sorted({r for _, r in counts}, key=lambda r: (
            EXPECTED.index(r.upper()) if r.upper() in EXPECTED else 99, r))
        for r in reasons:
            print(f"    {r:18s} {counts.get(('sp', r), 0):4d} {counts.get(('tp_only', r), 0):8d}")
        print(f"    {'total':18s} {sum(c for (m, _), c in counts.items() if m == 'sp'):4d} "
              f"{sum(c for (m, _), c in counts.items() if m == 'tp_only'):8d}")
        fired = {r.upper() for (_, r), c in counts.items() if c > 0}
        missing = [r for r in EXPECTED if r not in fired]
        if missing:
            self.failures.append(f"reasons that never fired: {', '.join(missing)}")
        label = {"SP": "sp", "TP-only": "tp_only"}
        seen = {(label[m], r.lower()): c for (m, r), c in self.seen.items()}
        nonzero = {k: v for k, v in counts.items() if v > 0}
        if nonzero != seen:
            self.failures.append(f"/metrics {nonzero} disagrees with the decisions the job "
                                 f"received {seen}")
        threshold = [s[2] for s in samples if s[0] == "spgate_gate_threshold"
                     and s[1].get("job_id") == JOB and s[1].get("gate") == "max_length_cv"]
        if threshold:
            print(f"    spgate_gate_threshold{{job_id=\"{JOB}\",gate=\"max_length_cv\"}} "
                  f"{threshold[0]:g}")

    def close(self):
        for rank in self.ranks:
            rank.close()
        self.gate.channel.close()
        self.admin.channel.close()


class Rank:
    """One worker rank: Register, then a Connect stream driven message by message."""

    def __init__(self, demo, group, rank, size):
        self.demo, self.gate = demo, demo.gate
        self.group, self.rank = group, rank
        reg = self.gate.call("Register", job_id=JOB, incarnation=INCARNATION, launch_credential=LAUNCH_CREDENTIAL, group=group,
                             rank_in_group=rank,
                             group_size=size, global_rank=group * size + rank,
                             host="demo-host", memory_budget_bytes=80 * GIB)
        self.session_id = reg.session_id
        self.stream = self.gate.bidi("Connect", timeout=60)
        self.decisions, self.rejections, self.config_updates = {}, {}, []
        self.telemetry_sent = 0
        self.acked = -1
        # The first message names the session; its heartbeat's ack says we are attached.
        self.stream.send(self._message(heartbeat=True))
        self._await(lambda: self.acked >= 0, "the Connect stream to attach")

    def _message(self, plans=(), telemetry=(), heartbeat=False):
        msg = self.gate.new("WorkerMessage", session_id=self.session_id, plans=list(plans),
                            telemetry=list(telemetry))
        if heartbeat:
            msg.heartbeat.telemetry_sent = self.telemetry_sent
        return msg

    def _await(self, done, what):
        while not done():
            try:
                msg = self.stream.recv(RECV_TIMEOUT)
            except TimeoutError:
                raise DemoError(f"group {self.group} rank {self.rank}: no reply within "
                                f"{RECV_TIMEOUT} s waiting for {what}") from None
            if msg is None:
                raise DemoError(f"group {self.group} rank {self.rank}: the daemon ended the "
                                f"stream while we waited for {what}")
            for d in msg.decisions:
                self.decisions[d.step] = d
            for r in msg.rejections:
                self.rejections[r.step] = r
            if msg.HasField("config_update"):
                self.config_updates.append(msg.config_update)
            if msg.HasField("ack"):
                self.acked = msg.ack.telemetry_received

    def plan(self, step, lengths):
        self.stream.send(self._message(plans=[self.gate.new(
            "BatchPlan", job_id=JOB, group=self.group, step=step, lengths=lengths)]))
        self._await(lambda: step in self.decisions or step in self.rejections,
                    f"the decision for step {step}")
        if step in self.rejections:
            raise DemoError(f"step {step} refused: {self.rejections[step].message}")
        return self.decisions[step]

    def report(self, decision, rs_share, lengths):
        """Telemetry for a step this rank ran; returns once the daemon has counted it."""
        step_time = 1.2
        self.telemetry_sent += 1
        t = self.gate.new("StepTelemetry", job_id=JOB, group=self.group,
                          rank_in_group=self.rank, step=decision.step, mode=decision.mode,
                          reason=decision.reason, step_time_s=step_time,
                          rs_wait_s=rs_share * step_time, all_gather_s=0.02 * step_time,
                          norm_stall_s=0.0, effective_tokens=sum(lengths), padding_tokens=0,
                          peak_memory_bytes=(52 if self.demo.mode(decision.mode) == "SP"
                                             else 64) * GIB)
        self.stream.send(self._message(telemetry=[t], heartbeat=True))
        self._await(lambda: self.acked >= self.telemetry_sent,
                    f"the daemon to count step {decision.step}'s telemetry")

    def await_config(self, version):
        self._await(lambda: any(u.config.effective_version >= version
                                for u in self.config_updates),
                    f"the config update to v{version}")
        return [u for u in self.config_updates if u.config.effective_version >= version][0]

    def close(self):
        code = self.stream.close(RECV_TIMEOUT)
        if code != grpc.StatusCode.OK:
            raise DemoError(f"group {self.group} rank {self.rank}: stream ended with {code}")


class TpGroup:
    """A TP group: the leader asks, every rank reports how the step went."""

    def __init__(self, demo, group, size):
        self.demo = demo
        self.ranks = [Rank(demo, group, r, size) for r in range(size)]
        demo.ranks += self.ranks
        self.leader = self.ranks[0]

    def step(self, step, lengths, rs_shares):
        decision = self.leader.plan(step, lengths)
        sp = self.demo.mode(decision.mode) == "SP"
        # Followers first, so the leader's report completes the step before its next plan.
        # Only SP steps have a reduce-scatter to wait in.
        for rank in reversed(self.ranks):
            rank.report(decision, rs_shares[rank.rank] if sp else 0.0, lengths)
        return decision


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spgated", required=True, help="path to the spgated binary")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(90, exit=True)  # bounded, whatever hangs

    tmp = tempfile.mkdtemp(prefix="spgate-demo-")
    config_path = os.path.join(tmp, "gates.textproto")
    with open(config_path, "w") as f:
        f.write(DEMO_CONFIG)
    daemon = sr.SpgatedProcess(args.spgated, state_dir=os.path.join(tmp, "state"),
                               config=config_path)
    try:
        daemon.start()
        print(f"spgated is serving on loopback: worker API :{daemon.worker_port}, admin API "
              f":{daemon.admin_port}, metrics :{daemon.metrics_port}; state in {tmp}/state")
        demo = Demo(daemon)
        cfg = demo.config()
        print(f"gates: max_length_cv {cfg.max_length_cv:.2f}, max_rs_wait_share "
              f"{cfg.max_rs_wait_share:.2f} (margin {cfg.rs_wait_reenable_margin:.2f}), "
              f"memory_headroom {cfg.memory_headroom:.2f}; demo windows: window_steps "
              f"{cfg.window_steps}, probe_interval_steps {cfg.probe_interval_steps}, "
              f"min_dwell_steps {cfg.min_dwell_steps}")
        demo.bucketing_and_threshold_change()
        demo.reduce_scatter_wait()
        demo.memory()
        demo.pin()
        demo.job_view()
        demo.metrics()
        demo.close()
        failures = demo.failures
        rc = daemon.terminate(timeout=15)
        print(f"\nSIGTERM: spgated drained and exited with status {rc}")
        if rc != 0:
            failures.append(f"spgated exited with {rc} after SIGTERM:\n{daemon.stderr_text}")
    except Exception as e:  # noqa: BLE001 -- any failure ends the demo with the daemon's log
        if isinstance(e, grpc.RpcError):
            details = f"{e.code()}: {e.details()}"
        elif isinstance(e, (DemoError, TimeoutError)):
            details = str(e)
        else:
            details = traceback.format_exc()
        print(f"\ndemo FAILED: {details}\n--- spgated stderr ---\n{daemon.stderr_text}",
              file=sys.stderr)
        return 1
    finally:
        daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("\ndemo FAILED:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print("demo OK: every reason of the static gates and the pin fired, "
          "/metrics agrees with the decisions received, and the threshold change took "
          "effect where announced.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
