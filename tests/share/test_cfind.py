"""The finder's native hit path (native/archive/loader/find.c) against the
Python path, on the same inputs: the same entry for every name, the same
facts for every path, and the same verdicts of pycds._pyc.check and
pycds._search.find_spec whichever side took the facts."""

import _imp
import importlib.machinery
import os
import sys
import time
from _frozen_importlib_external import MAGIC_NUMBER
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import import_state, run_python
from test_search import describe
from pycds import _archive, _nativeapi, _pyc, _search
from pycds.errors import ArchiveFormatError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def entry(number, name, origin="/nonexistent/m.py", pyc_path="", search=None,
          mtime_ns=0, size=0, pyc_kind=0, pyc_mtime_ns=0, pyc_size=0,
          source_hash=b"", check_hash_pycs="default"):
    return _archive.ModuleEntry(
        number, name, origin, False, None, mtime_ns, size, source_hash, pyc_path,
        pyc_kind, pyc_mtime_ns, pyc_size, check_hash_pycs, 0, 0, 0, 0, 0, 0, 0,
        search)


def write_index(path, entries, archive_id=0x1234_5678_9ABC_DEF0):
    """An archive holding ``entries`` and an empty heap; its Index."""
    h, parts = _archive.file_sections(entries, 0, 0, _archive.meta_for_this_interpreter(),
                               archive_id)
    buf = bytearray(h.file_len)
    buf[:_archive.HEADER_SIZE] = h.pack()
    for off, data in parts:
        buf[off:off + len(data)] = data
    with open(path, "wb") as f:
        f.write(buf)
    return _archive.Index.open(str(path), check_owner=False)


def native_find(index, name, files=True):
    return _nativeapi.IndexFinder(index, index.descriptor(), files).find(name)


class TestKeyedHash:
    @given(key=st.integers(0, 2**63 - 1), data=st.binary(max_size=100))
    @SETTINGS
    def test_is_source_hash(self, key, data):
        assert _nativeapi.keyed_hash(key, data) == \
            int.from_bytes(_imp.source_hash(key, data), "little")


# Module names: ASCII, other scripts, lone surrogates (which the native
# lookup declines: Index.lookup encodes them with surrogatepass).
NAMES = st.text(st.characters(min_codepoint=1), min_size=1, max_size=40)


