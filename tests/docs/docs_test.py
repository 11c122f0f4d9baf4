#!/usr/bin/python3
"""The docs name only things that exist: README.md and docs/*.md checked against the tree,
the proto and the built binaries. Offline, read-only, a few seconds (one spgated on
127.0.0.1 with port 0 for a /metrics scrape).

What is checked, and the rule that decides what a name refers to:

* Links. Every relative link `[t](path)`, `![t](path)`, `[t]: path`, `<a href>`/`<img src>`
  resolves to a file or folder (from the doc's folder); a `#anchor` on a Markdown target
  (or alone) names one of its headings, slugged as GitHub does (lowercase, punctuation
  but `-` and `_` dropped, spaces to `-`, `-1`, `-2` for repeats) or an `<a id/name>`.
  "design.md §N" (in docs and in code comments) names an existing "## N." section, and
  `x.md, "Title"` / `design.md §N "Title"` a text in that doc (section). A
  path in an inline code span whose first folder is one of the repository's top-level
  folders (`server/metrics.cc`, `deploy/k8s/`) exists.
* Metrics. A `spgate_*` word in a doc is a metric unless it is a file name
  (`spgate_x.py`), a call (`spgate_x(`), or an identifier of the C API header, the Python
  package or a CMake target. A metric must be registered in server/*.cc
  (`.Name("spgate_…")`), with `_bucket`/`_sum`/`_count` allowed for histograms and
  `spgate_x_*` for a family prefix. The names read from the source are held against a live
  /metrics of spgated, so the reading cannot drift from what the daemon exports. Recording
  rules (`level:spgate_x:op`) must be a `record:`, and alerts (`SpgateX`) an `alert:`, of
  deploy/**/*.yml.
* RPCs. `spgate.v1.X` names a service, message or enum of proto/spgate/v1/*.proto;
  `FooService/Method` and `FooService.Method` a method of that service;
  `Method(Request) → Response` an rpc with exactly those types; `` `X` RPC`` an rpc.
* Commands. In a code block line or an inline code span that runs spgatectl, the first
  words after it (flags and their values skipped) must be one of the commands
  `spgatectl --help` lists (`gates set`, `jobs show`, `pin`, ...); after `make`, a rule
  of the top-level Makefile; after spgate-sim, a subcommand its usage shows (`replay`).
* Flags (`--name`, lowercase). Attributed to a program by where they stand:
  1. On a command line (a code block's line, `\\`-continued lines joined, cut at `|`,
     `;`, `&&`, `&`; or an inline code span that names a program), a flag belongs to the
     program word nearest before it, and must be one of its flags: spgated, spgate-sim,
     spgate-worker (their `--helpfull`), spgatectl (its global flags plus the named
     command's, from `spgatectl [COMMAND] --help`); a script of the repository (`x.py`,
     `x.sh`: the flag appears in its source, or is a flag of a binary the script runs);
     another program (mpirun, kubectl, podman, `*_bench`, ...) is not checked.
  2. A flag table's row (first cell a flag) under headings that name exactly one binary
     (`# spgate-worker: ...` > `## Flags`): that binary's flag; a `default` column must
     say the binary's default (`--helpfull`; empty reads as empty, none, off or —).
  3. Anywhere else (prose, a code line that runs nothing): a flag of any of the four
     binaries or of a script named nearby (the paragraph, two blocks either side in the
     same section, the headings). Skipped only when it is none of those, something nearby
     names another program, and it is not a near miss (difflib ratio >= 0.85, 8+
     characters, no `-`) of one of our flags.
  Exempt: `--flag` and UPPERCASE placeholders, `--x_*` prefixes (one flag must start with
  `x_`), `--nox` for a boolean `--x`, and a flag the same block shows refused
  ("unknown flag --x").
* Internal tracker references ("issue 12", "(#12)", "the issue's ...") and the private
  workspace (SPEC.md, /work/main, shared/research) appear in no doc and no source file
  (an upstream project's issue is cited by its URL).
A self-test first runs the checks on a made-up doc with one mistake of each kind.

Usage: docs_test.py [--root=DIR] [--spgated=BIN] [--spgatectl=BIN] [--spgate_sim=BIN]
                    [--spgate_worker=BIN] [--build=DIR (binaries in DIR/bin)]
A binary not given and not under --build is not checked (said once); the rest still runs.
Exit 0: every check passed; 1: each failure printed as FILE:LINE: what.
"""
import argparse
import copy
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
import urllib.request

BINARIES = ("spgated", "spgatectl", "spgate-sim", "spgate-worker")
# Programs whose flags are not ours to check (named in docs beside our binaries).
EXTERNAL = {
    "mpirun", "mpiexec", "torchrun", "python", "python3", "kubectl", "kustomize", "helm",
    "docker", "podman", "buildah", "curl", "grpcurl", "openssl", "promtool", "prometheus",
    "ctest", "cmake", "make", "ninja", "git", "pip", "pip3", "systemctl", "systemd-analyze",
    "systemd-run", "journalctl", "sudo", "env", "timeout", "nvidia-smi", "nsys", "ncu",
    "apt-get", "apt", "grep", "jq", "watch", "perf", "gdb", "valgrind", "bash", "sh", "ssh",
    "kill", "protoc", "taskset", "chattr", "chmod", "ulimit", "nccl-tests", "all_reduce_perf",
    "reduce_scatter_perf", "all_gather_perf", "megatron", "pretrain_gpt.py", "deepspeed",
    "debootstrap", "clang", "gcc", "g++", "nvcc", "ccache", "cmake-format", "clang-format",
    "clang-tidy", "grafana", "amtool", "yq", "unshare", "runc", "mount", "tar",
}
# Words in prose that name a non-spgate program whose flags we do not check.
EXTERNAL_PROSE = re.compile(
    r"\b(mpirun|mpiexec|torchrun|kubectl|kustomize|podman|docker|ctest|cmake|systemctl|"
    r"protoc|promtool|curl|grpcurl|openssl|Megatron|nccl-tests)\b")
