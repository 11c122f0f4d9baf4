#!/usr/bin/env python3
"""How long spgated takes from SIGTERM to exit, with the /metrics endpoint on and off.

Each round starts spgated on loopback (ports picked by the daemon), waits for its
"serving" line, sends SIGTERM and times the exit; the two variants alternate, so machine
noise hits both. The baseline is the daemon without --metrics_listen: whatever the
/metrics server adds to a stop shows as the ratio. Every process is bounded (10 s to
start, 10 s to stop) and killed on the way out.

Usage: bench/server/stop_time.py --spgated=BIN [--rounds=5] [--out=FILE.json]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

VARIANTS = {"metrics_on": ["--metrics_listen=127.0.0.1:0"], "metrics_off": ["--metrics_listen="]}


def stop_seconds(spgated, extra, state_dir):
    cmd = [spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
           f"--state_dir={state_dir}", *extra]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         errors="replace")
    # readline and wait block: a daemon that neither serves nor exits within 10 s, or
    # does not stop within 10 s of SIGTERM, is killed, which ends the read or the wait.
    starting = threading.Timer(10, p.kill)
    stopping = threading.Timer(10, p.kill)
    try:
        starting.start()
        while True:
            line = p.stderr.readline()
            if "serving" in line:
                break
            if not line:
                raise RuntimeError(f"{cmd}: no 'serving' line (exit {p.wait()})")
        starting.cancel()
        # A blocking wait: Popen.wait with a timeout polls, in steps of up to 50 ms.
        stopping.start()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait()
        elapsed = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"{cmd}: exit {rc} after SIGTERM")
        return elapsed
    finally:
        starting.cancel()
        stopping.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spgated", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not 1 <= a.rounds <= 100:
        sys.exit("stop_time.py: --rounds must be in [1, 100]")
    times = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="spgate-stop-") as tmp:
        for r in range(a.rounds):
            for v, extra in VARIANTS.items():
                d = os.path.join(tmp, f"{v}-{r}")
                os.mkdir(d)
                times[v].append(stop_seconds(a.spgated, extra, d))
    result = {v: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                  "runs": len(t)} for v, t in times.items()}
    result["ratio_on_over_off"] = (result["metrics_on"]["median_s"] /
                                   result["metrics_off"]["median_s"])
    print("| variant | stop, median s | range s |")
    print("|---|---:|---|")
    for v in VARIANTS:
        s = result[v]
        print(f"| {v} | {s['median_s']:.3f} | {s['min_s']:.3f}–{s['max_s']:.3f} |")
    print(f"ratio metrics_on / metrics_off (medians): {result['ratio_on_over_off']:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
