"""examples/torch/train.py end to end against a live spgated on loopback: 4 processes
(2 TP groups of 2, gloo) train a small GPT; the run must use both modes, every rank of a
group must log the same decision at every step, the summary must report 0 consistency
violations and 0 lost telemetry with every decision from the daemon, and the daemon's
spgate_decisions_total{job_id} (scraped from /metrics) must equal the summary's
decisions.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/torch_example_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import torch  # noqa: F401
    from spgate import _spgate  # noqa: F401
except ImportError as e:
    print(f"FAILED: needs PyTorch (make deps installs python3-torch) and spgate's native module ({e})")
    sys.exit(1)
from daemon_util import Daemon  # noqa: E402

TRAIN = os.path.join(HERE, "..", "..", "examples", "torch", "train.py")
STEPS = 24


class TorchExampleTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.tmp = tempfile.TemporaryDirectory(prefix="spgate-torch-e2e-")

    def tearDown(self):
        self.daemon.stop()
        self.tmp.cleanup()

    def test_train_against_live_daemon(self):
        summary_path = os.path.join(self.tmp.name, "summary.json")
        prefix = os.path.join(self.tmp.name, "decisions")
        # A generous deadline: on a loaded machine every step still gets the daemon's
        # answer, so the daemon's counters and the summary must agree exactly.
        cmd = [sys.executable, TRAIN, f"--controller={self.daemon.address}",
               "--job_id=torch-e2e", f"--steps={STEPS}", "--decision_deadline_ms=2000",
               f"--summary_json={summary_path}", f"--decision_log={prefix}"]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=240)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        with open(summary_path) as f:
            s = json.load(f)
        for key in ("steps", "decisions", "local_decisions", "consistency_violations",
                    "lost_telemetry", "effective_tokens_per_s", "step_time_p95_s",
                    "peak_memory_bytes"):
            self.assertIn(key, s)
        self.assertEqual(s["steps"], STEPS)
        self.assertEqual(set(s["decisions"]), {"sp", "tp_only"}, s["decisions"])
        self.assertEqual(sum(n for r in s["decisions"].values() for n in r.values()), 2 * STEPS)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["lost_telemetry"], 0)
        self.assertEqual(s["telemetry_acked"], 4 * STEPS)
        self.assertEqual(s["local_decisions"], 0)
        self.assertEqual(s["decision_sources"], {"daemon": 2 * STEPS})
        for key in ("sp", "tp_only", "all"):
            self.assertGreater(s["effective_tokens_per_s"][key], 0)
            self.assertGreater(s["step_time_p95_s"][key], 0)
            self.assertGreater(s["peak_memory_bytes"][key], 0)
        self.assertLess(s["loss_last"], s["loss_first"], "the model did not learn")
        # The daemon's own counters match the summary.
        self.assertEqual(self.daemon.decisions_total("torch-e2e"), s["decisions"])
        # Every rank of a TP group ran the same mode at every step (ranks 0,1 and 2,3).
        logs = []
        for r in range(4):
            with open(f"{prefix}.rank{r}.csv") as f:
                logs.append(f.read().splitlines())
        self.assertEqual(len(logs[0]), STEPS + 1)
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(logs[2], logs[3])


if __name__ == "__main__":
    unittest.main()
