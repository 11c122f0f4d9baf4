"""The package as a user installs it: `pip install ./python` into a fresh virtualenv that
sees Debian's PyTorch (--system-site-packages), from the package index of nobody
(--no-index: the build needs no download), built from an existing build tree
(SPGATE_BUILD_DIR, so only what is out of date is compiled). Then the installed copy -
not the build tree - is imported from outside the repository: its version must be the
project's. The ctest fixture the native Python tests run under (tests/python/CMakeLists.txt).

Run: python3 tests/python/pip_install.py REPO BUILD_DIR VENV VERSION
"""
import os
import shutil
import subprocess
import sys
import time


def main(repo, build_dir, venv, version):
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True,
                   timeout=120)
    python = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPGATE_BUILD_DIR"] = build_dir
    created = time.monotonic()
    subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                    "--disable-pip-version-check", "--quiet", os.path.join(repo, "python")],
                   check=True, env=env, timeout=900)
    installed = time.monotonic()
    out = subprocess.run(
        [python, "-c", "import spgate, spgate.torch; print(spgate.__version__); "
                       "print(spgate.__file__); print(callable(spgate.torch.connect))"],
        check=True, env=env, cwd=venv, stdout=subprocess.PIPE, text=True, timeout=120).stdout
    got_version, where, has_connect = out.split()
    problems = []
    if got_version != version:
        problems.append("spgate.__version__ is %s, the project's is %s" % (got_version, version))
    if not os.path.realpath(where).startswith(os.path.realpath(venv) + os.sep):
        problems.append("spgate imported from %s, not the virtualenv %s" % (where, venv))
    if has_connect != "True":
        problems.append("spgate.torch.connect is missing")
    print("pip_install: virtualenv %.1f s, pip install %.1f s; spgate %s at %s"
          % (created - started, installed - created, got_version, where))
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
