#!/usr/bin/env python3
"""Static checks of deploy/docker/Dockerfile (the image itself is built and run by
image_test.sh, label `image`; docs/deploy.md has the build commands).

Checks: multi-stage, every stage on Debian 12 (bookworm), a slim runtime stage; the runtime
stage runs as a numeric non-root user set before ENTRYPOINT and never switches back;
exec-form ENTRYPOINT of /usr/local/bin/spgated with CMD flags from docs/design.md §5 that
match the Kubernetes sidecar's ports, and that spgated accepts: a worker API beyond
loopback only with a worker credential, never --allow_unauthenticated_workers (an empty
--listen is 127.0.0.1:50061 without one; docs/security.md, "Worker credentials"); apt-get with -y --no-install-recommends and the
package lists removed in the same RUN; no ADD of URLs or `curl | sh`; no pipeline in any
RUN and no SHELL to rely on (the OCI image format, podman's default, ignores SHELL, so a
pipeline would lose its failures under /bin/sh); no `# syntax` line (BuildKit would fetch a
frontend image from a registry); no `useradd/groupadd --system` (uid 65532 is outside the
system range and warns); the build stage installs only the Makefile's build packages
(`make deps-build`), builds without tests and runs deploy/docker/runtime_packages.sh;
COPY sources exist; the .dockerignore keeps build trees and .git out of the context.
Runs hadolint too when it is installed.
"""
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(REPO, "deploy", "docker", "Dockerfile")
IGNORE = DOCKERFILE + ".dockerignore"
CONTRACT_FLAGS = {"listen", "admin_listen", "metrics_listen", "health_listen", "state_dir",
                  "config", "admin_token_file", "tls_cert", "tls_key", "tls_client_ca",
                  "worker_token_file", "worker_subjects_file"}
DEFAULT_WORKER_PORT = 50061  # an empty --listen (docs/design.md §5)

problems = []


