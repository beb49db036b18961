"""What the interpreter imports before the program runs is not served and
does not open the archive (pycds._config.imported_by_interpreter)."""

import os
import sys
import textwrap

import pytest

from support import run_python


class TestStartUpImports:
    """What the interpreter imports before the program runs (site's
    sitecustomize, 3.13's linecache for -c, runpy for -m) is imported plainly,
    before the archive is opened (which loads the native module): a short
    program must not pay for it (pycds._config.imported_by_interpreter)."""

    PROBE = ("import sys, sitecustomize; "
             "print(sitecustomize.STARTED, 'pycds._nativeapi' in sys.modules)")

    @pytest.fixture
    def app(self, tmp_path):
        (tmp_path / "sitecustomize.py").write_text("import startdep\nSTARTED = startdep.X\n")
        (tmp_path / "startdep.py").write_text("X = 'started'\n")
        (tmp_path / "appmod.py").write_text("import sys\nprint('appmod', __name__)\n")
        img = str(tmp_path / "a.img")
        env = dict(PYTHONPATH=str(tmp_path), PYCDSARCHIVE=img)
        d = run_python(["-c", self.PROBE + "; import appmod, linecache"], cwd=tmp_path,
                       PYCDSMODE="DUMP", **env)
        assert d.out.split()[0] == "started" and os.path.exists(img), d
        return tmp_path, env

    def test_start_up_imports_do_not_open_the_archive(self, app):
        cwd, env = app
        code = self.PROBE + "; print('pycds.share' in sys.modules)"
        r = run_python(["-c", code], cwd=cwd, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
        assert r.out.split() == ["started", "False", "False"] and r.err == "", r
        # Opened (by a stats() call here, which loads the native module), it
        # counts what went by plainly.
        code = self.PROBE + ("; import pycds; print(pycds.stats()['startup_plain'], "
                             "'pycds._nativeapi' in sys.modules)")
        r = run_python(["-c", code], cwd=cwd, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
        plain = [line.split()[2] for line in r.err.splitlines()
                 if line.startswith("[pycds] plain ")]
        # Both are in the archive; 3.13 also imports linecache for -c
        # before running it.
        expect = ["sitecustomize:", "startdep:"]
        if sys.version_info >= (3, 13):
            expect.append("linecache:")
        assert r.out.split() == ["started", "False", str(len(expect)), "True"], r
        assert sorted(plain) == sorted(expect), r
        assert r.served() == [] and not r.fallbacks() and not r.warnings(), r

    def test_the_programs_imports_are_served(self, app):
        cwd, env = app
        code = (self.PROBE + "; import appmod, pycds; s = pycds.stats(); "
                "print(s['startup_plain'], 'pycds._nativeapi' in sys.modules)")
        r = run_python(["-c", code], cwd=cwd, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
        n = 3 if sys.version_info >= (3, 13) else 2
        assert r.out.split() == ["started", "False", "appmod", "appmod", str(n), "True"], r
        assert r.served() == ["appmod"], r

    def test_run_module(self, tmp_path):
        # -m: runpy and what it imports come first, from C, and are imported
        # plainly; the module it runs is the program's.
        (tmp_path / "appmod.py").write_text("print(__name__)\n")
        img = str(tmp_path / "m.img")
        plain = run_python(["-m", "appmod"], cwd=tmp_path)
        run_python(["-m", "appmod"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["-m", "appmod"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "__main__\n"), r
        assert "[pycds] plain importlib:" in r.err and not r.warnings(), r

    def test_start_up_imports_past_the_bound_are_served(self, tmp_path):
        # What the interpreter imports plainly is bounded: the first
        # STARTUP_PLAIN_IMPORTS imports before the archive is opened.  A
        # sitecustomize that imports a large library (as tracing agents' do)
        # has the part past the bound served, which opens the archive.
        from pycds import STARTUP_PLAIN_IMPORTS
        names = ["startdep"] + [f"small{i}" for i in range(STARTUP_PLAIN_IMPORTS)] + ["last"]
        (tmp_path / "sitecustomize.py").write_text(f"import {', '.join(names)}\n")
        for name in names:
            (tmp_path / f"{name}.py").write_text("X = 1\n")
        img = str(tmp_path / "a.img")
        env = dict(PYTHONPATH=str(tmp_path), PYCDSARCHIVE=img)
        (tmp_path / "probe.py").write_text(
            "import sys, last\nprint(last.X, 'pycds._nativeapi' in sys.modules)\n")
        run_python(["probe.py"], cwd=tmp_path, PYCDSMODE="DUMP", **env)
        r = run_python(["probe.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
        assert r.out.split() == ["1", "True"], r
        started = ["sitecustomize"] + names
        assert r.served() == started[STARTUP_PLAIN_IMPORTS:], r
        plain = [line.split()[2] for line in r.err.splitlines()
                 if line.startswith("[pycds] plain ")]
        assert plain == [f"{name}:" for name in started[:STARTUP_PLAIN_IMPORTS]], r

    def test_only_until_the_native_module_is_loaded(self, tmp_path):
        # A thread started from C (no Python frame) imports as the
        # interpreter does: plainly before the native module is loaded,
        # served after (the program's own import loaded it).
        for name in ("early", "late", "own"):
            (tmp_path / f"{name}.py").write_text("DONE = True\n")
        (tmp_path / "prog.py").write_text(textwrap.dedent("""\
            import _thread, sys, time
            def from_c(name):
                _thread.start_new_thread(__import__, (name,))
                deadline = time.monotonic() + 30
                while not getattr(sys.modules.get(name), "DONE", False):
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
            from_c("early")
            print('pycds._nativeapi' in sys.modules)
            import own
            from_c("late")
            print('pycds._nativeapi' in sys.modules)
            """))
        img = str(tmp_path / "a.img")
        plain = run_python(["prog.py"], cwd=tmp_path)
        run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (plain.out, r.out) == ("False\nFalse\n", "False\nTrue\n"), (plain, r)
        assert r.served() == ["own", "late"], r
        assert "[pycds] plain early:" in r.err and not r.warnings(), r

    @pytest.mark.parametrize("change", [
        "from unittest import mock; patch = mock.patch('sys._getframe'); patch.start()",
        "del sys._getframe",
    ])
    def test_a_replaced_getframe_is_not_followed(self, tmp_path, change):
        # The walk uses sys._getframe as it was when the finder was imported:
        # a mock's f_back never ends, and a deleted one must not raise into
        # the import.
        (tmp_path / "dep.py").write_text("X = 1\n")
        prog = f"import sys\n{change}\nimport dep\nprint(dep.X)\n"
        (tmp_path / "prog.py").write_text(prog)
        img = str(tmp_path / "a.img")
        run_python(["-c", "import dep"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, timeout=60)
        assert (r.rc, r.out) == (0, "1\n") and "dep" in r.served(), r
