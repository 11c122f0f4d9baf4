"""The metric contract of docs/design.md §7, as data, for the deploy/dashboard tests.

Dashboards and rules may only query what the daemon promises to export; this module is
the copy of that promise the tests use. LoadDesignMetrics() parses the table in
docs/design.md §7 so a test can prove this copy and the document have not drifted apart.
"""
import os
import re

import gate_fields

# metric -> (type, labels). Labels are the ones the daemon attaches; Prometheus adds
# `job` and `instance` at scrape time.
METRICS = {
    "spgate_decisions_total": ("counter", ("job_id", "mode", "reason")),
    "spgate_worker_local_decisions_total": ("counter", ("job_id", "reason")),
    "spgate_worker_memory_overrides_total": ("counter", ("job_id",)),
    "spgate_batch_length_cv": ("histogram", ("job_id",)),
    "spgate_rs_wait_share": ("gauge", ("job_id", "group")),
    "spgate_all_gather_tail_seconds": ("gauge", ("job_id", "group")),
    "spgate_norm_stall_ratio": ("gauge", ("job_id", "group")),
    "spgate_slowest_rank": ("gauge", ("job_id", "group")),
    "spgate_stage_predicted_peak_bytes": ("gauge", ("job_id", "stage")),
    "spgate_stage_tp_only_share": ("gauge", ("job_id", "stage")),
    "spgate_stage_adaptive_tokens_per_second": ("gauge", ("job_id", "stage", "band", "mode")),
    "spgate_step_duration_seconds": ("histogram", ("job_id", "mode")),
    "spgate_effective_tokens_total": ("counter", ("job_id", "mode")),
    "spgate_padding_tokens_total": ("counter", ("job_id", "mode")),
    "spgate_peak_memory_bytes": ("gauge", ("job_id", "mode")),
    "spgate_memory_budget_bytes": ("gauge", ("job_id",)),
    "spgate_current_mode": ("gauge", ("job_id", "group", "mode")),
    "spgate_mode_switches_total": ("counter", ("job_id", "group")),
    "spgate_gate_threshold": ("gauge", ("job_id", "gate")),
    "spgate_config_version": ("gauge", ("job_id",)),
    "spgate_config_updates_total": ("counter", ("result",)),
    "spgate_workers": ("gauge", ("job_id", "state")),
    "spgate_decision_latency_seconds": ("histogram", ()),
    "spgate_state_persist_failures_total": ("counter", ()),
    "spgate_config_last_reload_successful": ("gauge", ()),
    "spgate_build_info": ("gauge", ("version",)),
    "spgate_gate_policy": ("gauge", ("job_id", "policy")),
    "spgate_adaptive_tokens_per_second": ("gauge", ("job_id", "band", "mode")),
    "spgate_adaptive_samples": ("gauge", ("job_id", "band", "mode")),
    "spgate_adaptive_exploration_steps_total": ("counter", ("job_id",)),
    "spgate_adaptive_gain_ratio": ("gauge", ("job_id",)),
    "spgate_adaptive_flips_held_total": ("counter", ("job_id",)),
    "spgate_adaptive_changes_total": ("counter", ("job_id",)),
    "spgate_adaptive_straggler_steps_total": ("counter", ("job_id",)),
    "spgate_adaptive_switch_cost_seconds": ("gauge", ("job_id",)),
    "spgate_hardware_id_mismatches_total": ("counter", ("job_id",)),
    "spgate_worker_refusals_total": ("counter", ("reason",)),
    "spgate_admin_refusals_total": ("counter", ("reason",)),
}

# Closed label value sets (docs/design.md §6 enums, lower-cased; docs/design.md §7).
MODES = ("sp", "tp_only")
REASONS = ("gates_passed", "length_cv", "rs_wait", "probe", "memory_requires_sp",
           "memory_over_budget", "pinned", "controller_unavailable", "adaptive",
           "lengths_unknown", "sp_required")
