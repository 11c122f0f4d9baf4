#!/usr/bin/env python3
"""The benchmark drivers whose figures docs/benchmarks.md quotes: the replay table's
paired statistics and report (bench/worker/replay_table.py), the decision-quality
targets per cell (bench/sim/decision_quality.py) and the ADAPTIVE ablation over the
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

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
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
        self.assertAlmostEqual(cov, self.coverage(20, 6))
        self.assertGreaterEqual(cov, 0.95)
        self.assertLess(self.coverage(20, 7), 0.95)

    def test_too_few_rounds_have_no_interval(self):
        self.assertIsNone(replay_table.median_ci([1.0, 1.1, 0.9, 1.2, 1.05])[1])
        self.assertEqual(replay_table.tie_verdict(None), "too few rounds")

    def test_verdicts(self):
        self.assertTrue(replay_table.tie_verdict((0.975, 1.02, 0.96)).startswith("tie"))
        self.assertTrue(replay_table.tie_verdict((0.88, 0.95, 0.96)).startswith("apart"))
        self.assertTrue(replay_table.tie_verdict((1.04, 1.10, 0.96)).startswith("apart"))
        # Below 1 but touching the band: slower, not shown to be by more than the band.
        self.assertTrue(replay_table.tie_verdict((0.856, 0.974, 0.96)).startswith("slower"))
        self.assertTrue(replay_table.tie_verdict((1.01, 1.05, 0.96)).startswith("faster"))
        # Spanning 1 and leaving the band: neither shown.
        self.assertEqual(replay_table.tie_verdict((0.95, 1.01, 0.96)), "not separated")
        self.assertEqual(replay_table.tie_verdict((0.90, 1.10, 0.96)), "not separated")


def summary(tps, peak, decisions):
    """A spgate-worker summary with the keys the replay table reads."""
    return {"effective_tokens_per_s": {"all": tps}, "step_time_p95_s": {"all": 1e4 / tps},
            "peak_memory_bytes": {"all": peak}, "rs_wait_share_mean": 0.2,
            "norm_stall_ratio_mean": 0.0, "mean_length_cv": {"all": 0.1},
            "decisions": decisions}


class ReplayTableReportTest(unittest.TestCase):
    """build_table and report_lines on made-up rounds whose answers are known."""

    def results(self, factor, peaks, rounds=12):
        # Round r's load scales every row by load[r]: pairing by round must cancel it.
        load = [1.0 + 0.5 * (r % 3) for r in range(rounds)]
        out = {}
        for name, _ in replay_table.ROWS:
            out[name] = [summary(10000 * factor[name] * load[r] * (1 + 0.001 * r), peaks[name],
                                 {"sp": {"adaptive": 1}}) for r in range(rounds)]
        return out

    def base(self):
        factor = {name: 0.9 for name, _ in replay_table.ROWS}
        factor["pure TP"] = 1.0
        peaks = {name: 68 for name, _ in replay_table.ROWS}
        peaks["pure TP"] = 100
        return factor, peaks

    def test_pairing_cancels_round_load(self):
        factor, peaks = self.base()
        table = replay_table.build_table(self.results(factor, peaks))
        rows = {r["configuration"]: r for r in table}
        sp = rows["SP + bucketing"]
        # Every round's ratio is exactly 0.9 although the rounds' loads differ by 2x.
        self.assertAlmostEqual(sp["tokens_per_s_paired_ratio"], 0.9)
        self.assertAlmostEqual(sp["tokens_per_s_paired_ratio_ci"][0], 0.9)
        self.assertAlmostEqual(sp["tokens_per_s_paired_ratio_ci"][1], 0.9)
        self.assertTrue(sp["tokens_per_s_vs_pure_tp"].startswith("apart"))
        self.assertAlmostEqual(sp["peak_memory_rel"], 0.68)

    def report(self, factor, peaks):
        """The report's lines, and its Targets line."""
        lines = replay_table.report_lines(replay_table.build_table(self.results(factor, peaks)))
        return lines, next(l for l in lines if l.startswith("Targets:"))

    def test_targets_when_the_modes_tie(self):
        factor, peaks = self.base()
        factor["SP + bucketing + LayerNorm kept in shard"] = 1.0
        factor["spgate auto"] = 1.02      # the best static row
        factor["spgate adaptive"] = 1.05  # not static: never the row to beat
        peaks["spgate adaptive"] = 100
        lines, targets = self.report(factor, peaks)
        self.assertIn("1.03x the best static row's (spgate auto): met", targets)
        self.assertIn("tie (within", targets)
        self.assertIn("Peak 1.00x pure TP's: MISSED", targets)
        self.assertIn("so the target applies", targets)
        capped = next(l for l in lines if l.startswith("With the memory budget"))
        self.assertIn("peak 0.68x", capped)
        self.assertIn("0.88x the best static row's and 0.90x SP's", capped)

    def test_targets_when_the_modes_do_not_tie(self):
        factor, peaks = self.base()
        factor["spgate adaptive"] = 0.95
        _, targets = self.report(factor, peaks)
        self.assertIn("0.95x the best static row's (pure TP): MISSED", targets)
        self.assertIn("Peak 0.68x pure TP's: met", targets)
        self.assertIn("which this run does not show", targets)