PLACEHOLDER_FLAGS = {"flag"}
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)(\*?)")
ISSUE_REF = re.compile(r"\bissues? #?\d+\b|\(#\d+\)|\bthe issue(?:'s| asks| names| says)\b",
                       re.IGNORECASE)
# The project's private workspace: its contract and notes are not part of the tree.
PRIVATE_REF = re.compile(r"\bSPEC(?:\.md)?\b|/work/main\b|\bshared/(?:research|SPEC)")
SOURCE_EXTS = (".cc", ".h", ".cu", ".cuh", ".py", ".pyi", ".sh", ".cmake", ".proto", ".yml",
               ".yaml", ".txt", ".json.in", ".service", ".textproto")


STATS = {"command-line flags": 0, "table flags": 0, "prose flags": 0, "spgatectl commands": 0}


class Failures:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")


# ---------------------------------------------------------------- Markdown reading

class Block:
    """A paragraph: prose lines (kind 'prose') or a fenced code block (kind 'code')."""

    def __init__(self, kind, start, lines, headings, lang=""):
        self.kind, self.start, self.lines, self.headings, self.lang = (
            kind, start, lines, headings, lang)

    def text(self):
        return "\n".join(self.lines)


def ReadMarkdown(text):
    """Blocks and headings of one Markdown file: ([Block], [(line, level, title)])."""
    blocks, headings, stack = [], [], []
    lines = text.split("\n")
    i, cur, cur_start = 0, [], 0
    fence = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")

    def Flush():
        nonlocal cur
        if cur:
            blocks.append(Block("prose", cur_start, cur, [h for _, h in stack]))
        cur = []

    while i < len(lines):
        line = lines[i]
        m = fence.match(line)
        if m:
            Flush()
            marker, lang, start, body = m.group(1), m.group(2), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker[:3]):
                body.append(lines[i])
                i += 1
            blocks.append(Block("code", start + 1, body, [h for _, h in stack], lang))
            i += 1
            continue
        h = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if h:
            Flush()
            level = len(h.group(1))
            headings.append((i + 1, level, h.group(2)))
            stack = [(lv, t) for lv, t in stack if lv < level] + [(level, h.group(2))]
        elif line.strip():
            if not cur:
                cur_start = i + 1
            cur.append(line)
        else:
            Flush()
        i += 1
    Flush()
    return blocks, headings


def Slug(title):
    """GitHub's heading anchor: rendered text, lowercase, punctuation gone, spaces to '-'."""
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", title)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = t.replace("`", "").replace("**", "").replace("*", "")
    t = t.strip().lower()
    out = []
    for ch in t:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN" or cat == "Mn":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def Anchors(text):
    _, headings = ReadMarkdown(text)
    seen, anchors = {}, set()
    for _, _, title in headings:
        s = Slug(title)
        n = seen.get(s, 0)
        anchors.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return anchors


def CodeSpans(line):
    return re.findall(r"`([^`]+)`", line)


# ---------------------------------------------------------------- the facts from the tree

class Facts:
    def __init__(self, root):
        self.root = root
        self.flags = {}        # binary -> set of flags; absent: not checked
        self.valued = {}       # spgatectl flag -> takes a value
        self.defaults = {}     # binary -> flag -> default, as --helpfull prints it
        self.ctl_commands = {}  # "gates set" -> its flags
        self.metrics = set()
        self.records = set()
        self.alerts = set()
        self.rpcs = {}         # method -> (service, request, response)
        self.services = {}     # service -> {methods}
        self.proto_names = set()
        self.make_targets = MakeTargets(root)
        self.top_folders = TopFolders(root)
        self.non_metrics = set()
        self._script_text = {}

    def Script(self, path):
        """The text of a repository script named by PATH (a.py, a.sh), or None."""
        path = path.strip("'\"`()[],")
        if not re.search(r"\.(py|sh)$", path) or path.startswith("/"):
            return None
        if path not in self._script_text:
            full = os.path.join(self.root, path)
            text = None
            if os.path.isfile(full):
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
            self._script_text[path] = text
        return self._script_text[path]


SUBCOMMANDS = {}  # binary -> the subcommands its usage lines show (spgate-sim: replay)


def HelpfullFlags(binary, defaults):
    """The flags `BINARY --helpfull` lists; their defaults into DEFAULTS."""
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=20)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"^    --([A-Za-z0-9_]+) \(", text, re.MULTILINE))
    for m in re.finditer(r"^    --(\w+) \(.*?\);\s+default: (.*?);$", text, re.M | re.S):
        defaults[m.group(1)] = m.group(2).strip().strip('"')
    name = os.path.basename(binary)
    SUBCOMMANDS[name] = set(re.findall(r"^\s*" + re.escape(name) + r" ([a-z]+)\b", text, re.M))
    if not flags:
        raise RuntimeError(f"{binary} --helpfull listed no flags:\n{text[:2000]}")
    # absl's own usage flags, handled before the listing.
    return flags | {"help", "helpfull", "helpshort", "helppackage", "helpmatch", "version",
                    "only_check_args"}


