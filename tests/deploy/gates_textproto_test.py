#!/usr/bin/env python3
"""deploy/k8s/base/gates.textproto is a valid spgate.v1.GateConfig (protobuf text format,
parsed with protoc-generated Python from proto/spgate/v1/gate.proto), sets every field,
every value passes the validation of docs/design.md §3, and the values are the defaults
listed there (the file documents the defaults; a change to either must be deliberate)."""
import math
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTPROTO = os.path.join(REPO, "deploy", "k8s", "base", "gates.textproto")

CONTRACT_DEFAULTS = {"max_length_cv": 0.18, "max_rs_wait_share": 0.22,
                     "bucket_target_cv": 0.15, "rs_wait_reenable_margin": 0.03,
                     "probe_interval_steps": 200, "min_dwell_steps": 20, "window_steps": 50,
                     "memory_headroom": 0.90}
CV_FIELDS = {"max_length_cv", "bucket_target_cv"}            # (0, 10]
COUNT_FIELDS = {"probe_interval_steps", "min_dwell_steps", "window_steps"}  # [1, 1e6]


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
        fields = [f.name for f in gate_pb2.GateConfig.DESCRIPTOR.fields]
        if set(fields) != set(CONTRACT_DEFAULTS):
            problems.append(f"GateConfig fields {sorted(fields)} are not those of "
                            f"docs/design.md §3: {sorted(CONTRACT_DEFAULTS)}")
        for name in fields:
            if not config.HasField(name):
                problems.append(f"{name} is not set (the shipped file spells out every gate)")
                continue
            value = getattr(config, name)
            if name in COUNT_FIELDS:
                ok = 1 <= value <= 1_000_000
            else:
                ok = math.isfinite(value) and 0 < value <= (10 if name in CV_FIELDS else 1)
            if not ok:
                problems.append(f"{name} = {value} fails docs/design.md §3 validation")
            if name in CONTRACT_DEFAULTS and not math.isclose(value, CONTRACT_DEFAULTS[name]):
                problems.append(f"{name} = {value}, the docs/design.md §3 default is "
                                f"{CONTRACT_DEFAULTS[name]}")
        if config.rs_wait_reenable_margin >= config.max_rs_wait_share:
            problems.append("rs_wait_reenable_margin must be below max_rs_wait_share")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: {os.path.relpath(TEXTPROTO, REPO)} is a complete, valid GateConfig with "
          "the defaults of docs/design.md §3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
