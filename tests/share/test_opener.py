"""SHARE opens its archive at the program's first import, not at start-up
(pycds._Opener): what start-up still does, what the first import does, and
the ways a program can meet the stand-in on sys.meta_path."""

import os
import sys
import textwrap

import pytest

from support import import_state, run_python

import pycds
from pycds import _config
from pycds import share as finder


@pytest.fixture
def app(tmp_path):
    """(directory, archive) of a program importing its module ``m``."""
    (tmp_path / "m.py").write_text("X = 1\n")
    img = str(tmp_path / "a.img")
    r = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert os.path.exists(img), r
    return tmp_path, img


def share(cwd, img, code, **env):
    return run_python(["-c", code], cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                      PYCDSVERBOSE="1", **env)


class TestWhatStartUpKeeps:
    def test_the_session_tag_is_set_before_anything_is_imported(self, app):
        # A child started before the first import (os is loaded already)
        # still learns its parent's interpreter facts.
        cwd, img = app
        r = share(cwd, img, "import os; print(os.environ['PYCDS_SHARE_SESSION'], "
                            "'pycds.share' in __import__('sys').modules)")
        tag, opened = r.out.split()
        assert len(tag) == 16 and opened == "False" and r.err == "", r

    def test_a_loader_patched_before_the_first_import_is_seen(self, app):
        # The stock SourceFileLoader is noted at start-up, not when the
        # archive is opened.
        cwd, img = app
        code = ("from importlib.machinery import SourceFileLoader as L; "
                "stock = L.source_to_code; "
                "L.source_to_code = lambda self, data, path, **k: stock(self, data, path, **k); "
                "import m; print(m.X)")
        r = share(cwd, img, code)
        assert r.out == "1\n" and r.served() == [], r
        assert r.fallbacks() == ["[pycds] fallback m: SourceFileLoader is patched"], r

    def test_pycds_s_own_module_as_the_first_import_runs_once(self, app):
        # It does not open the archive (pycds.share would be imported
        # inside the program's import of it, and run twice); the next
        # import does, with that one module.
        cwd, img = app
        r = share(cwd, img, "import pycds.share as f, sys; opened = f._installed; import m; "
                            "print(opened, f is sys.modules['pycds.share'], "
                            "f._installed is not None, f.stats()['served'])")
        assert r.out.split() == ["None", "True", "True", "1"] and not r.warnings(), r

    def test_stats_opens_the_archive(self, app):
        cwd, img = app
        r = share(cwd, img, "import pycds; s = pycds.stats(); "
                            "print(s['archive'] == %r, s['modules_in_archive'] > 0)" % img)
        assert r.out.split() == ["True", "True"] and not r.warnings(), r


