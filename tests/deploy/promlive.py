"""Helpers for tests that run a real Prometheus on loopback.

Prometheus (Debian package `prometheus`) is started in a temporary directory with a
generated config; everything listens on 127.0.0.1 and every wait is bounded. The checks
shared by the dashboard tests live here too: run every panel query, every variable
query and every rule through Prometheus's HTTP API and name what came back empty.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import dashboard_queries as dq
import promql_lint

try:
    import yaml
except ImportError:
    raise SystemExit("python3-yaml is missing (Debian: apt-get install python3-yaml; make deps)")

REPO = dq.REPO
RULES_FILE = os.path.join(REPO, "deploy", "prometheus", "spgate-rules.yml")


def FreePort():
    """A port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def HttpGet(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def WaitFor(what, predicate, timeout, interval=0.2):
    """Polls predicate() until truthy; returns its value or raises TimeoutError."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError) as e:
            last_error = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                       + (f" (last error: {last_error})" if last_error else ""))


class Prometheus:
    """A Prometheus server on 127.0.0.1 in `workdir`, stopped by Stop() or `with`."""

    def __init__(self, workdir, config, binary=None):
        self.binary = binary or shutil.which("prometheus")
        if not self.binary:
            raise SystemExit("prometheus not found (Debian package `prometheus`; make deps)")
        self.workdir = workdir
        self.port = FreePort()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = os.path.join(workdir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        self.log_path = os.path.join(workdir, "prometheus.log")
        self.proc = None

    def Start(self, timeout=30, attempts=3):
        """Starts Prometheus and waits until it is ready: this one, whose storage path is
        ours (another test's Prometheus on the port would answer too). Its listen address
        cannot be port 0 (it would not say which port it got), so the port is picked here
        and free a moment before; one that a test beside this one took in between ("address
        already in use") is picked again, up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [self.binary, f"--config.file={self.config_path}",
                     f"--storage.tsdb.path={os.path.join(self.workdir, 'data')}",
                     f"--web.listen-address=127.0.0.1:{self.port}",
                     "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                WaitFor("Prometheus /-/ready",
                        lambda: self._alive() and "Ready" in HttpGet(self.url + "/-/ready")
                        and self._ours(), timeout)
                return self
            except RuntimeError:
                if attempt == attempts or "address already in use" not in self.LogTail():
                    raise
                self.port = FreePort()
                self.url = f"http://127.0.0.1:{self.port}"
            except TimeoutError:
                self.Stop()
                raise RuntimeError("Prometheus did not become ready:\n" + self.LogTail())
        raise AssertionError("unreachable")

    def _ours(self):
        """Whether the server on self.port is the one started here (its storage path)."""
        flags = json.loads(HttpGet(self.url + "/api/v1/status/flags"))["data"]
        return flags.get("storage.tsdb.path") == os.path.join(self.workdir, "data")

    def _alive(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"Prometheus exited with {self.proc.returncode}:\n" + self.LogTail())
        return True

    def LogTail(self, n=40):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def Stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self):
        return self.Start()

    def __exit__(self, *exc):
        self.Stop()

    def Api(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        body = json.loads(HttpGet(f"{self.url}/api/v1/{path}?{query}", timeout=10))
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('error')}")
        return body["data"]

    def Query(self, expr):
        """Instant query: list of {metric, value}."""
        return self.Api("query", query=expr)["result"]

    def Series(self, selector):
        return self.Api("series", **{"match[]": selector, "start": time.time() - 600})


def ScrapedOnce(prom, job):
    """Truthy once every target of `job` has been scraped successfully."""
    up = prom.Query(f'up{{job="{job}"}}')
    return up and all(s["value"][1] == "1" for s in up)


def DashboardCases(job_id, groups):
    """(dashboard file, variables) combinations every panel must have data for."""
    return [
        ("spgate-overview.json", {"job_id": ".+", "group": ".+"}),          # All, All
        ("spgate-overview.json", {"job_id": [job_id], "group": [groups[0]]}),
        ("spgate-job.json", {"job_id": job_id, "group": ".+"}),
        ("spgate-job.json", {"job_id": job_id, "group": [groups[-1]]}),
    ]


# Panels whose series only a pipelined job has (step plans, docs/design.md §12). The
# live traffic is spgate-sim's, whose live mode has no pipeline stages (its pipeline
# cells are replay-only): their queries run against fake_spgated in dashboards_prometheus_test and the
# real daemon's series are checked in tests/server/gate_state_pipeline_test.cc.
PIPELINE_ONLY_PANELS = {"Predicted stage peak against budget", "TP-only share by stage",
                        "Learned TP-only over SP by stage"}


def EmptyPanels(prom, job_id, groups, rate_interval="1m"):
    """Runs every panel query; returns ['dashboard / panel (ref, vars): expr -> why']."""
    problems = []
    dashboards = dq.LoadDashboards()
    for name, variables in DashboardCases(job_id, groups):
        dash = dashboards[name]
        for title, ref, expr in dq.PanelQueries(dash):
            if title in PIPELINE_ONLY_PANELS:
                continue
            plain = dq.Substitute(expr, variables, rate_interval=rate_interval)
            try:
                result = prom.Query(plain)
            except (ValueError, urllib.error.URLError) as e:
                problems.append(f"{dash['title']} / {title} ({ref}, {variables}): "
                                f"query error {e}: {plain}")
                continue
            values = [s["value"][1] for s in result]
            if not result:
                problems.append(f"{dash['title']} / {title} ({ref}, {variables}): no data: {plain}")
            elif all(v in ("NaN", "+Inf", "-Inf") for v in values):
                problems.append(f"{dash['title']} / {title} ({ref}, {variables}): only {values}: {plain}")
    return problems


def EmptyVariables(prom, job_id, groups):
    """Checks every template variable query lists the values the test traffic created."""
    problems = []
    for name, dash in dq.LoadDashboards().items():
        for var, query in dq.VariableQueries(dash).items():
            selector, label = dq.ParseLabelValues(query)
            selector = dq.Substitute(selector, {"job_id": job_id})
            values = {s.get(label) for s in prom.Series(selector)}
            want = {job_id} if var == "job_id" else set(groups)
            if not want <= values:
                problems.append(f"{dash['title']} variable {var}: {query} gave {sorted(values - {None})}, "
                                f"expected to include {sorted(want)}")
    return problems


def RuleProblems(prom):
    """Rules that failed to evaluate, and recording rules without (well-labelled) data."""
    problems = []
    groups = prom.Api("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    with open(RULES_FILE) as f:
        expected = [r.get("record") or r.get("alert")
                    for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    names = [r["name"] for r in loaded]
    if sorted(names) != sorted(expected):
        problems.append(f"loaded rules {sorted(names)} != rules file {sorted(expected)}")
    for rule in loaded:
        if rule.get("health") == "err":
            problems.append(f"rule {rule['name']}: evaluation error: {rule.get('lastError')}")
        elif rule.get("health") != "ok":
            problems.append(f"rule {rule['name']}: not evaluated yet ({rule.get('health')})")
        if rule["type"] != "recording":
            continue
        result = prom.Query(rule["name"])
        if not result:
            problems.append(f"recording rule {rule['name']}: no data")
            continue
        want = set(promql_lint.LevelLabels(rule["name"]))
        for s in result:
            got = set(s["metric"]) - {"__name__"}
            # `namespace` comes from Kubernetes discovery; a host's targets have none.
            if got != want and got != want - {"namespace"}:
                problems.append(f"recording rule {rule['name']}: labels {sorted(got)}, "
                                f"its level promises {sorted(want)}")
                break
    return problems


def PromtoolCheckMetrics(text):
    """`promtool check metrics` output for an exposition (docs/design.md §7: must be empty)."""
    promtool = shutil.which("promtool")
    if not promtool:
        return "promtool not found"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    return (r.stdout + r.stderr).strip()
