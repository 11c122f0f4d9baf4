#!/usr/bin/env python3
"""The benchmark drivers whose figures docs/benchmarks.md quotes: the replay table's
paired statistics and report (bench/worker/replay_table.py), the decision-quality
targets per cell (bench/sim/decision_quality.py), the ADAPTIVE ablation over the
decision-quality grid (bench/sim/adaptive_ablation.py), on a short grid; the medians and
ranges over seeds (bench/sim/seeds.py) the seeded drivers report, on short runs of
decision_quality.py and adaptive_incumbent.py; that SP vs TP-only by sequence length
(bench/sim/sp_crossover.py) does not depend on the seed; and the chooser that reads only a
plan's length statistics (bench/sim/stats_reference.py) on a made-up cell and a short run.

Usage: bench_drivers_test.py --sim=BUILD/bin/spgate-sim
"""
import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "worker"))
sys.path.insert(0, os.path.join(ROOT, "bench", "sim"))
import adaptive_ablation  # noqa: E402
import adaptive_incumbent  # noqa: E402
import replay_table  # noqa: E402
import seeds  # noqa: E402
import sp_crossover  # noqa: E402
import stats_reference  # noqa: E402

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
        rows, cells, regret_rows, _, _ = dq.run_pp_cells(SIM, 80, 1)
        self.assertEqual(len(rows), len(dq.PP_CELLS))
        self.assertEqual(len(regret_rows), len(dq.PP_CELLS))
        by_name = {c["name"]: c["runs"][0]["compare"] for c in cells}
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
                        "--groups=2", "--seeds=11"]
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
        # The detector's count reaches the table, and the variant without it finds none (the
        # run is shorter than a half-life: no band comes back after one).
        self.assertGreater(base["changes_detected"], 0)
        self.assertEqual(variants["adaptive_change_threshold: 1"]["changes_detected"], 0)
        # And the knobs reach ADAPTIVE: no variant decides exactly as the defaults do —
        # but the floor's, whose probe runs (every 1,000 or 1,600 steps) first differ past
        # this run's 300 steps, and which must then decide exactly as they do.
        floor = variants["adaptive_explore_floor: 0.004"]
        self.assertEqual(
            (floor["tp_only_share"], floor["probe_steps"], floor["mean_ratio_to_oracle"]),
            (base["tp_only_share"], base["probe_steps"], base["mean_ratio_to_oracle"]))
        for config, v in variants.items():
            if config and config != "adaptive_explore_floor: 0.004":
                self.assertNotEqual(
                    (v["tp_only_share"], v["probe_steps"], v["mean_ratio_to_oracle"]),
                    (base["tp_only_share"], base["probe_steps"], base["mean_ratio_to_oracle"]),
                    config)

    def test_summarize(self):
        def cell(sp, tp, static, adaptive, p95_static, p95_adaptive, probes, tp_steps, changes=0):
            c = {p: {"effective_tokens_per_s": v, "ratio_to_oracle": v / 100.0}
                 for p, v in (("sp", sp), ("tp_only", tp), ("static", static),
                              ("oracle", 100.0), ("adaptive", adaptive))}
            c["static"]["step_time_p95_s"] = p95_static
            c["adaptive"].update(step_time_p95_s=p95_adaptive, probe_steps=probes,
                                 sp_steps=100 - tp_steps, tp_only_steps=tp_steps,
                                 changes_detected=changes)
            return c
        got = adaptive_ablation.summarize([cell(90, 95, 98, 97, 1.0, 1.03, 3, 40, 2),
                                           cell(99, 90, 96, 98, 1.0, 1.01, 5, 10, 7)])
        self.assertEqual(got["cells_below_static"], 1)
        self.assertAlmostEqual(got["worst_vs_static"], 97 / 98)
        self.assertEqual(got["cells_p95_over_1.02_static"], 1)
        self.assertAlmostEqual(got["mean_ratio_to_oracle"], 0.975)
        self.assertAlmostEqual(got["worst_ratio_to_oracle"], 0.97)
        self.assertAlmostEqual(got["worst_vs_best_fixed"], 97 / 98)  # cell 1: best fixed is static
        self.assertEqual(got["probe_steps"], 8)
        self.assertEqual(got["changes_detected"], 9)
        self.assertAlmostEqual(got["tp_only_share"], 50 / 200)

        # Three seeds per cell: per-cell medians, and the worst single seed beside them.
        seeds_a = [cell(90, 95, 98, a, 1.0, 1.0, 3, 40) for a in (97, 99, 98.5)]  # 97/98 once
        seeds_b = [cell(99, 90, 96, b, 1.0, p, 5, 10) for b, p in ((98, 1.01), (98, 1.03),
                                                                    (96, 1.05))]
        got = adaptive_ablation.summarize([seeds_a, seeds_b])
        self.assertEqual(got["cells_below_static"], 0)       # medians 98.5/98 and 98/96
        self.assertAlmostEqual(got["worst_vs_static"], 98.5 / 98)
        self.assertEqual(got["cells_below_static_any_seed"], 1)
        self.assertAlmostEqual(got["worst_seed_vs_static"], 97 / 98)
        self.assertEqual(got["cells_p95_over_1.02_static"], 1)  # cell b: median 1.03
        self.assertAlmostEqual(got["worst_vs_best_fixed"], 98 / 99)
        self.assertAlmostEqual(got["worst_seed_vs_best_fixed"], 96 / 99)
        self.assertEqual(got["probe_steps"], 8)
        self.assertEqual(len(got["others"]), 2)
        self.assertEqual(len(got["others"][0]), 3)


