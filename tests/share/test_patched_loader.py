"""A program that patches the stock SourceFileLoader: SHARE and DUMP do what
plain import does (pycds._pyc.loader_patched)."""

import textwrap

import pytest

from support import run_python


class TestPatchedLoader:
    """A program that replaces part of the stock SourceFileLoader (an import
    hook rewriting code in source_to_code) gets its replacement's code, as
    with plain import: pycds neither archives code made while it was in
    place nor serves archived code while it is (pycds._pyc.loader_patched)."""

    MAIN = textwrap.dedent('''\
        import os
        import importlib.machinery as M
        import a
        if os.environ.get("PATCH"):
            orig = M.SourceFileLoader.source_to_code
            def source_to_code(self, data, path, *, _optimize=-1):
                code = orig(self, data, path, _optimize=_optimize)
                return code.replace(co_consts=tuple(
                    "PATCHED" if c == "ORIG" else c for c in code.co_consts))
            M.SourceFileLoader.source_to_code = source_to_code
        import b
        print("a:", a.X, "b:", b.X)
        ''')

    @pytest.fixture
    def app(self, tmp_path):
        (tmp_path / "a.py").write_text('X = "ORIG"\n')
        (tmp_path / "b.py").write_text('X = "ORIG"\n')
        (tmp_path / "main.py").write_text(self.MAIN)
        return tmp_path

    @pytest.mark.parametrize("pyc", ["written", "none"])
    def test_a_dump_under_the_patch_archives_no_patched_code(self, app, pyc):
        env = {"PYTHONDONTWRITEBYTECODE": "1"} if pyc == "none" else {}
        img = str(app / "a.img")
        d = run_python(["main.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                       PATCH="1", **env)
        assert (d.rc, d.out) == (0, "a: ORIG b: PATCHED\n"), d
        for patch in ("", "1"):
            plain = run_python(["main.py"], cwd=app, PATCH=patch, **env)
            r = run_python(["main.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                           PYCDSVERBOSE=1, PATCH=patch, **env)
            assert (r.rc, r.out) == (plain.rc, plain.out), (patch, plain, r)
            assert not r.warnings(), r
            assert "b" not in r.served(), r

    def test_a_traceback_through_the_patched_loader_is_plain(self, tmp_path):
        (tmp_path / "blocked.py").write_text("X = 1\n")
        (tmp_path / "app.py").write_text(textwrap.dedent("""\
            import os
            from importlib.machinery import SourceFileLoader
            if os.environ.get("BLOCK"):
                _orig = SourceFileLoader.get_code
                def get_code(self, fullname):
                    if fullname == "blocked":
                        raise ImportError("blocked by policy")
                    return _orig(self, fullname)
                SourceFileLoader.get_code = get_code
            import blocked
            """))
        img = str(tmp_path / "a.img")
        run_python(["app.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python(["app.py"], cwd=tmp_path, BLOCK="1")
        r = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       BLOCK="1")
        assert plain.rc == 1 and "blocked by policy" in plain.err, plain
        assert (r.rc, r.out, r.err) == (plain.rc, plain.out, plain.err), r

    def test_share_under_the_patch_runs_the_patched_loader(self, app):
        # No .pyc: plain import compiles b with the patched source_to_code.
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        img = str(app / "a.img")
        d = run_python(["main.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img, **env)
        assert (d.rc, d.out) == (0, "a: ORIG b: ORIG\n"), d
        plain = run_python(["main.py"], cwd=app, PATCH="1", **env)
        r = run_python(["main.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PATCH="1", **env)
        assert plain.out == "a: ORIG b: PATCHED\n", plain
        assert (r.rc, r.out) == (plain.rc, plain.out), r
        assert "a" in r.served() and "b" not in r.served(), r
        assert "fallback b: SourceFileLoader is patched" in r.err, r
