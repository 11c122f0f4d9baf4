#!/usr/bin/env python3
"""Generates spgate's Grafana dashboards (spgate-overview.json, spgate-job.json).

The JSON files are committed so they can be imported or file-provisioned as they are;
this script is their source. Edit here, run `python3 dashboards/generate.py`, commit
both. tests/deploy/dashboards_lint_test.py fails when the JSON and this script disagree.

Rules every panel follows (and the lint test checks): the datasource is the
`${datasource}` template variable (never `__inputs`, which breaks file provisioning),
every panel declares a unit, queries use only docs/design.md §7 metrics and aggregate
across daemons (one sidecar per pod can export the same job_id), and rates use
`$__rate_interval`.
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
JOB_DASHBOARD_UID = "spgate-job"
OVERVIEW_UID = "spgate-overview"

# Series colours used across panels so SP / TP-only read the same everywhere.
MODE_COLORS = {"sp": "green", "tp_only": "orange"}


class Layout:
    """Places panels left to right in a 24-column grid, opening a new line when full."""

    def __init__(self):
        self.x, self.y, self.line_h, self.next_id, self.panels = 0, 0, 0, 1, []

    def Row(self, title):
        self.Newline()
        self.panels.append({"id": self.next_id, "type": "row", "title": title,
                            "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.next_id += 1
        self.y += 1

    def Newline(self):
        if self.x:
            self.x, self.y, self.line_h = 0, self.y + self.line_h, 0

    def Add(self, panel, w, h=8):
        if self.x + w > 24:
            self.Newline()
        panel["id"] = self.next_id
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.next_id += 1
        self.x += w
        self.line_h = max(self.line_h, h)
        self.panels.append(panel)


def Target(expr, legend, ref, instant=False):
    return {"refId": ref, "datasource": DS, "editorMode": "code", "expr": expr,
            "legendFormat": legend, "range": not instant, "instant": instant}


def Targets(queries, instant=False):
    return [Target(expr, legend, chr(ord("A") + i), instant)
            for i, (expr, legend) in enumerate(queries)]


def ModeOverrides():
    return [{"matcher": {"id": "byRegexp", "options": f".*\\b{mode}\\b.*"},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}]}
            for mode, color in MODE_COLORS.items()]


def ThresholdLine(ref, color="red"):
    """Draws query `ref` as a dashed line: a gate threshold or a budget, not data."""
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "custom.fillOpacity", "value": 0},
                {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                {"id": "color", "value": {"mode": "fixed", "fixedColor": color}}]}


def TimeSeries(title, description, unit, queries, *, stack=False, minimum=0, maximum=None,
               overrides=(), links=()):
    defaults = {
        "unit": unit,
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if stack else 5,
                   "showPoints": "never", "spanNulls": False,
                   "stacking": {"mode": "normal" if stack else "none", "group": "A"}},
        "color": {"mode": "palette-classic"},
        "links": list(links),
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"], "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": Targets(queries),
    }


def Stat(title, description, unit, queries, *, mappings=(), thresholds=None, instant=True,
         decimals=None):
    stat = {
        "type": "stat", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": {
            "unit": unit, "mappings": list(mappings),
            "color": {"mode": "thresholds"},
            "thresholds": thresholds or {"mode": "absolute",
                                         "steps": [{"color": "green", "value": None}]}},
            "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "none", "textMode": "value_and_name",
                    "justifyMode": "auto", "orientation": "auto"},
        "targets": Targets(queries, instant=instant),
    }
    if decimals is not None:
        stat["fieldConfig"]["defaults"]["decimals"] = decimals
    return stat


def JobLink():
    return {"title": "Open job ${__field.labels.job_id}",
            "url": f"/d/{JOB_DASHBOARD_UID}/spgate-job?var-job_id=${{__field.labels.job_id}}"
                   "&${datasource:queryparam}&${__url_time_range}"}


def DatasourceVariable():
    return {"type": "datasource", "name": "datasource", "label": "Data source",
            "query": "prometheus", "current": {}, "hide": 0, "includeAll": False,
            "multi": False, "options": [], "refresh": 1, "regex": "", "skipUrlSync": False}


def QueryVariable(name, label, query, *, multi, sort=1):
    var = {"type": "query", "name": name, "label": label, "datasource": DS,
           "definition": query,
           "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
           "refresh": 2, "regex": "", "sort": sort, "hide": 0, "skipUrlSync": False,
           "options": [], "multi": multi, "includeAll": multi}
    if multi:
        var["allValue"] = ".+"
        var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    else:
        var["current"] = {}
    return var


def Dashboard(uid, title, description, variables, panels, links):
    return {
        "uid": uid, "title": title, "description": description, "id": None,
        "tags": ["spgate"], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "fiscalYearStartMonth": 0,
        "liveNow": False, "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [DatasourceVariable()] + variables},
        "links": links,
        "panels": panels,
    }


# --- spgate-overview.json: every job, side by side ---------------------------------------

def GateLines(gate, jobs):
    """Each selected job's value of `gate` (the daemon exports every job's effective value);
    the global default's only where none of the selected jobs has a series of its own
    (`_default` is excluded from the jobs' side, which the All value `.+` would match)."""
    return (f'max by (job_id) (spgate_gate_threshold{{gate="{gate}",{jobs},job_id!="_default"}})'
            f' or on () max by (job_id) (spgate_gate_threshold{{gate="{gate}",job_id="_default"}})')


def Overview():
    j = 'job_id=~"$job_id"'
    jg = 'job_id=~"$job_id",group=~"$group"'
    thr = 'job_id=~"$job_id|_default"'  # per-job config versions and the global default
    L = Layout()

    L.Row("Decisions")
    L.Add(TimeSeries(
        "Decisions by mode and reason",
        "Per-batch decisions the daemon made for each job (a step plan's micro-batches one "
        "each), by the mode chosen and why (docs/design.md §3). TP-only: length_cv, rs_wait. "
        "SP: gates_passed, memory_requires_sp, memory_over_budget, lengths_unknown, "
        "sp_required. Either mode: pinned (an operator pin), adaptive (ADAPTIVE departed "
        "from the gates' choice or held the group's mode), probe (the RS_WAIT fallback's SP "
        "probe, or ADAPTIVE's exploration of the mode not chosen).",
        "count:decisions/s",
        [(f"sum by (job_id, mode, reason) (rate(spgate_decisions_total{{{j}}}[{RATE}]))",
          "{{job_id}} · {{mode}} · {{reason}}")], stack=True, links=[JobLink()]), w=12)
    L.Add(TimeSeries(
        "Steps in sequence parallel",
        "Share of each job's decided group-steps that run sequence parallel.",
        "percentunit",
        [(f'sum by (job_id) (rate(spgate_decisions_total{{{j},mode="sp"}}[{RATE}]))'
          f" / sum by (job_id) (rate(spgate_decisions_total{{{j}}}[{RATE}]))", "{{job_id}}")],
        maximum=1, links=[JobLink()]), w=6)
    L.Add(TimeSeries(
        "Local fallback decisions",
        "Decisions group leaders made with their local policy because the daemon's answer "
        "missed the step deadline or the daemon was unreachable (reported after reconnect), "
        "by the reason the local policy gave. Only rates above 0 are drawn (every reason's "
        "counter exists from the start at 0): empty while no leader decides locally, and a "
        "gap is 0.",
        "count:decisions/s",
        [(f"sum by (job_id, reason) (rate(spgate_worker_local_decisions_total{{{j}}}[{RATE}]))"
          " > 0",
          "{{job_id}} · {{reason}}")], links=[JobLink()]), w=6)

    L.Row("Throughput and step time")
    L.Add(TimeSeries(
        "Effective tokens/s by mode",
        "Non-padding tokens processed per second, by the mode the steps ran in.",
        "count:tok/s",
        [(f"sum by (job_id, mode) (rate(spgate_effective_tokens_total{{{j}}}[{RATE}]))",
          "{{job_id}} · {{mode}}")], overrides=ModeOverrides(), links=[JobLink()]), w=12)
    L.Add(TimeSeries(
        "Step time p95 by mode",
        "95th percentile of step wall time, by mode. SP should not be slower than TP-only "
        "once batches are bucketed and LayerNorm stays in the shard.",
        "s",
        [(f"histogram_quantile(0.95, sum by (job_id, mode, le) "
          f"(rate(spgate_step_duration_seconds_bucket{{{j}}}[{RATE}])))",
          "{{job_id}} · {{mode}}")], overrides=ModeOverrides(), links=[JobLink()]), w=12)

    L.Row("Memory")
    L.Add(TimeSeries(
        "Peak memory against budget",
        "Peak device memory per mode (max over ranks and daemons) and the device budget "
        "the workers report (dashed). 0 is not drawn: a mode that has not run, or a job whose "
        "workers have not reported since the daemon started.",
        "bytes",
        [(f"max by (job_id, mode) (spgate_peak_memory_bytes{{{j}}}) > 0",
          "{{job_id}} · peak {{mode}}"),
         (f"max by (job_id) (spgate_memory_budget_bytes{{{j}}}) > 0", "{{job_id}} · budget")],
        overrides=[ThresholdLine("B")], links=[JobLink()]), w=12)
    L.Add(TimeSeries(
        "Peak memory / budget",
        "Peak memory as a share of the budget, per mode; the dashed line is each job's "
        "memory_headroom gate: TP-only above it is not allowed (MEMORY_REQUIRES_SP).",
        "percentunit",
        [(f"max by (job_id, mode) (spgate_peak_memory_bytes{{{j}}}) / on (job_id) group_left () "
          f"(max by (job_id) (spgate_memory_budget_bytes{{{j}}}) > 0)", "{{job_id}} · {{mode}}"),
         (GateLines("memory_headroom", j),
          "{{job_id}} · memory_headroom")],
        overrides=[ThresholdLine("B")], links=[JobLink()]), w=12)

    L.Row("Safety checks")
    L.Add(TimeSeries(
        "Memory overrides",
        "Daemon answers the job's group leaders did not run because their own memory gate "
        "forbade TP-only for the plan (they ran SP, source memory_override), summed over "
        "daemons. Should stay 0: a config mismatch, a daemon bug or an answer that was not "
        "the daemon's (alert SpgateWorkerMemoryOverride).",
        "count:overrides/min",
        [(f"sum by (job_id) (rate(spgate_worker_memory_overrides_total{{{j}}}[{RATE}])) * 60",
          "{{job_id}}")], links=[JobLink()]), w=12)
    L.Add(TimeSeries(
        "Worker requests refused",
        "Worker requests the daemons refused for who sent them, by reason, over all jobs "
        "(the counter has no job_id). launch_credential: a Register without the running "
        "launch's credential (alert SpgateLaunchCredentialRefusals); worker_credential: a "
        "call without a worker credential for its job (alert SpgateWorkerCredentialRefusals); "
        "undecided_step: a few after a daemon pause or restart are normal (docs/metrics.md).",
        "count:refusals/min",
        [(f"sum by (reason) (rate(spgate_worker_refusals_total[{RATE}])) * 60",
          "{{reason}}")]), w=12)

    L.Row("Collectives")
    L.Add(TimeSeries(
        "Reduce-scatter wait share against its threshold",
        "Rolling share of step time spent waiting in reduce-scatter, per TP group (max over "
        "ranks). Above max_rs_wait_share (dashed) the group falls back to TP-only.",
        "percentunit",
        [(f"max by (job_id, group) (spgate_rs_wait_share{{{jg}}})", "{{job_id}} · group {{group}}"),
         (GateLines("max_rs_wait_share", j),
          "{{job_id}} · max_rs_wait_share")],
        overrides=[ThresholdLine("B")], links=[JobLink()]), w=8)
    L.Add(TimeSeries(
        "All-gather tail",
        "p95 over the window of the slowest rank's all-gather time per step, per TP group.",
        "ms",
        [(f"max by (job_id, group) (spgate_all_gather_tail_seconds{{{jg}}}) * 1000",
          "{{job_id}} · group {{group}}")], links=[JobLink()]), w=8)
    L.Add(TimeSeries(
        "Norm stall ratio",
        "Share of step time spent in collectives that exist only because LayerNorm crossed "
        "the shard boundary. Should be ~0 with LayerNorm kept in the shard.",
        "percentunit",
        [(f"max by (job_id, group) (spgate_norm_stall_ratio{{{jg}}})",
          "{{job_id}} · group {{group}}")], links=[JobLink()]), w=8)

    L.Row("Control plane")
    L.Add(TimeSeries(
        "Mode switches",
        "SP <-> TP-only switches per minute, summed over the job's TP groups.",
        "count:switches/min",
        [(f"sum by (job_id) (rate(spgate_mode_switches_total{{{jg}}}[{RATE}])) * 60",
          "{{job_id}}")], links=[JobLink()]), w=8)
    L.Add(TimeSeries(
        "Workers",
        "Registered worker ranks, active and stale (no heartbeat).",
        "count:ranks",
        [(f"sum by (job_id, state) (spgate_workers{{{j}}})", "{{job_id}} · {{state}}")],
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*stale.*"},
                    "properties": [{"id": "color",
                                    "value": {"mode": "fixed", "fixedColor": "red"}}]}],
        links=[JobLink()]), w=8)
    L.Add(TimeSeries(
        "Decision latency",
        "Time from a batch plan's arrival to its decision being sent, over all daemons. "
        "Workers wait 20 ms by default before deciding locally.",
        "s",
        [(f"histogram_quantile(0.5, sum by (le) (rate(spgate_decision_latency_seconds_bucket[{RATE}])))",
          "p50"),
         (f"histogram_quantile(0.99, sum by (le) (rate(spgate_decision_latency_seconds_bucket[{RATE}])))",
          "p99")]), w=8)
    L.Add(Stat(
        "Config updates in range",
        "Admin API gate updates over the dashboard's time range, by result (rounded: "
        "increase() extrapolates to the range's edges).",
        "count:updates",
        [("round(sum by (result) (increase(spgate_config_updates_total[$__range])))",
          "{{result}}")], decimals=0),
        w=6, h=5)
    L.Add(Stat(
        "Config reload",
        "Whether every daemon's last --config (re)load succeeded (SIGHUP, or the file's "
        "change seen by its poll).",
        "none",
        [("min(spgate_config_last_reload_successful)", "last reload")],
        mappings=[{"type": "value", "options": {
            "0": {"text": "failed", "color": "red", "index": 0},
            "1": {"text": "ok", "color": "green", "index": 1}}}]), w=4, h=5)
    L.Add(Stat(
        "State persist failures in range",
        "Failed writes to --state_dir (state file: admin changes refused; launches file: new "
        "launches refused; learned tables: lost to a kill -9). The log names the file.",
        "count:failures",
        [("round(sum(increase(spgate_state_persist_failures_total[$__range])))", "failures")],
        decimals=0,
        thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                  {"color": "red", "value": 1}]}), w=4, h=5)
    L.Add(Stat(
        "Config version",
        "Version of the effective gate config per job (_default: the global scope).",
        "none",
        [(f"max by (job_id) (spgate_config_version{{{thr}}})", "{{job_id}}")]), w=5, h=5)
    L.Add(Stat(
        "Daemon versions",
        "Running spgated daemons by version.",
        "count:daemons",
        [("count by (version) (spgate_build_info)", "{{version}}")]), w=5, h=5)

    variables = [
        QueryVariable("job_id", "Job", "label_values(spgate_workers, job_id)", multi=True),
        QueryVariable("group", "TP group", 'label_values(spgate_current_mode{job_id=~"$job_id"}, group)',
                      multi=True, sort=3),
    ]
    links = [{"type": "dashboards", "tags": ["spgate"], "asDropdown": False,
              "includeVars": False, "keepTime": True, "title": "spgate"}]
    return Dashboard(OVERVIEW_UID, "spgate / Overview",
                     "spgate decisions, throughput, memory and collectives for every job.",
                     variables, L.panels, links)


