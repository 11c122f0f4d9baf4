"""What the client-binary integration tests (tls_clients_test, worker_token_test) share:
the environment for mpirun, a small worker model, and a mixin that runs the real
spgate-worker (2 ranks, one TP group) or spgate-sim against `self.daemon` and returns
the summary after the checks every such run must pass (the ranks ran the same
decisions, every step and group was decided, no consistency violation).

A test class using ClientRuns sets `args` (with .worker, .sim, .mpirun), `tmp` (a
folder it owns) and `daemon` (with .worker_address and .kill()) in setUpClass; the mixin
provides `p(name)` and the tearDownClass that kills the daemon and removes `tmp`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import unittest

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OPENBLAS_NUM_THREADS="1")
WORKER_SMALL = ["--tp=2", "--layers=1", "--hidden=64", "--heads=4", "--ffn_hidden=128",
                "--lengths=bimodal:short=64,long=512,p_long=0.3", "--tokens_per_batch=1024"]
STEPS = 12


def decision_rows(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "step,mode,reason,source,stage,micro_batch", lines[0]
    return [line.split(",") for line in lines[1:]]


class ClientRuns:
    @classmethod
    def tearDownClass(cls):
        cls.daemon.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def p(cls, name):
        """A path in the class's temporary folder (`cls.tmp`)."""
        return os.path.join(cls.tmp, name)

    def run_worker(self, name, extra):
        """Returns (summary, rank 0's decision rows, stderr)."""
        prefix, summary = self.p(f"{name}.decisions"), self.p(f"{name}.summary.json")
        cmd = [self.args.mpirun, "--oversubscribe", "-np", "2", self.args.worker,
               *WORKER_SMALL, f"--controller={self.daemon.worker_address}",
               f"--job_id={name}", f"--steps={STEPS}", f"--decision_log={prefix}",
               f"--summary_json={summary}", *extra]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, f"{cmd}\n{r.stdout}\n{r.stderr}")
        with open(summary) as f:
            s = json.load(f)
        logs = [decision_rows(f"{prefix}.rank{rank}.csv") for rank in range(2)]
        self.assertEqual(logs[1], logs[0], "the two ranks of the group ran different decisions")
        self.assertEqual(s["steps"], STEPS)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(len(logs[0]), STEPS)
        return s, logs[0], r.stderr

    def run_sim(self, name, extra):
        """Returns (summary, decisions made, stderr)."""
        summary = self.p(f"{name}.sim.json")
        cmd = [self.args.sim, f"--controller={self.daemon.worker_address}", f"--job_id={name}",
               "--groups=2", "--tp=2", f"--steps={STEPS}", "--steps_per_s=40",
               f"--summary_json={summary}", *extra]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, f"{cmd}\n{r.stdout}\n{r.stderr}")
        with open(summary) as f:
            s = json.load(f)
        self.assertEqual(s["consistency_violations"], 0)
        decided = sum(n for reasons in s["decisions"].values() for n in reasons.values())
        self.assertEqual(decided, 2 * STEPS, s["decisions"])  # one per group and step
        return s, decided, r.stderr


def parse_binaries(argv):
    """--spgated, --worker, --sim and --mpirun from `argv` (CMake passes the built
    binaries); returns (those, the arguments left for unittest)."""
    parser = argparse.ArgumentParser()
    for flag in ("spgated", "worker", "sim", "mpirun"):
        parser.add_argument(f"--{flag}", required=True)
    return parser.parse_known_args(argv)


def main(module):
    """A client-binary test file's entry point: the binaries from the command line into
    `module.ARGS`, then its tests."""
    module.ARGS, rest = parse_binaries(sys.argv[1:])
    unittest.main(module=module, argv=[sys.argv[0]] + rest, verbosity=2)
