"""Reads spgate's Grafana dashboards and turns their panel queries into plain PromQL.

Shared by the dashboard lint test and the tests that run every panel query against a
real Prometheus. Substitution follows what Grafana sends to a Prometheus datasource:
multi-value/All variables become a regex (`.+` for All), `$__rate_interval` becomes a
range of at least four scrape intervals.
"""
import json
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD_DIR = os.path.join(REPO, "dashboards")
DASHBOARD_FILES = ("spgate-overview.json", "spgate-job.json")


def LoadDashboards(directory=DASHBOARD_DIR):
    """{file name: parsed dashboard}."""
    out = {}
    for name in DASHBOARD_FILES:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            out[name] = json.load(f)
    return out


def Panels(dashboard):
    """Every panel, rows' nested panels included; rows themselves excluded."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            for inner in panel.get("panels", []):
                yield inner
        else:
            yield panel


def PanelQueries(dashboard):
    """[(panel title, refId, expr)] for every target of every panel."""
    return [(p.get("title", "?"), t.get("refId", "?"), t.get("expr", ""))
            for p in Panels(dashboard) for t in p.get("targets", [])]


def GrafanaRegexEscape(value):
    """What Grafana's Prometheus datasource does to one value of a multi-value variable
    (prometheusSpecialRegexEscape): regex metacharacters get a backslash that survives
    PromQL's string unescaping. `-` is left alone; PromQL rejects `\\-` in a string."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def Substitute(expr, variables, rate_interval="1m", range_="5m", interval="15s"):
    """Replaces Grafana variables as Grafana would for the Prometheus datasource.

    A list value is a multi-value selection: `(a|b)` with each value regex-escaped; a
    string is used as it is (single-value variables, or an All value such as `.+`)."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    out = out.replace("$__interval", interval)
    for name in sorted(variables, key=len, reverse=True):
        value = variables[name]
        if isinstance(value, (list, tuple)):
            value = "(" + "|".join(GrafanaRegexEscape(v) for v in value) + ")"
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    left = re.findall(r"\$\{?[A-Za-z_]\w*", out)
    if left:
        raise ValueError(f"unsubstituted variables {left} in {expr!r}")
    return out


def VariableQueries(dashboard):
    """{variable name: label_values(...) query} for the query variables."""
    return {v["name"]: v.get("definition", "")
            for v in dashboard.get("templating", {}).get("list", []) if v.get("type") == "query"}


def ParseLabelValues(query):
    """'label_values(metric{sel}, label)' -> (selector, label)."""
    m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_]\w*)\s*\)\s*", query)
    if not m:
        raise ValueError(f"not a label_values(metric, label) query: {query!r}")
    return m.group(1), m.group(2)