def run_main(main, argv):
    """main() under argv, its printed tables kept out of the test's output."""
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return main()
    finally:
        sys.argv = saved


class SeedsTest(unittest.TestCase):
    """bench/sim/seeds.py: the SEEDS list and each figure's median and range."""

    def test_parse(self):
        self.assertEqual(seeds.parse("11 12,13\t14"), [11, 12, 13, 14])
        self.assertEqual(seeds.parse(" 7 "), [7])
        for bad, msg in (("", "no seed"), ("1 x", "'x' is not a seed"), ("1 -2", "'-2'"),
                         ("3 4 3", "seed 3 is listed twice"), ("1.5", "'1.5'")):
            with self.assertRaises(SystemExit) as e:
                seeds.parse(bad)
            self.assertIn(msg, str(e.exception))

    def test_spread(self):
        per_seed = [{"r": 0.99, "stage": [1.0, 4.0], "best": "sp", "gap": None},
                    {"r": 0.97, "stage": [3.0, 2.0], "best": "tp_only", "gap": 0.5},
                    {"r": 1.02, "stage": [2.0, 6.0], "best": "sp", "gap": None}]
        sp = seeds.Spread(per_seed)
        self.assertEqual((sp.median["r"], sp.min["r"], sp.max["r"]), (0.99, 0.97, 1.02))
        self.assertEqual(sp.median["stage"], [2.0, 4.0])  # element-wise
        self.assertEqual((sp.min["stage"], sp.max["stage"]), ([1.0, 2.0], [3.0, 6.0]))
        self.assertEqual(sp.median["best"], "sp")          # the most common
        self.assertEqual(sp.median["gap"], 0.5)            # undefined seeds left out
        self.assertEqual(sp.fmt("r"), "0.9900 (0.9700–1.0200)")
        self.assertEqual(sp.fmt("r", "%.1f", 100), "99.0 (97.0–102.0)")
        self.assertEqual(seeds.Spread(per_seed[:1]).fmt("r"), "0.9900")  # one seed: no range
        self.assertIsNone(seeds.Spread([{"gap": None}]).median["gap"])
        self.assertEqual(sp.to_json()["max"]["stage"], [3.0, 6.0])

    def test_targets_on_the_medians(self):
        # ADAPTIVE over static per seed 1.002, 0.999, 1.001: the median meets ">= static",
        # one seed misses it.
        cmp = DecisionQualityTargetsTest.cmp
        cells = [cmp(None, 95, 96, 100, 100 * r, 101) for r in (1.002, 0.999, 1.001)]
        row, miss = adaptive_ablation.dq.evaluate(cells, "packed", "t", "r")
        self.assertEqual(miss, [])
        self.assertTrue(row.endswith("| 1 of 3 | all met |"), row)
        self.assertIn("| 1.0010 (0.9990–1.0020) (static) |", row)


