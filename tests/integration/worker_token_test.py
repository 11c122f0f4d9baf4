#!/usr/bin/python3
"""The shared worker credential in the client binaries (docs/security.md): one real spgated
on 127.0.0.1 with --worker_token_file, and the real spgate-worker (2 ranks under mpirun)
and spgate-sim dialling it with --worker_token_file:

- with the daemon's own token file (a trailing newline, as `echo` writes it) every
  decision is the daemon's (0 local decisions);
- with a wrong token the daemon refuses every call, every step falls back locally, the
  run still finishes (fail-static, docs/design.md §4) and the summary says so;
- a missing or blank token file is refused at start-up with exit status 2 and a message
  naming --worker_token_file.

Usage: worker_token_test.py --spgated=BIN --worker=BIN --sim=BIN --mpirun=BIN
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "demo"))
import spgate_reflect as sr  # noqa: E402
import client_runs  # noqa: E402
from client_runs import ENV, STEPS, WORKER_SMALL, ClientRuns  # noqa: E402

ARGS = None



class WorkerTokenTest(ClientRuns, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.args = ARGS
        cls.tmp = tempfile.mkdtemp(prefix="spgate-worker-token-")
        with open(cls.p("token"), "w") as f:
            f.write("tenant-a-0123456789abcdef\n")
        with open(cls.p("wrong"), "w") as f:
            f.write("tenant-b-fedcba9876543210\n")
        with open(cls.p("blank"), "w") as f:
            f.write(" \n")
        cls.daemon = sr.SpgatedProcess(ARGS.spgated, extra_args=[
            f"--worker_token_file={cls.p('token')}"]).start()

    def test_worker_with_the_token_gets_the_daemons_decisions(self):
        s, rows, err = self.run_worker("token-worker", [
            f"--worker_token_file={self.p('token')}", "--decision_deadline=5s",
            "--connect_timeout=30s"])
        self.assertEqual(s["local_decisions"], 0, err)
        self.assertEqual({row[3] for row in rows}, {"daemon"}, rows)

    def test_worker_with_a_wrong_token_is_refused_and_falls_back(self):
        s, rows, err = self.run_worker("token-worker-wrong", [
            f"--worker_token_file={self.p('wrong')}", "--decision_deadline=50ms",
            "--connect_timeout=1s"])
        self.assertEqual(s["local_decisions"], STEPS, err)
        self.assertEqual({(row[2], row[3]) for row in rows},
                         {("controller_unavailable", "fallback")}, rows)
        self.assertIn("not connected", err)

    def test_worker_without_a_token_is_refused_and_falls_back(self):
        s, rows, err = self.run_worker("token-worker-none", [
            "--decision_deadline=50ms", "--connect_timeout=1s"])
        self.assertEqual(s["local_decisions"], STEPS, err)
        self.assertEqual({row[3] for row in rows}, {"fallback"}, rows)

    def test_sim_with_the_token_gets_the_daemons_decisions(self):
        s, decided, err = self.run_sim("token-sim", [
            f"--worker_token_file={self.p('token')}", "--deadline=5s", "--connect_timeout=30s"])
        self.assertEqual(s["local_decisions"], 0, err)
        self.assertEqual(s["decision_sources"], {"daemon": decided}, err)

    def test_sim_with_a_wrong_token_is_refused_and_falls_back(self):
        s, decided, err = self.run_sim("token-sim-wrong", [
            f"--worker_token_file={self.p('wrong')}", "--deadline=50ms", "--connect_timeout=1s"])
        self.assertEqual(s["local_decisions"], decided, err)
        self.assertEqual(s["decision_sources"], {"fallback": decided}, err)

    def check_refused(self, cmd, message):
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, f"{cmd}\n{r.stdout}\n{r.stderr}")
        self.assertIn(message, r.stderr, cmd)

    def test_bad_token_files_are_refused_at_start_up(self):
        cases = [(self.p("missing"), f"--worker_token_file: cannot read \"{self.p('missing')}\""),
                 (self.p("blank"), f"--worker_token_file: \"{self.p('blank')}\" is empty")]
        for path, message in cases:
            with self.subTest(path=path):
                self.check_refused([ARGS.worker, f"--controller={self.daemon.worker_address}",
                                    "--job_id=token-flags", "--steps=1",
                                    f"--worker_token_file={path}"], message)
                self.check_refused([ARGS.sim, f"--controller={self.daemon.worker_address}",
                                    "--job_id=token-flags", "--groups=1", "--tp=2", "--steps=1",
                                    f"--worker_token_file={path}"], message)
        # Under mpirun too, as a job is really started: refused before MPI starts.
        self.check_refused([ARGS.mpirun, "--oversubscribe", "-np", "2", ARGS.worker,
                            *WORKER_SMALL, f"--controller={self.daemon.worker_address}",
                            "--job_id=token-flags", "--steps=1",
                            f"--worker_token_file={self.p('missing')}"],
                           "--worker_token_file: cannot read")


if __name__ == "__main__":
    client_runs.main(sys.modules[__name__])
