"""The archive file format: header, module index, chunk table; both sides.

Specified byte by byte in docs/archive-format.md.  All integers are
little-endian except the chunk table's (native order: the C loader reads its
records as structs).  Sections, in file order::

    header | meta | bucket table | module entries | chunk table | heap | relocations

The reading side (:class:`Index`) runs at start-up, so this module imports
only builtins and reads with ``os.pread``: opening an archive reads the
header, the meta block and the bucket table, nothing else; a lookup reads
one entry.  Every part is checked before use: the header with a fixed-key
hash, the rest with hashes keyed by the archive's id (a hash of its
content), so a part of another archive (say, after the file was overwritten
in place) never passes as part of this one.  Checksums use
``_imp.source_hash`` (the function PEP 552 uses for hash-based pycs:
SipHash-1-3 from 3.11, SipHash-2-4 on 3.10, so an archive is only ever
verified by its own minor version); the heap is checked per module, in C,
with XXH64.  The writing side (:func:`file_sections`)
lays out what pycds.dumping.dumper collected; pycds._files puts it in a file.  The
meta block names the interpreter the archive is for
(:func:`meta_for_this_interpreter`); a reader refuses an archive of another.
"""

import _imp
import marshal
import os
import sys

from . import _format
from ._config import interpreter_tag, meta_for_this_interpreter
from .errors import ArchiveFormatError, program_raised

__all__ = ["Header", "ModuleEntry", "Index", "file_sections", "checksum", "name_hash",
           "meta_for_this_interpreter", "interpreter_tag"]

# The format's constants are pycds._format's (shared with the C loader).
HEADER_SIZE, MAGIC, FORMAT_VERSION = _format.HEADER_SIZE, _format.MAGIC, _format.FORMAT_VERSION
HEAP_ALIGN, CHUNK_REC, EMPTY = _format.HEAP_ALIGN, _format.CHUNK_REC, _format.EMPTY_BUCKET
PYC_NONE, PYC_TIMESTAMP = _format.PYC_NONE, _format.PYC_TIMESTAMP
PYC_CHECKED_HASH, PYC_UNCHECKED_HASH = _format.PYC_CHECKED_HASH, _format.PYC_UNCHECKED_HASH
_FIELDS = _format.HEADER_FIELDS
_SUM_AT = _format.HEADER_SUM_AT
_HEADER_KEY = _format.HEADER_KEY
_NAME_KEY = _format.NAME_KEY
_ENTRY_READ = _format.ENTRY_READ
_ENTRY_HEAD = _format.ENTRY_HEAD


def _u(b, off, size):
    return int.from_bytes(b[off:off + size], "little")


def checksum(data, key):
    """Return the 64-bit SipHash-1-3 of ``data`` keyed with int ``key``."""
    return int.from_bytes(_imp.source_hash(key & 0x7FFFFFFFFFFFFFFF, data), "little")


def name_hash(name):
    """Bucket hash of a module name (independent of PYTHONHASHSEED)."""
    return checksum(name.encode("utf-8", "surrogatepass"), _NAME_KEY)


# ---- the interpreter an archive is for --------------------------------------
# (pycds._config takes these facts at start-up, without this module.)

def code_debug_ranges(code):
    """Return whether code has column positions.

    Whether ``code`` has column positions (every code object made with
    them has some: even an empty module's RESUME is at column 0)."""
    positions = getattr(code, "co_positions", None)
    return positions is None or any(p[2] is not None for p in positions())


def why_not_archive(head, size):
    """Return "" if a dump may replace this file as an archive, else why not.

    "" when a file of ``size`` bytes whose first bytes are ``head`` is a
    pycds archive a dump may replace -- it starts with the magic, whatever
    its version or damage -- else why not: not an archive, or one with
    bytes appended after the end its header gives (someone else's bytes;
    a truncated archive is replaced)."""
    if head[:8] != MAGIC:
        return f"is not a pycds archive (a file of {size} bytes that does not start as one)"
    if len(head) >= HEADER_SIZE and _u(head, *_AT["format"]) == FORMAT_VERSION \
            and _u(head, _SUM_AT, 8) == checksum(head[:_SUM_AT], _HEADER_KEY):
        # (A header that fails its checksum is damage: its length is no
        # evidence of anything.)
        end = _u(head, *_AT["file_len"])
        if size > end:
            return f"is a pycds archive with {size - end} bytes appended to it"
    return ""


