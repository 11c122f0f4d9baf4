"""examples/python/train_loop.py (the C API through ctypes) when the daemon is not there to
answer yes: a daemon that refuses the client (here: it wants a worker token, the example
sends none) ends the run at once with exit status 2 and the refusal on stderr, before any
step and with no summary; a daemon that does not answer is said on stderr, every step falls
back, the records that could not be flushed are said too, and the run exits 0 after its
two bounded waits (5 s to connect, 5 s to flush); against a daemon that accepts it,
stderr stays empty. (Its runs against a daemon, with TLS and without a daemon are
c_api_test's.)

Run: SPGATED=build/bin/spgated SPGATE_CLIENT_LIB=build/lib/libspgate_client.so \
     python3 tests/python/train_loop_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from daemon_util import Daemon, refused_address  # noqa: E402

TRAIN_LOOP = os.path.join(HERE, "..", "..", "examples", "python", "train_loop.py")
LIB = os.environ.get("SPGATE_CLIENT_LIB") or os.path.join(HERE, "..", "..", "build", "lib",
                                                           "libspgate_client.so")


def train_loop(*flags):
    """(exit status, stdout, stderr, seconds) of the example with these flags."""
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, TRAIN_LOOP, "--lib", LIB, *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=120)
    return run.returncode, run.stdout, run.stderr, time.monotonic() - t0


class TrainLoopTest(unittest.TestCase):
    def test_a_refusal_is_said_and_exits_2_before_any_step(self):
        with tempfile.TemporaryDirectory(prefix="spgate-train-loop-") as d:
            token = os.path.join(d, "token")
            with open(token, "w") as f:
                f.write("train-loop-token\n")
            daemon = Daemon(extra_args=[f"--worker_token_file={token}"])
            try:
                rc, out, err, seconds = train_loop("--controller", daemon.address, "--job_id",
                                                   "train-loop-refused", "--tp", "3",
                                                   "--steps", "5")
                decided = daemon.decisions_total("train-loop-refused")
            finally:
                daemon.stop()
        self.assertEqual(rc, 2, out + err)
        self.assertEqual(out, "")  # no summary
        self.assertRegex(err, r"rank 0: wait_connected failed \(code 16\): not connected: the "
                              r"daemon at .* refused this client's credential \(Register: "
                              r"UNAUTHENTICATED")
        self.assertNotIn("Traceback", err)
        self.assertLess(seconds, 5.0)  # at once, not after the 5 s wait
        self.assertEqual(decided, {})

    def test_a_daemon_that_does_not_answer_is_said_and_the_steps_fall_back(self):
        with refused_address() as address:
            rc, out, err, seconds = train_loop("--controller", address, "--job_id",
                                               "train-loop-away", "--tp", "2", "--steps", "4")
        self.assertEqual(rc, 0, out + err)
        summary = json.loads(out)
        self.assertEqual(summary["local_decisions"], 4)
        self.assertEqual(summary["daemon_decisions"], 0)
        lines = err.splitlines()
        self.assertEqual(len(lines), 2, err)
        self.assertRegex(lines[0], r"^rank 0: %s not connected \(waited at most 5 s: .*\); "
                                   r"deciding locally until it answers$" % address)
        self.assertRegex(lines[1], r"^rank 0: flush: 0 telemetry records sent, 0 "
                                   r"acknowledged, 4 still buffered, stream down$")
        # The two bounded waits, and little else.
        self.assertGreaterEqual(seconds, 10.0)
        self.assertLess(seconds, 40.0)

    def test_a_daemon_that_accepts_it_leaves_stderr_empty(self):
        daemon = Daemon()
        try:
            rc, out, err, _ = train_loop("--controller", daemon.address, "--job_id",
                                         "train-loop-ok", "--tp", "2", "--steps", "6")
        finally:
            daemon.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(err, "")
        self.assertEqual(json.loads(out)["daemon_decisions"], 6)


if __name__ == "__main__":
    unittest.main()
