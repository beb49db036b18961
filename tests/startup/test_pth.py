"""The .pth activation line: inert without PYCDSMODE, never breaks start-up."""

import os

import pytest

from support import pycds_installed_pth, run_python


class TestPth:
    def test_installed_line_is_guarded(self):
        text = open(pycds_installed_pth()).read()
        assert text.startswith("import ")
        assert "'PYCDSMODE' in os.environ" in text and "ignore_environment" in text

    def test_inert_without_mode(self, tmp_path):
        r = run_python(["-c", "import sys; print(sorted(m for m in sys.modules "
                        "if m.startswith(('pycds', '_cffi'))))"], cwd=tmp_path)
        assert r.out.strip() == "[]" and r.err == "", r

    def test_share_loads_no_native_module_until_first_hit(self, tmp_path):
        img = str(tmp_path / "a.img")
        (tmp_path / "m.py").write_text("X = 1\n")
        run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        probe = ("import sys; print(sorted(m for m in sys.modules if m.startswith"
                 "(('numpy', '_cffi', 'pycds._native', 'pycds.bf16', 'cffi'))))\n")
        (tmp_path / "probe.py").write_text(probe)
        # -c too: 3.13 imports linecache for -c (to show the command's
        # source in tracebacks), which the DUMP run archived; it is imported
        # plainly (finder._imported_by_interpreter).
        for args in (["probe.py"], ["-c", probe]):
            r = run_python(args, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
            assert r.out.strip() == "[]", (args, r)

    def test_quiet_share_start_up_imports_only_the_package_and_its_settings(self, tmp_path):
        # Every module imported at start-up costs each SHARE process its
        # finding, reading and unmarshalling (docs/performance.md): start-up
        # imports the package (with the .pth entry point and its stand-in
        # finder) and its settings; the program's first import opens the
        # archive (the native module, whose reader checks it, the exceptions,
        # the finder); pycds._log only when there is a line to print, the
        # index reader, the search replay and the .pyc rules in Python only
        # for a hit the native verdict did not take.
        img = str(tmp_path / "a.img")
        (tmp_path / "m.py").write_text("X = 1\n")
        run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('pycds')))\n"
        (tmp_path / "probe.py").write_text(probe)
        r = run_python(["probe.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.strip() == str(["pycds", "pycds._config"]) and r.err == "", r
        (tmp_path / "probe.py").write_text("import json\n" + probe)
        r = run_python(["probe.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.strip() == str(["pycds", "pycds._config", "pycds._native",
                                     "pycds._native.lib", "pycds._nativeapi",
                                     "pycds.errors", "pycds.share"]) and r.err == "", r
        r = run_python(["probe.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE="2")
        assert "pycds._log" in r.out and "[pycds] not in archive json" in r.err, r

    def test_bad_setting_warns_at_start_up(self, tmp_path):
        r = run_python(["-c", "print('fine')"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(tmp_path / "missing.img"), PYCDSVERBOSE="loud")
        assert r.out == "fine\n" and r.rc == 0
        assert any("PYCDSVERBOSE='loud'" in w for w in r.warnings()), r

    def test_broken_archive_path_warns_once_and_runs(self, tmp_path):
        r = run_python(["-c", "print('fine')"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(tmp_path / "missing.img"))
        assert r.out == "fine\n" and r.rc == 0
        assert len(r.warnings()) == 1 and "ignored" in r.warnings()[0]

    def test_directory_as_archive(self, tmp_path):
        r = run_python(["-c", "print('fine')"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(tmp_path))
        assert r.out == "fine\n" and len(r.warnings()) == 1


class TestArchiveDirectory:
    def _archive(self, d):
        (d / "m.py").write_text("X = 1\n")
        img = str(d / "arch" / "a.img")
        run_python(["-c", "import m"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        return img

    def test_world_writable_directory_is_refused(self, tmp_path):
        img = self._archive(tmp_path)
        os.chmod(os.path.dirname(img), 0o777)
        r = run_python(["-c", "import m; print(m.X)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out == "1\n"
        assert len(r.warnings()) == 1 and "writable by others" in r.warnings()[0], r

    @pytest.mark.parametrize("how", ["parent", "symlink", "link in a chain"])
    def test_a_world_writable_directory_above_or_behind_a_link_is_refused(self, tmp_path,
                                                                          how):
        img = self._archive(tmp_path)
        if how == "parent":      # .../open/arch/a.img, "open" writable by others
            opened = tmp_path / "open"
            os.rename(tmp_path / "arch", tmp_path / "arch2")
            opened.mkdir()
            os.rename(tmp_path / "arch2", opened / "arch")
            os.chmod(opened, 0o777)
            used = str(opened / "arch" / "a.img")
        elif how == "symlink":   # a link in a safe directory to one in an unsafe one
            os.chmod(os.path.dirname(img), 0o777)
            (tmp_path / "safe").mkdir()
            os.symlink(img, tmp_path / "safe" / "a.img")
            used = str(tmp_path / "safe" / "a.img")
        else:                    # safe/l1 -> ../open/l2 -> ../arch: "open" is unsafe
            for d in ("safe", "open"):
                (tmp_path / d).mkdir()
            os.symlink("../arch", tmp_path / "open" / "l2")
            os.symlink("../open/l2", tmp_path / "safe" / "l1")
            os.chmod(tmp_path / "open", 0o777)
            used = str(tmp_path / "safe" / "l1" / "a.img")
        r = run_python(["-c", "import m; print(m.X)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=used)
        assert r.out == "1\n"
        assert len(r.warnings()) == 1 and "writable by others" in r.warnings()[0], r

    def test_dump_into_a_world_writable_directory_warns(self, tmp_path):
        # Written (the program's choice), but said now rather than refused
        # by every SHARE run after; a sticky directory (/tmp) is fine.
        (tmp_path / "m.py").write_text("X = 1\n")
        for mode, warned in ((0o777, True), (0o1777, False)):
            d = tmp_path / f"d{mode:o}"
            d.mkdir()
            os.chmod(d, mode)
            img = str(d / "a.img")
            r = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=img)
            assert r.rc == 0 and os.path.exists(img), r
            if warned:
                assert len(r.warnings()) == 1, r
                assert "SHARE runs will refuse it" in r.warnings()[0], r
                assert "writable by others" in r.warnings()[0], r
            else:
                assert r.warnings() == [], r

    def test_sticky_world_writable_directory_is_accepted(self, tmp_path):
        img = self._archive(tmp_path)
        os.chmod(os.path.dirname(img), 0o1777)
        r = run_python(["-c", "import m; print(m.X)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out == "1\n" and "m" in r.served() and not r.warnings(), r


def test_start_from_code_where_no_pth_is_read(tmp_path):
    # A serverless zip's packages sit on PYTHONPATH, where site reads no
    # .pth file (here: -S, site-packages on PYTHONPATH): pycds.start() does
    # the .pth line's work, for the imports after it (docs/deploy.md).
    import pycds
    site_dir = os.path.dirname(os.path.dirname(pycds.__file__))
    (tmp_path / "mod_after.py").write_text("VALUE = 42\n")
    img = str(tmp_path / "a.img")
    prog = ("import pycds, sys; pycds.start(); import mod_after; "
            "print(mod_after.VALUE, 'pycds.share' in sys.modules)")
    env = dict(PYTHONPATH=os.pathsep.join([str(tmp_path), site_dir]), PYCDSARCHIVE=img)
    r = run_python(["-S", "-c", prog], cwd=tmp_path, PYCDSMODE="DUMP", **env)
    assert r.out == "42 False\n" and os.path.exists(img), r
    r = run_python(["-S", "-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSVERBOSE="1", **env)
    assert r.out == "42 True\n" and "mod_after" in r.served() and r.warnings() == [], r
    # Without PYCDSMODE it does nothing.
    r = run_python(["-S", "-c", prog], cwd=tmp_path, **env)
    assert r.out == "42 False\n" and r.err == "", r