_AT = {name: (off, size) for name, off, size in _FIELDS}

# What pycds._files.check_replaceable needs of an archive file: its name,
# the suffix of an empty file left for one, the judge above.
ARCHIVE_FILE = ("archive", ".img", why_not_archive)


# ---- the reading side ---------------------------------------------------

class Header:
    """The parsed 256-byte header."""

    __slots__ = tuple(name for name, _, _ in _FIELDS)

    @classmethod
    def unpack(cls, b):
        """Return the fields of header b, unchecked; ValueError if too short.

        The fields of the header ``b`` (its first HEADER_SIZE bytes), as
        they are: nothing is checked (an archive's reader checks them:
        :class:`Index`).  For tools that rewrite a header."""
        if len(b) < HEADER_SIZE:
            raise ValueError(f"{len(b)} bytes, shorter than a header")
        h = cls()
        for name, off, size in _FIELDS[1:]:
            setattr(h, name, _u(b, off, size))
        h.magic = b[:8]
        return h

    def pack(self):
        b = bytearray(HEADER_SIZE)
        b[:8] = MAGIC
        for name, off, size in _FIELDS[1:]:
            b[off:off + size] = getattr(self, name).to_bytes(size, "little")
        b[_SUM_AT:] = checksum(bytes(b[:_SUM_AT]), _HEADER_KEY).to_bytes(8, "little")
        return bytes(b)