class TestLookup:
    @given(names=st.lists(NAMES, min_size=1, max_size=30, unique=True),
           others=st.lists(NAMES, max_size=10), long=st.integers(0, 3000))
    @SETTINGS
    def test_same_entry_for_every_name(self, tmp_path, names, others, long):
        # (long: an origin that makes some entries longer than one read.)
        ents = [entry(i, n, origin="/x/" + "o" * (long * (i % 2)) + ".py")
                for i, n in enumerate(names)]
        index = write_index(tmp_path / "a.img", ents)
        try:
            for name in names + others:
                want = index.lookup(name)
                got = native_find(index, name)
                if got is False:
                    with pytest.raises(UnicodeEncodeError):
                        name.encode("utf-8")
                    continue
                if want is None:
                    assert got is None
                else:
                    assert got is not None and got[0] == want.to_tuple()
        finally:
            index.close()

    @given(order=st.randoms(use_true_random=False), pad=st.integers(0, 1500))
    @SETTINGS
    def test_entries_beyond_one_window(self, tmp_path, order, pad):
        # More entries than one window of the section holds (ENTRY_WINDOW),
        # looked up in any order by one finder: each is the Python reader's.
        names = [f"m{i}" for i in range(150)]
        ents = [entry(i, n, origin="/x/" + "p" * (pad + 7 * i) + ".py")
                for i, n in enumerate(names)]
        index = write_index(tmp_path / "w.img", ents)
        try:
            assert index.header.entries_len > _nativeapi.ENTRY_WINDOW
            finder = _nativeapi.IndexFinder(index, index.descriptor())
            order.shuffle(names)
            for name in names + names[::-1]:
                got = finder.find(name)
                assert got is not None and got[0] == index.lookup(name).to_tuple(), name
        finally:
            index.close()

    def test_a_damaged_entry_declines(self, tmp_path):
        index = write_index(tmp_path / "a.img", [entry(0, "mod")])
        at = index.header.entries_off + 20
        index.close()
        with open(tmp_path / "a.img", "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 1]))
        index = _archive.Index.open(str(tmp_path / "a.img"), check_owner=False)
        try:
            assert native_find(index, "mod") is False
            with pytest.raises(ArchiveFormatError, match="checksum"):
                index.lookup("mod")
        finally:
            index.close()

    def test_a_closed_descriptor_declines(self, tmp_path):
        index = write_index(tmp_path / "a.img", [entry(0, "mod")])
        fd = os.dup(index.descriptor())
        finder = _nativeapi.IndexFinder(index, fd)
        os.close(fd)
        try:
            assert finder.find("mod") is False
        finally:
            index.close()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Paths of every kind a stat meets, in a directory of their own."""
    d = str(tmp_path_factory.mktemp("paths"))
    with open(os.path.join(d, "file.py"), "w") as f:
        f.write("x = 1\n")
    os.mkdir(os.path.join(d, "dir"))
    os.mkdir(os.path.join(d, "d\u00e9j\u00e0"))
    with open(os.path.join(d, "\u00fcber.py"), "w") as f:
        f.write("")
    os.symlink("file.py", os.path.join(d, "link"))
    os.symlink("absent", os.path.join(d, "dangling"))
    return [os.path.join(d, p) for p in (
        "file.py", "dir", "d\u00e9j\u00e0", "\u00fcber.py", "link", "dangling",
        "absent", "file.py/below", "nul\0.py", "surr\udcff.py")] + ["", d]


class TestFacts:
    @given(data=st.data())
    @SETTINGS
    def test_same_facts_for_every_path(self, tmp_path, paths, data):
        pick = st.sampled_from(paths)
        origin, pyc, d0, d1, pkg = (data.draw(pick) for _ in range(5))
        stamped = data.draw(st.lists(st.booleans(), min_size=3, max_size=3))
        steps = (("a", d0, (1, 2, 3, 4) if stamped[0] else None),
                 ("b", d1, (1, 2, 3, 4) if stamped[1] else None))
        search = data.draw(st.sampled_from([
            None, (steps, pkg, (5, 6, 7, 8) if stamped[2] else None), (steps, None, None)]))
        e = entry(0, "mod", origin=origin, pyc_path=pyc, search=search)
        index = write_index(tmp_path / "a.img", [e])
        try:
            for files in (True, False):
                got = native_find(index, "mod", files)
                assert got[0] == e.to_tuple()
                if search is None:
                    assert got[1:3] == [(), None]
                else:
                    assert got[1] == tuple(_search._stamp(d) if s is not None else None
                                           for _, d, s in search[0])
                    assert got[2] == (None if search[2] is None else _search._stamp(pkg))
                if files:
                    assert got[3] == _pyc.file_facts(origin)
                    assert got[4] == (_pyc.file_facts(pyc) if pyc else None)
                else:
                    assert got[3:] == [None, None]
        finally:
            index.close()


def pyc_header(kind, mtime, size, src_hash):
    if kind == _pyc.PYC_TIMESTAMP:
        return MAGIC_NUMBER + bytes(4) + (int(mtime) & 0xFFFFFFFF).to_bytes(4, "little") \
            + (size & 0xFFFFFFFF).to_bytes(4, "little")
    flags = 3 if kind == _pyc.PYC_CHECKED_HASH else 1
    return MAGIC_NUMBER + flags.to_bytes(4, "little") + src_hash


def search_tree(tmp_path, data):
    """Two search directories, the second with a package ``pkg``; a drawn
    name, ``mod`` or ``pkg``, and the origin of its module there (a fresh
    tree for each example)."""
    import tempfile
    root = tempfile.mkdtemp(dir=tmp_path)
    dirs = [Path(root, "s0"), Path(root, "s1")]
    for p in dirs:
        p.mkdir(exist_ok=True)
    (dirs[1] / "pkg").mkdir(exist_ok=True)
    name = data.draw(st.sampled_from(["mod", "pkg"]))
    return dirs, name, str(dirs[1] / ("mod.py" if name == "mod" else "pkg/__init__.py"))


EXT = importlib.machinery.EXTENSION_SUFFIXES[0]


def _write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# Names a directory of the search may gain after the dump: what FileFinder
# takes first (a module or package earlier on the path, an extension
# beside the source, a package's extension __init__, a package in the
# module's place), or passes over (a folder without __init__, a dangling
# link, another name).  Each takes (dirs, name).
EXTRAS = {
    "earlier module": lambda d, n: _write(d[0] / f"{n}.py"),
    "earlier package": lambda d, n: _write(d[0] / n / "__init__.py"),
    "earlier extension": lambda d, n: _write(d[0] / f"{n}{EXT}"),
    "earlier compiled": lambda d, n: _write(d[0] / f"{n}.pyc"),
    "earlier namespace": lambda d, n: (d[0] / n).mkdir(exist_ok=True),
    "earlier dangling link": lambda d, n: os.path.lexists(d[0] / f"{n}.py")
    or os.symlink(d[0] / "nowhere.py", d[0] / f"{n}.py"),
    "earlier other name": lambda d, n: _write(d[0] / "other.py"),
    "extension beside": lambda d, n: _write(d[1] / f"{n}{EXT}"),
    "init extension": lambda d, n: _write(d[1] / n / f"__init__{EXT}"),
    "package in place": lambda d, n: _write(d[1] / n / "__init__.py"),
    "other name beside": lambda d, n: _write(d[1] / "other.py"),
}


class TestVerdicts:
    @given(data=st.data())
    @SETTINGS
    def test_check_judges_both_kinds_of_facts_alike(self, tmp_path, data):
        d = tmp_path / "t"
        d.mkdir(exist_ok=True)
        src = d / "m.py"
        pyc = d / "m.pyc"
        text = data.draw(st.sampled_from([b"x = 1\n", b"x = 22\n", b""]))
        src.write_bytes(text)
        st_src = os.stat(src)
        src_hash = _pyc.source_hash(text)
        # The .pyc plain import would read: absent, or a header of some kind,
        # for this source or another.
        kind = data.draw(st.sampled_from([0, 1, 2, 3]))
        if pyc.exists():
            pyc.unlink()
        if kind or data.draw(st.booleans()):
            head_kind = kind or _pyc.PYC_TIMESTAMP
            good = data.draw(st.booleans())
            pyc.write_bytes(pyc_header(
                head_kind, st_src.st_mtime if good else 7, st_src.st_size,
                src_hash if good else b"\0" * 8) + b"rest")
        st_pyc = os.stat(pyc) if pyc.exists() else None
        # What the dump recorded: what is there now, or something else.
        def now_or(value, other):
            return value if data.draw(st.booleans()) else other
        e = entry(
            0, "m", origin=str(src),
            pyc_path=now_or(str(pyc), data.draw(st.sampled_from(["", str(d / "o.pyc")]))),
            mtime_ns=now_or(st_src.st_mtime_ns, st_src.st_mtime_ns + 1),
            size=now_or(st_src.st_size, st_src.st_size + 1),
            pyc_kind=kind,
            pyc_mtime_ns=now_or(st_pyc.st_mtime_ns if st_pyc else 0, 5),
            pyc_size=now_or(st_pyc.st_size if st_pyc else 0, 6),
            source_hash=now_or(src_hash, b"\1" * 8),
            check_hash_pycs=now_or(_imp.check_hash_based_pycs, "never"))
        mode = data.draw(st.sampled_from(["stat", "hash", "unchecked"]))
        cached = data.draw(st.sampled_from([None, str(pyc), str(d / "o.pyc")]))
        index = write_index(tmp_path / "a.img", [e])
        try:
            got = native_find(index, "m")
        finally:
            index.close()
        assert _pyc.check(e, mode, cached, got[3:]) == _pyc.check(e, mode, cached)

    @given(data=st.data())
    @SETTINGS
    def test_search_replays_alike(self, tmp_path, data):
        dirs, name, origin = search_tree(tmp_path, data)
        for f in (dirs[1] / "pkg" / "__init__.py", dirs[1] / "mod.py"):
            f.write_text("")

        def stamp(p):
            real = _search._stamp(str(p))
            return data.draw(st.sampled_from([real, None, (0, 0, 0, 0)]))
        steps = tuple((str(p), str(p), stamp(p)) for p in dirs)
        pkg_dir = str(dirs[1] / "pkg") if name == "pkg" else None
        search = (steps, pkg_dir, stamp(pkg_dir) if pkg_dir else None)
        e = entry(0, name, origin=origin, search=search)
        index = write_index(tmp_path / "a.img", [e])
        try:
            got = native_find(index, name)
        finally:
            index.close()
        path = [str(p) for p in dirs]
        with import_state(path=path):
            before = _search.replayed
            python = _search.find_spec(name, None, None, origin, search)
            replayed_py = _search.replayed - before
            native = _search.find_spec(name, None, None, origin, search, got[1:3])
            replayed_c = _search.replayed - before - replayed_py
        assert describe(native) == describe(python)
        assert replayed_c == replayed_py


class EqualProxy:
    """A wrapper that compares equal to what it wraps."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __eq__(self, other):
        return other is self.wrapped or other is self

    __hash__ = object.__hash__

    def __call__(self, *args, **kwargs):
        return self.wrapped(*args, **kwargs)


class RaisingEq:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__


class GivesBack:
    """A descriptor that gives back ``value`` when read."""

    def __init__(self, value):
        self.value = value

    def __get__(self, instance, owner=None):
        return self.value


def timestamp_module(d, steps):
    """Module m in directory d with its timestamp .pyc, and its entry as a
    dump found it through the search ``steps``: (path entry, directory)
    pairs, the last one d's."""
    from importlib.util import cache_from_source
    origin = d / "m.py"
    origin.write_text("x = 1\n")
    pyc = cache_from_source(str(origin))
    os.makedirs(os.path.dirname(pyc))
    src = os.stat(origin)
    with open(pyc, "wb") as f:
        f.write(pyc_header(_pyc.PYC_TIMESTAMP, src.st_mtime, src.st_size, b""))
    p = os.stat(pyc)
    search = (tuple((e, str(dir), _search._stamp(str(dir))) for e, dir in steps), None, None)
    return entry(0, "m", origin=str(origin), search=search, pyc_path=pyc,
                 mtime_ns=src.st_mtime_ns, size=src.st_size, pyc_kind=_pyc.PYC_TIMESTAMP,
                 pyc_mtime_ns=p.st_mtime_ns, pyc_size=p.st_size)


class TestNativeVerdict:
    """pycds_index_hit's verdict against the Python path on the same
    files: True only where pycds._search finds the archived file (from the
    stamps, or asking the directories whose stamp no longer holds, as
    PathFinder would) and pycds._pyc.check finds the files unchanged
    (PYCDSCHECK=mtime) with the .pyc ModuleSpec names; and True where no
    file changed since the record, whatever the directories' stamps say."""

    @given(data=st.data())
    @SETTINGS
    def test_true_only_where_python_serves(self, tmp_path, data):
        from importlib.util import cache_from_source
        dirs, name, origin = search_tree(tmp_path, data)
        with open(origin, "w") as f:
            f.write(data.draw(st.sampled_from(["x = 1\n", "x = 22\n"])))
        pyc = cache_from_source(origin)
        os.makedirs(os.path.dirname(pyc), exist_ok=True)
        src_st = os.stat(origin)
        with open(pyc, "wb") as f:
            f.write(pyc_header(_pyc.PYC_TIMESTAMP, src_st.st_mtime, src_st.st_size, b"")
                    + b"code")
        pyc_st = os.stat(pyc)
        changed = []

        def draw(real, other, what):
            if data.draw(st.booleans()):
                return real
            changed.append(what)
            return other

        def stamp(p):
            return draw(_search._stamp(str(p)), data.draw(st.sampled_from([None, (0, 0, 0, 0)])),
                        "stamp")
        steps = tuple((str(p), str(p), stamp(p)) for p in dirs)
        pkg_dir = str(dirs[1] / "pkg") if name == "pkg" else None
        search = (steps, pkg_dir, stamp(pkg_dir) if pkg_dir else None)
        # Names put in the directories after the record: what FileFinder
        # would take before the archived file, or would pass over.
        for what in data.draw(st.lists(st.sampled_from(sorted(EXTRAS)), max_size=2,
                                       unique=True)):
            EXTRAS[what](dirs, name)
            changed.append(what)
        e = entry(0, name, origin=origin, search=search,
                  pyc_path=draw(pyc, str(tmp_path / "other.pyc"), "pyc path"),
                  mtime_ns=draw(src_st.st_mtime_ns, src_st.st_mtime_ns + 1, "mtime"),
                  size=draw(src_st.st_size, src_st.st_size + 1, "size"),
                  pyc_kind=draw(_pyc.PYC_TIMESTAMP, _pyc.PYC_CHECKED_HASH, "kind"),
                  pyc_mtime_ns=draw(pyc_st.st_mtime_ns, 5, "pyc mtime"),
                  pyc_size=draw(pyc_st.st_size, 6, "pyc size"),
                  source_hash=_pyc.source_hash(open(origin, "rb").read()))
        index = write_index(tmp_path / "a.img", [e])
        path = [str(p) for p in dirs]
        try:
            with import_state(path=path):
                # (Every directory's FileFinder in the path importer cache.)
                assert importlib.machinery.PathFinder.find_spec("no_such_name") is None
                before = _search.replayed
                spec = _search.find_spec(name, None, None, origin, search)
                replayed = _search.replayed - before == 1
                got = _nativeapi.IndexFinder(index, index.descriptor()).hit(name, None)
        finally:
            index.close()
        assert got[0] == e.to_tuple()
        assert got[3:5] == [_pyc.file_facts(origin), _pyc.file_facts(e.pyc_path)]
        verdict = got[5]
        python = (spec is not None and spec.origin == origin
                  and _pyc.check(e, "mtime", spec.cached)[0] is None
                  and e.pyc_kind == _pyc.PYC_TIMESTAMP and spec.cached == e.pyc_path)
        assert verdict is python or (verdict is False and python), (verdict, python, changed)
        if not changed:
            assert verdict is True and replayed
        if set(changed) <= {"stamp"}:
            assert verdict is True

    @pytest.mark.parametrize("name", ["mod", "pkg"])
    @pytest.mark.parametrize("what", sorted(EXTRAS))
    def test_a_directory_changed_since_the_record(self, tmp_path, name, what):
        # Every file as recorded, every stamp taken at the record; then a
        # directory of the search gains a name.  The verdict is plain
        # import's answer, from the names there now (the Python path asks
        # the changed directory's FileFinder).
        from importlib.util import cache_from_source
        dirs = [tmp_path / "s0", tmp_path / "s1"]
        for p in dirs:
            p.mkdir()
        (dirs[1] / "pkg").mkdir()
        origin = str(dirs[1] / ("mod.py" if name == "mod" else "pkg/__init__.py"))
        with open(origin, "w") as f:
            f.write("x = 1\n")
        pyc = cache_from_source(origin)
        os.makedirs(os.path.dirname(pyc))
        src = os.stat(origin)
        with open(pyc, "wb") as f:
            f.write(pyc_header(_pyc.PYC_TIMESTAMP, src.st_mtime, src.st_size, b"") + b"c")
        pyc_st = os.stat(pyc)
        steps = tuple((str(p), str(p), _search._stamp(str(p))) for p in dirs)
        pkg_dir = str(dirs[1] / "pkg") if name == "pkg" else None
        search = (steps, pkg_dir, _search._stamp(pkg_dir) if pkg_dir else None)
        EXTRAS[what](dirs, name)
        e = entry(0, name, origin=origin, search=search, pyc_path=pyc,
                  mtime_ns=src.st_mtime_ns, size=src.st_size, pyc_kind=_pyc.PYC_TIMESTAMP,
                  pyc_mtime_ns=pyc_st.st_mtime_ns, pyc_size=pyc_st.st_size)
        index = write_index(tmp_path / "a.img", [e])
        try:
            with import_state(path=[str(p) for p in dirs]):
                # (Every directory's FileFinder in the path importer cache.)
                assert importlib.machinery.PathFinder.find_spec("no_such_name") is None
                spec = importlib.machinery.PathFinder.find_spec(name)
                got = _nativeapi.IndexFinder(index, index.descriptor()).hit(name, None)
        finally:
            index.close()
        plain = (spec is not None and spec.origin == origin
                 and _pyc.check(e, "mtime", spec.cached)[0] is None)
        assert got[-1] is plain, (what, spec and spec.origin)
        if what in ("earlier namespace", "earlier dangling link", "earlier other name",
                    "other name beside") or (what, name) == ("extension beside", "pkg"):
            assert plain

    @pytest.mark.parametrize("change", ["none", "cwd entry", "pycache prefix",
                                        "finder of another directory", "no finder first",
                                        "not cached", "a path hook raising"])
    def test_what_the_program_changed(self, tmp_path, change, monkeypatch):
        from importlib.machinery import FileFinder
        d0, d1 = tmp_path / "s0", tmp_path / "s1"
        d0.mkdir()
        d1.mkdir()
        first = "" if change == "cwd entry" else str(d0)
        if change == "cwd entry":
            monkeypatch.chdir(d0)
        e = timestamp_module(d1, [(first, d0), (str(d1), d1)])
        origin, search = e.origin, e.search
        index = write_index(tmp_path / "a.img", [e])
        try:
            with import_state(path=[first, str(d1)]):
                _search.find_spec("m", None, None, str(origin), search)   # (fills the cache)
                if change == "pycache prefix":
                    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pp"))
                elif change == "finder of another directory":
                    sys.path_importer_cache[str(d1)] = FileFinder(
                        str(d0), *_search._get_supported_file_loaders())
                elif change == "no finder first":
                    sys.path_importer_cache[str(d0)] = None
                elif change in ("not cached", "a path hook raising"):
                    del sys.path_importer_cache[first or str(d0)]
                if change == "a path hook raising":
                    def hook(entry):
                        raise RuntimeError("the program's hook")
                    sys.path_hooks.insert(0, hook)
                got = _nativeapi.IndexFinder(index, index.descriptor()).hit("m", None)
                cached = sys.path_importer_cache.get(first or str(d0), "absent")
        finally:
            index.close()
        # A path importer cache entry of None before the last step is
        # skipped, as PathFinder skips it.  One not cached yet is no verdict,
        # and no path hook has run: PathFinder runs them in the middle of its
        # search, and so does pycds._search
        # (test_path_hooks_run_as_plain_import_runs_them).
        assert got[5] is (change in ("none", "cwd entry", "no finder first")), change
        if change in ("not cached", "a path hook raising"):
            assert cached == "absent", (change, cached)

    @pytest.mark.parametrize("change", [
        "none", "finder not on sys.meta_path", "another finder before PathFinder",
        "PathFinder.find_spec replaced", "FileFinder.find_spec replaced",
        "SourceFileLoader.get_data replaced", "SourceLoader.get_code replaced",
        "_compile_bytecode replaced", "PathFinder._get_spec replaced",
        "FileFinder._get_spec replaced", "get_code wrapped by a proxy equal to it",
        "a get_code whose == raises", "a descriptor giving back the stock get_code",
        "marshal.loads replaced", "cache_from_source replaced", "_path_isfile replaced",
        "FileFinder.__getattribute__ defined", "the cached FileFinder's own find_spec"])
    def test_what_serving_requires(self, tmp_path, change, monkeypatch):
        # With `serving`, the verdict also requires what CDSFinder.find_spec
        # checks of the import system in Python (_path_finder_next,
        # search_replayable, loader_patched): True exactly where those hold,
        # and then with the entry alone.
        import _frozen_importlib_external as bx
        import pycds
        from pycds import share as finder
        d = tmp_path / "s"
        d.mkdir()
        e = timestamp_module(d, [(str(d), d)])
        origin, search = e.origin, e.search
        index = write_index(tmp_path / "a.img", [e])
        me, other = object(), object()
        serving = (me, bx.PathFinder, pycds._config.STOCK_SEARCH,
                   pycds._config.STOCK_LOADER_ATTRS + pycds._config.STOCK_SEARCH_FUNCS)

        def replaced(*args, **kwargs):
            raise AssertionError("not called")
        try:
            with import_state(path=[str(d)]):
                _search.find_spec("m", None, None, str(origin), search)   # (fills the cache)
                at = sys.meta_path.index(bx.PathFinder)
                if change != "finder not on sys.meta_path":
                    sys.meta_path.insert(at, me)
                if change == "another finder before PathFinder":
                    sys.meta_path.insert(at + 1, other)
                elif change == "PathFinder.find_spec replaced":
                    monkeypatch.setattr(bx.PathFinder, "find_spec", classmethod(replaced))
                elif change == "FileFinder.find_spec replaced":
                    monkeypatch.setattr(bx.FileFinder, "find_spec", replaced)
                elif change == "SourceFileLoader.get_data replaced":
                    monkeypatch.setattr(bx.SourceFileLoader, "get_data", replaced)
                elif change == "SourceLoader.get_code replaced":
                    monkeypatch.setattr(bx.SourceLoader, "get_code", replaced)
                elif change == "_compile_bytecode replaced":
                    monkeypatch.setattr(bx, "_compile_bytecode", replaced)
                elif change == "PathFinder._get_spec replaced":
                    monkeypatch.setattr(bx.PathFinder, "_get_spec", classmethod(replaced))
                elif change == "FileFinder._get_spec replaced":
                    monkeypatch.setattr(bx.FileFinder, "_get_spec", replaced)
                elif change == "get_code wrapped by a proxy equal to it":
                    # (as wrapt's function wrappers, which APM agents put
                    # on SourceFileLoader.get_code, compare)
                    monkeypatch.setattr(bx.SourceFileLoader, "get_code",
                                        EqualProxy(bx.SourceLoader.get_code))
                elif change == "marshal.loads replaced":
                    monkeypatch.setattr(bx.marshal, "loads", replaced)
                elif change == "cache_from_source replaced":
                    monkeypatch.setattr(bx, "cache_from_source", replaced)
                elif change == "_path_isfile replaced":
                    monkeypatch.setattr(bx, "_path_isfile", replaced)
                elif change == "FileFinder.__getattribute__ defined":
                    monkeypatch.setattr(bx.FileFinder, "__getattribute__",
                                        object.__getattribute__, raising=False)
                elif change == "the cached FileFinder's own find_spec":
                    cached = sys.path_importer_cache[str(d)]
                    cached.find_spec = cached.find_spec
                elif change == "a get_code whose == raises":
                    monkeypatch.setattr(bx.SourceFileLoader, "get_code", RaisingEq())
                elif change == "a descriptor giving back the stock get_code":
                    monkeypatch.setattr(bx.SourceFileLoader, "get_code",
                                        GivesBack(bx.SourceLoader.get_code))
                got = _nativeapi.IndexFinder(index, index.descriptor(), True, serving).hit(
                    "m", None)
                python = (finder._path_finder_next(me) and pycds._config.search_replayable()
                          and not pycds._config.loader_patched()
                          and not _search.own_search_methods(
                              sys.path_importer_cache[str(d)]))
        finally:
            index.close()
        assert python is (change == "none"), change
        assert got[-1] is python and got[0] == e.to_tuple(), (change, got)
        assert len(got) == (2 if python else 6), (change, got)

    def test_a_property_that_empties_sys_path_does_not_crash(self, tmp_path):
        # The attribute lookups of the verdict may run the program's code.
        (tmp_path / "m.py").write_text("X = 1\n")
        (tmp_path / "n.py").write_text("Y = 2\n")
        code = "import sys; sys.path.insert(0, '.'); import json, m, n"
        img = str(tmp_path / "a.img")
        assert run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP",
                          PYCDSARCHIVE=img).rc == 0
        prog = ("import sys; sys.path.insert(0, '.'); import json, m\n"
                "from importlib.machinery import FileFinder\n"
                "real = FileFinder.__dict__.get('path')\n"
                "def path(self):\n"
                "    sys.path.clear(); sys.path_importer_cache.clear()\n"
                "    return self.__dict__['path']\n"
                "FileFinder.path = property(path)\n"
                "import pycds.share as f\n"
                "print(f._installed.archive.fast.hit('n', None)[-1])\n")
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.out in ("True\n", "False\n"), r

    def test_another_search_path_is_no_verdict(self, tmp_path):
        (tmp_path / "m.py").write_text("x = 1\n")
        search = (((str(tmp_path), str(tmp_path), _search._stamp(str(tmp_path))),), None, None)
        e = entry(0, "m", origin=str(tmp_path / "m.py"), search=search)
        index = write_index(tmp_path / "a.img", [e])
        try:
            with import_state(path=["/elsewhere", str(tmp_path)]):
                got = _nativeapi.IndexFinder(index, index.descriptor()).hit("m", None)
        finally:
            index.close()
        assert got[5] is False


