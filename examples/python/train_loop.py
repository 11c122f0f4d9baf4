#!/usr/bin/env python3
"""A plain training loop driving spgate through its C API with ctypes (standard library
only). One process plays one TP group of --tp ranks, each rank a thread. The group has one
session (the client option group_session, the default): only the leader (rank 0) has a
spgate client, and the other ranks make their decider without one. The group's broadcast
and max-reduce are in-memory ones written in Python and handed to libspgate_client.so as
callbacks — in a real trainer they would wrap torch.distributed.broadcast and all_reduce
(MAX) on the TP group (see docs/client.md). With --per_rank_sessions every rank has a
client of its own (group_session "false"), and reports its own telemetry through it.

Per step, as docs/design.md §4 asks: the leader submits the plan for step n+1 while step n
"runs", every rank calls decide(n) (the leader asks the daemon, everyone receives the
leader's answer), runs the step in that mode, logs it, and reports telemetry: every rank
gives its record to spgate_decider_report_telemetry, which reduces the group's records
(each value's maximum) into the leader, which sends one record for the group. The leader
waits for the daemon's answer at most the deadline (--deadline_ms; on a loaded host,
scheduling can add a few ms before the local decision runs): without a daemon (or with
--controller empty) the local policy decides.

    python3 examples/python/train_loop.py --lib build/lib/libspgate_client.so \
        --controller 127.0.0.1:50061 --tp 2 --steps 100

Against a daemon with TLS, add the worker's flags (docs/security.md): --tls_ca (mTLS:
also --tls_cert and --tls_key; --tls_server_name when the address is not the name in the
daemon's certificate). They become the C API options of the same names.

The launch's credential (docs/design.md §10) is SPGATE_LAUNCH_CREDENTIAL, or
--launch_credential, or one this process makes with spgate_new_launch_credential: the
ranks here are threads of one process, the whole "job", so that is world rank 0 making it
and every rank receiving it. (A flag is visible to other users in `ps`; prefer the
variable.)

Prints a JSON summary; exits 1 if ranks of the group ever ran different modes, 2 on a
usage error or when spgated refuses the client (a worker token or launch credential it
does not accept, a Register field, an address without its worker API: the reason on
stderr, before any step). A daemon that does not answer is no error: the leader waits at
most 5 s for it before the first step and says so on stderr, every step falls back to the
local policy, and at the end each client waits at most 5 s to flush its telemetry (the
records it could not deliver are said on stderr).
"""
import argparse
import ctypes
import json
import math
import os
import random
import uuid
import sys
import threading
import time


class Decision(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("config_version", ctypes.c_int64),
                ("mode", ctypes.c_int32), ("reason", ctypes.c_int32),
                ("policy_reason", ctypes.c_int32), ("source", ctypes.c_int32)]


class Telemetry(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("mode", ctypes.c_int32), ("reason", ctypes.c_int32),
                ("step_time_s", ctypes.c_double), ("rs_wait_s", ctypes.c_double),
                ("all_gather_s", ctypes.c_double), ("norm_stall_s", ctypes.c_double),
                ("effective_tokens", ctypes.c_int64), ("padding_tokens", ctypes.c_int64),
                ("peak_memory_bytes", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    _fields_ = [("connected", ctypes.c_int32), ("registrations", ctypes.c_int64),
                ("daemon_decisions", ctypes.c_int64), ("local_decisions", ctypes.c_int64),
                ("late_decisions", ctypes.c_int64), ("telemetry_reported", ctypes.c_int64),
                ("telemetry_sent", ctypes.c_int64), ("telemetry_acked", ctypes.c_int64),
                ("telemetry_dropped", ctypes.c_int64), ("memory_overrides", ctypes.c_int64),
                ("session_replaced", ctypes.c_int32)]


BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                                ctypes.c_void_p)
REDUCE_MAX_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_double), ctypes.c_size_t,
                                 ctypes.c_int32, ctypes.c_void_p)
SP, TP_ONLY = 1, 2
# What spgate_client_wait_connected returns at once when the daemon answered no
# (spgate_client.h): SPGATE_INVALID_ARGUMENT (a Register field), SPGATE_PERMISSION_DENIED
# and SPGATE_UNAUTHENTICATED (the credential), SPGATE_UNIMPLEMENTED (no worker API there).
REFUSED = (3, 7, 12, 16)
CONNECT_TIMEOUT_MS = FLUSH_TIMEOUT_MS = 5000
# C API options and flags of this script, named as spgate-worker's TLS flags.
TLS_OPTIONS = ("tls_ca", "tls_cert", "tls_key", "tls_server_name")


