#!/usr/bin/env python3
"""Checks deploy/prometheus/spgate-rules.yml beyond what promtool checks.

- recording rules are named level:metric:operations, the level made of label names;
- every expression uses only docs/design.md §7 metrics, labels and label values
  (promql_lint);
- every aggregation keeps `namespace` (`by (namespace, ...)`, never `without
  (namespace)`, never a bare `sum(...)`): one job id in two namespaces is two jobs, and
  alerts are routed by namespace;
- deploy/k8s/monitoring/prometheusrule.yaml holds exactly this file's groups;
- every alert has a severity, summary, description and a runbook_url whose section
  exists in docs/operations-runbooks.md;
- an alert exists for each condition operators must hear about (REQUIRED_ALERTS);
- tests/deploy/prometheus/spgate_rules_test.yml has, for every alert, a case where it
  fires and a case where it stays quiet, and an expression test for every recording rule.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import promql_lint  # noqa: E402

try:
    import yaml
except ImportError:
    sys.exit("python3-yaml is missing (Debian: apt-get install python3-yaml; make deps)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RULES = os.path.join(REPO, "deploy", "prometheus", "spgate-rules.yml")
RULE_TESTS = os.path.join(HERE, "prometheus", "spgate_rules_test.yml")
RUNBOOKS = os.path.join(REPO, "docs", "operations-runbooks.md")
RUNBOOK_DOC = "docs/operations-runbooks.md"

# Conditions operators must be alerted on -> the alert that covers each.
REQUIRED_ALERTS = {
    "sustained RS_WAIT fallbacks": "SpgateRsWaitFallbackSustained",
    "memory over budget": "SpgateMemoryOverBudget",
    "frequent mode switches": "SpgateModeSwitchesFrequent",
    "stale workers": "SpgateWorkersStale",
    "workers deciding locally": "SpgateWorkersDecidingLocally",
    "daemon absent": "SpgateDaemonAbsent",
    "daemon answers the workers' memory gate refused": "SpgateWorkerMemoryOverride",
    "Registers without the launch's credential": "SpgateLaunchCredentialRefusals",
    "worker calls refused for their credential": "SpgateWorkerCredentialRefusals",
}
RECORD_NAME = re.compile(r"^[a-z][a-z_]*:spgate_[a-z0-9_]+:[a-z0-9_]+$")
PROMETHEUS_RULE = os.path.join(REPO, "deploy", "k8s", "monitoring", "prometheusrule.yaml")
AGGREGATION = re.compile(r"\b(sum|min|max|avg|count|stddev|stdvar|group|topk|bottomk|quantile)"
                         r"\s*(by|without)?\s*\(([^()]*)")


def NamespaceProblems(expr):
    """Aggregations in `expr` that drop the namespace label."""
    problems = []
    for m in AGGREGATION.finditer(expr):
        op, clause, labels = m.group(1), m.group(2), m.group(3)
        names = {l.strip() for l in labels.split(",")}
        if clause is None:
            problems.append(f"{op}(...) without `by (namespace, ...)` drops namespace")
        elif clause == "by" and "namespace" not in names:
            problems.append(f"{op} by ({labels}) drops namespace")
        elif clause == "without" and "namespace" in names:
            problems.append(f"{op} without ({labels}) drops namespace")
    return problems


def GithubAnchor(heading):
    anchor = heading.strip().lower()
    anchor = re.sub(r"[^\w\- ]", "", anchor)
    return anchor.replace(" ", "-")


def main():
    failures = []
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    all_rules = [r for g in rules["groups"] for r in g["rules"]]
    records = [r["record"] for r in all_rules if "record" in r]
    alerts = {r["alert"]: r for r in all_rules if "alert" in r}

    for name in records:
        if not RECORD_NAME.match(name):
            failures.append(f"recording rule {name}: not level:spgate_metric:operations")
        try:
            promql_lint.LevelLabels(name)
        except ValueError as e:
            failures.append(str(e))
    for rule in all_rules:
        name = rule.get("record") or rule.get("alert")
        for problem in promql_lint.Lint(rule["expr"], recorded=records):
            failures.append(f"{name}: {problem}")
        for problem in NamespaceProblems(rule["expr"]):
            failures.append(f"{name}: {problem}")
    # Self-check of the namespace rule on what the rules file used to say.
    for expr, bad in (("sum by (job_id) (rate(x[5m]))", True), ("sum(rate(x[5m]))", True),
                      ("sum without (namespace, reason) (x)", True),
                      ("max by (namespace, job_id) (x)", False), ("sum without (reason) (x)", False)):
        if bool(NamespaceProblems(expr)) != bad:
            failures.append(f"NamespaceProblems({expr!r}) is wrong")

    # The Prometheus Operator's copy: the same groups, nothing else in its spec.
    if os.path.exists(PROMETHEUS_RULE):
        with open(PROMETHEUS_RULE) as f:
            pr = yaml.safe_load(f)
        if (pr.get("apiVersion"), pr.get("kind")) != ("monitoring.coreos.com/v1", "PrometheusRule"):
            failures.append(f"{PROMETHEUS_RULE}: not a monitoring.coreos.com/v1 PrometheusRule")
        if pr.get("spec") != {"groups": rules["groups"]}:
            failures.append(f"{PROMETHEUS_RULE}: spec.groups differ from {RULES}; run "
                            f"python3 deploy/k8s/monitoring/generate.py")
    else:
        failures.append(f"{PROMETHEUS_RULE} is missing")

    anchors = set()
    if os.path.exists(RUNBOOKS):
        with open(RUNBOOKS, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^#{2,3} (.+)$", line)
                if m:
                    anchors.add(GithubAnchor(m.group(1)))
    else:
        failures.append(f"{RUNBOOKS} is missing")
    for name, rule in alerts.items():
        if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
            failures.append(f"{name}: severity must be warning or critical")
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                failures.append(f"{name}: no {key} annotation")
        url = ann.get("runbook_url", "")
        doc, _, anchor = url.partition("#")
        if not doc.endswith(RUNBOOK_DOC):
            failures.append(f"{name}: runbook_url must point into {RUNBOOK_DOC}")
        if anchor != GithubAnchor(name):
            failures.append(f"{name}: runbook anchor should be #{GithubAnchor(name)}")
        if anchor not in anchors:
            failures.append(f"{name}: {RUNBOOK_DOC} has no section '## {name}'")
    for what, name in REQUIRED_ALERTS.items():
        if name not in alerts:
            failures.append(f"no alert for {what} ({name})")

    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)
    fires, quiet, tested_exprs = set(), set(), []
    for case in tests["tests"]:
        for a in case.get("alert_rule_test", []):
            (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
        tested_exprs += [t["expr"] for t in case.get("promql_expr_test", [])]
    for name in alerts:
        if name not in fires:
            failures.append(f"{name}: no unit test where it fires")
        if name not in quiet:
            failures.append(f"{name}: no unit test where it stays quiet")
    for name in records:
        if not any(name in expr for expr in tested_exprs):
            failures.append(f"recording rule {name}: no promql_expr_test")

    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        for f in failures:
            print("  " + f)
        return 1
    print(f"PASS: {len(records)} recording rules, {len(alerts)} alerts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
