"""The native archiver in-process: copy code objects with tricky constants,
load them back from a real archive file, compare and execute."""

import dis
import marshal
import math
import os
import sys
import types

import pytest
from hypothesis import given, settings, strategies as st

from pycds import _archive, errors
from pycds import _nativeapi as N, _nativewriter as NW
from pycds import _files as W
from pycds.errors import NativeError

from support import ROOT, flip_bits, load_script, run_python

T = load_script("twin_check")

TRICKY = r'''
import math
BIG = 2 ** 200 + 12345
NEG = -(3 ** 90)
SMALL = (-5, 0, 1, 256, 257, -6)
FLOATS = (0.0, -0.0, 1.5e-310, 1e308, float("inf"), float("-inf"))
NAN = float("nan")
CPLX = (1j, -0.0 - 0j, complex(-0.0, -0.0), 3 + 4j)
STRS = ("", "a", "é", "ascii", "Ünïcödé", "\u4e2d\u6587", "\U0001f600x",
        "\udcff lone", "nul\x00byte", "x" * 100000)
BYTES = (b"", b"\x00", bytes(range(256)), b"y" * 70000)
NEST = ((((((((((1,),),),),),),),),),)
FS = frozenset({"alpha", "beta", 1, 2.5, (1, 2), frozenset({"inner"})})
ELL = ...
def löwe(ärger=1, *, ß=2):
    "docstring"
    x = {1, 2, 3}
    if x & {2}:
        return ärger + ß, ELL, None, True, False
def gen():
    yield from range(3)
async def co():
    return 5
def cl(k):
    def inner(v):
        return v + k
    return inner
class K:
    a: int = 1
    def m(self):
        try:
            return 1 / 0
        except ZeroDivisionError as e:
            return type(e).__name__
        finally:
            pass
RESULT = (löwe(), list(gen()), cl(2)(3), K().m())
'''


def archive_of(codes, tmp_path, name="t.img"):
    """Write ``codes`` (name -> code) into a real archive; return the Index
    and a NativeArchive over it.  Raises NativeError where the writer
    refuses a code object."""
    path, refused = T.write_archive(codes.items(), str(tmp_path), name)
    if refused:
        raise NativeError("; ".join(refused.values()))
    index = _archive.Index.open(path)
    return index, N.NativeArchive(index.fd, index.header, NW.layout_id())


def slots_of(code):
    """``(slot, kind, 8 bytes the slot holds)`` of each relocation entry of
    ``code``'s chunk as the writer leaves it (slot: chunk offset)."""
    w = NW.Writer(1)
    c = w.add(code)
    heap, relocs = bytes(w.heap()), bytes(w.relocs())
    for i in range(c.reloc_first, c.reloc_first + c.reloc_count):
        e = int.from_bytes(relocs[4 * i:4 * i + 4], "little")
        at = c.chunk_off + (e & ~7)
        yield e & ~7, e & 7, heap[at:at + 8]


def all_codes(co):
    yield co
    for c in co.co_consts:
        if hasattr(c, "co_code"):
            yield from all_codes(c)


# The code attributes compared, as far as this interpreter's code type has
# them (co_qualname and co_exceptiontable are 3.11+; co_positions() too).
CODE_ATTRS = [a for a in (
    "co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars",
    "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_linetable",
    "co_exceptiontable", "co_flags", "co_argcount", "co_kwonlyargcount",
    "co_posonlyargcount", "co_stacksize", "co_nlocals")
    if hasattr(types.CodeType, a)]


def same_code(a, b):
    for x, y in zip(all_codes(a), all_codes(b), strict=True):
        for attr in CODE_ATTRS:
            assert getattr(x, attr) == getattr(y, attr), attr
        assert len(x.co_consts) == len(y.co_consts)
        assert list(x.co_lines()) == list(y.co_lines())
        if hasattr(x, "co_positions"):
            assert list(x.co_positions()) == list(y.co_positions())
        assert [i.opname for i in dis.get_instructions(x)] == \
            [i.opname for i in dis.get_instructions(y)]
    return True


