#!/usr/bin/env python3
"""Writes prometheusrule.yaml: deploy/prometheus/spgate-rules.yml's groups, unchanged,
as the Prometheus Operator's PrometheusRule. The rules file is the one to edit; then run
  python3 deploy/k8s/monitoring/generate.py
`--check` exits 1 when prometheusrule.yaml differs from what it would write
(tests/deploy/rules_lint_test.py checks the content too).
"""
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
RULES = os.path.join(REPO, "deploy", "prometheus", "spgate-rules.yml")
OUT = os.path.join(HERE, "prometheusrule.yaml")
HEADER = """\
# Generated from deploy/prometheus/spgate-rules.yml by generate.py: edit that file, then run
#   python3 deploy/k8s/monitoring/generate.py
# The same groups as the rules file (comments there explain each rule). Your Prometheus's
# ruleSelector may require a label on it (kube-prometheus-stack: release: <its release>),
# added in your overlay.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL) as `|` blocks, as the rules file writes them."""


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def Render():
    with open(RULES, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "spgate",
                         "labels": {"app.kubernetes.io/name": "spgate",
                                    "app.kubernetes.io/part-of": "spgate"}},
            "spec": {"groups": groups}}
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                              width=100)


def main(argv):
    text = Render()
    old = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else None
    if argv[1:] == ["--check"]:
        if old != text:
            print(f"{os.path.relpath(OUT)} is stale: run python3 {os.path.relpath(__file__)}")
            return 1
        return 0
    if old != text:
        with open(OUT, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
