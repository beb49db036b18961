"""End to end: plain, DUMP and SHARE runs in fresh interpreters must agree,
and the share run must really serve the modules from the archive."""

import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from pycds import _archive

from support import clean_env, dump_and_share, installed, run_python, settle


class TestRoundTrip:
    def test_package_identical_and_served(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app_shop.py"], workspace, img)
        assert plain.rc == 3, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        served = set(share.served())
        assert {"shopkit", "shopkit.catalog", "shopkit.pricing"} <= served
        # stdlib modules imported from source are served too
        assert {"dataclasses", "inspect", "pickle", "asyncio"} <= served
        assert not share.warnings(), share.err
        assert os.stat(img).st_mode & 0o777 == 0o644

    def test_traceback_has_source_lines(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        plain, _, share = dump_and_share(["app_shop.py"], workspace, img)
        assert "return 1 / 0" in share.out
        if hasattr(types.CodeType, "co_positions"):
            # 3.11+ (PEP 657): carets from the archived co_positions
            assert "~~^~~" in share.out
        assert share.out == plain.out

    def test_stats_report_served_modules(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        src = ("import pycds, shopkit, json; s = pycds.stats(); "
               "print(s['served'] >= 3, s['archive'] is not None, s['load_ms'] >= 0, "
               "s['bytes_loaded'] > 0)")
        run_python(["-c", src], cwd=workspace, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["-c", src], cwd=workspace, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.split() == ["True"] * 4, r

    def test_stats_have_the_same_keys_when_off(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        src = "import pycds, json; print(sorted(pycds.stats()))"
        off = run_python(["-c", src], cwd=workspace)
        run_python(["-c", src], cwd=workspace, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        on = run_python(["-c", src], cwd=workspace, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert off.out == on.out and "startup_plain" in on.out, (off, on)

    def test_exit_paths_still_dump(self, tmp_path):
        (tmp_path / "m.py").write_text("X = 1\n")
        for code, rc in (("import m; raise SystemExit(7)", 7),
                         ("import m; raise KeyError('k')", 1)):
            img = str(tmp_path / f"a{rc}.img")
            r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
            assert r.rc == rc
            assert os.path.exists(img), r
            s = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE=1)
            assert s.rc == rc and "m" in s.served(), s

    def test_the_dump_api(self, tmp_path):
        (tmp_path / "m.py").write_text("X = 1\n")
        (tmp_path / "n.py").write_text("Y = 2\n")
        img = tmp_path / "api.img"
        r = run_python(["-c", f"import m, pycds; print(pycds.dump({str(img)!r}, ['n', 'nope']))"],
                       cwd=tmp_path)
        assert r.rc == 0 and int(r.out) > 2, r
        assert "module 'nope' not archived: importing it raised ModuleNotFoundError" \
            in r.err, r
        names = {e.name for e in _archive.Index.open(str(img)).entries()}
        assert {"m", "n"} <= names and "pycds" not in names
        s = run_python(["-c", "import m, n; print(m.X + n.Y)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
        assert s.out == "3\n" and {"m", "n"} <= set(s.served()), s
        # No path given: $PYCDSARCHIVE, as a DUMP run would use.
        env_img = tmp_path / "env.img"
        r = run_python(["-c", "import m, pycds; pycds.dump()"], cwd=tmp_path,
                       PYCDSARCHIVE=str(env_img))
        assert r.rc == 0 and "m" in {e.name for e in _archive.Index.open(str(env_img)).entries()}
        r = run_python(["-c", "import pycds; pycds.dump('x.img', [b'm'])"], cwd=tmp_path)
        assert "TypeError: module names are str, not bytes" in r.err, r

    @pytest.mark.parametrize("length", [214, 226, 240, 255])
    def test_archive_names_up_to_name_max_are_written(self, tmp_path, length):
        # The temporary name made from the archive's name must fit NAME_MAX
        # (255 bytes) too; two-byte characters end some cuts mid-character.
        (tmp_path / "m.py").write_text("X = 1\n")
        name = ("\u00e9" * 200 + "a" * 255).encode()[:length - 4].decode("utf-8", "ignore")
        name = name + "x" * (length - 4 - len(name.encode())) + ".img"
        assert len(name.encode()) == length
        img = str(tmp_path / name)
        for _ in range(2):      # the second one replaces the first
            r = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=img)
            assert r.rc == 0 and r.err == "", r
        assert sorted(set(os.listdir(tmp_path)) - {"__pycache__"}) == sorted(["m.py", name])
        s = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "m" in s.served(), s

    def test_two_dumps_write_the_same_heap(self, tmp_path):
        """The heap and relocations of an archive are a function of the
        code archived: two DUMP runs of one program (one PYTHONHASHSEED, for
        the frozensets' order) write the same bytes.  Stale process memory
        copied with an object (padding its constructor never writes: 3.11's
        code objects, found by valgrind) made them differ; the header's
        archive id, time and the checksums keyed by that id legitimately
        do."""
        for i in range(3):
            src = "".join(
                f"def f{j}(a, b={j}, *, c='{i}.{j}'):\n"
                f"    return [a * b for _ in range({j})], lambda: c\n"
                for j in range(40))
            (tmp_path / f"det{i}.py").write_text(
                f'"""Module {i}."""\n{src}'
                f"class K{i}:\n    S = frozenset({{'x', 'y', {i}}})\n"
                f"    def m(self):\n        return {2 ** 70 + i}, -{i}.5, {i}j\n")
            installed(tmp_path / f"det{i}.py")
        settle(tmp_path)
        code = "import det0, det1, det2, json"
        heaps = []
        for n in (1, 2):
            img = tmp_path / f"a{n}.img"
            r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=str(img), PYTHONHASHSEED=0)
            assert r.rc == 0 and os.path.exists(img), r
            data = img.read_bytes()
            h = _archive.Header.unpack(data)
            assert h.nmodules >= 4
            heaps.append((h.heap_len, h.reloc_count,
                          data[h.heap_off:h.heap_off + h.heap_len],
                          data[h.reloc_off:h.reloc_off + 4 * h.reloc_count]))
        (len1, n1, heap1, rel1), (len2, n2, heap2, rel2) = heaps
        assert (len1, n1) == (len2, n2)
        assert rel1 == rel2
        diff = [i for i, (a, b) in enumerate(zip(heap1, heap2)) if a != b]
        assert not diff, f"{len(diff)} heap bytes differ, first at {diff[:8]}"


    def test_the_loader_is_plain_imports(self, tmp_path):
        """Exact type, repr, equality and pickling, before and after the
        module ran (CPython's test_import looks loaders up by exact type)."""
        (tmp_path / "m.py").write_text("X = 1\n")
        (tmp_path / "use.py").write_text(textwrap.dedent('''\
            import copy, importlib.util, pickle, sys
            from importlib.machinery import SourceFileLoader
            spec = importlib.util.find_spec("m")
            print(type(spec.loader) is SourceFileLoader, repr(spec.loader).split(" at ")[0])
            again = importlib.util.find_spec("m")
            print(again == spec, again.loader == spec.loader, len({again.loader, spec.loader}))
            early = copy.deepcopy(spec)
            print(type(early.loader).__name__, early.loader.get_code("m").co_filename == spec.origin)
            print(pickle.loads(pickle.dumps(spec.loader)).get_code("m").co_names)
            fresh = SourceFileLoader("m", spec.origin)
            print(b"pycds" in pickle.dumps(spec), vars(early.loader) == vars(fresh),
                  vars(copy.copy(spec.loader)) == vars(fresh))
            # two threads running one spec both get code (one holding the
            # get_code it looked up before the other's call)
            stale = spec.loader.get_code
            print(type(spec.loader.get_code("m")).__name__, type(stale("m")).__name__)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["m"] = mod
            spec.loader.exec_module(mod)
            fresh = SourceFileLoader("m", spec.origin)
            print(mod.X, spec.loader == fresh, vars(spec.loader) == vars(fresh))
            print({SourceFileLoader: "pure Python"}[type(mod.__loader__)])
            print(pickle.loads(pickle.dumps(mod.__spec__)) == mod.__spec__,
                  copy.deepcopy(mod.__spec__) == mod.__spec__)
            print(mod.__loader__.get_code("m").co_names)
            '''))
        img = str(tmp_path / "a.img")
        run_python(["use.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python(["use.py"], cwd=tmp_path)
        r = run_python(["use.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert plain.rc == 0 and plain.out.splitlines()[0] == (
            "True <_frozen_importlib_external.SourceFileLoader object"), plain
        assert r.rc == 0 and r.out == plain.out, (plain, r)
        assert "m" in r.served() and not r.warnings(), r


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


# A module rules.py of LIMIT = <limit>, the command printing it, the archive.
RULES_CMD = ["-c", "import rules; print(rules.LIMIT)"]


def dumped_rules(tmp_path, limit, **env):
    """rules.py written, then archived by a DUMP run of RULES_CMD (with
    ``env``); returns (its path, the archive's path)."""
    mod = tmp_path / "rules.py"
    mod.write_text(f"LIMIT = {limit}\n")
    img = str(tmp_path / "a.img")
    run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img, **env)
    return mod, img


class TestStaleSources:
    def test_edit_after_dump_runs_new_code(self, tmp_path):
        mod, img = dumped_rules(tmp_path, 10)
        cmd = RULES_CMD
        st = os.stat(mod)
        mod.write_text("LIMIT = 999\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
        r = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out.strip() == "999", r
        assert any("fallback rules: source changed" in f for f in r.fallbacks())

    def test_an_edit_before_a_lazy_module_runs_is_seen(self, tmp_path):
        """importlib.util.LazyLoader runs the module at its first attribute
        access: a source changed after find_spec is the one plain import
        runs (SHARE ran the dumped code)."""
        (tmp_path / "mymod.py").write_text('VERSION = "v1"\n')
        (tmp_path / "main.py").write_text(textwrap.dedent("""\
            import importlib.util, sys
            spec = importlib.util.find_spec("mymod")
            spec.loader = importlib.util.LazyLoader(spec.loader)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["mymod"] = mod
            spec.loader.exec_module(mod)
            with open("mymod.py", "w") as f:
                f.write('VERSION = "v2.0"\\n')
            print(mod.VERSION)
            """))
        img = str(tmp_path / "a.img")
        run_python(["-c", "import mymod"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        src = (tmp_path / "mymod.py").read_text()
        st = os.stat(tmp_path / "mymod.py")
        (pyc,) = tmp_path.glob("__pycache__/mymod.*.pyc")
        pyc_bytes, pyc_st = pyc.read_bytes(), os.stat(pyc)
        plain = run_python(["main.py"], cwd=tmp_path)
        assert plain.out == "v2.0\n", plain
        # Back as the dump left them (plain import wrote a .pyc of v2.0).
        (tmp_path / "mymod.py").write_text(src)
        os.utime(tmp_path / "mymod.py", ns=(st.st_atime_ns, st.st_mtime_ns))
        pyc.write_bytes(pyc_bytes)
        os.utime(pyc, ns=(pyc_st.st_atime_ns, pyc_st.st_mtime_ns))
        r = run_python(["main.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out == "v2.0\n", r
        assert "[pycds] fallback mymod: source changed since it was found" in r.fallbacks()

    def test_same_second_same_size_edit_matches_plain(self, tmp_path):
        # The .pyc header keeps whole seconds, so plain Python itself keeps
        # running the cached code here, and so does pycds: the dumped .pyc
        # is still valid for the source.
        mod, img = dumped_rules(tmp_path, 10)
        cmd = RULES_CMD
        st = os.stat(mod)
        mod.write_text("LIMIT = 99\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        snapshot = {p: (p.read_bytes(), os.stat(p)) for p in tmp_path.rglob("*.pyc")}
        plain = run_python(cmd, cwd=tmp_path)
        for p, (data, pst) in snapshot.items():
            p.write_bytes(data)
            os.utime(p, ns=(pst.st_atime_ns, pst.st_mtime_ns))
        r = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out == plain.out == "10\n", (plain, r)
        # The dumped .pyc, still valid for the source: what plain runs.
        assert "rules" in r.served(), r

    def test_edit_keeping_stat_without_pyc_is_seen(self, tmp_path):
        # No .pyc anywhere, so plain Python compiles the source it finds:
        # an edit that keeps size and mtime (mtimes clamped by a build, or
        # forged back) is what plain import runs, and so must SHARE.
        mod, img = dumped_rules(tmp_path, 10, PYTHONDONTWRITEBYTECODE=1)
        cmd = RULES_CMD
        st = os.stat(mod)
        mod.write_text("LIMIT = 77\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))   # mtime forged back
        plain = run_python(cmd, cwd=tmp_path, PYTHONDONTWRITEBYTECODE=1)
        for check in ("mtime", "hash"):
            r = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                           PYCDSCHECK=check, PYCDSVERBOSE=1, PYTHONDONTWRITEBYTECODE=1)
            assert plain.out.strip() == r.out.strip() == "77", (check, plain, r)
            assert any("source hash differs" in f for f in r.fallbacks()), r

    def test_edit_keeping_stat_with_a_rewritten_pyc_is_seen(self, tmp_path):
        # A release keeps the source's size and (clamped) mtime and its
        # installer compiles the .pyc again: plain import runs the new .pyc.
        lib = tmp_path / "lib"
        lib.mkdir()
        mod = lib / "mylib.py"
        mod.write_text('VERSION = "1.0.1"\n')
        os.utime(mod, (1700000000, 1700000000))
        compileall = [sys.executable, "-m", "compileall", "-q", str(lib)]
        subprocess.run(compileall, check=True, env=clean_env())
        img = str(tmp_path / "a.img")
        cmd = ["-c", "import mylib; print(mylib.VERSION)"]
        d = run_python(cmd, cwd=tmp_path, PYTHONPATH=str(lib), PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img)
        assert d.out.strip() == "1.0.1", d
        # Unchanged: served, the .pyc's stat is all it takes.
        r = run_python(cmd, cwd=tmp_path, PYTHONPATH=str(lib), PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.strip() == "1.0.1" and "mylib" in r.served(), r
        mod.write_text('VERSION = "1.0.2"\n')
        os.utime(mod, (1700000000, 1700000000))
        subprocess.run(compileall[:3] + ["-f"] + compileall[3:], check=True,
                       env=clean_env())
        plain = run_python(cmd, cwd=tmp_path, PYTHONPATH=str(lib))
        r = run_python(cmd, cwd=tmp_path, PYTHONPATH=str(lib), PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert plain.out.strip() == r.out.strip() == "1.0.2", (plain, r)
        assert any("source hash differs" in f for f in r.fallbacks()), r
        # The .pyc compiled again from the same source: served again.
        mod.write_text('VERSION = "1.0.1"\n')
        os.utime(mod, (1700000000, 1700000000))
        subprocess.run(compileall[:3] + ["-f"] + compileall[3:], check=True,
                       env=clean_env())
        r = run_python(cmd, cwd=tmp_path, PYTHONPATH=str(lib), PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.strip() == "1.0.1" and "mylib" in r.served(), r

    def test_edit_keeping_stat_past_a_stale_pyc_is_seen(self, tmp_path):
        # A .pyc of an older source that plain import cannot replace (here:
        # bytecode writing off) is passed over: plain import compiles the
        # source at every run, so a same-stat edit is what it runs.
        import py_compile
        mod = tmp_path / "rules.py"
        mod.write_text("LIMIT = 1\n")
        py_compile.compile(str(mod), doraise=True)
        mod.write_text("LIMIT = 22\n")          # the .pyc's header is stale now
        img = str(tmp_path / "a.img")
        cmd = ["-c", "import rules; print(rules.LIMIT)"]
        d = run_python(cmd, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                       PYTHONDONTWRITEBYTECODE=1)
        assert d.out.strip() == "22", d
        st = os.stat(mod)
        mod.write_text("LIMIT = 33\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        plain = run_python(cmd, cwd=tmp_path, PYTHONDONTWRITEBYTECODE=1)
        r = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYTHONDONTWRITEBYTECODE=1)
        assert plain.out.strip() == r.out.strip() == "33", (plain, r)
        assert any("source hash differs" in f for f in r.fallbacks()), r

    def test_another_pycache_prefix_at_share_is_seen(self, tmp_path):
        # PYTHONPYCACHEPREFIX set for the SHARE run only: plain import looks
        # for another .pyc (none there) and compiles the source.
        mod, img = dumped_rules(tmp_path, 10)
        st = os.stat(mod)
        mod.write_text("LIMIT = 44\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        prefix = str(tmp_path / "prefix")
        # Plain import compiles the source and writes a .pyc there: so
        # does the SHARE run (plainly: not the dumped source); then that
        # .pyc is what plain import runs.
        r = run_python(RULES_CMD, cwd=tmp_path, PYTHONPYCACHEPREFIX=prefix,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert any("source hash differs" in f for f in r.fallbacks()), r
        assert list((tmp_path / "prefix").rglob("rules.*.pyc")), r
        plain = run_python(RULES_CMD, cwd=tmp_path, PYTHONPYCACHEPREFIX=prefix)
        again = run_python(RULES_CMD, cwd=tmp_path, PYTHONPYCACHEPREFIX=prefix,
                           PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert plain.out.strip() == r.out.strip() == again.out.strip() == "44", \
            (plain, r, again)
        assert any("source hash differs" in f for f in again.fallbacks()), again

    # What a run leaves in __pycache__, and whether it served rules.
    def _pycs(self, tmp_path):
        return {p.name: p.read_bytes() for p in tmp_path.glob("__pycache__/rules.*.pyc")}

    def test_a_removed_pyc_is_served_and_not_written(self, tmp_path):
        # Plain import compiles the source and writes a .pyc; SHARE serves
        # the archived code once the source's hash matches, and writes none
        # (the archived code marshalled again is not what a compile gives:
        # docs/importer-compliance.md).  The next plain run writes it.
        mod, img = dumped_rules(tmp_path, 10)
        assert self._pycs(tmp_path)
        shutil.rmtree(tmp_path / "__pycache__")
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out.strip() == "10" and "rules" in r.served(), r
        assert not self._pycs(tmp_path)

    def test_an_invalid_pyc_is_passed_over(self, tmp_path):
        mod, img = dumped_rules(tmp_path, 10)
        (pyc,) = tmp_path.glob("__pycache__/rules.*.pyc")
        bad = b"\0\0\0\0" + pyc.read_bytes()[4:]      # bad magic
        pyc.write_bytes(bad)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out.strip() == "10" and "rules" in r.served(), r
        # A same-size edit behind it is what plain import compiles.
        st = os.stat(mod)
        mod.write_text("LIMIT = 66\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        pyc.write_bytes(bad)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out.strip() == "66", r
        assert any("source hash differs" in f for f in r.fallbacks()), r

    def test_a_touched_source_is_served(self, tmp_path):
        # mtime moved, bytes unchanged (touch, a copy without -p, a fresh
        # checkout): plain import passes over the .pyc (its header holds
        # the old mtime) and compiles the same code.
        mod, img = dumped_rules(tmp_path, 10)
        st = os.stat(mod)
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out.strip() == "10" and "rules" in r.served(), r
        # A same-size edit with it is not served.
        mod.write_text("LIMIT = 77\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 9_000_000_000))
        plain = run_python(RULES_CMD, cwd=tmp_path, PYTHONDONTWRITEBYTECODE=1)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert plain.out.strip() == r.out.strip() == "77", (plain, r)
        assert any("source hash differs" in f for f in r.fallbacks()), r

    def test_no_pyc_where_none_can_be_written_is_served(self, tmp_path):
        # Bytecode writing off, or a cache directory that cannot be made
        # (a file in its way, as on a read-only install): plain import
        # compiles the source at every run and writes nothing; the
        # archived code is served once the source's hash matches.
        mod, img = dumped_rules(tmp_path, 10)
        shutil.rmtree(tmp_path / "__pycache__")
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYTHONDONTWRITEBYTECODE=1)
        assert r.out.strip() == "10" and "rules" in r.served(), r
        (tmp_path / "blocker").write_text("")
        prefix = str(tmp_path / "blocker" / "prefix")
        plain = run_python(RULES_CMD, cwd=tmp_path, PYTHONPYCACHEPREFIX=prefix)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYTHONPYCACHEPREFIX=prefix)
        assert plain.out == r.out and "rules" in r.served(), (plain, r)
        assert not self._pycs(tmp_path)

    def test_an_unchecked_hash_pyc_runs_as_plain_import_runs_it(self, tmp_path):
        # Plain import runs an unchecked hash-based .pyc whatever the source
        # holds: here one compiled from other code.
        import py_compile
        mod, img = dumped_rules(tmp_path, 10)
        (pyc,) = tmp_path.glob("__pycache__/rules.*.pyc")
        src = mod.read_bytes()
        st = os.stat(mod)
        mod.write_text("LIMIT = 55\n")
        py_compile.compile(str(mod), cfile=str(pyc), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        mod.write_bytes(src)
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        plain = run_python(RULES_CMD, cwd=tmp_path)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert plain.out.strip() == r.out.strip() == "55", (plain, r)
        assert "[pycds] fallback rules: an unchecked hash-based .pyc replaced the " \
               "dumped one" in r.fallbacks(), r

    # SHARE of RULES_CMD printing how often rules.py itself was opened.
    COUNT_OPENS = ("import sys\n"
                   "opens = []\n"
                   "sys.addaudithook(lambda e, a: e == 'open' and "
                   "str(a[0]).endswith('rules.py') and opens.append(a))\n"
                   "import rules; print(rules.LIMIT, len(opens))\n")

    def test_clamped_times_on_source_and_pyc_need_the_hash_mode(self, tmp_path):
        # A build that sets every file's mtime to one value and compiles a
        # same-size release again: the .pyc's stat is the dumped one's.
        # The default mode takes it for the dumped .pyc (the documented
        # limit: hashing every .pyc no newer than its source would cost a
        # read of most sources of tar and Docker installs, whose mtimes are
        # whole seconds); PYCDSCHECK=hash, for such builds, runs the new.
        mod = tmp_path / "rules.py"
        clamp = 1700000000

        def build(limit):
            import py_compile
            mod.write_text(f"LIMIT = {limit}\n")
            os.utime(mod, (clamp, clamp))
            pyc = py_compile.compile(str(mod), doraise=True)   # header: the clamp
            os.utime(pyc, (clamp, clamp))

        build(10)
        img = str(tmp_path / "a.img")
        run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["-c", self.COUNT_OPENS], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.split() == ["10", "0"] and "rules" in r.served(), r
        build(77)
        plain = run_python(RULES_CMD, cwd=tmp_path)
        r = run_python(RULES_CMD, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSCHECK="hash", PYCDSVERBOSE=1)
        assert plain.out.strip() == r.out.strip() == "77", (plain, r)
        assert any("source hash differs" in f for f in r.fallbacks()), r

    def test_a_source_touched_within_the_pycs_second_costs_no_source_read(self, tmp_path):
        # The dumped .pyc is still valid for it: plain import opens no
        # source, and an audit hook must see none from pycds either.
        mod, img = dumped_rules(tmp_path, 10)
        st = os.stat(mod)
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns - st.st_mtime_ns % 10**9))
        r = run_python(["-c", self.COUNT_OPENS], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.split() == ["10", "0"] and "rules" in r.served(), r

    def test_a_pyc_as_left_costs_no_source_read(self, tmp_path):
        mod, img = dumped_rules(tmp_path, 10)
        r = run_python(["-c", self.COUNT_OPENS], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.split() == ["10", "0"] and "rules" in r.served(), r

    def test_forged_mtime_with_the_dumped_pyc_runs_what_plain_runs(self, tmp_path):
        # With the .pyc the dump saw still in place, plain import trusts
        # its header (source mtime in seconds and size) and runs the old
        # code: the default mode serves the same; PYCDSCHECK=hash reads the
        # source, sees the edit and leaves the module to plain import,
        # which runs that .pyc all the same.
        mod, img = dumped_rules(tmp_path, 10)
        cmd = RULES_CMD
        assert list(tmp_path.glob("__pycache__/rules.*.pyc"))
        st = os.stat(mod)
        mod.write_text("LIMIT = 77\n")
        os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
        plain = run_python(cmd, cwd=tmp_path)
        default = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                             PYCDSVERBOSE=1)
        hashed = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                            PYCDSCHECK="hash", PYCDSVERBOSE=1)
        assert plain.out.strip() == default.out.strip() == hashed.out.strip() == "10", \
            (plain, default, hashed)
        assert "rules" in default.served(), default
        assert any("source hash differs" in f for f in hashed.fallbacks()), hashed

    def test_deleted_source_falls_back(self, tmp_path):
        (tmp_path / "gone.py").write_text("print('here')\n")
        img = str(tmp_path / "a.img")
        cmd = ["-c", "import gone"]
        run_python(cmd, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        os.unlink(tmp_path / "gone.py")
        plain = run_python(cmd, cwd=tmp_path)
        r = run_python(cmd, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (plain.rc, plain.out)

    def test_shadowing_file_on_sys_path_wins(self, tmp_path):
        (tmp_path / "config.py").write_text("NAME = 'base'\n")
        (tmp_path / "over").mkdir()
        img = str(tmp_path / "a.img")
        code = ("import sys; sys.path.insert(0, 'over'); import config; "
                "print(config.NAME)")
        run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        (tmp_path / "over" / "config.py").write_text("NAME = 'override'\n")
        r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.strip() == "override", r
        assert any("resolves to another file" in f for f in r.fallbacks())


class TestProgramExceptions:
    """What the program raises while pycds's code runs inside an import (a
    signal handler, a trace function, its stack depth) propagates as out of
    plain import's code, and the archive stays in use: it is no fault of
    the archive (pycds.errors.program_raised)."""

    MODULES = ["json", "email.message", "argparse", "decimal", "csv", "string",
               "textwrap", "calendar", "fractions", "difflib", "pprint", "shlex"]

    def _dump(self, tmp_path):
        img = str(tmp_path / "a.img")
        d = run_python(["-c", "import " + ", ".join(self.MODULES)], cwd=tmp_path,
                       PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0, d
        return img

    REPORT = textwrap.dedent("""
        import pycds.share as f
        print("disabled", f._installed.archive.disabled, "served", f.stats()["served"])
    """)

    # The native hit path declining every name, so that the index is read
    # and the files stat'ed in Python (pycds._archive, pycds._pyc), as for
    # an entry the native lookup does not take.  Set after a first import,
    # which opens the archive.
    DECLINE = textwrap.dedent("""
        import inspect, pycds.share
        class Declining:
            serving = False
            def hit(self, *args):
                return False
            def find(self, *args):
                return False
        pycds.share._installed.archive.fast = Declining()
    """)

    def _import_under_tracer(self, tmp_path, tracer, exc):
        """SHARE run of: ``tracer`` (source defining ``tracer``, which
        raises ``exc`` somewhere in pycds's code) set, ``import json``,
        then a plain-again ``import csv``; asserts the program caught
        ``exc`` and the archive stayed in use.  Returns the run."""
        img = self._dump(tmp_path)
        prog = self.DECLINE + textwrap.dedent(tracer) + textwrap.dedent(f"""
            sys.settrace(tracer)
            try:
                import json
            except {exc} as e:
                print("raised", e)
            sys.settrace(None)
            import csv
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.rc == 0 and r.warnings() == [], r
        lines = r.out.splitlines()
        assert lines[0] == "raised from the trace function", r
        disabled, served = lines[-1].split()[1::2]
        assert disabled == "False" and int(served) >= 1, r
        return r

    def test_trace_function_exception_propagates(self, tmp_path):
        self._import_under_tracer(tmp_path, """
            import sys
            class Stop(Exception):
                pass
            def tracer(frame, event, arg):
                if event == "call" and frame.f_code.co_name == "lookup" \\
                        and frame.f_code.co_filename.endswith("_archive.py"):
                    raise Stop("from the trace function")
                return None
        """, "Stop")

    def test_os_error_of_the_program_inside_a_stat_propagates(self, tmp_path):
        # A TimeoutError (an OSError) raised where pycds stats a source, as a
        # signal handler's would be out of the interrupted os.stat: not
        # "source is gone", the program's.
        r = self._import_under_tracer(tmp_path, """
            import inspect, sys
            import pycds._pyc
            src, first = inspect.getsourcelines(pycds._pyc.stat_or_none)
            at = first + next(i for i, line in enumerate(src)
                              if "return _stat(path)" in line)
            armed = [True]
            def tracer(frame, event, arg):
                if frame.f_code.co_name == "stat_or_none" \\
                        and str(frame.f_locals.get("path")).endswith(".py"):
                    return local
                return None
            def local(frame, event, arg):
                if event == "line" and frame.f_lineno == at and armed[0]:
                    armed[0] = False
                    raise TimeoutError("from the trace function")
                return local
        """, "TimeoutError")
        assert not any("source is gone" in f for f in r.fallbacks()), r

    def test_a_replaced_os_stat_is_not_called(self, tmp_path):
        # importlib calls posix.stat as bound at start-up; so does pycds: a
        # program's replacement of os.stat (mock.patch) that refuses real
        # paths changes no import, served or plain.
        img = self._dump(tmp_path)
        prog = textwrap.dedent("""
            import os
            from unittest import mock
            def fake(path, *a, **k):
                raise FileNotFoundError(2, "fake file system", str(path))
            with mock.patch("os.stat", side_effect=fake):
                import json, csv
            print(json.dumps([csv.QUOTE_ALL]))
        """)
        plain = run_python(["-c", prog], cwd=tmp_path)
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n"), (plain, r)
        assert "json" in r.served() and r.warnings() == [], r

    def test_recursion_error_keeps_the_archive(self, tmp_path):
        img = self._dump(tmp_path)
        prog = textwrap.dedent("""
            import sys
            def dive(n):
                if n:
                    return dive(n - 1)
                try:
                    import json
                    return True
                except RecursionError:
                    return False
            d = sys.getrecursionlimit() - 20
            hit = 0
            while not dive(d):
                hit += 1
                d -= 5
            print("recursion errors", hit)
            import email.message, argparse, decimal
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.warnings() == [], r
        assert int(r.out.split()[2]) >= 1, r      # the import did hit the limit
        disabled, served = r.out.splitlines()[-1].split()[1::2]
        assert disabled == "False" and int(served) >= 4, r

    @pytest.mark.parametrize("exc", ["ImportError", "RuntimeError"])
    def test_program_refusing_the_native_module(self, tmp_path, exc):
        # A sandbox's audit hook refuses imports the program never makes
        # itself, such as the native module's _cffi_backend: that is a
        # reason not to use the archive (one warning), not an error of the
        # program's import of json.  (A meta path finder of the program is
        # not asked for it: pycds's dependency comes from where pycds was
        # found at start-up, test_the_programs_own_cffi_backend_is_its_own.)
        img = self._dump(tmp_path)
        prog = textwrap.dedent(f"""
            import sys
            def sandbox(event, args):
                if event == "import" and args[0] == "_cffi_backend":
                    raise {exc}("blocked by the sandbox")
            sys.addaudithook(sandbox)
            import json
            print(json.dumps([1]))
        """)
        plain = run_python(["-c", prog], cwd=tmp_path)
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n"), (plain, r)
        assert len(r.warnings()) == 1 and "blocked by the sandbox" in r.warnings()[0], r

    def test_signal_handler_exception_propagates(self, tmp_path):
        img = self._dump(tmp_path)
        prog = textwrap.dedent(f"""
            import importlib, signal, sys
            class Timeout(Exception):
                pass
            def on_alarm(sig, frame):
                raise Timeout()
            signal.signal(signal.SIGALRM, on_alarm)
            names = {self.MODULES!r}
            timeouts = 0
            for i in range(200):
                name = names[i % len(names)]
                sys.modules.pop(name, None)
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0.00002 * (1 + i % 40))
                    try:
                        importlib.import_module(name)
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                except Exception as e:
                    # the module body's own code may wrap it, as plain
                    # Python does: 3.12's enum turns an exception inside
                    # __set_name__ into a TypeError whose context is it
                    cause = e
                    while cause is not None and not isinstance(cause, Timeout):
                        cause = cause.__context__
                    if cause is None:
                        raise
                    timeouts += 1
            print("timeouts", timeouts)
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.warnings() == [], r
        assert int(r.out.split()[1]) >= 1, r
        disabled, _ = r.out.splitlines()[-1].split()[1::2]
        assert disabled == "False", r


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


class TestWideStrings:
    """Archived strs reach the wchar_t C API as unmarshalled ones do (3.10
    and 3.11 share a 4-byte-kind str's code units as its wstr; an archived
    copy without it passed non-BMP text on as UTF-16 halves)."""

    CONSTS = textwrap.dedent('''\
        S4 = "\\U00010000\\U0010ffff"
        MIXED = "UCS:\\xe9\\u20ac\\U0010ffff"
        EMOJI = "x\\U0001f600y"
        BMP = "\\u4e2d\\u6587"
        LATIN = "caf\\xe9"
        IDENT = "a non-BMP identifier"
        NAMES = tuple(n for n in dir() if not n.startswith("_"))
        ''')
    APP = textwrap.dedent('''\
        import ctypes, locale
        import consts
        for name in consts.NAMES:
            s = getattr(consts, name)
            if not isinstance(s, str):
                continue
            buf = ctypes.create_unicode_buffer(s)
            print(name, ascii(buf[:]), ascii(buf.value), len(buf))
            print(name, ascii(locale.strxfrm(s)), s.isidentifier())
        print(ascii(consts.NAMES))
        ''')

    def test_non_bmp_constants_through_wchar_t(self, tmp_path):
        # An identifier of a non-BMP letter (U+10000, LINEAR B SYLLABLE
        # B008 A): an interned 4-byte-kind str.
        src = self.CONSTS.replace("IDENT", "\U00010000")
        (tmp_path / "consts.py").write_text(src, encoding="utf-8")
        (tmp_path / "app.py").write_text(self.APP)
        installed(tmp_path / "consts.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img)
        assert plain.rc == 0, plain
        assert "'\\U00010000\\U0010ffff\\x00'" in plain.out, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "consts" in share.served(), share
        verified = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                              PYCDSARCHIVE=img, PYCDSVERIFY=1, PYCDSVERBOSE=1)
        assert (verified.rc, verified.out) == (plain.rc, plain.out), verified
        assert "consts" in verified.served(), verified


class TestManyInternedStrings:
    """A module whose load re-interns more strings than one growth of the
    interned dict makes room for (3.13 reserves that room before interning,
    pycds/native layout_313.h): served, in batches, as plain import runs it.
    It used to spin for good in the reservation."""

    def test_more_strings_than_one_resize_makes_room_for(self, tmp_path):
        names = ", ".join(f'"name_{i}"' for i in range(60000))
        (tmp_path / "many.py").write_text(f"NAMES = ({names},)\n")
        (tmp_path / "app.py").write_text(
            "import sys, many\n"
            "print(len(many.NAMES), sum(sys.intern(n) is n for n in many.NAMES))\n")
        installed(tmp_path / "many.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img)
        assert (plain.rc, plain.out) == (0, "60000 60000\n"), plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "many" in share.served() and not share.warnings(), share


class TestFrozensetOrder:
    """A frozenset constant iterates as plain import's does: unmarshal adds
    its items in the order the .pyc holds them (3.11+: sorted by their own
    marshalled bytes), and so does the load (3.10 writes them in the writing
    process's order, unknown to the dump: only the items are compared)."""

    CONSTS = textwrap.dedent('''\
        def ints(x):
            return x in {0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120,
                         128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 256, 384, 392}
        def mixed(x):
            return x in {"name", "not an identifier", 10 ** 20, 2.5, -7, (1, "t"), b"b", 1j}
        def strs(x):
            return x in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta",
                         "theta", "iota", "kappa", "lambda", "mu", "nu", "xi"}
        def shared(x):
            return x in {10 ** 20, 2.5}, 2.5
        ''')
    APP = textwrap.dedent('''\
        import consts
        for f in (consts.ints, consts.mixed, consts.strs, consts.shared):
            fs, = [c for c in f.__code__.co_consts if type(c) is frozenset]
            print(f.__name__, [repr(v) for v in fs] if f.__name__ in ORDER
                  else sorted(map(repr, fs)))
        ''')

    @pytest.mark.parametrize("seed", ["0", "1", "random"])
    def test_iteration_order_is_plains(self, tmp_path, seed):
        (tmp_path / "consts.py").write_text(self.CONSTS)
        # Where the order is plain's own on every run: strs only under one
        # PYTHONHASHSEED.
        order = {"ints", "shared"} | ({"mixed", "strs"} if seed != "random" else set())
        if sys.version_info < (3, 11):
            order = set()
        (tmp_path / "app.py").write_text(f"ORDER = {sorted(order)}\n" + self.APP)
        installed(tmp_path / "consts.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        env = {"PYTHONHASHSEED": seed}
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img, extra_env=env)
        assert plain.rc == 0, plain
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "consts" in share.served(), share


# The companion's dependencies, made unimportable (as in a venv of plain
# `pip install pycds`) by a .pth-free blocker in the child itself.
_NO_BF16_DEPS = ("import sys\n"
                 "for _m in ('numpy', 'ml_dtypes', 'safetensors'):\n"
                 "    sys.modules[_m] = None\n")


def test_the_hook_needs_none_of_the_companions_dependencies(tmp_path):
    (tmp_path / "m.py").write_text("X = 1\n")
    (tmp_path / "app.py").write_text(_NO_BF16_DEPS + "import json, m\nprint(m.X)\n")
    img = str(tmp_path / "a.img")
    for mode in ("DUMP", "SHARE", "AUTO"):
        r = run_python(["app.py"], cwd=tmp_path, PYCDSMODE=mode, PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.rc == 0 and r.out == "1\n" and r.warnings() == [], (mode, r)
    assert "m" in r.served()
    api = run_python(["-c", _NO_BF16_DEPS + "import m, pycds, pycds.auto, pycds.cli.cache\n"
                      f"print(pycds.dump({img!r}) > 0)"], cwd=tmp_path)
    assert api.out == "True\n", api


def test_importing_the_companion_without_its_dependencies_names_the_extra(tmp_path):
    r = run_python(["-c", _NO_BF16_DEPS + "import pycds.bf16"], cwd=tmp_path)
    assert r.rc == 1 and "ImportError: pycds.bf16 needs numpy" in r.err, r
    assert "pip install 'pycds[bf16]'" in r.err, r