class TestRoundTrip:
    def test_tricky_constants(self, tmp_path):
        code = compile(TRICKY, "/virtual/tricky.py", "exec")
        index, arch = archive_of({"tricky": code}, tmp_path)
        got = arch.load(index.lookup("tricky"))
        assert got is not code
        assert same_code(code, got)
        ns_plain, ns_arch = {}, {}
        exec(code, ns_plain)
        exec(got, ns_arch)
        for key in ("BIG", "NEG", "SMALL", "CPLX", "STRS", "BYTES", "NEST", "FS",
                    "ELL", "RESULT"):
            assert ns_arch[key] == ns_plain[key], key
        assert math.isnan(ns_arch["NAN"])
        assert [math.copysign(1, f) for f in ns_arch["FLOATS"]] == \
            [math.copysign(1, f) for f in ns_plain["FLOATS"]]
        assert ns_arch["FLOATS"] == ns_plain["FLOATS"]
        assert math.copysign(1, ns_arch["CPLX"][1].real) == -1.0
        assert ns_arch["löwe"].__doc__ == "docstring"

    def test_interned_names_are_the_interpreters(self, tmp_path):
        code = compile("import sys\nvalue = sys.maxsize\nsome_new_name_xyz = 1\n",
                       "/v/m.py", "exec")
        index, arch = archive_of({"m": code}, tmp_path)
        got = arch.load(index.lookup("m"))
        for a, b in zip(code.co_names, got.co_names):
            assert a is b or sys.intern(b) is b
        assert sys.intern("some_new_name_xyz") is got.co_names[-1]

    def test_frozenset_rebuilt_and_hashable(self, tmp_path):
        code = compile("S = frozenset({'p', 'q', 7})\nT = 'p' in {'p', 'z'}\n",
                       "/v/fs.py", "exec")
        index, arch = archive_of({"fs": code}, tmp_path)
        ns = {}
        exec(arch.load(index.lookup("fs")), ns)
        assert ns["S"] == frozenset({"p", "q", 7}) and "q" in ns["S"] and ns["T"]

    def test_load_is_once(self, tmp_path):
        code = compile("X = 1\n", "/v/x.py", "exec")
        index, arch = archive_of({"x": code}, tmp_path)
        e = index.lookup("x")
        assert arch.load(e) is arch.load(e)

    def test_many_modules_and_large_function(self, tmp_path):
        body = "\n".join(f"def f{i}(a, b={i}):\n    return a * {i} + b - {i}.5"
                         for i in range(400))
        codes = {f"m{i}": compile(body + f"\nK = {i}\n", f"/v/m{i}.py", "exec")
                 for i in range(40)}
        index, arch = archive_of(codes, tmp_path)
        for name in ("m0", "m17", "m39"):
            ns = {}
            exec(arch.load(index.lookup(name)), ns)
            assert ns["K"] == int(name[1:]) and ns["f399"](2) == 2 * 399 + 399 - 399.5
        assert index.lookup("m40") is None

    def test_deep_nesting(self, tmp_path):
        deep = "leaf"
        for _ in range(1500):
            deep = (deep, 1)
        base = compile("X = 1\n", "/v/deep.py", "exec")
        code = base.replace(co_consts=base.co_consts + (deep,))
        index, arch = archive_of({"deep": code}, tmp_path)
        a, b = arch.load(index.lookup("deep")).co_consts[-1], deep
        depth = 0
        while isinstance(b, tuple):      # compare level by level (no recursion)
            assert type(a) is tuple and a[1] == b[1] == 1
            a, b, depth = a[0], b[0], depth + 1
        assert (a, depth) == ("leaf", 1500)

    def test_too_deep_is_refused_whole(self):
        deep = "leaf"
        for _ in range(2100):
            deep = (deep,)
        base = compile("X = 1\n", "/v/deep.py", "exec")
        w = NW.Writer(1)
        w.add(base)
        before = bytes(w.heap())
        with pytest.raises(NativeError, match="nested deeper"):
            w.add(base.replace(co_consts=(deep,)))
        assert bytes(w.heap()) == before

    def test_shared_instances_are_as_unmarshal_gives_them(self, tmp_path):
        # Which constants are the interpreter's shared instances (small
        # ints, ''/1-char latin-1 strs, (), b'') must be as after
        # marshal.loads; on 3.10 these live on the heap (SINGLETON
        # relocations), on 3.11+ in the image (EXTERNAL).
        src = ("A = (0, 1, -5, 256, 257, -6, 2 ** 40, '', 'a', '+', 'é', "
               "'\\u0100', 'xy', (), b'', b'a', b'ab')\nb = c = A\n")
        code = compile(src, "/v/s.py", "exec")
        index, arch = archive_of({"s": code}, tmp_path)
        got = arch.load(index.lookup("s"))
        ref = marshal.loads(marshal.dumps(code))

        def shared(v):
            # v is the instance its type's constructors hand out for its value
            if type(v) is int:
                return v is int(repr(v))
            if type(v) is str:
                return v is (chr(ord(v)) if len(v) == 1 else v[:0] + v[:0])
            if type(v) is bytes:
                return v is (v[:0] if not v else None)
            return v is tuple(v)

        a_got = next(c for c in got.co_consts if type(c) is tuple)
        a_ref = next(c for c in ref.co_consts if type(c) is tuple)
        assert a_got == a_ref
        assert [shared(v) for v in a_got] == [shared(v) for v in a_ref]
        # (not vacuous: these are shared on every version)
        assert all(shared(a_got[i]) for i in (0, 1, 2, 3, 7, 9, 13, 14))
        # Interned 1-char names: the interned instance, and as shared as
        # after unmarshal (3.10: the latin-1 singleton is the interned one).
        assert list(got.co_names) == ["A", "b", "c"] == list(ref.co_names)
        for n, r in zip(got.co_names, ref.co_names):
            assert n is sys.intern(n) is r
            assert shared(n) == shared(r)

    @pytest.mark.parametrize("traced", [False, True])
    def test_code_that_has_run_is_copied_fresh(self, tmp_path, traced):
        # Code that has run holds per-process state: 3.10 an opcache and a
        # zombie frame after OPCACHE_MIN_RUNS (1024) calls; 3.11+ specialised
        # instructions and filled inline caches in co_code_adaptive, and on
        # 3.12+ instrumented instructions while a trace function is set.  The
        # copy must be the code as a fresh unmarshal makes it.
        src = ("def hot(n, k=2):\n    s = 0\n    for i in range(n):\n"
               "        s += len(str(i)) * k\n    return lambda: s + k\n"
               "class C:\n    def m(self, x):\n        return x.real + 1\n"
               "    def cold(self, x):\n        return x.real + self.m(x)\n")
        code = compile(src, "/v/hot.py", "exec")
        fresh = marshal.loads(marshal.dumps(code))
        ns = {}
        old = sys.gettrace()
        if traced:
            sys.settrace(lambda *a: None)
        try:
            exec(code, ns)
            hot, m = ns["hot"], ns["C"]().m
            for _ in range(3000):
                hot(3)
                m(2.5)
                m(7)
            assert hot.__code__ is next(c for c in code.co_consts
                                        if getattr(c, "co_name", "") == "hot")
            index, arch = archive_of({"hot": code}, tmp_path)
        finally:
            sys.settrace(old)
        if sys.version_info >= (3, 11) and not traced:
            # (not vacuous: the run specialised the bytecode in place)
            assert hot.__code__._co_code_adaptive != \
                next(c for c in fresh.co_consts
                     if getattr(c, "co_name", "") == "hot")._co_code_adaptive
        got = arch.load(index.lookup("hot"))
        for g, r in zip(all_codes(got), all_codes(fresh)):
            assert g.co_name == r.co_name and g.co_code == r.co_code
            if sys.version_info >= (3, 11):
                assert g._co_code_adaptive == r._co_code_adaptive, g.co_name
        got_ns = {"__builtins__": __builtins__}
        exec(got, got_ns)
        f = got_ns["hot"]
        assert f.__code__.co_cellvars == ("k", "s") == hot.__code__.co_cellvars
        for _ in range(3000):
            assert f(3)() == hot(3)() == 8
            assert got_ns["C"]().m(2.5) == m(2.5) == 3.5
        assert [f(n, 3)() for n in (0, 10, 200)] == \
            [hot(n, 3)() for n in (0, 10, 200)]

    def test_unsupported_constant_is_refused(self):
        code = compile("X = 1\n", "/v/x.py", "exec")
        bad = code.replace(co_consts=(1, None, [1, 2]))
        w = NW.Writer(1)
        with pytest.raises(NativeError, match="list"):
            w.add(bad)

    def test_static_objects_are_external(self):
        # None/True/False/Ellipsis and the type objects live in the
        # interpreter image on every version: EXTERNAL, never copied.  On
        # 3.10 nothing else is static, and the shared heap instances are
        # SINGLETON; on 3.11+ those are static too, so there is none.
        code = compile("X = (None, True, False, ..., 1.5, 'abc', 7, b'', ())\n",
                       "/v/e.py", "exec")
        external, kinds = set(), []
        for slot, kind, value in slots_of(code):
            kinds.append(kind)
            if kind == N.lib.PYCDS_RELOC_EXTERNAL:
                delta = int.from_bytes(value, "little", signed=True)
                external.add(id(None) + delta)      # the anchor: &_Py_NoneStruct
        statics = {id(o) for o in (None, True, False, ..., int, float, str, bytes,
                                   tuple, types.CodeType)}
        assert statics - {id(int), id(bytes)} <= external
        singletons = kinds.count(N.lib.PYCDS_RELOC_SINGLETON)
        if sys.version_info < (3, 11):
            assert external <= statics
            assert singletons >= 3       # 7, b'', () (and the empty name tuples)
        else:
            assert singletons == 0

    def test_a_4_byte_str_points_its_wstr_at_its_own_code_units(self):
        # 3.10/3.11 (PyUnicode_New with a 4-byte wchar_t): one DATA slot per
        # str of the 4-byte kind, the str's wstr, holding the chunk offset of
        # its code units; no str of another kind has one, and 3.12+ none.
        code = compile("X = ('\\U00010000\\U0010ffff', 'x\\U0001f600', '\\u4e2d', 'caf\\xe9')\n",
                       "/v/w.py", "exec")
        data = [(slot, int.from_bytes(value, "little"))
                for slot, kind, value in slots_of(code) if kind == N.lib.PYCDS_RELOC_DATA]
        if sys.version_info >= (3, 12):
            assert data == []
            return
        assert len(data) == 2
        # wstr is PyASCIIObject's last field; the code units follow
        # PyCompactUnicodeObject (sys.getsizeof of a 4-byte str of length
        # n is its size plus 4 (n + 1)).
        compact = sys.getsizeof("\U00010000") - 8
        wstr_at = sys.getsizeof("a") - 2 - 8
        for slot, target in data:
            assert target == slot - wstr_at + compact


