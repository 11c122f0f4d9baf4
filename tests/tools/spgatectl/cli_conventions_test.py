#!/usr/bin/env python3
"""The command-line conventions of every binary, through the real binaries:

* --help of spgated, spgatectl, spgate-sim and spgate-worker lists flags of its own, and
  --version prints the project's version; a refused flag exits 2 (spgated's, the flag
  library's own too, as JSON under --log_format=json);
* against one live spgated (loopback, port 0, --log_format=json): spgatectl -o json and
  -o yaml parse to the same document, SPGATE_ADMIN and its precedence under --admin,
  did-you-mean, `completion bash` driven as bash would, a pin before its job registers
  (gates set then saying no launch of it runs; jobs forget --operator_settings, bare),
  rollback to version 0, eval saying the memory gate is off (and refusing peaks with
  --budget=0);
* every line the daemon logged is one JSON object with time, level, message and fields.

Usage: cli_conventions_test.py --version=V --spgated=BIN --spgatectl=BIN --sim=BIN [--worker=BIN]
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import yaml

ARGS = None


def run(cmd, env=None, timeout=30):
    full = dict(os.environ)
    for k in list(full):
        if k.startswith("SPGATE_"):
            del full[k]
    full.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)


def civetweb_has_ipv6():
    """mg_check_feature(8) of the civetweb spgated links (prometheus-cpp's /metrics)."""
    try:
        return bool(ctypes.CDLL("libcivetweb.so.1").mg_check_feature(8))
    except OSError:
        return True  # no system civetweb to ask: the check below is skipped


class HelpAndVersion(unittest.TestCase):
    # (binary, a flag that binary defines)
    def cases(self):
        out = [(ARGS.spgated, "--state_dir"), (ARGS.spgatectl, "--admin"), (ARGS.sim, "--groups")]
        if ARGS.worker:
            out.append((ARGS.worker, "--controller"))
        return out

    def test_help_lists_own_flags(self):
        for binary, flag in self.cases():
            with self.subTest(binary=os.path.basename(binary)):
                r = run([binary, "--help"])
                text = r.stdout + r.stderr
                self.assertNotIn("No flags matched", text)
                self.assertIn(flag, text)

    def test_a_refused_flag_exits_2_and_help_exits_0(self):
        # 1 is a failed run; a flag the flags library refuses is a usage error like ours.
        for binary, flag in self.cases():
            if binary == ARGS.spgatectl:
                continue  # its own parser: test_did_you_mean and the usage errors below
            name = os.path.basename(binary)
            with self.subTest(binary=name):
                r = run([binary, "--no_such_flag=1"])
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("no_such_flag", r.stderr)
                r = run([binary, f"{flag}"])  # a string flag without its value
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(flag.lstrip("-"), r.stderr)
                r = run([binary, "--help"])
                self.assertEqual(r.returncode, 0, r.stderr)
                r = run([binary, "--help", "--no_such_flag=1"])
                self.assertEqual(r.returncode, 2, "help does not hide a refused flag")
        # spgated's own ranges, checked before a port is bound: the flag, its range, the value.
        for flag, message in (("--max_jobs=-1", "--max_jobs: must be >= 1, got -1"),
                              ("--decision_cache_steps=0",
                               "--decision_cache_steps: must be in [1, 1000000], got 0"),
                              ("--handshake_timeout=2h", "--handshake_timeout: must be in (0, 1h], got 2h"),
                              ("--shutdown_grace=-1s", "--shutdown_grace: must be >= 0, got -1s")):
            r = run([ARGS.spgated, flag, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                     "--metrics_listen="])
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(message, r.stderr)
        # A listen address of the wrong shape is refused before gRPC logs its own error.
        r = run([ARGS.spgated, "--listen=127.0.0.1:notaport", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen="])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--listen=127.0.0.1:notaport: not an address to listen on", r.stderr)
        self.assertNotIn("chttp2", r.stderr)
        # civetweb's port too (it failed at bind time, exit 1, "null context ... CivetServer").
        r = run([ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen=foo"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--metrics_listen=foo: not an address to listen on", r.stderr)
        # Two listeners on one address: said before a bind fails with gRPC's dump.
        r = run([ARGS.spgated, "--listen=127.0.0.1:52999", "--admin_listen=127.0.0.1:52999",
                 "--metrics_listen="])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--listen=127.0.0.1:52999 and --admin_listen=127.0.0.1:52999 would listen "
                      "on one socket", r.stderr)
        # A missing --config names the flag, as every start-up error does (exit 1).
        r = run([ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen=", "--config=/nonexistent/gates.textproto"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot start: --config: ", r.stderr)
        # Under --log_format=json a usage error is one JSON object on stderr, as every line.
        r = run([ARGS.spgated, "--log_format=json", "--shutdown_grace=-1s",
                 "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0", "--metrics_listen="])
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = [json.loads(line) for line in r.stderr.splitlines() if line.strip()]
        self.assertEqual([x.get("fields", {}).get("event") for x in lines], ["usage_error"],
                         r.stderr)
        self.assertEqual(lines[0]["level"], "error", r.stderr)
        self.assertEqual(lines[0]["fields"]["error"], "--shutdown_grace: must be >= 0, got -1s")
        # So are the flags library's own refusals, wherever --log_format stands (absl
        # reports them before it may have read it): one object each, exit 2.
        for args in (["--log_format=json", "--max_jobs=abc", "--bogus=1"],
                     ["--max_jobs=abc", "--bogus=1", "--log_format=json"]):
            r = run([ARGS.spgated] + args)
            self.assertEqual(r.returncode, 2, r.stderr)
            lines = [json.loads(line) for line in r.stderr.splitlines() if line.strip()]
            self.assertEqual([x["fields"]["event"] for x in lines], ["usage_error"] * 2, r.stderr)
            self.assertEqual({x["level"] for x in lines}, {"error"}, r.stderr)
            self.assertEqual(sorted(x["fields"]["error"] for x in lines),
                             ["Illegal value 'abc' specified for flag 'max_jobs'",
                              "Unknown command line flag 'bogus'"], r.stderr)
        r = run([ARGS.spgated, "--log_format=json", "--fromenv=max_jobs"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(json.loads(r.stderr)["fields"]["error"],
                         "FLAGS_max_jobs not found in environment", r.stderr)
        # In text they read as the flags library writes them.
        r = run([ARGS.spgated, "--max_jobs=abc"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr, "ERROR: Illegal value 'abc' specified for flag 'max_jobs'\n")
        # An IPv6 --metrics_listen where civetweb was built without IPv6 (Debian 12's): said
        # before anything binds (it was exit 1, "null context when constructing CivetServer").
        if not civetweb_has_ipv6():
            r = run([ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                     "--metrics_listen=[::1]:0"])
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--metrics_listen=[::1]:0: [::1]:0 listens on IPv6, but the civetweb "
                          "library spgated serves /metrics with was built without IPv6: give an "
                          "IPv4 address instead (127.0.0.1:0, ", r.stderr)
            self.assertNotIn("CivetServer", r.stderr)
        r = run([ARGS.sim, "--duration=abc"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("duration", r.stderr)
        r = run([ARGS.sim, "replay", "--no_such_flag=1"])
        self.assertEqual(r.returncode, 2)

    def test_version(self):
        for binary, _ in self.cases():
            with self.subTest(binary=os.path.basename(binary)):
                r = run([binary, "--version"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.strip(), f"{os.path.basename(binary)} {ARGS.version}")


class LiveDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spgate-cli-")
        cls.proc = subprocess.Popen(
            [ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
             "--metrics_listen=", f"--state_dir={cls.tmp}", "--log_format=json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cls.lines = []
        ready = threading.Event()

        def reader():
            for line in cls.proc.stderr:
                cls.lines.append(line)
                if '"serving"' in line:
                    ready.set()
        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(30):
            cls.proc.kill()
            raise AssertionError("spgated did not log 'serving': " + "".join(cls.lines))
        serving = json.loads(next(l for l in cls.lines if '"serving"' in l))
        cls.admin = f"127.0.0.1:{serving['fields']['admin_port']}"
        cls.worker_port = serving["fields"]["worker_port"]

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=20)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ctl(self, *args, env=None, admin=True):
        cmd = [ARGS.spgatectl] + ([f"--admin={self.admin}"] if admin else []) + list(args)
        return run(cmd, env=env)

    def test_json_and_yaml_are_the_same_document(self):
        for command in (["gates", "get"], ["jobs", "list"], ["gates", "history"]):
            with self.subTest(command=command):
                j = self.ctl(*command, "-o", "json")
                y = self.ctl(*command, "-o", "yaml")
                self.assertEqual(j.returncode, 0, j.stderr)
                self.assertEqual(y.returncode, 0, y.stderr)
                self.assertEqual(yaml.safe_load(y.stdout), json.loads(j.stdout))

    def test_admin_from_the_environment(self):
        # The variable alone reaches the daemon; a flag given wins over it.
        r = self.ctl("gates", "get", env={"SPGATE_ADMIN": self.admin}, admin=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.ctl("--admin=127.0.0.1:1", "--timeout=2s", "gates", "get",
                     env={"SPGATE_ADMIN": self.admin}, admin=False)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("UNAVAILABLE", r.stderr)
        r = self.ctl("gates", "get", env={"SPGATE_TIMEOUT": "soon"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("environment variable SPGATE_TIMEOUT", r.stderr)

    def test_did_you_mean(self):
        r = self.ctl("jbos", "list")
        self.assertEqual(r.returncode, 2)
        self.assertIn("did you mean jobs?", r.stderr)

    def complete(self, line):
        """COMPREPLY for `line` (the cursor at its end), as bash's programmable completion
        would compute it with the script `spgatectl completion bash` prints."""
        script = run([ARGS.spgatectl, "completion", "bash"]).stdout
        prog = (script + '\nCOMP_LINE="$1"; COMP_POINT=${#1}; COMP_WORDBREAKS=$\' \\t\\n"\\\'><=;|&(:\'\n'
                '_spgatectl; printf "%s\\n" "${COMPREPLY[@]}"\n')
        r = subprocess.run(["bash", "-c", prog, "complete", line], capture_output=True, text=True,
                           timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        return sorted(w for w in r.stdout.split("\n") if w)

    def test_completion_bash(self):
        cases = [
            ("spgatectl ", ["completion", "eval", "gates", "help", "jobs", "pin", "unpin", "watch"]),
            ("spgatectl j", ["jobs"]),
            ("spgatectl gates r", ["rollback"]),
            ("spgatectl -o json jobs s", ["show"]),
            ("spgatectl pin llama --gr", ["group="]),  # after '=' breaks: the value part
            ("spgatectl jobs list -o y", ["yaml"]),
            ("spgatectl completion z", ["zsh"]),
        ]
        for line, want in cases:
            with self.subTest(line=line):
                got = self.complete(line)
                if line.endswith("--gr"):
                    self.assertEqual(got, ["--group="])
                else:
                    self.assertEqual(got, want)

    def test_pin_before_register_then_rollback_to_zero(self):
        r = self.ctl("pin", "not-yet", "--mode=tp", "--for=10m")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("not registered yet", r.stdout)
        r = self.ctl("-o", "json", "jobs", "show", "not-yet")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(json.loads(r.stdout)["pins"]), 1)
        # Listed for its pin, with no launch: gates set says that, not "not known".
        r = self.ctl("gates", "set", "--job_id=not-yet", "--max_length_cv=0.31")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gates set: no launch of job not-yet is running", r.stderr)
        # A boolean flag works bare, as pin --force does, and drops the pin and override.
        r = self.ctl("jobs", "forget", "--operator_settings", "not-yet")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.ctl("jobs", "show", "not-yet")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("NOT_FOUND", r.stderr)
        r = self.ctl("gates", "set", "--max_length_cv=0.4")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.ctl("-o", "json", "gates", "rollback", "--to_version=0")
        self.assertEqual(r.returncode, 0, r.stderr)
        rolled = json.loads(r.stdout)
        self.assertEqual(rolled.get("overrides", {}), {})
        self.assertEqual(rolled["config"]["max_length_cv"], 0.18)  # the default again

    def test_eval_says_the_memory_gate_is_off(self):
        r = self.ctl("eval", "--lengths=4096,4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"\nmemory gate +off: no --budget")
        r = self.ctl("eval", "--lengths=4096,4096", "--peak_tp=79GiB")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--peak_tp needs --budget", r.stderr)
        r = self.ctl("eval", "--lengths=8192,8192", "--budget=0", "--peak_tp=5")
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("--peak_tp with --budget=0", r.stderr)

    def test_zz_log_lines_are_json(self):
        # Named to run last: the other tests' calls have been logged by now.
        self.assertTrue(self.lines)
        for line in self.lines:
            entry = json.loads(line)
            self.assertEqual(sorted(entry), ["fields", "level", "message", "time"], line)
            self.assertIn(entry["level"], ("info", "warning", "error"))
            self.assertRegex(entry["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
            self.assertIsInstance(entry["fields"], dict)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--version", required=True)
    p.add_argument("--spgated", required=True)
    p.add_argument("--spgatectl", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--worker", default="")
    ARGS, rest = p.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
