"""The spgate Python package (spgate._spgate over the C++ client): every call, every error
path (exception class, status code, the argument named in the message), context-manager
close, the 24-byte wire, the group's telemetry reduced into the leader over a Python
reduce (128 bytes and the ranks' busy times) or each rank's own client (group_session=False), a follower's client
refused with a controller in a group session, a live spgated on loopback (daemon
decisions, telemetry acknowledged, its /metrics agreeing), TLS/mTLS against a daemon with
generated certificates, the worker token of a daemon run with --worker_token_file, a missing
incarnation or launch credential named in the error, the type stubs against the module
(by introspection), the enums' int behaviour, the GIL released while await_decision,
wait_until_connected and flush wait, close() from another thread ending those waits (and
freeing the client only after them), constructor errors that never show a secret (an int
out of its option's range shown with the range), a bad SPGATE_LAUNCH_CREDENTIAL named, the
controller address and Register's fields checked at construction, a Register the daemon
refuses for a field said at once, lengths that must be integers, and - against a scripted
daemon (fake_gated) - a TP-only answer the worker's memory gate forbids running SP,
counted and reported, and a replaced session never taken back.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated FAKE_GATED=build/tests/fake_gated \
     SPGATE_LAUNCH_CREDENTIAL=0123456789abcdef0123456789abcdef python3 tests/python/client_test.py
"""
import collections
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import spgate
    from spgate import _spgate  # the native module must be there
except ImportError as e:
    print(f"FAILED: spgate's native module is registered but does not import ({e})")
    sys.exit(1)
from daemon_util import Daemon  # noqa: E402

Mode, Reason, Source = spgate.Mode, spgate.Reason, spgate.DecisionSource
UNIFORM = [4096] * 4           # length CV 0: the gates pass -> SP
MIXED = [128, 8192, 512, 4096]  # length CV > 0.18 -> TP-only (LENGTH_CV)


class Spinner:
    """A Python thread that counts while the main thread is inside a native call, noting
    the time every 1,000 iterations. It can run inside the call's window only if the
    call released the GIL (after the call it may run anyway, so only the window's inner
    part counts)."""

    def __enter__(self):
        self.stamps, self.stop = [], False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()
        time.sleep(0.05)  # running before the call starts
        return self

    def run(self):
        n = 0
        while not self.stop:
            n += 1
            if n % 1000 == 0:
                self.stamps.append(time.monotonic())

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join(timeout=10)
        return False

    def progress_within(self, t0, t1, margin=0.1):
        """Thousands of iterations done strictly inside (t0 + margin, t1 - margin)."""
        return sum(1 for t in self.stamps if t0 + margin < t < t1 - margin)


class SpgateTestCase(unittest.TestCase):
    def assertRaisesCode(self, exc_class, code, pattern):
        ctx = self.assertRaisesRegex(exc_class, pattern)
        test = self

        class Wrapper:
            def __enter__(self):
                return ctx.__enter__()

            def __exit__(self, *exc):
                handled = ctx.__exit__(*exc)
                test.assertEqual(ctx.exception.code, code, str(ctx.exception))
                test.assertIsInstance(ctx.exception, spgate.Error)
                return handled
        return Wrapper()


