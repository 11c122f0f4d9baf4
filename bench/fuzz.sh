#!/usr/bin/env bash
# Builds the four tests/fuzz harnesses with clang's libFuzzer under ASan/UBSan in their
# own build tree and runs each from its checked-in seed corpus (docs/operations.md,
# "Fuzzing"). A crash, sanitizer report, leak, timeout or broken invariant is a finding:
# libFuzzer writes the input under build-fuzz/fuzz-results/ and the script exits 1.
#
# Usage: bench/fuzz.sh [RUNS|SECONDSs]
#   bench/fuzz.sh            1,000,000 executions per harness (the default)
#   bench/fuzz.sh 200000     200,000 executions per harness
#   bench/fuzz.sh 60s        60 seconds per harness
# Environment: FUZZ_BUILD_DIR (build-fuzz), JOBS (nproc), FUZZ_CC / FUZZ_CXX (clang-14).
# Results: $FUZZ_BUILD_DIR/fuzz-results/results.{json,txt} (harness, executions, seconds,
# findings); new inputs libFuzzer found go to $FUZZ_BUILD_DIR/fuzz-corpus/<harness>/, the
# checked-in corpus (tests/fuzz/corpus/) is only read.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-1000000}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}
harnesses=(worker_message_fuzz admin_request_fuzz config_textproto_fuzz state_file_fuzz)

case "$budget" in
  *s) limit=(-runs=-1 "-max_total_time=${budget%s}") ;;
  *) limit=("-runs=$budget") ;;
esac
[[ "${budget%s}" =~ ^[0-9]+$ ]] || { echo "usage: $0 [RUNS|SECONDSs]" >&2; exit 2; }

CC=${FUZZ_CC:-clang-14} CXX=${FUZZ_CXX:-clang++-14} \
  cmake -S . -B "$build" -DSPGATE_FUZZ=ON -DSPGATE_ENABLE_CUDA=OFF -DSPGATE_BUILD_BENCH=OFF \
        -DSPGATE_TEST_DIRS=fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs" --target "${harnesses[@]}"

results="$build/fuzz-results"
mkdir -p "$results"
rm -f "$results"/*.log "$results"/results.*
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
total_findings=0
rows=()
for h in "${harnesses[@]}"; do
  work="$build/fuzz-corpus/$h"
  mkdir -p "$work"
  log="$results/$h.log"
  echo "== $h (${limit[*]})"
  start=$(date +%s%N)
  rc=0
  "$build/tests/$h" "${limit[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$results/$h-" \
      "$work" "tests/fuzz/corpus/$h" >"$log" 2>&1 || rc=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then  # a crash ends the run before the final stats
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  findings=$(find "$results" -maxdepth 1 -name "$h-*" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$findings" -eq 0 ]; then findings=1; fi
  total_findings=$((total_findings + findings))
  printf '%s: %s executions in %.1f s, %s findings (exit %s)\n' "$h" "${execs:-0}" "$seconds" "$findings" "$rc"
  rows+=("$h ${execs:-0} $seconds $findings $rc")
done

{
  printf '%-24s %12s %9s %9s\n' harness executions seconds findings
  for r in "${rows[@]}"; do
    read -r h e s f _ <<<"$r"
    printf '%-24s %12s %9.1f %9s\n' "$h" "$e" "$s" "$f"
  done
  echo "budget: ${limit[*]}; $(${FUZZ_CXX:-clang++-14} --version | head -1); logs and inputs: $results"
} | tee "$results/results.txt"
{
  printf '{"budget": "%s", "compiler": "%s", "harnesses": [' "${limit[*]}" "$(${FUZZ_CXX:-clang++-14} --version | head -1)"
  sep=""
  for r in "${rows[@]}"; do
    read -r h e s f rc <<<"$r"
    printf '%s\n  {"harness": "%s", "executions": %s, "seconds": %.1f, "findings": %s, "exit_code": %s}' \
      "$sep" "$h" "$e" "$s" "$f" "$rc"
    sep=","
  done
  printf '\n]}\n'
} >"$results/results.json"
[ "$total_findings" -eq 0 ]
