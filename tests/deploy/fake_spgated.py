#!/usr/bin/env python3
"""A stand-in for spgated's /metrics endpoint: every docs/design.md §7 family, live values.

Used to prove the dashboards and rules against a real Prometheus without the daemon
(tests/deploy/dashboards_prometheus_test.py). It models the *exposition*, not the policy:
two jobs with two TP groups each, every mode and reason, counters that grow with time,
histograms with real buckets. It must pass `promtool check metrics` cleanly, as
docs/design.md §7 requires of the daemon.

Run alone: fake_spgated.py [PORT]   (serves http://127.0.0.1:PORT/metrics)
"""
import http.server
import math
import sys
import threading
import time

import spgate_contract as contract

JOBS = ("fake-a", "fake-b")
GROUPS = ("0", "1")


def _labels(**kv):
    if not kv:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


class Exposition:
    """Builds the text exposition for time t (seconds since start)."""

    def __init__(self):
        self.start = time.monotonic()

    def Render(self):
        t = time.monotonic() - self.start + 1.0
        out = []

        def family(name, kind, help_text):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        def sample(name, value, **labels):
            text = str(int(value)) if float(value).is_integer() else f"{value:.9g}"
            out.append(f"{name}{_labels(**labels)} {text}")

        def histogram(name, buckets, rate, typical, **labels):
            # Observations arrive at `rate`/s; a fixed share lands in each bucket.
            n = rate * t
            cumulative = 0.0
            for i, le in enumerate(buckets):
                cumulative = n * min(1.0, (i + 1) / len(buckets) + (0.3 if le >= typical else 0))
                sample(name + "_bucket", math.floor(cumulative), le=f"{le:g}", **labels)
            sample(name + "_bucket", math.floor(n), le="+Inf", **labels)
            sample(name + "_sum", n * typical, **labels)
            sample(name + "_count", math.floor(n), **labels)

        family("spgate_decisions_total", "counter", "Per-batch decisions made by the daemon.")
        for j, job in enumerate(JOBS):
            for reason in contract.REASONS:
                if reason == "controller_unavailable":
                    continue  # made by workers, counted in spgate_worker_local_decisions_total
                mode = "tp_only" if reason in ("length_cv", "rs_wait") else "sp"
                if reason == "pinned":
                    sample("spgate_decisions_total", math.floor(0.5 * t), job_id=job,
                           mode="tp_only", reason=reason)
                sample("spgate_decisions_total", math.floor((2 + j) * t), job_id=job, mode=mode,
                       reason=reason)
        family("spgate_worker_local_decisions_total", "counter",
               "Decisions workers made with their local policy, reported after reconnect.")
        for job in JOBS:
            # Labelled with what the local policy decided (docs/metrics.md).
            sample("spgate_worker_local_decisions_total", math.floor(0.2 * t), job_id=job,
                   reason="gates_passed")
            sample("spgate_worker_local_decisions_total", math.floor(0.1 * t), job_id=job,
                   reason="length_cv")
        family("spgate_worker_memory_overrides_total", "counter",
               "Daemon answers workers did not run because their memory gate forbade TP-only.")
        for job in JOBS:
            sample("spgate_worker_memory_overrides_total", 0, job_id=job)  # should stay 0
        family("spgate_batch_length_cv", "histogram", "Length CV of planned batches.")
        for job in JOBS:
            histogram("spgate_batch_length_cv", (0.05, 0.1, 0.15, 0.18, 0.25, 0.5, 1, 2),
                      4, 0.12, job_id=job)
        for name, help_text, base in (
                ("spgate_rs_wait_share", "Rolling reduce-scatter wait share.", 0.1),
                ("spgate_all_gather_tail_seconds", "Rolling p95 all-gather tail.", 0.004),
                ("spgate_norm_stall_ratio", "Rolling LayerNorm stall ratio.", 0.01)):
            family(name, "gauge", help_text)
            for job in JOBS:
                for g in GROUPS:
                    sample(name, base * (1 + 0.5 * math.sin(t / 7 + int(g))) + 1e-6, job_id=job, group=g)
        family("spgate_slowest_rank", "gauge", "Slowest rank of the group's last step.")
        for job in JOBS:
            for g in GROUPS:
                sample("spgate_slowest_rank", (int(g) + int(t) // 30) % 8, job_id=job, group=g)
        family("spgate_stage_predicted_peak_bytes", "gauge", "Predicted peak of a stage's step.")
        family("spgate_stage_tp_only_share", "gauge", "Share of a stage's micro-batches TP-only.")
        for job in JOBS:
            for stage in ("0", "1"):
                sample("spgate_stage_predicted_peak_bytes",
                       (60 - 10 * int(stage)) * 2**30 * (1 + 0.05 * math.sin(t / 9)),
                       job_id=job, stage=stage)
                sample("spgate_stage_tp_only_share", 0.25 * int(stage) + 0.1 * (1 + math.sin(t / 5)),
                       job_id=job, stage=stage)
        family("spgate_stage_adaptive_tokens_per_second", "gauge",
               "Learned tokens/s of a stage by band and mode.")
        for job in JOBS:
            for stage in ("0", "1"):
                for mode, rate in (("sp", 9000.0), ("tp_only", 8000.0 + 2000.0 * int(stage))):
                    sample("spgate_stage_adaptive_tokens_per_second",
                           rate * (1 + 0.02 * math.sin(t / 11)), job_id=job, stage=stage,
                           band="cv2.tok1", mode=mode)
        family("spgate_step_duration_seconds", "histogram", "Step wall time by mode.")
        for job in JOBS:
            for mode in contract.MODES:
                histogram("spgate_step_duration_seconds", (0.1, 0.25, 0.5, 1, 2.5, 5), 2,
                          0.6 if mode == "sp" else 0.5, job_id=job, mode=mode)
        for name, help_text, per_s in (
                ("spgate_effective_tokens_total", "Non-padding tokens processed.", 50000),
                ("spgate_padding_tokens_total", "Padding tokens processed.", 4000)):
            family(name, "counter", help_text)
            for job in JOBS:
                for mode in contract.MODES:
                    sample(name, math.floor(per_s * t), job_id=job, mode=mode)
        family("spgate_peak_memory_bytes", "gauge", "Peak device memory by mode.")
        for job in JOBS:
            sample("spgate_peak_memory_bytes", 60e9, job_id=job, mode="sp")
            sample("spgate_peak_memory_bytes", 72e9, job_id=job, mode="tp_only")
        family("spgate_memory_budget_bytes", "gauge", "Device memory budget reported by workers.")
        for job in JOBS:
            sample("spgate_memory_budget_bytes", 80e9, job_id=job)
        family("spgate_current_mode", "gauge", "1 for the mode a TP group runs now.")
        for job in JOBS:
            for g in GROUPS:
                sp = (int(t / 5) + int(g)) % 2
                sample("spgate_current_mode", sp, job_id=job, group=g, mode="sp")
                sample("spgate_current_mode", 1 - sp, job_id=job, group=g, mode="tp_only")
        family("spgate_mode_switches_total", "counter", "SP <-> TP-only switches.")
        for job in JOBS:
            for g in GROUPS:
                sample("spgate_mode_switches_total", math.floor(t / 5), job_id=job, group=g)
        family("spgate_gate_threshold", "gauge", "Gate thresholds in effect.")
        for gate in contract.GATES:
            sample("spgate_gate_threshold", contract.GATE_DEFAULTS[gate],
                   job_id=contract.GLOBAL_JOB_ID, gate=gate)
        sample("spgate_gate_threshold", 0.25, job_id=JOBS[0], gate="max_rs_wait_share")
        family("spgate_config_version", "gauge", "Version of the effective gate config.")
        sample("spgate_config_version", 3, job_id=contract.GLOBAL_JOB_ID)
        sample("spgate_config_version", 4, job_id=JOBS[0])
        family("spgate_config_updates_total", "counter", "Admin config updates by result.")
        for result in contract.CONFIG_UPDATE_RESULTS:
            sample("spgate_config_updates_total", 1 if result == "ok" else 0, result=result)
        family("spgate_workers", "gauge", "Registered worker ranks by state.")
        for job in JOBS:
            sample("spgate_workers", 8, job_id=job, state="active")
            sample("spgate_workers", 0, job_id=job, state="stale")
        family("spgate_decision_latency_seconds", "histogram", "Plan received to decision sent.")
        histogram("spgate_decision_latency_seconds", (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.02),
                  20, 0.0004)
        family("spgate_state_persist_failures_total", "counter", "Failed state file writes.")
        sample("spgate_state_persist_failures_total", 0)
        family("spgate_config_last_reload_successful", "gauge", "1 if the last config load succeeded.")
        sample("spgate_config_last_reload_successful", 1)
        family("spgate_gate_policy", "gauge", "1 for the policy in force.")
        for job in (contract.GLOBAL_JOB_ID,) + JOBS:
            adaptive = job == JOBS[0]
            sample("spgate_gate_policy", 0 if adaptive else 1, job_id=job, policy="static")
            sample("spgate_gate_policy", 1 if adaptive else 0, job_id=job, policy="adaptive")
        family("spgate_adaptive_tokens_per_second", "gauge", "Learned tokens/s by band and mode.")
        for band, sp, tp in (("cv0.tok1", 120000, 110000), ("cv5.tok1", 90000, 101000)):
            sample("spgate_adaptive_tokens_per_second", sp, job_id=JOBS[0], band=band, mode="sp")
            sample("spgate_adaptive_tokens_per_second", tp, job_id=JOBS[0], band=band,
                   mode="tp_only")
        family("spgate_adaptive_samples", "gauge", "Weighted samples behind each estimate.")
        for band in ("cv0.tok1", "cv5.tok1"):
            sample("spgate_adaptive_samples", 40, job_id=JOBS[0], band=band, mode="sp")
            sample("spgate_adaptive_samples", 12, job_id=JOBS[0], band=band, mode="tp_only")
        family("spgate_adaptive_exploration_steps_total", "counter", "ADAPTIVE exploration steps.")
        for job in JOBS:
            sample("spgate_adaptive_exploration_steps_total",
                   math.floor(0.05 * t) if job == JOBS[0] else 0, job_id=job)
        family("spgate_adaptive_gain_ratio", "gauge", "ADAPTIVE's learned gain over STATIC.")
        for job in JOBS:
            sample("spgate_adaptive_gain_ratio", 1.02 if job == JOBS[0] else 0, job_id=job)
        family("spgate_adaptive_flips_held_total", "counter", "ADAPTIVE decisions that held.")
        for job in JOBS:
            sample("spgate_adaptive_flips_held_total",
                   math.floor(0.02 * t) if job == JOBS[0] else 0, job_id=job)
        family("spgate_adaptive_changes_total", "counter", "Changes ADAPTIVE detected.")
        for job in JOBS:
            sample("spgate_adaptive_changes_total",
                   math.floor(0.001 * t) if job == JOBS[0] else 0, job_id=job)
        family("spgate_adaptive_straggler_steps_total", "counter",
               "Steps ADAPTIVE did not learn: a straggler delayed them.")
        for job in JOBS:
            sample("spgate_adaptive_straggler_steps_total",
                   math.floor(0.01 * t) if job == JOBS[0] else 0, job_id=job)
        family("spgate_adaptive_switch_cost_seconds", "gauge", "Learned cost of a switch.")
        for job in JOBS:
            sample("spgate_adaptive_switch_cost_seconds", 0.04 if job == JOBS[0] else 0,
                   job_id=job)
        family("spgate_worker_refusals_total", "counter",
               "Worker requests refused for their sender.")
        for reason in contract.WORKER_REFUSAL_REASONS:  # every reason exists from the start
            sample("spgate_worker_refusals_total",
                   math.floor(0.1 * t) if reason == "undecided_step" else 0, reason=reason)
        family("spgate_build_info", "gauge", "Build information; always 1.")
        sample("spgate_build_info", 1, version="0.0.0-fake")
        return "\n".join(out) + "\n"


class FakeSpgated:
    """Serves the exposition on 127.0.0.1:port/metrics in a background thread."""

    def __init__(self, port=0):
        exposition = Exposition()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = exposition.Render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.exposition = exposition
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    with FakeSpgated(int(sys.argv[1]) if len(sys.argv) > 1 else 0) as fake:
        print(f"serving http://127.0.0.1:{fake.port}/metrics", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
