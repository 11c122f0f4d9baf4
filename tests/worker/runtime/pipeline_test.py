#!/usr/bin/env python3
"""spgate-worker with pipeline stages (TP2 x PP2, 4 ranks, 1F1B over 4 micro-batches)
under spgated (docs/design.md §12):

  - the schedule-aware memory gate, end to end: with a budget that fits the first stage
    only when all its micro-batches run SP (it holds two at once) and fits TP-only on the
    last stage (it holds one), every micro-batch wanting TP-only runs SP on the first
    stage and TP-only on the last, and every rank's measured peak stays under the budget;
  - the daemon killed mid-run: every stage finishes every step, the two ranks of each
    stage's TP group log identical decisions, no decision waits past its deadline, and
    after the kill the decisions are the fallback's;
  - the decision log has a row per (step, micro-batch) with the stage, and the summary
    has `layout`, `stages` and `p2p_size_mismatches` (0);
  - every step's group record reaches the daemon with its micro-batch records, none
    refused;
  - --verify per stage: each stage's layers agree in both modes;
  - --recompute: the first stage's peak falls, and the predicted stage peak still matches
    the measured one.

Usage: pipeline_test.py --worker=BIN --spgated=BIN --mpirun=BIN
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing"))
import proc_util  # noqa: E402
from worker_daemon_kill_test import metric, scrape, start_daemon  # noqa: E402

ARGS = None
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
MICROBATCHES = 4
# Every micro-batch is 64, 64, 512 tokens: a length CV of 0.99, above the gate's 0.5, so
# the policy wants TP-only for each, and alike, so each stage's peak is simple to bound.
PIPE = ["--tp=2", "--pp=2", f"--microbatches={MICROBATCHES}", "--layers=2", "--hidden=64",
        "--heads=4", "--ffn_hidden=128", "--tokens_per_batch=640"]
HEADROOM = 0.90  # spgated's default memory_headroom


def run_job(args, timeout=180):
    cmd = [ARGS.mpirun, "--oversubscribe", "-np", "4", ARGS.worker, *PIPE, *args]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    return r, cmd


class PipelineTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spgate-pipeline-")
        self.lengths = os.path.join(self.tmp, "lengths.txt")
        with open(self.lengths, "w") as f:
            f.write("64\n64\n512\n")
        self.daemon = None

    def tearDown(self):
        if self.daemon is not None:
            if self.daemon.poll() is None:
                self.daemon.kill()
            self.daemon.wait()
            self.daemon.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def summary_of(self, name, args):
        path = os.path.join(self.tmp, name + ".json")
        r, cmd = run_job([f"--lengths=file:{self.lengths}", f"--summary_json={path}", *args])
        self.assertEqual(r.returncode, 0, f"{cmd}\n{r.stdout}\n{r.stderr}")
        with open(path) as f:
            return json.load(f)

    def rows(self, prefix, rank):
        rows = [line.split(",") for line in proc_util.data_lines(f"{prefix}.rank{rank}.csv")]
        for row in rows:
            self.assertEqual(len(row), 6, row)
        return rows

    def test_the_first_stage_runs_sp_where_the_last_runs_tp_only(self):
        # What each stage holds in each mode, measured (every micro-batch alike).
        sp = self.summary_of("sp", ["--mode=sp", "--steps=2", "--verify"])
        tp = self.summary_of("tp", ["--mode=tp", "--steps=2"])
        # --verify per stage (after each step's measurements): every micro-batch through
        # each stage's layers in both modes agrees to fp32 tolerance.
        for stage in sp["stages"]:
            self.assertLess(stage["verify_max_abs_diff"], 1e-4, stage)
        self.assertNotIn("verify_max_abs_diff", tp["stages"][0])
        # Activation recompute: the first stage holds two micro-batches' input rows instead
        # of their activations, and the stage's predicted peak (the memory model with
        # recompute, through the schedule) still matches what it measured.
        tpr = self.summary_of("tp_recompute", ["--mode=tp", "--steps=2", "--recompute"])
        self.assertTrue(tpr["layout"]["recompute"])
        self.assertLess(tpr["stages"][0]["peak_memory_bytes"],
                        tp["stages"][0]["peak_memory_bytes"])
        self.assertLessEqual(tpr["memory_prediction_max_rel_error"], 0.05, tpr)
        self.assertLessEqual(tp["memory_prediction_max_rel_error"], 0.05, tp)
        # One-sided (docs/design.md §12): the gate's only margin is the headroom, so the
        # predicted stage peak is never more than 1 % under the measured one (5 % over, as
        # above). Every micro-batch and step is alike: a stage's maximum is every step's.
        for s in (sp, tp, tpr):
            for stage in s["stages"]:
                self.assertGreaterEqual(stage["predicted_peak_memory_bytes"],
                                        0.99 * stage["peak_memory_bytes"], stage)
        first_all_sp = sp["stages"][0]["peak_memory_bytes"]
        last_all_tp = tp["stages"][1]["peak_memory_bytes"]
        # The first stage holds two micro-batches, the last one: the first stage's all-SP
        # peak covers the last stage's TP-only one, and one TP-only micro-batch more on the
        # first stage would not fit.
        limit = max(first_all_sp, last_all_tp)
        self.assertLess(limit, tp["stages"][0]["peak_memory_bytes"])
        budget = math.ceil(limit / HEADROOM)

        self.daemon, port, metrics_port = start_daemon(ARGS.spgated, self.tmp)
        prefix = os.path.join(self.tmp, "decisions")
        s = self.summary_of("auto", [f"--controller=127.0.0.1:{port}", "--job_id=pipe-mem",
                                     f"--memory_budget={budget}", "--steps=6",
                                     "--decision_deadline=5s", "--connect_timeout=30s",
                                     f"--decision_log={prefix}"])
        self.assertEqual(s["layout"], {"tp": 2, "pp": 2, "dp": 1, "microbatches": 4,
                                       "schedule": "1f1b", "stage_boundary": "sharded",
                                       "recompute": False})
        # Each micro-batch's boundary message is t x smaller than the whole sequence: 640
        # tokens x 64 hidden / 2 ranks x 4 bytes, forward and backward, every rank.
        self.assertEqual(s["p2p_bytes_sent"], 6 * MICROBATCHES * 4 * (640 // 2) * 64 * 4)
        self.assertEqual(s["p2p_size_mismatches"], 0)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["local_decisions"], 0, s)
        first, last = s["stages"]
        self.assertEqual(first["decisions"], {"sp": {"memory_requires_sp": 6 * MICROBATCHES}}, s)
        self.assertEqual(last["decisions"], {"tp_only": {"length_cv": 6 * MICROBATCHES}}, s)
        for stage in s["stages"]:
            self.assertLessEqual(stage["peak_memory_bytes"], budget * HEADROOM, stage)
        # A row per (step, micro-batch) on every rank, the stage in its column, the TP
        # group's two ranks alike.
        for rank in range(4):
            rows = self.rows(prefix, rank)
            self.assertEqual(len(rows), 6 * MICROBATCHES)
            self.assertEqual({r[4] for r in rows}, {str(rank // 2)})
            self.assertEqual([(int(r[0]), int(r[5])) for r in rows],
                             [(n, i) for n in range(6) for i in range(MICROBATCHES)])
            self.assertEqual({r[3] for r in rows}, {"daemon"})
        self.assertEqual(self.rows(prefix, 0), self.rows(prefix, 1))
        self.assertEqual(self.rows(prefix, 2), self.rows(prefix, 3))
        # Every step's group record, with its micro-batch records (what each stage's
        # ADAPTIVE learns from), was taken: one per (stage, step), none refused.
        text = scrape(metrics_port)
        self.assertEqual(metric(text, "spgate_telemetry_records_total", {"result": "accepted"}),
                         2 * 6, text)
        self.assertIn(metric(text, "spgate_telemetry_records_total", {"result": "rejected"}),
                      (None, 0.0), text)

    def test_the_daemon_killed_mid_run(self):
        self.daemon, port, _ = start_daemon(ARGS.spgated, self.tmp)
        steps, deadline_s = 60, 0.2
        prefix = os.path.join(self.tmp, "decisions")
        summary = os.path.join(self.tmp, "kill.json")
        cmd = [ARGS.mpirun, "--oversubscribe", "-np", "4", ARGS.worker, *PIPE,
               "--lengths=bimodal:short=64,long=512,p_long=0.3",
               f"--controller=127.0.0.1:{port}", "--job_id=pipe-kill", f"--steps={steps}",
               f"--decision_deadline={int(deadline_s * 1000)}ms", "--connect_timeout=30s",
               f"--decision_log={prefix}", f"--summary_json={summary}"]
        job = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        until = time.time() + 120
        while len(proc_util.data_lines(prefix + ".rank0.csv")) < 8 * MICROBATCHES:
            self.assertIsNone(job.poll(), "the job ended before the daemon was killed")
            self.assertLess(time.time(), until, "the job made no progress")
            time.sleep(0.05)
        self.daemon.kill()
        killed_at = len(proc_util.data_lines(prefix + ".rank0.csv")) // MICROBATCHES
        out, _ = job.communicate(timeout=180)
        self.assertEqual(job.returncode, 0, out)
        with open(summary) as f:
            s = json.load(f)
        self.assertEqual(s["steps"], steps)
        self.assertEqual(s["consistency_violations"], 0)
        self.assertEqual(s["p2p_size_mismatches"], 0)
        self.assertLessEqual(s["leader_decision_wait_max_s"], deadline_s + 0.25, s)
        self.assertLess(killed_at, steps, "the daemon was not killed mid-run")
        logs = [self.rows(prefix, r) for r in range(4)]
        for r in range(4):
            self.assertEqual(len(logs[r]), steps * MICROBATCHES, f"rank {r} did not finish")
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(logs[2], logs[3])
        for stage_rows in (logs[0], logs[2]):
            self.assertEqual(stage_rows[0][3], "daemon", "the first decision should be the daemon's")
            # Answers already on the wire when it died may still be used for a step or two.
            late = [r for r in stage_rows if int(r[0]) >= killed_at + 3]
            self.assertTrue(late)
            self.assertEqual({(r[2], r[3]) for r in late}, {("controller_unavailable", "fallback")})


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--spgated", required=True)
    ap.add_argument("--mpirun", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