def CtlHelp(binary, args):
    out = subprocess.run([binary] + args + ["--help"], capture_output=True, text=True,
                         timeout=20)
    return out.stdout + out.stderr


def ReadSpgatectl(facts, binary):
    top = CtlHelp(binary, [])
    m = re.search(r"^Commands:\n((?:  .*\n)+)", top, re.MULTILINE)
    if not m:
        raise RuntimeError(f"spgatectl --help lists no commands:\n{top[:2000]}")
    commands = [re.split(r"\s{2,}", line.strip())[0] for line in m.group(1).splitlines()]
    flag_line = re.compile(r"^  (?:-\w, )?--([a-z0-9_]+)(=\S+)?", re.MULTILINE)
    base = set()
    for name, value in flag_line.findall(top):
        base.add(name)
        facts.valued[name] = bool(value)
    base |= {"help", "version"}
    for command in commands:
        text = CtlHelp(binary, command.split())
        own = set()
        for name, value in flag_line.findall(text):
            own.add(name)
            facts.valued.setdefault(name, bool(value))
        facts.ctl_commands[command] = own | base
    facts.flags["spgatectl"] = base.union(*facts.ctl_commands.values())


def ReadMetrics(facts):
    for d in ("server", "worker", "tools"):
        for dirpath, _, files in os.walk(os.path.join(facts.root, d)):
            for f in files:
                if f.endswith((".cc", ".h")):
                    with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                        facts.metrics.update(
                            re.findall(r"\.Name\(\s*\"(spgate_[a-z0-9_]+)\"", fh.read()))
    for dirpath, _, files in os.walk(os.path.join(facts.root, "deploy")):
        for f in files:
            if f.endswith((".yml", ".yaml")):
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    text = fh.read()
                facts.records.update(re.findall(r"^\s*-?\s*record:\s*(\S+)", text,
                                                re.MULTILINE))
                facts.alerts.update(re.findall(r"^\s*-?\s*alert:\s*(\w+)", text,
                                               re.MULTILINE))
    # Identifiers that share the prefix: the C API, the Python package, CMake targets.
    sources = [os.path.join(facts.root, "worker", "client", "spgate_client.h")]
    for d in ("python", "examples", "worker", "tools", "server", "tests"):
        for dirpath, _, files in os.walk(os.path.join(facts.root, d)):
            for f in files:
                if f == "CMakeLists.txt" or (d in ("python", "examples")
                                             and f.endswith((".py", ".pyi"))):
                    sources.append(os.path.join(dirpath, f))
    for path in sources:
        with open(path, encoding="utf-8", errors="replace") as fh:
            facts.non_metrics.update(re.findall(r"\b(spgate_[a-z0-9_]+)\b", fh.read()))
    facts.non_metrics -= facts.metrics


class LiveMetrics:
    """spgate_* families on a fresh spgated's /metrics (127.0.0.1, ports picked by it).
    Started first, read last, so its start-up overlaps the rest of the checks."""

    def __init__(self, spgated):
        self.tmp = tempfile.TemporaryDirectory()
        self.err_path = os.path.join(self.tmp.name, "stderr")
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [spgated, "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen=127.0.0.1:0", "--health_listen=", "--shutdown_grace=0s"],
                stdout=subprocess.DEVNULL, stderr=err)

    def Stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.tmp.cleanup()

    def Families(self):
        try:
            port, deadline = None, time.monotonic() + 30
            while port is None and time.monotonic() < deadline and self.proc.poll() is None:
                with open(self.err_path) as f:
                    m = re.search(r"metrics on port (\d+)", f.read())
                port = m and int(m.group(1))
                time.sleep(0.05)
            if port is None:
                with open(self.err_path) as f:
                    raise RuntimeError(f"spgated did not report its metrics port:\n{f.read()}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body = r.read().decode()
        finally:
            self.Stop()
        return set(re.findall(r"^# TYPE (spgate_[a-z0-9_]+) ", body, re.MULTILINE))


def ReadProto(facts):
    pdir = os.path.join(facts.root, "proto", "spgate", "v1")
    for f in sorted(os.listdir(pdir)):
        if not f.endswith(".proto"):
            continue
        with open(os.path.join(pdir, f), encoding="utf-8") as fh:
            text = re.sub(r"//.*", "", fh.read())
        facts.proto_names.update(re.findall(r"\b(?:message|enum|service)\s+(\w+)", text))
        for svc, body in re.findall(r"service\s+(\w+)\s*\{(.*?)\n\}", text, re.DOTALL):
            methods = facts.services.setdefault(svc, set())
            for name, req, resp in re.findall(
                    r"rpc\s+(\w+)\s*\(\s*((?:stream\s+)?\w+)\s*\)\s*returns\s*\(\s*"
                    r"((?:stream\s+)?\w+)\s*\)", body):
                methods.add(name)
                facts.rpcs[name] = (svc, " ".join(req.split()), " ".join(resp.split()))


# ---------------------------------------------------------------- the checks

ANCHORS = {}  # Markdown file -> its anchors


def CheckLinks(facts, doc, text, blocks, failures):
    base, rel = os.path.dirname(doc), os.path.relpath(doc, facts.root)
    link = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
    for block in blocks:
        if block.kind != "prose":
            continue
        for n, line in enumerate(block.lines):
            where = f"{rel}:{block.start + n}"
            plain = re.sub(r"`[^`]*`", "", line)
            targets = link.findall(plain)
            targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", plain)
            targets += re.findall(r"<(?:a|img)\s[^>]*(?:href|src)=\"([^\"]+)\"", plain)
            for target in targets:
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                    continue
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(base, path)) if path else doc
                if not os.path.exists(full):
                    failures.add(where, f"link to {target}: {os.path.relpath(full, facts.root)} "
                                        "does not exist")
                    continue
                if anchor and full.endswith(".md"):
                    if full not in ANCHORS:
                        with open(full, encoding="utf-8") as f:
                            ANCHORS[full] = Anchors(f.read())
                    if anchor not in ANCHORS[full]:
                        failures.add(where, f"link to {target}: no heading with anchor "
                                            f"#{anchor} in {os.path.relpath(full, facts.root)}")