class TestTheFirstImport:
    def test_a_damaged_archive_warns_there_and_the_import_is_plain(self, app):
        # The stand-in stays on sys.meta_path, declining: taken out while the
        # import system goes through the list, it would make it skip
        # PathFinder, and the import would fail.
        cwd, img = app
        with open(img, "r+b") as f:
            f.truncate(os.path.getsize(img) // 2)
        r = share(cwd, img, "import m, json; print(m.X, json.dumps(1))")
        assert (r.rc, r.out) == (0, "1 1\n"), r
        assert len(r.warnings()) == 1 and "truncated" in r.warnings()[0], r

    def test_a_program_that_took_pycds_away_imports_plainly(self, app):
        cwd, img = app
        code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
                "if type(f).__module__ != 'pycds']; import m; print(m.X)")
        r = share(cwd, img, code)
        assert r.out == "1\n" and r.err == "", r

    def test_an_audit_hook_refusing_pycds_is_one_warning_then_plain(self, app):
        # The opening imports pycds's modules inside the program's import,
        # where its audit hooks see them.
        cwd, img = app
        code = textwrap.dedent("""\
            import sys
            def hook(event, args):
                if event == "import" and args[0] == "pycds.share":
                    raise RuntimeError("not here")
            sys.addaudithook(hook)
            import m, json
            print(m.X, json.dumps(2))
            """)
        r = share(cwd, img, code)
        assert (r.rc, r.out) == (0, "1 2\n") and r.served() == [], r
        assert r.warnings() == ["[pycds] warning: pycds not activated: "
                                "RuntimeError('not here')"], r

    @pytest.mark.parametrize("first", ["m", "csv"])
    def test_descriptors_on_the_archive(self, app, first):
        # The opening keeps its descriptor for a first import the archive
        # holds (m), for that module's load; it keeps none where it holds
        # the first import not (csv), until an archived one.  One each time
        # the archive is in use, out of the program's way.
        cwd, img = app
        code = textwrap.dedent(f"""\
            import os
            def held():
                return sum(os.path.realpath(f"/proc/self/fd/{{fd}}") == {img!r}
                           for fd in os.listdir("/proc/self/fd"))
            import {first}
            print(held(), end=" ")
            import m
            print(held(), m.X)
            """)
        r = share(cwd, img, code)
        assert (r.rc, r.warnings(), r.served()) == (0, [], ["m"]), r
        assert r.out == ("1 1 1\n" if first == "m" else "0 1 1\n"), r

    def test_threads_importing_first_at_once_open_it_once(self, tmp_path):
        names = [f"mod{i}" for i in range(8)]
        for name in names:
            (tmp_path / f"{name}.py").write_text(f"NAME = {name!r}\n")
        prog = textwrap.dedent(f"""\
            import sys, threading
            names = {names!r}
            go = threading.Barrier(len(names))
            got = {{}}
            def imp(name):
                go.wait()
                got[name] = __import__(name).NAME
            threads = [threading.Thread(target=imp, args=(n,)) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(sorted(got.values()) == sorted(names))
            print([type(f).__name__ for f in sys.meta_path].count("CDSFinder"))
            """)
        (tmp_path / "prog.py").write_text(prog)
        img = str(tmp_path / "a.img")
        run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        for _ in range(3):
            r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE="1")
            assert (r.rc, r.out) == (0, "True\n1\n") and not r.warnings(), r
            assert set(names) <= set(r.served()), r


class TestOpenerInProcess:
    """The stand-in's decisions, with pycds.share.install replaced."""

    @pytest.fixture
    def opener(self):
        cfg = _config.Config(mode=_config.MODE_SHARE, archive="/nonexistent.img")
        o = pycds._Opener(cfg)
        with import_state(meta_path=[o] + sys.meta_path):
            yield o

    @staticmethod
    def _install_raising(monkeypatch, exc, own):
        # install() replaced by code that raises exc, run as the code of
        # pycds's finder module (in its namespace: own) or of the program.
        code = compile("def install(*a, **k):\n    raise _exc\n", "<install>", "exec")
        if own:
            monkeypatch.setattr(finder, "install", finder.install)
            monkeypatch.setattr(finder, "_exc", exc, raising=False)
            exec(code, vars(finder))
        else:
            ns = {"__name__": "app", "_exc": exc}
            exec(code, ns)
            monkeypatch.setattr(finder, "install", ns["install"])

    def test_the_programs_exception_propagates_and_the_next_import_opens(
            self, opener, monkeypatch):
        # A signal handler's or trace function's, raised inside the opening.
        self._install_raising(monkeypatch, TimeoutError("the program's alarm"), own=False)
        with pytest.raises(TimeoutError):
            opener.open()
        assert not opener.done and opener.opening == 0

    @pytest.mark.parametrize("exc", [RecursionError, MemoryError])
    def test_the_programs_state_makes_one_import_plain(self, opener, monkeypatch, exc):
        self._install_raising(monkeypatch, exc(), own=False)
        assert opener.open() is None and not opener.done

    def test_a_fault_of_pycds_is_one_warning_then_plain(self, opener, monkeypatch, capsys):
        self._install_raising(monkeypatch, KeyError("x"), own=True)
        assert opener.open() is None and opener.done
        assert opener.find_spec("json") is None
        err = capsys.readouterr().err
        assert err.count("[pycds] warning: pycds not activated: KeyError('x')") == 1, err
        assert opener in sys.meta_path   # declining, not taken out

    def test_the_interpreters_imports_go_by_within_the_bound(self, opener, monkeypatch):
        calls = []
        monkeypatch.setattr(finder, "install", lambda *a, **k: calls.append(k) or None)
        monkeypatch.setattr(pycds, "imported_by_interpreter", lambda: True)
        for i in range(pycds.STARTUP_PLAIN_IMPORTS):
            assert opener.find_spec(f"n{i}") is None
        assert calls == []
        opener.find_spec("last")
        assert len(calls) == 1
        assert calls[0]["started_plain"] == [f"n{i}" for i in range(pycds.STARTUP_PLAIN_IMPORTS)]
