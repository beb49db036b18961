"""The twin check (scripts/twin_check.py) on a reduced set: a module of
tricky constants and real standard-library modules must load from an
archive exactly as a fresh marshal.loads of their .pyc leaves them, field by
field in memory; and the check must see a change to any one field."""

import contextlib
import ctypes
import marshal
import sys
import types

import pytest

from support import load_script

T = load_script("twin_check")

SOURCE = r'''
import math
BIG = @BIG@
NEG = -@NEG@
HUGE = @HUGE@
SMALL = (-5, 0, 1, 256, 257, -6)
FLOATS = (0.0, -0.0, 1.5e-310, 1e308, float("inf"))
CPLX = (1j, -0.0 - 0j, complex(-0.0, -0.0), 3 + 4j)
STRS = ("", "a", "é", "ÿ", "ascii", "Ünïcödé", "café", "\u4e2d\u6587", "\u0100",
        "\U0001f600x", "\U00010000\U0010ffff", "UCS:é€\U0010ffff", "\udcff lone",
        "nul\x00byte", "x" * 4000, "ü" * 1000, "中" * 1000, "😀" * 1000)
BYTES = (b"", b"\x00", b"a", bytes(range(256)), b"y" * 4000)
NAMES = ("alpha", "beta")
SAME = (@BIG@, @BIG@)
NEST = ((((((((((1,),),),),),),),),),)
def member(x):
    return x in {"alpha", "beta", 1, 2.5, (1, 2), -0.0, b"by", "Ünï", @BIG@}
𐌰𐌱 = "gothic"
def 𠀀(ä, *, 𐌲=1):
    return ä + 𐌲
def löwe(ärger=1, *, ß=2):
    "docstring"
    x = {1, 2, 3}
    if x & {2}:
        return ärger + ß, ..., None, True, False
def gen():
    yield from range(3)
async def co():
    return 5
async def agen():
    yield "é"
def cl(k):
    def inner(v):
        nonlocal k
        k += 1
        return v + k
    return inner
def cellarg(a, b, *c, **d):
    return lambda: (a, d)
class K:
    a: int = 1
    def m(self):
        try:
            return 1 / 0
        except ZeroDivisionError as e:
            return type(e).__name__
        finally:
            pass
    class Inner:
        def n(self):
            return __class__
def fstr(x, w=10):
    return f"{x!r:>{w}} {x=} {'é'} {x:{'<'}{w}}"
def matcher(v):
    match v:
        case [1, *rest]:
            return rest
        case {"k": str() as s}:
            return s
        case K(a=1) | None:
            return "K"
        case ("é", 2.5, -3j):
            return "tuple"
        case _:
            return None
comp = [x * y for x in range(3) for y in (1, 2) if x]
for _i in range(300):
    RESULT = (löwe(), list(gen()), cl(2)(3), K().m(), 𠀀(1), fstr("é"),
              matcher([1, 2]), matcher(None), matcher({"k": "v"}), cellarg(1, 2)())
'''

# try/except* is 3.11+ syntax.
EXCEPT_STAR = r'''
def star():
    try:
        raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
    except* ValueError as e:
        caught = e
    except* TypeError:
        pass
    return caught
for _i in range(300):
    star()
'''

# Real modules, each in every supported version.
STDLIB = [
    "json", "json.decoder", "json.encoder", "json.scanner", "email.message",
    "email.parser", "email.feedparser", "email._header_value_parser",
    "email.utils", "email.headerregistry", "email.charset", "typing",
    "dataclasses", "enum", "asyncio.base_events", "asyncio.events",
    "asyncio.tasks", "asyncio.futures", "asyncio.streams", "collections",
    "functools", "string", "textwrap", "argparse", "ast", "tokenize",
    "logging", "unittest.case", "http.client", "urllib.parse", "fractions",
    "datetime", "calendar", "locale", "codecs", "encodings.cp1252",
    "encodings.idna", "html.entities", "contextlib", "pprint", "weakref",
]


BIG = 2 ** 200 + 12345      # literals: the compiler folds no big power


def tricky_data():
    """The marshal data of the tricky module, as compiled by import."""
    src = SOURCE + (EXCEPT_STAR if sys.version_info >= (3, 11) else "")
    src = src.replace("@BIG@", str(BIG)).replace("@NEG@", str(3 ** 90))
    src = src.replace("@HUGE@", str(7 ** 700))
    code = compile(src, "/virtual/twin_tricky.py", "exec", dont_inherit=True)
    # Nested frozensets: no source makes one, marshal carries them.  Each
    # item held by its set only, as the compiler's constants are when it
    # writes a .pyc: marshal flags an item referenced elsewhere as shared,
    # which changes its order (docs/importer-compliance.md).
    nested = frozenset({"inner", float("2.5"), -float("1.0"),
                        frozenset({3, "deep", "é", (1, frozenset({"x"}))})})
    return marshal.dumps(code.replace(co_consts=code.co_consts + (nested,)))


