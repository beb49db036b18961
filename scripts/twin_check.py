"""Twin check: every archived object against a fresh ``marshal.loads`` of
the same .pyc, field by field, in memory.

For each module: the .pyc bytes plain import would read (or, where it would
compile the source, the source compiled as ``SourceLoader.source_to_code``
compiles it), an archive of its code made by pycds's own writer, the code
loaded back from it, and an independent ``marshal.loads`` of the same bytes
(the twin).  Both object graphs are walked in parallel and every object's
memory is compared with ctypes, field by field, with offsets, sizes and
bit-field masks read from the interpreter's own headers (:func:`layouts`).

Pointers are compared by what they point to.  Whether a target is an object
the interpreter shares (interned str, small int, ``()``, a static object) is
decided by experiment, not by a list: a second archive handle and a second
``marshal.loads`` of the same bytes are walked alongside, and a target that
is the same object in both copies of a side is shared.  Where marshal's
target is shared, the archived one must be that very object, and vice versa
(``is`` differs otherwise); where neither is, the two are compared
recursively, and each archived object must always be paired with the same
twin object (the sharing inside a graph is part of its behaviour).

Usage (with the interpreter pycds is installed in)::

    python scripts/twin_check.py --all [--jobs 2]
    python scripts/twin_check.py --modules json email.message typing

Prints each difference (module, object path, field, archived vs marshal)
and a last line ``N modules, M objects compared, K differences``; exit
status 1 on any difference.  Module bodies are never executed.
"""

import argparse
import collections
import ctypes
import gc
import importlib.machinery
import importlib.util
import json
import marshal
import os
import site
import subprocess
import sys
import sysconfig
import tempfile
import warnings

import cprobe  # noqa: E402  (scripts/, beside this file)
from pycds import _archive, _pyc
from pycds import _nativeapi as N, _nativewriter as NW
from pycds import _files as W
from pycds.errors import NativeError

V = sys.version_info[:2]
PTR = ctypes.sizeof(ctypes.c_void_p)

# ---- what is compared ------------------------------------------------------

# Field kinds:
#   refcnt   excluded (EXCLUDED)        type     same type object
#   int      equal value                hash     EXCLUDED, checked: -1 or hash()
#   version  EXCLUDED, checked: zero iff the twin's is zero
#   state    str state: each named bit-field equal (masks from C)
#   obj      object pointer: same object, or twins compared recursively
#   self     pointer into the object itself: equal offsets (or both NULL)
#   raw      any other value (a cache pointer): equal, i.e. as fresh
#   cell2arg 3.10's co_cell2arg: both NULL or the pointed-to bytes equal
# A layout's last entry may be its variable part: ("name", "bytes"|"items").

_HEAD = [("ob_base.ob_refcnt", "refcnt"), ("ob_base.ob_type", "type")]
_VARHEAD = [("ob_base.ob_base.ob_refcnt", "refcnt"),
            ("ob_base.ob_base.ob_type", "type"), ("ob_base.ob_size", "int")]

_ASCII = _HEAD + [("length", "int"), ("hash", "hash"), ("state", "state")]
_STATE_BITS = ["interned", "kind", "compact", "ascii"]
if V < (3, 12):
    _ASCII += [("wstr", "self")]
    _COMPACT_OWN = [("utf8_length", "int"), ("utf8", "raw"), ("wstr_length", "int")]
    _STATE_BITS += ["ready"]
else:
    _COMPACT_OWN = [("utf8_length", "int"), ("utf8", "raw")]
    _STATE_BITS += ["statically_allocated"]
_COMPACT = [("_base." + n, k) for n, k in _ASCII] + _COMPACT_OWN

if V < (3, 12):
    _LONG = _VARHEAD + [("ob_digit", "bytes")]
else:
    _LONG = _HEAD + [("long_value.lv_tag", "int"), ("long_value.ob_digit", "bytes")]

_CODE_310 = _HEAD + [(f, "int") for f in (
    "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals",
    "co_stacksize", "co_flags", "co_firstlineno")] + [(f, "obj") for f in (
        "co_code", "co_consts", "co_names", "co_varnames", "co_freevars",
        "co_cellvars")] + [
    ("co_cell2arg", "cell2arg"), ("co_filename", "obj"), ("co_name", "obj"),
    ("co_linetable", "obj"), ("co_zombieframe", "raw"), ("co_weakreflist", "raw"),
    ("co_extra", "raw"), ("co_opcache_map", "raw"), ("co_opcache", "raw"),
    ("co_opcache_flag", "int"), ("co_opcache_size", "int")]

