#!/usr/bin/env python3
"""The benchmark drivers whose figures docs/benchmarks.md quotes: the replay table's
paired statistics (bench/worker/replay_table.py) and the ADAPTIVE ablation over the
decision-quality grid (bench/sim/adaptive_ablation.py), on a short grid.

Usage: bench_drivers_test.py --sim=BUILD/bin/spgate-sim
"""
import argparse
import json
import math
import os
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "worker"))
sys.path.insert(0, os.path.join(ROOT, "bench", "sim"))
import adaptive_ablation  # noqa: E402
import replay_table  # noqa: E402

SIM = None


class MedianIntervalTest(unittest.TestCase):
    def coverage(self, n, k):
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    def test_twelve_rounds_use_the_third_and_tenth(self):
        med, (lo, hi, cov) = replay_table.median_ci([12, 3, 7, 1, 9, 5, 11, 2, 8, 4, 10, 6])
        self.assertEqual(med, 6.5)
        self.assertEqual((lo, hi), (3, 10))
        self.assertAlmostEqual(cov, self.coverage(12, 3))
        self.assertGreaterEqual(cov, 0.95)
        # One step narrower would fall under 95 %: k is the largest that qualifies.
        self.assertLess(self.coverage(12, 4), 0.95)

    def test_twenty_rounds(self):
        _, (lo, hi, cov) = replay_table.median_ci(list(range(1, 21)))
        self.assertEqual((lo, hi), (6, 15))
        self.assertGreaterEqual(cov, 0.95)
        self.assertLess(self.coverage(20, 7), 0.95)

    def test_too_few_rounds_have_no_interval(self):
        self.assertIsNone(replay_table.median_ci([1.0, 1.1, 0.9, 1.2, 1.05])[1])
        self.assertEqual(replay_table.tie_verdict(None), "too few rounds")

    def test_verdicts(self):
        self.assertTrue(replay_table.tie_verdict((0.975, 1.02, 0.96)).startswith("tie"))
        self.assertTrue(replay_table.tie_verdict((0.88, 0.95, 0.96)).startswith("apart"))
        self.assertTrue(replay_table.tie_verdict((1.04, 1.10, 0.96)).startswith("apart"))
        # Straddling an edge of the band: neither shown.
        self.assertEqual(replay_table.tie_verdict((0.95, 1.01, 0.96)), "not separated")
        self.assertEqual(replay_table.tie_verdict((0.90, 1.10, 0.96)), "not separated")


class AblationTest(unittest.TestCase):
    def test_short_grid(self):
        with tempfile.TemporaryDirectory() as out:
            argv = sys.argv
            sys.argv = ["adaptive_ablation.py", f"--sim={SIM}", f"--out={out}", "--steps=300",
                        "--groups=2"]
            try:
                adaptive_ablation.main()
            finally:
                sys.argv = argv
            with open(os.path.join(out, "adaptive_ablation.json")) as f:
                variants = {v["config"]: v for v in json.load(f)["variants"]}
            with open(os.path.join(out, "adaptive_ablation.md")) as f:
                md = f.read()
        self.assertEqual(len(variants), len(adaptive_ablation.VARIANTS))
        base = variants[""]
        for config, v in variants.items():
            self.assertIn(v["variant"], md)
            # The knobs are ADAPTIVE's alone: every other policy runs exactly the same.
            self.assertEqual(v["others"], base["others"], config)
            self.assertEqual(len(v["others"]), 40)
        # Without the preference for SP on near-ties, ADAPTIVE runs TP-only at least as
        # often; a wider margin, at most as often.
        self.assertGreaterEqual(variants["adaptive_margin: 0.000001"]["tp_only_share"],
                                base["tp_only_share"])
        self.assertLessEqual(variants["adaptive_margin: 0.03"]["tp_only_share"],
                             base["tp_only_share"])
        # Less exploration, fewer probes.
        self.assertLess(variants["adaptive_explore_share: 0.01"]["probe_steps"],
                        base["probe_steps"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    args, rest = ap.parse_known_args()
    SIM = args.sim
    unittest.main(argv=[sys.argv[0]] + rest)