def DesignSections(root):
    with open(os.path.join(root, "docs", "design.md"), encoding="utf-8") as f:
        return set(re.findall(r"^## (\d+)\.", f.read(), re.MULTILINE))


TITLED_REF = re.compile(r"\b([a-z][a-z-]*\.md)(?: §(\d+))?,? \(?\"([A-Z][^\"]{2,60})\"")
DOC_TEXT = {}  # docs/X.md -> its text, read once


def CheckTitledRefs(root, where, line, failures):
    """`gates.md, "The ADAPTIVE policy"`, `design.md §2 "Range rules"`: the quoted text is
    in that doc (in that section)."""
    for doc, sec, title in TITLED_REF.findall(line):
        path = os.path.join(root, "docs", doc)
        if not os.path.isfile(path):
            continue
        if path not in DOC_TEXT:
            with open(path, encoding="utf-8") as f:
                DOC_TEXT[path] = f.read()
        text = DOC_TEXT[path]
        if sec:
            parts = [p for p in re.split(r"^## ", text, flags=re.M) if p.startswith(sec + ".")]
            text = parts[0] if parts else ""
        if title.lower() not in text.lower():
            failures.add(where, f"docs/{doc}{' §' + sec if sec else ''} has no \"{title}\"")


def CheckSectionRefs(where, line, sections, failures, in_design=False):
    pattern = r"design(?:\.md)? §(\d+)" if not in_design else r"§(\d+)"
    for n in re.findall(pattern, line):
        if n not in sections:
            failures.add(where, f"docs/design.md §{n} does not exist (sections: "
                                f"{', '.join(sorted(sections, key=int))})")


def CheckMetrics(facts, where, line, failures):
    for alert in re.findall(r"\b(Spgate[A-Z]\w+)\b", line):
        if alert not in facts.alerts:
            failures.add(where, f"alert {alert} is not an alert: of deploy/**/*.yml")
    for rec in re.findall(r"(?<![\w:])([a-z_]+:spgate_[a-z0-9_]+:[a-z0-9_]+)", line):
        if rec not in facts.records:
            failures.add(where, f"recording rule {rec} is not a record: of deploy/**/*.yml")
    for m in re.finditer(r"(?<![\w:./-])(spgate_[a-z0-9_]+)(\*?)", line):
        name, star = m.group(1), m.group(2)
        after = line[m.end():m.end() + 2]
        if re.match(r"\.[a-zA-Z]", after) or after.startswith("("):
            continue  # a file name or a call
        if name in facts.non_metrics or name in facts.metrics:
            continue
        if star or name.endswith("_"):
            if any(x.startswith(name) for x in facts.metrics):
                continue
            failures.add(where, f"no metric starts with {name}")
            continue
        stem = re.sub(r"_(bucket|sum|count)$", "", name)
        if stem in facts.metrics:
            continue
        failures.add(where, f"metric {name} is not registered (server/metrics.cc)")


def CheckRpcs(facts, where, line, failures):
    for name in re.findall(r"\bspgate\.v1\.([A-Z]\w*)", line):
        if name not in facts.proto_names:
            failures.add(where, f"spgate.v1.{name} is not in proto/spgate/v1/*.proto")
    for svc, method in re.findall(r"\b(\w+Service)[./]([A-Z]\w*)", line):
        if svc not in facts.services:
            failures.add(where, f"service {svc} is not in proto/spgate/v1/*.proto")
        elif method not in facts.services[svc]:
            failures.add(where, f"{svc} has no rpc {method}")
    for span in CodeSpans(line):
        m = re.match(r"^(\w+)\(((?:stream )?\w+)\)\s*(?:→|↔|->|returns)\s*((?:stream )?\w+)$",
                     span.strip())
        if m:
            name, req, resp = m.groups()
            if name not in facts.rpcs:
                failures.add(where, f"rpc {name} is not in proto/spgate/v1/*.proto")
            elif facts.rpcs[name][1:] != (req, resp):
                failures.add(where, f"rpc {name} is ({facts.rpcs[name][1]}) -> "
                                    f"{facts.rpcs[name][2]}, the doc says ({req}) -> {resp}")
    for name in re.findall(r"`([A-Z]\w+)` RPC\b|\bRPC `([A-Z]\w+)`", line):
        name = name[0] or name[1]
        if name not in facts.rpcs:
            failures.add(where, f"rpc {name} is not in proto/spgate/v1/*.proto")


def Tokens(text):
    return [t for t in re.split(r"\s+", text) if t]


