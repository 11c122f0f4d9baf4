"""spgate.torch.connect, the one call (docs/pytorch.md), on a 2-rank gloo job against a
live spgated on loopback run with a worker token:

- connect returns a decider on both ranks whose decisions are the daemon's (source
  DAEMON, the same on both ranks, counted by the daemon's metrics for the job), and
  close() flushes the group's telemetry;
- a refused job id ("bad id!", the daemon's own rule checked by spgate.Client) and a
  registration the daemon refuses (a wrong worker token: PERMISSION_DENIED) raise
  spgate.Error from connect on both ranks, with the same code, within a few seconds
  (the process group's timeout is 60 s: a rank left in a collective would show); a second
  launch of a job the first still holds raises FAILED_PRECONDITION on both ranks once
  connect_timeout has passed; the daemon's admin port as the controller (no worker API)
  raises UNIMPLEMENTED at once; ranks that name different controllers or jobs, or pass TP
  groups that do not partition the world, raise INVALID_ARGUMENT naming the world ranks;
- an unreachable daemon is not a refusal: connect returns after connect_timeout, the
  leader says so once on stderr, and the decisions are the fail-static fallback's;
- spgate.Client(job_id="bad id!") fails at construction, with or without a controller;
- the environment the Kubernetes sidecar sets (SPGATE_CONTROLLER, SPGATE_JOB_ID,
  SPGATE_WORKER_TOKEN_FILE) stands in for the arguments: connect() with none gets the
  daemon's decisions; arguments given win over variables that would fail; a missing
  controller or job id, a token file that cannot be read, a bad SPGATE_JOB_ID,
  SPGATE_HARDWARE_ID or SPGATE_LAUNCH_CREDENTIAL, and a variable only one rank has raise
  on both ranks naming the variable; the hardware id is the argument, else
  SPGATE_HARDWARE_ID, else detected.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/connect_test.py
(ctest runs it against the pip-installed package: tests/python/CMakeLists.txt).
"""
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch  # noqa: F401
    import spgate
    from spgate import _spgate  # noqa: F401
except ImportError as e:
    print(f"FAILED: needs PyTorch (make deps installs python3-torch) and spgate's native module ({e})")
    sys.exit(1)
from daemon_util import Daemon, refused_address  # noqa: E402
from dist_util import run_ranks  # noqa: E402

TOKEN = "py-connect-token"
LENGTHS = [512, 512, 256, 768]
REFUSAL_BOUND_S = 5.0  # "within seconds": the refusals below take well under one
STEPS = 4
ENV_STEPS = 2


def _refused(call):
    """(exception class name, code_name, message, seconds) of call(), which must raise."""
    t0 = time.monotonic()
    try:
        call()
    except spgate.Error as e:
        return (type(e).__name__, e.code_name, str(e), time.monotonic() - t0)
    return None


@contextlib.contextmanager
def _environment(**variables):
    """SPGATE_* variables set (None: unset) for the block, restored after."""
    def put(values):
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    saved = {k: os.environ.get(k) for k in variables}
    put(variables)
    try:
        yield
    finally:
        put(saved)


def _decide(decider, steps):
    """(mode, source) of `steps` decisions; closes the decider."""
    got = []
    for n in range(steps):
        decider.submit_plan(n, LENGTHS)
        d = decider.decide(n)
        got.append((d.mode.name, d.source.name))
    decider.close(flush_timeout=5.0)
    return got


