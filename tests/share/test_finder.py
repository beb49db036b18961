"""CDSFinder and ArchivedCode in-process (import state saved and restored)."""

import importlib
import sys
from importlib.machinery import SourceFileLoader

import pytest

from support import import_state, run_python, uncache
from pycds import _config
from pycds import share as finder


@pytest.fixture
def archived_pkg(tmp_path):
    """A package and a module on a private sys.path entry, and an archive of
    them made by a DUMP run in a fresh interpreter."""
    (tmp_path / "fpkg").mkdir()
    (tmp_path / "fpkg" / "__init__.py").write_text("NAME = 'fpkg'\n")
    (tmp_path / "fpkg" / "sub.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "fmod.py").write_text("VALUE = 41 + 1\n")
    img = str(tmp_path / "f.img")
    r = run_python(["-c", "import fpkg.sub, fmod"], cwd=tmp_path, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
    assert r.rc == 0, r
    return tmp_path, img


def make_finder(img, check="mtime"):
    # As finder.install makes it (the native handle opened by the first hit).
    from pycds import _nativeapi as N
    f = finder.CDSFinder(finder._Archive(N.ArchiveFile(img, out_of_the_way=True), check))
    f.archive.start(N)
    return f


def placed(f):
    """f, put before PathFinder on sys.meta_path as install() puts it (the
    finder serves only from there; run inside import_state())."""
    from importlib.machinery import PathFinder
    sys.meta_path.insert(sys.meta_path.index(PathFinder), f)
    return f


class TestCDSFinder:
    def test_hit_returns_path_finders_spec_with_archive_loader(self, archived_pkg):
        root, img = archived_pkg
        f = make_finder(img)
        with import_state(path=[str(root)] + sys.path), uncache("fpkg", "fmod"):
            placed(f)
            spec = f.find_spec("fmod")
            assert finder.served_loader(spec.loader)
            assert type(spec.loader) is SourceFileLoader
            assert spec.origin == str(root / "fmod.py") and spec.cached
            mod = importlib.import_module("fmod")
            assert mod.VALUE == 42 and mod.__file__ == spec.origin
            pkg = importlib.import_module("fpkg.sub")
            assert pkg.double(4) == 8
            assert sys.modules["fpkg"].__path__ == [str(root / "fpkg")]
            # once the code is handed out the loader is a plain one
            loader = sys.modules["fpkg"].__loader__
            assert type(loader) is SourceFileLoader and "get_code" not in vars(loader)
            assert loader == SourceFileLoader("fpkg", sys.modules["fpkg"].__file__)

    def test_miss_returns_none(self, archived_pkg):
        _, img = archived_pkg
        f = make_finder(img)
        assert f.find_spec("not_in_archive_xyz") is None

    def test_not_on_path_returns_none(self, archived_pkg):
        _, img = archived_pkg
        f = make_finder(img)
        with import_state(path=[p for p in sys.path if p]), uncache("fmod"):
            assert placed(f).find_spec("fmod") is None

    def test_unchecked_mode_skips_the_stat(self, archived_pkg):
        root, img = archived_pkg
        (root / "fmod.py").write_text("VALUE = 'edited'\n")
        with import_state(path=[str(root)] + sys.path), uncache("fmod"):
            spec = placed(make_finder(img)).find_spec("fmod")
            assert not finder.served_loader(spec.loader)    # mtime: stale
        with import_state(path=[str(root)] + sys.path), uncache("fmod"):
            spec = placed(make_finder(img, "unchecked")).find_spec("fmod")
            assert finder.served_loader(spec.loader)

    def test_damaged_index_disables_without_raising(self, archived_pkg):
        root, img = archived_pkg
        f = make_finder(img)
        index = f.archive.index
        h = index.header
        with open(img, "r+b") as fh:          # break every index entry's checksum
            for at in range(h.entries_off + 20, h.entries_off + h.entries_len, 16):
                fh.seek(at)
                fh.write(b"\xa5")
        with import_state(path=[str(root)] + sys.path), uncache("fpkg", "fmod"):
            placed(f)
            results = [f.find_spec(n) for n in ("fmod", "fpkg")]
        assert f.archive.disabled
        assert all(s is None or not finder.served_loader(s.loader) for s in results)


class TestInstall:
    def test_install_puts_finder_before_path_finder(self, archived_pkg):
        from importlib.machinery import PathFinder
        _, img = archived_pkg
        cfg = _config.Config(mode=_config.MODE_SHARE, archive=img)
        with import_state():
            try:
                f = finder.install(cfg)
                assert f is not None and finder.install(cfg) is f
                assert sys.meta_path.index(f) + 1 == sys.meta_path.index(PathFinder)
            finally:
                finder.uninstall()
            assert f not in sys.meta_path

    @pytest.mark.parametrize("first, held", [("fmod", True), ("not_archived", False),
                                             (None, False)])
    def test_the_opening_holds_its_descriptor_for_an_archived_first(self, archived_pkg,
                                                                     first, held):
        # (The stand-in opens the archive for the import of `first`: where
        # the archive holds it, that load reads through the same descriptor.)
        _, img = archived_pkg
        cfg = _config.Config(mode=_config.MODE_SHARE, archive=img)
        with import_state():
            try:
                f = finder.install(cfg, first=first)
                assert (f.archive.file.fd >= 0) == held
            finally:
                finder.uninstall()
                f.archive.file.close()

    @pytest.mark.parametrize("verbose", [1, 2])
    def test_installed_by_hand_prints_what_verbose_asks(self, archived_pkg, verbose):
        # The API form, in a process where start-up imported nothing of
        # pycds: the finder's first line must not import pycds._log through
        # the finder itself (it once recursed until RecursionError).
        root, img = archived_pkg
        r = run_python(["-c", f"""
from pycds import _config
from pycds import share as finder
finder.install(_config.Config(mode=_config.MODE_SHARE, archive={img!r}, verbose={verbose}))
import json, fmod, fpkg.sub
print(fmod.VALUE)
"""], cwd=root)
        assert (r.rc, r.out) == (0, "42\n"), r
        assert set(r.served()) == {"fmod", "fpkg", "fpkg.sub"}, r
        assert ("[pycds] not in archive json" in r.err) == (verbose == 2), r



KEPT = '''import gc, importlib, sys, tracemalloc
import pycds
def held():
    gc.collect()
    return sum(st.size for st in tracemalloc.take_snapshot().statistics("filename")
               if "/pycds/" in st.traceback[0].filename)
import kpkg
importlib.import_module("kpkg.m0")
before, served = held(), pycds.stats()["served"]
for i in range(1, 61):
    importlib.import_module(f"kpkg.m{i}")
print(pycds.stats()["served"] - served, held() - before)
'''


def test_served_modules_leave_little_behind(tmp_path):
    """What pycds's Python code holds for each module served: its loader
    keeps the module's name, number and chunk length, not its index entry
    (paths, hashes, directory stamps: ~1.5 KiB a module, 0.74 MiB for
    numpy, flask and boto3, for the life of the process).  Counted by
    tracemalloc (on from start-up) as the growth of what pycds's own lines
    allocated over 60 modules.  Counted with them, as the native verdict
    builds each spec from the entry: the loader and the origin and ``.pyc``
    paths the spec keeps (~600 bytes; plain import's importlib makes the
    same objects)."""
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for i in range(61):
        (pkg / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (tmp_path / "kept.py").write_text(KEPT)
    img = str(tmp_path / "k.img")
    r = run_python(["-c", "import kpkg; [__import__(f'kpkg.m{i}') for i in range(61)]"],
                   cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert r.rc == 0, r
    share = run_python("kept.py", cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYTHONTRACEMALLOC="1")
    assert share.rc == 0, share
    served, grew = map(int, share.out.split())
    assert served == 60, share
    assert grew < 800 * served, (grew, served)