def Instructions(text):
    """[(instruction, arguments)] with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def main():
    with open(DOCKERFILE) as f:
        text = f.read()
    instructions = Instructions(text)
    if re.search(r"(?im)^#\s*syntax\s*=", text):
        problems.append("a `# syntax=` line makes BuildKit fetch a frontend image from a "
                        "registry; nothing here needs it")
    args = {}
    stages = []  # each: {"from": image, "name": ..., "ins": [...]}
    for ins, rest in instructions:
        if ins == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
        elif ins == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.split()[0])
            name = rest.split()[2] if len(rest.split()) == 3 and rest.split()[1].upper() == "AS" else None
            stages.append({"from": image, "name": name, "ins": []})
        elif stages:
            stages[-1]["ins"].append((ins, rest))
    if len(stages) < 2:
        problems.append("must be multi-stage (build, runtime)")
    for i, s in enumerate(stages):
        if s["from"] in {t["name"] for t in stages[:i]}:
            continue  # FROM an earlier stage: on that stage's base, checked there
        if not re.fullmatch(r"debian:(bookworm|12)([.\d]*)?(-slim)?(@sha256:[0-9a-f]{64})?", s["from"]):
            problems.append(f"stage {s['name'] or s['from']}: not Debian 12 ({s['from']})")
    runtime = stages[-1] if stages else {"from": "", "ins": []}
    if "-slim" not in runtime["from"]:
        problems.append("the runtime stage should be debian:bookworm-slim")
    names = {s["name"] for s in stages if s["name"]}
    # Per-instruction rules.
    for s in stages:
        for ins, rest in s["ins"]:
            if ins == "SHELL":
                problems.append(f"SHELL {rest}: the OCI image format ignores it, so no RUN "
                                "may depend on it")
            if ins == "ADD" and re.search(r"https?://", rest):
                problems.append(f"ADD of a URL: {rest}")
            if ins != "RUN":
                continue
            if re.search(r"curl[^|]*\|\s*(ba)?sh", rest):
                problems.append(f"curl | sh: {rest}")
            if "apt-get install" in rest:
                if "--no-install-recommends" not in rest or " -y" not in rest:
                    problems.append(f"apt-get install without -y --no-install-recommends: {rest[:80]}")
            if "apt-get update" in rest and "rm -rf /var/lib/apt/lists" not in rest:
                problems.append(f"apt-get update without removing the lists in the same RUN: {rest[:80]}")
            if "make deps" in rest and "rm -rf /var/lib/apt/lists" not in rest:
                problems.append("`make deps` layer keeps the apt lists")
            if "|" in rest.replace("||", "") and not rest.startswith("["):
                problems.append(f"RUN with a pipeline (under /bin/sh a failing step is lost; "
                                f"write to a file and check it): {rest[:80]}")
            if re.search(r"\b(useradd|groupadd)\b[^&;]*--system", rest):
                problems.append("useradd/groupadd --system with uid 65532 warns on every build")
        for ins, rest in s["ins"]:
            if ins == "COPY":
                parts = [p for p in rest.split() if not p.startswith("--")]
                from_stage = re.search(r"--from=(\S+)", rest)
                if from_stage and from_stage.group(1) not in names:
                    problems.append(f"COPY --from={from_stage.group(1)}: no such stage")
                if not from_stage:
                    for src in parts[:-1]:
                        if src != "." and not os.path.exists(os.path.join(REPO, src)):
                            problems.append(f"COPY source {src} does not exist in the repository")
    build_runs = " ".join(r for s in stages[:-1] for i, r in s["ins"] if i == "RUN")
    if not re.search(r"make deps-build\b", build_runs):
        problems.append("the build stage should install only the Makefile's build packages "
                        "(make deps-build)")
    if "deploy/docker/runtime_packages.sh" not in build_runs:
        problems.append("the build stage should find the runtime packages with "
                        "deploy/docker/runtime_packages.sh (it fails on an unowned library)")
    if "-DSPGATE_BUILD_TESTS=OFF" not in build_runs:
        problems.append("the image build should not build the test suite")
    # Runtime user, entrypoint, cmd.
    users = [(i, r) for i, (ins, r) in enumerate(runtime["ins"]) if ins == "USER"]
    entry = [(i, r) for i, (ins, r) in enumerate(runtime["ins"]) if ins == "ENTRYPOINT"]
    if not users:
        problems.append("the runtime stage has no USER")
    else:
        uid = users[-1][1].split(":")[0]
        if not uid.isdigit() or uid == "0":
            problems.append(f"USER {users[-1][1]}: must be a numeric non-root uid "
                            "(Kubernetes runAsNonRoot cannot check a name)")
        if entry and users[-1][0] > entry[-1][0]:
            problems.append("USER must come before ENTRYPOINT")
    if not entry:
        problems.append("no ENTRYPOINT")
    else:
        try:
            ep = json.loads(entry[-1][1])
        except json.JSONDecodeError:
            ep = None
        if ep != ["/usr/local/bin/spgated"]:
            problems.append(f"ENTRYPOINT must be exec form [\"/usr/local/bin/spgated\"], is {entry[-1][1]}")
    cmd = [r for ins, r in runtime["ins"] if ins == "CMD"]
    flags = {}
    try:
        for a in json.loads(cmd[-1]) if cmd else []:
            k, _, v = a[2:].partition("=")
            flags[k] = v
    except json.JSONDecodeError:
        problems.append("CMD must be exec (JSON) form")
    if set(flags) - CONTRACT_FLAGS:
        problems.append(
            f"CMD flags not in docs/design.md §5: {sorted(set(flags) - CONTRACT_FLAGS)}")
    exposed = {int(p.split("/")[0]) for ins, r in runtime["ins"] if ins == "EXPOSE" for p in r.split()}
    for flag in ("listen", "metrics_listen", "health_listen"):
        default = f":{DEFAULT_WORKER_PORT}" if flag == "listen" else ":0"
        port = int((flags.get(flag) or default).rsplit(":", 1)[1])
        if port not in exposed:
            problems.append(f"--{flag} port {port} is not EXPOSEd")
    host = flags.get("listen", "").rsplit(":", 1)[0].strip("[]")
    credential = any(f in flags for f in ("worker_token_file", "tls_client_ca"))
    if flags.get("listen") and not credential and not (
            host in ("localhost", "::1") or host.startswith("127.")):
        problems.append(f"CMD --listen={flags['listen']} is beyond loopback without a worker "
                        "credential: spgated refuses to start (leave --listen empty)")
    if "allow_unauthenticated_workers" in flags:
        problems.append("CMD must not pass --allow_unauthenticated_workers")
    if not flags.get("admin_listen", "").startswith("127.0.0.1:"):
        problems.append("the admin API should stay on loopback by default")
    # .dockerignore
    with open(IGNORE) as f:
        ignored = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    for must in (".git", "build", "build-*"):
        if must not in ignored:
            problems.append(f"{os.path.basename(IGNORE)} should exclude {must}")
    hadolint = shutil.which("hadolint")
    if hadolint:
        r = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            problems.append(f"hadolint:\n{r.stdout}{r.stderr}")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: {len(stages)} stages on Debian 12, non-root runtime"
          + ("" if hadolint else " (hadolint not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
