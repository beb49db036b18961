"""What the program does to the import system (sys.meta_path, PathFinder,
its own cffi): SHARE follows it as plain import does."""

import textwrap

import pytest

from support import run_python


class TestMetaPath:
    """What the program does to the import system: PathFinder's answer is
    plain import's only while PathFinder follows pycds's finder on
    sys.meta_path; pycds's own dependency is found whatever sys.path says."""

    PROG = textwrap.dedent("""\
        import sys
        from importlib.machinery import PathFinder
        class Guard(PathFinder):
            @classmethod
            def find_spec(cls, name, path=None, target=None):
                if name == "csv":
                    raise ImportError("csv is not allowed here")
                return super().find_spec(name, path, target)
        at = sys.meta_path.index(PathFinder)
        if sys.argv[1] == "replace":
            sys.meta_path[at] = Guard
        elif sys.argv[1] == "between":
            sys.meta_path.insert(at, Guard)
        else:
            sys.meta_path.remove(PathFinder)
        try:
            import csv
            print("imported", csv.__name__)
        except ImportError as e:
            print("ImportError:", e)
        """)

    @pytest.mark.parametrize("how", ["replace", "between", "remove"])
    def test_a_finder_in_pathfinders_place_is_asked(self, tmp_path, how):
        (tmp_path / "prog.py").write_text(self.PROG)
        img = str(tmp_path / "a.img")
        run_python(["-c", "import csv"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python(["prog.py", how], cwd=tmp_path)
        assert plain.out.startswith("ImportError:"), plain
        s = run_python(["prog.py", how], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert s.out == plain.out and not s.warnings(), s
        assert "fallback csv: PathFinder does not follow pycds on sys.meta_path" in s.err

    def test_site_packages_taken_off_sys_path_still_serves(self, tmp_path):
        """The native module's _cffi_backend is found on the search path of
        start-up when the program has taken site-packages off sys.path (a
        misleading warning, "pycds._native is not built", and plain import
        before)."""
        img = str(tmp_path / "a.img")
        run_python(["-c", "import csv"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        code = ("import sys; sys.path[:] = [p for p in sys.path if '-packages' not in p]; "
                "import csv; print(csv.__name__)")
        s = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert s.out == "csv\n" and not s.warnings() and "csv" in s.served(), s

    def test_the_programs_own_cffi_backend_is_its_own(self, tmp_path):
        """A program that puts its own cffi on sys.path (a vendored one, as
        serverless bundles do) imports its own _cffi_backend, not the one
        pycds loaded for its native module: cffi refused to start (version
        mismatch) under DUMP, and under SHARE after an archived import."""
        vendor = tmp_path / "vendor"
        vendor.mkdir()
        (vendor / "_cffi_backend.py").write_text("__version__ = 'vendored'\n")
        (tmp_path / "app.py").write_text(textwrap.dedent("""\
            import csv, os, sys
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "vendor"))
            import _cffi_backend
            print(_cffi_backend.__version__, csv.__name__)
            """))
        img = str(tmp_path / "a.img")
        plain = run_python(["app.py"], cwd=tmp_path)
        assert plain.out == "vendored csv\n", plain
        d = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        s = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert d.out == s.out == plain.out, (d, s)
        assert "csv" in s.served() and not s.warnings(), s

    def test_a_cffi_backend_beside_the_script_is_not_pycds_s(self, tmp_path):
        """A bundle keeps its own _cffi_backend beside its script (pip
        install -t .): sys.path[0] names it, and pycds loaded it for its
        native module (running the bundle's code, then "archive ignored")."""
        (tmp_path / "_cffi_backend.py").write_text("print('the bundle body ran')\n")
        (tmp_path / "app.py").write_text("import csv\nprint(csv.__name__)\n")
        img = str(tmp_path / "a.img")
        plain = run_python(["app.py"], cwd=tmp_path)
        d = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        s = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert plain.out == d.out == s.out == "csv\n", (plain, d, s)
        assert "csv" in s.served() and not s.warnings(), s

    def test_a_finder_after_pathfinder_changes_nothing(self, tmp_path):
        (tmp_path / "prog.py").write_text(textwrap.dedent("""\
            import sys
            class Last:
                @staticmethod
                def find_spec(name, path=None, target=None):
                    return None
            sys.meta_path.append(Last)
            import csv
            print(csv.__name__)
            """))
        img = str(tmp_path / "a.img")
        run_python(["-c", "import csv"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        s = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert s.out == "csv\n" and "csv" in s.served(), s