def environment_main(rank, address, unreachable, token_file):
    """connect with the sidecar's variables instead of arguments (see the docstring)."""
    import spgate.torch
    out = {}
    sidecar = dict(SPGATE_CONTROLLER=address, SPGATE_JOB_ID="py-connect-env",
                   SPGATE_WORKER_TOKEN_FILE=token_file)
    with _environment(**sidecar):
        out["env_only"] = _decide(spgate.torch.connect(decision_deadline=5.0), ENV_STEPS)
    # Every argument given, each variable one that would fail: the arguments win.
    with _environment(SPGATE_CONTROLLER=unreachable, SPGATE_JOB_ID="bad id!",
                      SPGATE_WORKER_TOKEN_FILE=token_file + ".missing"):
        out["explicit"] = _decide(spgate.torch.connect(
            controller=address, job_id="py-connect-explicit", worker_token=TOKEN,
            connect_timeout=2.0, decision_deadline=5.0), 1)
    with _environment(**sidecar):
        out["explicit_local"] = _decide(spgate.torch.connect(controller=""), 1)
    none = dict(SPGATE_CONTROLLER=None, SPGATE_JOB_ID=None, SLURM_JOB_NAME=None,
                SPGATE_WORKER_TOKEN_FILE=None)
    with _environment(**none):
        out["no_controller"] = _refused(lambda: spgate.torch.connect())
        out["no_job_id"] = _refused(lambda: spgate.torch.connect(controller=address))
    with _environment(**dict(sidecar, SPGATE_WORKER_TOKEN_FILE=token_file + ".missing")):
        out["unreadable_token"] = _refused(lambda: spgate.torch.connect())
    with _environment(**dict(sidecar, SPGATE_JOB_ID="bad id!")):
        out["bad_job_id"] = _refused(lambda: spgate.torch.connect())
    # A launch credential rank 0 read from SPGATE_LAUNCH_CREDENTIAL that the rule refuses:
    # the variable is named, its value never shown; a credential passed wins over it.
    with _environment(**dict(sidecar, SPGATE_LAUNCH_CREDENTIAL="short")):
        out["bad_credential"] = _refused(lambda: spgate.torch.connect())
        out["credential_given"] = _decide(spgate.torch.connect(
            job_id="py-connect-cred", launch_credential=spgate.new_launch_credential(),
            decision_deadline=5.0), 1)
    # The hardware id: a variable the rule refuses is named; the argument wins over it.
    with _environment(**dict(sidecar, SPGATE_HARDWARE_ID="h" * 200)):
        out["bad_hardware_id"] = _refused(lambda: spgate.torch.connect())
        out["hardware_id_given"] = _decide(spgate.torch.connect(
            job_id="py-connect-hw", hardware_id="lab-h200", decision_deadline=5.0), 1)
    # Only rank 0's pod has the variables: both raise, neither waits for the other.
    with _environment(**(sidecar if rank == 0 else none)):
        out["one_rank"] = _refused(lambda: spgate.torch.connect())
    return out


def rank_main(rank, world, address, unreachable, token_file, admin):
    import spgate.torch
    import torch.distributed as dist
    out = {}
    out["bad_id"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="bad id!", worker_token=TOKEN))
    # The admin port serves no worker API: refused at once, not waited on as a daemon down.
    out["admin_port"] = _refused(lambda: spgate.torch.connect(
        controller=admin, job_id="py-connect-admin", worker_token=TOKEN))
    # Arguments the ranks disagree on raise on every rank, naming who said what.
    out["two_controllers"] = _refused(lambda: spgate.torch.connect(
        controller=address if rank == 0 else unreachable, job_id="py-connect-two",
        worker_token=TOKEN))
    out["two_jobs"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="py-connect-%d" % rank, worker_token=TOKEN))
    both, alone = dist.new_group([0, 1]), [dist.new_group([0]), dist.new_group([1])]
    out["tp_groups"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="py-connect-tp", worker_token=TOKEN,
        tp_group=both if rank == 0 else alone[1]))
    # connect's own arguments of the wrong type: TypeError naming them, on every rank.
    for case, kwargs in (("timeout_type", {"connect_timeout": "5"}),
                         ("tp_group_type", {"tp_group": [0, 1]})):
        try:
            spgate.torch.connect(controller=address, job_id="py-connect-args",
                                 worker_token=TOKEN, **kwargs)
            out[case] = None
        except TypeError as e:
            out[case] = str(e)
    out["timeout_value"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="py-connect-args", worker_token=TOKEN,
        connect_timeout=-1.0))
    out["wrong_token"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="py-connect-token", worker_token=TOKEN + "-wrong"))

    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err):
        decider = spgate.torch.connect(controller=unreachable, job_id="py-connect-away",
                                       connect_timeout=1.0, decision_deadline=0.05)
    out["away_s"] = time.monotonic() - t0
    out["away_stderr"] = err.getvalue()
    decider.submit_plan(0, LENGTHS)
    d = decider.decide(0)
    out["away_decision"] = (d.source.name, d.reason.name)
    decider.close(flush_timeout=0.1)

    decider = spgate.torch.connect(controller=address, job_id="py-connect", tp_group=None,
                                   worker_token=TOKEN, decision_deadline=5.0)
    out["is_leader"] = decider.is_leader
    out["decisions"] = []
    for n in range(STEPS):
        decider.submit_plan(n, LENGTHS)
        d = decider.decide(n)
        out["decisions"].append((d.step, d.mode.name, d.reason.name, d.source.name))
        decider.report_telemetry(step=n, mode=d.mode, reason=d.reason,
                                 step_time_s=0.01 + 0.001 * rank,
                                 effective_tokens=sum(LENGTHS))
    # Another launch of the same job while this one holds it: a launch conflict, raised
    # when it still stands at connect_timeout (1 s here).
    out["conflict"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="py-connect", incarnation="py-connect-second-launch",
        worker_token=TOKEN, connect_timeout=1.0))
    out["flushed"] = decider.close(flush_timeout=10.0)
    out.update(environment_main(rank, address, unreachable, token_file))
    return out


class ConnectTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="spgate-connect-")
        self.token_file = os.path.join(self.dir, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.daemon = Daemon(extra_args=[f"--worker_token_file={self.token_file}"])

    def tearDown(self):
        self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_two_ranks(self):
        admin = f"127.0.0.1:{self.daemon.admin_port}"
        with refused_address() as unreachable:
            ranks = run_ranks(2, rank_main, self.daemon.address, unreachable, self.token_file,
                              admin, timeout_s=120)

        for rank, out in enumerate(ranks):
            with self.subTest(rank=rank):
                cls, code, message, seconds = out["bad_id"]
                self.assertEqual((cls, code), ("InvalidArgumentError", "INVALID_ARGUMENT"))
                self.assertIn("job_id", message)
                self.assertLess(seconds, REFUSAL_BOUND_S)
                cls, code, message, seconds = out["wrong_token"]
                self.assertEqual(code, "PERMISSION_DENIED")
                self.assertIn("worker token", message)
                self.assertLess(seconds, REFUSAL_BOUND_S)
                self.assertIn("connect_timeout must be a number of seconds, got str",
                              out["timeout_type"] or "")
                self.assertIn("tp_group must be a torch.distributed process group",
                              out["tp_group_type"] or "")
                cls, code, message, seconds = out["admin_port"]
                self.assertEqual(code, "UNIMPLEMENTED")
                self.assertIn("does not serve spgated's worker API", message)
                self.assertLess(seconds, REFUSAL_BOUND_S)
                for case, words in (
                        ("two_controllers", ["different controllers", "world ranks [0]",
                                             "world ranks [1]"]),
                        ("two_jobs", ["different job_ids", "'py-connect-0' (world ranks [0])",
                                      "'py-connect-1' (world ranks [1])"]),
                        ("tp_groups", ["disagree on the TP groups", "world ranks [0, 1]"]),
                        ("timeout_value", ["connect_timeout: must be >= 0"])):
                    cls, code, message, seconds = out[case]
                    self.assertEqual(code, "INVALID_ARGUMENT", (case, message))
                    for word in words:
                        self.assertIn(word, message, case)
                    self.assertLess(seconds, REFUSAL_BOUND_S, case)

                self.assertGreaterEqual(out["away_s"], 1.0)
                self.assertLess(out["away_s"], 1.0 + REFUSAL_BOUND_S)
                self.assertEqual(out["away_decision"], ("FALLBACK", "CONTROLLER_UNAVAILABLE"))
                # Once, on the leader only.
                self.assertEqual(len(out["away_stderr"].splitlines()), 1 if rank == 0 else 0,
                                 out["away_stderr"])

                self.assertEqual(out["is_leader"], rank == 0)
                self.assertEqual(len(out["decisions"]), STEPS)
                self.assertTrue(all(d[3] == "DAEMON" for d in out["decisions"]), out["decisions"])
                self.assertTrue(out["flushed"])
                cls, code, message, seconds = out["conflict"]
                self.assertEqual((cls, code), ("FailedPreconditionError", "FAILED_PRECONDITION"))
                self.assertIn("held by another launch", message)
                self.assertGreaterEqual(seconds, 1.0)
                self.assertLess(seconds, 1.0 + REFUSAL_BOUND_S)
        self.assertIn("fail-static", ranks[0]["away_stderr"])
        # The follower raised the leader's refusal (the same code and message).
        self.assertEqual(ranks[0]["wrong_token"][2], ranks[1]["wrong_token"][2])
        self.assertEqual(ranks[0]["decisions"], ranks[1]["decisions"])
        counted = sum(n for reasons in self.daemon.decisions_total("py-connect").values()
                      for n in reasons.values())
        self.assertEqual(counted, STEPS)
        self.assertEqual(self.daemon.decisions_total("py-connect-token"), {})
        self.check_environment(ranks)

    def check_environment(self, ranks):
        missing = self.token_file + ".missing"
        for rank, out in enumerate(ranks):
            with self.subTest(rank=rank):
                self.assertEqual(out["env_only"], ranks[0]["env_only"])
                self.assertEqual([src for _, src in out["env_only"]], ["DAEMON"] * ENV_STEPS)
                self.assertEqual(out["explicit"][0][1], "DAEMON")
                self.assertEqual(out["explicit_local"][0][1], "LOCAL_ONLY")
                self.assertEqual(out["hardware_id_given"][0][1], "DAEMON")
                self.assertEqual(out["credential_given"][0][1], "DAEMON")
                for case, words in (
                        ("no_controller", ["controller=", "SPGATE_CONTROLLER"]),
                        ("no_job_id", ["job_id=", "SPGATE_JOB_ID"]),
                        ("unreadable_token", ["SPGATE_WORKER_TOKEN_FILE", missing]),
                        ("bad_job_id", ["SPGATE_JOB_ID", "bad id!"]),
                        ("bad_hardware_id", ["environment variable SPGATE_HARDWARE_ID: "
                                             "hardware_id: at most 128 characters"]),
                        ("bad_credential", ["environment variable SPGATE_LAUNCH_CREDENTIAL: "
                                            "launch_credential: must be 16 to 128 "
                                            "characters, got 5"]),
                        ("one_rank", ["world rank 1" if rank == 0 else "no controller",
                                      "SPGATE_CONTROLLER"])):
                    self.assertIsNotNone(out[case], case)
                    cls, code, message, seconds = out[case]
                    self.assertEqual((cls, code), ("InvalidArgumentError", "INVALID_ARGUMENT"),
                                     (case, message))
                    for word in words:
                        self.assertIn(word, message, case)
                    self.assertLess(seconds, REFUSAL_BOUND_S, case)
        counted = sum(n for reasons in self.daemon.decisions_total("py-connect-env").values()
                      for n in reasons.values())
        self.assertEqual(counted, ENV_STEPS)


class HardwareIdTest(unittest.TestCase):
    """What connect declares as the hardware id: the argument, else SPGATE_HARDWARE_ID,
    else the detected one (torch.cuda's device, else "cpu:" and the CPU model)."""
    def test_argument_then_variable_then_detected(self):
        from spgate.torch.session import _hardware_id
        with _environment(SPGATE_HARDWARE_ID=None):
            detected = _hardware_id(None, None)
            self.assertTrue(0 < len(detected) <= 128, detected)
            self.assertTrue(all(" " <= c <= "~" for c in detected), detected)
            if not torch.cuda.is_available():
                self.assertTrue(detected.startswith("cpu:"), detected)
            self.assertEqual(_hardware_id("given", None), "given")
        with _environment(SPGATE_HARDWARE_ID="lab-h200"):
            self.assertEqual(_hardware_id(None, None), "lab-h200")
            self.assertEqual(_hardware_id("given", None), "given")
        self.assertEqual(spgate.gpu_hardware_id("NVIDIA H200", 9, 0, 143771 << 20),
                         "NVIDIA H200 sm_90 140GiB")


class ClientJobIdTest(unittest.TestCase):
    def test_bad_job_id_fails_at_construction(self):
        for controller in ("", "127.0.0.1:1"):
            with self.subTest(controller=controller):
                with self.assertRaisesRegex(spgate.InvalidArgumentError,
                                            r"job_id: \"bad id!\" may contain only"):
                    spgate.Client(controller=controller, job_id="bad id!",
                                  incarnation="i", launch_credential="0" * 32)


if __name__ == "__main__":
    unittest.main()
