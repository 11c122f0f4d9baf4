# Sourced by the demo scripts. Sourcing it makes a temp dir ($tmp) and a trap that stops
# the daemon and removes $tmp on exit. start_spgated starts spgated on loopback (every
# port 0) and learns the ports it bound from its log: it sets daemon_pid, port (worker
# API), metrics_port and line (the log line); on failure it prints the log and exits 1.
# Usage: source tools/start_spgated.sh NAME; start_spgated SPGATED STATE_DIR LOG NAME
tmp=$(mktemp -d "${TMPDIR:-/tmp}/spgate-${1:-demo}.XXXXXX")
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

start_spgated() {
  local spgated=$1 state_dir=$2 log=$3 name=$4
  mkdir -p "$state_dir"
  "$spgated" --listen=127.0.0.1:0 --admin_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    --state_dir="$state_dir" 2>"$log" &
  daemon_pid=$!
  port="" metrics_port="" line=""
  for _ in $(seq 1 200); do
    line=$(grep -m1 "serving: worker API on port" "$log" || true)
    if [ -n "$line" ]; then
      port=$(sed -E 's/.*worker API on port ([0-9]+).*/\1/' <<<"$line")
      metrics_port=$(sed -E 's/.*metrics on port ([0-9]+).*/\1/' <<<"$line")
      return 0
    fi
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "$name: spgated did not start:" >&2
  cat "$log" >&2
  exit 1
}
