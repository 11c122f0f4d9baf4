#!/usr/bin/python3
"""TLS and mTLS in the client binaries (docs/security.md): one real spgated on 127.0.0.1
with --tls_cert, --tls_key and --tls_client_ca (certificates made for this run with the
openssl CLI by tests/testing/make_test_certs.sh; no openssl is a failure, not a skip),
and the real spgate-worker (2 ranks under mpirun) and spgate-sim dialling it with the
same four flags, --tls_ca, --tls_cert, --tls_key, --tls_server_name:

- with the client certificate every decision is the daemon's (0 local decisions);
- with only --tls_ca the daemon refuses the handshake, every step falls back locally and
  the run still finishes (fail-static, docs/design.md §4);
- bad TLS flags (a cert without its key, a key without its cert, an unreadable or empty
  file, a server name without TLS) are refused at start-up with exit status 2 and a
  message naming the flag.

Usage: tls_clients_test.py --spgated=BIN --worker=BIN --sim=BIN --mpirun=BIN
"""
import os
import shutil
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
MAKE_CERTS = os.path.join(HERE, "..", "testing", "make_test_certs.sh")


def make_certs(directory):
    r = subprocess.run(["bash", MAKE_CERTS, directory], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"make_test_certs.sh failed ({r.returncode}): {r.stderr}")



class TlsClientsTest(ClientRuns, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.args = ARGS
        cls.tmp = tempfile.mkdtemp(prefix="spgate-tls-clients-")
        make_certs(cls.tmp)
        cls.daemon = sr.SpgatedProcess(ARGS.spgated, extra_args=[
            f"--tls_cert={cls.p('server.pem')}", f"--tls_key={cls.p('server.key')}",
            f"--tls_client_ca={cls.p('ca.pem')}"]).start()
        # The daemon is dialled at 127.0.0.1; its certificate names localhost (and the IP).
        cls.mtls = [f"--tls_ca={cls.p('ca.pem')}", f"--tls_cert={cls.p('client.pem')}",
                    f"--tls_key={cls.p('client.key')}", "--tls_server_name=localhost"]
        cls.no_client_cert = [f"--tls_ca={cls.p('ca.pem')}", "--tls_server_name=localhost"]

    def test_worker_with_mtls_gets_the_daemons_decisions(self):
        # A generous deadline: on a loaded machine a late answer would be a (correct)
        # fallback, and this test is about the handshake, not latency.
        s, rows, err = self.run_worker(
            "tls-worker", [*self.mtls, "--decision_deadline=5s", "--connect_timeout=30s"])
        self.assertEqual(s["local_decisions"], 0, err)
        self.assertEqual({row[3] for row in rows}, {"daemon"}, rows)

    def test_worker_without_a_client_certificate_is_refused_and_falls_back(self):
        s, rows, err = self.run_worker(
            "tls-worker-nocert",
            [*self.no_client_cert, "--decision_deadline=50ms", "--connect_timeout=1s"])
        self.assertEqual(s["local_decisions"], STEPS, err)
        self.assertEqual({(row[2], row[3]) for row in rows},
                         {("controller_unavailable", "fallback")}, rows)
        self.assertIn("not connected", err)

    def test_sim_with_mtls_gets_the_daemons_decisions(self):
        s, decided, err = self.run_sim(
            "tls-sim", [*self.mtls, "--deadline=5s", "--connect_timeout=30s"])
        self.assertEqual(s["local_decisions"], 0, err)
        self.assertEqual(s["decision_sources"], {"daemon": decided}, err)

    def test_sim_without_a_client_certificate_is_refused_and_falls_back(self):
        s, decided, err = self.run_sim(
            "tls-sim-nocert", [*self.no_client_cert, "--deadline=50ms", "--connect_timeout=1s"])
        self.assertEqual(s["local_decisions"], decided, err)
        # Never registered: not waited for at the end (the flush's 30 s).
        self.assertIn("never registered with", err)
        self.assertEqual(s["decision_sources"], {"fallback": decided}, err)


class BadTlsFlagsTest(unittest.TestCase):
    """Refused before anything is dialled (and, for the worker, before MPI starts)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-tls-flags-")
        make_certs(self.tmp)
        open(os.path.join(self.tmp, "empty.pem"), "w").close()

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def cases(self):
        p = lambda name: os.path.join(self.tmp, name)  # noqa: E731
        return [
            ([f"--tls_cert={p('client.pem')}"], "--tls_cert and --tls_key go together"),
            ([f"--tls_ca={p('ca.pem')}", f"--tls_key={p('client.key')}"],
             "--tls_cert and --tls_key go together"),
            ([f"--tls_ca={p('missing.pem')}"], f"--tls_ca: cannot read \"{p('missing.pem')}\""),
            ([f"--tls_ca={p('empty.pem')}"], f"--tls_ca: \"{p('empty.pem')}\" is empty"),
            ([f"--tls_ca={p('ca.pem')}", f"--tls_cert={p('client.pem')}",
              f"--tls_key={p('missing.key')}"], "--tls_key: cannot read"),
            (["--tls_server_name=localhost"], "--tls_server_name needs TLS"),
        ]

    def check(self, cmd, message):
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, f"{cmd}\n{r.stdout}\n{r.stderr}")
        self.assertIn(message, r.stderr, cmd)

    def test_worker_refuses_bad_tls_flags(self):
        for flags, message in self.cases():
            with self.subTest(flags=flags):
                self.check([ARGS.worker, "--controller=127.0.0.1:1", "--job_id=tls-flags", "--steps=1", *flags], message)
        # Under mpirun too, as a job is really started.
        flags, message = self.cases()[0]
        self.check([ARGS.mpirun, "--oversubscribe", "-np", "2", ARGS.worker, *WORKER_SMALL,
                    "--controller=127.0.0.1:1", "--job_id=tls-flags", "--steps=1", *flags], message)

    def test_sim_refuses_bad_tls_flags(self):
        for flags, message in self.cases():
            with self.subTest(flags=flags):
                self.check([ARGS.sim, "--controller=127.0.0.1:1", "--job_id=tls-flags", "--groups=1", "--tp=2",
                            "--steps=1", *flags], message)


if __name__ == "__main__":
    client_runs.main(sys.modules[__name__])
