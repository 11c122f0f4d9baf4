"""examples/torch/train.py end to end against a live spgated on loopback: 4 processes
(2 TP groups of 2, gloo) train a small GPT; the run must use both modes, every rank of a
group must log the same decision at every step, the summary must report 0 consistency
violations and 0 lost telemetry with every decision from the daemon, and the daemon's
spgate_decisions_total{job_id} (scraped from /metrics) must equal the summary's
decisions; its summary has every key spgate-worker's summary has (found by running
spgate-worker single-rank, not from a list), with values recomputed here from the
decision logs and the example's own batch function. The example's --worker_token_file and
--tls_* flags against a daemon with mTLS and a worker token: the right token gets the
daemon's decisions, a wrong or missing one is refused (PERMISSION_DENIED /
UNAUTHENTICATED): spgate.torch.connect raises on both ranks, each says so, and the run
exits 2 within seconds, with no step run; a model shape the layers refuse exits 2 naming
the flag before any rank starts.

Run: PYTHONPATH=build/python SPGATED=build/bin/spgated python3 tests/python/torch_example_test.py
"""
import argparse
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
import unittest.mock as mock

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


def load_train():
    spec = importlib.util.spec_from_file_location("spgate_torch_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def spgate_worker():
    """spgate-worker of the same build: SPGATE_WORKER, else next to SPGATED."""
    path = os.environ.get("SPGATE_WORKER") or os.path.join(
        os.path.dirname(os.environ.get("SPGATED", os.path.join(HERE, "..", "..", "build", "bin",
                                                               "spgated"))), "spgate-worker")
    if not os.access(path, os.X_OK):
        raise AssertionError(f"spgate-worker not found at {path}: the example's summary keys "
                             "are checked against its summary (it needs MPI; make deps)")
    return path


_worker_summary = None


def worker_summary():
    """The summary JSON of a tiny single-rank spgate-worker run (no controller, no
    mpirun: --mode=sp runs without a daemon)."""
    global _worker_summary
    if _worker_summary is None:
        with tempfile.TemporaryDirectory(prefix="spgate-worker-keys-") as d:
            path = os.path.join(d, "summary.json")
            run = subprocess.run([spgate_worker(), "--mode=sp", "--steps=2", "--layers=1",
                                  "--hidden=32", "--heads=2", "--ffn_hidden=64",
                                  "--tokens_per_batch=256", f"--summary_json={path}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=120, cwd=d)
            if run.returncode != 0:
                raise AssertionError(f"spgate-worker failed:\n{run.stdout[-4000:]}")
            with open(path) as f:
                _worker_summary = json.load(f)
    return _worker_summary


def group_logs(prefix, world=4, tp=2):
    """Each TP group leader's decision log rows (step, mode, reason, source, stage,
    micro_batch)."""
    out = []
    for g in range(world // tp):
        with open(f"{prefix}.rank{g * tp}.csv") as f:
            out.append([line.split(",") for line in f.read().splitlines()[1:]])
    return out


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
        # No credential in the environment: world rank 0 makes the launch's and every
        # rank gets it over the job's process group (spgate.torch.agree_on_launch).
        env = {k: v for k, v in os.environ.items() if k != "SPGATE_LAUNCH_CREDENTIAL"}
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=240, env=env)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        with open(summary_path) as f:
            s = json.load(f)
        self.check_keys_match_worker(s)
        self.assertEqual(s["steps"], STEPS)
        self.assertEqual(set(s["decisions"]), {"sp", "tp_only"}, s["decisions"])
        self.assertEqual(sum(n for r in s["decisions"].values() for n in r.values()), 2 * STEPS)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["lost_telemetry"], 0)
        # One group session per TP group: one record a step for each of the 2 groups (the
        # group's, reduced in it), not one per rank.
        self.assertEqual(s["telemetry_acked"], 2 * STEPS)
        self.assertEqual(s["local_decisions"], 0)
        self.assertEqual(s["memory_overrides"], 0)
        self.assertEqual(s["decision_sources"], {"daemon": 2 * STEPS})
        for key in ("sp", "tp_only", "all"):
            self.assertGreater(s["effective_tokens_per_s"][key], 0)
            self.assertGreater(s["step_time_p95_s"][key], 0)
            self.assertGreater(s["peak_memory_bytes"][key], 0)
        # Labelled names beside the old ones: the job's tokens/s, group-steps, the unit.
        self.assertEqual(s["job_effective_tokens_per_s"], s["effective_tokens_per_s"])
        self.assertEqual(s["group_steps_by_mode"], s["steps_by_mode"])
        self.assertEqual(s["group_steps_by_mode"]["all"], 2 * STEPS)
        self.assertEqual(s["decision_unit"], "group_steps")
        self.assertLess(s["loss_last"], s["loss_first"], "the model did not learn")
        # The daemon's own counters match the summary.
        self.assertEqual(self.daemon.decisions_total("torch-e2e"), s["decisions"])
        accepted = [float(line.rsplit(" ", 1)[1]) for line in self.daemon.metrics().splitlines()
                    if line.startswith('spgate_telemetry_records_total{result="accepted"}')]
        self.assertEqual(accepted, [2 * STEPS])
        # Every rank of a TP group ran the same mode at every step (ranks 0,1 and 2,3).
        logs = []
        for r in range(4):
            with open(f"{prefix}.rank{r}.csv") as f:
                logs.append(f.read().splitlines())
        self.assertEqual(len(logs[0]), STEPS + 1)
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(logs[2], logs[3])
        self.check_values_from_logs(s, prefix)

    def check_keys_match_worker(self, s):
        w = worker_summary()
        self.assertEqual(set(w) - set(s), set(), "keys spgate-worker writes and the example not")
        self.assertEqual(set(w["run"]) - set(s["run"]), set(), "run.* keys missing")
        for key, value in w.items():
            if isinstance(value, dict):
                self.assertIsInstance(s[key], dict, key)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                # null: a quantity this example does not have (docs/pytorch.md)
                self.assertTrue(s[key] is None or isinstance(s[key], (int, float)), key)
        # The keys documented as empty, and why (docs/pytorch.md): CPU has no allocator
        # statistics, the example predicts no memory, LayerNorm needs no collective.
        for key in ("switch_device_alloc_bytes", "steady_device_alloc_bytes",
                    "predicted_peak_memory_bytes"):
            self.assertEqual(s[key], {}, key)
        self.assertIsNone(s["memory_prediction_max_rel_error"])
        self.assertIsNone(s["norm_stall_ratio_mean"])
        self.assertEqual((s["run"]["world_size"], s["run"]["tp"], s["run"]["dp"],
                          s["run"]["norm_boundary"], s["run"]["mode"]), (4, 2, 2, "shard", "auto"))

    def check_values_from_logs(self, s, prefix):
        """The new summary keys recomputed from what the ranks logged and from the
        example's own (pure) batch function."""
        train = load_train()
        args = train.parse_args(["--controller=", "--job_id=x", f"--steps={STEPS}"])
        tokens = {"all": 0}
        switches, steady = {}, set()
        for g, rows in enumerate(group_logs(prefix)):
            self.assertEqual([int(r[0]) for r in rows], list(range(STEPS)))
            for i, (_, mode, _, _, _, _) in enumerate(rows):
                n = sum(train.batch_lengths(args, g, i))
                tokens["all"] += n
                tokens[mode] = tokens.get(mode, 0) + n
                if i > 0 and rows[i - 1][1] != mode:
                    switches[mode] = switches.get(mode, 0) + 1
                elif i > 0:
                    steady.add(mode)
        self.assertEqual(s["effective_tokens"], tokens)
        self.assertEqual(s["switch_steps"], switches)
        # A ratio for every mode switched to that also ran steps in a row (the baseline).
        self.assertEqual(set(s["switch_cost_ratio"]), set(switches) & steady)
        for mode, ratio in s["switch_cost_ratio"].items():
            self.assertGreater(ratio, 0, mode)
        for key in ("sp", "tp_only", "all"):
            self.assertGreater(s["step_time_mean_s"][key], 0)
        self.assertGreater(s["all_gather_tail_p95_s"], 0)
        self.assertGreater(s["decision_wait_p95_s"], 0)
        # The leaders waited for the daemon, within the 2 s deadline.
        self.assertGreater(s["leader_decision_wait_max_s"], 0)
        self.assertLess(s["leader_decision_wait_max_s"], 2.5)

    def test_consistency_check_compares_step_and_mode(self):
        train = load_train()
        args = argparse.Namespace(tp=2, steps=2, short=64, long=512, p_long=0.3, job_id="x",
                                  controller="", layers=1, hidden=8, heads=2, ffn_hidden=16,
                                  tokens_per_batch=64)

        def rec(step, mode):
            return {"step": step, "mode": mode, "reason": "gates_passed", "source": "local",
                    "tokens": 10, "padding": 0, "step_time_s": 0.1, "decision_s": 0.001,
                    "rs_s": 0.01, "ag_s": 0.01, "peak": 100, "loss": 1.0, "length_cv": 0.1}
        counters = {"telemetry_sent": 0, "telemetry_acked": 0, "daemon_decisions": 0,
                    "memory_overrides": 0}

        def violations(rank1):
            per_rank = [{"records": [rec(0, "sp"), rec(1, "sp")], "counters": counters},
                        {"records": rank1, "counters": counters}]
            return train.summarize(args, 2, per_rank)["consistency_violations"]
        self.assertEqual(violations([rec(0, "sp"), rec(1, "sp")]), 0)
        self.assertEqual(violations([rec(0, "sp"), rec(1, "tp_only")]), 1)  # mode differs
        self.assertEqual(violations([rec(0, "sp"), rec(2, "sp")]), 1)       # step differs
        self.assertEqual(violations([rec(1, "sp"), rec(0, "sp")]), 2)

    def test_exit_status(self):
        """main(): 2 when a rank exited 2 (spgated refused the job: a usage error), 1 when
        a rank failed otherwise (a consistency violation, a traceback, a signal)."""
        import torch.multiprocessing as mp
        train = load_train()

        class Context:  # start_processes(join=False)'s, with these exit codes
            def __init__(self, codes):
                self.processes = [types.SimpleNamespace(exitcode=c) for c in codes]

            def join(self):
                failed = [i for i, p in enumerate(self.processes) if p.exitcode]
                if not failed:
                    return True
                code = self.processes[failed[0]].exitcode
                if code == "raised":
                    raise mp.ProcessRaisedException("Traceback ...", failed[0], 1)
                raise mp.ProcessExitedException("process %d terminated with exit code %s"
                                                % (failed[0], code), failed[0], 1, code)
        for codes, status in (([0, 0], 0), ([2, 2], 2), ([0, 2], 2), ([-15, 2], 2),
                              ([1, 0], 1), ([0, -9], 1), (["raised", 0], 1)):
            with self.subTest(codes=codes), \
                    mock.patch.object(mp, "start_processes", lambda *a, **k: Context(codes)), \
                    contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(train.main(["--controller="]), status)

    def test_flag_errors(self):
        train = load_train()
        bad = [["--tls_key=k.pem"], ["--tls_server_name=x"],
               ["--worker_token_file=/nonexistent/token"], [f"--worker_token_file={os.devnull}"],
               # Sizes out of range are usage errors (not a run of nothing that exits 0, a
               # ZeroDivisionError or an IndexError in the summary).
               ["--world=0"], ["--world=-4"], ["--tp=0"], ["--pp=0"], ["--steps=0"],
               ["--steps=-2"], ["--microbatches=0"], ["--dropout=1"], ["--p_long=1.5"],
               ["--lr=0"], ["--decision_deadline_ms=nan"], ["--tp=two"],
               # A model shape the layers refuse, before any rank starts (spgate-worker's
               # refusal): heads and ffn_hidden by the TP size, hidden by heads.
               ["--heads=3"], ["--ffn_hidden=255"], ["--hidden=66"], ["--heads=6", "--tp=4"]]
        for extra in bad:
            with self.subTest(extra=extra):
                with self.assertRaises(SystemExit) as cm, \
                        contextlib.redirect_stderr(io.StringIO()) as err:
                    train.parse_args(["--controller=", "--job_id=x", *extra])
                self.assertEqual(cm.exception.code, 2)
                flag = extra[0].split("=")[0]
                self.assertIn(flag, err.getvalue())  # the message names the flag
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
            train.parse_args(["--controller=", "--heads=3"])
        self.assertIn("--heads=3 is not divisible by --tp=2", err.getvalue())
        a = train.parse_args(["--controller=", "--job_id=x"])
        self.assertIsNone(train.tls_options(a))
        # No controller at all is a usage error (not a run decided locally in silence);
        # a local run needs no job id, a run with a controller does.
        with mock.patch.dict(os.environ):
            for name in ("SPGATE_CONTROLLER", "SPGATE_JOB_ID", "SLURM_JOB_NAME"):
                os.environ.pop(name, None)
            for argv, flag in ((["--job_id=x"], "--controller"),
                               (["--controller=127.0.0.1:50061"], "--job_id")):
                with self.subTest(argv=argv):
                    with self.assertRaises(SystemExit) as cm, \
                            contextlib.redirect_stderr(io.StringIO()) as err:
                        train.parse_args(argv)
                    self.assertEqual(cm.exception.code, 2)
                    self.assertIn(flag + ": required", err.getvalue())
            self.assertEqual(train.parse_args(["--controller="]).job_id, "")
            os.environ["SPGATE_CONTROLLER"] = "127.0.0.1:50061"
            os.environ["SPGATE_JOB_ID"] = "from-env"
            a = train.parse_args([])
            self.assertEqual((a.controller, a.job_id), ("127.0.0.1:50061", "from-env"))
        a = train.parse_args(["--controller=", "--job_id=x", "--tls_ca=ca.pem", "--tls_server_name=localhost"])
        self.assertEqual(train.tls_options(a), {"ca": "ca.pem", "cert": "", "key": "",
                                                "server_name": "localhost"})


class TorchExampleSecurityTest(unittest.TestCase):
    """--worker_token_file and --tls_* against a daemon with mTLS and a worker token."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="spgate-torch-sec-")
        subprocess.run(["bash", os.path.join(HERE, "..", "testing", "make_test_certs.sh"),
                        self.dir], check=True, timeout=60, stdout=subprocess.DEVNULL)
        self.p = lambda name: os.path.join(self.dir, name)  # noqa: E731
        with open(self.p("token"), "w") as f:
            f.write("  torch-example-secret\n")  # the daemon strips whitespace, so does the example
        with open(self.p("wrong-token"), "w") as f:
            f.write("not-the-secret\n")
        self.daemon = Daemon(extra_args=[f"--tls_cert={self.p('server.pem')}",
                                         f"--tls_key={self.p('server.key')}",
                                         f"--tls_client_ca={self.p('ca.pem')}",
                                         f"--worker_token_file={self.p('token')}"])

    def tearDown(self):
        self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def train(self, job_id, *extra, refused=False):
        summary = self.p(f"{job_id}.json")
        cmd = [sys.executable, TRAIN, f"--controller={self.daemon.address}", f"--job_id={job_id}",
               "--world=2", "--tp=2", "--steps=3", "--layers=1", "--tokens_per_batch=256",
               "--decision_deadline_ms=2000", f"--summary_json={summary}",
               f"--tls_ca={self.p('ca.pem')}", f"--tls_cert={self.p('client.pem')}",
               f"--tls_key={self.p('client.key')}", "--tls_server_name=localhost", *extra]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=180)
        if refused:
            # 2, as a usage error: not 1, a consistency violation's or a failed rank's.
            self.assertEqual(run.returncode, 2, run.stdout[-4000:])
            self.assertFalse(os.path.exists(summary))
            return None, run.stdout
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        with open(summary) as f:
            return json.load(f), run.stdout

    def test_right_token_gets_daemon_decisions(self):
        s, _ = self.train("torch-tok", f"--worker_token_file={self.p('token')}")
        self.assertEqual(s["decision_sources"], {"daemon": 3})
        self.assertEqual((s["local_decisions"], s["lost_telemetry"], s["telemetry_acked"]),
                         (0, 0, 3))  # one group session: a record a step
        self.assertEqual(sum(n for r in self.daemon.decisions_total("torch-tok").values()
                             for n in r.values()), 3)

    def test_wrong_or_missing_token_is_refused(self):
        for job, extra, refusal in (
                ("torch-wrong", [f"--worker_token_file={self.p('wrong-token')}"],
                 "PERMISSION_DENIED: the worker token"),
                ("torch-none", [], "UNAUTHENTICATED")):
            with self.subTest(job=job):
                _, out = self.train(job, *extra, refused=True)
                for rank in (0, 1):  # every rank raised the leader's refusal
                    self.assertRegex(out, f"rank {rank}: connect: spgated at .* refused job "
                                          f"{job}: {refusal}")
                self.assertEqual(self.daemon.decisions_total(job), {})


if __name__ == "__main__":
    unittest.main()
