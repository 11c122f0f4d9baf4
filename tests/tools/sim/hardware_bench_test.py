#!/usr/bin/env python3
"""The cost model's benchmark drivers whose figures docs/benchmarks.md quotes: the seed
table (bench/sim/seed_table.py: medians, ranges and target checks; a short run writes the
keys scripts rely on) and SP vs TP-only by sequence length (bench/sim/sp_crossover.py: a
short run's rows and what fits); and the spgate-sim flags they rest on (--hardware,
explicit device flags over the preset, --norm_boundary).

Usage: hardware_bench_test.py --sim=BUILD/bin/spgate-sim
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "sim"))
import seed_table  # noqa: E402
import sp_crossover  # noqa: E402

SIM = None


def run_main(module, args):
    argv = sys.argv
    sys.argv = [module.__name__ + ".py", f"--sim={SIM}"] + args
    try:
        module.main()
    finally:
        sys.argv = argv


class SeedTableTest(unittest.TestCase):
    def test_summarize(self):
        # Three seeds; sp_default's tokens/s ratios 0.90, 0.86, 0.95 -> median 0.90, range
        # 0.86-0.95, within 0.04 of the seeds' 0.91; its memory 0.70 is not within 0.82 +- 0.04.
        def seed(tokens):
            rows = {name: (1.0, 1.0, 1.0) for name in seed_table.ROWS}
            rows["sp_default"] = (0.70, tokens, 1.15)
            return rows
        rows = seed_table.summarize([seed(0.90), seed(0.86), seed(0.95)])
        d = rows["sp_default"]
        self.assertEqual(d["tokens_per_s_ratio"], 0.90)
        self.assertEqual(d["range"]["tokens_per_s_ratio"], [0.86, 0.95])
        self.assertTrue(d["within_target"]["tokens_per_s_ratio"])
        self.assertFalse(d["within_target"]["peak_memory_ratio"])
        self.assertTrue(d["within_target"]["step_time_p95_ratio"])  # 1.15 vs 1.19 +- 0.08
        self.assertTrue(all(rows["tp_only"]["within_target"].values()))
        md = seed_table.markdown(rows, 3, 10)
        self.assertIn("| sp_default | 0.700 (0.700–0.700) [0.82] ✗ | 0.900 (0.860–0.950) [0.91] ✓ |",
                      md)

    def test_short_run(self):
        with tempfile.TemporaryDirectory() as out:
            run_main(seed_table, [f"--out={out}", "--seeds=1,2", "--steps=40"])
            with open(os.path.join(out, "seed_table.json")) as f:
                rows = json.load(f)["rows"]
        self.assertEqual(set(rows), {"tp_only", "sp_default", "sp_bucketed",
                                     "sp_bucketed_norm_in_shard"})
        for name, row in rows.items():
            for key in ("peak_memory_ratio", "tokens_per_s_ratio", "step_time_p95_ratio"):
                self.assertGreater(row[key], 0, (name, key))
                lo, hi = row["range"][key]
                self.assertLessEqual(lo, row[key])
                self.assertLessEqual(row[key], hi)
        for key in ("peak_memory_ratio", "tokens_per_s_ratio", "step_time_p95_ratio"):
            self.assertEqual(rows["tp_only"][key], 1.0)
        # LayerNorm in the shard beats the gather boundary: no norm stalls, 1/t of the
        # norms' passes, and the norms' inputs sharded in memory.
        shard, gather = rows["sp_bucketed_norm_in_shard"], rows["sp_bucketed"]
        self.assertGreater(shard["tokens_per_s_ratio"], gather["tokens_per_s_ratio"] + 0.05)
        self.assertLess(shard["peak_memory_ratio"], gather["peak_memory_ratio"])
        # SP keeps less than TP-only on this 32K shape (Korthikanti et al.).
        self.assertLess(gather["peak_memory_ratio"], 1.0)


class CliTest(unittest.TestCase):
    """spgate-sim's --hardware, explicit device flags over the preset, --norm_boundary."""

    def tokens_per_s(self, *flags):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "out.json")
            subprocess.run([SIM, "replay", "--compare", "--steps=5", "--groups=1", "--jitter=0",
                            "--lengths=uniform:min=4096,max=4096", "--tokens_per_batch=16384",
                            f"--summary_json={path}"] + list(flags),
                           check=True, stderr=subprocess.DEVNULL)
            with open(path) as f:
                c = json.load(f)["compare"]
        return c["sp"]["effective_tokens_per_s"], c["tp_only"]["effective_tokens_per_s"]

    def test_presets_and_explicit_flags(self):
        h100 = self.tokens_per_s()
        self.assertEqual(self.tokens_per_s("--hardware=h100-sxm"), h100)  # the default
        # A flag given with the preset's own value changes nothing; another value does.
        self.assertEqual(self.tokens_per_s("--hbm_gbps=2900"), h100)
        self.assertNotEqual(self.tokens_per_s("--hbm_gbps=1000"), h100)
        h200 = self.tokens_per_s("--hardware=h200-sxm")
        self.assertGreater(h200[1], h100[1])  # faster HBM
        self.assertNotEqual(self.tokens_per_s("--hardware=h200-sxm", "--hbm_gbps=2900"), h200)
        # An explicit --link_gbps replaces the measured curves with a flat link.
        self.assertNotEqual(self.tokens_per_s("--link_gbps=370"), h100)
        # The gather boundary slows SP only.
        gather = self.tokens_per_s("--norm_boundary=gather")
        self.assertLess(gather[0], h100[0])
        self.assertEqual(gather[1], h100[1])

    def test_bad_flags_exit_2_naming_the_flag(self):
        for flag, want in (("--hardware=b200", "--hardware"),
                           ("--norm_boundary=full", "--norm_boundary"),
                           ("--mfu=1.5", "--mfu"),
                           ("--hardware=h100-sxm --tp=1 --hbm_gbps=-1", "--hbm_gbps")):
            r = subprocess.run([SIM, "replay", "--steps=1"] + flag.split(),
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, flag)
            self.assertIn(want, r.stderr, flag)