# The gate fields come from their one source, SPGATE_GATE_FIELDS in policy/gate_config.h
# (gate_fields.py parses it): spgate_gate_threshold has a `gate` for every field but the
# policy, an enum exported as spgate_gate_policy{policy} instead.
GATES = tuple(f.name for f in gate_fields.Thresholds())
GATE_DEFAULTS = {f.name: f.default for f in gate_fields.Thresholds()}
WORKER_STATES = ("active", "stale")
POLICIES = tuple(name.lower() for name, _ in
                 sorted(gate_fields.PolicyValues().items(), key=lambda kv: kv[1]))
# ADAPTIVE's bands (docs/design.md §11): 8 length-CV bands x 4 token bands.
BANDS = tuple(f"cv{c}.tok{t}" for c in range(8) for t in range(4))
CONFIG_UPDATE_RESULTS = ("ok", "invalid", "conflict", "denied", "unavailable")
LABEL_VALUES = {
    "mode": MODES,
    "reason": REASONS,
    "gate": GATES,
    "state": WORKER_STATES,
    "result": CONFIG_UPDATE_RESULTS,
    "policy": POLICIES,
    "band": BANDS,
}
# A label whose values depend on the family: spgate_worker_refusals_total's `reason` says
# why a worker request was refused (docs/metrics.md), not which gate decided.
WORKER_REFUSAL_REASONS = ("stale_incarnation", "live_incarnation", "not_leader",
                          "step_too_far", "unknown_session", "launch_credential",
                          "plan_mismatch", "undecided_step", "worker_credential")
# spgate_admin_refusals_total's: an admin call without a credential, or denied.
ADMIN_REFUSAL_REASONS = ("unauthenticated", "denied")
FAMILY_LABEL_VALUES = {
    "spgate_worker_refusals_total": {"reason": WORKER_REFUSAL_REASONS},
    "spgate_admin_refusals_total": {"reason": ADMIN_REFUSAL_REASONS},
}
GLOBAL_JOB_ID = "_default"  # spgate_gate_threshold / spgate_config_version global scope

# Labels every scraped series carries in addition to its own; on Kubernetes also the
# pod's namespace and name (the PodMonitor, deploy/prometheus/scrape-kubernetes.yml).
TARGET_LABELS = ("job", "instance", "namespace", "pod")

# What the rules read from kube-state-metrics (a gauge each), to tell where a daemon is
# expected: family -> labels.
KUBE_STATE_METRICS = {
    "kube_pod_container_info": ("namespace", "pod", "container"),
    "kube_pod_init_container_info": ("namespace", "pod", "container"),
    "kube_pod_status_phase": ("namespace", "pod", "phase"),
}

# The Prometheus scrape job name the rules and docs assume.
SCRAPE_JOB = "spgated"


def LabelValues(family, label):
    """The closed set of values `label` takes on `family` (None: any value). `family`
    None (a recording rule) falls back to the set the label has everywhere else."""
    return FAMILY_LABEL_VALUES.get(family, {}).get(label, LABEL_VALUES.get(label))


def SeriesNames(metric):
    """Names of the series a metric family exposes (histograms: _bucket/_sum/_count)."""
    kind, _ = METRICS[metric]
    if kind == "histogram":
        return [metric + "_bucket", metric + "_sum", metric + "_count"]
    return [metric]


def SeriesIndex():
    """series name -> (family, type, labels), with `le` added to histogram buckets."""
    index = {}
    for metric, (kind, labels) in METRICS.items():
        for name in SeriesNames(metric):
            extra = ("le",) if name.endswith("_bucket") and kind == "histogram" else ()
            index[name] = (metric, kind, tuple(labels) + extra)
    return index


def DesignDocPath():
    """Path of docs/design.md in this checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return os.path.join(repo, "docs", "design.md")


def LoadDesignMetrics(path):
    """Parses the metric table of docs/design.md §7: {metric: (type, labels)}."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## 7.", 1)[1].split("\n## ", 1)[0]
    metrics = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`(spgate_[a-z_]+)`\s*\|\s*([a-z]+)[^|]*\|\s*([^|]*)\|", line)
        if not m:
            continue
        labels = tuple(l.strip() for l in re.sub(r"\([^)]*\)", "", m.group(3)).split(",")
                       if l.strip() and l.strip() not in ("—", "-"))
        labels = tuple(re.sub(r"[`\s]", "", l) for l in labels)
        metrics[m.group(1)] = (m.group(2), labels)
    return metrics
