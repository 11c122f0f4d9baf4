#!/usr/bin/python3
"""The adversarial campaign: hostile requests on every RPC of both services, beside a real job.

An independent client (Python grpcio, no spgate-generated code: the messages are built
from the descriptors the daemon's reflection returns, tools/demo/spgate_reflect.py) sends
at least --requests requests across every RPC of GateService and AdminService with
hostile content: NaN and Inf, negative and huge values, unknown enum values, empty and
oversized messages, lengths whose sum overflows int64, steps going backwards or far
ahead, unknown and foreign sessions, wrong and missing credentials, half-open streams,
streams that never read, a ping flood, and more streams and sessions than the limits
allow. Every request's status must equal the code the table CASES documents for it.

Meanwhile a real job (spgate-sim, 2 TP groups, the shipped C++ client) runs against the
same daemon. Checked: the daemon never exits, health stays SERVING on both ports, its
RSS (VmRSS) stays under --rss_limit_mb, the job's decisions come from the daemon (local
decisions at most --max_local_share of its steps) and it loses no telemetry, and a
SIGTERM at the end exits 0.

Short form (ctest, label integration): 10,000 requests, about 30 s on 2 cores. Long form:
bench/adversarial.sh. Loopback only; every loop is bounded in count and in time; every
process started here is killed on exit.

Run: /usr/bin/python3 adversarial_test.py --spgated=BIN --sim=BIN [--requests=N]
         [--max_seconds=S] [--rss_limit_mb=M] [--summary_json=FILE]
"""
import argparse
import collections
import faulthandler
import json
import math
import os
import random
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
OK = C.OK
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
ADMIN_TOKEN = "adv-admin-secret"
READER_TOKEN = "adv-reader-secret"
WORKER_TOKEN = "adv-worker-secret"
# The campaign's own launches' credential (docs/security.md, "Launch credentials"); the
# real job's is its own, made by spgate-sim, and the campaign never learns it.
LAUNCH_CREDENTIAL = "adv-campaign-launch-credential"
# Generous: the campaign shares two cores with the daemon, the real job and whatever else
# the machine runs; a late answer is not what this test is about (the real job's
# deadline and the daemon's own latency histogram are).
CALL_TIMEOUT = 15.0

# The daemon's limits for the campaign: small enough that the campaign reaches each.
LIMITS = {
    "max_receive_message_bytes": 1 << 20,
    "max_sequences_per_plan": 4096,
    "max_sessions_per_job": 64,
    "max_streams": 48,
    "max_watch_streams": 4,
    "max_plans_per_second": 200,        # bursts of 400
    "max_telemetry_per_second": 1000,
    "max_jobs": 256,
    "first_message_timeout": "2s",
    # A launch lets go of its job after its ranks were silent this long (the squat case).
    "stale_after": "2s",
}


def code_of(number):
    """The grpc.StatusCode with this number (a PlanRejection carries the number)."""
    for c in C:
        if c.value[0] == number:
            return c
    return C.UNKNOWN


def auth(token):
    return (("authorization", f"Bearer {token}"),)


ADMIN = auth(ADMIN_TOKEN)
READER = auth(READER_TOKEN)


