#!/usr/bin/env bash
# spgate-sim at cluster scale against one spgated process: by default 128 TP
# groups x 8 ranks (1,024 GateClients, one Connect stream each) at 10 steps/s per group
# for 60 s, once per arrival pattern (SIM_PHASES, default "random aligned"), each against
# a freshly started spgated:
#   random  - every group ticks at its own seeded phase in the step period (independent
#             groups: plans reach the daemon spread over the period);
#   aligned - every group ticks at the same instant (the groups of one data-parallel job
#             after a gradient all-reduce: all 128 plans in one burst, the worst case).
# For each it reports, next to each other:
#   - lost telemetry: records the simulated ranks produced minus those the daemon
#     acknowledged (sim summary), and the daemon's own accepted-record counter
#     (spgate_telemetry_records_total{result="accepted"}) - they must be equal;
#   - decision latency as seen by the leaders (plan submitted -> decision arrived), p50/p99,
#     and the part of it a plan spent queued in the sim process before its client's
#     writer took it (1,024 clients share one writer thread here, unlike a real cluster)
#     and the rest (writer -> decision arrived);
#   - daemon CPU (utime+stime over the run, as cores) and peak RSS (VmHWM), and the
#     daemon's own decision time (spgate_decision_latency_seconds: message parsed ->
#     decision made, its p99 as the histogram's bucket bound), so the latency splits into
#     the sim's queue, the daemon's work and the transport and scheduling around them;
#   - the sessions the run held (one per group with group sessions, the default; one per
#     rank with SIM_FLAGS=--group_session=false).
# and once, the baseline of the same run with --controller empty (local policy only), so
# the sim's own cost and schedule are visible apart from the daemon's.
#
# Usage: bench/sim_scale.sh [BUILD_DIR] [OUTDIR]
#   SIM_GROUPS=128 SIM_TP=8 SIM_RATE=10 SIM_DURATION=60s SIM_PHASES="random aligned" \
#     bench/sim_scale.sh build out/bench-sim
# SIM_DAEMON_CPUS / SIM_SIM_CPUS (taskset lists, e.g. 0 and 1) pin the daemon and the sim
# to their own cores; SIM_FLAGS adds spgate-sim flags.
# Writes OUTDIR/sim_scale.json (all runs + daemon figures), OUTDIR/sim_scale.md, and each
# run's summary (sim_scale_<phase>.json, sim_scale_local.json).
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
groups=${SIM_GROUPS:-128}
tp=${SIM_TP:-8}
rate=${SIM_RATE:-10}
duration=${SIM_DURATION:-60s}
phases=${SIM_PHASES:-random aligned}
mkdir -p "$out"
sim="$build/bin/spgate-sim"
spgated="$build/bin/spgated"
for b in "$sim" "$spgated"; do [ -x "$b" ] || { echo "missing $b (build it first)" >&2; exit 2; }; done

tmp=$(mktemp -d)
daemon_pid=""
stop_daemon() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
  fi
  daemon_pid=""
}
trap 'stop_daemon; rm -rf "$tmp"' EXIT

ticks=$(getconf CLK_TCK)
# scrape PORT: "ACCEPTED DECIDE_P99_MS" (the p99 as the bound of its histogram bucket).
scrape() {
  python3 - "$1" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
accepted, buckets = 0, []
for line in body.splitlines():
    if line.startswith('spgate_telemetry_records_total{') and 'result="accepted"' in line:
        accepted = int(float(line.rsplit(" ", 1)[1]))
    if line.startswith('spgate_decision_latency_seconds_bucket{'):
        le = line.split('le="', 1)[1].split('"', 1)[0]
        buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
p99 = -1.0
if buckets and buckets[-1][1] > 0:
    total = buckets[-1][1]
    p99 = next(le for le, n in buckets if n >= 0.99 * total) * 1e3
print(accepted, p99)
EOF
}

# run_phase PHASE: one sim run against a fresh daemon; writes $out/sim_scale_PHASE.json
# and $tmp/PHASE.daemon (cpu_s wall_s accepted rss_kb sim_rc).
run_phase() {
  local phase=$1
  ${SIM_DAEMON_CPUS:+taskset -c "$SIM_DAEMON_CPUS"} \
    "$spgated" --listen=127.0.0.1:0 --admin_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    >"$tmp/spgated.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 100); do
    grep -q "serving:" "$tmp/spgated.log" 2>/dev/null && break
    sleep 0.1
  done
  local line worker_port metrics_port
  line=$(grep -m1 "serving:" "$tmp/spgated.log") || { cat "$tmp/spgated.log" >&2; exit 1; }
  worker_port=$(sed -E 's/.*worker API on port ([0-9]+).*/\1/' <<<"$line")
  metrics_port=$(sed -E 's/.*metrics on port ([0-9]+).*/\1/' <<<"$line")

  echo "== spgate-sim: $groups groups x $tp ranks, $rate steps/s, $duration, --group_phase=$phase, against spgated pid $daemon_pid ==" >&2
  local cpu0 cpu1 t0 t1 rc accepted rss_kb
  cpu0=$(awk '{print $14 + $15}' "/proc/$daemon_pid/stat")
  t0=$(date +%s.%N)
  # The sim's stderr as it runs, with its progress lines when ours is a terminal.
  local progress=()
  [ -t 2 ] && progress=(--progress)
  set +e
  ${SIM_SIM_CPUS:+taskset -c "$SIM_SIM_CPUS"} \
    "$sim" --controller="127.0.0.1:$worker_port" --job_id=scale --groups="$groups" --tp="$tp" \
    --group_phase="$phase" ${SIM_FLAGS:-} --steps_per_s="$rate" --duration="$duration" \
    --summary_json="$out/sim_scale_$phase.json" "${progress[@]}" 2>&1 >/dev/null | tee "$tmp/sim.log" >&2
  rc=${PIPESTATUS[0]}
  set -e
  t1=$(date +%s.%N)
  cpu1=$(awk '{print $14 + $15}' "/proc/$daemon_pid/stat")
  read -r accepted decide_p99 < <(scrape "$metrics_port")
  rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$daemon_pid/status")
  stop_daemon
  echo "$(( cpu1 - cpu0 )) $t0 $t1 $accepted $rss_kb $rc $decide_p99" >"$tmp/$phase.daemon"
}