_CODE_311 = _VARHEAD + [
    ("co_consts", "obj"), ("co_names", "obj"), ("co_exceptiontable", "obj"),
    ("co_flags", "int"), ("co_warmup", "int"), ("_co_linearray_entry_size", "int"),
    ("co_argcount", "int"), ("co_posonlyargcount", "int"),
    ("co_kwonlyargcount", "int"), ("co_stacksize", "int"),
    ("co_firstlineno", "int"), ("co_nlocalsplus", "int"), ("co_nlocals", "int"),
    ("co_nplaincellvars", "int"), ("co_ncellvars", "int"), ("co_nfreevars", "int"),
    ("co_localsplusnames", "obj"), ("co_localspluskinds", "obj"),
    ("co_filename", "obj"), ("co_name", "obj"), ("co_qualname", "obj"),
    ("co_linetable", "obj"), ("co_weakreflist", "raw"), ("_co_code", "raw"),
    ("_co_linearray", "raw"), ("_co_firsttraceable", "int"), ("co_extra", "raw"),
    ("co_code_adaptive", "bytes")]

_CODE_312 = _VARHEAD + [
    ("co_consts", "obj"), ("co_names", "obj"), ("co_exceptiontable", "obj"),
    ("co_flags", "int"), ("co_argcount", "int"), ("co_posonlyargcount", "int"),
    ("co_kwonlyargcount", "int"), ("co_stacksize", "int"),
    ("co_firstlineno", "int"), ("co_nlocalsplus", "int"), ("co_framesize", "int"),
    ("co_nlocals", "int"), ("co_ncellvars", "int"), ("co_nfreevars", "int"),
    ("co_version", "version"), ("co_localsplusnames", "obj"),
    ("co_localspluskinds", "obj"), ("co_filename", "obj"), ("co_name", "obj"),
    ("co_qualname", "obj"), ("co_linetable", "obj"), ("co_weakreflist", "raw")] + (
        [("co_executors", "raw")] if V >= (3, 13) else []) + [
    ("_co_cached", "raw"), ("_co_instrumentation_version", "int"),
    ("_co_monitoring", "raw"), ("_co_firsttraceable", "int"), ("co_extra", "raw"),
    ("co_code_adaptive", "bytes")]

# C struct -> its fields, for each type an archive holds (frozenset apart).
LAYOUT_FIELDS = {
    "PyASCIIObject": _ASCII,
    "PyCompactUnicodeObject": _COMPACT,
    "PyBytesObject": _VARHEAD + [("ob_shash", "hash"), ("ob_sval", "bytes")],
    "PyLongObject": _LONG,
    "PyFloatObject": _HEAD + [("ob_fval", "int")],
    "PyComplexObject": _HEAD + [("cval.real", "int"), ("cval.imag", "int")],
    "PyTupleObject": _VARHEAD + [("ob_item", "items")],
    "PyCodeObject": {(3, 10): _CODE_310, (3, 11): _CODE_311}.get(V, _CODE_312),
}

# What is left out, and why (printed by --excluded; docs/reliability.md).
EXCLUDED = {
    "ob_refcnt": "reference counts are per process: archived objects get one no "
                 "program brings to zero (3.10/3.11) or the immortal count (3.12+)",
    "str.hash, bytes.ob_shash": "hash caches: -1 until hashed, and a str's hash "
                                "depends on PYTHONHASHSEED; checked to be -1 or "
                                "the object's true hash",
    "PyGC_Head": "the GC links before a tuple are the collector's per-process "
                 "list (an archived tuple's is zeroed, untracked); not part "
                 "of the object",
    "str.state unnamed bits": "the unnamed 24-bit padding of the state "
                              "bit-field word, never written by PyUnicode_New "
                              "nor read by CPython",
    "alignment padding": "bytes between fields (or after the last) that are "
                         "exactly the C alignment padding, which no code reads",
    "frozenset memory": "a frozenset's hash table is built per process "
                        "(FROZENSET relocation; its layout depends on "
                        "PYTHONHASHSEED): compared by value, each item paired "
                        "with its equal twin of the same type and compared "
                        "recursively",
    "frozenset order": "3.10 only: marshal writes a frozenset's items in the "
                       "writing process's iteration order, which the dump cannot "
                       "know; the load adds them in the dump's (3.11+ compare the "
                       "iteration order)",
    "identity-compared objects": "an object the interpreter shares (interned "
                                 "str, small int, (), static objects) is compared "
                                 "by identity only, so its interned bits and "
                                 "caches are the interpreter's",
}
if V >= (3, 12):
    EXCLUDED["co_version"] = ("drawn from a per-process counter by init_code "
                              "(3.12: _Py_next_func_version; 3.13: the "
                              "interpreter's func_state.next_version); checked "
                              "to be nonzero iff the twin's is")


