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
  connect_timeout has passed;
- an unreachable daemon is not a refusal: connect returns after connect_timeout, the
  leader says so once on stderr, and the decisions are the fail-static fallback's;
- spgate.Client(job_id="bad id!") fails at construction, with or without a controller.

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
from daemon_util import Daemon  # noqa: E402
from dist_util import free_port, run_ranks  # noqa: E402

TOKEN = "py-connect-token"
LENGTHS = [512, 512, 256, 768]
REFUSAL_BOUND_S = 5.0  # "within seconds": the refusals below take well under one
STEPS = 4


def _refused(call):
    """(exception class name, code_name, message, seconds) of call(), which must raise."""
    t0 = time.monotonic()
    try:
        call()
    except spgate.Error as e:
        return (type(e).__name__, e.code_name, str(e), time.monotonic() - t0)
    return None


def rank_main(rank, world, address, unreachable):
    import spgate.torch
    out = {}
    out["bad_id"] = _refused(lambda: spgate.torch.connect(
        controller=address, job_id="bad id!", worker_token=TOKEN))
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
    return out


class ConnectTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="spgate-connect-")
        token_file = os.path.join(self.dir, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.daemon = Daemon(extra_args=[f"--worker_token_file={token_file}"])

    def tearDown(self):
        self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_two_ranks(self):
        unreachable = f"127.0.0.1:{free_port()}"  # nothing listens there
        ranks = run_ranks(2, rank_main, self.daemon.address, unreachable, timeout_s=120)

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
