"""spgate.Client's keyword arguments in python/spgate/_spgate.pyi against the compiled
module. The module builds them from the client's option table (worker/client/
client_options.h: one keyword per row that Python takes, typed and defaulted by the
table, then tls), so this is the check that the stub has not drifted from the table:
the same names in the same order, the same types, the same defaults. client_test.py's
stub test checks every method's parameter names; this one adds types and defaults for
the table-driven signature. A self-test makes sure a drifted stub fails.

Run: PYTHONPATH=build/python python3 tests/python/stub_check_test.py
"""
import ast
import os
import re
import sys
import unittest

try:
    import spgate
    from spgate import _spgate
except ImportError as e:
    print(f"FAILED: spgate's native module is registered but does not import ({e})")
    sys.exit(1)

STUB = os.environ.get("SPGATE_STUB") or os.path.join(os.path.dirname(spgate.__file__),
                                                     "_spgate.pyi")
# Keywords that are not plain values of the table (pybind11 reports `object` for tls and
# the module's own class names for the pipeline's layout, coordinates and features,
# docs/design.md §12), after the table's rows; their defaults are still compared.
NOT_IN_TABLE = {"layout", "coordinates", "sp_required", "tls"}


def split_top_level(sig):
    """Splits a parameter list on the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in sig:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def module_params(fn):
    """[(name, type, default repr or None)] of a pybind11 function's one typed signature
    (Client.__init__ has a second, __init__(*args, **kwargs), that takes the calls the
    typed one refuses and names the bad keyword: no parameters of its own)."""
    sigs = re.findall(r"^(?:\d+\. )?\w+\((.*)\) -> ", fn.__doc__ or "", re.M)
    sigs = [s for s in sigs if not s.endswith("*args, **kwargs")]
    if len(sigs) != 1:
        raise AssertionError(f"expected one signature, got {sigs!r}")
    out = []
    for p in split_top_level(sigs[0]):
        if p == "*":
            continue
        name, _, rest = p.partition(":")
        typ, _, default = rest.partition("=")
        if name.strip() == "self":
            continue
        out.append((name.strip(), typ.strip(), default.strip() or None))
    return out


def stub_params(source, cls, method):
    """[(name, annotation, default repr or None)] of `cls.method` in the stub source."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == method:
                    a = f.args
                    if a.args[1:] or a.posonlyargs or a.vararg:
                        raise AssertionError(f"{cls}.{method}: keywords only, after *")
                    return [(arg.arg, ast.unparse(arg.annotation),
                             None if d is None else repr(ast.literal_eval(d)))
                            for arg, d in zip(a.kwonlyargs, a.kw_defaults)]
    raise AssertionError(f"{cls}.{method} is not in the stub")


def drift(source):
    """What differs between the stub's Client.__init__ and the module's; [] if nothing."""
    got = module_params(_spgate.Client.__init__)
    want = stub_params(source, "Client", "__init__")
    problems = []
    if [p[0] for p in got] != [p[0] for p in want]:
        problems.append(f"names: module {[p[0] for p in got]} != stub {[p[0] for p in want]}")
        return problems
    for (name, mtype, mdef), (_, stype, sdef) in zip(got, want):
        if name not in NOT_IN_TABLE and mtype != stype:
            problems.append(f"{name}: type {stype} in the stub, {mtype} in the module")
        if mdef != sdef:
            problems.append(f"{name}: default {sdef} in the stub, {mdef} in the module")
    return problems


class StubCheckTest(unittest.TestCase):
    def setUp(self):
        with open(STUB) as f:
            self.source = f.read()

    def test_client_keywords_match_the_module(self):
        self.assertEqual(drift(self.source), [])

    def test_the_signature_comes_from_the_table(self):
        # The module's keywords are the table's Python rows: spot-check that the
        # durations arrive in seconds and job_id is the one required keyword.
        params = {name: default for name, _, default in module_params(_spgate.Client.__init__)}
        self.assertIsNone(params["job_id"])
        self.assertEqual(params["decision_deadline"], "0.02")  # 20 ms
        self.assertEqual([n for n, d in params.items() if d is None], ["job_id"])
        self.assertEqual(list(params)[-1], "tls")

    def test_a_drifted_stub_fails(self):
        cases = {
            "default": self.source.replace("decision_deadline: float = 0.02",
                                           "decision_deadline: float = 0.05"),
            "type": self.source.replace("telemetry_buffer: int = 4096",
                                        "telemetry_buffer: float = 4096"),
            "missing": self.source.replace(" seed: int = 0,\n", "\n"),
            "order": self.source.replace('controller: str = "", incarnation: str = ""',
                                         'incarnation: str = "", controller: str = ""'),
        }
        for what, source in cases.items():
            with self.subTest(what):
                self.assertNotEqual(source, self.source, "the case did not change the stub")
                self.assertNotEqual(drift(source), [], what)


if __name__ == "__main__":
    unittest.main()