def ProgramOf(facts, token):
    """('bin', name) / ('script', path) / ('external', name) / None for one word."""
    t = token.strip("'\"`()[],;{}")
    if not t or t.startswith("-") or "=" in t:
        return None
    base = t.rstrip("/").split("/")[-1]
    if base in BINARIES:
        return ("bin", base)
    if re.search(r"\.(py|sh)$", t) and facts.Script(t) is not None:
        return ("script", t)
    if base in EXTERNAL or t in EXTERNAL or re.search(r"\w_(bench|test)$", base):
        return ("external", base)  # another program, or a benchmark or test binary
    return None


def FlagOk(facts, program, flag, command=None):
    """True / False for a flag of a program; None when the program is not checked."""
    kind, name = program
    if kind == "external":
        return None
    if kind == "script":
        # Its own flag, or one of a binary it runs (and passes flags on to).
        text = facts.Script(name)
        if re.search(r"--" + re.escape(flag) + r"(?![\w-])", text) or (
                flag == "help" and name.endswith(".py")):  # argparse's
            return True
        runs = [b for b in BINARIES if re.search(r"(?<![\w-])" + b + r"(?![\w-])", text)]
        if any(b not in facts.flags for b in runs):
            return None  # it runs a binary whose flags are unknown here
        return any(flag in facts.flags[b] for b in runs)
    flags = facts.flags.get(name)
    if flags is None:
        return None
    if name == "spgatectl" and command in facts.ctl_commands:
        flags = facts.ctl_commands[command]
    if flag in flags:
        return True
    return flag.startswith("no") and flag[2:] in flags


def PrefixOk(facts, program, prefix):
    kind, name = program
    if kind == "script":
        return ("--" + prefix) in facts.Script(name)
    flags = facts.flags.get(name)
    return flags is None or any(f.startswith(prefix) for f in flags)


