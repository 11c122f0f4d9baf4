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
# The policy and ADAPTIVE's tuning (docs/design.md §11; defaults in docs/gates.md).
ADAPTIVE_DEFAULTS = {"policy": 1, "adaptive_cv_band_width": 0.05,
                     "adaptive_tokens_band_base": 8192, "adaptive_half_life_steps": 2000,
                     "adaptive_min_samples": 8, "adaptive_margin": 0.01,
                     "adaptive_explore_share": 0.03}
DEFAULTS = {**CONTRACT_DEFAULTS, **ADAPTIVE_DEFAULTS}
CV_FIELDS = {"max_length_cv", "bucket_target_cv", "adaptive_cv_band_width"}  # (0, 10]
COUNT_FIELDS = {"probe_interval_steps", "min_dwell_steps", "window_steps",
                "adaptive_tokens_band_base", "adaptive_half_life_steps",
                "adaptive_min_samples"}  # [1, 1e6]
ENUM_FIELDS = {"policy": {1, 2}}  # STATIC, ADAPTIVE


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
        if set(fields) != set(DEFAULTS):
            problems.append(f"GateConfig fields {sorted(fields)} are not those of "
                            f"docs/design.md §3 and §11: {sorted(DEFAULTS)}")
        for name in fields:
            if not config.HasField(name):
                problems.append(f"{name} is not set (the shipped file spells out every gate)")
                continue
            value = getattr(config, name)
            if name in ENUM_FIELDS:
                ok = value in ENUM_FIELDS[name]
            elif name in COUNT_FIELDS:
                ok = 1 <= value <= 1_000_000
            else:
                ok = math.isfinite(value) and 0 < value <= (10 if name in CV_FIELDS else 1)
            if not ok:
                problems.append(f"{name} = {value} fails docs/design.md §3 validation")
            if name in DEFAULTS and not math.isclose(value, DEFAULTS[name]):
                problems.append(f"{name} = {value}, the default is {DEFAULTS[name]}")
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