# --- spgate-job.json: one job, by TP group ----------------------------------------------

def EffectiveGate(gate, job='"$job_id"'):
    """The job's value of `gate`: its own series when exported, else the global default."""
    return (f'(max(spgate_gate_threshold{{gate="{gate}",job_id={job}}})'
            f' or max(spgate_gate_threshold{{gate="{gate}",job_id="_default"}}))')


def Job():
    j = 'job_id="$job_id"'
    jg = 'job_id="$job_id",group=~"$group"'
    L = Layout()

    L.Row("Mode by TP group")
    L.Add({
        "type": "state-timeline", "title": "Current mode by TP group",
        "description": "The mode each TP group runs now (spgate_current_mode).",
        "datasource": DS,
        "fieldConfig": {"defaults": {
            "unit": "none", "color": {"mode": "thresholds"},
            "thresholds": {"mode": "absolute", "steps": [{"color": "orange", "value": None}]},
            "mappings": [{"type": "value", "options": {
                "0": {"text": "TP-only", "color": MODE_COLORS["tp_only"], "index": 0},
                "1": {"text": "SP", "color": MODE_COLORS["sp"], "index": 1}}}],
            "custom": {"fillOpacity": 80, "lineWidth": 0}}, "overrides": []},
        "options": {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9,
                    "alignValue": "left", "legend": {"showLegend": True, "displayMode": "list",
                                                     "placement": "bottom"},
                    "tooltip": {"mode": "single", "sort": "none"}},
        # 1 = SP, 0 = TP-only, whether the daemon exports both mode series or only the
        # active one.
        "targets": Targets([(
            f'max by (group) (spgate_current_mode{{{jg},mode="sp"}})'
            f' or max by (group) (spgate_current_mode{{{jg},mode="tp_only"}}) * 0',
            "group {{group}}")]),
    }, w=24, h=7)
    L.Add(TimeSeries(
        "Decisions by mode and reason",
        "Per-batch decisions for this job, by mode and the gate that chose it.",
        "count:decisions/s",
        [(f"sum by (mode, reason) (rate(spgate_decisions_total{{{j}}}[{RATE}]))",
          "{{mode}} · {{reason}}")], stack=True), w=12)
    L.Add(TimeSeries(
        "Mode switches by TP group",
        "SP <-> TP-only switches per minute, per TP group.",
        "count:switches/min",
        [(f"sum by (group) (rate(spgate_mode_switches_total{{{jg}}}[{RATE}])) * 60",
          "group {{group}}")]), w=12)

    L.Row("Gates by TP group")
    L.Add(TimeSeries(
        "Reduce-scatter wait share by TP group",
        "Rolling reduce-scatter wait share per group. Above max_rs_wait_share (red) the "
        "group falls back to TP-only; it resumes SP below max_rs_wait_share - "
        "rs_wait_reenable_margin (yellow).",
        "percentunit",
        [(f"max by (group) (spgate_rs_wait_share{{{jg}}})", "group {{group}}"),
         (EffectiveGate("max_rs_wait_share"), "max_rs_wait_share"),
         (f'{EffectiveGate("max_rs_wait_share")} - {EffectiveGate("rs_wait_reenable_margin")}',
          "re-enable below")],
        overrides=[ThresholdLine("B"), ThresholdLine("C", "yellow")]), w=12)
    L.Add(TimeSeries(
        "Batch length CV",
        "Coefficient of variation of sequence lengths inside a batch (p50, p95). Above "
        "max_length_cv (red) the batch runs TP-only; bucketing aims at bucket_target_cv "
        "(yellow).",
        "short",
        [(f"histogram_quantile(0.5, sum by (le) (rate(spgate_batch_length_cv_bucket{{{j}}}[{RATE}])))",
          "p50"),
         (f"histogram_quantile(0.95, sum by (le) (rate(spgate_batch_length_cv_bucket{{{j}}}[{RATE}])))",
          "p95"),
         (EffectiveGate("max_length_cv"), "max_length_cv"),
         (EffectiveGate("bucket_target_cv"), "bucket_target_cv")],
        overrides=[ThresholdLine("C"), ThresholdLine("D", "yellow")]), w=12)
    L.Add(TimeSeries(
        "All-gather tail by TP group",
        "p95 over the window of the slowest rank's all-gather time per step.",
        "ms",
        [(f"max by (group) (spgate_all_gather_tail_seconds{{{jg}}}) * 1000", "group {{group}}")]),
        w=12)
    L.Add(TimeSeries(
        "Norm stall ratio by TP group",
        "Share of step time in collectives that exist only because LayerNorm gathered "
        "across the shard boundary.",
        "percentunit",
        [(f"max by (group) (spgate_norm_stall_ratio{{{jg}}})", "group {{group}}")]), w=12)
    L.Add(TimeSeries(
        "Slowest rank by TP group",
        "rank_in_group of the rank the others waited for in each group's last complete step: "
        "the most step time outside its reduce-scatter, all-gather and norm-boundary waits "
        "(a group's ranks finish a step together, so step times alone do not tell; on a tie, "
        "the highest rank). A TP-only step reports no wait, so there it is the longest step, "
        "which is noise; a rank that stays on top over many SP steps is a straggler (a slow "
        "device, a busy host) that every collective of its group waits for.",
        "short",
        [(f"max by (group) (spgate_slowest_rank{{{jg}}})", "group {{group}}")]), w=12)

    L.Row("Throughput, step time and memory")
    L.Add(TimeSeries(
        "Effective tokens/s by mode",
        "Non-padding tokens per second, by mode.",
        "count:tok/s",
        [(f"sum by (mode) (rate(spgate_effective_tokens_total{{{j}}}[{RATE}]))", "{{mode}}")],
        overrides=ModeOverrides()), w=8)
    L.Add(TimeSeries(
        "Padding share by mode",
        "Padding tokens over all tokens processed, by mode: what bucketing leaves on the "
        "table.",
        "percentunit",
        [(f"sum by (mode) (rate(spgate_padding_tokens_total{{{j}}}[{RATE}]))"
          f" / (sum by (mode) (rate(spgate_padding_tokens_total{{{j}}}[{RATE}]))"
          f" + sum by (mode) (rate(spgate_effective_tokens_total{{{j}}}[{RATE}])))", "{{mode}}")],
        maximum=1, overrides=ModeOverrides()), w=8)
    L.Add(TimeSeries(
        "Step time by mode",
        "Step wall time p50 and p95, by mode.",
        "s",
        [(f"histogram_quantile(0.5, sum by (mode, le) (rate(spgate_step_duration_seconds_bucket{{{j}}}[{RATE}])))",
          "p50 · {{mode}}"),
         (f"histogram_quantile(0.95, sum by (mode, le) (rate(spgate_step_duration_seconds_bucket{{{j}}}[{RATE}])))",
          "p95 · {{mode}}")], overrides=ModeOverrides()), w=8)
    L.Add(TimeSeries(
        "Peak memory by mode against budget",
        "Peak device memory per mode, the budget (red) and budget x memory_headroom "
        "(yellow), the line TP-only may not cross. 0 is not drawn: a mode that has not run, "
        "or workers that have not reported since the daemon started.",
        "bytes",
        [(f"max by (mode) (spgate_peak_memory_bytes{{{j}}}) > 0", "peak · {{mode}}"),
         (f"max(spgate_memory_budget_bytes{{{j}}}) > 0", "budget"),
         (f'(max(spgate_memory_budget_bytes{{{j}}}) > 0) * {EffectiveGate("memory_headroom")}',
          "budget x memory_headroom")],
        overrides=ModeOverrides() + [ThresholdLine("B"), ThresholdLine("C", "yellow")]), w=24)

    L.Row("Pipeline stages")
    L.Add(TimeSeries(
        "Predicted stage peak against budget",
        "A pipelined job's stages (docs/design.md §12): the largest predicted peak over a "
        "step of each stage's TP groups, with every micro-batch in flight under the "
        "schedule in its decided mode. Early stages hold more micro-batches at once, so "
        "they reach budget x memory_headroom (yellow) first and run SP there.",
        "bytes",
        [(f"max by (stage) (spgate_stage_predicted_peak_bytes{{{j}}})", "stage {{stage}}"),
         (f'(max(spgate_memory_budget_bytes{{{j}}}) > 0) * {EffectiveGate("memory_headroom")}',
          "budget x memory_headroom")],
        overrides=[ThresholdLine("B", "yellow")]), w=12)
    L.Add(TimeSeries(
        "TP-only share by stage",
        "Share of each stage's micro-batches decided TP-only in its groups' last step "
        "plans. A stage stuck at 0 while later stages run TP-only is held by the memory "
        "gate (see the panel on the left); one stuck at 1 runs TP-only throughout.",
        "percentunit",
        [(f"max by (stage) (spgate_stage_tp_only_share{{{j}}})", "stage {{stage}}")]), w=12)
    L.Add(TimeSeries(
        "Learned TP-only over SP by stage",
        "ADAPTIVE's learned tokens/s of TP-only over SP's, per stage and band, from each "
        "micro-batch's compute on the stage (docs/design.md §12). Above 1 + adaptive_margin "
        "the band prefers TP-only on that stage; the first stage (embedding) and the last "
        "(loss) often differ from the middle ones.",
        "suffix:x",
        [(f'max by (stage, band) (spgate_stage_adaptive_tokens_per_second{{{j},mode="tp_only"}}) '
          f'/ max by (stage, band) (spgate_stage_adaptive_tokens_per_second{{{j},mode="sp"}})',
          "stage {{stage}} · {{band}}")]), w=24)

    L.Row("Adaptive policy")
    L.Add(Stat(
        "Policy in force",
        "STATIC: the gates' thresholds decide; ADAPTIVE: each mode's learned tokens/s per "
        "band of (length CV, tokens) decides (docs/design.md §11).",
        "none",
        [(f'max by (policy) (spgate_gate_policy{{{j}}}) == 1', "{{policy}}")]), w=4)
    L.Add(TimeSeries(
        "Estimated gain over the static gates",
        "Over the batches a band decided: learned throughput of ADAPTIVE's choices over "
        "that of the static gates' choices for the same batches (1 = no gain; an estimate "
        "from the learned table). 0 for a job whose policy is STATIC (it makes no ADAPTIVE "
        "decisions; one switched from ADAPTIVE keeps its last value), for an ADAPTIVE job "
        "before any band decided, and after a daemon restart until the job decides again.",
        "suffix:x",
        [(f"max(spgate_adaptive_gain_ratio{{{j}}})", "gain")], minimum=None), w=6)
    L.Add(TimeSeries(
        "Exploration share",
        "Steps ADAPTIVE spent measuring the mode not chosen (its own probes, not the "
        "gates' wait-share probes), over all decisions: adaptive_explore_floor in stable "
        "and rare bands, up to adaptive_explore_share while a band with at least 1/32 of "
        "the batches learns or after a change.",
        "percentunit",
        [(f"sum(rate(spgate_adaptive_exploration_steps_total{{{j}}}[{RATE}]))"
          f" / sum(rate(spgate_decisions_total{{{j}}}[{RATE}]))", "exploration")],
        maximum=1), w=6)
    L.Add(TimeSeries(
        "Learned tokens/s by band and mode",
        "The learned table: each band's estimate per mode, pooled over the job's groups "
        "(spgatectl jobs show has the weights and the preferred mode).",
        "count:tok/s",
        [(f"max by (band, mode) (spgate_adaptive_tokens_per_second{{{j}}})",
          "{{band}} · {{mode}}")]), w=8)
    L.Add(TimeSeries(
        "Switches, held flips and changes",
        "Per 1,000 decisions: mode switches, decisions where ADAPTIVE held the group's mode "
        "(the flip cap, adaptive_flip_interval_steps, had no switch left or the switch "
        "would not pay its learned cost), changes detected in the learned table (each "
        "raises a band's exploration), and steps not learned because a straggler delayed "
        "them (adaptive_straggler_share; about 1,000 / groups means one group has a rank "
        "slow on every step).",
        "short",
        [(f"1000 * sum(rate(spgate_mode_switches_total{{{j}}}[{RATE}]))"
          f" / sum(rate(spgate_decisions_total{{{j}}}[{RATE}]))", "switches"),
         (f"1000 * sum(rate(spgate_adaptive_flips_held_total{{{j}}}[{RATE}]))"
          f" / sum(rate(spgate_decisions_total{{{j}}}[{RATE}]))", "held"),
         (f"1000 * sum(rate(spgate_adaptive_changes_total{{{j}}}[{RATE}]))"
          f" / sum(rate(spgate_decisions_total{{{j}}}[{RATE}]))", "changes"),
         (f"1000 * sum(rate(spgate_adaptive_straggler_steps_total{{{j}}}[{RATE}]))"
          f" / sum(rate(spgate_decisions_total{{{j}}}[{RATE}]))", "straggler steps")]), w=12)
    L.Add(TimeSeries(
        "Learned switch cost",
        "Seconds the first step after a mode switch took beyond its band's estimate, "
        "learned from the job's telemetry. Where it is measured, a switch must pay it back: "
        "as an excursion out and back (this batch's saving at least twice the cost) or as a "
        "move over a fixed 50 decisions (this batch's saving plus 49 steps of the band mix's; "
        "docs/design.md §11). adaptive_flip_interval_steps is the flip cap's window, not "
        "this horizon.",
        "s",
        [(f"max(spgate_adaptive_switch_cost_seconds{{{j}}})", "switch cost")]), w=12)

    L.Row("Workers and config")
    L.Add(TimeSeries(
        "Workers",
        "Registered ranks of this job, active and stale (no heartbeat).",
        "count:ranks",
        [(f"sum by (state) (spgate_workers{{{j}}})", "{{state}}")],
        overrides=[{"matcher": {"id": "byName", "options": "stale"},
                    "properties": [{"id": "color",
                                    "value": {"mode": "fixed", "fixedColor": "red"}}]}]), w=6)
    L.Add(TimeSeries(
        "Local fallback decisions",
        "Decisions made by the workers' local policy (daemon late or unreachable), by the "
        "reason the local policy gave. Only rates above 0 are drawn (every reason's counter "
        "exists from the start at 0): empty while no leader decides locally, and a gap is 0.",
        "count:decisions/s",
        [(f"sum by (reason) (rate(spgate_worker_local_decisions_total{{{j}}}[{RATE}])) > 0",
          "{{reason}}")]), w=6)
    L.Add(TimeSeries(
        "Memory overrides",
        "Daemon answers this job's group leaders did not run because their own memory gate "
        "forbade TP-only for the plan (they ran SP; decision log source memory_override). "
        "Should stay 0 (alert SpgateWorkerMemoryOverride).",
        "count:overrides/min",
        [(f"sum(rate(spgate_worker_memory_overrides_total{{{j}}}[{RATE}])) * 60", "overrides")],
        overrides=[{"matcher": {"id": "byName", "options": "overrides"},
                    "properties": [{"id": "color",
                                    "value": {"mode": "fixed", "fixedColor": "red"}}]}]), w=6)
    L.Add(Stat(
        "Config version",
        "Version of the job's effective gate config.",
        "none",
        [('max(spgate_config_version{job_id=~"$job_id|_default"})', "version")]), w=6)
    L.Add({
        "type": "bargauge", "title": "Effective gate thresholds",
        "description": "The gate values this job runs with: its own override where one is "
                       "set, else the global default (spgatectl gates get --job_id).",
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": "short", "decimals": 3, "min": 0,
                                     "color": {"mode": "fixed", "fixedColor": "blue"}},
                        "overrides": []},
        "options": {"displayMode": "basic", "orientation": "horizontal", "showUnfilled": False,
                    "valueMode": "text", "namePlacement": "left",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
        "targets": Targets([(
            'max by (gate) (spgate_gate_threshold{job_id="$job_id"})'
            ' or max by (gate) (spgate_gate_threshold{job_id="_default"})', "{{gate}}")],
            instant=True),
    }, w=24, h=9)

    variables = [
        QueryVariable("job_id", "Job", "label_values(spgate_workers, job_id)", multi=False),
        QueryVariable("group", "TP group", 'label_values(spgate_current_mode{job_id="$job_id"}, group)',
                      multi=True, sort=3),
    ]
    links = [{"type": "link", "title": "spgate / Overview", "icon": "dashboard",
              "url": f"/d/{OVERVIEW_UID}/spgate-overview", "keepTime": True,
              "includeVars": False, "asDropdown": False, "tags": []}]
    return Dashboard(JOB_DASHBOARD_UID, "spgate / Job",
                     "One spgate job by TP group: modes, gates, throughput, memory.",
                     variables, L.panels, links)


DASHBOARDS = {"spgate-overview.json": Overview, "spgate-job.json": Job}


def Render(build):
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv):
    out_dir = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, build in DASHBOARDS.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(Render(build))
        print(f"wrote {os.path.join(out_dir, name)}")


if __name__ == "__main__":
    main(sys.argv)
