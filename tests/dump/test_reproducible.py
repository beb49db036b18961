"""Reproducible archives (issue #25): the same interpreter and the same files
give the same bytes, whatever the hash seed, the working directory, the time
or the order the program happened to import in (docs/archive-format.md,
"What the bytes depend on")."""

import errno
import os
import textwrap
import time

from support import installed, run_python, settle
from pycds import _archive
from pycds.dumping import dumper as _dumper

# Imports in an order that depends on the hash seed and on thread timing
# (of modules that import no package another thread imports: importlib's
# module locks would see a deadlock, with pycds or without).
MAIN = textwrap.dedent("""\
    import importlib, threading
    names = {"rmod_a", "rmod_b", "json", "decimal"}
    threads = [threading.Thread(target=importlib.import_module, args=(n,))
               for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in {"rmod_c", "rpkg.y", "rloop"}:
        importlib.import_module(name)
    import rloop
    print(rloop.LAST.count(" ") == 1)
    """)

TREE = {
    "rmod_a.py": "import rmod_b\nA = ('a', 1.5, b'x', frozenset({3, 4}))\n",
    "rmod_b.py": "B = {'b': [1, 2]}\n",
    "rmod_c.py": "from rpkg import x\nC = x.X + 1\n",
    "rpkg/__init__.py": "from . import y\n",
    "rpkg/x.py": "X = 41\n",
    "rpkg/y.py": "Y = 'y'\n",
    # The loop variable keeps one item of the frozenset constant alive, the
    # last one the hash seed's order gives.
    "rloop.py": textwrap.dedent("""\
        for LAST in {"alpha one", "beta two", "gamma three", "delta four", "eps five"}:
            pass
        """),
}


def make_tree(root):
    app = root / "app"
    for rel, text in {"main.py": MAIN, **TREE}.items():
        path = app / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel != "main.py":
            installed(path)
    settle(app)
    _quiet(app)
    return app


def _quiet(*dirs):
    """Wait until no directory under ``dirs`` changed in the last two
    seconds and a bit: one that did gets no stamp in the dump's search
    record (pycds._search), one that did not gets one."""
    newest = 0
    for d in dirs:
        for here, _, _ in os.walk(d):
            st = os.stat(here)
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    wait = newest / 1e9 + 2.3 - time.time()
    if wait > 0:
        time.sleep(wait)


def dump(app, archive, cwd, seed):
    r = run_python([str(app / "main.py")], cwd=cwd, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=str(archive), PYTHONHASHSEED=str(seed))
    assert (r.rc, r.out, r.warnings()) == (0, "True\n", []), r
    return archive.read_bytes()


def test_two_dumps_are_byte_identical(tmp_path):
    app = make_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = dump(app, out / "one.cds", tmp_path, 1)
    second = dump(app, out / "two.cds", elsewhere, 4242)
    assert first == second
    # ... and the archive is one that serves the program.
    r = run_python([str(app / "main.py")], cwd=tmp_path, PYCDSMODE="SHARE",
                   PYCDSARCHIVE=str(out / "one.cds"), PYCDSVERBOSE=1)
    assert r.out == "True\n" and r.warnings() == [], r
    assert {"rloop", "rmod_a", "rmod_c", "rpkg", "rpkg.x", "json"} <= set(r.served()), r


def test_a_dump_session_leaves_its_id_out_of_the_bytes(tmp_path):
    # A DUMP run is a session (its children merge into its archive); the
    # session's random id is an extended attribute of the file, not content.
    app = make_tree(tmp_path)
    archive = tmp_path / "s.cds"
    first = dump(app, archive, tmp_path, 7)
    ids = [os.getxattr(archive, _dumper.SESSION_XATTR)]
    second = dump(app, archive, tmp_path, 8)
    ids.append(os.getxattr(archive, _dumper.SESSION_XATTR))
    assert first == second and ids[0] != ids[1]
    index = _archive.Index.open(str(archive))
    try:
        assert "session" not in index.meta
        assert _dumper.archive_session(index) == ids[1].decode()
    finally:
        index.close()


def test_session_kept_in_the_meta_without_extended_attributes(tmp_path, monkeypatch):
    # A file system that takes no user.* attribute (tmpfs before Linux 6.6):
    # the session goes in the meta, so that the session's processes still
    # merge (the bytes then differ between sessions).
    import json
    archive = str(tmp_path / "m.cds")

    def refuse(*args, **kwargs):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(os, "setxattr", refuse)
    n, _ = _dumper.dump_modules([("json", json)], archive, session="0123456789abcdef-x")
    assert n >= 1
    assert _dumper._session_of(archive) == "0123456789abcdef-x"
    index = _archive.Index.open(archive)
    try:
        assert index.meta["session"] == "0123456789abcdef-x"
    finally:
        index.close()


def test_the_archive_id_follows_the_content(tmp_path):
    # It keys every checksum: two archives that differ anywhere differ in
    # it, so a part of one never passes for a part of the other.
    import json, csv
    a, b, c = (str(tmp_path / n) for n in ("a.cds", "b.cds", "c.cds"))
    _dumper.dump_modules([("json", json)], a)
    _dumper.dump_modules([("json", json)], b)
    _dumper.dump_modules([("json", json), ("csv", csv)], c)
    ids = []
    for p in (a, b, c):
        index = _archive.Index.open(p)
        ids.append(index.header.archive_id)
        index.close()
    assert ids[0] == ids[1] != ids[2]
    assert open(a, "rb").read() == open(b, "rb").read()


def test_frozenset_order_does_not_follow_the_programs_references(tmp_path):
    # rloop's loop variable holds one item more; the order unmarshal adds
    # the items in is read off a fresh copy of the .pyc, not inferred from
    # the counts the program left.
    app = make_tree(tmp_path)
    code = f"""
import sys
sys.path.insert(0, {str(app)!r})
import rloop, pycds.dumping.dumper as d, pycds._nativeapi as N
from pycds.dumping import capture as _capture
spec = rloop.__spec__
code = _capture.ran("rloop", rloop, spec.origin, __import__("os").stat(spec.origin))[0]
head = open(spec.cached, "rb").read(16)
orders = d._frozenset_orders(code, spec.cached, head)
fs = next(c for c in code.co_consts if type(c) is frozenset)
print(list(orders[id(fs)]) == sorted(fs, key=lambda s: (len(s), s)))
"""
    for seed in (1, 2, 3):
        r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=str(tmp_path / "x.cds"), PYTHONHASHSEED=str(seed))
        assert r.out == "True\n", r
