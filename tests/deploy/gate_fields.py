"""The gate-config fields for the Python tests, read from their one source.

SPGATE_GATE_FIELDS in policy/gate_config.h is the table every C++ consumer reads (name,
type, default, range, help; docs/design.md §3). The tests parse it here instead of
keeping a copy of the names, defaults and ranges, so a field added to the table (and to
spgate.v1.GateConfig) reaches every test without editing one.

  Load()          -> [GateField] in table order (= GateConfig field order)
  Thresholds()    -> the fields that are thresholds, i.e. the `gate` label values of
                     spgate_gate_threshold (everything but the policy, an enum)
  ProtoRanges()   -> [(name, range)] from gate.proto's `message GateConfig` comments,
                     for a cross-check of the table against the proto
  Valid(f, v)     -> whether v passes f's range (the validation of docs/design.md §3)
"""
import collections
import math
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO, "policy", "gate_config.h")
PROTO = os.path.join(REPO, "proto", "spgate", "v1", "gate.proto")

# GateFieldRange (policy/gate_config.h) -> how validation reads it.
RANGES = {
    "kShare": "finite, (0, 1]",
    "kCv": "finite, (0, 10]",
    "kCount": "integer in [1, 1e6]",
    "kPolicy": "STATIC or ADAPTIVE",
}
# The range comments of gate.proto's GateConfig fields, by range.
PROTO_RANGE_COMMENTS = {"(0, 1]": "kShare", "(0, 10]": "kCv", "[1, 1e6]": "kCount",
                        "STATIC or ADAPTIVE": "kPolicy"}

GateField = collections.namedtuple("GateField", "type name default range help")


class ParseError(Exception):
    pass


def _Read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def PolicyValues(header_text=None):
    """{"STATIC": 1, "ADAPTIVE": 2} from enum class GatePolicyKind."""
    text = header_text if header_text is not None else _Read(HEADER)
    m = re.search(r"enum class GatePolicyKind\b[^{]*\{(.*?)\};", text, re.S)
    if not m:
        raise ParseError(f"{HEADER}: no enum class GatePolicyKind")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    values = {k[1:].upper(): int(v) for k, v in re.findall(r"(k\w+)\s*=\s*(\d+)", body)}
    if not values:
        raise ParseError(f"{HEADER}: GatePolicyKind has no enumerators")
    return values


def Load(header=None):
    """The rows of SPGATE_GATE_FIELDS, in order. Raises ParseError when the table cannot
    be read completely (every X( row must parse)."""
    text = _Read(header or HEADER)
    start = text.find("#define SPGATE_GATE_FIELDS(X)")
    if start < 0:
        raise ParseError(f"{header or HEADER}: no #define SPGATE_GATE_FIELDS(X)")
    lines = []
    for line in text[start:].splitlines()[1:]:
        stripped = line.rstrip()
        lines.append(stripped.rstrip("\\"))
        if not stripped.endswith("\\"):
            break
    body = " ".join(lines)
    string = r'"(?:[^"\\]|\\.)*"'
    row = re.compile(r"X\(\s*([\w:]+)\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,\s*(k\w+)\s*,\s*"
                     rf"((?:{string}\s*)+)\)")
    rows = row.findall(body)
    if not rows or len(rows) != body.count("X("):
        raise ParseError(f"{header or HEADER}: parsed {len(rows)} of {body.count('X(')} "
                         "SPGATE_GATE_FIELDS rows")
    policies = PolicyValues(text)
    fields = []
    for ctype, name, default, rng, help_text in rows:
        if rng not in RANGES:
            raise ParseError(f"{name}: unknown range {rng}")
        if ctype == "double":
            value = float(default)
        elif ctype == "int64_t":
            value = int(default)
        elif ctype == "GatePolicyKind":
            enumerator = default.rsplit("::", 1)[-1]
            value = policies[enumerator[1:].upper()]
        else:
            raise ParseError(f"{name}: unknown type {ctype}")
        help_text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', help_text))
        fields.append(GateField(ctype, name, value, rng, help_text))
    return fields


def Thresholds(fields=None):
    """The fields exported as spgate_gate_threshold{gate=...}: all but the policy enum."""
    return [f for f in (fields or Load()) if f.range != "kPolicy"]


def ProtoRanges(proto=None):
    """[(name, range)] of spgate.v1.GateConfig's fields, the range read from each field's
    trailing comment in gate.proto; range None where the comment names none."""
    text = _Read(proto or PROTO)
    m = re.search(r"\nmessage GateConfig \{(.*?)\n\}", text, re.S)
    if not m:
        raise ParseError(f"{proto or PROTO}: no message GateConfig")
    out = []
    for name, comment in re.findall(r"^\s*optional\s+\w+\s+(\w+)\s*=\s*\d+;[ \t]*(?://[ \t]*(.*))?$",
                                    m.group(1), re.M):
        rng = next((r for c, r in PROTO_RANGE_COMMENTS.items() if comment.startswith(c)), None)
        out.append((name, rng))
    return out


def Valid(field, value, policies=None):
    """Whether `value` passes the field's range (docs/design.md §3)."""
    if field.range == "kPolicy":
        return value in set((policies or PolicyValues()).values())
    if field.range == "kCount":
        return float(value).is_integer() and 1 <= value <= 1_000_000
    high = 10 if field.range == "kCv" else 1
    return math.isfinite(value) and 0 < value <= high