for phase in $phases; do run_phase "$phase"; done

echo "== baseline: the same run, local policy only ==" >&2
"$sim" --groups="$groups" --tp="$tp" --steps_per_s="$rate" --duration="$duration" \
  --summary_json="$out/sim_scale_local.json" 2>"$tmp/local.log" || true
cat "$tmp/local.log" >&2

python3 - "$out" "$tmp" "$ticks" "$groups" "$tp" "$rate" "$duration" $phases <<'EOF'
import json, sys
out, tmp, ticks, groups, tp, rate, duration = sys.argv[1:8]
phases = sys.argv[8:]
local = json.load(open(out + "/sim_scale_local.json"))
runs = []
for phase in phases:
    run = json.load(open(f"{out}/sim_scale_{phase}.json"))
    cpu_ticks, t0, t1, accepted, rss_kb, rc, decide_p99 = open(f"{tmp}/{phase}.daemon").read().split()
    wall = float(t1) - float(t0)
    cpu_s = int(cpu_ticks) / int(ticks)
    tel = run["telemetry"]
    lat = run["decision_latency_s"]
    runs.append({
        "group_phase": phase, "sim_exit": int(rc), "steps_per_group": run["steps"],
        "consistency_violations": run["consistency_violations"],
        "decide_errors": run["decide_errors"], "decision_sources": run["decision_sources"],
        "local_decisions": run["local_decisions"],
        "telemetry_reported": tel["reported"], "telemetry_acknowledged": tel["acknowledged"],
        "telemetry_dropped": tel["dropped"], "lost_telemetry": run["lost_telemetry"],
        "daemon_telemetry_accepted": int(accepted),
        "decision_latency_p50_ms": lat["p50"] * 1e3, "decision_latency_p99_ms": lat["p99"] * 1e3,
        "decision_latency_max_ms": lat["max"] * 1e3, "decision_latency_samples": lat["samples"],
        "plan_queued_p50_ms": run["plan_queued_s"]["p50"] * 1e3,
        "plan_queued_p99_ms": run["plan_queued_s"]["p99"] * 1e3,
        "from_write_p50_ms": run["decision_latency_from_write_s"]["p50"] * 1e3,
        "from_write_p99_ms": run["decision_latency_from_write_s"]["p99"] * 1e3,
        "daemon_cpu_s": cpu_s, "daemon_cpu_cores": cpu_s / wall if wall > 0 else 0,
        "daemon_peak_rss_mib": int(rss_kb) / 1024, "sim_wall_s": wall,
        "daemon_decide_p99_ms": float(decide_p99), "sessions": run.get("sessions"),
        "late_ticks": run["late_steps"],
    })
result = {
    "benchmark": "sim_scale", "groups": int(groups), "tp": int(tp),
    "ranks": int(groups) * int(tp), "steps_per_s": float(rate), "duration": duration,
    "runs": runs,
    "baseline_local_only": {"wall_s": local["wall_s"], "late_ticks": local["late_steps"],
                            "consistency_violations": local["consistency_violations"]},
}
json.dump(result, open(out + "/sim_scale.json", "w"), indent=2)
md = (f"{result['ranks']} ranks ({groups} groups x {tp}) at {rate} steps/s, {duration}; "
      f"local-only baseline: {local['late_steps']} late ticks, "
      f"{local['consistency_violations']} consistency violations\n\n"
      "| group phase | sessions | consistency violations | decisions by source | telemetry reported / acked / daemon accepted | lost | leader latency p50 / p99 / max | queued in the sim p50 / p99 | from the write p50 / p99 | daemon's decision p99 | daemon CPU | daemon peak RSS | late ticks |\n"
      "|---|---:|---:|---|---|---:|---|---|---|---:|---:|---:|---:|\n")
for r in runs:
    md += (f"| {r['group_phase']} | {r['sessions'] if r['sessions'] is not None else '—'} | "
           f"{r['consistency_violations']} | {r['decision_sources']} | "
           f"{r['telemetry_reported']} / {r['telemetry_acknowledged']} / {r['daemon_telemetry_accepted']} | "
           f"{r['lost_telemetry']} | {r['decision_latency_p50_ms']:.2f} / {r['decision_latency_p99_ms']:.2f} / "
           f"{r['decision_latency_max_ms']:.2f} ms | "
           f"{r['plan_queued_p50_ms']:.2f} / {r['plan_queued_p99_ms']:.2f} ms | "
           f"{r['from_write_p50_ms']:.2f} / {r['from_write_p99_ms']:.2f} ms | "
           f"≤ {r['daemon_decide_p99_ms']:g} ms | {r['daemon_cpu_cores']:.2f} cores | "
           f"{r['daemon_peak_rss_mib']:.0f} MiB | {r['late_ticks']} |\n")
open(out + "/sim_scale.md", "w").write(md)
print(md)
EOF