class ModuleEntry:
    """One module of the index (see docs/archive-format.md, "entries")."""

    __slots__ = _format.ENTRY_FIELDS

    # Plain assignments: an entry is built on every archive hit, and this is
    # several times faster than a setattr loop over __slots__.
    def __init__(self, number, name, origin, is_package, search_locations,
                 mtime_ns, size, source_hash, pyc_path, pyc_kind, pyc_mtime_ns,
                 pyc_size, check_hash_pycs, chunk_off, chunk_len, root_off,
                 reloc_first, reloc_count, chunk_sum, nobjects, search):
        self.number = number
        self.name = name
        self.origin = origin
        self.is_package = is_package
        self.search_locations = search_locations
        self.mtime_ns = mtime_ns
        self.size = size
        self.source_hash = source_hash
        self.pyc_path = pyc_path
        self.pyc_kind = pyc_kind
        self.pyc_mtime_ns = pyc_mtime_ns
        self.pyc_size = pyc_size
        self.check_hash_pycs = check_hash_pycs
        self.chunk_off = chunk_off
        self.chunk_len = chunk_len
        self.root_off = root_off
        self.reloc_first = reloc_first
        self.reloc_count = reloc_count
        self.chunk_sum = chunk_sum
        self.nobjects = nobjects
        self.search = search

    def to_tuple(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def moved_to(self, origin, cached, is_package):
        """Return this entry as if dumped at origin (a moved tree), or None.

        This entry as if dumped at ``origin``, the source plain import
        finds now (``cached``: its spec's ``.pyc`` path), when the archived
        file's tree has moved there: the same path below the search-path
        entry that holds the top-level package (``pkg/sub/mod.py``,
        ``pkg/__init__.py``, ``mod.py``) and the same kind (package or
        module).  None otherwise.  What the files say is for
        :func:`pycds._pyc.check` to judge, at the new place."""
        if type(origin) is not str or bool(is_package) != bool(self.is_package):
            return None
        depth = self.name.count(".") + 1 + bool(self.is_package)
        old = self.origin.rsplit("/", depth)
        new = origin.rsplit("/", depth)
        if len(new) != depth + 1 or len(old) != depth + 1 or new[1:] != old[1:] \
                or not new[0]:
            return None
        moved = ModuleEntry(*self.to_tuple())
        moved.origin = origin
        # The .pyc plain import reads at the new place stands for the dumped
        # one (under sys.pycache_prefix too: its own path there).
        moved.pyc_path = (cached or "") if self.pyc_path else ""
        moved.search = None
        return moved


_SWAPPED = object()    # Index._lookup: the archive at the path was another


class Index:
    """Read side of an archive: lookups by module name, entries, chunk table.

It reads over an archive file the native reader opened and checked
(pycds._nativeapi.ArchiveFile, whose ``path``, ``header``, ``meta``,
``foreign``, ``mtime``, ``fd``, ``descriptor()`` and ``close()`` it
passes on).

    ``Index.open(path)`` raises :class:`~pycds.errors.ArchiveFormatError`
    with the reason when the archive cannot be used; it never reads more
    than the header, the meta block and the bucket table.
    """

    def __init__(self, file):
        self.file = file
        self._table = None       # chunk table bytes, read by verify only

    def __getattr__(self, name):
        # (Only what the file has; not the file's private state.)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.file, name)

    @classmethod
    def open(cls, path, check_owner=True, check_interpreter=True,
             out_of_the_way=False):
        """Open the archive at path; raise ArchiveFormatError if unusable.

        The archive at ``path`` (pycds._nativeapi.ArchiveFile says what
        each argument does).  Needs the native module.  Raises
        :class:`~pycds.errors.ArchiveFormatError`
        (:class:`~pycds.errors.ForeignArchiveError`)."""
        from ._nativeapi import ArchiveFile
        return cls(ArchiveFile(path, check_owner, check_interpreter, out_of_the_way))

    def lookup(self, name):
        """Return the :class:`ModuleEntry` for ``name``, or None."""
        entry = self._lookup(name)
        if entry is _SWAPPED:       # once: the new archive holds a descriptor
            entry = self._lookup(name)
        return entry

    def _lookup(self, name):
        h = name_hash(name)
        tag = h >> 32
        file = self.file
        b = file.buckets
        nbuckets = file.header.nbuckets
        i = h & (nbuckets - 1)
        # At most every bucket once: a table without an empty bucket (a
        # crafted one: the writer leaves half of them empty) must not
        # loop for ever.
        for _ in range(nbuckets):
            at = i * 8
            off = int.from_bytes(b[at + 4:at + 8], "little")
            if off == EMPTY:
                return None
            if int.from_bytes(b[at:at + 4], "little") == tag:
                if file.fd < 0:
                    # The first entry read opens the file, which may take
                    # another archive renamed over this one: its buckets
                    # come with it.  A miss opens nothing.
                    file.descriptor()
                    if file.buckets is not b:
                        return _SWAPPED
                entry = self._read_entry(off)
                if entry is None:
                    raise ArchiveFormatError("index entry fails its checksum (archive "
                                      "corrupt, or replaced while in use)")
                if entry.name == name:
                    return entry
            i = (i + 1) & (nbuckets - 1)
        return None

    def _read_entry(self, off):
        fd = self.file.descriptor()
        h = self.file.header
        if off + _ENTRY_HEAD > h.entries_len:
            return None
        # One pread covers most entries (a few hundred bytes); a longer
        # entry gets a second read for the rest.
        head = os.pread(fd, min(_ENTRY_READ, h.entries_len - off), h.entries_off + off)
        length = int.from_bytes(head[:4], "little")
        if length < _ENTRY_HEAD or off + length > h.entries_len or len(head) < _ENTRY_HEAD:
            return None
        payload = head[_ENTRY_HEAD:length]
        if len(head) < length:
            payload += os.pread(fd, length - len(head), h.entries_off + off + len(head))
        if checksum(payload, h.archive_id) != int.from_bytes(head[4:_ENTRY_HEAD], "little"):
            return None
        try:
            return ModuleEntry(*marshal.loads(payload))
        except (ValueError, EOFError, TypeError) as e:
            if program_raised(e):
                raise
            return None

    def entries(self):
        """All entries, in index order (for ``info`` and ``verify``)."""
        h = self.header
        off = 0
        out = []
        while off + _ENTRY_HEAD <= h.entries_len:
            length = int.from_bytes(os.pread(self.descriptor(), 4, h.entries_off + off), "little")
            entry = self._read_entry(off)
            if entry is None or length < _ENTRY_HEAD:
                raise ArchiveFormatError(f"bad index entry at {off}")
            out.append(entry)
            off += length
        return out

    def chunk_intact(self, entry):
        """Return whether entry's chunk still has its recorded checksums.

        True if ``entry``'s heap chunk and relocation entries still have
        the checksum the dump recorded and its chunk-table record (what the
        native loader uses) says the same (reads them; needs the native
        module, as the loader does)."""
        from ._nativeapi import hash64
        h = self.header
        chunk = os.pread(self.descriptor(), entry.chunk_len, h.heap_off + entry.chunk_off)
        relocs = os.pread(self.descriptor(), 4 * entry.reloc_count,
                          h.reloc_off + 4 * entry.reloc_first)
        if len(chunk) != entry.chunk_len or len(relocs) != 4 * entry.reloc_count:
            return False
        try:
            rec = self.chunk_record(entry.number)
        except ArchiveFormatError:
            return False
        if rec != (entry.chunk_off, entry.chunk_len, entry.root_off,
                   entry.reloc_first, entry.reloc_count, entry.chunk_sum):
            return False     # the loader would use other bytes than these
        return hash64(relocs, hash64(chunk, h.archive_id)) == entry.chunk_sum

    def _chunk_table(self):
        # The whole chunk table, read once (short if the file is).
        if self._table is None:
            h = self.header
            self._table = os.pread(self.descriptor(), h.nmodules * CHUNK_REC, h.chunks_off)
        return self._table

    def chunk_table_intact(self):
        """True if the chunk table has the checksum the header records."""
        from ._nativeapi import hash64
        h = self.header
        table = self._chunk_table()
        return len(table) == h.nmodules * CHUNK_REC and \
            hash64(table, h.archive_id) == h.chunks_sum

    def chunk_record(self, number):
        """Return module number's chunk-table record; raise ArchiveFormatError.

        The chunk-table record of module ``number`` as a tuple
        ``(chunk_off, chunk_len, root_off, reloc_first, reloc_count,
        checksum)``: what the native loader uses (for ``verify``; the
        table's own checksum is checked by the loader)."""
        b = self._chunk_table()[number * CHUNK_REC:(number + 1) * CHUNK_REC]
        if len(b) != CHUNK_REC or not 0 <= number < self.header.nmodules:
            raise ArchiveFormatError(f"no chunk-table record for module {number}")
        import struct      # not at start-up: only verify reads records
        # native byte order (chunk_table)
        r = struct.unpack("=QIIQIIQ", b)
        return (r[0], r[1], r[2], r[3], r[4], r[6])


# ---- the writing side --------------------------------------------------

_ORDER = sys.byteorder
_ZERO4 = bytes(4)


def chunk_table(entries, archive_id, strict=True):
    """Return the chunk table of entries and its checksum; raise ValueError.

    The chunk table of ``entries`` (record i describes ``entries[i]``)
    and its checksum.  Raises ValueError if the entries are not numbered
    0..n-1 with their chunks in increasing heap order; with ``strict=False``
    (for tests that write damaged archives) values are stored as given,
    truncated to their fields' widths."""
    from ._nativeapi import hash64
    recs = []
    end = 0
    m32, m64 = (1 << 32) - 1, (1 << 64) - 1
    for i, e in enumerate(entries):
        if strict and (e.number != i or e.chunk_off < end or e.chunk_len > m32
                       or e.root_off > m32 or e.reloc_count > m32):
            raise ValueError(f"module entry {i} ({e.name}) out of order")
        end = e.chunk_off + e.chunk_len
        # struct.pack("=QIIQIIQ", ...), without importing struct (DUMP's
        # exit cost)
        recs += [(e.chunk_off & m64).to_bytes(8, _ORDER),
                 (e.chunk_len & m32).to_bytes(4, _ORDER),
                 (e.root_off & m32).to_bytes(4, _ORDER),
                 (e.reloc_first & m64).to_bytes(8, _ORDER),
                 (e.reloc_count & m32).to_bytes(4, _ORDER), _ZERO4,
                 (e.chunk_sum & m64).to_bytes(8, _ORDER)]
    table = b"".join(recs)
    return table, hash64(table, archive_id)


def file_sections(entries, heap_len, reloc_count, meta, archive_id, flags=0,
                  strict=True):
    """Return the header and file sections of an archive of ``entries``.

    Returns ``(header, parts)`` where ``parts`` is a
    list of ``(offset, bytes)`` for meta, buckets, entries and the chunk
    table; the heap and relocations go at ``header.heap_off`` /
    ``header.reloc_off``.  Needs the native module (the chunk table's
    checksum is XXH64).  ``strict``: see :func:`chunk_table`."""
    n = len(entries)
    nbuckets = 8
    while nbuckets < 2 * n:
        nbuckets *= 2
    meta_b = canonical_marshal(meta)
    blobs = []
    offsets = []
    pos = 0
    for e in entries:
        payload = canonical_marshal(e.to_tuple())
        rec = (len(payload) + _ENTRY_HEAD).to_bytes(4, "little") + \
            checksum(payload, archive_id).to_bytes(8, "little") + payload
        offsets.append(pos)
        blobs.append(rec)
        pos += len(rec)
    entries_b = b"".join(blobs)
    buckets = bytearray(b"\xff" * (nbuckets * 8))
    mask = nbuckets - 1
    for e, off in zip(entries, offsets):
        h = name_hash(e.name)
        i = h & mask
        while buckets[i * 8 + 4:i * 8 + 8] != b"\xff\xff\xff\xff":
            i = (i + 1) & mask
        buckets[i * 8:i * 8 + 4] = (h >> 32).to_bytes(4, "little")
        buckets[i * 8 + 4:i * 8 + 8] = off.to_bytes(4, "little")
    buckets = bytes(buckets)

    h = Header()
    h.magic = MAGIC
    h.format = FORMAT_VERSION
    h.header_size = HEADER_SIZE
    h.archive_id = archive_id
    h.created_ns = 0      # reproducible bytes: the file's mtime says when
    h.nmodules = n
    h.flags = flags
    h.py_hexversion = sys.hexversion
    h.meta_off = HEADER_SIZE
    h.meta_len = len(meta_b)
    h.buckets_off = _align(h.meta_off + h.meta_len, 8)
    h.nbuckets = nbuckets
    h.entries_off = h.buckets_off + len(buckets)
    h.entries_len = len(entries_b)
    table, h.chunks_sum = chunk_table(entries, archive_id, strict)
    h.chunks_off = _align(h.entries_off + h.entries_len, 8)
    h.heap_off = _align(h.chunks_off + len(table), HEAP_ALIGN)
    h.heap_len = heap_len
    h.reloc_off = _align(h.heap_off + heap_len, 8)
    h.reloc_count = reloc_count
    h.file_len = h.reloc_off + 4 * reloc_count
    h.meta_sum = checksum(meta_b, archive_id)
    h.buckets_sum = checksum(buckets, archive_id)
    parts = [(h.meta_off, meta_b), (h.buckets_off, buckets),
             (h.entries_off, entries_b), (h.chunks_off, table)]
    return h, parts


def canonical_marshal(obj):
    """Return marshal.dumps(obj) as of a fresh copy: bytes of its value only.

    ``marshal.dumps(obj)`` as of a fresh copy of ``obj``: the bytes
    depend on its value only.  Marshal marks an object for sharing
    (``FLAG_REF``) by its reference count and a str by whether it is
    interned (``w_ref``, ``w_complex_object`` in Python/marshal.c, 3.10-3.13):
    facts of the process, which differ between two dumps of the same files
    (which thread imported a module first, say).  Version 2 writes neither;
    loaded again, every object is held once."""
    return marshal.dumps(marshal.loads(marshal.dumps(obj, 2)))


def _align(x, a):
    return (x + a - 1) // a * a