def unmarshal_over(data, fill):
    """``marshal.loads(data)`` into memory that last held ``fill`` bytes:
    blocks of the pymalloc size classes from 48 to 512 bytes are filled and
    freed just before, and pymalloc hands out the block freed last first."""
    overhead = sys.getsizeof(b"")
    junk = [bytes([fill]) * (size - overhead)
            for size in range(48, 513, 16) for _ in range(64)]
    del junk
    return marshal.loads(data)


class TestDeterminism:
    def test_a_copy_holds_only_what_the_object_is(self):
        # What an object's memory holds besides its value -- alignment
        # padding no constructor writes, such as 3.11's after a code
        # object's _co_firsttraceable -- must not reach the heap: the archive
        # would carry stale process memory (uninitialised bytes to valgrind,
        # hashed and written) and differ from one dump to the next.  The same
        # code unmarshalled over memory that held 0x00 and then 0xff bytes
        # must copy to the same bytes.
        data = marshal.dumps(compile(TRICKY, "/virtual/tricky.py", "exec"))
        heaps = []
        for fill in (0x00, 0xFF):
            code = unmarshal_over(data, fill)
            w = NW.Writer(1)
            w.add(code)
            heaps.append(bytes(w.heap()))
        assert len(heaps[0]) == len(heaps[1])
        diff = [i for i, (a, b) in enumerate(zip(*heaps)) if a != b]
        assert not diff, f"{len(diff)} heap bytes differ, first at {diff[:8]}"


