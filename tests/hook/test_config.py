"""PYCDS* environment parsing (pycds/_config.py)."""

import os
import sys
import types

import pytest

from pycds import _config as C


def flags(ignore=0):
    return types.SimpleNamespace(ignore_environment=ignore)


class TestFromEnviron:
    @pytest.mark.parametrize("raw,mode", [
        ("DUMP", C.MODE_DUMP), ("share", C.MODE_SHARE), (" Trace ", C.MODE_TRACE),
        ("MANUALLY", C.MODE_MANUALLY), ("", C.MODE_OFF), ("off", C.MODE_OFF)])
    def test_modes(self, raw, mode):
        cfg = C.from_environ({"PYCDSMODE": raw, "PYCDSARCHIVE": "/a.img"}, flags())
        assert cfg.mode == mode and not cfg.problems

    def test_bad_mode_is_one_problem_and_off(self):
        cfg = C.from_environ({"PYCDSMODE": "FAST"}, flags())
        assert cfg.mode == C.MODE_OFF
        assert len(cfg.problems) == 1 and "'FAST'" in cfg.problems[0]

    def test_ignore_environment_turns_everything_off(self):
        cfg = C.from_environ({"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/x"}, flags(1))
        assert cfg.mode == C.MODE_OFF and cfg.archive == ""

    @pytest.mark.parametrize("raw,level,problem", [
        ("0", 0, False), ("1", 1, False), ("2", 2, False), ("7", 2, False),
        ("-1", 0, False), ("loud", 0, True)])
    def test_verbose(self, raw, level, problem):
        cfg = C.from_environ({"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/a",
                              "PYCDSVERBOSE": raw}, flags())
        assert cfg.verbose == level and bool(cfg.problems) == problem

    @pytest.mark.parametrize("raw,check,problem", [
        ("mtime", "mtime", False), ("HASH", "hash", False),
        ("unchecked", "unchecked", False), ("sha", "mtime", True)])
    def test_check(self, raw, check, problem):
        cfg = C.from_environ({"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/a",
                              "PYCDSCHECK": raw}, flags())
        assert cfg.check == check and bool(cfg.problems) == problem

    def test_default_archive_in_cache_dir(self, tmp_path):
        env = {"PYCDSMODE": "DUMP", "XDG_CACHE_HOME": str(tmp_path)}
        cfg = C.from_environ(env, flags())
        assert cfg.archive.startswith(str(tmp_path / "pycds") + os.sep)
        assert cfg.archive.endswith(".img")


class TestProgramId:
    @pytest.mark.parametrize("argv,expected", [
        (["py", "app.py", "x"], ("script", os.path.realpath("app.py"))),
        (["py", "-O", "-X", "dev", "app.py"], ("script", os.path.realpath("app.py"))),
        (["py", "-m", "pkg.tool", "-v"], ("-m", "pkg.tool")),
        (["py", "-mjson.tool"], ("-m", "json.tool")),
        (["py", "-Bc", "print(1)"], ("-c", "print(1)")),
        (["py", "-W", "error", "-c", "pass"], ("-c", "pass")),
        (["py", "--check-hash-based-pycs", "always", "a.py"], ("script", os.path.realpath("a.py"))),
    ])
    def test_parse(self, argv, expected):
        assert C.program_id(argv) == expected

    def test_different_programs_get_different_archives(self):
        a = C.default_archive_path({}, ["py", "a.py"])
        b = C.default_archive_path({}, ["py", "b.py"])
        assert a != b and a == C.default_archive_path({}, ["py", "a.py"])
