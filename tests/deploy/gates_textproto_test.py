#!/usr/bin/env python3
"""deploy/k8s/components/sidecar/gates.textproto is a valid spgate.v1.GateConfig (protobuf
text format, parsed with protoc-generated Python from proto/spgate/v1/gate.proto), sets every field,
every value passes the validation of docs/design.md §3, and the values are the built-in
defaults (the file documents the defaults; a change to either must be deliberate).

Fields, defaults and ranges are not copied here: they come from their one source, the
SPGATE_GATE_FIELDS table in policy/gate_config.h (tests/deploy/gate_fields.py parses it).
The table is checked against the proto (same fields in the same order, the same range in
each field's comment, the same policy enum values) and against the users' defaults table,
docs/gates.md's "Defaults and validation" (every numeric field listed, with its default),
so none of the three can drift from the others."""
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gate_fields  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTPROTO = os.path.join(REPO, "deploy", "k8s", "components", "sidecar", "gates.textproto")
GATES_MD = os.path.join(REPO, "docs", "gates.md")
# A floor on what the parser must find, so a parser that reads nothing cannot pass: the
# eight gates of docs/design.md §3 and the policy of §11 exist since 0.1.
REQUIRED = {"max_length_cv", "max_rs_wait_share", "bucket_target_cv", "rs_wait_reenable_margin",
            "probe_interval_steps", "min_dwell_steps", "window_steps", "memory_headroom",
            "policy"}


def DocDefaults():
    """{field: default} of the numeric rows of docs/gates.md's `| field | default | valid
    range | what it does |` table ("Defaults and validation")."""
    with open(GATES_MD, encoding="utf-8") as f:
        text = f.read()
    if "\n## Defaults and validation" not in text:
        return {}
    section = text.split("\n## Defaults and validation", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^\|\s*`(\w+)`\s*\|\s*([0-9.]+)\s*\|", section, re.M)}


def main():
    try:
        from google.protobuf import text_format
    except ImportError:
        print("FAIL: python3-protobuf is missing (Debian: apt-get install python3-protobuf; make deps)")
        return 1
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: protoc not found (Debian package protobuf-compiler; make deps)")
        return 1
    problems = []
    with tempfile.TemporaryDirectory() as out:
        include = [f"-I{os.path.join(REPO, 'proto')}"]
        if os.path.isdir("/usr/include/google/protobuf"):
            include.append("-I/usr/include")
        r = subprocess.run([protoc, *include, f"--python_out={out}",
                            os.path.join(REPO, "proto", "spgate", "v1", "gate.proto")],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print(f"FAIL: protoc: {r.stderr}")
            return 1
        sys.path.insert(0, out)
        from spgate.v1 import gate_pb2
        config = gate_pb2.GateConfig()
        with open(TEXTPROTO, encoding="utf-8") as f:
            try:
                text_format.Parse(f.read(), config)
            except text_format.ParseError as e:
                print(f"FAIL: {TEXTPROTO} is not a GateConfig: {e}")
                return 1
        try:
            table = gate_fields.Load()
            proto_ranges = gate_fields.ProtoRanges()
            policies = gate_fields.PolicyValues()
        except (gate_fields.ParseError, OSError) as e:
            print(f"FAIL: reading the gate field table: {e}")
            return 1
        fields = [f.name for f in gate_pb2.GateConfig.DESCRIPTOR.fields]
        names = [f.name for f in table]
        if not REQUIRED <= set(names):
            problems.append(f"policy/gate_config.h's SPGATE_GATE_FIELDS lacks {sorted(REQUIRED - set(names))}")
        if fields != names:
            problems.append(f"GateConfig fields {fields} are not SPGATE_GATE_FIELDS's, in its "
                            f"order: {names}")
        if proto_ranges != [(f.name, f.range) for f in table]:
            problems.append(f"gate.proto's range comments {proto_ranges} disagree with "
                            f"SPGATE_GATE_FIELDS {[(f.name, f.range) for f in table]}")
        proto_policies = {v.name: v.number for v in
                          gate_pb2.GateConfig.DESCRIPTOR.enum_types_by_name["Policy"].values
                          if v.number != 0}
        if proto_policies != policies:
            problems.append(f"GateConfig.Policy {proto_policies} is not GatePolicyKind {policies}")
        documented = DocDefaults()
        if not documented:
            problems.append("docs/gates.md has no \"Defaults and validation\" table")
        for name, value in documented.items():
            row = next((f for f in table if f.name == name), None)
            if row is None or not math.isclose(value, row.default):
                problems.append(f"docs/gates.md says {name} defaults to {value}, "
                                f"SPGATE_GATE_FIELDS {row.default if row else 'has no such field'}")
        undocumented = [f.name for f in table if f.name != "policy" and f.name not in documented]
        if documented and undocumented:
            problems.append(f"docs/gates.md's defaults table lacks {undocumented}")
        for f in table:
            name = f.name
            if name not in fields:
                continue
            if not config.HasField(name):
                problems.append(f"{name} is not set (the shipped file spells out every gate)")
                continue
            value = getattr(config, name)
            if not gate_fields.Valid(f, value, policies):
                problems.append(f"{name} = {value} fails docs/design.md §3 validation "
                                f"({gate_fields.RANGES[f.range]})")
            if not math.isclose(value, f.default):
                problems.append(f"{name} = {value}, the default is {f.default}")
        if config.rs_wait_reenable_margin >= config.max_rs_wait_share:
            problems.append("rs_wait_reenable_margin must be below max_rs_wait_share")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: {os.path.relpath(TEXTPROTO, REPO)} is a complete, valid GateConfig with "
          f"the {len(table)} defaults of policy/gate_config.h (= gate.proto, docs/gates.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
