#!/usr/bin/env python3
"""spgate-worker end to end, without a daemon: bad flags, impossible shapes and an invalid
SPGATE_LAUNCH_CREDENTIAL are refused with exit status 2 and a message naming the flag (or
variable); a 4-rank job (tp=2, dp=2)
under mpirun with --verify writes the summary keys of docs/design.md §5, runs both
modes on a bimodal length mix with the local policy, keeps every TP group consistent,
matches SP to TP-only within tolerance, and writes one decision log per global rank;
with --memory_budget the memory gate keeps every step's measured peak under budget.

Usage: worker_cli_test.py --worker=BIN --mpirun=BIN
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1")
SMALL = ["--layers=1", "--hidden=32", "--heads=4", "--ffn_hidden=64"]


def run(args, np=None, timeout=120):
    cmd = [ARGS.worker] + args
    if np:
        cmd = [ARGS.mpirun, "--oversubscribe", "-np", str(np)] + cmd
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


class RefusalTest(unittest.TestCase):
    CASES = [
        (["--heads=6", "--hidden=96", "--tp=4"], "--heads=6 is not divisible by --tp=4"),
        (["--ffn_hidden=100", "--tp=8", "--heads=8"], "--ffn_hidden=100"),
        (["--hidden=100", "--heads=8"], "--hidden=100"),
        (["--backend=gpu"], "--backend=gpu"),
        (["--mode=sometimes"], "--mode=sometimes"),
        (["--norm_boundary=middle"], "--norm_boundary=middle"),
        (["--lengths=gaussian:mean=3"], "--lengths="),
        (["--tokens_per_batch=0"], "--tokens_per_batch"),
        (["--steps=0"], "--steps"),
        (["--tp=-1"], "--tp=-1"),
        (["--layers=0"], "--layers=0"),
        (["stray"], "unexpected argument 'stray'"),
    ]

    def test_refused_before_starting(self):
        for args, message in self.CASES:
            with self.subTest(args=args):
                r = run(args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)

    # Where spgate-worker takes a job id from when --job_id is not given
    # (worker/client/identity.cc, JobIdFromEnvironment).
    JOB_ID_ENV = ("SPGATE_JOB_ID", "SLURM_JOB_NAME")

    def test_controller_without_job_id_is_refused(self):
        # No silent default job id: two jobs sharing one would get each other's decisions.
        env = {k: v for k, v in ENV.items() if k not in self.JOB_ID_ENV}
        cmd = [ARGS.worker, "--controller=127.0.0.1:1", "--connect_timeout=0", "--steps=1",
               *SMALL]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--job_id", r.stderr)
        self.assertNotIn("sources:", r.stdout, "refused at start-up, before any step")
        # The launcher's name stands in for the flag (the controller is unreachable, so
        # the step is the fallback's; what matters is that it is not refused).
        for var in self.JOB_ID_ENV:
            with self.subTest(env=var):
                r = subprocess.run(cmd, env=dict(env, **{var: "from-launcher"}),
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertNotIn("--job_id", r.stderr)

    def test_invalid_launch_credential_is_refused_naming_the_variable(self):
        # The credential comes from the environment only; a bad one is refused before MPI
        # starts, its value never printed. Without a controller it is not used.
        cmd = [ARGS.worker, "--controller=127.0.0.1:1", "--job_id=cred", "--connect_timeout=0",
               "--steps=1", *SMALL]
        for bad in ("too-short", "a credential with spaces"):
            with self.subTest(credential=bad):
                r = subprocess.run(cmd, env=dict(ENV, SPGATE_LAUNCH_CREDENTIAL=bad),
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn("SPGATE_LAUNCH_CREDENTIAL: ", r.stderr)
                self.assertNotIn(bad, r.stderr)
        r = subprocess.run([ARGS.worker, "--steps=1", *SMALL],
                           env=dict(ENV, SPGATE_LAUNCH_CREDENTIAL="too-short"),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_unknown_flag_is_named(self):
        r = run(["--tensor_parallel=2"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("tensor_parallel", r.stderr)

    def test_tp_must_divide_the_world(self):
        r = run(["--tp=3"] + SMALL[:1] + ["--heads=6", "--hidden=48", "--ffn_hidden=48"], np=4)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--tp=3", r.stderr)
        self.assertEqual(r.stderr.count("--tp=3"), 1, "only rank 0 should print the refusal")


class LocalRunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-worker-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_four_ranks_both_modes_verified(self):
        steps = 24
        summary = os.path.join(self.tmp, "s.json")
        prefix = os.path.join(self.tmp, "log")
        r = run(SMALL + ["--tp=2", "--lengths=bimodal:short=40,long=400,p_long=0.25,jitter=0.05",
                         "--tokens_per_batch=800", f"--steps={steps}", "--verify",
                         f"--summary_json={summary}", f"--decision_log={prefix}"], np=4,
                timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Counts and rates say what they count: group-steps, the job's tokens/s.
        self.assertIn("decisions (mode / reason: group-steps)", r.stdout)
        self.assertIn("per mode: group-steps; tokens/s of the job", r.stdout)
        with open(summary) as f:
            s = json.load(f)
        for key in ("steps", "decisions", "local_decisions", "consistency_violations",
                    "lost_telemetry", "effective_tokens_per_s", "step_time_p95_s",
                    "peak_memory_bytes", "verify_max_abs_diff"):
            self.assertIn(key, s)
        self.assertEqual(s["steps"], steps)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["lost_telemetry"], 0)
        # Two TP groups decide every step locally (no controller).
        self.assertEqual(s["local_decisions"], 2 * steps)
        self.assertEqual(set(s["decisions"]), {"sp", "tp_only"}, s["decisions"])
        self.assertIn("gates_passed", s["decisions"]["sp"])
        self.assertIn("length_cv", s["decisions"]["tp_only"])
        for key in ("sp", "tp_only", "all"):
            self.assertGreater(s["effective_tokens_per_s"][key], 0)
            self.assertGreater(s["step_time_p95_s"][key], 0)
        self.assertGreater(s["peak_memory_bytes"]["sp"], 0)
        self.assertLess(s["verify_max_abs_diff"], 1e-4)
        self.assertLessEqual(s["memory_prediction_max_rel_error"], 0.05)
        # One log per global rank; the two ranks of each TP group agree step by step.
        logs = []
        for rank in range(4):
            with open(f"{prefix}.rank{rank}.csv") as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], "step,mode,reason,source,stage,micro_batch")
            self.assertEqual(len(lines), steps + 1)
            logs.append(lines)
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(logs[2], logs[3])

    def test_grad_accum_steps_is_an_alias_of_microbatches(self):
        # A step is a loop over its micro-batches; --grad_accum_steps names that loop too,
        # warns, and runs what --microbatches runs (a row per micro-batch in the log).
        steps, m = 3, 2
        logs = {}
        for name, flag in (("alias", f"--grad_accum_steps={m}"), ("flag", f"--microbatches={m}")):
            prefix = os.path.join(self.tmp, name)
            r = run(SMALL + ["--tp=2", "--lengths=bimodal:short=40,long=400,p_long=0.25",
                             "--tokens_per_batch=800", f"--steps={steps}",
                             "--mode=alternate:1", f"--decision_log={prefix}", flag], np=2,
                    timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            warned = r.stderr.count("--grad_accum_steps is an alias of --microbatches")
            self.assertEqual(warned, 1 if name == "alias" else 0, r.stderr)
            with open(f"{prefix}.rank0.csv") as f:
                logs[name] = f.read().splitlines()
        self.assertEqual(len(logs["flag"]), 1 + steps * m)
        self.assertEqual(logs["alias"], logs["flag"])
        r = run(SMALL + ["--grad_accum_steps=3", "--microbatches=2"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--grad_accum_steps=3 is an alias of --microbatches", r.stderr)

    def test_forced_modes_and_file_lengths(self):
        lengths = os.path.join(self.tmp, "lengths.txt")
        with open(lengths, "w") as f:
            f.write("\n".join(str(n) for n in (17, 250, 3, 64, 129)) + "\n")
        for mode, label in (("sp", "sp"), ("tp", "tp_only")):
            summary = os.path.join(self.tmp, f"{mode}.json")
            r = run(SMALL + ["--tp=2", f"--lengths=file:{lengths}", "--tokens_per_batch=300",
                             "--steps=4", f"--mode={mode}", "--norm_boundary=gather",
                             f"--summary_json={summary}"], np=2)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(summary) as f:
                s = json.load(f)
            self.assertEqual(s["decisions"], {label: {"pinned": 4}})
            self.assertEqual(s["local_decisions"], 0)

    def test_memory_budget_gates_tp_only(self):
        # The same seeded batches three ways (tp=2, one group, local policy). First forced
        # SP, for the largest SP peak the memory model predicts for them; then with a
        # budget whose headroom (0.9, the default memory_headroom) just holds that: SP
        # always fits, TP-only (full-sequence activations) only on the smaller batches, so
        # the memory gate must turn some of the length gate's TP-only choices into SP and
        # no step may go over; then with a budget nothing fits.
        common = SMALL + ["--tp=2", "--lengths=bimodal:short=40,long=400,p_long=0.25,jitter=0.05",
                          "--tokens_per_batch=800", "--steps=16", "--seed=5"]
        def summary_of(name, extra):
            path = os.path.join(self.tmp, f"{name}.json")
            r = run(common + extra + [f"--summary_json={path}"], np=2)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(path) as f:
                return json.load(f)
        sp = summary_of("sp", ["--mode=sp"])
        max_sp = sp["predicted_peak_memory_bytes"]["sp"]
        budget = int(max_sp / 0.9) + 1
        s = summary_of("budget", [f"--memory_budget={budget}"])
        self.assertEqual(s["consistency_violations"], 0)
        self.assertGreater(s["decisions"]["sp"].get("memory_requires_sp", 0), 0, s["decisions"])
        self.assertNotIn("memory_over_budget", s["decisions"].get("sp", {}))
        # Measured, not predicted: no step's peak went over budget x headroom.
        self.assertLessEqual(s["peak_memory_bytes"]["all"], 0.9 * budget, s["peak_memory_bytes"])
        for reason in s["decisions"].get("tp_only", {}):  # a threshold gate chose it
            self.assertIn(reason, ("length_cv", "rs_wait"), s["decisions"])
        tiny = summary_of("tiny", ["--memory_budget=1024"])
        self.assertEqual(tiny["decisions"], {"sp": {"memory_over_budget": 16}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--mpirun", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
