#!/usr/bin/env python3
"""Table-driven tests of promql_lint: each mistake it exists to catch is caught, and the
query shapes our dashboards and rules use pass."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import promql_lint  # noqa: E402

RECORDED = ("job_id:spgate_decisions:rate5m", "job_id_mode_reason:spgate_decisions:rate5m")

GOOD = [
    'sum by (job_id, mode, reason) (rate(spgate_decisions_total{job_id=~"(a|b)"}[1m]))',
    'histogram_quantile(0.95, sum by (job_id, mode, le) (rate(spgate_step_duration_seconds_bucket[5m])))',
    'max by (job_id, group) (spgate_rs_wait_share{job_id=~".+",group=~".+"}) * 1000',
    'max by (job_id) (spgate_gate_threshold{gate="max_rs_wait_share",job_id=~"a|_default"})',
    'absent(up{job="spgated"} == 1)',
    'sum by (job_id) (job_id_mode_reason:spgate_decisions:rate5m{reason=~"rs_wait|probe"}) / job_id:spgate_decisions:rate5m',
    'max by (group) (spgate_current_mode{job_id="a",mode="sp"}) or max by (group) (spgate_current_mode{mode="tp_only"}) * 0',
    'count by (version) (spgate_build_info)',
    'increase(spgate_state_persist_failures_total[10m]) > 0',
    'sum by (job_id) (increase(spgate_worker_memory_overrides_total[10m])) > 0',
    # `reason` takes the refusal reasons on this family, the decision reasons elsewhere.
    'sum without (reason) (increase(spgate_worker_refusals_total{reason="launch_credential"}[5m]))',
    'sum by (reason) (rate(spgate_worker_refusals_total{reason=~"plan_mismatch|undecided_step"}[1m]))',
]

BAD = [  # (expr, fragment of the expected complaint)
    ('sum(rate(spgate_decisions_total{reason="RS_WAIT"}[1m]))', "not one of"),
    ('sum(rate(spgate_decisions_total{mode="tp"}[1m]))', "not one of"),
    ('sum(rate(spgate_decisions_total{job="x",group="0"}[1m]))', "has no label 'group'"),
    ('rate(spgate_rs_wait_share[1m])', "rate() of gauge"),
    ('spgate_decisions_total', "without rate()"),
    ('sum(spgate_step_duration_seconds_count)', "without rate()"),
    ('sum(rate(spgate_decision_total[1m]))', "unknown metric"),
    ('sum(rate(spgate_decisions{job_id="a"}[1m]))', "unknown metric"),
    ('sum by (group) (rate(spgate_decisions_total[1m]))', "by(group)"),
    ('histogram_quantile(0.9, sum by (mode) (rate(spgate_step_duration_seconds_bucket[1m])))',
     "without `by (..., le)`"),
    ('spgate_gate_threshold{gate="max_cv"}', "not one of"),
    ('spgate_workers{state=~"active|dead"}', "'dead' not one of"),
    ('job_id:spgate_unknown:rate5m', "unknown metric"),
    ('rate(spgate_worker_refusals_total{reason="rs_wait"}[5m])', "not one of"),
    ('rate(spgate_decisions_total{reason="launch_credential"}[5m])', "not one of"),
    ('job_id_mode_reason:spgate_decisions:rate5m{reason="plan_mismatch"}', "not one of"),
    ('sum by (job_id) (rate(spgate_worker_refusals_total[5m]))', "by(job_id)"),
    ('spgate_worker_memory_overrides_total{job_id="a"}', "without rate()"),
]


class PromqlLintTest(unittest.TestCase):
    def test_good_queries_pass(self):
        for expr in GOOD:
            with self.subTest(expr=expr):
                self.assertEqual(promql_lint.Lint(expr, recorded=RECORDED), [])

    def test_bad_queries_are_caught(self):
        for expr, fragment in BAD:
            with self.subTest(expr=expr):
                problems = promql_lint.Lint(expr, recorded=RECORDED)
                self.assertTrue(any(fragment in p for p in problems),
                                f"{expr}: expected {fragment!r} in {problems}")

    def test_level_labels(self):
        self.assertEqual(promql_lint.LevelLabels("job_id_mode_reason:x:rate5m"),
                         ("job_id", "mode", "reason"))
        self.assertEqual(promql_lint.LevelLabels("instance:x:p99"), ("instance",))
        self.assertEqual(promql_lint.LevelLabels("namespace_job_id:x:rate5m"),
                         ("namespace", "job_id"))
        with self.assertRaises(ValueError):
            promql_lint.LevelLabels("node_job:x:rate5m")


if __name__ == "__main__":
    unittest.main()
