"""Fuzz pycds archives: mutate a real archive in many ways and run a program
under SHARE with each mutant.

Run with the interpreter pycds is installed in (it needs ``pycds._archive``,
``pycds._files`` and the native hash)::

    python scripts/fuzz_archive.py --cases 1200 --jobs 2 [--seed N] [--keep DIR]

Oracle, per mutant (the archive is passed with PYCDSVERBOSE=0):

* no crash (negative return code) and no hang (timeout);
* stdout and return code identical to the plain run;
* stderr is plain's stderr plus at most one line, and that line is exactly
  ``[pycds] warning: archive <path> ignored: <reason>``.

A re-signed mutant that passes every check and then runs differently is
counted as ``content_changed``, not as a mismatch: the checks found it well
formed (a constant now None, a tuple constant now a frozenset), i.e. a valid
archive of other code, as a .pyc with other constants is a valid .pyc.

Mutations (see :func:`mutations`):

* *raw* -- the bytes as an attacker-free disk or a bad copy would damage them:
  truncation at any length (0 included), bit flips, overwritten byte ranges,
  appended bytes, anywhere in the file (header, meta, buckets, entries,
  heap, relocations).  Checksums catch these.
* *re-signed* -- a structural change followed by recomputing every checksum
  (:meth:`Model.to_bytes`), so that the structural checks behind the
  checksums are exercised: index entry fields out of range (chunk offset,
  length, root, relocation range, module number), relocation entries whose
  slot or target lies outside the chunk or the interpreter image, unknown
  kinds, misaligned targets, ob_type slots pointing at non-types, header
  section offsets, foreign meta (layout, version, optimize), the root code
  object's computed fields (argument and local/cell/free counts, the frame
  size, the first traceable instruction, per-process cache pointers: the
  fields :func:`code_layout` lists for this CPython) and a str's cached
  UTF-8 pointer.

Mutating *data* bytes (bytecode, string contents) and re-signing them is not
done: that is a valid archive with other code in it, as a .pyc with forged
bytecode is a valid .pyc; CPython trusts both (see docs/reliability.md).

Exit status 0 when every mutant passes the oracle, 1 otherwise; a summary
line ``cases=N crashes=C hangs=H mismatches=M refused=R accepted=A`` ends the
output.
"""

import argparse
import collections
import concurrent.futures
import marshal
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import cprobe
from pycds import _archive
from pycds import _nativeapi as N

WARNING_PREFIX = "[pycds] warning: archive "

# The program run under SHARE: stdlib packages and modules with many kinds
# of constants (frozensets, big ints, floats, complex, nested code), and a
# local package so site-packages-free code is served too.
PROGRAM = r'''
import json, textwrap, fractions, dataclasses, string, colorsys
import fuzzpkg
from fuzzpkg import shapes
print(json.dumps({"a": [1, 2.5, None]}, sort_keys=True))
print(textwrap.shorten("the quick brown fox jumps over the lazy dog", 20))
print(fractions.Fraction(3, 9) + 1, colorsys.rgb_to_hsv(0.2, 0.4, 0.6))
print(shapes.area(shapes.Box(2, 3)), sorted(shapes.KINDS), shapes.BIG, shapes.Z,
      ascii(shapes.UNIT))
print(fuzzpkg.describe("x"), string.capwords("hello world"))
raise SystemExit(shapes.EXIT)
'''

PKG_INIT = '''
"""A package."""
def describe(v):
    return f"<{v!r}>" if v in {"x", "y", "z"} else "?"
'''

PKG_SHAPES = '''
from dataclasses import dataclass
KINDS = frozenset({"box", "ring"}) | {"tri"}
BIG = 2 ** 100 - 3
Z = complex(1.5, -2)
EXIT = 3
UNIT = "\u00b5m\u00b2"

@dataclass
class Box:
    w: int
    h: int

def area(s):
    match s:
        case Box(w=w, h=h):
            return w * h
    return None
'''