# marshal's type codes of interned strs and of the same strs not interned
# (Python/marshal.c).
_UNINTERNED = {"t": "u", "A": "a", "Z": "z"}

# What a str shared with the interpreter may differ in from a fresh one of
# its value: the interned bits (interning sets them) and the UTF-8 cache
# (names are encoded on use: getattr messages, PyUnicode_AsUTF8).
INTERNED_SKIP = {"interned", "utf8", "utf8_length", "statically_allocated"}
EXCLUDED["interned str: interned bits, utf8 cache, statically_allocated"] = (
    "a str both sides share (interned) is compared against a fresh "
    "non-interned str marshal makes of its value but for these, which "
    "interning and use change (3.12+ static strs are statically allocated)")


# ---- layouts from the interpreter's headers -------------------------------

class Field:
    """One field of a C struct: its offset, size, alignment and kind."""

    __slots__ = ("name", "off", "size", "align", "kind")

    def __init__(self, name, off, size, align, kind):
        self.name, self.off, self.size, self.align, self.kind = name, off, size, align, kind


class Layout:
    """A struct's fields (sorted), its size, and its variable part."""

    def __init__(self, struct, fields, sizeof, alignof):
        self.struct = struct
        self.fields = fields
        self.sizeof = sizeof
        self.alignof = alignof
        self.var = fields[-1] if fields[-1].kind in ("bytes", "items") else None
        self.fixed = [f for f in fields if f is not self.var]
        _check_coverage(self)
        if struct in ("PyASCIIObject", "PyCompactUnicodeObject"):
            # The code units (and a NUL) follow the struct (_PyUnicode_COMPACT_DATA).
            self.var = Field("data", sizeof, 0, 1, "bytes")
        # Bytes read before the variable part.
        self.head = self.var.off if self.var else sizeof


_layouts = None


def _probe_source():
    """The C program that prints every listed field's offset, size and
    alignment, the str state masks and a few constants."""
    lines = []
    for struct, fields in LAYOUT_FIELDS.items():
        lines.append(f'printf("S {struct} %zu %zu\\n", sizeof({struct}), '
                     f'(size_t)__alignof__({struct}));')
        for name, _ in fields:
            lines.append(f'printf("F {struct} {name} %zu %zu %zu\\n", '
                         f'offsetof({struct}, {name}), sizeof(((({struct} *)0)->{name})), '
                         f'(size_t)__alignof__(((({struct} *)0)->{name})));')
    for bit in _STATE_BITS:
        # An unsigned bit-field decremented from 0 is all ones (C11 6.3.1.3).
        lines.append(f'{{ PyASCIIObject a; memset(&a, 0, sizeof a); a.state.{bit}--; '
                     f'unsigned char b[sizeof a.state]; memcpy(b, &a.state, sizeof b); '
                     f'printf("M {bit} "); for (size_t i = 0; i < sizeof b; i++) '
                     f'printf("%02x", b[i]); printf("\\n"); }}')
    lines.append('printf("C digit %zu\\n", sizeof(digit));')
    if V >= (3, 12):
        lines.append('printf("C non_size_bits %d\\n", _PyLong_NON_SIZE_BITS);')
    return ("#define Py_BUILD_CORE 1\n#include <Python.h>\n"
            + ("#include \"longintrepr.h\"\n" if V < (3, 11) else "")
            + ("#include \"internal/pycore_long.h\"\n" if V >= (3, 12) else "")
            + "#include <stddef.h>\n#include <stdio.h>\n#include <string.h>\n"
            "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")



