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

    def test_a_relative_xdg_cache_home_is_ignored(self, tmp_path, monkeypatch):
        # XDG Base Directory Specification: relative paths are invalid.
        monkeypatch.setenv("HOME", str(tmp_path))
        cfg = C.from_environ({"PYCDSMODE": "DUMP", "XDG_CACHE_HOME": "relcache"}, flags())
        assert cfg.archive.startswith(str(tmp_path / ".cache" / "pycds") + os.sep), cfg

    def test_no_home_directory_means_no_default_archive(self, monkeypatch):
        # HOME unset and a user id without a passwd entry (docker run -u
        # 12345): expanduser gives "~" back, and the archive went to a
        # directory named "~" in the working directory.
        monkeypatch.setattr(os.path, "expanduser", lambda path: path)
        for mode in ("DUMP", "SHARE"):
            cfg = C.from_environ({"PYCDSMODE": mode}, flags())
            assert cfg.mode == C.MODE_OFF and cfg.archive == "", cfg
            assert len(cfg.problems) == 1 and "PYCDSARCHIVE" in cfg.problems[0], cfg
        assert C.default_archive_path({}, ["py", "a.py"]) == ""
        cfg = C.from_environ({"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/a"}, flags())
        assert cfg.mode == C.MODE_SHARE and not cfg.problems, cfg
        cfg = C.from_environ({"PYCDSMODE": "SHARE", "XDG_CACHE_HOME": "/c"}, flags())
        assert cfg.archive.startswith("/c/pycds/") and not cfg.problems, cfg

    def test_a_home_that_does_not_exist_is_never_made(self, tmp_path):
        # A service user's home in many images (HOME=/nonexistent), as root:
        # DUMP made that directory to put its cache in.
        from support import run_python
        home = tmp_path / "nonexistent"
        (tmp_path / "prog.py").write_text("import json\nprint('ran')\n")
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", HOME=str(home))
        assert r.rc == 0 and r.out == "ran\n", r
        assert not home.exists()
        assert len(r.warnings()) == 1 and "does not exist" in r.warnings()[0], r


    def test_prefetch(self):
        base = {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/a"}
        assert C.from_environ(base, flags()).prefetch is True
        assert C.from_environ({**base, "PYCDSPREFETCH": "0"}, flags()).prefetch is False
        bad = C.from_environ({**base, "PYCDSPREFETCH": "yes"}, flags())
        assert bad.prefetch is True and len(bad.problems) == 1

    @pytest.mark.parametrize("raw,mode,problem", [
        (None, C.RELEASE_ON, False), ("1", C.RELEASE_ON, False),
        ("0", C.RELEASE_OFF, False), ("protect", C.RELEASE_PROTECT, False),
        (" Protect ", C.RELEASE_PROTECT, False), ("yes", C.RELEASE_ON, True)])
    def test_release(self, raw, mode, problem):
        env = {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": "/a"}
        if raw is not None:
            env["PYCDSRELEASE"] = raw
        cfg = C.from_environ(env, flags())
        assert cfg.release == mode
        assert len(cfg.problems) == int(problem)


class TestRelativePaths:
    """Relative paths mean the directory the program starts in, even when it
    changes directory before DUMP writes at exit, and for its children."""

    PROG = ("import os, subprocess, sys, json\n"
            "os.chdir('sub')\n"
            "subprocess.run([sys.executable, '-c', 'import csv, textwrap'], check=True)\n")

    def test_dump_and_children_write_where_the_program_started(self, tmp_path):
        from support import run_python
        (tmp_path / "sub").mkdir()
        (tmp_path / "prog.py").write_text(self.PROG)
        d = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE="rel.img")
        assert d.rc == 0 and d.warnings() == [], d
        assert (tmp_path / "rel.img").exists() and not (tmp_path / "sub" / "rel.img").exists()
        s = run_python(["-c", "import json, csv, textwrap"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE="rel.img", PYCDSVERBOSE=1)
        assert s.warnings() == [] and {"json", "csv", "textwrap"} <= set(s.served()), s

    def test_share_children_use_the_same_archive(self, tmp_path):
        """A SHARE child started in another directory uses the archive the
        program named, not a file of the same relative name there."""
        from support import run_python
        (tmp_path / "sub").mkdir()
        (tmp_path / "prog.py").write_text(self.PROG)
        d = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE="rel.img")
        assert d.rc == 0, d
        # In sub/, "rel.img" names a file that is not an archive.
        (tmp_path / "sub" / "rel.img").write_bytes(b"not an archive")
        s = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE="rel.img", PYCDSVERBOSE=1)
        assert s.rc == 0 and s.warnings() == [], s
        assert s.served().count("csv") == 1 and s.served().count("json") == 1, s

    def test_children_use_the_program_s_default_archive(self, tmp_path):
        """Without PYCDSARCHIVE a child started as `python -c ...` (as
        multiprocessing starts its workers) uses the program's archive: no
        archive of its own, no warning about a missing one."""
        from support import run_python
        (tmp_path / "sub").mkdir()
        (tmp_path / "prog.py").write_text(self.PROG)
        cache = tmp_path / "cache"
        d = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", XDG_CACHE_HOME=cache)
        assert d.rc == 0 and d.warnings() == [], d
        assert len(os.listdir(cache / "pycds")) == 1
        s = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       XDG_CACHE_HOME=cache, PYCDSVERBOSE=1)
        assert s.rc == 0 and s.warnings() == [], s
        assert {"json", "csv", "textwrap"} <= set(s.served()), s
        assert len(os.listdir(cache / "pycds")) == 1

    def test_trace_list_of_a_process_tree(self, tmp_path):
        """A TRACE run's children (a multiprocessing worker, a subprocess in
        another directory) add their modules to the program's list, which
        then dumps without warnings."""
        from support import run_python
        (tmp_path / "sub").mkdir()
        (tmp_path / "tmod.py").write_text("import textwrap\nVALUE = 7\n")
        (tmp_path / "prog.py").write_text(
            "import multiprocessing as mp, os, subprocess, sys, json\n"
            "def work(x):\n"
            "    import tmod\n"
            "    return tmod.VALUE * x\n"
            "if __name__ == '__main__':\n"
            "    pool = mp.get_context('spawn').Pool(1)\n"
            "    print(pool.map(work, [1, 2]))\n"
            "    pool.close()\n"      # workers exit (terminate() would kill them)
            "    pool.join()\n"
            "    os.chdir('sub')\n"
            "    subprocess.run([sys.executable, '-c', 'import csv'], check=True)\n")
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="TRACE", PYCDSLIST="mods.lst")
        assert r.rc == 0 and r.out == "[7, 14]\n" and r.warnings() == [], r
        names = (tmp_path / "mods.lst").read_text().split("\n")
        assert {"json", "tmod", "textwrap", "csv", "multiprocessing.pool"} <= set(names)
        assert "__mp_main__" not in names and len(names) == len(set(names))
        assert not (tmp_path / "sub" / "mods.lst").exists()
        d = run_python(["-c", "import pycds; print(pycds._dump('mods.lst', 'a.img') > 5)"],
                       cwd=tmp_path)
        assert d.out == "True\n" and d.warnings() == [], d

    def test_trace_list(self, tmp_path):
        from support import run_python
        (tmp_path / "sub").mkdir()
        r = run_python(["-c", "import os, json; os.chdir('sub')"], cwd=tmp_path,
                       PYCDSMODE="TRACE", PYCDSLIST="mods.lst")
        assert r.rc == 0 and "json" in (tmp_path / "mods.lst").read_text().split()


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