class LocalClientTest(SpgateTestCase):
    """No controller: the local policy decides (source LOCAL_ONLY)."""

    def test_enums(self):
        self.assertEqual(int(Mode.SEQUENCE_PARALLEL), 1)
        self.assertEqual(int(Mode.TENSOR_PARALLEL_ONLY), 2)
        self.assertEqual(Mode.TENSOR_PARALLEL_ONLY.label, "tp_only")
        self.assertEqual([r.label for r in (Reason.GATES_PASSED, Reason.LENGTH_CV, Reason.RS_WAIT,
                                            Reason.PROBE, Reason.MEMORY_REQUIRES_SP,
                                            Reason.MEMORY_OVER_BUDGET, Reason.PINNED,
                                            Reason.CONTROLLER_UNAVAILABLE, Reason.ADAPTIVE,
                                            Reason.LENGTHS_UNKNOWN, Reason.SP_REQUIRED)],
                         ["gates_passed", "length_cv", "rs_wait", "probe", "memory_requires_sp",
                          "memory_over_budget", "pinned", "controller_unavailable", "adaptive",
                          "lengths_unknown", "sp_required"])
        self.assertEqual(int(Reason.ADAPTIVE), 9)
        self.assertEqual(Source.FALLBACK.label, "fallback")
        self.assertEqual(Source.MEMORY_OVERRIDE.label, "memory_override")
        self.assertRegex(spgate.__version__, r"^\d+\.\d+\.\d+$")

    def test_enums_are_arithmetic(self):
        """py::arithmetic(): members convert to their int (int(), operator.index, hash)
        and order among themselves; they equal members, not ints (pybind11 compares a
        C++ `enum class` strictly); the classes are not enum.IntEnum (what the stubs
        say)."""
        import enum
        import operator
        for cls, members in ((Mode, {"SEQUENCE_PARALLEL": 1, "TENSOR_PARALLEL_ONLY": 2}),
                             (Source, {"DAEMON": 1, "FALLBACK": 2, "LOCAL_ONLY": 3,
                                       "MEMORY_OVERRIDE": 4}),
                             (Reason, {"GATES_PASSED": 1, "ADAPTIVE": 9})):
            self.assertFalse(issubclass(cls, enum.Enum), cls)
            for name, value in members.items():
                m = getattr(cls, name)
                self.assertEqual((m.name, m.value, int(m), operator.index(m)),
                                 (name, value, value, value))
                self.assertTrue(m == cls(value) and not m != cls(value), f"{cls}.{name}")
                self.assertFalse(m == value, f"{cls}.{name} is not an int")
                self.assertEqual(hash(m), hash(value))
                self.assertIs(cls.__members__[name], m)
        self.assertLess(Mode.SEQUENCE_PARALLEL, Mode.TENSOR_PARALLEL_ONLY)
        # Ordered only against members of their own class (what the stubs say).
        with self.assertRaises(TypeError):
            Mode.SEQUENCE_PARALLEL < 2
        with self.assertRaises(TypeError):
            Mode.SEQUENCE_PARALLEL < Reason.GATES_PASSED
        self.assertEqual({Mode.SEQUENCE_PARALLEL: "x"}.get(Mode(1)), "x")
        self.assertEqual(["", "sp", "tp"][Mode.TENSOR_PARALLEL_ONLY], "tp")
        self.assertNotEqual(Mode.SEQUENCE_PARALLEL, Mode.TENSOR_PARALLEL_ONLY)

    def test_type_stubs_cover_the_module(self):
        """_spgate.pyi against the runtime module, by introspection: the same public
        names; per class the same public members, enum members with their values,
        read-only attributes stubbed as properties and writable ones as plain
        attributes, unhashable classes stubbed with __hash__: ClassVar[None], and every
        method's parameter names (each overload's) as the runtime signature has them."""
        import ast
        import re
        stub = os.path.join(os.path.dirname(spgate.__file__), "_spgate.pyi")
        with open(stub) as f:
            source = f.read()
        tree = ast.parse(source)
        stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        stubbed |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}
        native = {n for n in dir(_spgate) if not n.startswith("_")}
        self.assertEqual(native - stubbed, set(), "names without type hints")
        # Private (underscore) names are typing-only aliases, e.g. _TlsOptions.
        self.assertEqual({n for n in stubbed - native if not n.startswith("_")}, set(),
                         "stubs of missing names")
        self.assertFalse(hasattr(_spgate, "TlsOptions"))

        def decorated(fn, name):
            return any(isinstance(d, ast.Name) and d.id == name for d in fn.decorator_list)

        def runtime_params(fn):
            """Parameter names of each overload, from pybind11's signature lines."""
            sigs = re.findall(r"^(?:\d+\. )?\w+\((.*)\) -> ", fn.__doc__ or "", re.M)
            # The catch-all __init__(*args, **kwargs) of Client (the calls its typed
            # signature refuses) and CPython's slot wrappers are no parameters to stub.
            sigs = [s for s in sigs if not s.endswith("*args, **kwargs")]
            out = []
            for sig in sigs:
                names = [p.split(":")[0].split("=")[0].strip().lstrip("*") for p in
                         re.split(r", (?![^\[]*\])", sig)]
                out.append([n for n in names if n and n != "self"])
            return out

        checked_dunders = {"__init__", "__eq__", "__ne__", "__hash__", "__int__", "__index__",
                           "__lt__", "__le__", "__gt__", "__ge__", "__enter__", "__exit__",
                           "__members__"}
        for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            runtime = getattr(_spgate, node.name)
            if issubclass(runtime, BaseException):
                continue
            with self.subTest(cls=node.name):
                fns = [n for n in node.body if isinstance(n, ast.FunctionDef)]
                props = {f.name for f in fns if decorated(f, "property")}
                methods = {f.name for f in fns} - props
                attrs = {n.target.id: n for n in node.body if isinstance(n, ast.AnnAssign)}
                classvars = {k for k, v in attrs.items() if "ClassVar" in ast.unparse(v.annotation)}
                hinted = props | methods | set(attrs)
                public = {n for n in dir(runtime) if not n.startswith("_")}
                public |= {n for n in checked_dunders if n in runtime.__dict__
                           or (n == "__members__" and hasattr(runtime, n))}
                # A class without a constructor has only CPython's tp_init slot wrapper.
                if not (runtime.__init__.__doc__ or "").startswith("__init__("):
                    public.discard("__init__")
                if runtime.__dict__.get("__hash__", 0) is None:
                    public.add("__hash__")
                self.assertEqual(public - hinted, set(), "members without type hints")
                for name in hinted - {"__hash__"}:
                    self.assertTrue(hasattr(runtime, name), f"stub of a missing member {name}")
                for name in props:
                    attr = getattr(runtime, name)
                    self.assertIsInstance(attr, property, name)
                    self.assertIsNone(attr.fset, f"{name} is writable: stub it as an attribute")
                for name in set(attrs) - classvars:
                    attr = getattr(runtime, name)
                    self.assertTrue(isinstance(attr, property) and attr.fset is not None,
                                    f"{name} is read-only: stub it as a @property")
                if "__hash__" in attrs:
                    self.assertEqual(ast.unparse(attrs["__hash__"].annotation), "ClassVar[None]")
                    self.assertIsNone(runtime.__hash__, "stubbed unhashable but hashable")
                elif runtime.__dict__.get("__hash__", 0) is None:
                    self.fail("unhashable at runtime: stub __hash__: ClassVar[None]")
                if hasattr(runtime, "__members__"):  # a pybind11 enum
                    lines = source.splitlines()
                    stub_members = {}
                    for name in classvars - {"__members__"}:
                        m = re.search(r"# value (\d+)", lines[attrs[name].lineno - 1])
                        self.assertIsNotNone(m, f"{name}: no '# value N' comment")
                        stub_members[name] = int(m.group(1))
                    self.assertEqual(stub_members, {k: int(v) for k, v in
                                                    runtime.__members__.items()})
                by_name = {}
                for f in fns:
                    if f.name in props or f.name.startswith("__") and f.name != "__init__":
                        continue
                    a = f.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    by_name.setdefault(f.name, []).append(
                        [n for n in names if n != "self"] + ([a.vararg.arg] if a.vararg else [])
                        + ([a.kwarg.arg] if a.kwarg else []))
                    if len(by_name[f.name]) > 1:
                        self.assertTrue(all(decorated(g, "overload") for g in fns
                                            if g.name == f.name), f"{f.name}: @overload missing")
                for name, stub_sigs in by_name.items():
                    self.assertEqual(sorted(stub_sigs), sorted(runtime_params(getattr(runtime, name))),
                                     f"{node.name}.{name} parameters")

    def test_plans_decisions_and_telemetry(self):
        c = spgate.Client(job_id="local")
        self.assertTrue(c.is_leader)
        self.assertEqual((c.job_id, c.group, c.rank_in_group, c.group_size), ("local", 0, 0, 1))
        c.submit_plan(0, UNIFORM)
        c.submit_plan(spgate.BatchPlan(step=1, lengths=MIXED))
        # TP-only would need 95 of 100 bytes (> 0.9 headroom): the memory gate wants SP.
        c.submit_plan(2, MIXED, predicted_peak_bytes_sp=50, predicted_peak_bytes_tp=95,
                      memory_budget_bytes=100)
        d0 = c.await_decision(0)
        self.assertEqual((d0.step, d0.mode, d0.reason, d0.policy_reason, d0.source),
                         (0, Mode.SEQUENCE_PARALLEL, Reason.GATES_PASSED, Reason.GATES_PASSED,
                          Source.LOCAL_ONLY))
        self.assertTrue(d0.sequence_parallel)
        d1 = c.await_decision(1, timeout=0.5)
        self.assertEqual((d1.mode, d1.reason), (Mode.TENSOR_PARALLEL_ONLY, Reason.LENGTH_CV))
        self.assertFalse(d1.sequence_parallel)
        self.assertEqual(c.await_decision(1), d1)  # committed: the same answer again
        d2 = c.await_decision(2)
        self.assertEqual((d2.mode, d2.reason), (Mode.SEQUENCE_PARALLEL, Reason.MEMORY_REQUIRES_SP))
        self.assertIn("mode=sp", repr(d2))
        c.report_telemetry(spgate.StepTelemetry(step=0, mode=d0.mode, reason=d0.reason,
                                                step_time_s=0.01, rs_wait_s=0.001,
                                                effective_tokens=16384))
        c.observe_group_rs_wait_share(0, Mode.SEQUENCE_PARALLEL, 0.1)
        c.flush(timeout=1.0)  # no controller: OK at once
        s = c.stats()
        self.assertEqual((s.local_decisions, s.daemon_decisions, s.telemetry_reported,
                          s.plans_submitted, s.connected), (3, 0, 1, 3, False))
        self.assertEqual((s.memory_overrides, s.session_replaced), (0, False))
        # Printed, every field with its value.
        self.assertTrue(repr(s).startswith("ClientStats(connected=False, registrations=0, "), repr(s))
        self.assertIn("local_decisions=3, ", repr(s))
        self.assertTrue(repr(s).endswith("session_replaced=False, last_error='')"), repr(s))
        cfg = c.config_for(0)
        self.assertEqual((cfg["max_length_cv"], cfg["window_steps"], cfg["memory_headroom"]),
                         (0.18, 50, 0.9))
        # Every gate field (policy/gate_config.h's table, defaults here), the policy by name.
        self.assertEqual({k: v for k, v in cfg.items() if k == "policy" or k.startswith("adaptive_")},
                         {"policy": "STATIC", "adaptive_cv_band_width": 0.05,
                          "adaptive_tokens_band_base": 8192, "adaptive_half_life_steps": 2000,
                          "adaptive_min_samples": 8, "adaptive_margin": 0.01,
                          "adaptive_explore_share": 0.03, "adaptive_explore_floor": 0.0025,
                          "adaptive_change_threshold": 0.05, "adaptive_explore_boost_steps": 200,
                          "adaptive_flip_interval_steps": 50,
                          "adaptive_straggler_share": 0.1})
        self.assertEqual(len(cfg), 2 + 20, sorted(cfg))  # version, effective_from_step + fields
        self.assertEqual(c.take_decision_latencies(), [])
        c.close()

    def test_constructor_errors_name_the_argument(self):
        E = spgate.InvalidArgumentError
        cases = [
            (dict(group_size=0), "group_size"),
            (dict(group_size=2, rank_in_group=2), "rank_in_group"),
            (dict(group=-1), "group"),
            (dict(decision_deadline=-1.0), "decision_deadline"),
            (dict(decision_deadline=float("nan")), "decision_deadline"),
            (dict(rpc_timeout=0.0), "rpc_timeout"),
            (dict(initial_backoff=2.0, max_backoff=1.0), "initial_backoff"),
            (dict(telemetry_buffer=0), "telemetry_buffer"),
            (dict(tls={"ca": "/nonexistent/ca.pem"}), r"tls\.ca"),
            (dict(tls={"cert": __file__}), r"tls\.cert and tls\.key go together"),
            (dict(tls={"ca": os.devnull}), r"tls\.ca: .* is empty"),
            (dict(tls={"ca": None, "certificate": "c.pem"}), r'tls: unknown key "certificate"'),
            (dict(tls="ca.pem"), r"tls: must be None, a dict or an object .*; got str"),
            (dict(tls=5), r"tls: must be None, a dict .*; got int"),
            (dict(tls=object()), r"tls: a value of type object with none of the attributes "
                                 r"ca, cert"),
            (dict(tls={"ca": 5}), r"tls\.ca: must be a path \(str or os\.PathLike\) or None, "
                                  r"got int"),
            (dict(tls={"server_name": b"x"}), r"tls\.server_name: must be a str or None"),
            # Any mapping reads as a dict, a namedtuple by its fields.
            (dict(tls=types.MappingProxyType({"certificate": "c.pem"})),
             r'tls: unknown key "certificate"'),
            (dict(tls=collections.namedtuple("Tls", "ca")("/nonexistent/ca.pem")), r"tls\.ca"),
            # Register's fields, by the daemon's rules (common/registration.h).
            (dict(group_size=2000), r"group_size: must be in \[1, 1024\], got 2000"),
            (dict(global_rank=-5), r"global_rank: must be >= 0, got -5"),
            (dict(host="h" * 300), r"host: at most 255 characters, got 300"),
        ]
        for kwargs, pattern in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesCode(E, 3, pattern):
                    spgate.Client(job_id="x", **kwargs)
        with self.assertRaisesCode(E, 3, "job_id"):
            spgate.Client(job_id="", controller="127.0.0.1:1")
        # With a controller and group_session (the default) a follower has no client: the
        # leader's session speaks for the group.
        follower = dict(job_id="x", controller="127.0.0.1:1", incarnation="launch-1",
                        launch_credential="0123456789abcdef0123456789abcdef", group_size=2,
                        rank_in_group=1)
        with self.assertRaisesCode(E, 3, "rank_in_group 1: with group_session"):
            spgate.Client(**follower)
        with spgate.Client(group_session=False, **follower) as c:  # a session per rank
            self.assertFalse(c.group_session)
        with self.assertRaises(ValueError):  # InvalidArgumentError is a ValueError too
            spgate.Client(job_id="x", group_size=0)
        with self.assertRaisesRegex(TypeError, "missing the required keyword argument job_id"):
            spgate.Client()
        with self.assertRaisesRegex(TypeError, "unknown keyword argument 'no_such_option'"):
            spgate.Client(job_id="x", no_such_option=1)
        with self.assertRaisesRegex(TypeError, "takes keyword arguments only"):
            spgate.Client("x")
        # The table's conversions hold on that path too: an int for seconds, a bool's int.
        with spgate.Client(job_id="x", decision_deadline=1, rpc_timeout=3) as c:
            self.assertEqual(c.config_for(0)["window_steps"], 50)

    def test_controller_address_is_checked(self):
        cred = "0123456789abcdef0123456789abcdef"
        for controller, pattern in (
                ("127.0.0.1:85136", r'port must be a number in \[1, 65535\], got "85136"'),
                (":abc", "no host"), ("127.0.0.1", "no port"), ("127.0.0.1:0", 'got "0"'),
                ("::1:50061", r"an IPv6 address in brackets: \[::1\]:50061")):
            with self.subTest(controller=controller):
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                           r'^controller: "%s" is not host:port \(.*%s'
                                           % (re.escape(controller), pattern)):
                    spgate.Client(job_id="x", controller=controller, incarnation="launch-1",
                                  launch_credential=cred)
        for controller in ("[::1]:50061", "localhost:1", "unix:/tmp/spgated.sock"):
            with spgate.Client(job_id="x", controller=controller, incarnation="launch-1",
                               launch_credential=cred):
                pass

    def test_type_errors_never_show_a_secret(self):
        """pybind11's own message for a call no signature takes lists every argument's
        value; Client's names the keyword and the types only (docs/client.md)."""
        credential, token = spgate.new_launch_credential(), "worker-token-0123456789"
        base = dict(job_id="x", controller="127.0.0.1:1", incarnation="launch-1",
                    launch_credential=credential, worker_token=token)
        for extra, pattern in ((dict(wrker_token="x"), "unknown keyword argument 'wrker_token'; "
                                                       "did you mean 'worker_token'?"),
                               (dict(group="1"), r"^Client\(\): group must be an int \(32 bits\), "
                                                 r"got str$"),
                               (dict(decision_deadline="soon"),
                                "decision_deadline must be a number of seconds, got str"),
                               (dict(sp_required="fp8"), "sp_required must be a list of str"),
                               (dict(layout=3), "layout must be a JobLayout or None, got int")):
            with self.subTest(extra=extra):
                with self.assertRaisesRegex(TypeError, pattern) as cm:
                    spgate.Client(**base, **extra)
                self.assertNotIn(credential, str(cm.exception))
                self.assertNotIn(token, str(cm.exception))
                self.assertNotIn("Invoked with", str(cm.exception))

    def test_an_int_out_of_range_is_shown(self):
        """An int of the right type but outside its option's range is not a TypeError that
        says it got an int: InvalidArgumentError naming the keyword and the range, with
        the value (no int option is a secret)."""
        base = dict(job_id="x", controller="127.0.0.1:1", incarnation="launch-1",
                    launch_credential=spgate.new_launch_credential())
        for extra, pattern in (
                (dict(group=2**40), r"^group: 1099511627776 is out of the 32-bit range "
                                    r"\[-2147483648, 2147483647\]$"),
                (dict(global_rank=-2**31 - 1), r"^global_rank: -2147483649 is out of the "
                                               r"32-bit range"),
                (dict(memory_budget_bytes=-1), r"^memory_budget_bytes: -1 is out of the "
                                               r"unsigned 64-bit range \[0, 18446744073709551615\]$"),
                (dict(memory_budget_bytes=2**64), r"^memory_budget_bytes: 18446744073709551616 ")):
            with self.subTest(extra=extra):
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3, pattern):
                    spgate.Client(**base, **extra)

    def test_call_errors(self):
        c = spgate.Client(job_id="x")
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "step"):
            c.submit_plan(-1, UNIFORM)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "length"):
            c.submit_plan(0, [])
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "length"):
            c.submit_plan(0, [10, 0])
        # Lengths are integers: a float or a bool is named, never truncated or taken as 1.
        for bad, shown in ((["a"], "str 'a'"), ([4096, 5.7], "float 5.7"), ([True], "bool True"),
                           ([4096.0], "float 4096.0")):
            with self.subTest(lengths=bad):
                i = len(bad) - 1
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                           r"lengths\[%d\]: must be an integer, got %s"
                                           % (i, re.escape(shown))):
                    c.submit_plan(0, bad)
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3, r"lengths\[%d\]" % i):
                    spgate.BatchPlan(step=0, lengths=bad)
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3, r"lengths\[%d\]" % i):
                    spgate.MicrobatchPlan(0, bad)
        # A mapping (its keys) or a set (its own order) is no batch's lengths.
        for bad, name in (({4096: 1}, "dict"), ({4096, 512}, "set")):
            with self.subTest(lengths=name):
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                           "lengths: must be a sequence of integers .*, got "
                                           + name):
                    c.submit_plan(0, bad)
        plan = spgate.BatchPlan(step=0)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, r"lengths\[1\]"):
            plan.lengths = [1, 2.5]
        plan.lengths = (n for n in (4096, 4096))  # any iterable of integers
        self.assertEqual(plan.lengths, [4096, 4096])
        with self.assertRaisesRegex(TypeError, "incompatible"):
            c.submit_plan(0, "4096")  # a str is not a list of lengths
        for share in (float("nan"), -0.5, 1.5, float("inf")):
            with self.subTest(share=share):
                with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                           "share: must be finite and in \\[0, 1\\]"):
                    c.observe_group_rs_wait_share(0, Mode.SEQUENCE_PARALLEL, share)
        c.submit_plan(0, UNIFORM)
        with self.assertRaisesCode(spgate.Error, 6, "already submitted"):
            c.submit_plan(0, UNIFORM)
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "no plan"):
            c.await_decision(5)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "timeout"):
            c.await_decision(0, timeout=-1)
        c.await_decision(0)
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "already decided"):
            c.submit_plan(0, UNIFORM)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "step_time"):
            c.report_telemetry(spgate.StepTelemetry(step=0, mode=Mode.SEQUENCE_PARALLEL,
                                                    reason=Reason.GATES_PASSED, step_time_s=0))
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "telemetry.step"):
            c.report_telemetry(spgate.StepTelemetry(step=-1, mode=Mode.SEQUENCE_PARALLEL,
                                                    reason=Reason.GATES_PASSED, step_time_s=1))
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "no controller"):
            c.wait_until_connected(0.1)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "timeout"):
            c.flush(timeout=-2)
        c.close()

    def test_non_leader(self):
        c = spgate.Client(job_id="x", rank_in_group=1, group_size=2)  # no controller: allowed
        self.assertFalse(c.is_leader)
        self.assertTrue(c.group_session)
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "only the group leader"):
            c.submit_plan(0, UNIFORM)
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "non-leaders"):
            c.await_decision(0)
        c.report_telemetry(spgate.StepTelemetry(step=0, mode=Mode.TENSOR_PARALLEL_ONLY,
                                                reason=Reason.LENGTH_CV, step_time_s=0.5))
        # Or its fields as keywords, as the deciders take them; not both at once.
        c.report_telemetry(step=1, mode=Mode.TENSOR_PARALLEL_ONLY, reason=Reason.LENGTH_CV,
                           step_time_s=0.5, effective_tokens=64, all_reduce_s=0.1)
        self.assertEqual(c.stats().telemetry_reported, 2)
        self.assertEqual(spgate.StepTelemetry(step=1, mode=Mode.TENSOR_PARALLEL_ONLY,
                                              reason=Reason.LENGTH_CV, step_time_s=0.5,
                                              all_reduce_s=0.2).all_reduce_s, 0.2)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "telemetry.all_reduce_s"):
            c.report_telemetry(step=2, mode=Mode.TENSOR_PARALLEL_ONLY, reason=Reason.LENGTH_CV,
                               step_time_s=0.5, all_reduce_s=0.6)
        for bad, words in (((), "a spgate.StepTelemetry or its fields"),
                           (({"step": 1},), "telemetry must be a spgate.StepTelemetry, got dict")):
            with self.assertRaisesRegex(TypeError, "report_telemetry: " + words):
                c.report_telemetry(*bad)
        with self.assertRaisesRegex(TypeError, "not both"):
            c.report_telemetry(spgate.StepTelemetry(step=2, mode=Mode.TENSOR_PARALLEL_ONLY,
                                                    reason=Reason.LENGTH_CV, step_time_s=0.5),
                               step=2)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "step_time"):
            c.report_telemetry(step=2, mode=Mode.TENSOR_PARALLEL_ONLY, reason=Reason.LENGTH_CV,
                               step_time_s=0)
        c.close()

    def test_close_and_context_manager(self):
        with spgate.Client(job_id="x") as c:
            self.assertFalse(c.closed)
            c.submit_plan(0, UNIFORM)
        self.assertTrue(c.closed)
        for call in (lambda: c.submit_plan(1, UNIFORM), lambda: c.await_decision(0),
                     lambda: c.stats(), lambda: c.flush(), lambda: c.job_id):
            with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "closed"):
                call()
        c.close()  # twice is fine

    def test_close_from_another_thread_ends_its_waits(self):
        """close() while other threads wait in the client (GIL released) ends their waits
        at once with FailedPreconditionError; the client is freed when the last of them
        returns (it used to be freed under them)."""
        for _ in range(3):
            c = spgate.Client(job_id="x", controller="127.0.0.1:1")  # nothing listens
            outcomes = {}

            def wait(name, call):
                t0 = time.monotonic()
                try:
                    call()
                    outcomes[name] = ("returned", time.monotonic() - t0)
                except BaseException as e:  # noqa: B902 - what it raised is the point
                    outcomes[name] = (e, time.monotonic() - t0)
            threads = [threading.Thread(target=wait, args=(name, call)) for name, call in
                       (("wait_until_connected", lambda: c.wait_until_connected(20)),
                        ("flush", lambda: c.flush(20)))]
            for t in threads:
                t.start()
            time.sleep(0.3)
            c.close()
            self.assertTrue(c.closed)
            for t in threads:
                t.join(10)
                self.assertFalse(t.is_alive())
            for name, (outcome, seconds) in outcomes.items():
                with self.subTest(call=name):
                    self.assertIsInstance(outcome, spgate.FailedPreconditionError, outcome)
                    self.assertRegex(str(outcome), "the client is closed")
                    self.assertLess(seconds, 5.0)
            with self.assertRaisesCode(spgate.FailedPreconditionError, 9,
                                       "wait_until_connected: the client is closed"):
                c.wait_until_connected(1)

    def test_wire(self):
        d = spgate.GateDecision(step=7, mode=Mode.TENSOR_PARALLEL_ONLY, reason=Reason.LENGTH_CV,
                                source=Source.FALLBACK, config_version=3)
        w = d.to_wire()
        self.assertEqual(len(w), 24)
        self.assertEqual(spgate.GateDecision.from_wire(w), d)
        self.assertEqual(d.policy_reason, Reason.LENGTH_CV)
        with self.assertRaisesCode(spgate.UnavailableError, 14, "could not decide step 5"):
            spgate.GateDecision.from_wire(spgate.wire_failure(5, 14))
        bad = bytearray(w)
        bad[16] = 7  # mode 7
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "not a decision"):
            spgate.GateDecision.from_wire(bytes(bad))
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "24 bytes"):
            spgate.GateDecision.from_wire(b"\0" * 8)

    def test_gil_released_while_waiting_to_connect(self):
        # Nothing listens on port 1: the wait runs to its timeout.
        c = spgate.Client(job_id="x", controller="127.0.0.1:1")
        with Spinner() as spin:
            t0 = time.monotonic()
            with self.assertRaisesCode(spgate.DeadlineExceededError, 4, ""):
                c.wait_until_connected(0.5)
            t1 = time.monotonic()
        self.assertGreaterEqual(t1 - t0, 0.45)
        self.assertGreater(spin.progress_within(t0, t1), 10, "a Python thread made no progress")
        # With no stream open a decision does not wait: the fallback decides at once.
        c.submit_plan(0, MIXED)
        d = c.await_decision(0, timeout=5.0)
        self.assertEqual((d.source, d.reason, d.policy_reason),
                         (Source.FALLBACK, Reason.CONTROLLER_UNAVAILABLE, Reason.LENGTH_CV))
        c.close()