class CrossoverTest(unittest.TestCase):
    def test_short_run(self):
        with tempfile.TemporaryDirectory() as out:
            run_main(sp_crossover, [f"--out={out}", "--seq_lens=2048,131072", "--no_figure"])
            with open(os.path.join(out, "sp_crossover.json")) as f:
                rows = json.load(f)["rows"]
        self.assertEqual(len(rows), 2 * 2 * 2)  # presets x TP degrees x lengths
        keys = {"hardware", "tp", "seq_len", "sp_over_tp_only_tokens_per_s", "tp_only_fits",
                "sp_fits"}
        by = {}
        for r in rows:
            self.assertTrue(keys <= set(r), r)
            by[(r["hardware"], r["tp"], r["seq_len"])] = r
        # At 128K on 80 GiB, TP 8: TP-only's activations (13 s·h bytes a layer) do not fit,
        # SP's (4.25 s·h) do; at 2K both fit. The 141 GiB H200 does not fit TP-only either.
        long8 = by[("h100-sxm", 8, 131072)]
        self.assertFalse(long8["tp_only_fits"])
        self.assertTrue(long8["sp_fits"])
        self.assertTrue(by[("h100-sxm", 8, 2048)]["tp_only_fits"])
        self.assertFalse(by[("h200-sxm", 8, 131072)]["tp_only_fits"])
        for r in rows:
            self.assertGreater(r["sp_over_tp_only_tokens_per_s"], 0.5, r)
            # Overlapping SP's collectives with the GEMMs can only help SP.
            self.assertGreaterEqual(r["sp_overlap_over_tp_only_tokens_per_s"],
                                    r["sp_over_tp_only_tokens_per_s"], r)

    def test_presets_memory_is_the_table(self):
        mem = sp_crossover.device_memory_gib()
        self.assertEqual(mem, {"h100-sxm": 80.0, "h200-sxm": 141.0})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    args, rest = ap.parse_known_args()
    SIM = args.sim
    unittest.main(argv=[sys.argv[0]] + rest)