def make_workdir(base):
    """Write the program and its package under ``base``; returns the path."""
    os.makedirs(os.path.join(base, "fuzzpkg"), exist_ok=True)
    with open(os.path.join(base, "prog.py"), "w") as f:
        f.write(PROGRAM)
    with open(os.path.join(base, "fuzzpkg", "__init__.py"), "w") as f:
        f.write(PKG_INIT)
    with open(os.path.join(base, "fuzzpkg", "shapes.py"), "w") as f:
        f.write(PKG_SHAPES)
    return base


def child_env(**extra):
    """Memory given back after module bodies ran is made inaccessible at once
    (PYCDSRELEASE=protect): a mutant whose objects pycds wrongly thought dead
    faults instead of passing unseen."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON")) and k != "SOURCE_DATE_EPOCH"}
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYCDSRELEASE"] = "protect"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(python, args, cwd, timeout=30, **env):
    """Run python with args; returns (rc, out, err), rc None on timeout."""
    try:
        p = subprocess.run([python, *args], cwd=cwd, env=child_env(**env),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timeout"
    return p.returncode, p.stdout, p.stderr


# ---- the archive model and re-signing --------------------------------------

class Model:
    """An archive taken apart: header fields, meta, entries, heap, relocs.

    :meth:`to_bytes` lays it out again with every checksum recomputed (the
    writer's own layout, same archive id), so a structural change passes the
    checksums and reaches the structural checks.  ``header_patch`` fields are
    written after layout (and the header re-signed), for section offsets.
    """

    def __init__(self, data):
        h = _archive.Header.unpack(data)
        self.header = h
        self.meta = marshal.loads(data[h.meta_off:h.meta_off + h.meta_len])
        self.entries = []
        off = 0
        ents = data[h.entries_off:h.entries_off + h.entries_len]
        while off + 12 <= len(ents):
            length = int.from_bytes(ents[off:off + 4], "little")
            if length < 12:
                raise ValueError(f"index entry at {off} is {length} bytes")
            self.entries.append(_archive.ModuleEntry(*marshal.loads(ents[off + 12:off + length])))
            off += length
        self.heap = bytearray(data[h.heap_off:h.heap_off + h.heap_len])
        self.relocs = bytearray(data[h.reloc_off:h.reloc_off + 4 * h.reloc_count])
        self.header_patch = {}
        self.keep_sums = False

    @classmethod
    def read(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    def reloc(self, i):
        return int.from_bytes(self.relocs[4 * i:4 * i + 4], "little")

    def set_reloc(self, i, v):
        self.relocs[4 * i:4 * i + 4] = (v & 0xFFFFFFFF).to_bytes(4, "little")

    def chunk_sum(self, e):
        """XXH64 of e's chunk then its relocation entries, as the writer
        computes it (native/archive/writer/writer.c, pycds_writer_add); the stored sum if
        e's ranges are outside the sections (the range check fires first)."""
        seed = self.header.archive_id
        if e.chunk_off + e.chunk_len > len(self.heap) or \
                4 * (e.reloc_first + e.reloc_count) > len(self.relocs) or \
                min(e.chunk_off, e.chunk_len, e.reloc_first, e.reloc_count) < 0:
            return e.chunk_sum
        h = N.hash64(bytes(self.heap[e.chunk_off:e.chunk_off + e.chunk_len]), seed)
        r = bytes(self.relocs[4 * e.reloc_first:4 * (e.reloc_first + e.reloc_count)])
        return N.hash64(r, h)

    def to_bytes(self):
        if not self.keep_sums:
            for e in self.entries:
                e.chunk_sum = self.chunk_sum(e)
        h, parts = _archive.file_sections(self.entries, len(self.heap), len(self.relocs) // 4,
                            self.meta, self.header.archive_id, self.header.flags,
                            strict=False)
        out = bytearray(h.file_len)
        heap_off, reloc_off = h.heap_off, h.reloc_off
        for off, b in parts:
            out[off:off + len(b)] = b
        out[heap_off:heap_off + len(self.heap)] = self.heap
        out[reloc_off:reloc_off + len(self.relocs)] = self.relocs
        for name, value in self.header_patch.items():
            setattr(h, name, value)
        out[:_archive.HEADER_SIZE] = h.pack()
        return bytes(out)


def entry_of(model, name):
    for e in model.entries:
        if e.name == name:
            return e
    raise KeyError(name)


# ---- object layout of this CPython -------------------------------------------

# The PyCodeObject fields that marshal never reads from a .pyc but the code
# object's constructor computes or starts empty (Include/cpython/code.h of
# each version): the re-signed mutations below damage them, and the load
# must refuse the result under PYCDSVERIFY=1 (native/archive/common/layout/layout_3XX.h,
# pycds_layout_check_object).  (int fields, pointer fields; the mutations
# write 4 bytes at an int field's offset: 3.11's co_warmup is a short, and
# adding 1 to the 4 bytes there adds 1 to it.)
_CODE_FIELDS = {
    (3, 10): (("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals"),
              ("co_cell2arg", "co_zombieframe", "co_weakreflist", "co_extra",
               "co_opcache_map", "co_opcache")),
    (3, 11): (("co_argcount", "co_posonlyargcount", "co_kwonlyargcount",
               "co_nlocalsplus", "co_nlocals", "co_nplaincellvars", "co_ncellvars",
               "co_nfreevars", "_co_firsttraceable", "co_warmup"),
              ("co_weakreflist", "_co_code", "_co_linearray", "co_extra")),
    (3, 12): (("co_argcount", "co_posonlyargcount", "co_kwonlyargcount",
               "co_nlocalsplus", "co_framesize", "co_nlocals", "co_ncellvars",
               "co_nfreevars", "co_version", "_co_firsttraceable"),
              ("co_weakreflist", "_co_cached", "_co_monitoring", "co_extra")),
}
_CODE_FIELDS[(3, 13)] = (_CODE_FIELDS[(3, 12)][0],
                         _CODE_FIELDS[(3, 12)][1] + ("co_executors",))
_COMMON = ("co_consts", "co_stacksize", "co_flags", "co_firstlineno")

_layout = None


def code_layout():
    """``{name: offset}`` of this CPython's PyCodeObject fields that the
    mutations use (:data:`_CODE_FIELDS` and ``co_consts``, ``co_stacksize``,
    ``co_flags``, ``co_firstlineno``; 3.11+ ``co_code_adaptive``), and of
    the str fields ``str.state`` (PyASCIIObject) and ``str.utf8``
    (PyCompactUnicodeObject), read from
    the interpreter's own headers by compiling a few lines of C with the C
    compiler that builds extensions.  Raises RuntimeError without one."""
    global _layout
    if _layout is not None:
        return _layout
    ints, ptrs = _CODE_FIELDS[sys.version_info[:2]]
    lines = [f'printf("{f} %zu\\n", offsetof(PyCodeObject, {f}));'
             for f in (*_COMMON, *ints, *ptrs)]
    if sys.version_info >= (3, 11):
        lines.append('printf("co_code_adaptive %zu\\n", '
                     'offsetof(PyCodeObject, co_code_adaptive));')
    lines += ['printf("str.state %zu\\n", offsetof(PyASCIIObject, state));',
              'printf("str.utf8 %zu\\n", offsetof(PyCompactUnicodeObject, utf8));']
    src = ("#include <Python.h>\n#include <stddef.h>\n#include <stdio.h>\n"
           "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    out = cprobe.run(src)
    _layout = {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}
    return _layout


def code_int_fields():
    """The int fields of :data:`_CODE_FIELDS` for this CPython."""
    return _CODE_FIELDS[sys.version_info[:2]][0]


def code_ptr_fields():
    """The pointer fields of :data:`_CODE_FIELDS` for this CPython."""
    return _CODE_FIELDS[sys.version_info[:2]][1]


def internal_target(model, e, slot):
    """The chunk offset a chunk-relative pointer slot of module ``e`` holds
    (as the writer stores INTERNAL targets), or None if the slot has no
    INTERNAL relocation."""
    for _, s, k in _ptr_slots(model, e):
        if s == slot and k == 0:
            at = e.chunk_off + slot
            return int.from_bytes(model.heap[at:at + 8], "little")
    return None


def const_items(model, e, code_off):
    """``(slot, target)`` chunk offsets of each co_consts item of the code
    object at chunk offset ``code_off`` of module ``e``; target None where
    the item is not an INTERNAL reference into the chunk (an interned str,
    a static object).  Empty where co_consts is not in the chunk."""
    consts = internal_target(model, e, code_off + code_layout()["co_consts"])
    if consts is None:
        return []
    at = e.chunk_off + consts
    n = int.from_bytes(model.heap[at + 16:at + 24], "little")      # ob_size
    slots = [consts + 24 + 8 * k for k in range(n)]                 # ob_item
    return [(slot, internal_target(model, e, slot)) for slot in slots]


def nested_code(model, e, code_off):
    """``(slot, target)`` chunk offsets of the co_consts items of the code
    object at chunk offset ``code_off`` of module ``e`` that are code
    objects of the chunk."""
    base = e.chunk_off
    root_type = model.heap[base + e.root_off + 8:base + e.root_off + 16]
    return [(slot, t) for slot, t in const_items(model, e, code_off)
            if t is not None and model.heap[base + t + 8:base + t + 16] == root_type]


# ---- mutations ---------------------------------------------------------------

def _sections(data):
    h = _archive.Header.unpack(data)
    return {
        "header": (0, _archive.HEADER_SIZE),
        "meta": (h.meta_off, h.meta_len),
        "buckets": (h.buckets_off, h.nbuckets * 8),
        "entries": (h.entries_off, h.entries_len),
        "chunks": (h.chunks_off, h.nmodules * _archive.CHUNK_REC),
        "heap": (h.heap_off, h.heap_len),
        "relocs": (h.reloc_off, h.reloc_count * 4),
    }


def raw_mutations(data, rng, n):
    """At least ``n`` (label, bytes) raw mutants of ``data``, one at a time
    (each is a whole archive)."""
    secs = _sections(data)
    names = sorted(secs)
    count = 0
    # Truncations: 0, around every section boundary, and random lengths.
    cuts = {0, 1, 7, 8, _archive.HEADER_SIZE - 1, _archive.HEADER_SIZE, len(data) - 1}
    for off, length in secs.values():
        cuts.update({off, off + 1, off + length - 1, off + length})
    for c in sorted(x for x in cuts if 0 <= x < len(data)):
        yield f"truncate:{c}", data[:c]
        count += 1
    yield "append:1", data + b"\0"
    yield "append:4096", data + bytes(4096)
    count += 2
    while count < n:
        kind = rng.choice(("flip", "flip", "flip", "range", "truncate", "zero"))
        sec = rng.choice(names)
        off, length = secs[sec]
        if length == 0:
            continue
        b = bytearray(data)
        if kind == "flip":
            pos = off + rng.randrange(length)
            bit = rng.randrange(8)
            b[pos] ^= 1 << bit
            label = f"flip:{sec}:{pos}:{bit}"
        elif kind == "range":
            pos = off + rng.randrange(length)
            ln = rng.randint(1, 64)
            b[pos:pos + ln] = bytes(rng.randrange(256) for _ in range(ln))[:len(b) - pos]
            label = f"range:{sec}:{pos}:{ln}"
        elif kind == "zero":
            pos = off + rng.randrange(length)
            ln = rng.randint(1, 4096)
            end = min(len(b), pos + ln)
            b[pos:end] = bytes(end - pos)
            label = f"zero:{sec}:{pos}:{ln}"
        else:
            c = rng.randrange(len(data))
            label, b = f"truncate:{c}", data[:c]
        yield label, bytes(b)
        count += 1


def _ptr_slots(model, e):
    """Relocation indices of module e, with (slot, kind)."""
    for i in range(e.reloc_first, e.reloc_first + e.reloc_count):
        v = model.reloc(i)
        yield i, v & ~7, v & 7


def resigned_mutations(data, rng, n, used):
    """``n`` (label, bytes) structural mutants, re-signed, one at a time.
    ``used`` are the module names the program imports (mutations target
    them so they are reached)."""
    count = 0
    base = Model(data)
    names = [e.name for e in base.entries if e.name in used] or \
        [e.name for e in base.entries]
    big = [0xFFFFFFFF, 1 << 32, 1 << 40, (1 << 63) - 1, 2 ** 64 - 8]

    def entry_field(m, e):
        field = rng.choice(("chunk_off", "chunk_len", "root_off", "reloc_first",
                            "reloc_count", "number"))
        old = getattr(e, field)
        new = rng.choice([old + 8, old - 8, old + 1, old * 2 + 8, 0,
                          rng.choice(big), old + rng.randrange(1, 1 << 16) * 8])
        if field == "number":
            new = rng.choice([len(m.entries), len(m.entries) + 5, 2 ** 32 - 1, -1])
        if new < 0 and field != "number":
            new = 0
        if field in ("chunk_off", "chunk_len", "root_off", "reloc_first", "reloc_count") and new == old:
            new = old + 8
        setattr(e, field, new)
        return f"entry:{e.name}:{field}:{old}->{new}"

    def reloc_slot(m, e):
        if not e.reloc_count:
            return None
        i = e.reloc_first + rng.randrange(e.reloc_count)
        v = m.reloc(i)
        choice = rng.randrange(4)
        if choice == 0:      # slot outside the chunk
            nv = ((e.chunk_len + rng.randrange(0, 1 << 12) * 8) & ~7) | (v & 7)
        elif choice == 1:    # unknown kind
            nv = (v & ~7) | rng.choice((4, 5, 6, 7))
        elif choice == 2:    # kind swapped
            nv = (v & ~7) | rng.choice([k for k in (0, 1, 2, 3) if k != v & 7])
        else:                # slot moved to another place in the chunk
            nv = (rng.randrange(max(e.chunk_len // 8, 1)) * 8) | (v & 7)
        if nv == v:
            return None
        m.set_reloc(i, nv)
        return f"reloc:{e.name}:{i}:{v:#x}->{nv:#x}"

    def slot_value(m, e):
        if not e.reloc_count:
            return None
        i, slot, kind = rng.choice(list(_ptr_slots(m, e)))
        at = e.chunk_off + slot
        old = int.from_bytes(m.heap[at:at + 8], "little")
        if kind == 1:
            cands = [old + 8, old - 8, old + 1, old + 4096 * 1024, -old,
                     old ^ (1 << 40), 0, 8, 16, 24]
        else:
            cands = [e.chunk_len, e.chunk_len - 8, e.chunk_len + 8, old + 1, old + 4,
                     2 ** 63, 2 ** 64 - 8, old - 8 if old >= 8 else 8,
                     rng.randrange(max(e.chunk_len // 8, 1)) * 8]
        new = rng.choice(cands) & (2 ** 64 - 1)
        if new == old:
            return None
        m.heap[at:at + 8] = new.to_bytes(8, "little")
        return f"slot:{e.name}:{slot}:kind{kind}:{old:#x}->{new:#x}"

    def header_field(m, e):
        field = rng.choice(("meta_off", "buckets_off", "entries_off", "heap_off",
                            "heap_len", "reloc_off", "reloc_count", "nmodules",
                            "nbuckets", "entries_len", "meta_len", "py_hexversion",
                            "format", "file_len", "chunks_off", "chunks_sum"))
        h, _ = _archive.file_sections(m.entries, len(m.heap), len(m.relocs) // 4, m.meta,
                        m.header.archive_id, strict=False)
        old = getattr(h, field)
        new = rng.choice([old + 8, old - 8 if old >= 8 else 0, old + 4096,
                          old * 2 + 1, 0, rng.choice(big)])
        if new == old:
            return None
        m.header_patch[field] = new
        return f"header:{field}:{old}->{new}"

    def meta_field(m, e):
        key, value = rng.choice([
            ("layout", m.meta["layout"].replace("cpython-3.11", "cpython-3.12")),
            ("layout", m.meta["layout"] + "x"),
            ("layout", m.meta["layout"].replace("build=", "build=00")),
            ("layout", ""),
            ("version", m.meta["version"].replace("3.11", "3.12", 1)),
            ("hexversion", 0x030C01F0),
            ("cache_tag", "cpython-312"),
            ("optimize", 1),
            ("optimize", 2),
            ("byteorder", "big"),
        ])
        old = m.meta.get(key)
        m.meta[key] = value
        return f"meta:{key}:{old!r}->{value!r}"

    def code_field(m, e):
        """A field of the module's code object that marshal never reads from
        a .pyc but computes (counts derived from co_localspluskinds, caches
        reset per process: :data:`_CODE_FIELDS`).  co_stacksize, co_flags
        and co_firstlineno are left alone: a .pyc carries them and CPython
        trusts them there too."""
        try:
            lay = code_layout()
        except RuntimeError:
            return None
        name = rng.choice(sorted(code_int_fields()) + sorted(code_ptr_fields()))
        at = e.chunk_off + e.root_off + lay[name]
        if name in code_int_fields():
            old = int.from_bytes(m.heap[at:at + 4], "little", signed=True)
            new = rng.choice([old + 1, old - 1, -1, 2 ** 31 - 1, old + 1000])
            m.heap[at:at + 4] = new.to_bytes(4, "little", signed=True)
        else:
            old = 0
            new = rng.choice([8, 2 ** 40, e.root_off])
            m.heap[at:at + 8] = new.to_bytes(8, "little")
        return f"code:{e.name}:{name}:{old}->{new}"

    makers = ((entry_field, 3), (reloc_slot, 3), (slot_value, 4),
              (header_field, 1), (meta_field, 1), (code_field, 2))
    pool = [f for f, w in makers for _ in range(w)]
    attempts = 0
    while count < n and attempts < 20 * n:
        attempts += 1
        m = Model(data)
        e = entry_of(m, rng.choice(names))
        label = rng.choice(pool)(m, e)
        if label is None:
            continue
        try:
            blob = m.to_bytes()
        except (OverflowError, ValueError, MemoryError):
            continue
        yield "resigned:" + label, blob
        count += 1


def iter_mutations(data, rng, n_raw, n_resigned, used):
    yield from raw_mutations(data, rng, n_raw)
    yield from resigned_mutations(data, rng, n_resigned, used)


def mutations(data, rng, n_raw, n_resigned, used):
    return list(iter_mutations(data, rng, n_raw, n_resigned, used))


# ---- running the oracle -------------------------------------------------------

class Result:
    def __init__(self, label, verdict, detail=""):
        self.label = label
        self.verdict = verdict    # "refused", "accepted", or a failure kind
        self.detail = detail

    @property
    def ok(self):
        return self.verdict in ("refused", "accepted", "content")


def check(label, rc, out, err, plain, path):
    """Apply the oracle to one SHARE run; returns a :class:`Result`."""
    prc, pout, perr = plain
    if rc is None:
        return Result(label, "hang")
    if rc < 0:
        return Result(label, "crash", f"signal {-rc}: {err[-500:]}")
    if (rc, out) != (prc, pout):
        if label.startswith("resigned:") and "[pycds] warning" not in err:
            # Re-signed and accepted: every check passed, so the archive is
            # well formed and holds other constants (None for a str, a
            # frozenset for a tuple) -- as a .pyc with other constants is a
            # valid .pyc.  Not a crash; counted apart.
            return Result(label, "content", f"rc {rc}; err {err[-300:]!r}")
        return Result(label, "mismatch", f"rc {rc} vs {prc}; out {out[-300:]!r}; err {err[-500:]!r}")
    extra = [line for line in err.splitlines() if line not in perr.splitlines()]
    warn = [line for line in extra if line.startswith("[pycds]")]
    if len(extra) != len(warn) or len(warn) > 1:
        return Result(label, "stderr", repr(err[-800:]))
    if warn:
        if not warn[0].startswith(f"{WARNING_PREFIX}{path} ignored: "):
            return Result(label, "stderr", warn[0])
        return Result(label, "refused", warn[0][len(WARNING_PREFIX) + len(path):])
    return Result(label, "accepted")


def fuzz(python, mutants, workdir, jobs=2, timeout=30, keep=None):
    """Run the program under SHARE with each mutant (an iterable, consumed a
    few at a time); returns Results."""
    plain = run(python, ["prog.py"], workdir)
    adir = tempfile.mkdtemp(prefix="pycds-fuzz-")
    os.chmod(adir, 0o755)

    def one(i_mutant):
        i, (label, blob) = i_mutant
        path = os.path.join(adir, f"m{i}.img")
        with open(path, "wb") as f:
            f.write(blob)
        os.chmod(path, 0o644)
        # Re-signed mutants pass the checksums by construction: they are run
        # with the deep structural check on (PYCDSVERIFY=1); raw mutants with
        # the default, where the checksums must catch them.
        verify = "1" if label.startswith("resigned:") else "0"
        rc, out, err = run(python, ["prog.py"], workdir, timeout=timeout,
                           PYCDSMODE="SHARE", PYCDSARCHIVE=path, PYCDSVERIFY=verify)
        res = check(label, rc, out, err, plain, path)
        if res.ok or keep is None:
            os.unlink(path)
        else:
            shutil.move(path, os.path.join(keep, f"m{i}.img"))
        return res

    results, pending = [], collections.deque()
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
            # At most 2 * jobs mutants in memory: each is a whole archive.
            for item in enumerate(mutants):
                pending.append(ex.submit(one, item))
                if len(pending) >= 2 * jobs:
                    results.append(pending.popleft().result())
            results += [f.result() for f in pending]
        return results
    finally:
        shutil.rmtree(adir, ignore_errors=True)


def prepare(python, base):
    """Write the program, dump its archive; returns (workdir, archive bytes,
    names of the modules the program imported from the archive)."""
    workdir = make_workdir(os.path.join(base, "w"))
    img = os.path.join(base, "base.img")
    rc, out, err = run(python, ["prog.py"], workdir, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    if not os.path.exists(img):
        raise SystemExit(f"DUMP wrote no archive: rc={rc} err={err}")
    rc, out, err = run(python, ["prog.py"], workdir, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    used = {line.split(" ", 2)[2] for line in err.splitlines()
            if line.startswith("[pycds] served ")}
    if not {"fuzzpkg", "fuzzpkg.shapes", "json"} <= used:
        raise SystemExit(f"the clean archive is not served: {err[-2000:]}")
    with open(img, "rb") as f:
        return workdir, f.read(), used


def summarize(results):
    counts = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    return {
        "cases": len(results),
        "crashes": counts.get("crash", 0),
        "hangs": counts.get("hang", 0),
        "mismatches": counts.get("mismatch", 0) + counts.get("stderr", 0),
        "refused": counts.get("refused", 0),
        "accepted": counts.get("accepted", 0),
        "content_changed": counts.get("content", 0),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1200, help="total mutants")
    ap.add_argument("--resigned-share", type=float, default=0.4,
                    help="fraction of re-signed structural mutants")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--keep", default=None, help="directory for failing mutants")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    base = tempfile.mkdtemp(prefix="pycds-fuzzbase-")
    try:
        workdir, data, used = prepare(args.python, base)
        n_res = int(args.cases * args.resigned_share)
        mutants = iter_mutations(data, rng, args.cases - n_res, n_res, used)
        t0 = time.time()
        results = fuzz(args.python, mutants, workdir, args.jobs, keep=args.keep)
        dt = time.time() - t0
    finally:
        shutil.rmtree(base, ignore_errors=True)
    reasons = {}
    for r in results:
        if not r.ok:
            print(f"FAIL {r.verdict} {r.label}: {r.detail}")
        elif r.verdict == "content":
            print(f"content changed (well-formed re-signed archive) {r.label}: "
                  f"{r.detail[-200:]}")
        elif r.verdict == "refused":
            key = re.sub(r"\d+", "N", r.detail.rsplit(": ", 1)[-1])[:70]
            reasons[key] = reasons.get(key, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  refused {count:5d}  {reason}")
    s = summarize(results)
    raw = sum(1 for r in results if not r.label.startswith("resigned:"))
    print(f"seed={seed} archive_bytes={len(data)} raw={raw} resigned={len(results) - raw} "
          f"seconds={dt:.0f}")
    print(" ".join(f"{k}={v}" for k, v in s.items()))
    return 0 if s["crashes"] == s["hangs"] == s["mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