def SplitCommands(text):
    """Logical command lines of a code block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for n, line in enumerate(joined.split("\n")):
        line = re.sub(r"(^|\s)#.*", "", line)
        line = re.sub(r"^\s*[$>]\s", "", line)
        for seg in re.split(r"\|\|?|;|&&?", line):
            out.append((n, seg))
    return out


def MakeTargets(root):
    with open(os.path.join(root, "Makefile"), encoding="utf-8") as f:
        return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", f.read(), re.MULTILINE))


def CheckMake(facts, where, tokens, failures):
    """`make TARGET`: TARGET is a rule of the top-level Makefile."""
    for i, tok in enumerate(tokens):
        if tok != "make":
            continue
        rest = tokens[i + 1:]
        while rest and (rest[0].startswith("-") or "=" in rest[0]):
            takes = rest[0] in ("-C", "-f", "-j")
            rest = rest[2 if takes else 1:]
        if rest and re.match(r"^[a-z][\w.-]*$", rest[0]) and rest[0] not in facts.make_targets:
            failures.add(where, f"make {rest[0]}: no such target in the Makefile "
                                f"({', '.join(sorted(facts.make_targets))})")
        return


def CheckCommand(facts, where, segment, refused, failures):
    """Flags and spgatectl commands on one command line; returns the flags it did not own."""
    loose, program, ctl_words, ctl_command, seen_word = [], None, None, None, False
    tokens = Tokens(segment)
    CheckMake(facts, where, [t.strip("'\"`()") for t in tokens], failures)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        prog = ProgramOf(facts, tok)
        if program == ("external", "kubectl") and tokens[i - 1] != "--":
            prog = None  # kubectl's own words (`logs POD -c spgated`) until `--`
        if prog is not None:
            if program == ("bin", "spgatectl"):
                ctl_command = CheckCtlCommand(facts, where, ctl_words, failures)
            program, ctl_words = prog, ([] if prog == ("bin", "spgatectl") else None)
            seen_word = False
            i += 1
            continue
        m = FLAG.match(tok.strip("'\"[],("))
        if m:
            flag, star = m.group(1), m.group(2)
            takes = (program == ("bin", "spgatectl") and "=" not in tok
                     and facts.valued.get(flag, False))
            if program is None:
                loose.append((flag, star))
            else:
                Judge(facts, where, program, flag, star, refused, failures, ctl_words,
                      ctl_command)
            i += 2 if takes else 1
            continue
        if re.match(r"^-[a-zA-Z]$", tok) and program == ("bin", "spgatectl"):
            i += 2
            continue
        if ctl_words is not None:
            ctl_words.append(tok)
        elif program and program[0] == "bin" and SUBCOMMANDS.get(program[1]) and not seen_word:
            seen_word = True
            if re.match(r"^[a-z]+$", tok) and tok not in SUBCOMMANDS[program[1]]:
                failures.add(where, f"{program[1]} has no subcommand '{tok}' (its usage shows "
                                    f"{', '.join(sorted(SUBCOMMANDS[program[1]]))})")
        i += 1
    if program == ("bin", "spgatectl"):
        CheckCtlCommand(facts, where, ctl_words, failures)
    return loose


def Judge(facts, where, program, flag, star, refused, failures, ctl_words=None,
          ctl_command=None):
    if flag in PLACEHOLDER_FLAGS or flag in refused:
        return
    if ctl_words is not None:
        ctl_command = CtlCommand(facts, ctl_words)
    if star or flag.endswith("_"):
        if not PrefixOk(facts, program, flag):
            failures.add(where, f"no flag of {program[1]} starts with --{flag}")
        return
    ok = FlagOk(facts, program, flag, ctl_command)
    STATS["command-line flags"] += ok is not None
    if ok is False:
        scope = f"{program[1]} {ctl_command}" if ctl_command else program[1]
        failures.add(where, f"{scope} has no flag --{flag}")


def CtlCommand(facts, words):
    words = [w for w in words if re.match(r"^[a-z][a-z-]*$", w)]
    if len(words) >= 2 and " ".join(words[:2]) in facts.ctl_commands:
        return " ".join(words[:2])
    if words and words[0] in facts.ctl_commands:
        return words[0]
    return None


def CheckCtlCommand(facts, where, words, failures):
    if not words or "spgatectl" not in facts.flags:
        return None
    first = words[0].strip("'\"`")
    if not re.match(r"^[a-z][a-z-]*$", first):
        return None  # a placeholder (<command>, COMMAND, ...)
    command = CtlCommand(facts, words)
    STATS["spgatectl commands"] += 1
    if command is None or (command in ("gates", "jobs")):
        failures.add(where, f"spgatectl has no command '{' '.join(words[:2])}' (commands: "
                            f"{', '.join(facts.ctl_commands)})")
    return command


def ProgramsNamed(facts, text):
    """Programs a piece of prose names: ([('bin'|'script', name)], names another program)."""
    key = (id(facts), text)
    if key not in PROGRAMS_NAMED:
        PROGRAMS_NAMED[key] = _ProgramsNamed(facts, text)
    return PROGRAMS_NAMED[key]


PROGRAMS_NAMED = {}


def _ProgramsNamed(facts, text):
    progs = []
    for b in BINARIES:
        if re.search(r"(?<![\w/-])" + re.escape(b) + r"(?![\w-])", text):
            progs.append(("bin", b))
    for path in re.findall(r"[\w./-]+\.(?:py|sh)\b", text):
        p = ProgramOf(facts, path)
        if p and p[0] == "script" and p not in progs:
            progs.append(p)
    return progs, (EXTERNAL_PROSE.search(text) is not None
                   or re.search(r"\b\w+_(bench|test)\b", text) is not None)


def CheckLooseFlags(facts, where, flags, contexts, refused, failures, owner=None):
    """Flags not on a command line. OWNER (a flag table's binary): its flags only.
    Otherwise any of the four binaries, or a script the paragraph, its neighbours or the
    headings name; skipped when in none and those name another program."""
    if not flags:
        return
    programs, external = [], False
    for text in contexts:
        progs, ext = ProgramsNamed(facts, text)
        external = external or ext
        programs += [p for p in progs if p not in programs]
    if owner is not None:
        candidates = [("bin", owner)]
    else:
        candidates = [("bin", b) for b in BINARIES] + [p for p in programs if p[0] == "script"]
    checked = [p for p in candidates if p[0] == "script" or p[1] in facts.flags]
    if not checked:
        return
    for flag, star in flags:
        if flag in PLACEHOLDER_FLAGS or flag in refused:
            continue
        if star or flag.endswith("_"):
            if not any(PrefixOk(facts, p, flag) for p in checked):
                failures.add(where, f"no flag starts with --{flag} in "
                                    f"{', '.join(p[1] for p in checked)}")
            continue
        verdicts = [FlagOk(facts, p, flag) for p in checked]
        STATS["table flags" if owner else "prose flags"] += 1
        if any(verdicts) or None in verdicts:
            continue
        if external and owner is None and not CloseTo(facts, flag):
            continue  # another program's flag (not a near miss of one of ours)
        if owner is not None:
            failures.add(where, f"--{flag} is not a flag of {owner} (the binary of this "
                                "section's flag table)")
        else:
            failures.add(where, f"--{flag} is not a flag of any of "
                                f"{', '.join(p[1] for p in checked)}")


def CloseTo(facts, flag):
    """One of our binaries' flags that FLAG (8+ characters) looks like a typo of, or None.
    Shorter ones are too often another program's (`--ulimit` is not `--limit`), and so are
    hyphenated ones (`--tp-comm-overlap` is Megatron's; ours are spelled with `_`)."""
    if len(flag) < 8 or "-" in flag:
        return None
    ours = set().union(*facts.flags.values()) if facts.flags else set()
    close = difflib.get_close_matches(flag, ours, n=1, cutoff=0.85)
    return close[0] if close else None


def CheckDefault(facts, where, owner, owned, row, header, failures):
    """A flag table's `default` column against the binary's own default."""
    columns = [c.strip().lower() for c in header.strip().strip("|").split("|")]
    if "default" not in columns or len(owned) != 1:
        return
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    defaults = facts.defaults.get(owner, {})
    flag = owned[0][0]
    if flag not in defaults or len(cells) <= columns.index("default"):
        return
    doc = cells[columns.index("default")].replace("`", "").strip()
    actual = defaults[flag]
    if actual == "":
        ok = doc.lower() in ("", "empty", "none", "off", "—", "-") or doc.startswith(
            ("empty", "none", "off", "host of", "—"))
    else:
        ok = doc == actual or re.search(r"(?<![\w.])" + re.escape(actual) + r"(?![\w.])", doc)
    if not ok:
        failures.add(where, f"--{flag}: the table says the default is '{doc}', "
                            f"{owner} --helpfull says '{actual or '(empty)'}'")


def TableOwner(facts, line, headings):
    """The binary a flag table's row belongs to: the row's first cell is a flag and the
    enclosing headings name exactly one binary."""
    if not re.match(r"^\s*\|\s*`?--[a-z]", line):
        return None
    named = [p[1] for p in ProgramsNamed(facts, "\n".join(headings))[0] if p[0] == "bin"]
    return named[0] if len(named) == 1 else None


def CheckPaths(facts, where, line, failures):
    """A repository path in an inline code span (`server/metrics.cc`, `deploy/k8s/`) exists."""
    for span in CodeSpans(line):
        for tok in re.split(r"[\s,;()]+", span):
            tok = tok.strip("'\"").split(":")[0]
            if "/" not in tok or re.search(r"[*{}<>$…]|\.\.\.", tok):
                continue
            top = tok.split("/")[0]
            if top not in facts.top_folders or not re.match(r"^[\w./+-]+$", tok):
                continue
            if not os.path.exists(os.path.join(facts.root, tok)):
                failures.add(where, f"{tok} does not exist in the repository")


def TopFolders(root):
    """Top-level folders of the source tree (not build trees or outputs)."""
    return {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
            and not d.startswith(("build", "out")) and d not in (".git", "shared")}


def CheckLines(facts, where_of, lines, sections, failures, in_design):
    for n, line in enumerate(lines):
        where = where_of(n)
        CheckMetrics(facts, where, line, failures)
        CheckRpcs(facts, where, line, failures)
        CheckSectionRefs(where, line, sections, failures, in_design)
        CheckTitledRefs(facts.root, where, line, failures)
        CheckIssueRefs(where, line, failures)


def CheckDoc(facts, doc, sections, failures):
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(doc, facts.root)
    blocks, _ = ReadMarkdown(text)
    CheckLinks(facts, doc, text, blocks, failures)
    in_design = rel == os.path.join("docs", "design.md")
    for index, block in enumerate(blocks):
        # The blocks around it (two each side) in the same section.
        near = [b for b in blocks[max(0, index - 2):index + 3]
                if b is not block and b.headings == block.headings]
        def Where(n, block=block):
            return f"{rel}:{block.start + n}"
        heading_text = "\n".join(block.headings)
        refused = set(re.findall(r"unknown (?:command-line )?flag:? '?--([a-z0-9_-]+)",
                                 block.text()))
        contexts = [block.text(), heading_text] + [b.text() for b in near]
        CheckLines(facts, Where, block.lines, sections, failures, in_design)
        if block.kind == "code":
            for n, seg in SplitCommands(block.text()):
                loose = CheckCommand(facts, Where(n), seg, refused, failures)
                CheckLooseFlags(facts, Where(n), loose, contexts, refused, failures)
            continue
        for n, line in enumerate(block.lines):
            CheckPaths(facts, Where(n), line, failures)
            rest = line
            for span in CodeSpans(line):
                if any(ProgramOf(facts, t) for t in Tokens(span)):
                    loose = []
                    for _, seg in SplitCommands(span):
                        loose += CheckCommand(facts, Where(n), seg, refused, failures)
                    CheckLooseFlags(facts, Where(n), loose, contexts, refused, failures)
                    rest = rest.replace(f"`{span}`", " ", 1)
            loose = [(m.group(1), m.group(2)) for m in FLAG.finditer(rest)]
            owner = TableOwner(facts, line, block.headings)
            if owner is not None:  # the first cell is the table's flag; the rest is prose
                first = re.match(r"^\s*\|([^|]*)", rest).group(1)
                owned = [(m.group(1), m.group(2)) for m in FLAG.finditer(first)]
                CheckLooseFlags(facts, Where(n), owned, contexts, refused, failures, owner)
                loose = [f for f in loose if f not in owned]
                CheckDefault(facts, Where(n), owner, owned, line, block.lines[0], failures)
            CheckLooseFlags(facts, Where(n), loose, contexts, refused, failures)


def CheckIssueRefs(where, line, failures):
    for m in PRIVATE_REF.finditer(line):
        failures.add(where, f"'{m.group(0)}' is outside the repository (cite docs/design.md)")
    for m in ISSUE_REF.finditer(line):
        if re.search(r"https?://\S*$", line[:m.start()]):
            continue  # part of a URL (an upstream project's issue)
        failures.add(where, f"internal tracker reference '{m.group(0)}' (say what it was, "
                            "not its number)")


def SourceFiles(root):
    skip = {".git", "shared", "third_party", "__pycache__", "corpus", "figures"}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(("build", "."))
                   and not (rel == "." and d in ("out",))]
        for f in files:
            if f.endswith(SOURCE_EXTS) or f in ("CMakeLists.txt", "Makefile", "Dockerfile"):
                yield os.path.join(dirpath, f)


SOURCE_SUSPECT = re.compile(r"(?i:issue)|\(#\d|SPEC|/work/main|shared/")


def CheckSources(root, sections, failures):
    me = os.path.abspath(__file__)
    for path in SourceFiles(root):
        if os.path.abspath(path) == me:
            continue
        rel = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        if "§" not in text and ".md" not in text and not SOURCE_SUSPECT.search(text):
            continue
        for n, line in enumerate(text.split("\n"), 1):
            if "design" in line and "§" in line:
                CheckSectionRefs(f"{rel}:{n}", line, sections, failures)
            if '.md' in line and '"' in line:
                CheckTitledRefs(root, f"{rel}:{n}", line, failures)
            if SOURCE_SUSPECT.search(line):
                CheckIssueRefs(f"{rel}:{n}", line, failures)


# ---------------------------------------------------------------- self-test

def SelfTest(facts):
    """The checker on a made-up doc with one mistake of each kind: each must be caught."""
    ctl = "spgatectl" in facts.flags
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "docs"))
        doc = os.path.join(tmp, "docs", "x.md")
        with open(os.path.join(tmp, "docs", "design.md"), "w") as f:
            f.write("# d\n\n## 1. One\n")
        with open(doc, "w") as f:
            f.write("# X\n\n## Good part\n\nSee [one](design.md#1-one) and design.md §1.\n\n"
                    "```sh\nspgated --state_dir=/tmp/s --listen=127.0.0.1:0 &\n```\n\n"
                    "## Bad part\n\n[gone](nowhere.md), [bad anchor](design.md#2-two), "
                    "design.md §7.\n\n"
                    "```sh\nspgated --state_dri=/tmp/s\n```\n\n"
                    "The daemon's `spgate_decisions_totl` and issue 12; SpgateNoSuchAlert; SPEC §3; "
                    "design.md §1 \"No such part\".\n\n"
                    "`spgatectl jobz list` and `spgatectl gates set --max_lenght_cv=1`; "
                    "`make tset`; `server/no_such_file.cc`.\n\n"
                    "spgate-sim takes `--stpes`; `spgate-sim replya --compare`. `Regster(RegisterRequest) → RegisterResponse`, "
                    "`AdminService/PinMod`.\n\n"
                    "## spgate-sim flags\n\n| flag | default | meaning |\n|---|---|---|\n"
                    "| `--seed` | `123456789` | a wrong default |\n"
                    "| `--max_jobs` | — | spgated's, not the sim's |\n")
        bad = Failures()
        shadow = copy.copy(facts)  # the same facts, the made-up tree's files
        shadow.root, shadow._script_text = tmp, {}
        CheckDoc(shadow, doc, DesignSections(tmp), bad)
    got = "\n".join(bad.items)
    want = ["nowhere.md", "#2-two", "§7", "--state_dri", "spgate_decisions_totl",
            "issue 12", "--stpes", "--max_jobs", "SpgateNoSuchAlert", "rpc Regster",
            "no rpc PinMod", "default is '123456789'", "make tset",
            "server/no_such_file.cc does not exist", "no subcommand 'replya'", "'SPEC' is outside", "has no \"No such part\""]
    if ctl:
        want += ["jobz", "--max_lenght_cv"]
    if "spgated" not in facts.flags:
        want.remove("--state_dri")
    if "spgate-sim" not in facts.flags:
        want.remove("--stpes")
        want.remove("--max_jobs")
        want.remove("default is '123456789'")
        want.remove("no subcommand 'replya'")
    missed = [w for w in want if w not in got]
    lines_good = [x for x in bad.items if ":5:" in x or ":8:" in x]
    problems = []
    if missed:
        problems.append(f"self-test: mistakes not caught: {missed}\n{got}")
    if lines_good:
        problems.append(f"self-test: correct lines flagged: {lines_good}")
    if len(bad.items) != len(want):
        problems.append(f"self-test: expected {len(want)} failures, got:\n{got}")
    return problems