def load(path):
    lib = ctypes.CDLL(path)
    c = ctypes
    sig = {
        "spgate_last_error": (c.c_char_p, []),
        "spgate_mode_name": (c.c_char_p, [c.c_int32]),
        "spgate_reason_name": (c.c_char_p, [c.c_int32]),
        "spgate_new_launch_credential": (c.c_int32, [c.c_char_p, c.c_size_t]),
        "spgate_options_create": (c.c_void_p, []),
        "spgate_options_set": (c.c_int32, [c.c_void_p, c.c_char_p, c.c_char_p]),
        "spgate_options_destroy": (None, [c.c_void_p]),
        "spgate_client_create": (c.c_int32, [c.c_void_p, c.POINTER(c.c_void_p)]),
        "spgate_client_destroy": (None, [c.c_void_p]),
        "spgate_client_report_telemetry": (c.c_int32, [c.c_void_p, c.POINTER(Telemetry)]),
        "spgate_client_flush": (c.c_int32, [c.c_void_p, c.c_int64]),
        "spgate_client_wait_connected": (c.c_int32, [c.c_void_p, c.c_int64]),
        "spgate_client_get_stats": (c.c_int32, [c.c_void_p, c.POINTER(Stats)]),
        "spgate_decider_create": (c.c_int32, [c.c_void_p, c.c_int32, BROADCAST_FN, c.c_void_p,
                                              c.POINTER(c.c_void_p)]),
        "spgate_decider_create_group": (c.c_int32, [c.c_void_p, c.c_int32, BROADCAST_FN,
                                                    REDUCE_MAX_FN, c.c_void_p,
                                                    c.POINTER(c.c_void_p)]),
        "spgate_decider_report_telemetry": (c.c_int32, [c.c_void_p, c.POINTER(Telemetry)]),
        "spgate_decider_destroy": (None, [c.c_void_p]),
        "spgate_decider_submit_plan": (c.c_int32, [c.c_void_p, c.c_int64, c.POINTER(c.c_int64),
                                                   c.c_size_t, c.c_uint64, c.c_uint64,
                                                   c.c_uint64]),
        "spgate_decider_decide": (c.c_int32, [c.c_void_p, c.c_int64, c.c_int64,
                                              c.POINTER(Decision)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class SpgateError(RuntimeError):
    pass


def check(lib, rc, what):
    if rc != 0:
        raise SpgateError("%s failed (code %d): %s" % (what, rc, lib.spgate_last_error().decode()))


class InMemoryBroadcast:
    """The k-th broadcast of every rank gets the root's k-th payload, and the root's k-th
    max-reduce gets the element-wise maximum of every rank's k-th (like collectives)."""

    def __init__(self, size):
        self.size = size
        self.cond = threading.Condition()
        self.failed = False  # a rank failed: nobody waits for it (fail)
        self.calls = [0] * size
        self.slots = {}  # k -> [bytes, receivers left]
        self.reduce_calls = [0] * size
        self.reduce_slots = {}  # k -> [maxima so far, ranks arrived]

    def fail(self):
        """A rank has failed and will call no more collectives: every wait, now or later,
        returns an error at once instead of waiting out its timeout for that rank."""
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def callback_for(self, rank):
        def bcast(buf, size, root, _user):
            with self.cond:
                k = self.calls[rank]
                self.calls[rank] += 1
                if rank == root:
                    self.slots[k] = [ctypes.string_at(buf, size), self.size - 1]
                    self.cond.notify_all()
                    return 0
                if not self.cond.wait_for(lambda: k in self.slots or self.failed, timeout=60) \
                        or k not in self.slots:
                    return 1
                data, left = self.slots[k]
                ctypes.memmove(buf, data, size)
                if left == 1:
                    del self.slots[k]
                else:
                    self.slots[k][1] = left - 1
                return 0
        return BROADCAST_FN(bcast)

    def reduce_callback_for(self, rank):
        def reduce_max(values, count, root, _user):
            with self.cond:
                k = self.reduce_calls[rank]
                self.reduce_calls[rank] += 1
                mine = values[:count]
                slot = self.reduce_slots.setdefault(k, [mine, 0])
                if slot[1]:
                    slot[0] = [max(a, b) for a, b in zip(slot[0], mine)]
                slot[1] += 1
                self.cond.notify_all()
                if rank != root:
                    return 0  # a contributor does not wait
                if not self.cond.wait_for(lambda: self.reduce_slots[k][1] == self.size
                                          or self.failed, timeout=60) or self.failed:
                    return 1
                for i, v in enumerate(self.reduce_slots.pop(k)[0]):
                    values[i] = v
                return 0
        return REDUCE_MAX_FN(reduce_max)


def next_batch(rng, tokens_per_batch, bucketed):
    """A batch of lognormal lengths (mean ~4096); a bucketed batch has similar lengths."""
    if bucketed:
        center = int(min(32768, max(256, rng.lognormvariate(math.log(4096) - 0.32, 0.8))))
        lengths = []
        while sum(lengths) + center <= tokens_per_batch or not lengths:
            lengths.append(max(1, int(center * rng.uniform(0.9, 1.1))))
        return lengths
    lengths = []
    while True:
        n = int(min(32768, max(16, rng.lognormvariate(math.log(4096) - 0.32, 0.8))))
        if lengths and sum(lengths) + n > tokens_per_batch:
            return lengths
        lengths.append(min(n, tokens_per_batch))


def rank_main(lib, args, rank, broadcast, plans, results, errors):
    client_error = None
    try:
        client = ctypes.c_void_p()  # NULL: a follower in the group's session has none
        if rank == 0 or args.per_rank_sessions:
            opts = lib.spgate_options_create()
            for key, value in (("controller", args.controller), ("job_id", args.job_id),
                               ("incarnation", args.incarnation),
                               ("launch_credential", args.launch_credential),
                               ("group", "0"), ("rank_in_group", str(rank)),
                               ("group_size", str(args.tp)), ("global_rank", str(rank)),
                               ("group_session", "false" if args.per_rank_sessions else "true"),
                               ("decision_deadline_ms", str(args.deadline_ms)),
                               *((name, getattr(args, name)) for name in TLS_OPTIONS
                                 if getattr(args, name))):
                check(lib, lib.spgate_options_set(opts, key.encode(), value.encode()),
                      "options " + key)
            try:
                check(lib, lib.spgate_client_create(opts, ctypes.byref(client)), "client_create")
            except SpgateError as e:
                # The decider is still made below, without a client: creating it is
                # collective, and a leader without one fails every rank of the group at
                # once (its refusal is broadcast) instead of leaving them waiting.
                client_error = e
            finally:
                lib.spgate_options_destroy(opts)
        # Keep references to the callbacks while the decider lives.
        callback = broadcast.callback_for(rank)
        decider = ctypes.c_void_p()
        if args.per_rank_sessions:
            check(lib, lib.spgate_decider_create(client, rank, callback, None,
                                                 ctypes.byref(decider)), "decider_create")
        else:
            reduce_callback = broadcast.reduce_callback_for(rank)
            check(lib, lib.spgate_decider_create_group(client, rank, callback, reduce_callback,
                                                       None, ctypes.byref(decider)),
                  "decider_create_group")
        if client_error is not None:
            raise client_error
        if args.controller and rank == 0:
            # Not required (decisions fall back locally meanwhile); it makes the demo's
            # first steps come from the daemon. A refusal ends the run before any step
            # (exit 2, like a bad flag: retrying cannot change it); a daemon that does not
            # answer is said once, as spgate-worker says it, and the steps fall back.
            status = lib.spgate_client_wait_connected(client, CONNECT_TIMEOUT_MS)
            if status in REFUSED:
                check(lib, status, "wait_connected")
            if status != 0:
                print("rank %d: %s not connected (waited at most %g s: %s); deciding locally "
                      "until it answers" % (rank, args.controller, CONNECT_TIMEOUT_MS / 1000,
                                            lib.spgate_last_error().decode()),
                      file=sys.stderr, flush=True)

        def submit(step):
            lengths = plans[step]
            arr = (ctypes.c_int64 * len(lengths))(*lengths)
            check(lib, lib.spgate_decider_submit_plan(decider, step, arr, len(lengths), 0, 0, 0),
                  "submit_plan")

        log = []
        if rank == 0:
            submit(0)
        for step in range(args.steps):
            if rank == 0 and step + 1 < args.steps:
                submit(step + 1)  # the plan for n+1 goes out while n runs
            d = Decision()
            check(lib, lib.spgate_decider_decide(decider, step, -1, ctypes.byref(d)), "decide")
            log.append((d.step, d.mode, d.reason, d.policy_reason, d.source, d.config_version))
            started = time.monotonic()
            time.sleep(args.step_ms / 1000.0)  # the step itself
            step_time = time.monotonic() - started
            t = Telemetry(step=step, mode=d.mode, reason=d.reason, step_time_s=step_time,
                          rs_wait_s=step_time * (0.05 if d.mode == SP else 0.0),
                          effective_tokens=sum(plans[step]))
            if args.per_rank_sessions:  # the rank's own record, through its own client
                check(lib, lib.spgate_client_report_telemetry(client, ctypes.byref(t)),
                      "telemetry")
            else:  # collective: one record for the group, from the leader
                check(lib, lib.spgate_decider_report_telemetry(decider, ctypes.byref(t)),
                      "telemetry")
        flushed = 0
        stats = None
        if client:
            if args.controller:
                flushed = lib.spgate_client_flush(client, FLUSH_TIMEOUT_MS)
                if flushed != 0:  # the records it could not deliver, and why
                    print("rank %d: %s" % (rank, lib.spgate_last_error().decode()),
                          file=sys.stderr, flush=True)
            stats = Stats()
            check(lib, lib.spgate_client_get_stats(client, ctypes.byref(stats)), "get_stats")
        results[rank] = {"log": log, "stats": stats, "flushed": flushed == 0}
        lib.spgate_decider_destroy(decider)
        lib.spgate_client_destroy(client)  # NULL is fine
    except Exception as e:  # reported by the main thread
        errors.append("rank %d: %s" % (rank, client_error or e))
        broadcast.fail()  # the other ranks stop waiting for this one


def at_least(minimum, kind=int):
    """An argparse type: a `kind` >= minimum, or a usage error naming the flag."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("not %s: %r" % (
                "an integer" if kind is int else "a number", text)) from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError("must be >= %s, got %s" % (minimum, text))
        return value
    return parse


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_lib = os.environ.get("SPGATE_CLIENT_LIB") or os.path.join(
        here, "..", "..", "build", "lib", "libspgate_client.so")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=default_lib, help="path to libspgate_client.so")
    p.add_argument("--controller", default="", help="spgated worker address; empty: local only")
    p.add_argument("--job_id", default="python-example")
    # One launch of the job, the same on every rank: the ranks here are threads of one
    # process, so one value made at start-up serves them all (a multi-process trainer takes
    # the launcher's run id, or has rank 0 make one and broadcast it).
    p.add_argument("--incarnation", default=os.environ.get("SPGATE_INCARNATION") or uuid.uuid4().hex)
    p.add_argument("--launch_credential", default=os.environ.get("SPGATE_LAUNCH_CREDENTIAL", ""),
                   help="the launch's secret, 16-128 printable ASCII characters; default: "
                        "SPGATE_LAUNCH_CREDENTIAL, else a new one made here")
    p.add_argument("--tp", type=at_least(1), default=2, help="ranks in the TP group (threads)")
    p.add_argument("--steps", type=at_least(1), default=50)
    p.add_argument("--step_ms", type=at_least(0, float), default=2.0,
                   help="simulated step time")
    p.add_argument("--deadline_ms", type=at_least(0), default=20)
    p.add_argument("--tokens_per_batch", type=at_least(1), default=16384)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per_rank_sessions", action="store_true",
                   help="a client and a session per rank (group_session \"false\"), each "
                        "rank reporting its own telemetry; default: one session for the group")
    p.add_argument("--tls_ca", default="", help="PEM roots that sign the daemon's certificate")
    p.add_argument("--tls_cert", default="", help="PEM client certificate (mTLS; needs --tls_key)")
    p.add_argument("--tls_key", default="", help="PEM private key of --tls_cert")
    p.add_argument("--tls_server_name", default="",
                   help="name to check in the daemon's certificate (default: host of --controller)")
    args = p.parse_args()

    lib = load(args.lib)
    if not args.launch_credential:
        buf = ctypes.create_string_buffer(33)  # SPGATE_LAUNCH_CREDENTIAL_BUFFER
        check(lib, lib.spgate_new_launch_credential(buf, len(buf)), "new_launch_credential")
        args.launch_credential = buf.value.decode()
    rng = random.Random(args.seed)
    # Every other batch unbucketed, so both modes show up.
    plans = [next_batch(rng, args.tokens_per_batch, bucketed=(s % 2 == 0))
             for s in range(args.steps)]
    broadcast = InMemoryBroadcast(args.tp)
    results, errors = [None] * args.tp, []
    threads = [threading.Thread(target=rank_main,
                                args=(lib, args, r, broadcast, plans, results, errors))
               for r in range(args.tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 2

    violations = sum(1 for s in range(args.steps)
                     if len({results[r]["log"][s][:2] for r in range(args.tp)}) > 1)
    decisions = {}
    for (_, mode, reason, _, _, _) in results[0]["log"]:
        m = lib.spgate_mode_name(mode).decode()
        r = lib.spgate_reason_name(reason).decode()
        decisions.setdefault(m, {}).setdefault(r, 0)
        decisions[m][r] += 1
    leader = results[0]["stats"]
    stats = [r["stats"] for r in results if r["stats"] is not None]  # the ranks with a client
    summary = {
        "steps": args.steps,
        "decisions": decisions,
        "daemon_decisions": leader.daemon_decisions,
        "local_decisions": leader.local_decisions,
        "memory_overrides": leader.memory_overrides,
        "consistency_violations": violations,
        "clients": len(stats),
        "telemetry_sent": sum(s.telemetry_sent for s in stats),
        "lost_telemetry": sum(s.telemetry_sent - s.telemetry_acked
                              for s in stats) if args.controller else 0,
    }
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