class SeededDriversTest(unittest.TestCase):
    """Short runs of the seeded drivers over several seeds: the median / range keys."""

    def assert_spread(self, figures, per_seed, name):
        """figures: {"median", "min", "max"}; per_seed: each seed's figures."""
        for key, med in figures["median"].items():
            if not isinstance(med, float):
                continue
            vals = [f[key] for f in per_seed if f[key] is not None]
            self.assertAlmostEqual(med, statistics.median(vals), places=5, msg=(name, key))
            self.assertAlmostEqual(figures["min"][key], min(vals), places=5, msg=(name, key))
            self.assertAlmostEqual(figures["max"][key], max(vals), places=5, msg=(name, key))

    @staticmethod
    def run_driver(main, argv, json_name, md_name):
        """Runs a driver's main on SIM into a fresh folder: (its JSON, its markdown)."""
        with tempfile.TemporaryDirectory() as out:
            run_main(main, argv[:1] + [f"--sim={SIM}", f"--out={out}"] + argv[1:])
            with open(os.path.join(out, json_name)) as f:
                result = json.load(f)
            with open(os.path.join(out, md_name)) as f:
                return result, f.read()

    def test_decision_quality_pp(self):
        dq = adaptive_ablation.dq
        result, md = self.run_driver(
            dq.main, ["decision_quality.py", "--cells=pp", "--steps=80", "--groups=1",
                      "--seeds=11,12,13"], "decision_quality.json", "decision_quality_pp.md")
        self.assertEqual(result["seeds"], [11, 12, 13])
        self.assertIn("median over seeds 11, 12, 13 (range)", md)
        self.assertEqual(len(result["pp_cells"]), len(dq.PP_CELLS))
        differs = False
        for cell in result["pp_cells"]:
            self.assertEqual([r["seed"] for r in cell["runs"]], [11, 12, 13])
            per_seed = [dq.pp_figures(r["compare"]) for r in cell["runs"]]
            self.assertIn("--seed=12", cell["runs"][1]["command"])
            self.assert_spread(cell["figures"], per_seed, cell["name"])
            self.assert_spread(cell["regret_figures"],
                               [dq.regret_figures(r["compare"]) for r in cell["runs"]],
                               cell["name"])
            differs |= len({f["adaptive"] for f in per_seed}) > 1
            self.assertIn("| %s | %.4f (%.4f–%.4f) |" % (
                cell["name"], *(cell["figures"][k]["sp"] for k in ("median", "min", "max"))), md)
        self.assertTrue(differs, "the seeds drew the same noise")

    def test_adaptive_incumbent(self):
        result, md = self.run_driver(
            adaptive_incumbent.main,
            ["adaptive_incumbent.py", "--sets=stress", "--switch_costs=0", "--steps=100",
             "--groups=1", "--seeds=11 12 13"], "adaptive_incumbent.json", "adaptive_incumbent.md")
        self.assertEqual(result["seeds"], [11, 12, 13])
        self.assertEqual(len(result["cells"]), len(adaptive_incumbent.dq.STRESS))
        for cell in result["cells"]:
            per_seed = [s["figures"] for s in cell["seeds"]]
            self.assertEqual([s["seed"] for s in cell["seeds"]], [11, 12, 13])
            self.assert_spread({"median": cell["figures"], "min": cell["figures_min"],
                                "max": cell["figures_max"]}, per_seed, cell["cell"])
            # Targets on the medians; the seeds that miss one on their own figures.
            self.assertEqual(cell["missed"], adaptive_incumbent.misses(cell["figures"], 0, True))
            self.assertEqual(cell["seeds_missing_a_target"],
                             sum(bool(adaptive_incumbent.misses(f, 0, True)) for f in per_seed))
        worst = min(s["figures"]["vs_static"] for c in result["cells"] for s in c["seeds"])
        self.assertIn("worst single seed %.4f" % worst, md)

    def test_adaptive_incumbent_config(self):
        # --config reaches every run and the outputs name it; another exploration share
        # changes what ADAPTIVE explores on the same batches.
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "floor.txt")
            with open(config, "w") as f:
                f.write("adaptive_explore_share: 0.1\n")
            args = ["adaptive_incumbent.py", "--sets=stress", "--cells=jitter_10pct",
                    "--switch_costs=0", "--steps=400", "--groups=1", "--seeds=11"]
            base, _ = self.run_driver(adaptive_incumbent.main, args, "adaptive_incumbent.json",
                                      "adaptive_incumbent.md")
            result, md = self.run_driver(adaptive_incumbent.main, args + ["--config=" + config],
                                         "adaptive_incumbent.json", "adaptive_incumbent.md")
            self.assertEqual(base["config"], "")
            self.assertEqual(result["config"], "adaptive_explore_share: 0.1\n")
            self.assertIn("--config=" + config, result["cells"][0]["seeds"][0]["command"])
            self.assertIn("adaptive_explore_share: 0.1.", md)
            self.assertGreater(result["cells"][0]["figures"]["explore"],
                               base["cells"][0]["figures"]["explore"])
            missing = os.path.join(tmp, "missing.txt")
            with self.assertRaisesRegex(SystemExit, "--config: no file " + missing):
                run_main(adaptive_incumbent.main,
                         args[:1] + [f"--sim={SIM}", f"--out={tmp}", "--config=" + missing]
                         + args[1:])