def explain(diffs):
    return "\n".join(map(repr, diffs[:30]))


def test_layouts_cover_every_byte():
    lays, masks, _ = T.layouts()
    code = lays["PyCodeObject"]
    kept = [f for f in code.fields if f.name != "co_stacksize"]
    with pytest.raises(RuntimeError, match="not listed"):
        T.Layout("PyCodeObject", kept, code.sizeof, code.alignof)
    ascii_ = lays["PyASCIIObject"]
    with pytest.raises(RuntimeError, match="not listed"):
        T.Layout("PyASCIIObject", ascii_.fields[:-1], ascii_.sizeof, ascii_.alignof)
    # The masks read from C: the kind of a str as its data says it.
    kinds = {}
    for s in ("a", "é", "\u4e2d", "\U0001f600"):
        state = T.layouts()[0]["PyCompactUnicodeObject" if not s.isascii()
                                else "PyASCIIObject"]
        f = next(x for x in state.fixed if x.name.endswith("state"))
        v = int.from_bytes(ctypes.string_at(id(s) + f.off, f.size), sys.byteorder)
        m = masks["kind"]
        kinds[s] = (v & m) // (m & -m)
    assert list(kinds.values()) == [1, 1, 2, 4]


def test_tricky_module_is_its_twin():
    diffs, objects, skipped = T.check_datas({"tricky": tricky_data()})
    assert not skipped
    assert diffs == [], explain(diffs)
    assert objects > 250


def test_tricky_module_that_ran_is_its_twin():
    # As a DUMP run archives it: after its body ran (functions quickened
    # and specialised on 3.11+).
    diffs, objects, skipped = T.check_datas({"tricky": tricky_data()}, ran={"tricky"})
    assert not skipped
    assert diffs == [], explain(diffs)
    assert objects > 250


def test_stdlib_modules_are_their_twins():
    mods = [(m, T.find_module(m)) for m in STDLIB]
    n, diffs, objects, skipped = T.check_files(mods)
    assert not skipped
    assert n == len(STDLIB)
    assert diffs == [], explain(diffs)
    assert objects > 10000


# ---- the check is not blind --------------------------------------------------

@pytest.fixture(scope="module")
def loaded():
    (m,), skipped = T.load_twins({"tricky": tricky_data()})
    assert not skipped
    assert m.compare()[0] == []
    return m


def const_index(code, pred):
    return next(i for i, c in enumerate(code.co_consts) if pred(c))


def field(struct, name):
    return next(f for f in T.layouts()[0][struct].fields if f.name == name)


@contextlib.contextmanager
def poke(addr, ctype, value):
    """Set the ``ctype`` at ``addr`` to ``value`` for the block, then back."""
    cell = ctype.from_address(addr)
    old = cell.value
    cell.value = value
    try:
        yield
    finally:
        cell.value = old


def only(diffs):
    assert len(diffs) == 1, explain(diffs)
    return diffs[0]


def strs_tuple(m):
    i = const_index(m.a, lambda c: type(c) is tuple and "Ünïcödé" in c)
    return i, m.a.co_consts[i]


def test_sees_a_str_utf8_length(loaded):
    i, strs = strs_tuple(loaded)
    k = strs.index("Ünïcödé")
    f = field("PyCompactUnicodeObject", "utf8_length")
    with poke(id(strs[k]) + f.off, ctypes.c_ssize_t, 3):
        d = only(loaded.compare()[0])
    assert (d.path, d.field, d.archived, d.marshal) == \
        (f"<module>.co_consts[{i}][{k}]", "utf8_length", 3, 0)


def test_sees_a_code_objects_stacksize(loaded):
    i = const_index(loaded.a, lambda c: getattr(c, "co_name", "") == "löwe")
    code = loaded.a.co_consts[i]
    f = field("PyCodeObject", "co_stacksize")
    with poke(id(code) + f.off, ctypes.c_int, code.co_stacksize + 1):
        d = only(loaded.compare()[0])
    assert (d.path, d.field) == (f"<module>.co_consts[{i}]", "co_stacksize")
    assert d.archived == d.marshal + 1


def item_slot(t, k):
    return id(t) + field("PyTupleObject", "ob_item").off + k * T.PTR


def test_sees_an_equal_str_that_is_not_the_interned_one(loaded):
    i = const_index(loaded.a, lambda c: c == ("alpha", "beta"))
    names = loaded.a.co_consts[i]
    fresh = "".join(["al", "pha"])
    assert fresh == names[0] and fresh is not names[0]
    with poke(item_slot(names, 0), ctypes.c_void_p, id(fresh)):
        d = only(loaded.compare()[0])
    assert (d.path, d.field) == (f"<module>.co_consts[{i}]", "ob_item[0]")
    assert d.archived.startswith("a fresh str") and d.marshal.startswith("the shared str")


