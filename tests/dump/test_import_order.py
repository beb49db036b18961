"""Chunks are laid out in the order imports start, the order a SHARE run
asks for them (predicted from the code: pycds.dumping.order; TRACE records
it: pycds.dumping.import_order), not sys.modules' finishing order."""

from support import run_python
from pycds import _archive

# opkg's body imports its submodules: they finish before it does.
TREE = {
    "opkg/__init__.py": "from . import a\nfrom . import b\n",
    "opkg/a.py": "import omid\nA = 1\n",
    "opkg/b.py": "B = 2\n",
    "omid.py": "M = 3\n",
    "olast.py": "L = 4\n",
}
STARTED = ["opkg", "opkg.a", "omid", "opkg.b", "olast"]
IMPORT = "import sys, opkg, olast; print(','.join(sys.modules))"


def make_tree(root):
    for rel, text in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def ours(names):
    return [n for n in names if n in STARTED]


def archived(img):
    entries = _archive.Index.open(img).entries()
    assert [e.number for e in entries] == sorted(e.number for e in entries)
    return ours([name for _, name in sorted((e.chunk_off, e.name) for e in entries)])


def test_dump_lays_out_chunks_in_start_order(tmp_path):
    make_tree(tmp_path)
    img = str(tmp_path / "o.img")
    r = run_python(["-c", IMPORT], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert r.rc == 0, r
    # sys.modules has them in finishing order ...
    assert ours(r.out.strip().split(",")) == ["omid", "opkg.a", "opkg.b", "opkg", "olast"]
    # ... the archive in the order the imports started
    assert archived(img) == STARTED
    share = run_python(["-c", IMPORT], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert ours(share.served()) == STARTED, share


def test_trace_list_and_api_dump_follow_start_order(tmp_path):
    make_tree(tmp_path)
    lst, img = str(tmp_path / "o.lst"), str(tmp_path / "api.img")
    r = run_python(["-c", IMPORT], cwd=tmp_path, PYCDSMODE="TRACE", PYCDSLIST=lst)
    assert r.rc == 0, r
    assert ours(open(lst).read().split()) == STARTED
    code = (f"import sys, pycds; pycds._dump({lst!r}, {img!r}); "
            "print(any(type(f).__name__ == 'ImportOrderRecorder' or "
            "getattr(f, '__name__', '') == 'ImportOrderRecorder' for f in sys.meta_path))")
    r = run_python(["-c", code], cwd=tmp_path)
    assert r.out.strip() == "False", r      # _dump takes its recorder off again
    assert archived(img) == STARTED
