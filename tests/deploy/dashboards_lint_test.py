#!/usr/bin/env python3
"""Static checks of dashboards/*.json and the Grafana provisioning file.

Fails on what makes a dashboard break on import or show empty panels without an error:
an `__inputs` section or `${DS_...}` datasource (breaks file provisioning), a panel
without a unit, a missing datasource/job_id/group variable, unstable uids, queries that
name metrics, labels or label values outside docs/design.md §7, counters without rate(),
hard-coded rate windows, and PromQL that Prometheus cannot parse (checked with promtool).
Also fails when the JSON is not what dashboards/generate.py produces, and when the metric
list in tests/deploy/spgate_contract.py differs from the table in docs/design.md §7.

Usage: dashboards_lint_test.py            (exit 0 pass, 1 fail)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_queries as dq  # noqa: E402
import promql_lint  # noqa: E402
import spgate_contract as contract  # noqa: E402

try:
    import yaml
except ImportError:
    sys.exit("python3-yaml is missing (Debian: apt-get install python3-yaml; make deps)")

EXPECTED_UIDS = {"spgate-overview.json": "spgate-overview", "spgate-job.json": "spgate-job"}
# Built-in Grafana unit ids we allow, plus the custom forms Grafana's getValueFormat()
# understands (count:, suffix:, prefix:, si:).
BUILTIN_UNITS = {"short", "none", "percentunit", "percent", "s", "ms", "bytes", "decbytes",
                 "ops", "reqps"}
CUSTOM_UNIT = re.compile(r"^(count|suffix|prefix|si):.+")
NONE_UNIT_PANELS = {"stat", "state-timeline", "table"}  # "none" is fine for mapped states

failures = []


def Fail(where, msg):
    failures.append(f"{where}: {msg}")


def CheckGenerator(dashboards):
    sys.path.insert(0, dq.DASHBOARD_DIR)
    import generate  # dashboards/generate.py
    for name, build in generate.DASHBOARDS.items():
        with open(os.path.join(dq.DASHBOARD_DIR, name), encoding="utf-8") as f:
            if f.read() != generate.Render(build):
                Fail(name, "differs from dashboards/generate.py output; run "
                           "`python3 dashboards/generate.py` and commit")


def CheckVariables(name, dash):
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        Fail(name, "needs a `datasource` variable of type datasource, query prometheus")
    for var in ("job_id", "group"):
        v = variables.get(var)
        if not v or v.get("type") != "query":
            Fail(name, f"needs a query variable {var!r}")
            continue
        if v.get("datasource", {}).get("uid") != "${datasource}":
            Fail(name, f"variable {var} must query the ${{datasource}} variable")
        try:
            selector, label = dq.ParseLabelValues(v.get("definition", ""))
        except ValueError as e:
            Fail(name, f"variable {var}: {e}")
            continue
        if label != var:
            Fail(name, f"variable {var} reads label {label}")
        problems = promql_lint.Lint(dq.Substitute(selector, {"job_id": "j", "group": "0"}))
        for p in problems:
            Fail(name, f"variable {var}: {p}")
        if v.get("multi") and v.get("allValue") != ".+":
            Fail(name, f"multi-value variable {var} needs allValue '.+'")


def CheckPanels(name, dash, all_exprs):
    seen_titles, seen_ids = set(), set()
    cells = set()
    for panel in dash.get("panels", []):
        gp = panel.get("gridPos", {})
        for x in range(gp.get("x", 0), gp.get("x", 0) + gp.get("w", 0)):
            for y in range(gp.get("y", 0), gp.get("y", 0) + gp.get("h", 0)):
                if (x, y) in cells:
                    Fail(name, f"panel {panel.get('title')!r} overlaps another")
                cells.add((x, y))
        if gp.get("x", 0) + gp.get("w", 0) > 24:
            Fail(name, f"panel {panel.get('title')!r} is wider than the grid")
    for panel in dq.Panels(dash):
        title = panel.get("title", "")
        where = f"{name} panel {title!r}"
        if not title:
            Fail(name, f"panel id {panel.get('id')} has no title")
        if title in seen_titles:
            Fail(where, "duplicate title (the live test reports panels by title)")
        seen_titles.add(title)
        if panel.get("id") in seen_ids:
            Fail(where, "duplicate id")
        seen_ids.add(panel.get("id"))
        if not panel.get("description"):
            Fail(where, "no description")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            Fail(where, "no unit in fieldConfig.defaults.unit")
        elif unit == "none" and panel.get("type") not in NONE_UNIT_PANELS:
            Fail(where, "unit 'none' on a graph; say what the numbers are")
        elif unit not in BUILTIN_UNITS and not CUSTOM_UNIT.match(unit):
            Fail(where, f"unit {unit!r} is not a Grafana unit id we know")
        if panel.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            Fail(where, f"datasource must be the ${{datasource}} variable, is {panel.get('datasource')}")
        targets = panel.get("targets", [])
        if not targets:
            Fail(where, "no queries")
        for t in targets:
            tw = f"{where} query {t.get('refId')}"
            if t.get("datasource", {}).get("uid") != "${datasource}":
                Fail(tw, "query datasource must be ${datasource}")
            expr = t.get("expr", "")
            for window in re.findall(r"\[([^\]]+)\]", expr):
                if window not in ("$__rate_interval", "$__range"):
                    Fail(tw, f"hard-coded range [{window}]; use $__rate_interval (graphs) or "
                             "$__range (stats) so the window follows the scrape interval")
            if "$__range" in expr and not t.get("instant"):
                Fail(tw, "$__range belongs in instant (stat) queries")
            try:
                plain = dq.Substitute(expr, {"job_id": ["j1", "j2"], "group": ["0", "1"]})
            except ValueError as e:
                Fail(tw, str(e))
                continue
            for problem in promql_lint.Lint(plain):
                Fail(tw, problem)
            all_exprs.append((tw, plain))


def CheckPromtoolParses(all_exprs):
    promtool = shutil.which("promtool")
    if not promtool:
        Fail("promtool", "not found (Debian package `prometheus`; make deps)")
        return
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:check_{i}:expr", "expr": expr}
        for i, (_, expr) in enumerate(all_exprs)]}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard_exprs.yml")
        with open(path, "w") as f:
            yaml.safe_dump(rules, f)
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            # promtool names the failing rule by its position: map it back to the panel.
            index = {f"dashboard:check_{i}:expr": where for i, (where, _) in enumerate(all_exprs)}
            out = (r.stdout + r.stderr).strip()
            named = [where for record, where in index.items() if record in out]
            Fail("promtool check rules (dashboard queries)",
                 f"{out[-2000:]}" + (f" [panels: {named}]" if named else ""))


def CheckProvisioning():
    path = os.path.join(dq.DASHBOARD_DIR, "provisioning", "dashboards", "spgate.yaml")
    with open(path) as f:
        prov = yaml.safe_load(f)
    if prov.get("apiVersion") != 1:
        Fail(path, "apiVersion must be 1")
    providers = prov.get("providers") or []
    if not providers or providers[0].get("type") != "file" or not providers[0].get(
            "options", {}).get("path"):
        Fail(path, "needs a file provider with options.path")
    ds_path = os.path.join(dq.DASHBOARD_DIR, "provisioning", "datasources", "prometheus.yaml")
    with open(ds_path) as f:
        ds = yaml.safe_load(f)
    if ds.get("apiVersion") != 1 or ds["datasources"][0].get("type") != "prometheus":
        Fail(ds_path, "needs one prometheus datasource, apiVersion 1")


def CheckContractAgainstDesign():
    design = contract.DesignDocPath()
    parsed = contract.LoadDesignMetrics(design)
    if parsed != contract.METRICS:
        Fail("tests/deploy/spgate_contract.py", f"differs from {design} §7: "
             f"{set(parsed.items()) ^ set(contract.METRICS.items())}")


def main():
    dashboards = {}
    for name in dq.DASHBOARD_FILES:
        path = os.path.join(dq.DASHBOARD_DIR, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            dashboards[name] = json.loads(text)
        except json.JSONDecodeError as e:
            Fail(name, f"invalid JSON: {e}")
            continue
        if "__inputs" in text or "${DS_" in text:
            Fail(name, "has __inputs / ${DS_...}: Grafana file provisioning cannot resolve them")
        if dashboards[name].get("uid") != EXPECTED_UIDS[name]:
            Fail(name, f"uid must be {EXPECTED_UIDS[name]!r} (links and bookmarks use it)")
        if dashboards[name].get("id") is not None:
            Fail(name, "id must be null (Grafana assigns it)")
    all_exprs = []
    for name, dash in dashboards.items():
        CheckVariables(name, dash)
        CheckPanels(name, dash, all_exprs)
    CheckPromtoolParses(all_exprs)
    CheckGenerator(dashboards)
    CheckProvisioning()
    CheckContractAgainstDesign()
    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        for f in failures:
            print("  " + f)
        return 1
    print(f"PASS: {len(dashboards)} dashboards, {len(all_exprs)} queries checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