def test_share_serves_through_the_native_hit_path(tmp_path):
    # After the first module served (which loads the native module), hits
    # are found by the native path, and a stale source still falls back.
    (tmp_path / "late.py").write_text("X = 1\n")
    code = "import sys; sys.path.insert(0, '.'); import json, late"
    img = str(tmp_path / "a.img")
    assert run_python(["-c", code], cwd=tmp_path).rc == 0
    r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert r.rc == 0, r
    report = ("; import pycds.share as f; a = f._installed.archive; "
              "print(a.fast is not None, late.X)")
    r = run_python(["-c", code + report], cwd=tmp_path, PYCDSMODE="SHARE",
                   PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "True 1\n", r
    assert "late" in r.served() and "json.decoder" in r.served(), r
    (tmp_path / "late.py").write_text("X = 22\n")
    r = run_python(["-c", code + report], cwd=tmp_path, PYCDSMODE="SHARE",
                   PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "True 22\n", r
    assert "late" not in r.served(), r
    assert "[pycds] fallback late: source changed" in r.fallbacks(), r


def test_a_replayed_program_is_found_from_the_stamps(tmp_path):
    # Every hit of a program whose directories are as the dump recorded
    # them is found from the stamps by the native verdict, also those whose
    # search meets a directory not in sys.path_importer_cache yet (the
    # script's, a package's): importlib's own path hooks run for it first.
    # The Python rules are never imported.  The directories are older than
    # the two seconds a racy stamp would be (pycds._search).
    app, arc = tmp_path / "app", tmp_path / "arc"
    app.mkdir()
    arc.mkdir()
    (app / "appmod.py").write_text("import json\nX = 1\n")
    (app / "prog.py").write_text(
        "import appmod, sys, pycds\n"
        "print(appmod.X, pycds.stats()['searches_replayed'],\n"
        "      'pycds._search' in sys.modules, 'pycds._pyc' in sys.modules)\n")
    img = str(arc / "a.img")
    plain = run_python(["prog.py"], cwd=app)      # (writes app/__pycache__)
    time.sleep(2.1)
    assert run_python(["prog.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
    r = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out.split()[0] == "1" == plain.out.split()[0], (plain, r)
    served = r.served()
    assert "appmod" in served and "json.decoder" in served, r
    assert r.out.split()[1:] == [str(len(served)), "False", "False"], r


@pytest.mark.parametrize("gained", ["log.txt", "json.py", f"appmod{EXT}",
                                    "appmod/__init__.py", "json/"])
def test_a_directory_changed_since_the_dump_is_judged_natively(tmp_path, gained):
    # The script's directory gains a name after the dump (a log, a shadow of
    # an archived module, a folder without __init__): the native verdict
    # judges each hit from the names there now, without asking the
    # directory's FileFinder in Python; what plain import takes from there
    # is what SHARE runs.
    (tmp_path / "appmod.py").write_text("X = 'archived'\n")
    (tmp_path / "prog.py").write_text(
        "import sys\n"
        "try:\n"
        "    import appmod, json\n"
        "    print(getattr(appmod, 'X', None), getattr(json, 'X', 'stdlib'))\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
        "print('search in Python:', 'pycds._search' in sys.modules, file=sys.stderr)\n")
    img = str(tmp_path / "arc" / "a.img")
    os.mkdir(tmp_path / "arc")
    assert run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
    target = tmp_path / gained
    if gained.endswith("/"):
        target.mkdir()
    else:
        target.parent.mkdir(exist_ok=True)
        target.write_text("X = 'local'\n")
    plain = run_python(["prog.py"], cwd=tmp_path)
    r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert (r.rc, r.out) == (plain.rc, plain.out) and r.rc == 0, (plain, r)
    shadowed = {"json.py": "json", f"appmod{EXT}": "appmod",
                "appmod/__init__.py": "appmod"}.get(gained)
    if shadowed != "appmod":        # (an empty extension module fails)
        assert ("json" in r.served()) == (shadowed != "json"), r
    assert ("appmod" in r.served()) == (shadowed is None or shadowed == "json"), r
    if shadowed is None:
        assert "search in Python: False" in r.err, r


def dumped_app(tmp_path, files, prog):
    """``tmp_path/app`` with ``files`` (path -> text; a path ending in "/"
    is a directory) and ``prog.py``, its modules compiled to timestamp
    ``.pyc`` files and its directories older than a racy stamp
    (pycds._search), dumped by a run of ``prog.py``: (app, archive path)."""
    import compileall
    app = tmp_path / "app"
    app.mkdir()
    for rel, text in files.items():
        if rel.endswith("/"):
            (app / rel).mkdir(parents=True)
        else:
            (app / rel).parent.mkdir(parents=True, exist_ok=True)
            (app / rel).write_text(text)
    (app / "prog.py").write_text(prog)
    compileall.compile_dir(str(app), quiet=1)
    time.sleep(2.1)
    img = str(tmp_path / "a.img")
    assert run_python(["prog.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
    return app, img


CACHE_PROG = """\
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, d) for d in ("gen", "lib")]
def cached():
    return sorted(os.path.relpath(key, here) + " " + type(finder).__name__
                  for key, finder in sys.path_importer_cache.items()
                  if key.startswith(here))
import m
print(m.WHERE, cached())
import pkg.sub
print(pkg.sub.WHERE, cached())
"""


@pytest.mark.parametrize("change", ["none", "shadowed", "package shadowed"])
def test_the_path_importer_cache_is_left_as_plain_import_leaves_it(tmp_path, change):
    # The entries of a search not in sys.path_importer_cache yet get their
    # finders (importlib's own hooks run before the native verdict); where
    # the verdict is no (a module now found earlier on the path), they are
    # taken out again, and plain import's search puts in only those it
    # reaches.
    app, img = dumped_app(tmp_path, {"gen/": "", "lib/m.py": "WHERE = 'lib'\n",
                                     "lib/pkg/__init__.py": "",
                                     "lib/pkg/sub.py": "WHERE = 'lib'\n"}, CACHE_PROG)
    if change == "shadowed":
        (app / "gen" / "m.py").write_text("WHERE = 'gen'\n")
    elif change == "package shadowed":
        (app / "gen" / "pkg").mkdir()
        (app / "gen" / "pkg" / "__init__.py").write_text("")
        (app / "gen" / "pkg" / "sub.py").write_text("WHERE = 'gen'\n")
    share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
    plain = run_python(["prog.py"], cwd=app)
    assert plain.rc == 0 and ("lib FileFinder" in plain.out.splitlines()[0]) \
        == (change != "shadowed"), plain
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)
    assert ("m" in share.served()) == (change != "shadowed"), share
    assert ("pkg.sub" in share.served()) == (change != "package shadowed"), share


SHADOW_PROG = """\
import os, sys, zipimport
from importlib.machinery import PathFinder
here = os.path.dirname(os.path.abspath(__file__))
calls, opened = [], []
if os.environ.get("PATCH"):
    hooks = PathFinder._path_hooks
    def logged(path):
        calls.append(os.path.relpath(path, here))
        return hooks(path)
    PathFinder._path_hooks = staticmethod(logged)
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].endswith("zipped"):
        opened.append(os.path.relpath(args[0], here))
sys.addaudithook(audit)
sys.path[:0] = [os.path.join(here, d) for d in ("a", "zipped", "c")]
import m
print(m.WHERE, calls, opened, sorted(os.path.relpath(p, here)
                                     for p in zipimport._zip_directory_cache))
"""


@pytest.mark.parametrize("patch", ["", "1"])
def test_hooks_plain_import_does_not_reach_do_not_run(tmp_path, patch):
    # A module now found before the directory the dump found it in: plain
    # import runs no hook past it, and reads no zip file there (a directory
    # of the recorded search, now a zip file); nor does SHARE, also when
    # the program wraps PathFinder._path_hooks.
    import zipfile
    app, img = dumped_app(tmp_path, {"a/": "", "zipped/": "", "c/m.py": "WHERE = 'c'\n"},
                          SHADOW_PROG)
    (app / "a" / "m.py").write_text("WHERE = 'a'\n")
    (app / "zipped").rmdir()
    with zipfile.ZipFile(app / "zipped", "w") as z:
        z.writestr("other.py", "")
    share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img, PATCH=patch)
    plain = run_python(["prog.py"], cwd=app, PATCH=patch)
    assert plain.rc == 0 and plain.out == "a %s [] []\n" % (["a"] if patch else []), plain
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)


PKG_INIT = """\
import os
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
__path__ = [os.path.join(here, "d1"), os.path.join(here, "d2")]
"""

WATCH_PROG = """\
import os, sys, zipimport
from importlib.machinery import FileFinder, SourceFileLoader
here = os.path.dirname(os.path.abspath(__file__))
D1, D2 = os.path.join(here, "d1"), os.path.join(here, "d2")
import pkg
what = os.environ.get("WATCH", "")
seen, log = [], []
def cached():
    c = sys.path_importer_cache
    return (D1 in c, D2 in c)
def tracer(frame, event, arg):
    if not seen or seen[-1] != cached():
        seen.append(cached())
if what == "trace":
    sys.settrace(tracer)
elif what == "one-shot loaders":
    # importlib's own hook code for FileFinder, with suffixes that can be
    # iterated once.
    sys.path_hooks[-1] = FileFinder.path_hook((SourceFileLoader, (s for s in [".py"])))
elif what == "rewriting hook":
    # A ZipImportError of the program's, which zipimporter looks up as it
    # refuses d1: it rewrites the module plain import then finds in d2.
    class Rewriting(zipimport.ZipImportError):
        def __init__(self, *args, **kwargs):
            if kwargs.get("path") == D1 and not log:
                log.append("rewritten")
                with open(os.path.join(D2, "m.py"), "w") as f:
                    f.write("WHERE = 'd2, rewritten by the hook'\\n")
            super().__init__(*args, **kwargs)
    zipimport.ZipImportError = Rewriting
elif what == "patched internals":
    class Refused(zipimport.ZipImportError):
        def __init__(self, *args, **kwargs):
            log.append("zipimporter refused " + os.path.basename(kwargs.get("path", "?")))
            super().__init__(*args, **kwargs)
    zipimport.ZipImportError = Refused
    def new(cls, path, *details):
        log.append("FileFinder " + os.path.basename(path))
        return object.__new__(cls)
    FileFinder.__new__ = new
try:
    import pkg.m
    print(pkg.m.WHERE)
except ImportError as e:
    print("ImportError", e)
sys.settrace(None)
print(seen, log, cached())
"""


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("watch", ["trace", "one-shot loaders", "patched internals",
                                   "rewriting hook"])
def test_what_the_program_sees_of_the_path_hooks(tmp_path, watch, stale):
    # A package's first submodule import, the package's two directories
    # not in sys.path_importer_cache yet: the states of the cache a trace
    # function sees, a FileFinder hook whose loader details can be read
    # once (plain import's second directory gets none), hooks whose
    # importlib internals the program replaced (one of them rewriting the
    # module where plain import then finds it); with the archive current
    # or stale (a module put in the first directory after the dump: plain
    # import stops there, and runs no hook for the second).
    app, img = dumped_app(tmp_path, {"pkg/__init__.py": PKG_INIT, "d1/other.py": "",
                                     "d2/m.py": "WHERE = 'd2'\n"}, WATCH_PROG)
    if stale:
        (app / "d1" / "m.py").write_text("WHERE = 'd1'\n")
    share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, WATCH=watch)
    (app / "d2" / "m.py").write_text("WHERE = 'd2'\n")
    plain = run_python(["prog.py"], cwd=app, WATCH=watch)
    assert plain.rc == 0, plain
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)
    if watch == "trace":
        assert plain.out.startswith("d1" if stale else "d2"), plain
        assert ("pkg.m" in share.served()) != stale, share


DEPTH_PROG = """\
import sys
import pkg
def f(k):
    if k == 0:
        import pkg.sub
        return
    f(k - 1)
try:
    f(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print("ok")
except RecursionError:
    print("RecursionError")
"""


def test_a_first_submodule_import_is_as_deep_as_plain_imports(tmp_path):
    # The deepest recursion from which a package's first submodule import
    # still succeeds is the same with and without pycds: the path hooks run
    # as deep in the stack as PathFinder runs them.
    app, img = dumped_app(tmp_path, {"pkg/__init__.py": "", "pkg/sub.py": ""}, DEPTH_PROG)

    def deepest(**env):
        lo, hi = 100, sys.getrecursionlimit() + 100
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            out = run_python(["prog.py", str(mid)], cwd=app, **env).out
            lo, hi = (mid, hi) if out == "ok\n" else (lo, mid)
        return lo

    share = deepest(PYCDSMODE="SHARE", PYCDSARCHIVE=img)
    assert share == deepest(), share
    r = run_python(["prog.py", str(share)], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert "pkg.sub" in r.served(), r


HOOK_CLASS_PROG = """\
import os, sys
from importlib.machinery import FileFinder
here = os.path.dirname(os.path.abspath(__file__))
made = []
class Finder(FileFinder):
    def __init__(self, path, *details):
        made.append(os.path.relpath(path, here))
        super().__init__(path, *details)
hook = sys.path_hooks[-1]
if os.environ.get("HOOK"):
    sys.path_hooks[-1] = Finder.path_hook(*hook.__closure__[
        hook.__code__.co_freevars.index("loader_details")].cell_contents)
    sys.path_importer_cache.clear()
sys.path.insert(0, os.path.join(here, "lib"))
import m
print(m.WHERE, made)
"""


def test_a_program_hook_like_importlibs_runs_as_plain_import_runs_it(tmp_path):
    # FileFinder.path_hook of a program's FileFinder subclass is the
    # closure importlib's own hook is, for another class: running it runs
    # the program's code, so it runs where PathFinder runs it, and as often
    # (dumped with importlib's hook, so that the search was recorded).
    app, img = dumped_app(tmp_path, {"lib/m.py": "WHERE = 'lib'\n"}, HOOK_CLASS_PROG)
    share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img, HOOK="1")
    plain = run_python(["prog.py"], cwd=app, HOOK="1")
    assert plain.rc == 0 and plain.out.startswith("lib ['lib']"), plain
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)


