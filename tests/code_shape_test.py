#!/usr/bin/env python3
"""The production code's shape (docs/design.md §8): no file over 800 lines and no function
over 120, outside the declarative tables named below with their reason.

Production code is the .cc, .h, .cu, .cuh, .py and .proto files under common, policy,
proto, server, worker, kernels, tools and python. Functions and their extents come from
universal-ctags (`make deps` installs it); a function's length counts its lines from the
signature to the closing brace. The check fails, naming each, on
  - a file over MAX_FILE_LINES lines;
  - a function over MAX_FUNCTION_LINES lines that is not an exception;
  - an exception that no longer holds: its function has gone or is now short enough.
Run as ctest `code_shape_test` (label `layout`) or directly:
`python3 tests/code_shape_test.py [--root=DIR]`.
"""
import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

FOLDERS = ["common", "policy", "proto", "server", "worker", "kernels", "tools", "python"]
EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".py", ".proto")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120

# Functions allowed past MAX_FUNCTION_LINES: (path, name) -> why it is a declarative table.
EXCEPTIONS = {
    ("server/metrics.cc", "Metrics"): "the constructor registers every metric family, name "
                                      "and help text: one entry per metric, no logic",
}


def production_files(root):
    out = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__"))]
            for name in filenames:
                if name.endswith(EXTENSIONS):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def functions(root, files):
    """(path, name, first line, lines) for every function ctags finds with an end."""
    code = [f for f in files if not f.endswith(".proto")]
    result = subprocess.run(
        ["ctags", "-x", "--fields=+ne", "--kinds-C++=f", "--kinds-CUDA=f", "--kinds-Python=fm",
         "--map-CUDA=+.cu", "--map-CUDA=+.cuh", "--_xformat=%N\t%F\t%n\t%e", "-L", "-"],
        cwd=root, input="\n".join(code), capture_output=True, text=True, check=True)
    out = []
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        name, path, first, end = parts
        out.append((path, name, int(first), int(end) - int(first) + 1))
    return out


def check(root):
    problems = []
    files = production_files(root)
    if not files:
        return [f"no production files under {root}"]
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_FILE_LINES:
            problems.append(f"{path}: {n} lines (at most {MAX_FILE_LINES})")
    found = functions(root, files)
    if not found:
        return problems + ["ctags found no functions: is universal-ctags installed (make deps)?"]
    long_ones = {}
    for path, name, first, lines in found:
        if lines > MAX_FUNCTION_LINES:
            long_ones[(path, name)] = (first, lines)
    for (path, name), (first, lines) in sorted(long_ones.items()):
        if (path, name) not in EXCEPTIONS:
            problems.append(f"{path}:{first}: {name} is {lines} lines "
                            f"(at most {MAX_FUNCTION_LINES} outside a declarative table)")
    for key in EXCEPTIONS:
        if key not in long_ones:
            problems.append(f"exception {key[0]} {key[1]} no longer holds: no such function "
                            f"over {MAX_FUNCTION_LINES} lines (remove the entry)")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=ROOT)
    args = parser.parse_args()
    # A missing or other ctags fails the test: `make deps` installs universal-ctags.
    version = ""
    if shutil.which("ctags") is not None:
        version = subprocess.run(["ctags", "--version"], capture_output=True, text=True).stdout
    if "Universal Ctags" not in version:
        print("code_shape_test: universal-ctags not found (make deps installs it)")
        return 1
    problems = check(args.root)
    for p in problems:
        print(f"code_shape_test: {p}")
    if not problems:
        print("code_shape_test: every production file and function within bounds")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
