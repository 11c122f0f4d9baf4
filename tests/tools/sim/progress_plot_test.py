"""spgate-sim's progress lines and --plot, end to end on the binary.

--progress prints lines on stderr and leaves the JSON on stdout the same (but its wall time)
(a replay --compare of a few hundred steps, and a short live run); without it, and with
stderr not a terminal, nothing is added. --plot writes a PNG (its signature, a size), and
a missing matplotlib, a missing interpreter or a bad path fails before the run with a
message that names what is wrong.

  python3 progress_plot_test.py --sim=build/bin/spgate-sim
"""

import argparse
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import unittest

SIM = None
REPLAY = ["replay", "--compare", "--steps=300", "--groups=2", "--tp=4",
          "--lengths=bimodal:short=512,long=8192,p_long=0.3"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LINE = re.compile(r"^spgate-sim replay --compare \(adaptive\): step (\d+)/300 \((\d+)%\)  "
                  r"[0-9.]+[kMG]? sim tok/s/job  SP \d+% TP-only \d+%  ETA \d+:\d\d$")


def run(args, env=None):
    return subprocess.run([SIM] + args, capture_output=True, text=True, timeout=120,
                          env=env)


class ProgressTest(unittest.TestCase):
    def test_progress_lines_on_stderr_json_unchanged(self):
        quiet = run(REPLAY)
        loud = run(REPLAY + ["--progress"])
        self.assertEqual(quiet.returncode, 0, quiet.stderr)
        self.assertEqual(loud.returncode, 0, loud.stderr)
        # The JSON, byte for byte but for the wall time the run took.
        wall = re.compile(r'"wall_s": [0-9.]+')
        self.assertEqual(wall.sub("", loud.stdout), wall.sub("", quiet.stdout))
        self.assertIn("compare", json.loads(loud.stdout))
        lines = [l for l in loud.stderr.splitlines() if LINE.match(l)]
        self.assertTrue(lines, loud.stderr)
        self.assertEqual(LINE.match(lines[-1]).group(1), "300")  # the last line: all done
        # stderr is a pipe: no lines unasked
        self.assertFalse([l for l in quiet.stderr.splitlines() if LINE.match(l)], quiet.stderr)
        self.assertNotIn("tok/s/job", quiet.stderr)
        # The same text but for the run's wall time ("0.01 s wall").
        wall_text = re.compile(r"[0-9.]+ s wall")
        self.assertEqual(wall_text.sub("", run(REPLAY + ["--progress=false"]).stderr),
                         wall_text.sub("", quiet.stderr))

    def test_live_run(self):
        r = run(["--steps=40", "--steps_per_s=200", "--groups=2", "--tp=2", "--progress"])
        self.assertEqual(r.returncode, 0, r.stderr)
        json.loads(r.stdout)
        self.assertRegex(r.stderr, r"(?m)^spgate-sim: step 40/40 \(100%\)  [0-9.]+[kMG]? tok/s/job  "
                                   r"SP \d+% TP-only \d+%  ETA 0:00$")


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.png = os.path.join(self.dir.name, "compare.png")

    def tearDown(self):
        self.dir.cleanup()

    def test_writes_a_png(self):
        r = run(REPLAY + [f"--plot={self.png}"])
        self.assertEqual(r.returncode, 0, r.stderr)
        json.loads(r.stdout)
        with open(self.png, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE)
        self.assertGreater(len(data), 10000)  # a figure, not an empty canvas

    def fails_before_the_run(self, args, message, env=None):
        r = run(args, env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(message, r.stderr)
        self.assertEqual(r.stdout, "")  # nothing ran
        self.assertFalse(os.path.exists(self.png))

    def test_without_matplotlib(self):
        # Debian's python3 without its site packages (-S): matplotlib does not import.
        python = os.path.join(self.dir.name, "python-without-site")
        with open(python, "w") as f:
            f.write('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
        os.chmod(python, stat.S_IRWXU)
        env = dict(os.environ, SPGATE_PLOT_PYTHON=python)
        self.fails_before_the_run(REPLAY + [f"--plot={self.png}"], "python3-matplotlib", env)

    def test_missing_interpreter(self):
        env = dict(os.environ, SPGATE_PLOT_PYTHON=os.path.join(self.dir.name, "no-python"))
        self.fails_before_the_run(REPLAY + [f"--plot={self.png}"],
                                  "cannot run the plotting interpreter", env)

    def test_bad_paths_and_flags(self):
        self.fails_before_the_run(REPLAY + ["--plot=/nonexistent-spgate-dir/x.png"],
                                  "folder /nonexistent-spgate-dir does not exist")
        self.fails_before_the_run(REPLAY + [f"--plot={self.png}.txt"], "want a .png, .svg or .pdf")
        self.fails_before_the_run(["replay", "--steps=10", f"--plot={self.png}"],
                                  "--plot belongs to `spgate-sim replay --compare`")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    args, rest = ap.parse_known_args()
    SIM = os.path.abspath(args.sim)
    unittest.main(argv=[sys.argv[0]] + rest)
