"""A loaded module's objects are the objects this version's own unmarshal
would produce: same adaptive bytecode, never freed, and (3.12+) the
per-process state init_code gives a new code object: a fresh co_version
from the interpreter's counter and a PY_CODE_EVENT_CREATE for the code
watchers.  Each test compares what the running version has (checked with
ctypes, since Python does not expose these fields)."""

import ctypes
import inspect
import marshal
import sys
import types

import pytest

from test_archive import all_codes, archive_of

SRC = '''
import os
def outer(a, b=2, *args, k=3, **kw):
    def inner(x):
        return x + a
    for i in range(3):
        a += i
    return inner
class C:
    def m(self):
        return [v * 2 for v in (1, 2, 3)]
    async def am(self):
        return 1
NOT_NAME = "not an identifier!"
'''

HAS_CODE_VERSION = sys.version_info >= (3, 12)   # Include/cpython/code.h


def adaptive_bytes(co):
    """The inline bytecode (co_code_adaptive) of code object co."""
    return ctypes.string_at(id(co) + type(co).__basicsize__,
                            len(co.co_code))


@pytest.fixture
def loaded(tmp_path):
    code = compile(SRC, "/v/fid.py", "exec")
    index, arch = archive_of({"fid": code}, tmp_path)
    return code, arch, index.lookup("fid")


@pytest.mark.skipif(types.CodeType.__itemsize__ == 0,
                    reason="3.10 keeps bytecode in a bytes object, not inline")
def test_adaptive_bytecode_is_a_fresh_unmarshal(loaded):
    code, arch, entry = loaded
    got = arch.load(entry)
    fresh = marshal.loads(marshal.dumps(code))
    for g, f in zip(all_codes(got), all_codes(fresh), strict=True):
        assert adaptive_bytes(g) == adaptive_bytes(f), g.co_name


def test_archived_objects_are_never_freed(loaded):
    code, arch, entry = loaded
    got = arch.load(entry)
    ns = {}
    exec(got, ns)
    # 3.12+: the immortal count (PEP 683); 3.10/3.11: one no program reaches.
    for obj in (got, got.co_consts, ns["NOT_NAME"], got.co_linetable):
        assert sys.getrefcount(obj) >= 2 ** 32 - 1, obj


def codes_inner_first(co):
    """Code objects reachable from co, each after its constants (the
    order in which unmarshal creates them)."""
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes_inner_first(c)
    yield co


def _u32(addr):
    return ctypes.c_uint32.from_address(addr).value


def code_version_offset():
    """Offset of co_version, found as the one 32-bit field that counts up
    by one per new code object (init_code draws it from a counter)."""
    cs = [compile(f"x = {i}", "/v/n.py", "exec") for i in range(3)]
    size = types.CodeType.__basicsize__
    hits = [off for off in range(16, size - 3, 4)
            if _u32(id(cs[1]) + off) == _u32(id(cs[0]) + off) + 1
            and _u32(id(cs[2]) + off) == _u32(id(cs[1]) + off) + 1]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.skipif(not HAS_CODE_VERSION, reason="co_version is new in 3.12")
def test_code_versions_are_drawn_at_load(loaded):
    code, arch, entry = loaded
    off = code_version_offset()
    before = compile("pass", "/v/b.py", "exec")
    got = arch.load(entry)
    after = compile("pass", "/v/a.py", "exec")
    versions = [_u32(id(c) + off) for c in codes_inner_first(got)]
    lo, hi = _u32(id(before) + off), _u32(id(after) + off)
    # Unique in the process (functions take it as func_version, the guard
    # of specialised calls), drawn in unmarshal's order: constants first.
    assert sorted(versions) == versions
    assert all(lo < v < hi for v in versions), (lo, versions, hi)
    assert len(set(versions)) == len(versions)
    ns = {}
    exec(got, ns)
    inner = ns["outer"](1)
    assert inner(1) == 5 and ns["C"]().m() == [2, 4, 6]