def _check_coverage(lay):
    """Raise RuntimeError unless the fields of ``lay`` cover every byte of
    its struct but exact alignment padding (so a field missing from
    LAYOUT_FIELDS fails here instead of going uncompared)."""
    end = 0
    for f in lay.fields:
        pad_ok = f.off >= end and f.off == -(-end // f.align) * f.align
        if not pad_ok:
            raise RuntimeError(f"{lay.struct}: bytes {end}..{f.off} before {f.name} "
                               "are not alignment padding: a field is not listed")
        end = f.off + (0 if f is lay.var else f.size)
    if lay.var is None and -(-end // lay.alignof) * lay.alignof != lay.sizeof:
        raise RuntimeError(f"{lay.struct}: bytes {end}..{lay.sizeof} at its end are "
                           "not alignment padding: a field is not listed")


def layouts():
    """``({struct: Layout}, {bit: mask}, {const: value})`` of this CPython,
    read from its headers (cached).  Raises RuntimeError without a C
    compiler, or if a struct has bytes no listed field covers."""
    global _layouts
    if _layouts is not None:
        return _layouts
    sizes, fields, masks, consts = {}, collections.defaultdict(list), {}, {}
    kinds = {s: dict(fs) for s, fs in LAYOUT_FIELDS.items()}
    for line in cprobe.run(_probe_source()).splitlines():
        tag, *rest = line.split()
        if tag == "S":
            sizes[rest[0]] = (int(rest[1]), int(rest[2]))
        elif tag == "F":
            s, name, off, size, align = rest
            fields[s].append(Field(name, int(off), int(size), int(align), kinds[s][name]))
        elif tag == "M":
            masks[rest[0]] = int.from_bytes(bytes.fromhex(rest[1]), sys.byteorder)
        else:
            consts[rest[0]] = int(rest[1])
    lays = {}
    for s, fs in fields.items():
        fs.sort(key=lambda f: f.off)
        lays[s] = Layout(s, fs, *sizes[s])
    _layouts = (lays, masks, consts)
    return _layouts


# ---- reading objects -------------------------------------------------------

def _obj(addr):
    """The object at address ``addr`` (a new reference)."""
    return ctypes.cast(addr, ctypes.py_object).value


def _int(raw, f, signed=True):
    return int.from_bytes(raw[f.off:f.off + f.size], sys.byteorder, signed=signed)


def _word(addr):
    return ctypes.c_void_p.from_address(addr).value or 0


def _layout_of(o):
    """The Layout of object ``o`` by its exact type (None: not one an
    archive holds byte for byte)."""
    lays = layouts()[0]
    t = type(o)
    if t is str:
        return lays["PyASCIIObject" if o.isascii() else "PyCompactUnicodeObject"]
    name = {bytes: "PyBytesObject", int: "PyLongObject", float: "PyFloatObject",
            complex: "PyComplexObject", tuple: "PyTupleObject"}.get(t)
    if name is None and t.__name__ == "code" and t.__module__ == "builtins":
        name = "PyCodeObject"
    return lays.get(name) if name else None


def _var_size(o, lay, head):
    """Bytes of the variable part of ``o`` (after ``lay.head``), computed
    from its own header ``head``: what CPython itself reads."""
    _, masks, consts = layouts()
    f = {x.name: x for x in lay.fixed}
    if lay.struct in ("PyASCIIObject", "PyCompactUnicodeObject"):
        state = _int(head, f[("_base." if "_base.state" in f else "") + "state"], False)
        kind = (state & masks["kind"]) // (masks["kind"] & -masks["kind"])
        length = _int(head, f[("_base." if "_base.length" in f else "") + "length"])
        return (length + 1) * kind
    if lay.struct == "PyLongObject":
        if V < (3, 12):
            return abs(_int(head, f["ob_base.ob_size"])) * consts["digit"]
        n = _int(head, f["long_value.lv_tag"], False) >> consts["non_size_bits"]
        return max(n, 1) * consts["digit"]   # long_alloc writes >= 1 digit
    n = _int(head, f["ob_base.ob_size"])
    return {"PyBytesObject": n + 1, "PyTupleObject": n * PTR,
            "PyCodeObject": n * 2}.get(lay.struct, 0)


def read(o):
    """``(layout, raw bytes)`` of object ``o``: its struct and its variable
    part, as far as its own header says it extends.  (None, b"") if it is
    not an archived type."""
    lay = _layout_of(o)
    if lay is None:
        return None, b""
    head = ctypes.string_at(id(o), lay.head)
    n = _var_size(o, lay, head) if lay.var else 0
    return lay, head + ctypes.string_at(id(o) + lay.head, n)


# ---- the comparison --------------------------------------------------------

class Difference:
    """One difference: module, object path, field, archived and marshal values."""

    __slots__ = ("module", "path", "field", "archived", "marshal")

    def __init__(self, module, path, field, archived, marshal_):
        self.module, self.path, self.field = module, path, field
        self.archived, self.marshal = archived, marshal_

    def __repr__(self):
        return (f"{self.module}: {self.path}: {self.field}: "
                f"archived {self.archived} vs marshal {self.marshal}")


def _short(o):
    r = repr(o)
    return f"{type(o).__name__} {r[:60]}{'...' if len(r) > 60 else ''}"


class Walk:
    """The parallel walk of one module's four graphs: ``a`` (archived),
    ``a2`` (the same module from a second archive handle), ``b`` (marshal)
    and ``b2`` (a second marshal.loads)."""

    def __init__(self, module):
        self.module = module
        self.diffs = []
        self.a_to_b, self.b_to_a = {}, {}
        self.identical = set()
        self.stack = []

    def diff(self, path, field, a, b):
        self.diffs.append(Difference(self.module, path, field, a, b))

    def run(self, a, a2, b, b2):
        """Compare the graphs from their roots; return the differences."""
        self.pointer("<module>", "(root)", a, a2, b, b2)
        while self.stack:
            self.compare(*self.stack.pop())
        return self.diffs

    @property
    def objects(self):
        return len(self.a_to_b) + len(self.identical)

    def pointer(self, path, field, a, a2, b, b2, child=None):
        """One pointer slot ``field`` of the object at ``path``, pointing at
        ``a`` (archived) and ``b`` (marshal): the same object, or two fresh
        twins paired consistently and compared later."""
        child = path if child is None else child
        if a is b:
            if id(a) not in self.identical:
                self.identical.add(id(a))
                if type(a) is str:
                    self.interned_twin(child, a)
            return
        shared_a, shared_b = a is a2, b is b2
        if shared_a or shared_b:
            self.diff(path, field,
                      f"{'the shared' if shared_a else 'a fresh'} {_short(a)}",
                      f"{'the shared' if shared_b else 'a fresh'} {_short(b)}")
            return
        pa, pb = self.a_to_b.get(id(a)), self.b_to_a.get(id(b))
        if pa is None and pb is None:
            self.a_to_b[id(a)], self.b_to_a[id(b)] = id(b), id(a)
            self.stack.append((child, a, a2, b, b2))
        elif pa != id(b) or pb != id(a):
            self.diff(path, field, f"{_short(a)} paired with another twin before",
                      f"{_short(b)} paired with another archived object before")

    def interned_twin(self, path, s):
        """A str both sides share (interned, or a 1-char/empty singleton),
        which may be the archive's own copy become the interned one: its
        memory against a fresh str marshal builds of the same value (the
        .pyc's type code without interning), but for what interning and use
        change (INTERNED_SKIP)."""
        data = bytearray(marshal.dumps(s))
        code = chr(data[0] & 0x7f)
        if code not in _UNINTERNED:
            return
        data[0] = (data[0] & 0x80) | ord(_UNINTERNED[code])
        fresh = marshal.loads(bytes(data))
        if fresh is not s:
            self.compare(path, s, s, fresh, fresh, INTERNED_SKIP)

    def compare(self, path, a, a2, b, b2, skip=()):
        """Compare two fresh twins field by field (but the fields or state
        bits named in ``skip``), queueing their targets."""
        if type(a) is not type(b):
            self.diff(path, "ob_type", type(a).__name__, type(b).__name__)
            return
        if type(a) is frozenset:
            self.frozenset(path, a, a2, b, b2)
            return
        lay, ra = read(a)
        if lay is None:
            self.diff(path, "(type)", f"uncompared {type(a).__name__}", "")
            return
        lb, rb = read(b)
        if lb is not lay:
            self.diff(path, "(layout)", lay.struct, lb.struct)
            return
        for f in lay.fixed:
            if f.name not in skip:
                self.field(path, f, a, a2, b, b2, ra, rb, skip)
        if lay.var is not None:
            self.var(path, lay, a, a2, b, b2, ra, rb)

    def field(self, path, f, a, a2, b, b2, ra, rb, skip=()):
        """Compare one fixed field ``f`` of twins ``a``/``b``."""
        k = f.kind
        if k == "refcnt":
            return
        va, vb = _int(ra, f), _int(rb, f)
        if k in ("int", "raw", "type"):
            if va != vb:
                self.diff(path, f.name, va if k == "int" else hex(va),
                          vb if k == "int" else hex(vb))
        elif k == "hash":
            for side, v, o in (("archived", va, a), ("marshal", vb, b)):
                if v != -1 and v != hash(o):
                    self.diff(path, f.name, f"{side} cache {v}", f"hash {hash(o)}")
        elif k == "version":
            if (va == 0) != (vb == 0):
                self.diff(path, f.name, va, vb)
        elif k == "state":
            self.state(path, f, va, vb, skip)
        elif k == "self":
            oa, ob = self.self_offset(a, ra, va), self.self_offset(b, rb, vb)
            if oa != ob:
                self.diff(path, f.name, oa, ob)
        elif k == "cell2arg":
            self.cell2arg(path, f, a, b, va, vb)
        elif k == "obj":
            if va == 0 or vb == 0:
                if va != vb:
                    self.diff(path, f.name, hex(va), hex(vb))
                return
            self.pointer(path, f.name, _obj(va), _obj(_word(id(a2) + f.off)),
                         _obj(vb), _obj(_word(id(b2) + f.off)), f"{path}.{f.name}")

    @staticmethod
    def self_offset(o, raw, v):
        """A pointer as an offset into ``o`` if it points inside it."""
        if v == 0:
            return "NULL"
        if id(o) <= v < id(o) + len(raw):
            return f"+{v - id(o)}"
        return f"outside ({hex(v)})"

    def state(self, path, f, va, vb, skip=()):
        masks = layouts()[1]
        for bit, m in masks.items():
            if va & m != vb & m and bit not in skip:
                s = m & -m
                self.diff(path, f"{f.name}.{bit}", (va & m) // s, (vb & m) // s)

    def cell2arg(self, path, f, a, b, va, vb):
        """3.10's co_cell2arg: a Py_ssize_t per cell variable, or NULL."""
        if va == 0 or vb == 0:
            if va != vb:
                self.diff(path, f.name, hex(va), hex(vb))
            return
        n = len(b.co_cellvars) * PTR
        da, db = ctypes.string_at(va, n), ctypes.string_at(vb, n)
        if da != db:
            self.diff(path, f.name, da.hex(), db.hex())

    def var(self, path, lay, a, a2, b, b2, ra, rb):
        """The variable part: code units, digits, bytecode, or items."""
        f, h = lay.var, lay.head
        if len(ra) != len(rb):
            self.diff(path, f.name, f"{len(ra) - h} bytes", f"{len(rb) - h} bytes")
            return
        if f.kind == "bytes":
            if ra[h:] != rb[h:]:
                i = next(i for i in range(h, len(ra)) if ra[i] != rb[i])
                self.diff(path, f.name, f"byte {i - h}: {ra[i:i + 8].hex()}",
                          f"{rb[i:i + 8].hex()}")
            return
        for i in range(0, len(ra) - h, PTR):
            va = int.from_bytes(ra[h + i:h + i + PTR], sys.byteorder)
            vb = int.from_bytes(rb[h + i:h + i + PTR], sys.byteorder)
            k = i // PTR
            self.pointer(path, f"{f.name}[{k}]", _obj(va), _obj(_word(id(a2) + h + i)),
                         _obj(vb), _obj(_word(id(b2) + h + i)), f"{path}[{k}]")

    def frozenset(self, path, a, a2, b, b2):
        """Frozensets by value: each item paired with its equal twin of the
        same type (a set holds at most one such), then compared as any
        pointer target."""
        keyed = [{(type(x), x): x for x in s} for s in (a, a2, b, b2)]
        if set(keyed[0]) != set(keyed[2]) or len(a) != len(b):
            self.diff(path, "(items)", _short(a), _short(b))
            return
        # 3.11+ unmarshal adds the items in the .pyc's order, the load in
        # the same (pycds_layout_frozenset_items): the same table, the same
        # iteration (3.10: "frozenset order" in EXCLUDED).
        if V >= (3, 11) and list(keyed[0]) != list(keyed[2]):
            self.diff(path, "(iteration order)", _short(tuple(a)), _short(tuple(b)))
        for key in keyed[0]:
            self.pointer(path, f"{{{key[1]!r:.40}}}", *(k[key] for k in keyed),
                         f"{path}{{{key[1]!r:.40}}}")


# ---- modules, .pyc bytes and archives --------------------------------------

def pyc_data(name, path):
    """The marshal data plain import would unmarshal for source ``path``:
    its .pyc's, if SourceLoader.get_code would use it, else the source
    compiled as source_to_code compiles it.  Raises SyntaxError (and
    ValueError, OSError, UnicodeDecodeError...) where no code can be made."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    src = None
    try:
        cpath = importlib.util.cache_from_source(path)
        with open(cpath, "rb") as f:
            pyc = f.read()
    except (OSError, NotImplementedError):
        pyc = None
    st = os.stat(path)
    head = pyc[:16] if pyc is not None else None
    src_hash = None
    if head is not None and len(head) >= 8 and int.from_bytes(head[4:8], "little") & 1:
        src = loader.get_data(path)
        src_hash = _pyc.source_hash(src)
    if _pyc.classify_pyc(head, st, src_hash) != _pyc.PYC_INVALID:
        return pyc[16:]
    if src is None:
        src = loader.get_data(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return marshal.dumps(loader.source_to_code(src, path))


def write_archive(items, directory, name="twin.img"):
    """Write ``items`` ([(key, code)]) into an archive in ``directory``;
    return ``(index_path, {key: skip reason})`` for the ones the writer
    refused (plain import would serve those)."""
    seed = int.from_bytes(os.urandom(8), "little")   # checksums' seed
    w = NW.Writer(seed)
    entries, refused = [], {}
    for key, code in items:
        try:
            c = w.add(code)
        except NativeError as e:
            refused[key] = f"writer refused: {e}"
            continue
        entries.append(_archive.ModuleEntry(len(entries), key, "/nonexistent.py", False, None,
                                     0, 0, b"", None, 0, 0, 0, "default",
                                     c.chunk_off, c.chunk_len, c.root_off,
                                     c.reloc_first, c.reloc_count, c.checksum,
                                     c.nobjects, None))
    heap, relocs = w.heap(), w.relocs()
    meta = _archive.meta_for_this_interpreter()
    meta["layout"] = NW.layout_id()
    h, parts = _archive.file_sections(entries, len(heap), len(relocs) // 4, meta, seed)
    parts = [(0, h.pack())] + parts + [(h.heap_off, heap), (h.reloc_off, relocs)]
    path = os.path.join(directory, name)
    W.write_atomic(path, parts, _archive.ARCHIVE_FILE)
    return path, refused


def _handle(path):
    """An Index and a NativeArchive over the archive at ``path``."""
    index = _archive.Index.open(path)
    return index, N.NativeArchive(index.fd, index.header, NW.layout_id())


class Loaded:
    """One module's four graphs: archived twice (two archive handles),
    unmarshalled twice."""

    def __init__(self, name, a, a2, b, b2):
        self.name, self.a, self.a2, self.b, self.b2 = name, a, a2, b, b2

    def compare(self):
        """``(differences, objects compared)``."""
        w = Walk(self.name)
        diffs = w.run(self.a, self.a2, self.b, self.b2)
        return diffs, w.objects


def load_twins(datas, ran=()):
    """Archive the code of each ``name: marshal data`` of ``datas`` with
    pycds's writer and load it back twice; unmarshal the data twice.
    Modules named in ``ran`` have their code executed before it is
    archived (as a DUMP run archives code that ran).  Returns
    ``([Loaded], {name: skip reason})``."""
    with tempfile.TemporaryDirectory() as d:
        dumped = [(name, marshal.loads(data)) for name, data in datas.items()]
        for name, code in dumped:
            if name in ran:
                exec(code, {"__name__": name})
        path, skipped = write_archive(dumped, d)
        del dumped
        gc.collect()   # strings only the dump's code held are no longer interned
        i1, arch1 = _handle(path)
        i2, arch2 = _handle(path)
        out = []
        for name, data in datas.items():
            if name in skipped:
                continue
            a = arch1.load(i1.lookup(name))
            a2 = arch2.load(i2.lookup(name))
            out.append(Loaded(name, a, a2, marshal.loads(data), marshal.loads(data)))
    return out, skipped


def check_datas(datas, ran=()):
    """Twin-check ``name: marshal data``; return ``(differences, objects,
    skipped)``."""
    loaded, skipped = load_twins(datas, ran)
    diffs, objects = [], 0
    for m in loaded:
        d, n = m.compare()
        diffs += d
        objects += n
    return diffs, objects, skipped


def check_files(mods):
    """Twin-check ``[(name, source path)]``; return ``(modules, differences,
    objects, {name: skip reason})``."""
    datas, skipped = {}, {}
    for name, path in mods:
        try:
            datas[name] = pyc_data(name, path)
        except (SyntaxError, ValueError, OSError, UnicodeDecodeError, EOFError,
                TypeError) as e:
            skipped[name] = f"no code: {type(e).__name__}"
    diffs, objects, refused = check_datas(datas)
    skipped.update(refused)
    return len(datas) - len(refused), diffs, objects, skipped


def find_module(name):
    """The source path of module ``name`` on sys.path, found on disk
    without importing anything.  Raises LookupError."""
    rel = name.replace(".", os.sep)
    for entry in sys.path:
        for cand in (os.path.join(entry or ".", rel + ".py"),
                     os.path.join(entry or ".", rel, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    raise LookupError(f"no source for module {name}")


def all_modules():
    """``[(name, path)]`` of every source module of the standard library
    and of this interpreter's site-packages (names made unique)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    roots = [stdlib] + [p for p in site.getsitepackages() if os.path.isdir(p)]
    out, seen = [], collections.Counter()
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "site-packages"))
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                name = ".".join(rel) or "__init__"
                seen[name] += 1
                out.append((name if seen[name] == 1 else f"{name}#{seen[name]}",
                            os.path.join(d, f)))
    return out


# ---- CLI -------------------------------------------------------------------

def _worker():
    """Check the ``[(name, path)]`` JSON on stdin; print the result JSON."""
    mods = json.load(sys.stdin)
    n, diffs, objects, skipped = check_files(mods)
    json.dump({"modules": n, "objects": objects, "skipped": skipped,
               "diffs": [[d.module, d.path, d.field, str(d.archived), str(d.marshal)]
                         for d in diffs]}, sys.stdout)


def _run_batches(mods, jobs, batch):
    """Run the worker over ``mods`` in batches of ``batch``, ``jobs`` at a
    time (a process per batch bounds the memory archives keep mapped)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(part):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"],
                           input=json.dumps(part), capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"worker failed ({p.returncode}) on "
                               f"{part[0][0]}..{part[-1][0]}:\n{p.stderr[-3000:]}")
        return json.loads(p.stdout)

    parts = [mods[i:i + batch] for i in range(0, len(mods), batch)]
    with ThreadPoolExecutor(jobs) as ex:
        yield from ex.map(one, parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--all", action="store_true",
                   help="every source module of the stdlib and site-packages")
    g.add_argument("--modules", nargs="+", metavar="NAME")
    g.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    g.add_argument("--excluded", action="store_true",
                   help="print the fields left out and why")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=300)
    args = ap.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    if args.excluded:
        for k, why in EXCLUDED.items():
            print(f"{k}: {why}")
        return 0
    layouts()   # fail early without a compiler or with an unlisted field
    mods = all_modules() if args.all else [(m, find_module(m)) for m in args.modules]
    total = {"modules": 0, "objects": 0, "diffs": 0}
    reasons = collections.Counter()
    for r in _run_batches(mods, args.jobs, args.batch):
        total["modules"] += r["modules"]
        total["objects"] += r["objects"]
        total["diffs"] += len(r["diffs"])
        for d in r["diffs"]:
            print(f"{d[0]}: {d[1]}: {d[2]}: archived {d[3]} vs marshal {d[4]}", flush=True)
        for name, why in r["skipped"].items():
            reasons[why] += 1
    for why, n in sorted(reasons.items()):
        print(f"skipped {n}: {why}")
    print(f"{total['modules']} modules, {total['objects']} objects compared, "
          f"{total['diffs']} differences")
    return 1 if total["diffs"] else 0


if __name__ == "__main__":
    sys.exit(main())