def test_sees_a_shared_object_where_marshal_has_a_fresh_one(loaded):
    # The second handle's int stands for an object of the interpreter's.
    i = const_index(loaded.a, lambda c: c == (BIG, BIG))
    same, other = loaded.a.co_consts[i], loaded.a2.co_consts[i]
    with poke(item_slot(same, 0), ctypes.c_void_p, id(other[0])):
        d = only(loaded.compare()[0])
    assert (d.path, d.field) == (f"<module>.co_consts[{i}]", "ob_item[0]")
    assert d.archived.startswith("the shared int") and d.marshal.startswith("a fresh int")


def test_sees_sharing_inside_the_graph(loaded):
    # marshal gives (BIG, BIG) one int twice: an equal copy is not that.
    i = const_index(loaded.a, lambda c: c == (BIG, BIG))
    same = loaded.a.co_consts[i]
    assert same[0] is same[1] and loaded.b.co_consts[i][0] is loaded.b.co_consts[i][1]
    copy = int(str(same[1]))
    with poke(item_slot(same, 1), ctypes.c_void_p, id(copy)):
        d = only(loaded.compare()[0])
    assert (d.path, d.field) == (f"<module>.co_consts[{i}]", "ob_item[1]")
    assert "paired with another" in d.archived


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="str has no wstr from 3.12")
def test_sees_a_non_bmp_str_without_its_wstr(loaded):
    # The bug format 5 fixed (commit 96f8488): wstr NULL on a 4-byte-kind str.
    i, strs = strs_tuple(loaded)
    k = strs.index("\U00010000\U0010ffff")
    s = strs[k]
    wstr = field("PyCompactUnicodeObject", "_base.wstr")
    wlen = field("PyCompactUnicodeObject", "wstr_length")
    assert T._word(id(s) + wstr.off) == id(s) + T.layouts()[0]["PyCompactUnicodeObject"].sizeof
    with poke(id(s) + wstr.off, ctypes.c_void_p, None), \
            poke(id(s) + wlen.off, ctypes.c_ssize_t, 0):
        diffs = loaded.compare()[0]
    assert sorted((d.path, d.field, str(d.archived)) for d in diffs) == [
        (f"<module>.co_consts[{i}][{k}]", "_base.wstr", "NULL"),
        (f"<module>.co_consts[{i}][{k}]", "wstr_length", "0")]


def test_sees_a_frozenset_item(loaded):
    i = const_index(loaded.a, lambda c: type(c) is frozenset)
    fs = loaded.a.co_consts[i]
    x = next(x for x in fs if type(x) is float)        # 2.5, fresh on both sides
    f = field("PyFloatObject", "ob_fval")
    with poke(id(x) + f.off, ctypes.c_double, 2.75):
        diffs = loaded.compare()[0]
    # The value changed: the items no longer pair (compared by value).
    assert [(d.path, d.field) for d in diffs] == [(f"<module>.co_consts[{i}]", "(items)")]


def test_a_frozenset_shared_by_two_functions_stays_one():
    # The compiler shares an equal constant between code objects (3.13's
    # always, older ones where both co_consts need it); made shared here
    # for every version.  marshal keeps the one object: so must the loader.
    code = compile("def f(x):\n    return x in {'p', 'q', 2.5}\n"
                   "def g(x):\n    return x in {'p', 'q', 2.5} or 'other'\n", "/v/fs.py", "exec",
                   dont_inherit=True)
    f, g = (c for c in code.co_consts if type(c) is types.CodeType)
    fs = {c for c in f.co_consts if type(c) is frozenset}.pop()
    g = g.replace(co_consts=tuple(fs if c == fs else c for c in g.co_consts))
    code = code.replace(co_consts=tuple(g if c is not f and type(c) is types.CodeType else c
                                        for c in code.co_consts))
    twin = marshal.loads(marshal.dumps(code))
    tf, tg = (c for c in twin.co_consts if type(c) is types.CodeType)
    assert any(c is {c for c in tf.co_consts if type(c) is frozenset}.pop()
               for c in tg.co_consts)          # marshal keeps one object
    diffs, _, _ = T.check_datas({"fs": marshal.dumps(code)})
    assert diffs == [], explain(diffs)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="str has no wstr from 3.12")
def test_sees_an_interned_non_bmp_name_without_its_wstr(loaded):
    # A name is interned: the archive's copy becomes the interpreter's, which
    # marshal then hands out too; it is compared against a fresh str.
    i = const_index(loaded.a, lambda c: c == ("\U00010332",))
    s = loaded.a.co_consts[i][0]
    assert s is loaded.b.co_consts[i][0]
    wstr = field("PyCompactUnicodeObject", "_base.wstr")
    with poke(id(s) + wstr.off, ctypes.c_void_p, None):
        d = only(loaded.compare()[0])
    # (reported once, where the walk first reaches the name)
    data = T.layouts()[0]["PyCompactUnicodeObject"].sizeof
    assert (d.field, d.archived, d.marshal) == ("_base.wstr", "NULL", f"+{data}")
