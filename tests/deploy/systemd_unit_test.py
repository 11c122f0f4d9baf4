#!/usr/bin/env python3
"""deploy/systemd/spgated.service: consistent with the flag file and docs/design.md §5,
accepted by `systemd-analyze verify`, and hardened (`systemd-analyze security --offline`
exposure at most 2.0, systemd's "OK" band). A worker API listening beyond loopback ships
with a worker credential (the worker tokens as a systemd credential, or mTLS) and never
with --allow_unauthenticated_workers (docs/security.md, "Worker credentials").

Usage: systemd_unit_test.py [BUILD_DIR]   (verifies ExecStart against BUILD_DIR/bin/spgated
when it exists, else against a stub executable; the unit's path is not installed here)
Fails when systemd-analyze is not installed: `make deps` installs it (Debian package
`systemd`, in the Makefile's DEB_PACKAGES; installing it in a container starts nothing),
so a missing tool means an incomplete set-up, not a passing unit.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "deploy", "systemd", "spgated.service")
FLAGS = os.path.join(REPO, "deploy", "systemd", "spgated.flags")
BINARY = "/usr/local/bin/spgated"
CONTRACT_FLAGS = {"listen", "admin_listen", "metrics_listen", "health_listen", "state_dir",
                  "config", "admin_token_file", "tls_cert", "tls_key", "tls_client_ca",
                  "worker_token_file", "worker_subjects_file", "version", "flagfile", "fromenv"}
MAX_EXPOSURE = 2.0

problems = []


def Directives(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def StaticChecks(unit_text):
    d = Directives(unit_text)
    exec_start = d.get("ExecStart", [""])[0].split()
    if not exec_start or exec_start[0] != BINARY:
        problems.append(f"ExecStart must run {BINARY} (where the image and docs install it)")
    args = dict(re.match(r"--([a-z_]+)=(.*)", a).groups() for a in exec_start[1:]
                if re.match(r"--([a-z_]+)=(.*)", a))
    if args.get("flagfile") != "/etc/spgate/spgated.flags":
        problems.append("ExecStart must pass --flagfile=/etc/spgate/spgated.flags")
    if args.get("admin_token_file") != "%d/admin-token" or not any(
            c.startswith("admin-token:") for c in d.get("LoadCredential", [])):
        problems.append("the admin token must come from LoadCredential=admin-token:... as %d/admin-token")
    if "worker_token_file" in args and (args["worker_token_file"] != "%d/worker-tokens" or not any(
            c.startswith("worker-tokens:") for c in d.get("LoadCredential", []))):
        problems.append("the worker tokens must come from LoadCredential=worker-tokens:... as "
                        "%d/worker-tokens")
    for key, want in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                      "StateDirectory": "spgate", "CapabilityBoundingSet": ""}.items():
        if d.get(key, [None])[-1] != want:
            problems.append(f"{key}={want} expected, found {d.get(key)}")
    if "HUP" not in d.get("ExecReload", [""])[0]:
        problems.append("ExecReload must send SIGHUP (re-reads --config)")
    flags = {}
    with open(FLAGS) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^--([a-z_]+)(?:=(.*))?$", line)
            if not m:
                problems.append(f"spgated.flags: not a --flag=value line: {line!r}")
                continue
            flags[m.group(1)] = "true" if m.group(2) is None else m.group(2)
    unknown = set(flags) - CONTRACT_FLAGS
    if unknown:
        problems.append(f"spgated.flags: flags not in docs/design.md §5: {sorted(unknown)}")
    if flags.get("state_dir") != "/var/lib/spgate":
        problems.append("--state_dir must be /var/lib/spgate (StateDirectory=spgate)")
    if flags.get("config") != "/etc/spgate/gates.textproto":
        problems.append("--config must be /etc/spgate/gates.textproto")
    if not flags.get("admin_listen", "").startswith("127.0.0.1:"):
        problems.append("--admin_listen should stay on loopback")
    for flag, port in {"listen": 50061, "admin_listen": 50062, "metrics_listen": 9461}.items():
        if not flags.get(flag, "").endswith(f":{port}"):
            problems.append(f"--{flag} should use docs/design.md §5's default port {port}")
    # spgated refuses a worker API beyond loopback without a worker credential.
    if "allow_unauthenticated_workers" in flags or "allow_unauthenticated_workers" in args:
        problems.append("--allow_unauthenticated_workers must not ship: it opens the worker API")
    host = flags.get("listen", "").rsplit(":", 1)[0].strip("[]")
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    credential = any(f in flags for f in ("worker_token_file", "tls_client_ca")) or \
        "worker_token_file" in args
    if not loopback and not credential:
        problems.append(f"--listen={flags.get('listen')} is beyond loopback without a worker "
                        "credential (--worker_token_file or --tls_client_ca): spgated refuses to start")


def main():
    with open(UNIT) as f:
        unit_text = f.read()
    StaticChecks(unit_text)
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        print("FAIL: static checks passed, but systemd-analyze is not installed, so the unit "
              "was not verified (Debian package `systemd`; make deps installs it)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(sys.argv[1], "bin", "spgated") if len(sys.argv) > 1 else ""
        used_stub = not os.access(binary, os.X_OK)
        if used_stub:
            binary = os.path.join(tmp, "spgated")
            with open(binary, "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(binary, 0o755)
        unit = os.path.join(tmp, "spgated.service")
        with open(unit, "w") as f:
            f.write(unit_text.replace(BINARY, binary))
        r = subprocess.run([analyze, "verify", unit], capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or out:
            problems.append(f"systemd-analyze verify:\n{out}")
        r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", unit],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
        if r.returncode != 0 and "offline" in r.stderr:
            print("note: this systemd-analyze has no --offline; exposure not scored")
        elif not m:
            problems.append(f"systemd-analyze security gave no exposure level:\n{r.stdout}{r.stderr}")
        elif float(m.group(1)) > MAX_EXPOSURE:
            problems.append(f"exposure level {m.group(1)} > {MAX_EXPOSURE}:\n{r.stdout}")
        exposure = m.group(1) if m else "n/a"
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    what = "a stub for ExecStart" if used_stub else binary
    print(f"PASS: unit verified by systemd-analyze (with {what}), exposure {exposure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