@pytest.mark.skipif(not HAS_CODE_VERSION, reason="code watchers are new in 3.12")
def test_code_watchers_see_each_loaded_code_object(loaded):
    code, arch, entry = loaded
    created, others = [], []
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.py_object)

    def on_event(event, co):
        if event == 0:          # PY_CODE_EVENT_CREATE
            created.append(co)
        else:                   # PY_CODE_EVENT_DESTROY: the 3.12 loader's
            others.append((event, co.co_name))  # version replicas, once
        return 0

    callback = callback_type(on_event)
    add = ctypes.pythonapi.PyCode_AddWatcher
    add.argtypes, add.restype = [callback_type], ctypes.c_int
    clear = ctypes.pythonapi.PyCode_ClearWatcher
    clear.argtypes, clear.restype = [ctypes.c_int], ctypes.c_int
    watcher = add(callback)
    assert watcher >= 0
    try:
        got = arch.load(entry)
        again = arch.load(entry)
    finally:
        assert clear(watcher) == 0
    assert again is got
    loaded_codes = list(all_codes(got))
    assert len(created) == len(loaded_codes)
    assert all(any(c is x for x in loaded_codes) for c in created)
    assert others == []       # as with marshal.loads: creations only


def share_run(tmp_path, probe):
    """``python -c probe`` under SHARE (PYCDSVERBOSE=1), with an archive of
    module m (SRC) dumped in tmp_path."""
    from support import run_python
    (tmp_path / "m.py").write_text(SRC)
    img = str(tmp_path / "a.img")
    run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    return run_python(["-c", probe], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                      PYCDSVERBOSE=1)


@pytest.mark.skipif(not HAS_CODE_VERSION, reason="co_version is new in 3.12")
def test_versions_drawn_from_the_counter_are_init_codes(tmp_path):
    # 3.12: the archive names libpython's private code version counter
    # where the writer finds it (its symbol table), and the loader then
    # draws from it directly instead of making a replica per code object.
    # Either way each loaded code object gets the version init_code would
    # give it: unique, between those of code objects made before and after.
    from pycds import _nativeapi, _nativewriter
    at = _nativewriter.version_counter_at()
    why = _nativeapi.ffi.string(_nativeapi.lib.pycds_last_error()).decode()
    if sys.version_info[:2] == (3, 12):
        assert at is not None or any(w in why for w in (
            "stripped", "no build id", "not the loaded build")), why
    else:
        assert at is None and "need no counter" in why, (at, why)
    probe = "import ctypes, types\n" + inspect.getsource(_u32) + \
        inspect.getsource(code_version_offset) + (
            "off = code_version_offset()\n"
            "before = compile('pass', '/v/b.py', 'exec')\n"
            "import m\n"
            "after = compile('pass', '/v/a.py', 'exec')\n"
            "codes = [m.outer.__code__, m.C.m.__code__, m.C.am.__code__]\n"
            "codes += [c for c in m.outer.__code__.co_consts if isinstance(c, types.CodeType)]\n"
            "vs = [_u32(id(c) + off) for c in codes]\n"
            "lo, hi = _u32(id(before) + off), _u32(id(after) + off)\n"
            "import pycds.share as f\n"
            "print(f._installed.archive._native.version_counter,\n"
            "      len(set(vs)) == len(vs) and all(lo < v < hi for v in vs),\n"
            "      m.outer(1)(1), m.C().m())\n")
    r = share_run(tmp_path, probe)
    assert r.out.split(maxsplit=3) == [str(at is not None), "True", "5", "[2, 4, 6]\n"], r
    assert "m" in r.served() and not r.warnings(), r


def test_loading_raises_no_audit_event(tmp_path):
    # marshal.loads of a .pyc raises no code.__new__ event; neither may the
    # load (the 3.12 loader once made its co_version replicas with
    # code.replace(), which raises one per code object).  A hook that
    # refuses code.__new__ (sandbox style) must not stop modules being served.
    probe = (
        "import sys\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'code.__new__':\n"
        "        seen.append(args)\n"
        "        raise RuntimeError('no new code objects here')\n"
        "sys.addaudithook(hook)\n"
        "import m\n"
        "print(m.outer(1)(1), seen)\n")
    r = share_run(tmp_path, probe)
    assert (r.rc, r.out) == (0, "5 []\n"), r
    assert "m" in r.served() and not r.warnings() and not r.fallbacks(), r
