"""pycds._search: PathFinder's answer, replayed from the dump run's
directory stamps, must be PathFinder's answer in every case."""

import importlib.machinery
import os
import sys
import time

import pytest

from support import import_state, run_python
from pycds import _archive, _search

PathFinder = importlib.machinery.PathFinder
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]


def stamp(path):
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


# The dump trusts no directory changed in its last two seconds; these
# trees are made just before: the dump run waives that (its own
# pycds._search._RACY_NS), and each test's change comes well after.
NOT_RACY = "import pycds._search as S; S._RACY_NS = 0; "


@pytest.fixture
def tree(tmp_path):
    """early/ (empty) and base/ (smod.py, spkg/__init__.py, spkg/inner.py)
    on the search path, and an archive of the three modules made by a DUMP
    run in another directory."""
    early, base = tmp_path / "early", tmp_path / "base"
    early.mkdir()
    (base / "spkg").mkdir(parents=True)
    (base / "smod.py").write_text("X = 1\n")
    (base / "spkg" / "__init__.py").write_text("P = 1\n")
    (base / "spkg" / "inner.py").write_text("I = 1\n")
    code = (f"import sys; sys.path[:0] = [{str(early)!r}, {str(base)!r}]; "
            "import smod, spkg.inner")
    assert run_python(["-c", code], cwd=tmp_path).rc == 0     # writes __pycache__
    (tmp_path / "img").mkdir()
    img = str(tmp_path / "img" / "a.img")
    r = run_python(["-c", NOT_RACY + code], cwd=tmp_path / "img", PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
    assert r.rc == 0, r
    return early, base, _archive.Index.open(img)


def describe(spec):
    if spec is None:
        return None
    return (spec.name, type(spec.loader), getattr(spec.loader, "path", None),
            spec.origin, spec.submodule_search_locations, spec.cached,
            spec.has_location, spec.parent)


def both(index, name, path=None):
    """(replayed spec, PathFinder's spec, whether the stamps alone answered)."""
    entry = index.lookup(name)
    before = _search.replayed
    mine = _search.find_spec(name, path, None, entry.origin, entry.search)
    return describe(mine), describe(PathFinder.find_spec(name, path)), \
        _search.replayed - before


def search_path(early, base):
    return [str(early), str(base)] + sys.path


class TestReplay:
    def test_unchanged_tree_is_answered_from_the_stamps(self, tree):
        early, base, index = tree
        with import_state(path=search_path(early, base)):
            for name, path in (("smod", None), ("spkg", None),
                               ("spkg.inner", [str(base / "spkg")])):
                mine, plain, replayed = both(index, name, path)
                assert mine == plain and replayed == 1, name
                assert mine[3].startswith(str(base))

    def test_the_record_lists_the_directories_searched(self, tree):
        early, base, index = tree
        steps, pkg_dir, pkg_stamp = index.lookup("spkg").search
        assert [s[0] for s in steps[:2]] == [str(early), str(base)]
        assert pkg_dir == str(base / "spkg")
        assert pkg_stamp == stamp(pkg_dir)
        assert all(s[2] == stamp(s[1]) for s in steps if s[1] is not None)

    @pytest.mark.parametrize("change", [
        "shadow_in_earlier_dir", "extension_beside_source",
        "module_becomes_package", "namespace_portion_earlier",
        "package_gains_extension_init", "source_deleted",
        "mtime_restored", "permissions_changed"])
    def test_a_change_gets_path_finders_answer(self, tree, change):
        early, base, index = tree
        name = "spkg" if change == "package_gains_extension_init" else "smod"
        if change == "shadow_in_earlier_dir":
            (early / "smod.py").write_text("X = 2\n")
        elif change == "extension_beside_source":
            (base / f"smod{EXT}").write_bytes(b"")
        elif change == "module_becomes_package":
            (base / "smod").mkdir()
            (base / "smod" / "__init__.py").write_text("")
        elif change == "namespace_portion_earlier":
            (early / "smod").mkdir()
        elif change == "package_gains_extension_init":
            (base / "spkg" / f"__init__{EXT}").write_bytes(b"")
        elif change == "source_deleted":
            os.unlink(base / "smod.py")
        elif change == "mtime_restored":       # touch -r: the ctime moves
            st = os.stat(early)
            (early / "smod.py").write_text("X = 2\n")
            os.utime(early, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif change == "permissions_changed":
            os.chmod(early, 0o700)
        with import_state(path=search_path(early, base)):
            mine, plain, replayed = both(index, name)
        assert mine == plain
        if change in ("namespace_portion_earlier", "permissions_changed"):
            # early/ changed and was asked; base/ still holds its stamp
            assert replayed == 1 and mine[3] == str(base / "smod.py")
        else:
            assert replayed == 0 and (mine is None or mine[3] != str(base / "smod.py")
                                      or change == "module_becomes_package")

    def test_another_search_path_gets_path_finders_answer(self, tree):
        early, base, index = tree
        for path in ([str(base)], [str(early)], [str(early), "", str(base)], []):
            with import_state(path=path + sys.path):
                mine, plain, replayed = both(index, "smod")
            assert mine == plain and replayed == 0, path

    def test_a_replaced_path_importer_gets_path_finders_answer(self, tree):
        early, base, index = tree

        class Finder:
            @staticmethod
            def find_spec(fullname, target=None):
                return importlib.machinery.ModuleSpec(
                    fullname, importlib.machinery.SourceFileLoader(fullname, "/x.py"),
                    origin="/x.py")

        with import_state(path=search_path(early, base)):
            sys.path_importer_cache[str(early)] = Finder
            mine, plain, replayed = both(index, "smod")
        assert mine == plain and mine[3] == "/x.py" and replayed == 0

    @pytest.mark.parametrize("layout", [
        "folder_earlier", "folder_beside_module", "dangling_link_earlier"])
    def test_what_can_answer_without_a_listing_change_is_always_asked(
            self, tmp_path, layout):
        # FileFinder looks into name/ and follows name.py: a name/__init__.py
        # or a symlink's target appearing changes no listing it reads.
        early, base = tmp_path / "early", tmp_path / "base"
        early.mkdir()
        base.mkdir()
        (base / "cmod.py").write_text("X = 1\n")
        if layout == "folder_earlier":
            (early / "cmod").mkdir()
        elif layout == "folder_beside_module":
            (base / "cmod").mkdir()
        else:
            os.symlink(tmp_path / "nowhere.py", early / "cmod.py")
        code = (f"import sys; sys.path[:0] = [{str(early)!r}, {str(base)!r}]; "
                "import cmod")
        img = str(tmp_path / "c.img")
        r = run_python(["-c", NOT_RACY + code], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img)
        assert r.rc == 0, r
        index = _archive.Index.open(img)
        steps = index.lookup("cmod").search[0]
        asked = {"folder_earlier": 0, "folder_beside_module": 1,
                 "dangling_link_earlier": 0}[layout]
        assert steps[asked][2] is None
        if layout == "folder_earlier":
            (early / "cmod" / "__init__.py").write_text("X = 'pkg'\n")
        elif layout == "folder_beside_module":
            (base / "cmod" / "__init__.py").write_text("X = 'pkg'\n")
        else:
            (tmp_path / "nowhere.py").write_text("X = 'link'\n")
        with import_state(path=[str(early), str(base)] + sys.path):
            mine, plain, replayed = both(index, "cmod")
        assert mine == plain and replayed == 0
        assert mine[3] != str(base / "cmod.py")
        r = run_python(["-c", code + "; print(cmod.X)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.strip() in ("pkg", "link"), r

    def test_a_path_entry_switched_to_a_twin_directory(self, tmp_path):
        # Two directories with the same times (normalised image layers, the
        # Nix store): the inode tells them apart.
        one, two = tmp_path / "one", tmp_path / "two"
        one.mkdir()
        two.mkdir()
        (two / "tmod.py").write_text("X = 'two'\n")
        base = tmp_path / "base"
        base.mkdir()
        (base / "tmod.py").write_text("X = 'base'\n")
        site = tmp_path / "site"
        os.symlink(one, site)
        for d in (one, two):
            os.utime(d, (1, 1))
        code = (f"import sys; sys.path[:0] = [{str(site)!r}, {str(base)!r}]; "
                "import tmod; print(tmod.X)")
        img = str(tmp_path / "t.img")
        r = run_python(["-c", NOT_RACY + code], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img)
        assert r.out.strip() == "base", r
        os.unlink(site)
        os.symlink(two, site)
        r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.strip() == "two", r

    def test_a_replaced_path_finder_is_called(self, tree):
        early, base, index = tree
        entry = index.lookup("smod")
        original = PathFinder.__dict__["find_spec"]
        calls = []

        def spy(cls, fullname, path=None, target=None):
            calls.append(fullname)
            return original.__func__(cls, fullname, path, target)
        try:
            PathFinder.find_spec = classmethod(spy)
            with import_state(path=search_path(early, base)):
                _search.find_spec("smod", None, None, entry.origin, entry.search)
        finally:
            PathFinder.find_spec = original
        assert calls == ["smod"]

    def test_a_directory_modified_at_the_dump_is_always_asked(self, tmp_path):
        (tmp_path / "fresh.py").write_text("Y = 1\n")
        img = str(tmp_path / "b.img")
        r = run_python(["-c", "import fresh"], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img)
        assert r.rc == 0, r
        index = _archive.Index.open(img)
        steps = index.lookup("fresh").search[0]
        assert steps[0][:2] == ("", str(tmp_path)) and steps[0][2] is None
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            with import_state(path=[""] + sys.path):
                mine, plain, replayed = both(index, "fresh")
        finally:
            os.chdir(cwd)
        assert mine == plain and mine[3] == str(tmp_path / "fresh.py")
        assert replayed == 0


class TestEndToEnd:
    def test_the_dump_runs_no_path_hook(self, tmp_path):
        # At exit the record looks searches up; it never makes a finder for
        # a path entry the program added after its imports.
        (tmp_path / "hpkg").mkdir()
        (tmp_path / "hpkg" / "__init__.py").write_text("")
        (tmp_path / "hpkg" / "m.py").write_text("")
        (tmp_path / "other").mkdir()
        code = ("import sys, hpkg.m\n"
                "def hook(p):\n"
                "    print('hook', p)\n"
                "    raise SystemExit(3)\n"
                "sys.path_hooks.insert(0, hook)\n"
                f"hpkg.__path__.insert(0, {str(tmp_path / 'other')!r})\n"
                "print('done')\n")
        img = str(tmp_path / "h.img")
        r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (0, "done\n") and not r.warnings(), r
        assert _archive.Index.open(img).lookup("hpkg.m") is not None

    def test_archive_in_the_script_directory(self, tmp_path):
        # The archive written next to the script moves that directory's
        # mtime: it is asked at every search, the stdlib is not.
        (tmp_path / "helper.py").write_text("def f():\n    return 'helped'\n")
        (tmp_path / "app.py").write_text(
            "import json, helper, pycds\n"
            "print(helper.f(), json.dumps([1]))\n"
            "s = pycds.stats()\n"
            "print(s['served'] >= 2, s['searches_replayed'] >= 1)\n")
        img = str(tmp_path / "app.img")
        plain = run_python(["app.py"], cwd=tmp_path)
        run_python(["app.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.out.splitlines()[0] == plain.out.splitlines()[0] == "helped [1]"
        assert r.out.splitlines()[1] == "True True", r
        assert "helper" in r.served() and "json" in r.served()

    def test_very_verbose_import_prints_what_plain_import_tries(self, tree):
        early, base, index = tree
        code = (f"import sys; sys.path[:0] = [{str(early)!r}, {str(base)!r}]; "
                "import smod")
        plain = run_python(["-vv", "-c", code])
        r = run_python(["-vv", "-c", code], PYCDSMODE="SHARE", PYCDSARCHIVE=index.path,
                       PYCDSVERBOSE=1)

        def tried(run):
            return [line for line in run.err.splitlines()
                    if line.startswith("# trying ") and "smod" in line]
        assert tried(plain) and tried(r) == tried(plain)
        assert "smod" in r.served()
