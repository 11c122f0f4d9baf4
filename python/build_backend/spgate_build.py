"""spgate's PEP 517 build backend: `pip install ./python` from the repository root.

It builds the native module spgate._spgate (python/*.cc over the C++ client library) with
CMake on the repository - that target only, CUDA, tests and benchmarks off - and packs it
with the package's Python sources and type stubs (python/spgate/) into a wheel for the
running interpreter. Nothing is downloaded: the build needs cmake, a C++20 compiler,
pybind11-dev, python3-dev and the client's libraries (gRPC, protobuf, Abseil), which
`make deps` installs, and the wheel is written here with zipfile, so it works offline with
or without pip's build isolation. The version is the project's: project(spgate VERSION x.y.z)
in the top-level CMakeLists.txt, the one place it is defined (spgated --version and
spgate.__version__ come from it too).

The build tree: SPGATE_BUILD_DIR when set (an already configured tree, e.g. `build` after
`make build`; a relative path is the repository root's: only what is out of date is rebuilt, so CI installs in seconds; it must have
been configured for this interpreter), else one tree per interpreter under <repo>/build-pip
(build-pip/cpython-311-1a2b3c4d: the cache tag and a digest of the interpreter's path),
configured on first use (Release) and reused by later installs with the same interpreter.
One tree per interpreter, because a CMake tree keeps the first interpreter's headers and
extension suffix in its cache whatever a later -DPython3_EXECUTABLE says; a virtualenv
counts as the interpreter it was made from (the same headers and ABI), so every
virtualenv of one Python shares a tree. SPGATE_BUILD_JOBS caps the compile jobs (default:
every core).

pip (>= 21.3) builds a local directory in place, which this backend needs: it reads the
repository around python/. docs/pytorch.md, "Install".
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent.parent  # python/
REPO = PYTHON_DIR.parent
NAME = "spgate"
NATIVE_TARGET = "spgate_python_native"
SUMMARY = ("spgate's worker client for Python (pybind11 over the C++ client) and "
           "spgate.torch, its PyTorch integration")


class BuildError(RuntimeError):
    pass


def _log(message: str) -> None:
    print("spgate build: " + message, file=sys.stderr, flush=True)


def _version() -> str:
    cmake_lists = REPO / "CMakeLists.txt"
    if not cmake_lists.is_file():
        raise BuildError(
            "%s is not inside a spgate checkout (no %s): run `pip install ./python` from the "
            "repository root; the build needs the whole repository" % (PYTHON_DIR, cmake_lists))
    m = re.search(r"project\(\s*spgate\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", cmake_lists.read_text())
    if not m:
        raise BuildError("%s: no project(spgate VERSION x.y.z)" % cmake_lists)
    return m.group(1)


def _run(cmd) -> None:
    _log("$ " + " ".join(str(c) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0:
        raise BuildError("command failed with exit status %d: %s"
                         % (r.returncode, " ".join(str(c) for c in cmd)))


def _cache_value(build_dir: Path, key: str) -> str:
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return ""
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    return ""


def _interpreter() -> Path:
    """The interpreter the extension is built for, symlinks resolved: a virtualenv's base
    interpreter (the same headers and ABI), else this one."""
    return Path(getattr(sys, "_base_executable", None) or sys.executable).resolve()


def _same_interpreter(configured: str) -> bool:
    return bool(configured) and Path(configured).resolve() == _interpreter()


def _pip_build_dir() -> Path:
    """This interpreter's tree under <repo>/build-pip."""
    digest = hashlib.sha256(str(_interpreter()).encode()).hexdigest()[:8]
    return REPO / "build-pip" / ("%s-%s" % (sys.implementation.cache_tag, digest))


