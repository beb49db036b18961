"""Sources and .pyc files changed, touched, removed or shadowed after the
dump: a SHARE run runs what plain import would (pycds._pyc's freshness
check; more in tests/reliability/test_stale_sources.py)."""

import os
import shutil
import subprocess
import sys
import textwrap

from support import clean_env, run_python


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