class DecisionQualityTargetsTest(unittest.TestCase):
    """decision_quality.evaluate's per-cell target checks."""

    def cmp(self, sp, tp, static, adaptive, oracle, p95_static=1.0, p95_adaptive=1.0):
        c = {p: {"effective_tokens_per_s": v} for p, v in
             (("sp", sp), ("tp_only", tp), ("static", static), ("adaptive", adaptive),
              ("oracle", oracle))}
        c["static"]["step_time_p95_s"] = p95_static
        c["adaptive"].update(step_time_p95_s=p95_adaptive, probe_steps=1, sp_steps=5,
                             tp_only_steps=5)
        return c

    def test_half_the_gap_applies_from_three_percent(self):
        dq = adaptive_ablation.dq
        # Oracle 4 % over the best fixed (sp, 100): capturing 1 of 4 misses, 2 of 4 meets.
        _, miss = dq.evaluate(self.cmp(100, 95, 96, 101, 104), "packed", "t", "r")
        self.assertEqual(miss, ["half the gap"])
        _, miss = dq.evaluate(self.cmp(100, 95, 96, 102, 104), "packed", "t", "r")
        self.assertEqual(miss, [])
        # Exactly 3 %: the target applies; capturing none of it misses.
        _, miss = dq.evaluate(self.cmp(100, 95, 100, 100, 103), "packed", "t", "r")
        self.assertEqual(miss, ["half the gap"])
        # A 2.5 % gap: capturing none of it misses nothing (the target does not apply).
        _, miss = dq.evaluate(self.cmp(100, 95, 100, 100, 102.5), "packed", "t", "r")
        self.assertEqual(miss, [])

    def test_static_and_p95(self):
        row, miss = adaptive_ablation.dq.evaluate(
            self.cmp(95, 96, 100, 99.9, 101, p95_static=1.0, p95_adaptive=1.03), "b", "t", "r")
        self.assertEqual(miss, [">= static", "p95 <= 1.02 static"])
        self.assertIn("MISSED: >= static, p95 <= 1.02 static", row)


class DecisionQualityRegretTest(unittest.TestCase):
    """decision_quality.evaluate_regret's windowed targets on made-up cells."""

    def cmp(self, median=0.005, p95=0.02, lowest=0.995, explore=0.004):
        c = {}
        for p, tps in (("sp", 100.0), ("tp_only", 95.0), ("static", 98.0), ("adaptive", 99.0),
                       ("oracle", 101.0)):
            c[p] = {"effective_tokens_per_s": tps, "regret_window_median": 0.01,
                    "regret_window_p95": 0.02, "regret_window_worst": 0.03,
                    "worst_window_vs_best_fixed": 1.0, "min_window_vs_best_fixed": 1.0,
                    "oracle_agreement": 0.5, "flips_per_1000_steps": 10.0, "explore_share": 0.0}
        c["adaptive"].update(regret_window_median=median, regret_window_p95=p95,
                             regret_window_worst=0.04, worst_window_vs_best_fixed=0.998,
                             min_window_vs_best_fixed=lowest, explore_share=explore)
        return c

    def test_targets(self):
        dq = adaptive_ablation.dq
        row, miss = dq.evaluate_regret(self.cmp(), "cell", stationary=True)
        self.assertEqual(miss, [])
        self.assertIn("| cell | 1.00 / 0.50 | 2.00 / 2.00 | 3.00 / 4.00 | 1.00 / 3.00 (sp) |", row)
        self.assertIn("| 0.9980, 0.9950 |", row)
        self.assertTrue(row.endswith("| all met |"))
        _, miss = dq.evaluate_regret(self.cmp(median=0.0101, p95=0.031, lowest=0.989,
                                              explore=0.006), "cell", stationary=True)
        self.assertEqual(miss, ["median <= 1 %", "p95 <= 3 %", "no window > 1 % below best fixed",
                                "explore <= 0.5 %"])
        # Exploration is a target only where nothing changes.
        row, miss = dq.evaluate_regret(self.cmp(explore=0.006), "cell", stationary=False)
        self.assertEqual(miss, [])
        self.assertIn("0.600 (not stationary)", row)


