"""python/build_backend/spgate_build.py's choice of build tree: one per interpreter under
build-pip/ (a CMake tree keeps its first interpreter's headers and extension suffix in
its cache whatever a later -DPython3_EXECUTABLE says), shared by the virtualenvs of one
interpreter; a keyed tree whose cache names another interpreter is configured afresh;
and SPGATE_BUILD_DIR configured for another interpreter is refused, naming both. CMake is
not run: the backend's command runner is replaced by one that records the command.

Run: python3 tests/python/build_backend_test.py
"""
import os
import re
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python", "build_backend"))
import spgate_build  # noqa: E402


class BuildTreeTest(unittest.TestCase):
    def setUp(self):
        self.repo = Path(tempfile.mkdtemp(prefix="spgate-build-backend-"))
        self.commands = []
        patches = [mock.patch.object(spgate_build, "REPO", self.repo),
                   mock.patch.object(spgate_build, "_run", self.commands.append),
                   mock.patch.object(spgate_build.shutil, "which", lambda name: "/usr/bin/" + name
                                     if name == "cmake" else None),
                   mock.patch.dict(os.environ, {"SPGATE_BUILD_DIR": ""})]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

    def tearDown(self):
        shutil.rmtree(self.repo, ignore_errors=True)

    def interpreter(self, path):
        """As if running under `path` (a virtualenv's base interpreter is `path` too)."""
        return mock.patch.object(sys, "_base_executable", path, create=True)

    def configure(self, build_dir, python):
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / "CMakeCache.txt").write_text(
            "CMAKE_BUILD_TYPE:STRING=Release\nPython3_EXECUTABLE:FILEPATH=%s\n" % python)
        (build_dir / "CMakeFiles").mkdir(exist_ok=True)

    def test_one_tree_per_interpreter(self):
        with self.interpreter("/opt/a/bin/python3"):
            a = spgate_build._build_dir()
        with self.interpreter("/opt/b/bin/python3"):
            b = spgate_build._build_dir()
        self.assertNotEqual(a, b)
        for tree in (a, b):
            self.assertEqual(tree.parent, self.repo / "build-pip")
            self.assertTrue(tree.name.startswith(sys.implementation.cache_tag + "-"), tree)
        self.assertEqual([c[c.index("-B") + 1] for c in self.commands], [a, b])
        self.assertIn("-DPython3_EXECUTABLE=/opt/a/bin/python3", self.commands[0])
        self.assertIn("-DPython3_EXECUTABLE=/opt/b/bin/python3", self.commands[1])

    def test_a_configured_tree_is_reused_by_its_interpreter(self):
        with self.interpreter("/opt/a/bin/python3"):
            tree = spgate_build._pip_build_dir()
            self.configure(tree, "/opt/a/bin/python3")
            self.assertEqual(spgate_build._build_dir(), tree)
        self.assertEqual(self.commands, [], "a tree of this interpreter is not reconfigured")

    def test_a_tree_of_another_interpreter_is_configured_afresh(self):
        with self.interpreter("/opt/a/bin/python3"):
            tree = spgate_build._pip_build_dir()
            self.configure(tree, "/opt/b/bin/python3")  # e.g. copied from elsewhere
            self.assertEqual(spgate_build._build_dir(), tree)
        self.assertFalse((tree / "CMakeCache.txt").exists(), "the stale cache was kept")
        self.assertFalse((tree / "CMakeFiles").exists())
        self.assertEqual(len(self.commands), 1)
        self.assertIn("-DPython3_EXECUTABLE=/opt/a/bin/python3", self.commands[0])

    def test_spgate_build_dir_of_another_interpreter_is_refused(self):
        given = self.repo / "build"
        self.configure(given, "/opt/b/bin/python3")
        with self.interpreter("/opt/a/bin/python3"), \
                mock.patch.dict(os.environ, {"SPGATE_BUILD_DIR": str(given)}):
            with self.assertRaisesRegex(spgate_build.BuildError,
                                        "configured for the interpreter /opt/b/bin/python3, "
                                        "not this one \\(/opt/a/bin/python3\\)"):
                spgate_build._build_dir()
            self.configure(given, "/opt/a/bin/python3")
            self.assertEqual(spgate_build._build_dir(), given.resolve())
        self.assertEqual(self.commands, [])

    def test_a_relative_spgate_build_dir_is_the_repository_roots(self):
        # pip calls the backend in python/, so a path relative to the working directory
        # would name python/build; the user wrote it from the repository root.
        given = self.repo / "build"
        elsewhere = Path(tempfile.mkdtemp(prefix="spgate-build-cwd-"))
        self.addCleanup(shutil.rmtree, elsewhere, True)
        self.configure(elsewhere / "build", "/opt/a/bin/python3")  # a decoy beside the cwd
        cwd = os.getcwd()
        os.chdir(elsewhere)
        self.addCleanup(os.chdir, cwd)
        with self.interpreter("/opt/a/bin/python3"), \
                mock.patch.dict(os.environ, {"SPGATE_BUILD_DIR": "build"}):
            with self.assertRaisesRegex(spgate_build.BuildError,
                                        re.escape("SPGATE_BUILD_DIR=build (%s) is not a "
                                                  "configured" % given.resolve())):
                spgate_build._build_dir()
            self.configure(given, "/opt/a/bin/python3")
            self.assertEqual(spgate_build._build_dir(), given.resolve())
        self.assertEqual(self.commands, [])


if __name__ == "__main__":
    unittest.main()
