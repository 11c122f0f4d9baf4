#!/usr/bin/env python3
"""Every dashboard query and every rule, run by a real Prometheus against the contract.

A stand-in exporter (fake_spgated.py) serves every docs/design.md §7 family on 127.0.0.1; a
real Prometheus discovers it through the relabelling of
deploy/prometheus/scrape-kubernetes.yml (kubernetes_sd swapped for file_sd carrying the
same __meta_kubernetes_* labels, plus a decoy container that must be dropped), scrapes it
every second and evaluates deploy/prometheus/spgate-rules.yml. Then:
  - every panel query of both dashboards, with the template variables substituted the way
    Grafana does (All, one job, one group), must return data — a failure names the panel;
  - every template variable query must list the job and its groups;
  - every rule must evaluate without error, and every recording rule must return data
    labelled exactly as its level: prefix says.
This proves the queries and rules against Prometheus without the daemon; the same checks
run against the real spgated and spgate-sim in live_dashboards_test.py.
"""
import copy
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_spgated  # noqa: E402
import promlive  # noqa: E402
import yaml  # noqa: E402  (promlive has already reported a missing python3-yaml)

TIMEOUT_S = 60


def PrometheusConfig(workdir, target_port):
    with open(os.path.join(promlive.REPO, "deploy", "prometheus", "scrape-kubernetes.yml")) as f:
        shipped = yaml.safe_load(f)
    job = copy.deepcopy(shipped["scrape_configs"][0])
    assert "kubernetes_sd_configs" in job, "scrape-kubernetes.yml changed shape"
    del job["kubernetes_sd_configs"]
    sd_file = os.path.join(workdir, "pods.yml")
    pod_meta = {"__meta_kubernetes_pod_phase": "Running",
                "__meta_kubernetes_namespace": "training"}
    with open(sd_file, "w") as f:
        yaml.safe_dump([
            {"targets": [f"127.0.0.1:{target_port}"],
             "labels": dict(pod_meta, __meta_kubernetes_pod_name="train-0",
                            __meta_kubernetes_pod_container_name="spgated",
                            __meta_kubernetes_pod_container_port_name="metrics")},
            {"targets": ["127.0.0.1:1"],  # the training container's port: must be dropped
             "labels": dict(pod_meta, __meta_kubernetes_pod_name="train-0",
                            __meta_kubernetes_pod_container_name="trainer",
                            __meta_kubernetes_pod_container_port_name="metrics")},
            {"targets": ["127.0.0.1:2"],  # spgated's gRPC port: must be dropped
             "labels": dict(pod_meta, __meta_kubernetes_pod_name="train-0",
                            __meta_kubernetes_pod_container_name="spgated",
                            __meta_kubernetes_pod_container_port_name="grpc")},
        ], f)
    job["file_sd_configs"] = [{"files": [sd_file], "refresh_interval": "1s"}]
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [promlive.RULES_FILE],
        "scrape_configs": [job],
    }


def CheckTargets(prom):
    targets = prom.Api("targets")
    active = targets["activeTargets"]
    problems = []
    if len(active) != 1:
        problems.append(f"scrape-kubernetes.yml relabelling kept {len(active)} targets, want 1: "
                        f"{[t['discoveredLabels'] for t in active]}")
    for t in active:
        labels = t["labels"]
        want = {"job": "spgated", "namespace": "training", "pod": "train-0", "instance": "train-0"}
        for k, v in want.items():
            if labels.get(k) != v:
                problems.append(f"scraped target label {k}={labels.get(k)!r}, want {v!r}")
    return problems


def main():
    with tempfile.TemporaryDirectory(prefix="spgate-prom-") as workdir, \
            fake_spgated.FakeSpgated() as fake:
        lint = promlive.PromtoolCheckMetrics(fake.exposition.Render())
        if lint:
            print(f"FAIL: promtool check metrics on the stand-in exporter:\n{lint}")
            return 1
        config = PrometheusConfig(workdir, fake.port)
        with promlive.Prometheus(workdir, config) as prom:
            promlive.WaitFor("the first successful scrape",
                             lambda: promlive.ScrapedOnce(prom, "spgated"), 30)
            problems = CheckTargets(prom)
            job_id, groups = fake_spgated.JOBS[0], list(fake_spgated.GROUPS)
            # rate() over [1m] needs two samples, the recording rules one evaluation after
            # that: poll until everything has data or the deadline passes.
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                pending = (promlive.EmptyPanels(prom, job_id, groups)
                           + promlive.EmptyVariables(prom, job_id, groups)
                           + promlive.RuleProblems(prom))
                # A query error is not going to heal by waiting; missing data may.
                if (not pending or time.monotonic() > deadline
                        or any("query error" in p or "evaluation error" in p for p in pending)):
                    break
                time.sleep(2)
            problems += pending
            if problems:
                print(f"FAIL: {len(problems)} problem(s)")
                for p in problems:
                    print("  " + p)
                print("--- prometheus log tail ---\n" + prom.LogTail())
                return 1
    print("PASS: every panel, variable and rule returned data from a real Prometheus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