class TestCorruption:
    def test_flipped_heap_byte_is_detected(self, tmp_path):
        code = compile("X = 'hello'\n", "/v/x.py", "exec")
        index, _ = archive_of({"x": code}, tmp_path)
        path = index.path
        h = index.header
        e = index.lookup("x")
        index.close()
        flip_bits(path, h.heap_off + e.chunk_off + e.chunk_len // 2, 0x10)
        index = _archive.Index.open(path)
        arch = N.NativeArchive(index.fd, index.header, index.meta["layout"])
        with pytest.raises(NativeError, match="checksum"):
            arch.load(index.lookup("x"))
        with pytest.raises(NativeError, match="failed to load before"):
            arch.load(index.lookup("x"))

    def test_foreign_layout_is_refused(self, tmp_path):
        code = compile("X = 1\n", "/v/x.py", "exec")
        index, _ = archive_of({"x": code}, tmp_path)
        with pytest.raises(NativeError, match="another interpreter build"):
            N.NativeArchive(index.fd, index.header, "cpython-3.11;hex=0;build=bad")

    @pytest.mark.parametrize("cut", [0, 1, 100, 255, 256, 300, -1])
    def test_truncated_file_is_refused_at_open(self, tmp_path, cut):
        code = compile("X = 1\n", "/v/x.py", "exec")
        index, _ = archive_of({"x": code}, tmp_path)
        path = index.path
        size = os.path.getsize(path)
        index.close()
        with open(path, "r+b") as f:
            f.truncate(cut if cut >= 0 else size + cut)
        with pytest.raises(errors.ArchiveFormatError):
            _archive.Index.open(path)

    def test_loose_permissions_are_refused(self, tmp_path):
        code = compile("X = 1\n", "/v/x.py", "exec")
        index, _ = archive_of({"x": code}, tmp_path)
        os.chmod(index.path, 0o666)
        with pytest.raises(errors.ArchiveFormatError, match="writable by group or others"):
            _archive.Index.open(index.path)


class TestHash:
    def test_xxh64_known_values(self):
        # Reference values of XXH64 (xxHash's own test vectors).
        assert N.hash64(b"", 0) == 0xEF46DB3751D8E999
        assert N.hash64(b"a", 0) == 0xD24EC4F1A98C6E5B
        assert N.hash64(b"abc", 0) == 0x44BC2CF5AD770999
        data = bytes(range(256)) * 4
        assert N.hash64(data, 1) != N.hash64(data, 2)

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, 2**64 - 1))
    def test_xxh64_of_two_parts_is_xxh64_of_their_concatenation(self, a, b, seed):
        # A chunk's head and tail are read to two places (loader.c) and
        # checked as the one chunk the writer hashed.
        import xxhash
        from pycds._native import lib
        want = xxhash.xxh64(a + b, seed=seed).intdigest()
        assert N.hash64(a + b, seed) == want
        assert lib.pycds_hash64_2(a, len(a), b, len(b), seed) == want