# ---------------------------------------------------------------- main

def CheckAll(facts, root, failures):
    """The self-test, then every check over README.md, docs/*.md and the sources."""
    ReadMetrics(facts)
    ReadProto(facts)
    for problem in SelfTest(facts):
        failures.add("docs_test.py", problem)
    for key in STATS:
        STATS[key] = 0
    sections = DesignSections(root)
    docs = [os.path.join(root, "README.md")]
    ddir = os.path.join(root, "docs")
    docs += sorted(os.path.join(ddir, f) for f in os.listdir(ddir) if f.endswith(".md"))
    for doc in docs:
        CheckDoc(facts, doc, sections, failures)
    CheckSources(root, sections, failures)
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "..")))
    ap.add_argument("--build", default="")
    for b in BINARIES:
        ap.add_argument("--" + b.replace("-", "_"), default="")
    args = ap.parse_args()
    start = time.monotonic()
    facts = Facts(args.root)
    for b in BINARIES:
        path = getattr(args, b.replace("-", "_"))
        if path and not os.access(path, os.X_OK):
            print(f"{path}: not an executable (--{b.replace('-', '_')})")
            return 1
        if not path and args.build and os.access(os.path.join(args.build, "bin", b), os.X_OK):
            path = os.path.join(args.build, "bin", b)
        if not path:
            print(f"note: {b} not given: its flags are not checked")
            continue
        if b == "spgatectl":
            ReadSpgatectl(facts, path)
        else:
            facts.defaults[b] = {}
            facts.flags[b] = HelpfullFlags(path, facts.defaults[b])
            if b == "spgated":
                facts.spgated = path
    daemon = LiveMetrics(facts.spgated) if getattr(facts, "spgated", None) else None
    failures = Failures()
    try:
        docs = CheckAll(facts, args.root, failures)
        if daemon is not None:
            live = daemon.Families()
            for name in sorted(live - facts.metrics):
                failures.add("server/metrics.cc", f"{name} is on /metrics but not read from "
                                                  "the source (.Name(\"...\")): fix this test")
            if not live:
                failures.add("spgated /metrics", "no spgate_* family at all")
    finally:
        if daemon is not None:
            daemon.Stop()  # also when a check raised: no daemon outlives the test
    for item in failures.items:
        print(item)
    print(f"docs_test: {len(docs)} docs; {len(facts.metrics)} metrics, {len(facts.rpcs)} rpcs, "
          f"flags of {', '.join(sorted(facts.flags)) or 'no binary'}; checked "
          + ", ".join(f"{v} {k}" for k, v in STATS.items())
          + f"; {len(failures.items)} failures ({time.monotonic() - start:.1f} s)")
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
