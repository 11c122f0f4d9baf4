#!/usr/bin/env python3
"""spgated re-reads --config on SIGHUP, through the real binary and its signal handling
(docs/design.md §5): a valid file changes the served thresholds (seen on /metrics), an
invalid one keeps the running config and sets spgate_config_last_reload_successful to 0,
and the next valid one sets it back to 1. Without any signal, --config_poll_interval
notices a file renamed over the config (as the kubelet and most tools replace files) and
applies the same rules. Without --config a SIGHUP logs one line saying there is nothing to
reload.

Usage: spgated_reload_test.py --spgated=BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

ARGS = None


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text, name, labels=None):
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in (labels or {}).items()):
            return float(value)
    return None


class ReloadHarness(unittest.TestCase):
    """One spgated with --config; subclasses pick --config_poll_interval."""
    POLL = "0"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-reload-")
        self.config = os.path.join(self.tmp, "gates.textproto")
        self.write("max_length_cv: 0.25\n")
        self.proc = subprocess.Popen(
            [ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
             "--metrics_listen=127.0.0.1:0", f"--config={self.config}",
             f"--config_poll_interval={self.POLL}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 30
        self.metrics_port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"metrics on port (\d+)", line)
            if m:
                self.metrics_port = int(m.group(1))
                break
        if self.metrics_port is None:
            self.proc.kill()
            self.fail("spgated did not report its ports")
        threading.Thread(target=self.drain, daemon=True).start()

    def drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def tearDown(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, text):
        with open(self.config, "w") as f:
            f.write(text)

    def replace(self, text):
        """A new file under a temporary name, renamed over the config."""
        tmp = os.path.join(self.tmp, ".gates.textproto.new")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.config)

    def threshold(self):
        return metric(scrape(self.metrics_port), "spgate_gate_threshold",
                      {"gate": "max_length_cv", "job_id": "_default"})

    def reload_ok(self):
        return metric(scrape(self.metrics_port), "spgate_config_last_reload_successful")

    def failure_lines(self):
        """The daemon's "config reload failed" log lines so far, oldest first."""
        return [line for line in list(self.log) if "config reload failed" in line]

    def wait_for(self, what, want, timeout=10):
        deadline = time.time() + timeout
        got = what()
        while got != want and time.time() < deadline:
            time.sleep(0.05)
            got = what()
        return got


class SighupReloadTest(ReloadHarness):
    POLL = "0"  # signals only, so every reload below is the signal's

    def test_sighup_reloads_and_a_bad_file_keeps_the_running_config(self):
        self.assertEqual(self.threshold(), 0.25)
        self.assertEqual(self.reload_ok(), 1)
        version = metric(scrape(self.metrics_port), "spgate_config_version", {"job_id": "_default"})

        self.write("max_length_cv: 0.3\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.wait_for(self.threshold, 0.3), 0.3, "".join(self.log))
        self.assertEqual(self.reload_ok(), 1)
        self.assertGreater(
            metric(scrape(self.metrics_port), "spgate_config_version", {"job_id": "_default"}),
            version)

        self.write("max_length_cv: nope\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.wait_for(self.reload_ok, 0), 0, "".join(self.log))
        self.assertEqual(self.threshold(), 0.3, "an invalid file must not change the config")
        self.assertTrue(self.wait_for(lambda: any("config reload failed" in l for l in self.log),
                                      True), "".join(self.log))

        # Parses, but out of range. The gauge is already 0 and the threshold must not move,
        # so neither can show that this reload happened: wait for its own failure line
        # (one more than so far, naming the field) before checking that nothing changed.
        failed_so_far = len(self.failure_lines())
        self.write("max_length_cv: 20\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertTrue(self.wait_for(lambda: len(self.failure_lines()) > failed_so_far, True),
                        "no reload-failure line for the out-of-range file:\n" + "".join(self.log))
        self.assertIn("max_length_cv", self.failure_lines()[-1])
        self.assertEqual(self.reload_ok(), 0)
        self.assertEqual(self.threshold(), 0.3, "an out-of-range file must not change the config")

        self.write("max_length_cv: 0.35\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.wait_for(self.reload_ok, 1), 1, "".join(self.log))
        self.assertEqual(self.threshold(), 0.35)
        self.assertIsNone(self.proc.poll(), "spgated must survive every reload")

    def test_the_policy_is_set_by_name_in_the_file(self):
        def policy(name):
            return metric(scrape(self.metrics_port), "spgate_gate_policy",
                          {"job_id": "_default", "policy": name})
        self.assertEqual(policy("static"), 1)
        self.assertEqual(policy("adaptive"), 0)
        self.write("max_length_cv: 0.25\npolicy: ADAPTIVE\nadaptive_margin: 0.05\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.wait_for(lambda: policy("adaptive"), 1), 1, "".join(self.log))
        self.assertEqual(policy("static"), 0)
        self.assertEqual(metric(scrape(self.metrics_port), "spgate_gate_threshold",
                                {"job_id": "_default", "gate": "adaptive_margin"}), 0.05)
        self.write("policy: SOMETIMES\n")  # not a policy: refused, ADAPTIVE stays
        self.proc.send_signal(signal.SIGHUP)
        self.assertEqual(self.wait_for(self.reload_ok, 0), 0, "".join(self.log))
        self.assertEqual(policy("adaptive"), 1)


class PollReloadTest(ReloadHarness):
    POLL = "100ms"

    def test_a_renamed_file_is_reloaded_without_a_signal(self):
        self.assertEqual(self.threshold(), 0.25)
        self.replace("max_length_cv: 0.4\n")
        self.assertEqual(self.wait_for(self.threshold, 0.4), 0.4, "".join(self.log))
        self.replace("max_length_cv: nope\n")
        self.assertEqual(self.wait_for(self.reload_ok, 0), 0, "".join(self.log))
        self.assertEqual(self.threshold(), 0.4, "an invalid file must not change the config")
        self.replace("max_length_cv: 0.45\n")
        self.assertEqual(self.wait_for(self.reload_ok, 1), 1, "".join(self.log))
        self.assertEqual(self.threshold(), 0.45)
        self.assertTrue(any("changed on disk" in l for l in self.log), "".join(self.log))


class SighupWithoutConfigTest(unittest.TestCase):
    """Without --config a SIGHUP has nothing to reload: one line says so, in either log
    format, as a reload's own line would say what it did."""

    def sighup_line(self, log_format):
        proc = subprocess.Popen(
            [ARGS.spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
             "--metrics_listen=", f"--log_format={log_format}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in proc.stderr:
                lines.append(line)
                if "serving" in line:
                    break
            self.assertTrue(lines and "serving" in lines[-1], "".join(lines))
            proc.send_signal(signal.SIGHUP)
            proc.send_signal(signal.SIGTERM)  # handled after the SIGHUP: sigwait takes both
            rest = proc.stderr.read()
            self.assertEqual(proc.wait(timeout=15), 0, rest)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        skipped = [l for l in rest.splitlines() if "config reload" in l]
        self.assertEqual(len(skipped), 1, rest)
        return skipped[0]

    def test_a_sighup_without_config_says_there_is_nothing_to_reload(self):
        self.assertEqual(self.sighup_line("text"),
                         "spgated: WARNING: config reload skipped: no --config file to reload: "
                         "the daemon was started without --config; the config stays as it is")
        line = json.loads(self.sighup_line("json"))
        self.assertEqual(line["level"], "warning")
        self.assertEqual(line["fields"]["event"], "config_reload_skipped")
        self.assertIn("no --config file to reload", line["message"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--spgated", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