class SpCrossoverSeedTest(unittest.TestCase):
    def test_no_seed_dependence(self):
        # One length, no noise: nothing is drawn, so the table is one run, not a median.
        base = sp_crossover.run_point(SIM, "h200-sxm", 8, 4096)
        other = sp_crossover.run_point(SIM, "h200-sxm", 8, 4096, ["--seed=7"])
        self.assertEqual(base, other)


class StatsReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if stats_reference.np is None:  # make deps installs it: a failure, not a skip
            raise AssertionError(stats_reference.NEEDS_NUMPY)

    @staticmethod
    def batches(n=4000):
        """Made-up batches whose faster mode follows the longest sequence alone (TP-only
        above 3,000 tokens), with CV and tokens drawn apart from it."""
        import numpy as np
        rng = np.random.default_rng(5)
        mx = rng.integers(500, 6000, n).astype(float)
        sp = np.full(n, 1.0)
        tp = np.where(mx > 3000, 0.9, 1.1)
        return {"group": np.zeros(n), "step": np.arange(n, dtype=float),
                "stage": np.zeros(n), "microbatch": np.zeros(n),
                "sequences": rng.integers(2, 12, n).astype(float),
                "tokens": rng.integers(8000, 16384, n).astype(float), "max_length": mx,
                "length_cv": rng.uniform(0.2, 1.2, n), "band": np.floor((mx + 500) / 1000),
                "sp_expected_s": sp,
                "tp_only_expected_s": tp, "sp_s": sp * 1.01, "tp_only_s": tp * 1.01}

    def test_a_chooser_finds_the_statistic_that_decides(self):
        b = self.batches()
        truth = b["sp_expected_s"] > b["tp_only_expected_s"]
        by_max = stats_reference.knn_choice(b, ["max_length"])
        by_cv = stats_reference.knn_choice(b, ["length_cv", "tokens"])
        self.assertGreater((by_max == truth).mean(), 0.98)
        self.assertLess((by_cv == truth).mean(), 0.7)
        # Bands of 1,000 tokens of the longest sequence, one across 3,000: one mode per
        # band is wrong on part of it; bands on CV cannot tell the batches apart.
        by_band = stats_reference.band_hindsight(b)
        self.assertTrue(0.8 < (by_band == truth).mean() < 0.99)
        b["band"] = stats_reference.np.floor(b["length_cv"] * 5)
        self.assertLess((stats_reference.band_hindsight(b) == truth).mean(), 0.7)
        # One mode per band is chosen on the drawn seconds, which the regret is scored on:
        # where the noise makes TP-only slower than its noise-free seconds say, SP.
        b["band"] = stats_reference.np.zeros(len(truth))
        b["tp_only_s"] = b["tp_only_expected_s"] * 1.2
        self.assertFalse(stats_reference.band_hindsight(b).any())
        b["tp_only_s"] = b["tp_only_expected_s"] * 0.95
        self.assertTrue(stats_reference.band_hindsight(b).all())
        with self.assertRaisesRegex(ValueError, "each half of the run needs more than 25"):
            stats_reference.knn_choice({k: v[:50] for k, v in b.items()}, ["max_length"])

    def test_figures_and_the_check_against_the_sim(self):
        b = self.batches()
        eo = stats_reference.throughput(b, b["sp_expected_s"] > b["tp_only_expected_s"])
        sp = stats_reference.throughput(b, b["sp_s"] < 0)
        tp = stats_reference.throughput(b, b["sp_s"] > 0)
        cmp = {"sp": {"effective_tokens_per_s": 8 * sp},
               "tp_only": {"effective_tokens_per_s": 8 * tp},
               "static": {"effective_tokens_per_s": 8 * tp},
               "adaptive": {"effective_tokens_per_s": 8 * eo, "expected_regret_window_median": 0.0,
                            "tp_only_steps": 3, "sp_steps": 1},
               "expected_oracle": {"effective_tokens_per_s": 8 * eo}}
        f = stats_reference.measure(b, cmp)
        self.assertAlmostEqual(f["sp"], 100 * (1 - sp / eo))
        self.assertAlmostEqual(f["tp_only_share_adaptive"], 0.75)
        by_band = stats_reference.throughput(b, stats_reference.band_hindsight(b))
        self.assertAlmostEqual(f[stats_reference.BAND_HINDSIGHT], 100 * (1 - by_band / eo))
        self.assertGreater(f[stats_reference.BAND_HINDSIGHT], 0.5)  # one band across 3,000
        self.assertLess(f["longest sequence"], 0.1)
        self.assertGreater(f["cv, tokens (ADAPTIVE's band axes)"], 1.0)
        cmp["sp"]["effective_tokens_per_s"] *= 1.01  # not this run's SP
        with self.assertRaisesRegex(ValueError, "sp over expected_oracle"):
            stats_reference.measure(b, cmp)

    def test_a_csv_that_is_not_the_sims_is_refused_naming_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "b.csv")
            with open(path, "w") as f:
                f.write("group,step\n0,1\n")
            with self.assertRaisesRegex(ValueError, f"{path}: columns \\['group', 'step'\\]"):
                stats_reference.load_batches(path)
            with open(path, "w") as f:
                f.write(",".join(stats_reference.COLUMNS_CSV) + "\n" + "x," * 12 + "1\n")
            with self.assertRaisesRegex(ValueError, f"{path}: not a number"):
                stats_reference.load_batches(path)

    def test_short_run(self):
        with tempfile.TemporaryDirectory() as out:
            run_main(stats_reference.main,
                     ["stats_reference.py", f"--sim={SIM}", f"--out={out}", "--steps=300",
                      "--groups=2", "--seeds=11 12", "--cells=megatron lognormal imbalance_heavy"])
            with open(os.path.join(out, "stats_reference.json")) as f:
                result = json.load(f)
            with open(os.path.join(out, "stats_reference.md")) as f:
                md = f.read()
        (cell,) = result["cells"]
        self.assertEqual([r["seed"] for r in cell["runs"]], [11, 12])
        self.assertIn("--compare_batches=", cell["runs"][0]["command"])
        for key in stats_reference.COLUMNS:
            vals = [r["figures"][key] for r in cell["runs"]]
            self.assertAlmostEqual(cell["median"][key], statistics.median(vals), places=5)
        self.assertIn("| megatron lognormal imbalance_heavy | ", md)
        with self.assertRaisesRegex(SystemExit, "--cells: unknown"):
            run_main(stats_reference.main, ["stats_reference.py", f"--sim={SIM}",
                                            "--out=/tmp", "--cells=nope"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    args, rest = ap.parse_known_args()
    SIM = args.sim
    unittest.main(argv=[sys.argv[0]] + rest)
