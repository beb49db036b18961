"""The modes end to end: an unknown PYCDSMODE, -E, the default archive path,
children with other flags, TRACE then the dump API, -X dev, names interned
as unmarshal interns them, a dump in a SHARE run, an unwritable target."""

import os
import textwrap

import pytest

from support import dump_and_share, run_python


class TestModes:
    def test_unknown_mode_warns_once_and_runs(self, tmp_path):
        r = run_python(["-c", "print('ok')"], cwd=tmp_path, PYCDSMODE="SHAER")
        assert r.out == "ok\n" and r.rc == 0
        assert len(r.warnings()) == 1 and "SHAER" in r.warnings()[0]

    @pytest.mark.parametrize("flag", ["-E", "-I"])
    def test_ignore_environment_keeps_pycds_off(self, tmp_path, flag):
        img = str(tmp_path / "a.img")
        r = run_python([flag, "-c", "import json; print('ok')"], cwd=tmp_path,
                       PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert r.out == "ok\n"
        assert not os.path.exists(img)

    def test_default_archive_path_per_program(self, tmp_path):
        (tmp_path / "prog.py").write_text("import json\nprint(json.dumps([1]))\n")
        cache = tmp_path / "cache"
        d = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", XDG_CACHE_HOME=cache)
        assert d.rc == 0
        files = os.listdir(cache / "pycds")
        assert len(files) == 1 and files[0].endswith(".img"), files
        s = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       XDG_CACHE_HOME=cache, PYCDSVERBOSE=1)
        assert s.out == "[1]\n" and "json" in s.served(), s
        other = run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP",
                           XDG_CACHE_HOME=cache)
        assert other.rc == 0 and len(os.listdir(cache / "pycds")) == 2

    # A child process run with -O (another interpreter's facts) inherits its
    # parent's archive through PYCDSARCHIVE.
    CHILD_O = textwrap.dedent("""\
        import subprocess, sys
        r = subprocess.run([sys.executable, "-O", "-c", "import json; print('child')"],
                           capture_output=True, text=True)
        print(repr(r.stdout), repr(r.stderr))
        import json
        """)

    def test_a_child_with_other_flags_takes_its_parents_archive_quietly(self, tmp_path):
        """Plain import in the child, and nothing on its stderr: it did not
        ask for that archive (the default one, or the one named for its
        parent); the parent is served."""
        (tmp_path / "prog.py").write_text(self.CHILD_O)
        cache = tmp_path / "cache"
        plain = run_python(["prog.py"], cwd=tmp_path)
        assert plain.out == "'child\\n' ''\n", plain
        for env in ({"XDG_CACHE_HOME": cache}, {"PYCDSARCHIVE": "app.img"}):
            d = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", **env)
            assert d.out == plain.out and not d.warnings(), d
            s = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", **env)
            assert s.out == plain.out and s.err == "", s
            v = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
            assert "json" in v.served() and "made by another interpreter" in v.out, v

    def test_an_archive_for_another_flag_still_warns_the_process_given_it(self, tmp_path):
        img = str(tmp_path / "a.img")
        run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        s = run_python(["-O", "-c", "import json; print('ok')"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert s.out == "ok\n"
        assert len(s.warnings()) == 1 and "optimize 0, this is 1" in s.warnings()[0], s

    def test_trace_then_api_dump(self, workspace, tmp_path):
        lst = str(tmp_path / "mods.lst")
        img = str(tmp_path / "api.img")
        run_python(["app_shop.py"], cwd=workspace, PYCDSMODE="TRACE", PYCDSLIST=lst)
        names = open(lst).read().split()
        assert "shopkit.pricing" in names and "__main__" not in names
        r = run_python(["-c", f"import pycds; print(pycds._dump({lst!r}, {img!r}) > 10)"],
                       cwd=workspace)
        assert r.out.strip() == "True", r
        s = run_python(["app_shop.py"], cwd=workspace, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "shopkit.pricing" in s.served() and s.rc == 3

    def test_trace_lists_only_importable_modules(self, tmp_path):
        # Cython extension modules put spec-less modules in sys.modules
        # (cython_runtime, _cython_3_x): no import can find them again.
        lst = str(tmp_path / "mods.lst")
        prog = ("import sys, types, json; "
                "sys.modules['fake_runtime'] = types.ModuleType('fake_runtime'); "
                "sys.modules['alias_json'] = json")
        run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="TRACE", PYCDSLIST=lst)
        names = open(lst).read().split()
        assert "json" in names and "fake_runtime" not in names, names
        assert "alias_json" not in names, names
        r = run_python(["-m", "pycds", "dump", lst, str(tmp_path / "a.img")], cwd=tmp_path)
        assert r.rc == 0 and "warning" not in r.err, r

    def test_names_are_interned_as_unmarshal_interns_them(self, tmp_path):
        """3.13's PyUnicode_InternInPlace interns mortal, unmarshal immortal:
        CPython 3.13.0's keyword suggestions drop references to co_varnames
        items they never took, which freed mortal names (a crash)."""
        (tmp_path / "kw.py").write_text(
            "class MultiplyNested:\n"
            "    def f2(self):\n"
            "        __arg = 1\n"
            "        class D:\n"
            "            def g(self, __arg):\n"
            "                return __arg\n"
            "        return D().g\n"
            "def h(self, zz_unique_param_name):\n"
            "    return 1\n")
        (tmp_path / "main.py").write_text(
            "import gc, sys, kw, json\n"
            "c = kw.MultiplyNested().f2()\n"
            "names = c.__code__.co_varnames + kw.h.__code__.co_varnames\n"
            "immortal = lambda: [sys.getrefcount(n) > 1 << 29 for n in names]\n"
            "if sys.version_info >= (3, 12):   # 3.11: the archive's counts are big\n"
            "    print(immortal())\n"
            "for i in range(5):\n"
            "    for call in (lambda: c(_MultiplyNested__arg=2),\n"
            "                 lambda: kw.h(None, zz_unique_param_nam=1)):\n"
            "        try:\n"
            "            call()\n"
            "        except TypeError as e:\n"
            "            print(e)\n"
            "gc.collect()\n"
            "if sys.version_info >= (3, 12):\n"
            "    print(immortal())\n")
        plain, dump, share = dump_and_share(["main.py"], tmp_path, str(tmp_path / "a.img"))
        assert "kw" in share.served()
        assert (share.rc, share.out) == (plain.rc, plain.out) == (0, plain.out), share

    def test_dev_mode_imports_during_the_native_load(self, tmp_path):
        """Under -X dev, loading the native module looks up the ascii codec:
        encodings.ascii, archived, is then imported plainly (it once waited
        for the lock its own import held: a hang)."""
        (tmp_path / "main.py").write_text("import json; print('ok')\n")
        img = str(tmp_path / "a.img")
        run_python(["-X", "dev", "main.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["-X", "dev", "main.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1, timeout=60)
        assert (r.rc, r.out) == (0, "ok\n") and not r.warnings(), r
        assert "json" in r.served(), r

    def test_dev_mode_extension_import_first(self, tmp_path):
        """CPython's test_cmd_line test_xdev: under -X dev the first archived
        import is encodings.ascii, looked up while an extension loads; the
        native load looks the codec up again.  It found this import's module
        still empty in sys.modules ("archive ignored: unknown encoding:
        ascii"), and once the native module was opened there, importlib ran
        encodings.ascii twice (a finder's nested import completed it).  Under
        -X dev the native module is opened at start-up, before the finder is
        on sys.meta_path: encodings.ascii is imported once, as plainly."""
        code = "import _testcapi, json; print(json.dumps([1]))"
        img = str(tmp_path / "a.img")
        flags = ["-X", "dev", "-X", "importtime", "-c", code]
        plain = run_python(flags, cwd=tmp_path)
        run_python(["-X", "dev", "-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(flags, cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1, timeout=60)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n") and not r.warnings(), r
        assert "json" in r.served(), r

        def runs(run):    # -X importtime: one line per module body run
            return sum(ln.rsplit("|", 1)[-1].strip() == "encodings.ascii"
                       for ln in run.err.splitlines() if ln.startswith("import time:"))
        assert runs(r) == runs(plain), (plain.err, r.err)    # 3.11: 1 (2 before)

    def test_api_dump_in_a_share_run_archives_served_modules(self, tmp_path):
        """Modules served from an archive (pycds.share.ArchivedCode) are archived
        by a dump in the same process like the others."""
        lst = tmp_path / "mods.lst"
        lst.write_text("json\n")
        first, second = str(tmp_path / "a.img"), str(tmp_path / "b.img")
        run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=first)
        r = run_python(["-c", "import json, pycds; n = pycds.stats()['served']; "
                        f"pycds._dump({str(lst)!r}, {second!r}); print(n > 0)"],
                       cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=first)
        assert r.rc == 0 and r.out == "True\n", r
        s = run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=second, PYCDSVERBOSE=1)
        assert {"json", "json.decoder", "json.scanner"} <= set(s.served()), s

    def test_unwritable_target_warns_keeps_exit_status(self, tmp_path):
        (tmp_path / "plainfile").write_text("")
        img = str(tmp_path / "plainfile" / "sub" / "a.img")   # under a file: fails even as root
        r = run_python(["-c", "import json; print('x'); raise SystemExit(4)"],
                       cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (4, "x\n")
        assert len(r.warnings()) == 1 and "no archive was written" in r.warnings()[0], r