class Tally:
    """Every request's expected and actual code; mismatches are kept for the report."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_expected = collections.Counter()
        self.by_case = collections.Counter()
        self.requests = 0
        self.plan_items = 0
        self.mismatches = []

    def record(self, case, expected, actual, detail=""):
        with self.lock:
            self.requests += 1
            self.by_expected[expected.name] += 1
            self.by_case[case] += 1
            if actual != expected and len(self.mismatches) < 50:
                self.mismatches.append(f"{case}: expected {expected.name}, got "
                                       f"{actual.name if actual else None}: {detail}")


def unary(tally, case, expected, service, method, request=None, metadata=None, **fields):
    try:
        reply = service.call(method, request=request, metadata=metadata, **fields)
        tally.record(case, expected, OK)
        return reply
    except grpc.RpcError as e:
        tally.record(case, expected, e.code(), e.details())
        return None


class Campaign:
    def __init__(self, args, daemon, tally, rng, name="a"):
        self.name = name          # job ids of this campaign thread start with adv-<name>-
        self.args = args
        self.d = daemon
        self.t = tally
        self.rng = rng
        self.gate = sr.connect(daemon.worker_address, "spgate.v1.GateService", CALL_TIMEOUT)
        self.admin = sr.connect(daemon.admin_address, "spgate.v1.AdminService", CALL_TIMEOUT)
        # [job, group, session, next step, plans sent, telemetry records acknowledged]
        self.sessions = []
        self.next_job = 0
        self.next_leader = 0

    @property
    def d0(self):
        return f"adv-{self.name}-d0"

    # --- helpers -----------------------------------------------------------------------

    def register(self, case, expected, metadata=None, **fields):
        defaults = dict(job_id="adv-w", incarnation="adv-1", group=0, rank_in_group=0,
                        group_size=1, global_rank=0, host="adversary",
                        launch_credential=LAUNCH_CREDENTIAL)
        defaults.update(fields)
        return unary(self.t, case, expected, self.gate, "Register", metadata=metadata,
                     **defaults)

    def leader(self):
        """A leader session with room under the plan rate (a fresh one every 300 plans)."""
        if not self.sessions or self.sessions[-1][4] >= 300:
            job = f"adv-{self.name}-d{self.next_leader % 8}"
            group = self.next_leader // 8
            self.next_leader += 1
            reply = self.register("Register/valid leader", OK, job_id=job, group=group)
            self.sessions.append([job, group, reply.session_id, 0, 0, 0])
        return self.sessions[-1]

    def plan(self, job, group, step, lengths, **fields):
        return self.gate.new("BatchPlan", job_id=job, group=group, step=step,
                             lengths=lengths, **fields)

    def decide(self, case, expected, s, plan, session_id=None, metadata=None):
        s[4] += 1
        req = self.gate.new("DecideRequest", session_id=s[2] if session_id is None else session_id,
                            plan=plan)
        self.t.plan_items += 1
        return unary(self.t, case, expected, self.gate, "Decide", request=req, metadata=metadata)

    # --- GateService ---------------------------------------------------------------------

    def register_cases(self):
        r = self.register
        r("Register/empty message", C.INVALID_ARGUMENT, job_id="", incarnation="", group_size=0)
        r("Register/job_id too long", C.INVALID_ARGUMENT, job_id="j" * 200)
        r("Register/job_id bad characters", C.INVALID_ARGUMENT, job_id="a b/\u00e9")
        r("Register/reserved job_id", C.INVALID_ARGUMENT, job_id="_default")
        r("Register/no incarnation", C.INVALID_ARGUMENT, incarnation="")
        r("Register/incarnation with NUL", C.INVALID_ARGUMENT, incarnation="a\x00b")
        r("Register/group_size 0", C.INVALID_ARGUMENT, group_size=0)
        r("Register/group_size negative", C.INVALID_ARGUMENT, group_size=-5)
        r("Register/group_size huge", C.INVALID_ARGUMENT, group_size=2**31 - 1)
        r("Register/rank outside group", C.INVALID_ARGUMENT, rank_in_group=3, group_size=2)
        r("Register/rank negative", C.INVALID_ARGUMENT, rank_in_group=-1, group_size=2)
        r("Register/global_rank negative", C.INVALID_ARGUMENT, global_rank=-7)
        r("Register/group negative", C.INVALID_ARGUMENT, group=-1)
        r("Register/group past --max_groups_per_job", C.INVALID_ARGUMENT, group=2**31 - 1)
        r("Register/huge budget, host at its 255-character maximum", OK, job_id="adv-huge",
          memory_budget_bytes=UINT64_MAX, host="h" * 255)
        r("Register/host past 255 characters", C.INVALID_ARGUMENT, job_id="adv-huge",
          host="h" * 10000)
        r("Register/hardware_id past 128 characters", C.INVALID_ARGUMENT, job_id="adv-huge",
          hardware_id="h" * 10000)
        r("Register/hardware_id not printable", C.INVALID_ARGUMENT, job_id="adv-huge",
          hardware_id="H200\x00\x1b[2J")
        # A seat in a launch needs the launch's credential.
        r("Register/no launch credential", C.UNAUTHENTICATED, job_id="adv-huge",
          launch_credential="")
        r("Register/launch credential too short", C.INVALID_ARGUMENT, job_id="adv-huge",
          launch_credential="short")
        r("Register/launch credential with a space", C.INVALID_ARGUMENT, job_id="adv-huge",
          launch_credential="a credential with spaces")
        r("Register/wrong launch credential", C.PERMISSION_DENIED, job_id="adv-huge",
          launch_credential="guessed-guessed-guessed-0000")

    def decide_cases(self):
        s = self.leader()
        job, group, sid = s[0], s[1], s[2]
        step = s[3]
        d = self.decide
        d("Decide/valid", OK, s, self.plan(job, group, step, [512, 4096, 128]))
        d("Decide/retry is idempotent", OK, s, self.plan(job, group, step, [512, 4096, 128]))
        # A decided step answers only the plan it was decided for: one without the memory
        # facts (or with other lengths) is refused, never answered from the cache.
        d("Decide/another plan for a decided step", C.ALREADY_EXISTS, s,
          self.plan(job, group, step, [7]))
        d("Decide/the decided plan with other memory facts", C.ALREADY_EXISTS, s,
          self.plan(job, group, step, [512, 4096, 128], memory_budget_bytes=80 << 30,
                    predicted_peak_bytes_tp=79 << 30, predicted_peak_bytes_sp=50 << 30))
        d("Decide/huge memory predictions", OK, s,
          self.plan(job, group, step + 2, [1024, 1024], predicted_peak_bytes_sp=UINT64_MAX,
                    predicted_peak_bytes_tp=UINT64_MAX, memory_budget_bytes=UINT64_MAX))
        d("Decide/step backwards, never decided", C.INVALID_ARGUMENT, s,
          self.plan(job, group, step + 1, [64]))
        d("Decide/step negative", C.INVALID_ARGUMENT, s, self.plan(job, group, -(2**62), [64]))
        d("Decide/step far ahead", C.INVALID_ARGUMENT, s, self.plan(job, group, step + 10**9, [64]))
        d("Decide/step INT64_MAX", C.INVALID_ARGUMENT, s, self.plan(job, group, INT64_MAX, [64]))
        nxt = step + 3
        d("Decide/no lengths", C.INVALID_ARGUMENT, s, self.plan(job, group, nxt, []))
        d("Decide/length 0", C.INVALID_ARGUMENT, s, self.plan(job, group, nxt, [64, 0]))
        d("Decide/length negative", C.INVALID_ARGUMENT, s, self.plan(job, group, nxt, [-64]))
        d("Decide/lengths summing past int64", C.INVALID_ARGUMENT, s,
          self.plan(job, group, nxt, [INT64_MAX, INT64_MAX, INT64_MAX]))
        d("Decide/length past 2^24", C.INVALID_ARGUMENT, s, self.plan(job, group, nxt, [2**24 + 1]))
        d("Decide/more sequences than --max_sequences_per_plan", C.RESOURCE_EXHAUSTED, s,
          self.plan(job, group, nxt, [1] * (LIMITS["max_sequences_per_plan"] + 1)))
        d("Decide/plan for another job", C.INVALID_ARGUMENT, s, self.plan("adv-foreign", group, nxt, [64]))
        d("Decide/plan for another group", C.INVALID_ARGUMENT, s,
          self.plan(job, group + 1000, nxt, [64]))
        d("Decide/unknown session", C.NOT_FOUND, s, self.plan(job, group, nxt, [64]),
          session_id="%032x" % self.rng.getrandbits(128))
        d("Decide/no session", C.UNAUTHENTICATED, s, self.plan(job, group, nxt, [64]),
          session_id="")
        d("Decide/empty plan", C.INVALID_ARGUMENT, s, self.gate.new("BatchPlan"))
        d("Decide/no plan", C.INVALID_ARGUMENT, s, None)
        d("Decide/session id of 100,000 characters", C.INVALID_ARGUMENT, s,
          self.plan(job, group, nxt, [64]), session_id="a" * 100000)
        d("Decide/valid after the refusals", OK, s, self.plan(job, group, nxt, [100, 200]))
        s[3] = nxt + 1

    def oversized_cases(self):
        s = self.leader()
        big = self.plan(s[0], s[1], s[3], [2**23] * (LIMITS["max_receive_message_bytes"] // 4 + 10))
        self.decide("Decide/message over --max_receive_message_bytes", C.RESOURCE_EXHAUSTED, s, big)
        ev = self.admin.new("EvaluateGatesRequest", lengths=list(big.lengths))
        unary(self.t, "EvaluateGates/message over --max_receive_message_bytes",
              C.RESOURCE_EXHAUSTED, self.admin, "EvaluateGates", request=ev, metadata=READER)

    def non_leader_case(self):
        job = f"adv-{self.name}-pair"
        self.register("Register/rank 0 of a pair", OK, job_id=job, group=0, group_size=2)
        r1 = self.register("Register/rank 1 of a pair", OK, job_id=job, group=0,
                           rank_in_group=1, group_size=2, global_rank=1)
        s = [job, 0, r1.session_id, 0, 0, 0]
        self.decide("Decide/from a non-leader", C.PERMISSION_DENIED, s, self.plan(job, 0, 0, [64]))

    def session_cap_cases(self):
        """Ranks of one job up to --max_sessions_per_job, then one more."""
        job = f"adv-cap{self.next_job}"
        self.next_job += 1
        cap = LIMITS["max_sessions_per_job"]
        for rank in range(cap):
            self.register("Register/rank under --max_sessions_per_job", OK, job_id=job,
                          rank_in_group=rank, group_size=1024, global_rank=rank)
        self.register("Register/rank past --max_sessions_per_job", C.RESOURCE_EXHAUSTED,
                      job_id=job, rank_in_group=cap, group_size=1024, global_rank=cap)
        # Registering an existing rank again replaces its session: always room.
        self.register("Register/a rank again", OK, job_id=job, rank_in_group=0, group_size=1024)

    def stream_cases(self):
        """Connect: hostile contents on a live stream, then the ways a stream can go wrong."""
        s = self.leader()
        job, group, sid = s[0], s[1], s[2]
        stream = self.gate.bidi("Connect", timeout=20)
        W = lambda **f: self.gate.new("WorkerMessage", **f)  # noqa: E731
        tel = lambda **f: self.gate.new("StepTelemetry", job_id=job, group=group, **f)  # noqa: E731
        nan, inf = float("nan"), float("inf")
        hostile = [
            tel(step=0, mode=1, step_time_s=nan, effective_tokens=10),
            tel(step=1, mode=1, step_time_s=inf, effective_tokens=10),
            tel(step=2, mode=1, step_time_s=0.1, rs_wait_s=-1.0),
            tel(step=3, mode=77, step_time_s=0.1),          # unknown enum value
            tel(step=-5, mode=1, step_time_s=0.1),
            tel(step=4, mode=1, step_time_s=1e308, rs_wait_s=1e308, effective_tokens=-1),
            self.gate.new("StepTelemetry", job_id="adv-foreign", group=group, step=5, mode=1,
                          step_time_s=0.1),
        ]
        # Telemetry is taken only for steps the group has decided: one for the step this
        # message decides, and none for a step it has not reached (or one far ahead).
        good = tel(step=s[3], mode=1, step_time_s=0.1, rs_wait_s=0.01, effective_tokens=128)
        hostile += [tel(step=s[3] + 1, mode=1, step_time_s=0.1, rs_wait_s=0.09,
                        effective_tokens=10),
                    tel(step=s[3] + 2000, mode=1, step_time_s=0.1, rs_wait_s=0.09,
                        effective_tokens=10)]
        hb = self.gate.new("Heartbeat")
        plans = [self.plan(job, group, s[3], [64, 64]),                 # ok
                 self.plan(job, group, -1, [64]),                        # INVALID_ARGUMENT
                 self.plan(job, group, s[3] + 1, []),                    # INVALID_ARGUMENT
                 self.plan(job, group, s[3] + 2, [1] * (LIMITS["max_sequences_per_plan"] + 1))]
        expected_rejections = [C.INVALID_ARGUMENT, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED]
        # Plans are decided before the message's telemetry is read.
        stream.send(W(session_id=sid, plans=plans, telemetry=hostile + [good], heartbeat=hb))
        self.t.plan_items += len(plans)
        s[4] += len(plans)
        acked, decisions, rejections = None, 0, []
        deadline = time.monotonic() + 5
        while (acked is None or decisions + len(rejections) < len(plans)) and \
                time.monotonic() < deadline:
            try:
                msg = stream.recv(timeout=max(0.01, deadline - time.monotonic()))
            except (TimeoutError, grpc.RpcError):
                break
            if msg is None:
                break
            if msg.HasField("ack"):
                acked = msg.ack.telemetry_received
            decisions += len(msg.decisions)
            rejections += [code_of(r.code) for r in msg.rejections]
        # The good record and the two for undecided steps are acknowledged (the ack is the
        # session's running count of records received and judged: the undecided ones are
        # refused without being lost in transit); NaN, Inf, negative, unknown enum and
        # foreign records are refused unacknowledged.
        s[5] += 3
        self.t.record("Connect/hostile telemetry, one good record acked", OK,
                      OK if acked == s[5] else C.UNKNOWN, f"acked={acked}, want {s[5]}")
        self.t.record("Connect/plans: one decided", OK, OK if decisions == 1 else C.UNKNOWN,
                      f"decisions={decisions}")
        for i, want in enumerate(expected_rejections):
            got = rejections[i] if i < len(rejections) else None
            self.t.record("Connect/plan rejection", want, got, f"rejections={rejections}")
        # Heartbeats with absurd local-decision counts are taken as they come.
        counts = [self.gate.new("LocalDecisionCount", reason=r, count=c)
                  for r, c in ((1, -5), (2, INT64_MAX), (99, 3))]
        stream.send(W(heartbeat=self.gate.new("Heartbeat", local_decisions=counts)))
        s[3] += 3
        try:
            code = stream.close(5)
        except TimeoutError:
            code = None
        self.t.record("Connect/half-close after hostile input", OK, code)

    def stream_open_cases(self):
        """How a stream can open wrong: unknown session, no session, a leader's burst."""
        for case, sid, want in (("Connect/unknown session", "%032x" % self.rng.getrandbits(128),
                                 C.NOT_FOUND),
                                ("Connect/no session", "", C.UNAUTHENTICATED)):
            stream = self.gate.bidi("Connect", timeout=10)
            stream.send(self.gate.new("WorkerMessage", session_id=sid))
            try:
                stream.recv(timeout=5)
                got = OK
            except grpc.RpcError as e:
                got = e.code()
            except TimeoutError:
                got = None
            self.t.record(case, want, got)
            try:
                stream.close(2)
            except TimeoutError:
                pass

    def oversized_stream_message_case(self):
        """One Connect message with more plans than any worker sends (4096): the stream
        ends with RESOURCE_EXHAUSTED instead of the daemon answering each."""
        s = self.leader()
        stream = self.gate.bidi("Connect", timeout=10)
        stream.send(self.gate.new("WorkerMessage", session_id=s[2], plans=[
            self.plan(s[0], s[1], s[3] + k, [64]) for k in range(4097)]))
        self.t.plan_items += 4097
        got = None
        try:
            # A leader that attaches may first get the job's learned table (ADAPTIVE's
            # fallback); the stream's end is what is checked.
            deadline = time.monotonic() + 8
            while stream.recv(timeout=max(0.01, deadline - time.monotonic())) is not None:
                pass
            got = OK
        except grpc.RpcError as e:
            got = e.code()
        except TimeoutError:
            got = None
        self.t.record("Connect/more than 4096 plans in one message", C.RESOURCE_EXHAUSTED, got)
        try:
            stream.close(2)
        except TimeoutError:
            pass

    def rate_burst_case(self):
        """One message of 600 plans from a fresh session: the burst (400) is decided, the
        rest refused with RESOURCE_EXHAUSTED (the worker decides those locally)."""
        job = f"adv-burst{self.next_job}"
        self.next_job += 1
        reply = self.register("Register/burst leader", OK, job_id=job)
        stream = self.gate.bidi("Connect", timeout=20)
        n = 600
        plans = [self.plan(job, 0, i, [64]) for i in range(n)]
        t0 = time.monotonic()
        stream.send(self.gate.new("WorkerMessage", session_id=reply.session_id, plans=plans))
        self.t.plan_items += n
        decided, refused, other = 0, 0, 0
        deadline = time.monotonic() + 10
        while decided + refused + other < n and time.monotonic() < deadline:
            try:
                msg = stream.recv(timeout=max(0.01, deadline - time.monotonic()))
            except (TimeoutError, grpc.RpcError):
                break
            if msg is None:
                break
            decided += len(msg.decisions)
            for r in msg.rejections:
                if r.code == C.RESOURCE_EXHAUSTED.value[0]:
                    refused += 1
                else:
                    other += 1
        # The bucket refills while the message is processed: allow for the time it took.
        rate = LIMITS["max_plans_per_second"]
        burst = 2 * rate
        slack = rate * (time.monotonic() - t0) + 2
        ok = burst <= decided <= burst + slack and decided + refused == n and other == 0
        self.t.record("Connect/plan burst over --max_plans_per_second", OK,
                      OK if ok else C.UNKNOWN, f"decided={decided} refused={refused} other={other}")
        # The same for telemetry: 1.5 bursts of valid records in one message; the ack
        # counts what was taken.
        tel_burst = 2 * LIMITS["max_telemetry_per_second"]
        # Step 0 over and over: it is decided, so each record is taken (and, being the
        # same rank's same step, counted once by the group).
        records = [self.gate.new("StepTelemetry", job_id=job, group=0, step=0, mode=1,
                                 step_time_s=0.1, rs_wait_s=0.01, effective_tokens=100)
                   for k in range(tel_burst * 3 // 2)]
        t0 = time.monotonic()
        stream.send(self.gate.new("WorkerMessage", telemetry=records,
                                  heartbeat=self.gate.new("Heartbeat")))
        acked = None
        deadline = time.monotonic() + 10
        while acked is None and time.monotonic() < deadline:
            try:
                msg = stream.recv(timeout=max(0.01, deadline - time.monotonic()))
            except (TimeoutError, grpc.RpcError):
                break
            if msg is None:
                break
            if msg.HasField("ack"):
                acked = msg.ack.telemetry_received
        slack = LIMITS["max_telemetry_per_second"] * (time.monotonic() - t0) + 2
        ok = acked is not None and tel_burst <= acked <= tel_burst + slack
        self.t.record("Connect/telemetry burst over --max_telemetry_per_second", OK,
                      OK if ok else C.UNKNOWN, f"acked={acked} of {len(records)}")
        try:
            stream.close(5)
        except TimeoutError:
            pass
        return decided, refused

    def stream_cap_case(self):
        """Half-open Connect streams (opened, nothing ever sent) until --max_streams
        refuses one; they are admitted when the call starts. The admitted ones are ended
        by --first_message_timeout (2 s here), freeing their slots."""
        channel = grpc.insecure_channel(self.d.worker_address)
        gate = sr.DynamicService(channel, self.gate.reflection, "spgate.v1.GateService")
        opened = time.monotonic()
        streams = [gate.bidi("Connect", timeout=30) for _ in range(LIMITS["max_streams"] + 4)]
        time.sleep(1.0)   # admitted ones stay silent; refused ones end at once
        admitted, refused, other, held = 0, 0, [], []
        for st in streams:
            try:
                st.recv(timeout=0.01)
                other.append("a message")
            except TimeoutError:
                admitted += 1
                held.append(st)
            except grpc.RpcError as e:
                if e.code() == C.RESOURCE_EXHAUSTED:
                    refused += 1
                else:
                    other.append(e.code().name)
        # Past the timeout (plus the sweeper's period), each silent stream has ended.
        expired = 0
        for st in held:
            try:
                st.recv(timeout=max(0.1, opened + 5.0 - time.monotonic()))
                other.append("a message")
            except TimeoutError:
                other.append("still open after --first_message_timeout")
            except grpc.RpcError as e:
                if e.code() == C.DEADLINE_EXCEEDED and "first_message_timeout" in (e.details() or ""):
                    expired += 1
                else:
                    other.append(e.code().name)
        for st in streams:
            st._call.cancel()
        channel.close()
        self.t.record("Connect/half-open streams past --max_streams", OK,
                      OK if refused >= 1 and admitted >= 1 and not other else C.UNKNOWN,
                      f"admitted={admitted} refused={refused} expired={expired} other={other}")
        time.sleep(0.5)   # their slots come back as the daemon sees the cancels
        return admitted, refused

    # --- launches, seats and streams (docs/security.md) ------------------------------------

    def launch_cases(self, job, incarnation):
        """What someone who knows a running job's id and launch name (a Slurm job id is
        visible to every cluster user) can do to it: nothing. They cannot start a second
        launch under the job id, the refusal does not name the running launch, and a seat
        in it needs its credential."""
        r = self.register
        try:
            self.gate.call("Register", job_id=job, incarnation="made-up-launch", group=0,
                           rank_in_group=0, group_size=2, global_rank=0, host="adversary",
                           launch_credential=LAUNCH_CREDENTIAL)
            got, details = OK, ""
        except grpc.RpcError as e:
            got, details = e.code(), e.details() or ""
        self.t.record("Register/a new launch of a running job", C.FAILED_PRECONDITION, got,
                      details)
        self.t.record("Register/the refusal names nothing the caller did not send", OK,
                      OK if incarnation not in details else C.UNKNOWN, details)
        r("Register/a seat in the running launch, no credential", C.UNAUTHENTICATED,
          job_id=job, incarnation=incarnation, group_size=2, launch_credential="")
        r("Register/a seat in the running launch, a guessed credential", C.PERMISSION_DENIED,
          job_id=job, incarnation=incarnation, group_size=2)
        r("Register/a follower's seat in the running launch, a guessed credential",
          C.PERMISSION_DENIED, job_id=job, incarnation=incarnation, group=1, rank_in_group=1,
          group_size=2, global_rank=3)

    def squat_case(self):
        """A job id registered first under a made-up launch, its stream held open and
        silent: the real launch is refused only until the squatter has been silent for
        --stale_after (2 s here), then takes the job."""
        job = f"adv-{self.name}-squat"
        squat = self.register("Register/squatter", OK, job_id=job, incarnation="squatter")
        stream = self.gate.bidi("Connect", timeout=15)
        stream.send(self.gate.new("WorkerMessage", session_id=squat.session_id,
                                  heartbeat=self.gate.new("Heartbeat")))
        try:
            stream.recv(timeout=5)
        except (TimeoutError, grpc.RpcError):
            pass
        self.register("Register/real launch while the squatter was just heard from",
                      C.FAILED_PRECONDITION, job_id=job, incarnation="slurm-4711.0")
        time.sleep(3.2)  # --stale_after (2 s) of silence on the open stream
        self.register("Register/real launch once the squatter is silent", OK, job_id=job,
                      incarnation="slurm-4711.0")
        try:
            stream.close(2)
        except TimeoutError:
            pass

    def one_stream_per_session_case(self):
        """Three Connect streams on one session: each new one ends the one before it
        (ABORTED, "session replaced"), so one session holds one stream slot."""
        s = self.leader()
        streams, aborted = [], 0
        for _ in range(3):
            st = self.gate.bidi("Connect", timeout=10)
            st.send(self.gate.new("WorkerMessage", session_id=s[2],
                                  heartbeat=self.gate.new("Heartbeat")))
            try:
                st.recv(timeout=5)   # the ack: this stream is attached
            except (TimeoutError, grpc.RpcError):
                pass
            streams.append(st)
        for st in streams[:2]:
            try:
                while st.recv(timeout=5) is not None:
                    pass
                got = OK
            except grpc.RpcError as e:
                got = e.code()
                aborted += 1 if "session replaced" in (e.details() or "") else 0
            except TimeoutError:
                got = None
            self.t.record("Connect/an older stream of the session is ended", C.ABORTED, got)
        self.t.record("Connect/ended saying the session was replaced", OK,
                      OK if aborted == 2 else C.UNKNOWN, f"aborted={aborted}")
        try:
            streams[2].close(2)
        except TimeoutError:
            pass

    def raw_cases(self):
        """Requests that do not parse are INVALID_ARGUMENT naming their message; a unary
        call that never sends its request is ended after --first_message_timeout."""
        channel = grpc.insecure_channel(self.d.worker_address)
        admin_channel = grpc.insecure_channel(self.d.admin_address)
        for ch, method, message in ((channel, "/spgate.v1.GateService/Register",
                                     "spgate.v1.RegisterRequest"),
                                    (channel, "/spgate.v1.GateService/Decide",
                                     "spgate.v1.DecideRequest"),
                                    (admin_channel, "/spgate.v1.AdminService/GetJob",
                                     "spgate.v1.GetJobRequest")):
            for label, raw in (("garbage", b"\xff\xff\xff\xff\x0f garbage"),
                               ("invalid UTF-8 in a string", b"\x0a\x02\xff\xfe")):
                call = ch.unary_unary(method)
                try:
                    call(raw, timeout=CALL_TIMEOUT, metadata=READER)
                    got, details = OK, ""
                except grpc.RpcError as e:
                    got, details = e.code(), e.details() or ""
                self.t.record(f"{method.rsplit('/', 1)[1]}/request that does not parse, "
                              f"{label}", C.INVALID_ARGUMENT, got, details)
                self.t.record(f"{method.rsplit('/', 1)[1]}/the refusal names the message", OK,
                              OK if message in details else C.UNKNOWN, details)
        # Headers and no request, the stream left open.
        release = threading.Event()

        def nothing():
            release.wait(20)
            return
            yield  # noqa: unreachable - a generator that sends nothing

        t0 = time.monotonic()
        call = channel.stream_stream("/spgate.v1.GateService/Register")(nothing(), timeout=20)
        try:
            for _ in call:
                pass
            got, details = OK, ""
        except grpc.RpcError as e:
            got, details = e.code(), e.details() or ""
        release.set()
        waited = time.monotonic() - t0
        self.t.record("Register/headers and no request", C.DEADLINE_EXCEEDED, got, details)
        self.t.record("Register/ended by the daemon within seconds", OK,
                      OK if "first_message_timeout" in details and waited < 8 else C.UNKNOWN,
                      f"{waited:.1f} s: {details}")
        channel.close()
        admin_channel.close()

    # --- AdminService --------------------------------------------------------------------

    def admin_cases(self, i):
        a = self.admin
        U = lambda case, want, method, md=ADMIN, **f: unary(  # noqa: E731
            self.t, case, want, a, method, metadata=md, **f)
        GC = lambda **f: a.new("GateConfig", **f)  # noqa: E731
        FM = lambda *paths: a.new("google.protobuf.FieldMask", paths=list(paths))  # noqa: E731
        U("GetGateConfig/no credential", C.UNAUTHENTICATED, "GetGateConfig", md=None)
        U("GetGateConfig/wrong token", C.PERMISSION_DENIED, "GetGateConfig",
          md=auth("not-the-token"))
        U("GetGateConfig/not a bearer header", C.PERMISSION_DENIED, "GetGateConfig",
          md=(("authorization", ADMIN_TOKEN),))
        U("GetGateConfig/reader", OK, "GetGateConfig", md=READER)
        U("GetGateConfig/unknown job", C.NOT_FOUND, "GetGateConfig", job_id="adv-nobody")
        U("GetGateConfig/bad job id", C.INVALID_ARGUMENT, "GetGateConfig", job_id="x" * 300)
        for name, value in (("NaN", float("nan")), ("Inf", float("inf")), ("-Inf", float("-inf")),
                            ("negative", -0.5), ("zero", 0.0), ("huge", 1e300)):
            U(f"UpdateGateConfig/max_length_cv {name}", C.INVALID_ARGUMENT, "UpdateGateConfig",
              config=GC(max_length_cv=value), update_mask=FM("max_length_cv"))
        for name, value in (("negative", -1), ("zero", 0), ("huge", INT64_MAX)):
            U(f"UpdateGateConfig/window_steps {name}", C.INVALID_ARGUMENT, "UpdateGateConfig",
              config=GC(window_steps=value), update_mask=FM("window_steps"))
        U("UpdateGateConfig/unknown mask path", C.INVALID_ARGUMENT, "UpdateGateConfig",
          config=GC(max_length_cv=0.2), update_mask=FM("no_such_field"))
        U("UpdateGateConfig/reader", C.PERMISSION_DENIED, "UpdateGateConfig", md=READER,
          config=GC(max_length_cv=0.2), update_mask=FM("max_length_cv"))
        U("UpdateGateConfig/no credential", C.UNAUTHENTICATED, "UpdateGateConfig", md=None)
        U("UpdateGateConfig/stale expected_version", C.ABORTED, "UpdateGateConfig",
          config=GC(max_length_cv=0.2), update_mask=FM("max_length_cv"),
          expected_version=12345)
        U("UpdateGateConfig/negative expected_version", C.INVALID_ARGUMENT, "UpdateGateConfig",
          config=GC(max_length_cv=0.2), update_mask=FM("max_length_cv"),
          expected_version=-12345)
        before = a.call("GetGateConfig", metadata=READER).version
        U("UpdateGateConfig/empty (changes nothing)", OK, "UpdateGateConfig")
        after = a.call("GetGateConfig", metadata=READER).version
        self.t.record("UpdateGateConfig/empty keeps the version", OK,
                      OK if after == before else C.UNKNOWN, f"{before} -> {after}")
        if i % 10 == 0:  # real changes are persisted and audited: fewer of them
            U("UpdateGateConfig/valid job override", OK, "UpdateGateConfig",
              job_id=f"adv-{self.name}-d{i % 8}", config=GC(max_length_cv=0.2 + (i % 7) / 100),
              update_mask=FM("max_length_cv"))
        U("ListJobs/reader", OK, "ListJobs", md=READER)
        U("ListJobs/no credential", C.UNAUTHENTICATED, "ListJobs", md=None)
        U("GetJob/unknown", C.NOT_FOUND, "GetJob", md=READER, job_id="adv-nobody")
        U("GetJob/empty", C.INVALID_ARGUMENT, "GetJob", md=READER, job_id="")
        U("GetJob/known", OK, "GetJob", md=READER, job_id=f"adv-{self.name}-d0")
        D = lambda s: a.new("google.protobuf.Duration", seconds=s)  # noqa: E731
        U("PinMode/unknown enum mode", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, mode=99,
          duration=D(60))
        U("PinMode/mode unspecified", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, mode=0,
          duration=D(60))
        U("PinMode/negative duration", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, mode=1,
          duration=D(-60))
        U("PinMode/duration past 7 days", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, mode=1,
          duration=D(10**11))
        if i % 10 == 0:  # a pin before the job registers is kept (pending): persisted, fewer
            U("PinMode/job not registered yet", OK, "PinMode", job_id="adv-pending", mode=1,
              duration=D(1))
        U("PinMode/group past --max_groups_per_job", C.INVALID_ARGUMENT, "PinMode",
          job_id=self.d0, group=2**31 - 1, mode=1, duration=D(60))
        U("PinMode/negative group", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, group=-1,
          mode=1, duration=D(60))
        U("PinMode/duration nanos 2e9", C.INVALID_ARGUMENT, "PinMode", job_id=self.d0, mode=1,
          duration=a.new("google.protobuf.Duration", seconds=60, nanos=2 * 10**9))
        U("PinMode/reader", C.PERMISSION_DENIED, "PinMode", md=READER, job_id=self.d0, mode=1,
          duration=D(60))
        if i % 10 == 0:
            U("PinMode/valid", OK, "PinMode", job_id=self.d0, mode=2, duration=D(1))
            U("Unpin/valid", OK, "Unpin", job_id=self.d0)
        U("Unpin/unknown job", C.NOT_FOUND, "Unpin", job_id="adv-nobody")
        U("Unpin/negative group", C.INVALID_ARGUMENT, "Unpin", job_id=self.d0, group=-1)
        U("Unpin/no credential", C.UNAUTHENTICATED, "Unpin", md=None, job_id=self.d0)
        E = lambda case, want, **f: U(case, want, "EvaluateGates", md=READER, **f)  # noqa: E731
        E("EvaluateGates/valid", OK, lengths=[512, 4096])
        E("EvaluateGates/no lengths", C.INVALID_ARGUMENT, lengths=[])
        E("EvaluateGates/lengths summing past int64", C.INVALID_ARGUMENT,
          lengths=[INT64_MAX, INT64_MAX])
        E("EvaluateGates/rs_wait_share NaN", C.INVALID_ARGUMENT, lengths=[64],
          rs_wait_share=float("nan"))
        E("EvaluateGates/rs_wait_share 7", C.INVALID_ARGUMENT, lengths=[64], rs_wait_share=7.0)
        E("EvaluateGates/config Inf", C.INVALID_ARGUMENT, lengths=[64],
          config=GC(max_rs_wait_share=float("inf")))
        E("EvaluateGates/unknown job", C.NOT_FOUND, lengths=[64], job_id="adv-nobody")
        E("EvaluateGates/group without job", C.INVALID_ARGUMENT, lengths=[64], group=3)
        H = lambda case, want, **f: U(case, want, "ListConfigHistory", md=READER, **f)  # noqa: E731
        H("ListConfigHistory/valid", OK, page_size=5)
        H("ListConfigHistory/page_size negative", C.INVALID_ARGUMENT, page_size=-1)
        H("ListConfigHistory/page_size huge", C.INVALID_ARGUMENT, page_size=2**31 - 1)
        H("ListConfigHistory/page_token garbage", C.INVALID_ARGUMENT, page_token="\u00ff" * 50)
        U("RollbackGateConfig/to_version negative", C.INVALID_ARGUMENT, "RollbackGateConfig",
          to_version=-1)
        if i % 10 == 0:  # version 0 is the startup config: a real change, fewer of them
            U("RollbackGateConfig/to_version 0", OK, "RollbackGateConfig", to_version=0)
        U("RollbackGateConfig/to_version never written", C.NOT_FOUND, "RollbackGateConfig",
          to_version=INT64_MAX)
        U("RollbackGateConfig/reader", C.PERMISSION_DENIED, "RollbackGateConfig", md=READER,
          to_version=1)
        U("ForgetJob/unknown job", C.NOT_FOUND, "ForgetJob", job_id="adv-nobody")
        U("ForgetJob/bad job id", C.INVALID_ARGUMENT, "ForgetJob", job_id="")
        U("ForgetJob/reader", C.PERMISSION_DENIED, "ForgetJob", md=READER, job_id="adv-huge")
        if i % 10 == 5:
            self.non_leader_case()  # (re)creates adv-<name>-pair
            U("ForgetJob/valid", OK, "ForgetJob", job_id=f"adv-{self.name}-pair",
              forget_operator_settings=True)

    def watch_cases(self, held):
        """WatchDecisions: streams that never read, up to the limit, then one more."""
        a = self.admin
        _, stub = a._callable("WatchDecisions", "unary_stream")
        req = a.new("WatchDecisionsRequest")
        call = stub(req, timeout=10, metadata=None)
        try:
            next(call)
            got = OK
        except grpc.RpcError as e:
            got = e.code()
        self.t.record("WatchDecisions/no credential", C.UNAUTHENTICATED, got)
        # Never read: the daemon queues (bounded) and drops the oldest.
        while len(held) < LIMITS["max_watch_streams"]:
            call = stub(req, timeout=120, metadata=READER)
            held.append(call)
            self.t.record("WatchDecisions/opened, never read", OK, OK)
        time.sleep(0.2)  # let them be admitted
        over = stub(req, timeout=10, metadata=READER)
        try:
            next(over)
            got = OK
        except grpc.RpcError as e:
            got = e.code()
        self.t.record("WatchDecisions/past --max_watch_streams", C.RESOURCE_EXHAUSTED, got)


def ping_flood_case(address, tally):
    """A client pinging every 10 ms without data: the daemon closes its connection
    (GOAWAY too_many_pings) and the long call on it ends UNAVAILABLE."""
    options = [("grpc.keepalive_time_ms", 10), ("grpc.keepalive_timeout_ms", 1000),
               ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.max_pings_without_data", 0),
               ("grpc.http2.min_time_between_pings_ms", 10)]
    channel = grpc.insecure_channel(address, options=options)
    # Health/Watch is a long server stream that carries no data while nothing changes.
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    call = watch(b"", timeout=8)
    got = None
    try:
        for _ in call:   # the first message is SERVING; then silence
            pass
        got = OK
    except grpc.RpcError as e:
        got = e.code()
    tally.record("Health.Watch/ping flood is cut off", C.UNAVAILABLE, got,
                 call.details() if hasattr(call, "details") else "")
    channel.close()


def polite_ping_case(address, tally, seconds=14.0):
    """A client pinging every 6 s without data (more often than the shipped clients' 10 s,
    less often than --min_ping_interval allows) keeps its connection: its long call runs
    until its own deadline."""
    options = [("grpc.keepalive_time_ms", 6000), ("grpc.keepalive_timeout_ms", 5000),
               ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.max_pings_without_data", 0),
               ("grpc.http2.min_time_between_pings_ms", 6000)]
    channel = grpc.insecure_channel(address, options=options)
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    call = watch(b"", timeout=seconds)
    try:
        for _ in call:
            pass
        got = OK
    except grpc.RpcError as e:
        got = e.code()
    tally.record("Health.Watch/pings every 6 s are accepted", C.DEADLINE_EXCEEDED, got)
    channel.close()


def worker_token_cases(spgated, tmp, tally):
    """A daemon that requires a worker credential: missing and wrong ones."""
    token_file = os.path.join(tmp, "worker-token")
    with open(token_file, "w") as f:
        f.write(WORKER_TOKEN + "\n")
    with sr.SpgatedProcess(spgated, extra_args=[f"--worker_token_file={token_file}"]) as d:
        gate = sr.connect(d.worker_address, "spgate.v1.GateService", CALL_TIMEOUT)
        fields = dict(job_id="adv-t", incarnation="t-1", group=0, rank_in_group=0, group_size=1,
                      launch_credential=LAUNCH_CREDENTIAL)
        for _ in range(20):
            unary(tally, "Register/no worker token", C.UNAUTHENTICATED, gate, "Register", **fields)
            unary(tally, "Register/wrong worker token", C.PERMISSION_DENIED, gate, "Register",
                  metadata=auth("nope"), **fields)
            r = unary(tally, "Register/worker token", OK, gate, "Register",
                      metadata=auth(WORKER_TOKEN), **fields)
            plan = gate.new("BatchPlan", job_id="adv-t", step=0, lengths=[64])
            unary(tally, "Decide/no worker token", C.UNAUTHENTICATED, gate, "Decide",
                  request=gate.new("DecideRequest", session_id=r.session_id if r else "x",
                                   plan=plan))
        stream = gate.bidi("Connect", timeout=5)
        stream.send(gate.new("WorkerMessage", session_id="x"))
        try:
            stream.recv(timeout=5)
            got = OK
        except grpc.RpcError as e:
            got = e.code()
        except TimeoutError:
            got = None
        tally.record("Connect/no worker token", C.UNAUTHENTICATED, got)
        assert d.proc.poll() is None, "the token daemon died"


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    faulthandler.enable()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spgated", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--max_seconds", type=float, default=40.0,
                   help="stop sending after this long even if --requests is not reached")
    p.add_argument("--rss_limit_mb", type=float, default=128.0)
    p.add_argument("--max_local_share", type=float, default=0.10,
                   help="most of the real job's steps that may be decided locally (its "
                        "deadline missed for want of CPU on a shared 2-core machine; the "
                        "daemon's own latency is checked separately)")
    p.add_argument("--summary_json", default="")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=3, help="campaign client threads")
    p.add_argument("--sim_seconds", type=float, default=15.0,
                   help="how long the real job runs (at most --max_seconds)")
    p.add_argument("--sim_deadline_ms", type=int, default=100,
                   help="the real job's decision deadline (the shipped default is 20)")
    args = p.parse_args()
    t_start = time.monotonic()
    # Never outlive ctest's timeout by hanging: a hard stop well past the budget.
    faulthandler.dump_traceback_later(args.max_seconds + 60, exit=True)
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="spgate-adv-")
    failures = []
    tally = Tally()
    sim = None
    daemon = None
    try:
        with open(os.path.join(tmp, "admin"), "w") as f:
            f.write(f"ops:{ADMIN_TOKEN}\n")
        with open(os.path.join(tmp, "reader"), "w") as f:
            f.write(f"ci:{READER_TOKEN}\n")
        extra = [f"--admin_token_file={tmp}/admin", f"--reader_token_file={tmp}/reader"]
        extra += [f"--{k}={v}" for k, v in LIMITS.items()]
        daemon = sr.SpgatedProcess(args.spgated, state_dir=os.path.join(tmp, "state"),
                                   extra_args=extra).start()
        pid = daemon.proc.pid
        rss_start = vm_rss_kib(pid)

        # The real job beside the campaign: 2 TP groups of 2, 50 steps/s each.
        sim_seconds = max(5.0, min(args.sim_seconds, args.max_seconds))
        summary_path = os.path.join(tmp, "sim.json")
        sim = subprocess.Popen(
            [args.sim, f"--controller={daemon.worker_address}", "--job_id=real-job",
             "--incarnation=real-1", "--groups=2", "--tp=2", "--steps_per_s=50",
             f"--duration={sim_seconds:.0f}s", "--threads=2", f"--summary_json={summary_path}",
             "--lengths=bimodal:short=512,long=16384,p_long=0.2",
             f"--deadline={args.sim_deadline_ms}ms"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        camp = Campaign(args, daemon, tally, rng)
        # The real job's launch, as anyone with read access (or the cluster's job list)
        # sees it; then what can be done to it without its credential.
        incarnation = ""
        wait_until = time.monotonic() + 20
        while not incarnation and time.monotonic() < wait_until:
            try:
                incarnation = camp.admin.call("GetJob", metadata=READER,
                                              job_id="real-job").summary.incarnation
            except grpc.RpcError:
                time.sleep(0.1)
        if not incarnation:
            failures.append("the real job did not register within 20 s")
        else:
            camp.launch_cases("real-job", incarnation)
        camp.squat_case()
        camp.one_stream_per_session_case()
        camp.raw_cases()
        held_watches = []
        rss_max = rss_start
        health_checks = 0
        stop_at = t_start + args.max_seconds
        camp.session_cap_cases()
        camp.non_leader_case()
        burst = camp.rate_burst_case()
        stream_cap = camp.stream_cap_case()
        camp.watch_cases(held_watches)
        pinger = threading.Thread(target=ping_flood_case, args=(daemon.admin_address, tally))
        pinger.start()
        polite = threading.Thread(target=polite_ping_case, args=(daemon.worker_address, tally))
        polite.start()
        worker_token_cases(args.spgated, tmp, tally)
        never_read = []   # Connect streams whose replies are never read
        never_read_lock = threading.Lock()
        thread_errors = []

        def run(camp):
            i = 0
            try:
                while tally.requests < args.requests and time.monotonic() < stop_at and \
                        daemon.proc.poll() is None:
                    camp.register_cases()
                    for _ in range(4):
                        camp.decide_cases()
                    camp.admin_cases(i)
                    if i % 5 == 0:
                        camp.stream_cases()
                        camp.stream_open_cases()
                    if i % 25 == 0:
                        camp.oversized_cases()
                        camp.oversized_stream_message_case()
                    if i % 10 == 0 and len(never_read) < 8:
                        # A leader that floods plans and never reads a reply.
                        # On a connection of its own, as a hostile client would be: a
                        # stream nobody reads also holds its connection's HTTP/2 window.
                        s = camp.leader()
                        own = sr.DynamicService(grpc.insecure_channel(daemon.worker_address),
                                                camp.gate.reflection, "spgate.v1.GateService")
                        st = own.bidi("Connect",
                                      timeout=max(5.0, stop_at - time.monotonic() + 5))
                        st.send(camp.gate.new("WorkerMessage", session_id=s[2], plans=[
                            camp.plan(s[0], s[1], s[3] + k, [64] * 64) for k in range(200)]))
                        s[3] += 200
                        s[4] += 200
                        tally.record("Connect/flood, never read", OK, OK)
                        with never_read_lock:
                            never_read.append(st)
                    i += 1
            except Exception as e:  # noqa: BLE001 - reported as a failure below
                import traceback
                thread_errors.append(f"campaign thread {camp.name}: {e!r}\n"
                                     f"{traceback.format_exc()}")

        threads = [threading.Thread(target=run, args=(Campaign(args, daemon, tally,
                                                               random.Random(args.seed + k),
                                                               name=f"t{k}"),))
                   for k in range(args.threads)]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            for address in (daemon.worker_address, daemon.admin_address):
                with grpc.insecure_channel(address) as ch:
                    status = sr.health_check(ch, timeout=CALL_TIMEOUT)
                health_checks += 1
                if status != sr.HEALTH_SERVING:
                    failures.append(f"health on {address} was {status} at request "
                                    f"{tally.requests}")
            rss_max = max(rss_max, vm_rss_kib(pid))
            if daemon.proc.poll() is not None:
                failures.append(f"spgated exited with {daemon.proc.returncode} during the "
                                f"campaign:\n{daemon.stderr_text[-3000:]}")
                break
            time.sleep(0.25)
        for th in threads:
            th.join(30)
        failures.extend(thread_errors)
        pinger.join(15)
        polite.join(30)
        campaign_s = time.monotonic() - t_start
        rss_max = max(rss_max, vm_rss_kib(pid))

        # The real job finishes its run.
        try:
            _, sim_err = sim.communicate(timeout=sim_seconds + 30)
        except subprocess.TimeoutExpired:
            sim.kill()
            _, sim_err = sim.communicate()
            failures.append("spgate-sim did not finish")
        sim_summary = {}
        if sim.returncode != 0:
            failures.append(f"spgate-sim exited {sim.returncode}: {sim_err[-2000:]}")
        else:
            with open(summary_path) as f:
                sim_summary = json.load(f)
        for st in never_read:
            st._call.cancel()
        for w in held_watches:
            w.cancel()

        # Verdicts.
        if tally.requests < args.requests:
            failures.append(f"only {tally.requests} requests within {args.max_seconds} s "
                            f"(wanted {args.requests})")
        if tally.mismatches:
            failures.append("statuses differ from the table:\n  " + "\n  ".join(tally.mismatches))
        if daemon.proc.poll() is not None:
            failures.append(f"spgated is gone (exit {daemon.proc.returncode})")
        for address in (daemon.worker_address, daemon.admin_address):
            with grpc.insecure_channel(address) as ch:
                if sr.health_check(ch, timeout=CALL_TIMEOUT) != sr.HEALTH_SERVING:
                    failures.append(f"health on {address} is not SERVING after the campaign")
        if rss_max > args.rss_limit_mb * 1024:
            failures.append(f"VmRSS reached {rss_max / 1024:.1f} MiB, over the bound "
                            f"{args.rss_limit_mb} MiB")
        steps = int(sim_summary.get("steps", 0))
        local = int(sim_summary.get("local_decisions", -1))
        if sim_summary:
            if steps <= 0:
                failures.append("the real job decided no steps")
            if local < 0 or local > args.max_local_share * steps:
                failures.append(f"the real job decided {local} of {steps} steps locally "
                                f"(bound {args.max_local_share:.0%})")
            if int(sim_summary.get("lost_telemetry", 1)) != 0:
                failures.append(f"the real job lost telemetry: {sim_summary.get('lost_telemetry')}")
            if int(sim_summary.get("consistency_violations", 1)) != 0:
                failures.append("the real job's ranks ran different modes")
        metrics = {}
        for name, labels, value in sr.scrape(daemon.metrics_port):
            if name == "spgate_limit_refusals_total":
                metrics[labels.get("limit")] = value
        # Where the real job's time went: the daemon's own decision latency (plan
        # received -> decision sent), from its histogram.
        buckets = sorted((float(lb["le"]), v) for n, lb, v in sr.scrape(daemon.metrics_port)
                         if n == "spgate_decision_latency_seconds_bucket")
        total = buckets[-1][1] if buckets else 0
        within = {le: v for le, v in buckets}
        daemon_latency = {
            "decisions": int(total),
            "share_within_1ms": round(within.get(0.001, 0) / total, 4) if total else None,
            "share_within_10ms": round(within.get(0.01, 0) / total, 4) if total else None,
        }
        if total and within.get(0.01, 0) / total < 0.99:
            failures.append(f"the daemon took over 10 ms for more than 1% of its decisions: "
                            f"{daemon_latency}")
        for limit in ("sessions_per_job", "sequences_per_plan", "plan_rate", "telemetry_rate",
                      "streams", "watch_streams", "items_per_message", "first_message"):
            if metrics.get(limit, 0) < 1:
                failures.append(f"spgate_limit_refusals_total{{limit=\"{limit}\"}} is "
                                f"{metrics.get(limit)}: the campaign should have reached it")
        rc = daemon.terminate(timeout=15)
        if rc != 0:
            failures.append(f"SIGTERM: spgated exited {rc}")

        report = {
            "requests": tally.requests,
            "plan_items": tally.plan_items,
            "by_expected_code": dict(sorted(tally.by_expected.items())),
            "cases": len(tally.by_case),
            "mismatches": len(tally.mismatches),
            "mismatch_details": tally.mismatches[:10],
            "campaign_seconds": round(campaign_s, 1),
            "daemon_crashes": 0 if rc == 0 else 1,
            "health_checks_serving": health_checks,
            "rss_start_mib": round(rss_start / 1024, 1),
            "rss_max_mib": round(rss_max / 1024, 1),
            "rss_limit_mib": args.rss_limit_mb,
            "plan_burst_decided_refused": list(burst),
            "half_open_streams_admitted_refused": list(stream_cap),
            "daemon_decision_latency": daemon_latency,
            "limit_refusals": metrics,
            "real_job": {k: sim_summary.get(k) for k in
                         ("steps", "local_decisions", "local_decisions_by_reason",
                          "lost_telemetry", "consistency_violations", "late_steps",
                          "decision_latency_s", "decision_latency_from_write_s")},
        }
        print(json.dumps(report, indent=2))
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump(report, f, indent=2)
    except Exception as e:  # noqa: BLE001 - report, then fail
        import traceback
        traceback.print_exc()
        failures.append(f"campaign error: {e!r}")
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        if daemon is not None:
            daemon.kill()
            if failures:
                failures.append("spgated's stderr (tail):\n" + daemon.stderr_text[-6000:])
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("FAIL:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print(f"PASS: {tally.requests} requests, every status as documented, "
          f"{time.monotonic() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