def _build_dir() -> Path:
    """The configured tree to build in (SPGATE_BUILD_DIR's, or this interpreter's under
    <repo>/build-pip)."""
    given = os.environ.get("SPGATE_BUILD_DIR", "")
    if given:
        # pip runs this hook in python/, not where pip was called: a relative path is the
        # repository root's (`SPGATE_BUILD_DIR=build pip install ./python` from the root).
        build_dir = Path(given)
        build_dir = (build_dir if build_dir.is_absolute() else REPO / build_dir).resolve()
        if not (build_dir / "CMakeCache.txt").is_file():
            raise BuildError("SPGATE_BUILD_DIR=%s (%s) is not a configured CMake build tree "
                             "(no CMakeCache.txt); unset it to build in %s"
                             % (given, build_dir, _pip_build_dir()))
        if _cache_value(build_dir, "SPGATE_SANITIZE"):
            raise BuildError("SPGATE_BUILD_DIR=%s is a sanitizer build: its extension cannot "
                             "load into an uninstrumented interpreter" % given)
        configured = _cache_value(build_dir, "Python3_EXECUTABLE")
        if not _same_interpreter(configured):
            raise BuildError("SPGATE_BUILD_DIR=%s was configured for the interpreter %s, not "
                             "this one (%s): its extension would be built against the other's "
                             "headers; unset SPGATE_BUILD_DIR to build in %s"
                             % (given, configured or "(none)", _interpreter(), _pip_build_dir()))
        return build_dir
    build_dir = _pip_build_dir()
    configured = _cache_value(build_dir, "Python3_EXECUTABLE")
    if not _same_interpreter(configured):
        if shutil.which("cmake") is None:
            raise BuildError("cmake is not installed (`make deps` installs it)")
        if configured:
            # Not the interpreter this tree is named for (a copied or edited tree): start
            # over, since a reconfigure would keep the other one's headers in the cache.
            _log("%s was configured for %s; configuring it afresh for %s"
                 % (build_dir, configured, _interpreter()))
            (build_dir / "CMakeCache.txt").unlink()
            shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        cmd = ["cmake", "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               "-DSPGATE_ENABLE_CUDA=OFF", "-DSPGATE_BUILD_TESTS=OFF",
               "-DSPGATE_BUILD_BENCH=OFF", "-DPython3_EXECUTABLE=%s" % _interpreter()]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        _run(cmd)
    return build_dir


def _build_native(build_dir: Path) -> Path:
    """Builds the extension for this interpreter; returns its path."""
    jobs = os.environ.get("SPGATE_BUILD_JOBS") or str(os.cpu_count() or 1)
    started = time.monotonic()
    try:
        _run(["cmake", "--build", build_dir, "--target", NATIVE_TARGET, "--parallel", jobs])
    except BuildError as e:
        raise BuildError(
            "%s (is pybind11-dev or python3-dev missing? `make deps` installs them; CMake "
            "then builds the target %s in %s)" % (e, NATIVE_TARGET, build_dir)) from None
    _log("extension built in %.1f s" % (time.monotonic() - started))
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    native = build_dir / "python" / NAME / ("_spgate" + suffix)
    if not native.is_file():
        found = sorted(p.name for p in native.parent.glob("_spgate*"))
        raise BuildError(
            "%s: no _spgate%s for this interpreter (%s); found %s - the build tree was "
            "configured for another Python (Python3_EXECUTABLE=%s)"
            % (native.parent, suffix, sys.executable, found or "nothing",
               _cache_value(build_dir, "Python3_EXECUTABLE")))
    return native


def _wheel_tag() -> str:
    interpreter = "cp%d%d" % sys.version_info[:2]
    soabi = sysconfig.get_config_var("SOABI") or ""
    m = re.match(r"cpython-(\d+)", soabi)
    abi = "cp" + m.group(1) if m else interpreter
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (interpreter, abi, platform)


def _package_files(native: Path):
    """(path in the wheel, file on disk) for every file of the package."""
    files = []
    for path in sorted((PYTHON_DIR / NAME).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and \
                (path.suffix in (".py", ".pyi") or path.name == "py.typed"):
            files.append((path.relative_to(PYTHON_DIR).as_posix(), path))
    files.append(("%s/%s" % (NAME, native.name), native))
    return files


def _metadata(version: str) -> str:
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
            "Requires-Python: >=3.9\n" % (NAME, version, SUMMARY))


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _write_wheel(wheel_directory: str, version: str, files) -> str:
    tag = _wheel_tag()
    dist_info = "%s-%s.dist-info" % (NAME, version)
    name = "%s-%s-%s.whl" % (NAME, version, tag)
    meta = {
        "METADATA": _metadata(version),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: spgate_build\nRoot-Is-Purelib: false\n"
                  "Tag: %s\n" % tag),
        "top_level.txt": NAME + "\n",
    }
    record = []
    out = Path(wheel_directory) / name
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for arcname, path in files:
            data = path.read_bytes()
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if os.access(path, os.X_OK) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            record.append(_record_line(arcname, data))
        for fname, text in meta.items():
            arcname = "%s/%s" % (dist_info, fname)
            z.writestr(arcname, text)
            record.append(_record_line(arcname, text.encode()))
        record.append("%s/RECORD,," % dist_info)
        z.writestr("%s/RECORD" % dist_info, "\n".join(record) + "\n")
    return name


# ---- PEP 517 hooks ----------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    build_dir = _build_dir()
    native = _build_native(build_dir)
    name = _write_wheel(wheel_directory, version, _package_files(native))
    _log("wrote %s (from %s)" % (name, build_dir))
    return name
