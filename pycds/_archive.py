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
with XXH64.  The writing side (:func:`layout`)
lays out what pycds._dumper collected; pycds._writer puts it in a file.  The
meta block names the interpreter the archive is for
(:func:`meta_for_this_interpreter`); a reader refuses an archive of another.
"""

import _imp
import marshal
import os
import stat
import sys

from ._config import interpreter_tag, meta_for_this_interpreter
from ._trust import check_trusted
from .errors import ArchiveFormatError, ForeignArchiveError, program_raised

__all__ = ["Header", "ModuleEntry", "Index", "layout", "checksum", "name_hash",
           "meta_for_this_interpreter", "interpreter_tag"]

MAGIC = b"PYCDS\x00ar"
FORMAT_VERSION = 6
HEADER_SIZE = 256
EMPTY = 0xFFFFFFFF
# The heap section's alignment in the file (PYCDS_HEAP_ALIGN in
# native/archive/pycds_native.h): the format's, not the page size (the loader
# reads the heap into memory of its own), so an archive written under 4 KiB
# pages is served under 16 or 64 KiB ones and the other way round.
HEAP_ALIGN = 4096
_ENTRY_READ = 1024    # bytes read at once for an index entry

# Header fields: (name, offset, size).  Bytes 148..151 and 168..247 are
# reserved (zero).
_FIELDS = (
    ("magic", 0, 8),
    ("format", 8, 4),
    ("header_size", 12, 4),
    ("archive_id", 16, 8),
    ("created_ns", 24, 8),
    ("nmodules", 32, 4),
    ("flags", 36, 4),
    ("meta_off", 40, 8),
    ("meta_len", 48, 8),
    ("buckets_off", 56, 8),
    ("nbuckets", 64, 8),
    ("entries_off", 72, 8),
    ("entries_len", 80, 8),
    ("heap_off", 88, 8),
    ("heap_len", 96, 8),
    ("reloc_off", 104, 8),
    ("reloc_count", 112, 8),
    ("file_len", 120, 8),
    ("meta_sum", 128, 8),
    ("buckets_sum", 136, 8),
    ("py_hexversion", 144, 4),
    ("chunks_off", 152, 8),
    ("chunks_sum", 160, 8),
)
# One chunk-table record per module, in module-number order (read by the
# native loader; see docs/archive-format.md and native/archive/loader/archive.h):
# chunk_off u64, chunk_len u32, root_off u32, reloc_first u64,
# reloc_count u32, zero u32, checksum u64.
CHUNK_REC = 40

# How a module's code reached the dump run: an index entry's pyc_kind.
PYC_NONE, PYC_TIMESTAMP, PYC_CHECKED_HASH, PYC_UNCHECKED_HASH = 0, 1, 2, 3
_SUM_AT = 248
_HEADER_KEY = 0x50594344534844        # "PYCDSHD"
_NAME_KEY = 0x50594344534e4d          # "PYCDSNM"


def _u(b, off, size):
    return int.from_bytes(b[off:off + size], "little")


def checksum(data, key):
    """64-bit SipHash-1-3 of ``data`` keyed with ``key`` (an int), as an int."""
    return int.from_bytes(_imp.source_hash(key & 0x7FFFFFFFFFFFFFFF, data), "little")


def name_hash(name):
    """Bucket hash of a module name (independent of PYTHONHASHSEED)."""
    return checksum(name.encode("utf-8", "surrogatepass"), _NAME_KEY)


# ---- the interpreter an archive is for --------------------------------------
# (pycds._config takes these facts at start-up, without this module.)

def code_debug_ranges(code):
    """Whether ``code`` has column positions (every code object made with
    them has some: even an empty module's RESUME is at column 0)."""
    positions = getattr(code, "co_positions", None)
    return positions is None or any(p[2] is not None for p in positions())


def why_not_archive(head, size):
    """"" when a file of ``size`` bytes whose first bytes are ``head`` is a
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

# What pycds._writer.check_replaceable needs of an archive file: its name,
# the suffix of an empty file left for one, the judge above.
ARCHIVE_FILE = ("archive", ".img", why_not_archive)


# ---- the reading side ---------------------------------------------------

class Header:
    """The parsed 256-byte header."""

    __slots__ = tuple(name for name, _, _ in _FIELDS)

    @classmethod
    def parse(cls, b, file_len, check_version=True):
        if len(b) < HEADER_SIZE:
            raise ArchiveFormatError(f"file is {len(b)} bytes, shorter than a header")
        if b[:8] != MAGIC:
            raise ArchiveFormatError("not a pycds archive (bad magic)")
        h = cls()
        for name, off, size in _FIELDS[1:]:
            setattr(h, name, _u(b, off, size))
        h.magic = b[:8]
        if h.format != FORMAT_VERSION:
            raise ForeignArchiveError(f"archive format {h.format}, this pycds reads "
                                 f"format {FORMAT_VERSION}")
        # Checked before the checksum: _imp.source_hash is SipHash-2-4 on
        # 3.10 and SipHash-1-3 from 3.11 on, so another version's header
        # could not even be verified; say which version made it instead.
        if check_version and h.py_hexversion >> 16 != sys.hexversion >> 16:
            raise ForeignArchiveError(
                f"made by Python {h.py_hexversion >> 24}.{h.py_hexversion >> 16 & 0xFF}, "
                f"this is Python {sys.version_info[0]}.{sys.version_info[1]}")
        if _u(b, _SUM_AT, 8) != checksum(b[:_SUM_AT], _HEADER_KEY):
            if (h.py_hexversion >= 0x030B0000) != (sys.hexversion >= 0x030B0000):
                # Not damage: the other side of the SipHash change (above).
                raise ForeignArchiveError(
                    f"made by Python {h.py_hexversion >> 24}.{h.py_hexversion >> 16 & 0xFF}, "
                    f"whose checksums this Python {sys.version_info[0]}."
                    f"{sys.version_info[1]} cannot verify; read it with that version")
            raise ArchiveFormatError("header checksum mismatch")
        if h.file_len != file_len:
            raise ArchiveFormatError(f"file is {file_len} bytes, header says {h.file_len} "
                              f"(truncated or appended to)")
        for off, length in ((h.meta_off, h.meta_len),
                            (h.buckets_off, h.nbuckets * 8),
                            (h.entries_off, h.entries_len),
                            (h.chunks_off, h.nmodules * CHUNK_REC),
                            (h.heap_off, h.heap_len),
                            (h.reloc_off, h.reloc_count * 4)):
            if off < HEADER_SIZE or off + length > file_len:
                raise ArchiveFormatError("section outside the file")
        # (The writer makes at least 8 and twice the modules: a lookup
        # always ends at an empty bucket.)
        if h.nbuckets < 1 or h.nbuckets & (h.nbuckets - 1) or h.nbuckets < h.nmodules:
            raise ArchiveFormatError("bad bucket table size")
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

    __slots__ = ("number", "name", "origin", "is_package", "search_locations",
                 "mtime_ns", "size", "source_hash", "pyc_path", "pyc_kind",
                 "pyc_mtime_ns", "pyc_size", "check_hash_pycs",
                 "chunk_off", "chunk_len", "root_off", "reloc_first",
                 "reloc_count", "chunk_sum", "nobjects", "search")

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
        """This entry as if dumped at ``origin``, the source plain import
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
    """Read side of an archive: header checked, lookups by module name.

    ``Index.open(path)`` raises :class:`~pycds.errors.ArchiveFormatError`
    with the reason when the archive cannot be used; it never reads more
    than the header, the meta block and the bucket table.
    """

    def __init__(self, path, fd, header, meta, buckets, foreign=None, file_id=None,
                 mtime=0.0):
        self.path = path
        self.mtime = mtime       # when the file was written (st_mtime, s)
        self.foreign = foreign   # why this interpreter may not use it, or None
        self.fd = fd
        self.header = header
        self.meta = meta
        self._buckets = buckets
        self._mask = header.nbuckets - 1
        self._key = header.archive_id
        self._table = None       # chunk table bytes, read by verify only
        self._file_id = file_id  # (st_dev, st_ino) of the file opened
        self._owned = True       # self.fd is ours to close (see adopt)
        self._reopen = fd < 0    # the first read opens the file (open's
                                 # out_of_the_way)

    @classmethod
    def open(cls, path, check_owner=True, check_interpreter=True,
             out_of_the_way=False):
        """The archive at ``path``.  With ``out_of_the_way`` (SHARE's
        start-up) no descriptor is held once the header, meta block and
        bucket table are read: the first entry read opens the file again
        (:meth:`descriptor`), and the native handle then moves it out of
        the program's way (native/archive/loader/descriptor.c; :meth:`adopt`).  Raises
        :class:`~pycds.errors.ArchiveFormatError`
        (:class:`~pycds.errors.ForeignArchiveError`)."""
        try:
            # O_NONBLOCK: opening a FIFO (or a device) put at the archive
            # path must not block start-up; it is refused as not a regular
            # file just below.  No effect on regular files.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise ArchiveFormatError(e.strerror or str(e)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ArchiveFormatError("not a regular file")
            if check_owner:
                check_trusted(st, path)
            h = Header.parse(os.pread(fd, HEADER_SIZE, 0), st.st_size,
                             check_version=check_interpreter)
            meta_b = os.pread(fd, h.meta_len, h.meta_off)
            if checksum(meta_b, h.archive_id) != h.meta_sum:
                raise ArchiveFormatError("meta checksum mismatch")
            meta = marshal.loads(meta_b)
            if type(meta) is not dict:
                raise ArchiveFormatError("meta block is not a dict")
            here = meta_for_this_interpreter()
            foreign = None
            for key, value in here.items():
                if key not in meta:
                    foreign = f"made by an older pycds (its meta has no {key})"
                elif meta[key] != value:
                    foreign = (f"made by another interpreter ({key} "
                               f"{meta[key]!r}, this is {value!r})")
                if foreign is not None:
                    if check_interpreter:
                        raise ForeignArchiveError(foreign)
                    break
            buckets = os.pread(fd, h.nbuckets * 8, h.buckets_off)
            if len(buckets) != h.nbuckets * 8 or \
                    checksum(buckets, h.archive_id) != h.buckets_sum:
                raise ArchiveFormatError("bucket table checksum mismatch")
            if out_of_the_way:
                os.close(fd)
                fd = -1
            return cls(path, fd, h, meta, buckets, foreign, (st.st_dev, st.st_ino),
                       st.st_mtime)
        except ArchiveFormatError:
            os.close(fd)
            raise
        except (OSError, ValueError, EOFError, TypeError) as e:
            os.close(fd)
            raise ArchiveFormatError(f"unreadable ({e})") from None

    def lookup(self, name):
        """Return the :class:`ModuleEntry` for ``name``, or None."""
        entry = self._lookup(name)
        if entry is _SWAPPED:       # once: the new archive holds a descriptor
            entry = self._lookup(name)
        return entry

    def _lookup(self, name):
        h = name_hash(name)
        tag = h >> 32
        b = self._buckets
        i = h & self._mask
        # At most every bucket once: a table without an empty bucket (a
        # crafted one: the writer leaves half of them empty) must not
        # loop for ever.
        for _ in range(self.header.nbuckets):
            at = i * 8
            off = int.from_bytes(b[at + 4:at + 8], "little")
            if off == EMPTY:
                return None
            if int.from_bytes(b[at:at + 4], "little") == tag:
                if self.fd < 0:
                    # The first entry read opens the file, which may take
                    # another archive renamed over this one: its buckets
                    # come with it.  A miss opens nothing.
                    self.descriptor()
                    if self._buckets is not b:
                        return _SWAPPED
                entry = self._read_entry(off)
                if entry is None:
                    raise ArchiveFormatError("index entry fails its checksum (archive "
                                      "corrupt, or replaced while in use)")
                if entry.name == name:
                    return entry
            i = (i + 1) & self._mask
        return None

    def _read_entry(self, off):
        fd = self.fd if self.fd >= 0 else self.descriptor()
        h = self.header         # (after descriptor(), which may change it)
        if off + 12 > h.entries_len:
            return None
        # One pread covers most entries (a few hundred bytes); a longer
        # entry gets a second read for the rest.
        head = os.pread(fd, min(_ENTRY_READ, h.entries_len - off), h.entries_off + off)
        length = int.from_bytes(head[:4], "little")
        if length < 12 or off + length > h.entries_len or len(head) < 12:
            return None
        payload = head[12:length]
        if len(head) < length:
            payload += os.pread(fd, length - len(head), h.entries_off + off + len(head))
        if checksum(payload, self._key) != int.from_bytes(head[4:12], "little"):
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
        while off + 12 <= h.entries_len:
            length = int.from_bytes(os.pread(self.descriptor(), 4, h.entries_off + off), "little")
            entry = self._read_entry(off)
            if entry is None or length < 12:
                raise ArchiveFormatError(f"bad index entry at {off}")
            out.append(entry)
            off += length
        return out

    def chunk_intact(self, entry):
        """True if ``entry``'s heap chunk and relocation entries still have
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
        """The chunk-table record of module ``number`` as a tuple
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

    def fd_lost(self):
        """Whether the descriptor no longer refers to the file opened: the
        program closed it (daemonizing code closes every descriptor), and
        maybe opened another file under its number.  A read failing then
        says nothing about the archive.  Never raises."""
        if self.fd < 0:
            return False          # none held yet (or closed by pycds)
        try:
            st = os.fstat(self.fd)
        except (OSError, ValueError):
            return True
        return self._file_id is not None and (st.st_dev, st.st_ino) != self._file_id

    def descriptor(self):
        """The descriptor to read through; the first call of an index
        opened ``out_of_the_way`` opens the file again.  Where the path
        names another file by then (a dump renamed a new archive over it;
        nothing was read from this one yet), that archive is taken, checked
        as at start-up.  Raises :class:`ArchiveFormatError`, or OSError where the
        file cannot be opened."""
        if self.fd >= 0:
            return self.fd
        if not self._reopen:
            raise ArchiveFormatError("archive closed")
        self._reopen = False
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if (st.st_dev, st.st_ino) == self._file_id:
            self.fd, self._owned = fd, True
            return fd
        os.close(fd)
        vars(self).update(vars(Index.open(self.path)))
        return self.fd

    def let_go(self):
        """Close the descriptor the first entry read opened, while no native
        handle holds one (out of the program's way): the next read opens
        the file again, as the first did.  For a lookup whose entry is not
        kept (a start-up import left plain), so that until a module is
        served SHARE holds no descriptor numbered where the program's own
        opens land."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._reopen = True

    def adopt(self, fd):
        """Read through ``fd`` from now on, a descriptor on the same file
        that its owner (the native handle) closes; this one's own is
        closed."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        self._owned = False

    def close(self):
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


# ---- the writing side --------------------------------------------------

_ORDER = sys.byteorder
_ZERO4 = bytes(4)


def chunk_table(entries, archive_id, strict=True):
    """The chunk table of ``entries`` (record i describes ``entries[i]``)
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


def layout(entries, heap_len, reloc_count, meta, archive_id, flags=0,
           strict=True):
    """Lay out an archive.  Returns ``(header, parts)`` where ``parts`` is a
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
        rec = (len(payload) + 12).to_bytes(4, "little") + \
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
    """``marshal.dumps(obj)`` as of a fresh copy of ``obj``: the bytes
    depend on its value only.  Marshal marks an object for sharing
    (``FLAG_REF``) by its reference count and a str by whether it is
    interned (``w_ref``, ``w_complex_object`` in Python/marshal.c, 3.10-3.13):
    facts of the process, which differ between two dumps of the same files
    (which thread imported a module first, say).  Version 2 writes neither;
    loaded again, every object is held once."""
    return marshal.dumps(marshal.loads(marshal.dumps(obj, 2)))


def _align(x, a):
    return (x + a - 1) // a * a