def _has_fallocate(directory):
    """Whether the file system of ``directory`` has fallocate(2) (ramfs and
    some FUSE and network file systems do not: the writer then does
    without, native/archive/writer/file.c)."""
    import ctypes
    import errno
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fd = os.open(os.path.join(directory, "probe"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        ok = libc.fallocate(fd, 1, 0, 4096) == 0      # FALLOC_FL_KEEP_SIZE
        if not ok and ctypes.get_errno() not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(ctypes.get_errno(), "fallocate probe")
        return ok
    finally:
        os.close(fd)
        os.unlink(os.path.join(directory, "probe"))


class TestWriteAtomic:
    """pycds._files.write_atomic allocates the file's blocks before writing
    (native/archive/writer/file.c), keeping its size and content as the writes make them."""

    def test_blocks_are_allocated_before_anything_is_written(self, tmp_path):
        if not _has_fallocate(tmp_path):
            pytest.skip(f"no fallocate on the file system of {tmp_path}")
        fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            NW.preallocate(fd, 3 << 20)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        assert st.st_size == 0 and st.st_blocks * 512 >= 3 << 20

    def test_a_failure_is_an_oserror(self, tmp_path):
        import errno
        (tmp_path / "f").write_bytes(b"")
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as e:
                NW.preallocate(fd, 1 << 20)
            assert e.value.errno == errno.EBADF
        finally:
            os.close(fd)

    def test_a_file_put_there_while_writing_is_left(self, tmp_path, monkeypatch):
        # The check is made again just before the rename.
        path = tmp_path / "a.img"
        path.write_bytes(_archive.MAGIC)
        real = os.pwrite

        def pwrite(fd, data, off):
            path.unlink()
            path.write_text("the user's, written meanwhile\n")
            return real(fd, data, off)

        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(W.NotReplaceable, match="not a pycds archive"):
            W.write_atomic(str(path), [(0, b"new")], _archive.ARCHIVE_FILE)
        monkeypatch.undo()
        assert path.read_text() == "the user's, written meanwhile\n"
        assert os.listdir(tmp_path) == ["a.img"]

    @pytest.mark.parametrize("length", [None, 10000, 3 << 20])
    def test_replacing_an_archive_writes_exactly_the_parts(self, tmp_path, length):
        path = tmp_path / "a.img"
        path.write_bytes(_archive.MAGIC + b"old archive" * 100000)
        parts = [(0, b"head"), (4096, bytes(range(256)) * 40), (20000, memoryview(b"tail")),
                 (50000, b"")]
        W.write_atomic(str(path), parts, _archive.ARCHIVE_FILE, length)
        got = path.read_bytes()
        # The file's size is length, else the end of the last byte written.
        want = bytearray(max(20004, length or 0))
        for off, data in parts:
            want[off:off + len(data)] = data
        assert got == (want if length is None else want[:length])
        assert sorted(os.listdir(tmp_path)) == ["a.img"]


def test_status_codes_are_the_native_modules():
    # pycds.errors mirrors PYCDS_E_* of native/archive/pycds_native.h.
    names = [n for n in dir(N.lib) if n.startswith("PYCDS_E_")]
    assert len(names) == 10
    for name in names:
        assert getattr(errors, name[len("PYCDS_"):]) == getattr(N.lib, name), name


# ---- the archive-wide string table (docs/archive-format.md, INTERN) -------

FZ = load_script("fuzz_archive")

STR_HEAD = 48 if sys.version_info < (3, 12) else 40   # PyASCIIObject + wstr (3.10/3.11)

SHARED_A = "tab_shared_alpha = 1\ntab_only_in_a = 2\ndef fa(): return tab_shared_alpha\n"
SHARED_B = "tab_shared_alpha = 3\ntab_only_in_b = 4\ndef fb(): return tab_shared_alpha\n"


def intern_slots(heap, relocs, c):
    """``(slot, number, value)`` of each INTERN slot of chunk ``c`` as the
    writer leaves it (ASCII strs only: their code units follow the header)."""
    for i in range(c.reloc_first, c.reloc_first + c.reloc_count):
        e = int.from_bytes(relocs[4 * i:4 * i + 4], "little")
        if e & 7 != 2:
            continue
        at = c.chunk_off + (e & ~7)
        v = int.from_bytes(heap[at:at + 8], "little")
        s = c.chunk_off + (v & 0xFFFFFFFF)
        n = int.from_bytes(heap[s + 16:s + 24], "little")
        yield e & ~7, v >> 32, bytes(heap[s + STR_HEAD:s + STR_HEAD + n])


class TestStringTable:
    def test_each_interned_string_has_one_number_in_every_chunk(self):
        w = NW.Writer(1)
        ca = w.add(compile(SHARED_A, "/v/a.py", "exec"))
        cb = w.add(compile(SHARED_B, "/v/b.py", "exec"))
        heap, relocs = bytes(w.heap()), bytes(w.relocs())
        numbers = {}
        for c in (ca, cb):
            for _, n, value in intern_slots(heap, relocs, c):
                assert numbers.setdefault(value, n) == n, value
        assert sorted(numbers.values()) == list(range(w.nstrings()))
        a = {v for _, _, v in intern_slots(heap, relocs, ca)}
        b = {v for _, _, v in intern_slots(heap, relocs, cb)}
        assert b"tab_shared_alpha" in a & b and b"tab_only_in_b" in b - a

    def test_a_refused_chunk_gives_its_numbers_back(self):
        deep = "leaf"
        for _ in range(2100):
            deep = (deep,)
        w = NW.Writer(1)
        w.add(compile("tab_first = 1\n", "/v/first.py", "exec"))
        before = w.nstrings()
        refused = compile("tab_refused_name = 1\n", "/v/deep.py", "exec")
        with pytest.raises(NativeError, match="nested deeper"):
            w.add(refused.replace(co_consts=refused.co_consts + (deep,)))
        assert w.nstrings() == before
        c = w.add(compile("tab_refused_name = 2\n", "/v/next.py", "exec"))
        heap, relocs = bytes(w.heap()), bytes(w.relocs())
        got = {v: n for _, n, v in intern_slots(heap, relocs, c)}
        assert got[b"tab_refused_name"] >= before
        assert sorted(got.values())[-1] == w.nstrings() - 1

    def test_a_name_two_modules_share_is_the_interned_one(self, tmp_path):
        index, arch = archive_of({"a": compile(SHARED_A, "/v/a.py", "exec"),
                                  "b": compile(SHARED_B, "/v/b.py", "exec")}, tmp_path)
        a = arch.load(index.lookup("a"))
        b = arch.load(index.lookup("b"))
        name_a = a.co_names[a.co_names.index("tab_shared_alpha")]
        name_b = b.co_names[b.co_names.index("tab_shared_alpha")]
        fresh = "".join(["tab_shared_", "alpha"])
        assert name_a is name_b and sys.intern(fresh) is name_a
        fb = b.co_consts[[getattr(k, "co_name", "") for k in b.co_consts].index("fb")]
        assert fb.co_names[0] is name_a
        ns = {}
        exec(b, ns)
        assert ns["fb"]() == 3 and "tab_only_in_b" in ns

    def _model(self, tmp_path):
        path, refused = T.write_archive(
            [("a", compile(SHARED_A, "/v/a.py", "exec")),
             ("b", compile(SHARED_B, "/v/b.py", "exec"))], str(tmp_path), "m.img")
        assert not refused
        return FZ.Model.read(path)

    def _set_number(self, m, e, pick, number):
        """Give the INTERN slot of module e whose str is ``pick`` the string
        number ``number`` (the model re-signs when written)."""
        for i in range(e.reloc_first, e.reloc_first + e.reloc_count):
            v = m.reloc(i)
            if v & 7 != 2:
                continue
            at = e.chunk_off + (v & ~7)
            slot = int.from_bytes(m.heap[at:at + 8], "little")
            s = e.chunk_off + (slot & 0xFFFFFFFF)
            n = int.from_bytes(m.heap[s + 16:s + 24], "little")
            if bytes(m.heap[s + STR_HEAD:s + STR_HEAD + n]) == pick:
                slot = number << 32 | (slot & 0xFFFFFFFF)
                m.heap[at:at + 8] = slot.to_bytes(8, "little")
                return
        raise AssertionError(f"no INTERN slot for {pick!r}")

    def _open(self, tmp_path, m, verify=False):
        path = tmp_path / "re.img"
        path.write_bytes(m.to_bytes())
        index = _archive.Index.open(str(path))
        return index, N.NativeArchive(index.fd, index.header, NW.layout_id(), verify=verify)

    def test_a_string_number_out_of_range_is_refused(self, tmp_path):
        m = self._model(tmp_path)
        e = FZ.entry_of(m, "b")
        self._set_number(m, e, b"tab_only_in_b", m.header.reloc_count)
        index, arch = self._open(tmp_path, m)
        arch.load(index.lookup("a"))
        with pytest.raises(NativeError, match="string number .* out of range"):
            arch.load(index.lookup("b"))

    @pytest.mark.parametrize("verify", [False, True])
    def test_a_number_of_another_value_is_caught_by_the_deep_check(self, tmp_path, verify):
        # A re-signed archive whose chunk b gives its own name the number of
        # a's "tab_only_in_a": well formed, other code (as a changed name
        # would be), unless the deep check compares the values.
        m = self._model(tmp_path)
        w = NW.Writer(1)
        ca = w.add(compile(SHARED_A, "/v/a.py", "exec"))
        number = {v: n for _, n, v in intern_slots(bytes(w.heap()), bytes(w.relocs()), ca)}
        self._set_number(m, FZ.entry_of(m, "b"), b"tab_only_in_b", number[b"tab_only_in_a"])
        index, arch = self._open(tmp_path, m, verify=verify)
        arch.load(index.lookup("a"))
        if verify:
            with pytest.raises(NativeError, match="differs between chunks"):
                arch.load(index.lookup("b"))
        else:
            assert "tab_only_in_a" in arch.load(index.lookup("b")).co_names

    def test_chunks_carried_over_are_numbered_after_the_new_ones(self, tmp_path):
        # pycds.dumping.dumper._carry_over: a chunk of an earlier archive of the session
        # keeps one number per string of that archive, above those of the
        # archive being written.
        from pycds.dumping import dumper as _dumper
        old = NW.Writer(7)
        entries = []
        for k, (name, src) in enumerate((("a", SHARED_A), ("b", SHARED_B))):
            c = old.add(compile(src, f"/v/{name}.py", "exec"))
            entries.append(_archive.ModuleEntry(
                k, name, f"/v/{name}.py", False, None, 0, 0, b"", None, 0, 0, 0,
                "default", c.chunk_off, c.chunk_len, c.root_off, c.reloc_first,
                c.reloc_count, c.checksum, c.nobjects, None))
        meta = _archive.meta_for_this_interpreter()
        meta.update(layout=NW.layout_id(), session="s-1")
        heap, relocs = bytes(old.heap()), bytes(old.relocs())
        h, parts = _archive.file_sections(entries, len(heap), len(relocs) // 4, meta, 7)
        path = str(tmp_path / "old.img")
        W.write_atomic(path, [(0, h.pack())] + parts + [(h.heap_off, heap), (h.reloc_off, relocs)],
                       _archive.ARCHIVE_FILE)
        new = NW.Writer(9)
        new.add(compile("tab_new_only = 1\n", "/v/c.py", "exec"))
        first = new.nstrings()
        got, chunks, rels = _dumper._carry_over(path, "s-1", [], 9, len(new.heap()),
                                             len(new.relocs()) // 4, first, NW)
        assert [e.name for e in got] == ["a", "b"]
        numbers = {}
        for e, chunk, rel in zip(got, [c for c in chunks if len(c) > 8], rels):
            c = types.SimpleNamespace(chunk_off=0, reloc_first=0, reloc_count=len(rel) // 4)
            for _, n, v in intern_slots(chunk, rel, c):
                assert numbers.setdefault(v, n) == n
        assert sorted(numbers.values()) == list(range(first, first + len(numbers)))


GIVEN_BACK = """
import os, sys
import importlib.util
for _name in ("cprobe", "twin_check"):     # scripts/, by path (twin_check imports cprobe)
    _spec = importlib.util.spec_from_file_location(_name, os.path.join(sys.argv[1], _name + ".py"))
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])
T = sys.modules["twin_check"]
from pycds import _archive, _nativeapi as N, _nativewriter as NW
names = [f"tab_given_back_name_{i:04d}" for i in range(800)]
src_a = "".join(f"{n} = {i}\\n" for i, n in enumerate(names))
src_b = "".join(f"{n} = {i} + 1\\n" for i, n in enumerate(names))
path, _ = T.write_archive([("a", compile(src_a, "/v/a.py", "exec")),
                           ("b", compile(src_b, "/v/b.py", "exec"))], sys.argv[2])
index = _archive.Index.open(path)
arch = N.NativeArchive(index.fd, index.header, NW.layout_id())
ea, eb = index.lookup("a"), index.lookup("b")
exec(arch.load(ea), {})
code_b = arch.load(eb)
print(all(code_b.co_names[i] is sys.intern(n) for i, n in enumerate(names)))
exec(code_b, {})
del code_b
print(arch.release(ea) + arch.release(eb))
print(ea.chunk_len - ea.root_off + eb.chunk_len - eb.root_off)
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 chunks are kept whole")
def test_copies_of_names_an_earlier_module_interned_are_given_back(tmp_path):
    # b's body names 800 strings a interned first: b's copies sit in its
    # tail, and once b's body ran, the table's answer left them dead.  In a
    # fresh process: on 3.12+ code run after any tracer was set (an earlier
    # test's) keeps instrumentation data, and with it its tail.
    run = run_python(["-c", GIVEN_BACK, os.path.join(ROOT, "scripts"), str(tmp_path)],
                     cwd=str(tmp_path))
    assert run.rc == 0, run
    same, given, tails = run.out.split()
    assert same == "True"
    assert int(given) >= int(tails) - 3 * os.sysconf("SC_PAGESIZE"), (given, tails)


def test_an_archive_renamed_into_place_while_looked_at_is_looked_at_again(tmp_path, monkeypatch):
    # Another dump's rename between the lstat and the open of the check is
    # not a user's file: the check looks again (concurrent AUTO runs).
    path = tmp_path / "a.img"
    path.write_bytes(_archive.MAGIC)
    real_open = os.open
    swaps = []

    def open_(p, *args, **kwargs):
        if str(p) == str(path) and len(swaps) < 2:
            swaps.append(1)
            other = tmp_path / "b.img"
            other.write_bytes(_archive.MAGIC)
            os.replace(other, path)
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    W.check_replaceable(str(path), _archive.ARCHIVE_FILE)     # does not raise
    assert len(swaps) == 2
