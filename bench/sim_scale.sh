#!/usr/bin/env bash
# spgate-sim at cluster scale against one spgated process (issue 3): by default 128 TP
# groups x 8 ranks (1,024 GateClients, one Connect stream each) at 10 steps/s per group
# for 60 s. Reports, next to each other:
#   - lost telemetry: records the simulated ranks produced minus those the daemon
#     acknowledged (sim summary), and the daemon's own accepted-record counter
#     (spgate_telemetry_records_total{result="accepted"}) — they must be equal;
#   - decision latency as seen by the leaders (plan submitted -> decision arrived), p50/p99;
#   - daemon CPU (utime+stime over the run, as cores) and peak RSS (VmHWM);
#   - the baseline of the same run with --controller empty (local policy only), so the
#     sim's own cost is visible separately from the daemon's.
#
# Usage: bench/sim_scale.sh [BUILD_DIR] [OUTDIR]
#   SIM_GROUPS=128 SIM_TP=8 SIM_RATE=10 SIM_DURATION=60s bench/sim_scale.sh build out/bench-sim
# Writes OUTDIR/sim_scale.json (summary + daemon figures) and OUTDIR/sim_scale.md.
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
groups=${SIM_GROUPS:-128}
tp=${SIM_TP:-8}
rate=${SIM_RATE:-10}
duration=${SIM_DURATION:-60s}
mkdir -p "$out"
sim="$build/bin/spgate-sim"
spgated="$build/bin/spgated"
for b in "$sim" "$spgated"; do [ -x "$b" ] || { echo "missing $b (build it first)" >&2; exit 2; }; done

tmp=$(mktemp -d)
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

"$spgated" --listen=127.0.0.1:0 --admin_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  >"$tmp/spgated.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 100); do
  grep -q "serving:" "$tmp/spgated.log" 2>/dev/null && break
  sleep 0.1
done
line=$(grep -m1 "serving:" "$tmp/spgated.log") || { cat "$tmp/spgated.log" >&2; exit 1; }
worker_port=$(sed -E 's/.*worker API on port ([0-9]+).*/\1/' <<<"$line")
metrics_port=$(sed -E 's/.*metrics on port ([0-9]+).*/\1/' <<<"$line")

ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$daemon_pid/stat"; }
scrape() {
  python3 - "$metrics_port" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith('spgate_telemetry_records_total{') and 'result="accepted"' in line:
        print(int(float(line.rsplit(" ", 1)[1])))
        break
else:
    print(0)
EOF
}

echo "== spgate-sim: $groups groups x $tp ranks, $rate steps/s, $duration, against spgated pid $daemon_pid ==" >&2
cpu0=$(cpu_ticks)
t0=$(date +%s.%N)
set +e
"$sim" --controller="127.0.0.1:$worker_port" --job_id=scale --groups="$groups" --tp="$tp" ${SIM_FLAGS:-} \
  --steps_per_s="$rate" --duration="$duration" --summary_json="$out/sim_scale_run.json" \
  2>"$tmp/sim.log"
sim_rc=$?
set -e
t1=$(date +%s.%N)
cpu1=$(cpu_ticks)
cat "$tmp/sim.log" >&2
accepted=$(scrape)
rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$daemon_pid/status")

echo "== baseline: the same run, local policy only ==" >&2
"$sim" --groups="$groups" --tp="$tp" --steps_per_s="$rate" --duration="$duration" \
  --summary_json="$out/sim_scale_local.json" 2>"$tmp/local.log" || true
cat "$tmp/local.log" >&2

python3 - "$out" "$cpu0" "$cpu1" "$ticks" "$t0" "$t1" "$accepted" "$rss_kb" "$sim_rc" \
  "$groups" "$tp" "$rate" "$duration" <<'EOF'
import json, sys
out, cpu0, cpu1, ticks, t0, t1, accepted, rss_kb, rc, groups, tp, rate, duration = sys.argv[1:]
run = json.load(open(out + "/sim_scale_run.json"))
local = json.load(open(out + "/sim_scale_local.json"))
wall = float(t1) - float(t0)
cpu_s = (int(cpu1) - int(cpu0)) / int(ticks)
tel = run["telemetry"]
lat = run["decision_latency_s"]
result = {
    "benchmark": "sim_scale", "groups": int(groups), "tp": int(tp), "ranks": int(groups) * int(tp),
    "steps_per_s": float(rate), "duration": duration, "sim_exit": int(rc),
    "steps_per_group": run["steps"], "consistency_violations": run["consistency_violations"],
    "decide_errors": run["decide_errors"], "decision_sources": run["decision_sources"],
    "local_decisions": run["local_decisions"],
    "telemetry_reported": tel["reported"], "telemetry_acknowledged": tel["acknowledged"],
    "telemetry_dropped": tel["dropped"], "lost_telemetry": run["lost_telemetry"],
    "daemon_telemetry_accepted": int(accepted),
    "decision_latency_p50_ms": lat["p50"] * 1e3, "decision_latency_p99_ms": lat["p99"] * 1e3,
    "decision_latency_max_ms": lat["max"] * 1e3, "decision_latency_samples": lat["samples"],
    "daemon_cpu_s": cpu_s, "daemon_cpu_cores": cpu_s / wall if wall > 0 else 0,
    "daemon_peak_rss_mib": int(rss_kb) / 1024, "sim_wall_s": wall,
    "late_steps": run["late_steps"],
    "baseline_local_only": {"wall_s": local["wall_s"], "late_steps": local["late_steps"],
                            "consistency_violations": local["consistency_violations"]},
}
json.dump(result, open(out + "/sim_scale.json", "w"), indent=2)
md = f"""| metric | value |
|---|---:|
| ranks (groups x tp) | {result['ranks']} ({groups} x {tp}) at {rate} steps/s, {duration} |
| steps per group | {result['steps_per_group']} |
| consistency violations | {result['consistency_violations']} |
| decisions by source | {result['decision_sources']} |
| telemetry reported / acknowledged / daemon accepted | {tel['reported']} / {tel['acknowledged']} / {accepted} |
| lost telemetry (reported - acknowledged) | {result['lost_telemetry']} |
| decision latency seen by leaders p50 / p99 / max | {result['decision_latency_p50_ms']:.2f} / {result['decision_latency_p99_ms']:.2f} / {result['decision_latency_max_ms']:.2f} ms |
| daemon CPU | {cpu_s:.1f} s over {wall:.1f} s = {result['daemon_cpu_cores']:.2f} cores |
| daemon peak RSS | {result['daemon_peak_rss_mib']:.0f} MiB |
| sim ticks started late (> half a period) | {result['late_steps']} (local-only baseline: {local['late_steps']}) |
"""
open(out + "/sim_scale.md", "w").write(md)
print(md)
EOF