class IncarnationTest(unittest.TestCase):
    def test_missing_incarnation_is_named(self):
        """With a controller, no incarnation= and none in the environment, Client raises
        InvalidArgumentError naming `incarnation` (run in a child without the launcher
        variables the client reads: ctest sets SPGATE_INCARNATION for these tests)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("SPGATE_INCARNATION", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                            "SLURM_RESTART_COUNT", "PMIX_NAMESPACE")}
        code = """
import spgate
try:
    spgate.Client(job_id="no-incarnation", controller="127.0.0.1:1")
except spgate.InvalidArgumentError as e:
    print("refused", e.code, e)
else:
    print("accepted")
spgate.Client(job_id="given", controller="127.0.0.1:1", incarnation="launch-1").close()
print("explicit ok")
"""
        out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout)
        lines = out.stdout.splitlines()
        self.assertRegex(lines[0], r"^refused 3 .*incarnation", out.stdout)
        self.assertEqual(lines[1], "explicit ok")
        # The environment's value is taken when none is passed.
        env["SPGATE_INCARNATION"] = "from-env"
        out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(out.stdout.splitlines()[0], "accepted", out.stdout)


class LaunchCredentialTest(SpgateTestCase):
    """The launch's secret (docs/design.md §10): made from the kernel's random source, read
    only from SPGATE_LAUNCH_CREDENTIAL, required with a controller and checked, its value
    never in the message."""

    def test_new_credentials_are_32_hex_digits_and_fresh(self):
        made = [spgate.new_launch_credential() for _ in range(200)]
        for c in made:
            self.assertRegex(c, r"^[0-9a-f]{32}$")
        self.assertEqual(len(set(made)), len(made))

    def test_required_with_a_controller_and_checked(self):
        saved = os.environ.pop("SPGATE_LAUNCH_CREDENTIAL", None)
        try:
            self.assertEqual(spgate.launch_credential_from_environment(), "")
            args = dict(job_id="py-cred", controller="127.0.0.1:1", incarnation="launch-1")
            with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                       "launch_credential must be set"):
                spgate.Client(**args)
            for bad, pattern in (("too-short", r"launch_credential: must be 16 to 128 "
                                               r"characters, got 9"),
                                 ("x" * 129, "got 129"),
                                 ("secret secret secret", r"without spaces only \(character 7")):
                with self.subTest(bad=bad[:20]):
                    with self.assertRaisesCode(spgate.InvalidArgumentError, 3, pattern) as ctx:
                        spgate.Client(launch_credential=bad, **args)
                    self.assertNotIn(bad, str(ctx.exception))
            spgate.Client(launch_credential=spgate.new_launch_credential(), **args).close()
            # Without a controller nothing is sent, so nothing is needed.
            spgate.Client(job_id="py-cred").close()
            # Passed as none, the environment's is taken.
            os.environ["SPGATE_LAUNCH_CREDENTIAL"] = "from-the-wrapper-0123"
            self.assertEqual(spgate.launch_credential_from_environment(), "from-the-wrapper-0123")
            spgate.Client(**args).close()
            # A bad one from the environment is named by its variable (as spgate-worker
            # names it), never shown; one passed wins over it.
            os.environ["SPGATE_LAUNCH_CREDENTIAL"] = "short"
            with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                       r"^environment variable SPGATE_LAUNCH_CREDENTIAL: "
                                       r"launch_credential: must be 16 to 128 characters, "
                                       r"got 5$"):
                spgate.Client(**args)
            spgate.Client(launch_credential=spgate.new_launch_credential(), **args).close()
            spgate.Client(job_id="py-cred").close()  # no controller: not read
        finally:
            if saved is None:
                os.environ.pop("SPGATE_LAUNCH_CREDENTIAL", None)
            else:
                os.environ["SPGATE_LAUNCH_CREDENTIAL"] = saved


class FakeDaemon:
    """fake_gated (tests/worker/client/fake_gated.cc): the C++ tests' scripted daemon as a
    process, commanded over stdin."""

    def __init__(self, *args):
        path = os.environ.get("FAKE_GATED") or os.path.join(
            os.path.dirname(__file__), "..", "..", "build", "tests", "fake_gated")
        self.proc = subprocess.Popen([path, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("address "):
            self.stop()
            raise RuntimeError(f"fake_gated did not report its address: {line!r}")
        self.address = line.split()[1]

    def command(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stats(self):
        words = self.command("stats").split()
        out = {k: int(v) for k, v in zip(words[0:6:2], words[1:6:2])}
        out["credentials"] = words[7].split(",") if len(words) > 7 else []
        return out

    def wait_for(self, pred, timeout=10.0):
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            s = self.stats()
            if pred(s):
                return s
            time.sleep(0.02)
        return self.stats()

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class ScriptedDaemonTest(SpgateTestCase):
    CREDENTIAL = "py-credential-0123456789"

    def setUp(self):
        self.fake = FakeDaemon("--answer=tp_only")

    def tearDown(self):
        self.fake.stop()

    def client(self):
        return spgate.Client(controller=self.fake.address, job_id="py-fake",
                             launch_credential=self.CREDENTIAL, initial_backoff=0.02,
                             max_backoff=0.1)

    def test_a_tp_only_answer_over_budget_runs_sp_and_is_reported(self):
        """The daemon answers TP-only to every plan; a plan whose TP-only peak (950 of a
        1,000-byte budget, headroom 0.9) does not fit runs SP with the worker's memory-gate
        reason, counted in stats and sent in the heartbeat; one that fits runs TP-only."""
        with self.client() as c:
            c.wait_until_connected(10)
            c.submit_plan(0, MIXED, predicted_peak_bytes_sp=500, predicted_peak_bytes_tp=950,
                          memory_budget_bytes=1000)
            c.submit_plan(1, MIXED, predicted_peak_bytes_sp=500, predicted_peak_bytes_tp=800,
                          memory_budget_bytes=1000)
            d0 = c.await_decision(0, timeout=5.0)
            self.assertEqual((d0.mode, d0.reason, d0.policy_reason, d0.source),
                             (Mode.SEQUENCE_PARALLEL, Reason.MEMORY_REQUIRES_SP,
                              Reason.MEMORY_REQUIRES_SP, Source.MEMORY_OVERRIDE))
            self.assertIn("source=memory_override", repr(d0))
            d1 = c.await_decision(1, timeout=5.0)
            self.assertEqual((d1.mode, d1.source), (Mode.TENSOR_PARALLEL_ONLY, Source.DAEMON))
            s = c.stats()
            self.assertEqual((s.memory_overrides, s.daemon_decisions, s.local_decisions),
                             (1, 1, 0))
            seen = self.fake.wait_for(lambda st: st["memory_overrides"] == 1)
            self.assertEqual(seen["memory_overrides"], 1, seen)
            self.assertEqual(seen["credentials"], [self.CREDENTIAL])

    def test_a_replaced_session_is_not_taken_back(self):
        with self.client() as c:
            c.wait_until_connected(10)
            self.assertEqual(self.fake.command("replace"), "replaced")
            give_up = time.monotonic() + 10
            while not c.stats().session_replaced and time.monotonic() < give_up:
                time.sleep(0.01)
            time.sleep(0.5)  # many backoff periods: a client that reconnects would have
            s = c.stats()
            self.assertTrue(s.session_replaced)
            self.assertFalse(s.connected)
            self.assertRegex(s.last_error, r"session replaced.*not reconnecting")
            self.assertEqual(self.fake.stats()["registrations"], 1)
            self.assertEqual(self.fake.stats()["streams"], 0)
            c.submit_plan(0, MIXED)
            t0 = time.monotonic()
            d = c.await_decision(0, timeout=5.0)
            self.assertLess(time.monotonic() - t0, 0.5)
            self.assertEqual((d.source, d.reason, d.policy_reason),
                             (Source.FALLBACK, Reason.CONTROLLER_UNAVAILABLE, Reason.LENGTH_CV))
            with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "session was replaced"):
                c.flush(timeout=5.0)


def unpack_wire(buf):
    """The little-endian float64s of a telemetry wire: 16 (128 bytes), then the ranks' busy
    times."""
    return list(struct.unpack("<%dd" % (len(buf) // 8), bytes(buf)))


class NativeGroupDeciderTest(SpgateTestCase):
    """spgate.GroupDecider (the C++ decider over Python broadcast and reduce callbacks)
    without torch: its error paths, and the group's telemetry reduced into the leader.
    spgate.torch.GroupDecider is this plus torch.distributed."""

    def test_construction_errors(self):
        c = spgate.Client(job_id="x")
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "broadcast"):
            spgate.GroupDecider(c, 0, "not callable")
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "client"):
            spgate.GroupDecider(None, 0, lambda buf, root: None)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "rank_in_group"):
            spgate.GroupDecider(None, -1, lambda buf, root: None)
        other = spgate.Client(job_id="x", rank_in_group=1, group_size=2)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "created for rank 1"):
            spgate.GroupDecider(other, 0, lambda buf, root: None)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "reduce"):
            spgate.GroupDecider(c, 0, lambda buf, root: None, "not callable")
        c.close()
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "open Client"):
            spgate.GroupDecider(c, 0, lambda buf, root: None)
        other.close()
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "closed"):
            spgate.GroupDecider(other, 1, lambda buf, root: None)

    def test_a_group_session_needs_the_reduce(self):
        args = dict(job_id="x", controller="127.0.0.1:1", incarnation="launch-1",
                    launch_credential="0123456789abcdef0123456789abcdef", group_size=2)
        bcast, reduce = (lambda buf, root: None), (lambda buf, root: None)
        with spgate.Client(**args) as c:
            self.assertTrue(c.group_session)
            with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "max-reduce"):
                spgate.GroupDecider(c, 0, bcast)
            spgate.GroupDecider(c, 0, bcast, reduce)
        with spgate.Client(group_session=False, **args) as c:
            with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "group_session=false"):
                spgate.GroupDecider(c, 0, bcast, reduce)
            spgate.GroupDecider(c, 0, bcast)

    def test_close_inside_a_callback_does_not_hang(self):
        """close() on the thread a GroupDecider call holds the client on (its broadcast
        callback; a signal handler runs there too) returns at once: the client is freed
        when that call returns, and the next call says it is closed."""
        c = spgate.Client(job_id="x", group_size=2)
        closed_inside = []

        def broadcast(buf, root):
            c.close()
            closed_inside.append(c.closed)
        decider = spgate.GroupDecider(c, 0, broadcast)
        decider.submit_plan(0, MIXED)
        done = threading.Event()

        def run():
            try:
                decider.decide(0)  # what it returns after the close does not matter here
            except spgate.Error:
                pass
            finally:
                done.set()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.assertTrue(done.wait(10), "close() inside the broadcast callback hung")
        self.assertEqual(closed_inside, [True])
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "closed"):
            decider.submit_plan(1, MIXED)

    def test_the_leader_reports_the_groups_maximum(self):
        """Two ranks in one thread: the follower's reduce (a contributor) hands its 144
        bytes over (the 128-byte record and both ranks' busy times, its own in its slot);
        the leader's reduce takes the element-wise maximum into its buffer, and its client
        queues one record for the group."""
        c = spgate.Client(job_id="x", group_size=2)
        contributed, seen, busy = [], [], []

        def follower_reduce(buf, root):
            self.assertEqual((len(buf), root), (144, 0))
            contributed.append(unpack_wire(buf))
            busy.append(contributed[-1][16:])  # the leader's slot 0, its own in slot 1

        def leader_reduce(buf, root):
            seen.append(unpack_wire(buf))
            buf[:] = struct.pack("<18d", *map(max, unpack_wire(buf), contributed.pop(0)))
        leader = spgate.GroupDecider(c, 0, lambda buf, root: None, leader_reduce)
        # A follower without a Client names the group's size (its slot among the busy times).
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "group_size: a rank that "
                                   "reduces"):
            spgate.GroupDecider(None, 1, lambda buf, root: None, follower_reduce)
        follower = spgate.GroupDecider(None, 1, lambda buf, root: None, follower_reduce,
                                       group_size=2)
        sp, ok = Mode.SEQUENCE_PARALLEL, Reason.GATES_PASSED
        follower.report_telemetry(spgate.StepTelemetry(step=3, mode=sp, reason=ok,
                                                       step_time_s=0.5, peak_memory_bytes=7,
                                                       rs_wait_s=0.1))
        leader.report_telemetry(step=3, mode=sp, reason=ok, step_time_s=0.2,
                                peak_memory_bytes=9)
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0][0], 3.0)  # the step comes first
        self.assertEqual(len(seen[0]), 18)
        self.assertEqual(seen[0][16:], [0.2, 0.0])  # the leader's own, before the maximum
        self.assertEqual(len(busy), 1)
        self.assertEqual(busy[0][0], 0.0)
        self.assertAlmostEqual(busy[0][1], 0.4)  # the follower's busy time: 0.5 - 0.1
        self.assertEqual(c.stats().telemetry_reported, 1)
        # Ranks that ran different modes: the leader refuses the group's record.
        follower.report_telemetry(spgate.StepTelemetry(
            step=4, mode=Mode.TENSOR_PARALLEL_ONLY, reason=Reason.LENGTH_CV, step_time_s=0.5))
        with self.assertRaisesCode(spgate.Error, 13, "different modes"):
            leader.report_telemetry(step=4, mode=sp, reason=ok, step_time_s=0.2)
        # A refused record still takes part in the reduction: both raise.
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "step_time"):
            follower.report_telemetry(step=5, mode=sp, reason=ok, step_time_s=0.0)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "was refused"):
            leader.report_telemetry(step=5, mode=sp, reason=ok, step_time_s=0.2)
        self.assertEqual(c.stats().telemetry_reported, 1)
        self.assertEqual(contributed, [])
        c.close()
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "closed"):
            leader.report_telemetry(step=6, mode=sp, reason=ok, step_time_s=0.2)

    def test_reduce_failures_raise_internal(self):
        c = spgate.Client(job_id="x", group_size=2)
        t = spgate.StepTelemetry(step=0, mode=Mode.SEQUENCE_PARALLEL,
                                 reason=Reason.GATES_PASSED, step_time_s=0.1)

        def boom(buf, root):
            raise RuntimeError("boom")
        with self.assertRaisesCode(spgate.Error, 13, "reduce failed.*boom"):
            spgate.GroupDecider(c, 0, lambda buf, root: None, boom).report_telemetry(t)
        with self.assertRaisesCode(spgate.Error, 13, "144-byte"):
            spgate.GroupDecider(c, 0, lambda buf, root: None,
                                lambda buf, root: buf.clear()).report_telemetry(t)
        self.assertEqual(c.stats().telemetry_reported, 0)
        c.close()

    def test_per_rank_sessions_report_through_each_ranks_client(self):
        t = spgate.StepTelemetry(step=0, mode=Mode.SEQUENCE_PARALLEL,
                                 reason=Reason.GATES_PASSED, step_time_s=0.1)
        own = spgate.Client(job_id="x", rank_in_group=1, group_size=2, group_session=False)
        spgate.GroupDecider(own, 1, lambda buf, root: None).report_telemetry(t)
        self.assertEqual(own.stats().telemetry_reported, 1)
        own.close()
        # Neither the group's reduce nor a client of its own: nothing to report with.
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "neither"):
            spgate.GroupDecider(None, 1, lambda buf, root: None).report_telemetry(t)

    def test_leader_broadcasts_what_it_decided(self):
        sent = []
        c = spgate.Client(job_id="x", group_size=2)
        dec = spgate.GroupDecider(c, 0, lambda buf, root: sent.append((bytes(buf), root)))
        self.assertTrue(dec.is_leader)
        dec.submit_plan(0, MIXED)
        d = dec.decide(0)
        self.assertEqual(sent, [(d.to_wire(), 0)])
        # No plan for step 1: the leader broadcasts the failure, then raises it.
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "no plan"):
            dec.decide(1)
        self.assertEqual(sent[1][0], spgate.wire_failure(1, 9))
        c.close()
        with self.assertRaisesCode(spgate.FailedPreconditionError, 9, "closed"):
            dec.decide(2)

    def test_broadcast_failures_raise_internal(self):
        c = spgate.Client(job_id="x", group_size=2)

        def boom(buf, root):
            raise RuntimeError("boom")
        dec = spgate.GroupDecider(c, 0, boom)
        dec.submit_plan(0, UNIFORM)
        with self.assertRaisesCode(spgate.Error, 13, "broadcast failed.*boom"):
            dec.decide(0)
        dec2 = spgate.GroupDecider(None, 1, lambda buf, root: buf.clear())
        with self.assertRaisesCode(spgate.Error, 13, "24-byte"):
            dec2.decide(0)
        c.close()

    def test_follower_receives(self):
        leader_d = spgate.GateDecision(step=4, mode=Mode.TENSOR_PARALLEL_ONLY,
                                       reason=Reason.CONTROLLER_UNAVAILABLE,
                                       policy_reason=Reason.LENGTH_CV, source=Source.FALLBACK,
                                       config_version=2)
        payload = [leader_d.to_wire()]

        def receive(buf, root):
            self.assertEqual(root, 0)
            buf[:] = payload[0]
        f = spgate.GroupDecider(None, 1, receive)
        self.assertFalse(f.is_leader)
        f.submit_plan(4, UNIFORM)  # no-op on a follower
        self.assertEqual(f.decide(4), leader_d)
        with self.assertRaisesCode(spgate.Error, 13, "out of step"):
            f.decide(5)  # the leader's bytes are still for step 4
        payload[0] = spgate.wire_failure(6, 4)
        with self.assertRaisesCode(spgate.DeadlineExceededError, 4, "could not decide step 6"):
            f.decide(6)
        bad = bytearray(leader_d.to_wire())
        bad[0] = 7  # step 7
        bad[16] = 9  # mode 9
        payload[0] = bytes(bad)
        with self.assertRaisesCode(spgate.InvalidArgumentError, 3, "not a decision"):
            f.decide(7)


class InstallTest(unittest.TestCase):
    @unittest.skipUnless(os.environ.get("SPGATE_BUILD_DIR"), "SPGATE_BUILD_DIR not set")
    def test_cmake_install(self):
        with tempfile.TemporaryDirectory(prefix="spgate-install-") as prefix:
            subprocess.run(["cmake", "--install", os.environ["SPGATE_BUILD_DIR"], "--prefix", prefix,
                            "--component", "python"], check=True, timeout=120,
                           stdout=subprocess.DEVNULL)
            found = [root for root, _, files in os.walk(prefix) if "_spgate.pyi" in files]
            self.assertEqual(len(found), 1, found)
            code = ("import spgate, spgate.torch.parallel; c = spgate.Client(job_id='i'); "
                    "c.submit_plan(0, [8, 8]); print(spgate.__file__, c.await_decision(0).mode.label)")
            env = dict(os.environ, PYTHONPATH=os.path.dirname(found[0]))
            out = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60,
                                 stdout=subprocess.PIPE, text=True, cwd=prefix).stdout
            self.assertTrue(out.startswith(prefix), out)
            self.assertTrue(out.strip().endswith(" sp"), out)


class DaemonClientTest(SpgateTestCase):
    def setUp(self):
        self.daemon = Daemon()

    def tearDown(self):
        self.daemon.stop()

    def test_daemon_decisions_telemetry_and_metrics(self):
        with spgate.Client(controller=self.daemon.address, job_id="py-live") as c:
            c.wait_until_connected(10)
            self.assertTrue(c.stats().connected)
            lengths = [UNIFORM, MIXED, UNIFORM, MIXED, UNIFORM]
            for step, ls in enumerate(lengths):
                c.submit_plan(step, ls)
            got = [c.await_decision(step, timeout=5.0) for step in range(len(lengths))]
            for step, d in enumerate(got):
                self.assertEqual(d.source, Source.DAEMON, d)
                self.assertEqual(d.reason, Reason.GATES_PASSED if step % 2 == 0 else
                                 Reason.LENGTH_CV)
                c.report_telemetry(spgate.StepTelemetry(step=step, mode=d.mode, reason=d.reason,
                                                        step_time_s=0.01,
                                                        effective_tokens=sum(lengths[step])))
            c.flush(timeout=10)
            s = c.stats()
            self.assertEqual((s.daemon_decisions, s.local_decisions), (5, 0))
            self.assertEqual(s.telemetry_acked, 5)
            self.assertEqual(s.telemetry_sent, 5)
            lat = c.take_decision_latencies()
            self.assertEqual(len(lat), 5)
            # Every decision spent some time queued in the client before await_decision
            # took it, and no more than its total.
            for total, queued in lat:
                self.assertGreater(queued, 0.0, lat)
                self.assertGreaterEqual(total, queued, lat)
        self.assertEqual(self.daemon.decisions_total("py-live"),
                         {"sp": {"gates_passed": 3}, "tp_only": {"length_cv": 2}})

    def test_a_register_refused_for_a_field_is_said_at_once(self):
        # A group past the daemon's --max_groups_per_job (4096): a bound only the daemon
        # knows, so the client learns it from Register, and its waits say so at once.
        with spgate.Client(controller=self.daemon.address, job_id="py-refused",
                           group=5000) as c:
            t0 = time.monotonic()
            with self.assertRaisesCode(spgate.InvalidArgumentError, 3,
                                       r"refused this client's registration .*group: must be "
                                       r"in \[0, 4096\) \(--max_groups_per_job\), got 5000"):
                c.wait_until_connected(20)
            self.assertLess(time.monotonic() - t0, 10)

    def test_gil_released_while_flush_waits(self):
        c = spgate.Client(controller=self.daemon.address, job_id="py-gil-flush")
        c.wait_until_connected(10)
        c.submit_plan(0, UNIFORM)
        d = c.await_decision(0, timeout=5.0)
        self.assertEqual(d.source, Source.DAEMON)
        # A frozen daemon never acknowledges: flush waits for its whole timeout.
        self.daemon.freeze()
        try:
            c.report_telemetry(spgate.StepTelemetry(step=0, mode=d.mode, reason=d.reason,
                                                    step_time_s=0.01))
            with Spinner() as spin:
                t0 = time.monotonic()
                with self.assertRaisesCode(spgate.DeadlineExceededError, 4, ""):
                    c.flush(timeout=1.0)
                t1 = time.monotonic()
            acked_while_frozen = c.stats().telemetry_acked
        finally:
            self.daemon.signal(signal.SIGCONT)
        self.assertGreaterEqual(t1 - t0, 0.9)
        self.assertLess(t1 - t0, 5.0)
        self.assertGreater(spin.progress_within(t0, t1), 10, "a Python thread made no progress")
        self.assertEqual(acked_while_frozen, 0)
        c.flush(timeout=10)  # thawed: acknowledged after all
        self.assertEqual(c.stats().telemetry_acked, 1)
        c.close()

    def test_gil_released_while_await_decision_waits(self):
        c = spgate.Client(controller=self.daemon.address, job_id="py-gil")
        c.wait_until_connected(10)
        # A frozen daemon keeps the stream open but never answers: the leader waits until
        # the deadline, then falls back.
        self.daemon.freeze()
        try:
            c.submit_plan(0, UNIFORM)
            with Spinner() as spin:
                t0 = time.monotonic()
                d = c.await_decision(0, timeout=1.0)
                t1 = time.monotonic()
            # The same through GroupDecider.decide (its broadcast callback takes the GIL
            # back only to run).
            dec = spgate.GroupDecider(c, 0, lambda buf, root: None)
            dec.submit_plan(1, MIXED)
            with Spinner() as spin2:
                t2 = time.monotonic()
                d2 = dec.decide(1, timeout=1.0)
                t3 = time.monotonic()
        finally:
            self.daemon.signal(signal.SIGCONT)
        for w in (t1 - t0, t3 - t2):
            self.assertGreaterEqual(w, 0.9)
            self.assertLess(w, 5.0)
        self.assertEqual((d.source, d.reason, d.policy_reason),
                         (Source.FALLBACK, Reason.CONTROLLER_UNAVAILABLE, Reason.GATES_PASSED))
        self.assertEqual((d2.source, d2.reason, d2.policy_reason),
                         (Source.FALLBACK, Reason.CONTROLLER_UNAVAILABLE, Reason.LENGTH_CV))
        self.assertGreater(spin.progress_within(t0, t1), 10, "a Python thread made no progress")
        self.assertGreater(spin2.progress_within(t2, t3), 10, "a Python thread made no progress")
        c.close()


class WorkerTokenTest(SpgateTestCase):
    """A daemon run with --worker_token_file (the file's text, whitespace stripped, is
    the token): worker_token= right gets daemon decisions; wrong is PERMISSION_DENIED,
    missing UNAUTHENTICATED - the client never connects (wait_until_connected and flush
    raise the refusal's code at once) and decisions fall back."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="spgate-token-")
        token_file = os.path.join(self.dir, "token")
        with open(token_file, "w") as f:
            f.write("\n  py-secret-token \n")
        self.daemon = Daemon(extra_args=[f"--worker_token_file={token_file}"])

    def tearDown(self):
        self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_right_token(self):
        with spgate.Client(controller=self.daemon.address, job_id="py-token",
                           worker_token="py-secret-token") as c:
            c.wait_until_connected(10)
            c.submit_plan(0, UNIFORM)
            self.assertEqual(c.await_decision(0, timeout=5.0).source, Source.DAEMON)
        self.assertEqual(self.daemon.decisions_total("py-token"), {"sp": {"gates_passed": 1}})

    def test_wrong_or_missing_token(self):
        # The refusal ends wait_until_connected and flush at once, with its code.
        for job, token, refusal, code in (
                ("py-wrong", "py-secret-tokeN", "PERMISSION_DENIED", 7),
                ("py-none", "", "UNAUTHENTICATED", 16)):
            with self.subTest(job=job):
                with spgate.Client(controller=self.daemon.address, job_id=job,
                                   worker_token=token) as c:
                    asked = time.monotonic()
                    with self.assertRaisesCode(spgate.Error, code,
                                               f"refused .*Register: {refusal}.*worker.token"):
                        c.wait_until_connected(10)
                    with self.assertRaisesCode(spgate.Error, code, "flush: .*refused"):
                        c.flush(timeout=10)
                    self.assertLess(time.monotonic() - asked, 5.0)
                    self.assertFalse(c.stats().connected)
                    self.assertIn(refusal, c.stats().last_error)
                    c.submit_plan(0, UNIFORM)
                    d = c.await_decision(0, timeout=1.0)
                    self.assertEqual((d.source, d.reason),
                                     (Source.FALLBACK, Reason.CONTROLLER_UNAVAILABLE))
                self.assertEqual(self.daemon.decisions_total(job), {})


class TlsClientTest(unittest.TestCase):
    def setUp(self):
        # make_test_certs.sh fails without the openssl CLI (make deps installs it), and so
        # does this test: it must not pass without having tried TLS.
        self.dir = tempfile.mkdtemp(prefix="spgate-tls-")
        subprocess.run(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                             "testing", "make_test_certs.sh"), self.dir],
                       check=True, timeout=60)
        p = lambda name: os.path.join(self.dir, name)  # noqa: E731
        self.daemon = Daemon(extra_args=[f"--tls_cert={p('server.pem')}",
                                         f"--tls_key={p('server.key')}",
                                         f"--tls_client_ca={p('ca.pem')}"])
        self.p = p

    def tearDown(self):
        self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_mtls(self):
        class Tls:  # an object with attributes works as well as a dict
            ca, cert, key = self.p("ca.pem"), self.p("client.pem"), self.p("client.key")
        with spgate.Client(controller=self.daemon.address, job_id="py-tls", tls=Tls) as c:
            c.wait_until_connected(10)
            c.submit_plan(0, UNIFORM)
            self.assertEqual(c.await_decision(0, timeout=5.0).source, Source.DAEMON)
        # server_name: the name checked in the daemon's certificate (it names localhost).
        tls = {"ca": self.p("ca.pem"), "cert": self.p("client.pem"), "key": self.p("client.key")}
        with spgate.Client(controller=self.daemon.address, job_id="py-tls-name",
                           tls=dict(tls, server_name="localhost")) as c:
            c.wait_until_connected(10)
        with spgate.Client(controller=self.daemon.address, job_id="py-tls-wrong-name",
                           tls=dict(tls, server_name="not-the-daemon.example")) as c:
            with self.assertRaises(spgate.DeadlineExceededError):
                c.wait_until_connected(1.0)
        # Without a client certificate the daemon refuses the connection.
        with spgate.Client(controller=self.daemon.address, job_id="py-tls2",
                           tls={"ca": self.p("ca.pem")}) as c:
            with self.assertRaises(spgate.DeadlineExceededError):
                c.wait_until_connected(1.0)
        # Plaintext against a TLS port does not connect either.
        with spgate.Client(controller=self.daemon.address, job_id="py-plain") as c:
            with self.assertRaises(spgate.DeadlineExceededError):
                c.wait_until_connected(1.0)


if __name__ == "__main__":
    unittest.main()