def test_a_search_method_replaced_before_the_first_import_is_called(tmp_path):
    # The stock methods are those pycds started with: one the program
    # replaced before its first import is not taken for the stock one, and
    # plain import's calls of it are made.
    prog = ("from _frozen_importlib_external import PathFinder\n"
            "calls = []\n"
            "real = PathFinder.find_spec\n"
            "def find_spec(name, path=None, target=None):\n"
            "    calls.append(name)\n"
            "    return real(name, path, target)\n"
            "PathFinder.find_spec = staticmethod(find_spec)\n"
            "import json\n"
            "print(sorted(n for n in calls if n.startswith('json')))\n")
    img = str(tmp_path / "a.img")
    plain = run_python(["-c", prog], cwd=tmp_path)
    assert run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP",
                      PYCDSARCHIVE=img).rc == 0
    r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
    assert plain.rc == 0 and "json.decoder" in plain.out, plain
    assert (r.rc, r.out) == (plain.rc, plain.out), (plain, r)


HOOKED_PROG = """\
import os, signal, sys
here = os.path.dirname(os.path.abspath(__file__))
lib, gen = os.path.join(here, "lib"), os.path.join(here, "gen")
calls = []
def hook(entry):
    calls.append(os.path.basename(entry))
    what = os.environ.get("HOOK")
    if what == "rewrite" and entry == lib and calls.count("lib") == 1:
        with open(os.path.join(lib, "m.py"), "w") as f:
            f.write("WHERE = 'lib, rewritten by the hook'\\n")
    elif what == "shadow" and entry == gen:
        with open(os.path.join(gen, "m.py"), "w") as f:
            f.write("WHERE = 'gen, made by the hook'\\n")
    elif what == "interrupt" and entry == lib:
        raise KeyboardInterrupt
    elif what == "new entry" and entry == gen:
        rewrite()
    raise ImportError
def rewrite():
    with open(os.path.join(lib, "m.py"), "w") as f:
        f.write("WHERE = 'lib, rewritten by the hook'\\n")
class Finder:
    # The program's path entry finder: it rewrites m and finds nothing.
    def find_spec(self, name, target=None):
        if name == "m" and what == "program's finder":
            rewrite()
    def invalidate_caches(self):
        pass
what = os.environ.get("HOOK")
sys.path_hooks.insert(0, hook)
if os.environ.get("LAYOUT"):
    # (Dumped so too.)  The native call's stats taken, the program's code
    # changes m: the program's own finder of an entry on the search, or
    # the hook of an entry put before the recorded ones.
    sys.path_importer_cache["<finder>"] = Finder()
    sys.path[:0] = ["<finder>", lib]
    import first
    if what == "new entry":
        sys.path.insert(0, gen)
else:
    sys.path[:0] = [gen, lib]
try:
    import m
    print(m.WHERE)
except BaseException as e:
    print("raised", type(e).__name__)
print("hook calls", calls.count("lib"), calls.count("gen"))
"""


