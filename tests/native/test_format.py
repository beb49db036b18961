"""The archive format is specified once (pycds/_format.py): the C loader is
built from it and keeps no constant of its own, and the Python side reads
its fields from it."""

import importlib.util
import inspect
import os
import re
import struct

import pycds
from pycds import _archive, _format
from pycds._native import lib

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = os.path.join(CHECKOUT, "native", "archive")


def _format_header():
    spec = importlib.util.spec_from_file_location(
        "pycds_format_header", os.path.join(NATIVE, "format_header.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FH = _format_header()
INSTALLED = os.path.dirname(os.path.dirname(os.path.abspath(pycds.__file__)))


def test_the_native_module_is_built_from_the_installed_spec():
    assert lib.pycds_format_digest() == FH.digest(FH.spec(INSTALLED))


def test_the_installed_spec_is_the_checkout_s():
    assert FH.spec(INSTALLED) == FH.spec(CHECKOUT)


def test_another_spec_gives_another_digest_and_header():
    s = FH.spec(CHECKOUT)
    changed = dict(s, ENTRY_FIELDS=s["ENTRY_FIELDS"][::-1])
    assert FH.digest(changed) != FH.digest(s)
    assert "#define PYCDS_FMT_ENTRY_SEARCH 0\n" in FH.header(changed)


def test_the_spec_is_the_module_python_reads():
    s = FH.spec(CHECKOUT)
    for name, value in s.items():
        assert getattr(_format, name) == value, name
    assert set(s) == {n for n in vars(_format) if n.isupper()}


def test_the_c_sources_keep_no_constant_of_their_own():
    own = re.compile(
        r"PYCDS\\0ar|0x50594344534|#define\s+(ENTRY_(FIELDS|READ|NUMBER|NAME|SEARCH)|"
        r"CHUNK_REC|HEADER_SIZE|FORMAT_VERSION|EMPTY_BUCKET|NAME_KEY|HEADER_KEY|SUM_AT)\b|"
        r"#define\s+\w*(PYC_(NONE|TIMESTAMP|CHECKED_HASH|UNCHECKED_HASH)|HEAP_ALIGN)\s+\d")
    found = []
    for folder, _, files in os.walk(NATIVE):
        for name in files:
            if name.endswith((".c", ".h")):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        if own.search(line):
                            found.append(f"{name}:{n}: {line.strip()}")
    assert found == []


def test_python_s_records_follow_the_spec():
    fields = list(inspect.signature(_archive.ModuleEntry).parameters)
    assert tuple(fields) == _format.ENTRY_FIELDS == _archive.ModuleEntry.__slots__
    assert _archive.Header.__slots__ == tuple(n for n, _, _ in _format.HEADER_FIELDS)
    assert _format.HEADER_FIELDS[-1][1] + _format.HEADER_FIELDS[-1][2] <= _format.HEADER_SUM_AT
    # The chunk table's record, as _archive packs and unpacks it.
    assert struct.calcsize("=QIIQIIQ") == _format.CHUNK_REC
    off = 0
    for (name, at, size), code in zip(_format.CHUNK_FIELDS, "QIIQIIQ"):
        assert (at, size) == (off, struct.calcsize(code)), name
        off += size
    assert off == _format.CHUNK_REC