class DecisionQualityPipelineTest(unittest.TestCase):
    """decision_quality's PP cells: the row of a made-up cell, and a short run of each."""

    def cmp(self, tps, over_tp=0):
        stages = lambda share, over=0: [{"tp_only_share": share, "over_limit_steps": over,
                                         "peak_memory_bytes": 2 ** 30} for _ in range(4)]
        c = {p: {"effective_tokens_per_s": v, "stages": stages(0.5), "bubble_share": 0.25,
                 "p2p_bytes_per_step": 2 ** 20, "p2p_native_bytes_per_step": 2 ** 22}
             for p, v in tps.items()}
        c["tp_only"]["stages"] = stages(1.0, over_tp)
        c["pipeline"] = {"memory_limit_bytes": 2 * 2 ** 30}
        return c

    def test_row(self):
        dq = adaptive_ablation.dq
        tps = {"sp": 90.0, "tp_only": 96.0, "static": 97.0, "adaptive": 98.0, "oracle": 100.0}
        row, over = dq.evaluate_pp(self.cmp(tps), "cell")
        self.assertEqual(over, 0)
        # The best fixed choice is tp_only (static is not fixed): oracle 100 / 96.
        self.assertIn("| 0.0417 (tp_only) | 1.0208 |", row)
        self.assertIn("| 1.00 / 1.00 / 1.00 / 1.00 | 1.0 / 1.0 / 1.0 / 1.0 (2.0) | 0 | 0.250 | 1 (4) |", row)
        _, over = dq.evaluate_pp(self.cmp(tps, over_tp=3), "cell")
        self.assertEqual(over, 12)

    def test_short_cells(self):
        dq = adaptive_ablation.dq
        rows, cells, regret_rows, _ = dq.run_pp_cells(SIM, 80, 1)
        self.assertEqual(len(rows), len(dq.PP_CELLS))
        self.assertEqual(len(regret_rows), len(dq.PP_CELLS))
        by_name = {c["name"]: c["compare"] for c in cells}
        for name, cmp in by_name.items():
            self.assertEqual(cmp["oracle"]["ratio_to_oracle"], 1.0, name)
            self.assertEqual(cmp["pipeline"]["pp"], 4, name)
            self.assertEqual(cmp["pipeline"]["steps"], 10, name)  # 80 micro-batches of 8
            for p in dq.POLICIES:
                self.assertEqual(sum(s["over_limit_steps"] for s in cmp[p]["stages"]), 0, (name, p))
        tight = by_name["pp4_m8_memory_tight"]["tp_only"]["stages"]
        self.assertLess(tight[0]["tp_only_share"], tight[3]["tp_only_share"])


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
        cells = len(list(adaptive_ablation.dq.grid()))
        for config, v in variants.items():
            self.assertIn(f"| {v['variant']} | {v['cells_below_static']} (", md)
            # The knobs are ADAPTIVE's alone: every other policy runs exactly the same.
            self.assertEqual(v["others"], base["others"], config)
            self.assertEqual(len(v["others"]), cells)
        # And the knobs reach ADAPTIVE: no variant decides exactly as the defaults do.
        for config, v in variants.items():
            if config:
                self.assertNotEqual(
                    (v["tp_only_share"], v["probe_steps"], v["mean_ratio_to_oracle"]),
                    (base["tp_only_share"], base["probe_steps"], base["mean_ratio_to_oracle"]),
                    config)

    def test_summarize(self):
        def cell(sp, tp, static, adaptive, p95_static, p95_adaptive, probes, tp_steps):
            c = {p: {"effective_tokens_per_s": v, "ratio_to_oracle": v / 100.0}
                 for p, v in (("sp", sp), ("tp_only", tp), ("static", static),
                              ("oracle", 100.0), ("adaptive", adaptive))}
            c["static"]["step_time_p95_s"] = p95_static
            c["adaptive"].update(step_time_p95_s=p95_adaptive, probe_steps=probes,
                                 sp_steps=100 - tp_steps, tp_only_steps=tp_steps)
            return c
        got = adaptive_ablation.summarize([cell(90, 95, 98, 97, 1.0, 1.03, 3, 40),
                                           cell(99, 90, 96, 98, 1.0, 1.01, 5, 10)])
        self.assertEqual(got["cells_below_static"], 1)
        self.assertAlmostEqual(got["worst_vs_static"], 97 / 98)
        self.assertEqual(got["cells_p95_over_1.02_static"], 1)
        self.assertAlmostEqual(got["mean_ratio_to_oracle"], 0.975)
        self.assertAlmostEqual(got["worst_ratio_to_oracle"], 0.97)
        self.assertAlmostEqual(got["worst_vs_best_fixed"], 97 / 98)  # cell 1: best fixed is static
        self.assertEqual(got["probe_steps"], 8)
        self.assertAlmostEqual(got["tp_only_share"], 50 / 200)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    args, rest = ap.parse_known_args()
    SIM = args.sim
    unittest.main(argv=[sys.argv[0]] + rest)