@pytest.mark.parametrize("check", ["mtime", "hash"])
@pytest.mark.parametrize("what", ["none", "rewrite", "shadow", "interrupt",
                                  "new entry", "program's finder"])
def test_path_hooks_run_as_plain_import_runs_them(tmp_path, what, check):
    # A search entry not in sys.path_importer_cache yet: its path hooks run
    # once, in the search's order, what they raise propagates, and the hit
    # is judged on the files as the hooks left them (a hook that writes the
    # module, or one that shadows it, is seen as plain import sees it),
    # by the native verdict (mtime) or in Python (hash).
    import compileall
    app = tmp_path / "app"
    (app / "lib").mkdir(parents=True)
    (app / "gen").mkdir()
    (app / "lib" / "m.py").write_text("WHERE = 'lib'\n")
    (app / "lib" / "first.py").write_text("")
    (app / "prog.py").write_text(HOOKED_PROG)
    compileall.compile_dir(str(app / "lib"), quiet=1)
    time.sleep(2.1)
    img = str(tmp_path / "a.img")
    layout = "1" if what in ("new entry", "program's finder") else ""
    assert run_python(["prog.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                      LAYOUT=layout).rc == 0
    share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYCDSCHECK=check, HOOK=what, LAYOUT=layout)
    (app / "lib" / "m.py").write_text("WHERE = 'lib'\n")
    (app / "gen" / "m.py").unlink(missing_ok=True)
    plain = run_python(["prog.py"], cwd=app, HOOK=what, LAYOUT=layout)
    expect = {"none": "lib", "rewrite": "lib, rewritten by the hook",
              "shadow": "gen, made by the hook", "interrupt": "raised KeyboardInterrupt",
              "new entry": "lib, rewritten by the hook",
              "program's finder": "lib, rewritten by the hook"}
    assert plain.out.splitlines()[0] == expect[what], plain
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)
    assert ("m" in share.served()) == (what == "none"), share


def test_what_the_program_raises_after_the_native_stats_propagates(tmp_path):
    # A signal handler's exception is delivered once the native call has
    # returned, in pycds's Python code: the program's (here a trace
    # function's, at that point), not a reason to drop the archive.
    img = str(tmp_path / "a.img")
    code = "import json, csv"
    r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert r.rc == 0, r
    prog = """if 1:
        import sys
        import json      # served: the native module is loaded
        def tracer(frame, event, arg):
            if event == "return" and frame.f_code.co_name in ("find", "hit") \\
                    and frame.f_code.co_filename.endswith("_nativeapi.py"):
                raise TimeoutError("from the trace function")
            return tracer if event == "call" else None
        sys.settrace(tracer)
        try:
            import csv
        except TimeoutError as e:
            print("raised", e)
        sys.settrace(None)
        import csv
        import pycds.share as f
        print(f._installed.archive.disabled, csv.QUOTE_ALL)
    """
    r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert r.rc == 0 and r.warnings() == [], r
    assert r.out == "raised from the trace function\nFalse 1\n", r


@pytest.mark.parametrize("check", ["hash", "unchecked"])
def test_searches_replayed_in_python_are_counted(tmp_path, check):
    # Under PYCDSCHECK=hash or unchecked every hit is judged in Python
    # (pycds._search replays the search): stats() counts those replays.
    app, arc = tmp_path / "app", tmp_path / "arc"
    app.mkdir()
    arc.mkdir()
    (app / "prog.py").write_text(
        "import json, email.message, pycds, pycds._search as s\n"
        "print(pycds.stats()['searches_replayed'] == s.replayed > 0)\n")
    img = str(arc / "a.img")
    run_python(["prog.py"], cwd=app)
    time.sleep(2.1)
    assert run_python(["prog.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
    r = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSCHECK=check, PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "True\n" and "json.decoder" in r.served(), r
