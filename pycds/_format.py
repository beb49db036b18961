"""The archive file format: header, module index, and reading them cheaply.

Specified byte by byte in docs/archive-format.md.  All integers are
little-endian.  Sections, in file order::

    header | meta | bucket table | module entries | chunk table | heap | relocations

The reading side runs at start-up, so this module imports only builtins
(``_imp``, ``marshal``, ``os``, ``stat``, ``sys``, importlib's own modules) and reads with ``os.pread``: opening an
archive reads the header, the meta block and the bucket table, nothing else;
a lookup reads one entry.  Every part is checked before use: the header with
a fixed-key hash, the rest with hashes keyed by the archive's random id, so a
part of another archive (say, after the file was overwritten in place) never
passes as part of this one.  Checksums use ``_imp.source_hash`` (the
function PEP 552 uses for hash-based pycs: SipHash-1-3 from 3.11, SipHash-2-4
on 3.10, so an archive is only ever verified by its own minor version); the heap is checked per
module, in C, with XXH64.
"""

import _frozen_importlib_external as _bootstrap_external
import _imp
import marshal
import os
import stat
import sys

from _frozen_importlib_external import _RAW_MAGIC_NUMBER, SourceFileLoader

MAGIC = b"PYCDS\x00ar"
FORMAT_VERSION = 5
HEADER_SIZE = 256
EMPTY = 0xFFFFFFFF
PAGE = 4096
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
# native loader; see docs/archive-format.md and native/archive.h):
# chunk_off u64, chunk_len u32, root_off u32, reloc_first u64,
# reloc_count u32, zero u32, checksum u64.
CHUNK_REC = 40
_SUM_AT = 248
_HEADER_KEY = 0x50594344534844        # "PYCDSHD"
_NAME_KEY = 0x50594344534e4d          # "PYCDSNM"

# How the module's code reached the dump run (what plain import used).
PYC_NONE, PYC_TIMESTAMP, PYC_CHECKED_HASH, PYC_UNCHECKED_HASH = 0, 1, 2, 3


def _u(b, off, size):
    return int.from_bytes(b[off:off + size], "little")


def checksum(data, key):
    """64-bit SipHash-1-3 of ``data`` keyed with ``key`` (an int), as an int."""
    return int.from_bytes(_imp.source_hash(key & 0x7FFFFFFFFFFFFFFF, data), "little")


# The code of pycds's modules has this directory in co_filename (importlib
# sets it from the module's __file__, as for this one); importlib's own
# frames (frozen; 3.10-3.13, also under -X frozen_modules=off) these names.
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
_BOOTSTRAP_FILES = ("<frozen importlib._bootstrap>",
                    "<frozen importlib._bootstrap_external>")


# Raised by whatever code runs when the program's stack or memory runs out.
PROGRAM_STATE_ERRORS = (RecursionError, MemoryError)

# The native module's status codes (PYCDS_E_* in native/pycds_native.h;
# tests/native/test_archive.py checks them against the built module).
E_NOMEM = -1        # out of memory
E_UNSUPPORTED = -2  # an object no archive can hold
E_TOODEEP = -3      # constants nested too deep
E_TOOBIG = -4       # a module's objects exceed 4 GiB
E_IO = -5           # a read or map of the archive failed
E_CORRUPT = -6      # a checksum or bounds check failed
E_FOREIGN = -7      # made by another interpreter build
E_STATE = -8        # the module failed before, or is being loaded
E_ARG = -9          # an argument out of range
E_PYTHON = -10      # a Python C-API call failed

# Bound at import, as importlib binds posix.stat: a program that replaces
# os.stat (mock.patch) changes neither what plain import sees nor this.
_stat = os.stat


def import_native(search_path=None):
    """``pycds._nativeapi``, imported with pycds's own ``_cffi_backend``
    (the native module's, which imports it by name), and the program's view
    of ``_cffi_backend`` left as it was.

    Where the program has imported a ``_cffi_backend``, the native module
    uses that one.  Else pycds's is loaded from ``search_path`` (the search
    path as start-up left it, where pycds and its dependencies were found),
    not from what the program's ``sys.path`` names now -- a
    ``_cffi_backend`` beside its script, a vendored cffi put first -- and
    taken out of ``sys.modules`` again once the native module has it (the
    library stays loaded): the program's own ``import _cffi_backend`` is
    then plain import's.  (Left: a thread of the program importing
    ``_cffi_backend`` during those ~2 ms of the first archive hit gets
    pycds's: the native module's init imports it by name through
    ``sys.modules``.)  The module's import lock is held meanwhile, so that
    a thread's import of it already under way finishes first, and is the
    one used.  The program's audit hooks see the import
    (``_bootstrap._load`` raises the "import" event) and may refuse it.
    Raises ImportError where it cannot be loaded."""
    api = sys.modules.get(__package__ + "._nativeapi")
    if api is not None:
        return api
    import _frozen_importlib as _bootstrap
    with _bootstrap._ModuleLockManager("_cffi_backend"):
        if "_cffi_backend" in sys.modules:
            from . import _nativeapi
            return _nativeapi
        spec = None
        if search_path:
            spec = _bootstrap_external.PathFinder.find_spec("_cffi_backend",
                                                            list(search_path))
        if spec is not None:
            ours = _bootstrap._load(spec)
        else:
            import _cffi_backend as ours
        try:
            from . import _nativeapi
        finally:
            if sys.modules.get("_cffi_backend") is ours:
                del sys.modules["_cffi_backend"]
    return _nativeapi


def program_raised(e):
    """Whether ``e``, caught around pycds's own work in an import (an index
    lookup, a ``stat``, a read, a native load or release), is the program's
    rather than a fault of the archive or of pycds: so it must propagate,
    as it would out of plain import's code, and the archive stays in use.

    - ``RecursionError`` and ``MemoryError``: the state of the program (its
      stack depth, its memory), met by whatever code runs at that moment.
    - An exception whose innermost frame is not pycds's: Python code of the
      program ran inside pycds's and raised, as a signal handler does (it
      runs in the main thread between two bytecodes of whatever code is
      running, importlib's or pycds's alike, and a system call it
      interrupts raises what the handler raised, PEP 475: a ``SIGALRM``
      timeout's ``TimeoutError`` out of ``os.stat``), or a trace function.
      pycds's own failures (a ``pread`` of a damaged file, a checksum, the
      native module's errors, a bug) have a frame of pycds innermost, or of
      importlib when loading the native module fails.

    (Not applied while the native module loads: what the program raises
    there, say its audit hook refusing ``_cffi_backend``, is a reason
    not to use the archive; ``pycds.finder._Archive.load_code``.)"""
    if isinstance(e, PROGRAM_STATE_ERRORS):
        return True
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return not (filename.startswith(_PACKAGE_DIR) or filename in _BOOTSTRAP_FILES)


def stat_or_none(path):
    """``os.stat(path)`` (as bound at import), or None where it fails; what
    the program raised meanwhile (:func:`program_raised`) propagates."""
    try:
        return _stat(path)
    except (OSError, ValueError) as e:
        if program_raised(e):
            raise
        return None


def source_hash(data):
    """The PEP 552 source hash of ``data`` (as importlib.util.source_hash)."""
    return _imp.source_hash(_RAW_MAGIC_NUMBER, data)


def pyc_source_checked(checked):
    """Whether plain import compares the source's hash with a hash-based
    .pyc's, given the .pyc's check_source flag ``checked``: checked pycs
    under ``_imp.check_hash_based_pycs`` "default", every one under
    "always", none under "never" (SourceLoader.get_code in
    importlib/_bootstrap_external.py, 3.10-3.13)."""
    policy = _imp.check_hash_based_pycs
    return policy == "always" or (policy == "default" and bool(checked))


# What plain import does with a .pyc for its source (classify_pyc).
PYC_VALID, PYC_UNCHECKED, PYC_INVALID = range(3)


def classify_pyc(head, st, src_hash):
    """What plain import does with the ``.pyc`` whose first 16 bytes are
    ``head`` (None: no .pyc, or unreadable) for the source of stat ``st``
    and hash ``src_hash`` (:func:`source_hash`; None where not known), as
    SourceLoader.get_code does (_classify_pyc, _validate_timestamp_pyc,
    _validate_hash_pyc in importlib/_bootstrap_external.py, 3.10-3.13):
    :data:`PYC_VALID` it runs the .pyc, whose header is valid for the source
    (a timestamp .pyc of its mtime in seconds and size, a checked hash-based
    one of its hash); :data:`PYC_UNCHECKED` it runs a hash-based .pyc it
    does not check against the source, whatever the source holds;
    :data:`PYC_INVALID` it compiles the source (a checked hash-based .pyc
    with ``src_hash`` None is taken for one)."""
    if head is None or len(head) < 16 or head[:4] != _bootstrap_external.MAGIC_NUMBER:
        return PYC_INVALID
    flags = int.from_bytes(head[4:8], "little")
    if flags & ~0b11:
        return PYC_INVALID
    if flags & 0b1:
        if not pyc_source_checked(flags & 0b10):
            return PYC_UNCHECKED
        return PYC_VALID if src_hash is not None and head[8:16] == src_hash else PYC_INVALID
    if (int.from_bytes(head[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
            or int.from_bytes(head[12:16], "little") != st.st_size & 0xFFFFFFFF):
        return PYC_INVALID
    return PYC_VALID


def _loader_parts():
    # What SourceLoader.get_code (importlib/_bootstrap_external.py,
    # 3.10-3.13) makes a module's code with, as a program may replace them:
    # the methods it calls on the loader, the function that unmarshals a
    # .pyc.  (Module-level helpers it calls besides are internal details no
    # import hook replaces.)
    cls = SourceFileLoader
    return (cls.get_code, cls.source_to_code, cls.get_data, cls.path_stats,
            _bootstrap_external._compile_bytecode)


# As they were when pycds started (this module is imported from the .pth
# line, before the program runs; by pycds._dump when called).
_STOCK_LOADER = _loader_parts()


def loader_patched():
    """Whether the program has replaced a part of the stock
    ``SourceFileLoader`` that plain import's ``get_code`` uses (a
    ``source_to_code`` that rewrites code, say): code made or archived then
    is not what the stock loader makes, so pycds neither archives nor serves
    it."""
    return _loader_parts() != _STOCK_LOADER


def name_hash(name):
    """Bucket hash of a module name (independent of PYTHONHASHSEED)."""
    return checksum(name.encode("utf-8", "surrogatepass"), _NAME_KEY)


def meta_for_this_interpreter():
    """The interpreter facts an archive must match, checkable without the
    native module.  The native layout id (image build and object layout) is
    added by the writer and checked by the native loader."""
    return {
        "version": sys.version,
        "hexversion": sys.hexversion,
        "cache_tag": sys.implementation.cache_tag,
        "optimize": sys.flags.optimize,
        "byteorder": sys.byteorder,
        "debug_ranges": debug_ranges(),
    }


# The environment variable in which the first SHARE process of a process
# tree names its interpreter facts (interpreter_tag) for the processes it
# starts, which inherit its archive through PYCDSARCHIVE.
SHARE_SESSION_VAR = "PYCDS_SHARE_SESSION"

_tag = None


def interpreter_tag():
    """16 hex digits naming this process's interpreter facts (what an
    archive's meta block must match: :func:`meta_for_this_interpreter`), as
    they were at the first call (start-up in DUMP and SHARE runs).  A child
    process whose tag is not its DUMP session's does not write over the
    session's archive (pycds.dump); one whose tag is not its SHARE
    session's takes an archive made for another interpreter quietly
    (pycds.finder.install)."""
    global _tag
    if _tag is None:
        facts = repr(sorted(meta_for_this_interpreter().items()))
        _tag = "%016x" % checksum(facts.encode("utf-8", "surrogatepass"), 0)
    return _tag


_debug_ranges = None


def debug_ranges():
    """Whether code objects made in this process keep column positions
    (3.11+): ``-X no_debug_ranges`` and ``PYTHONNODEBUGRANGES`` (set and
    not empty, unless ``-E``) make ``_PyCode_New`` drop them, so that plain
    import's code, its tracebacks and ``co_positions()`` have none.  The
    rule is the configuration's own (``config_read_complex_options`` in
    Python/initconfig.c, 3.11-3.13), applied once, at the first call (at
    start-up in SHARE and DUMP runs, before the program can change its
    environment): reading it off a code object would need ``__code__`` or a
    frame, which audit hooks see (``object.__getattr__``) and a sandbox may
    refuse.  A DUMP records what its code objects have
    (:func:`code_debug_ranges`)."""
    global _debug_ranges
    if _debug_ranges is None:
        if sys.version_info < (3, 11):
            _debug_ranges = True     # line numbers only, nothing to drop
        elif "no_debug_ranges" in sys._xoptions:
            _debug_ranges = False
        else:
            _debug_ranges = bool(sys.flags.ignore_environment
                                 or not os.environ.get("PYTHONNODEBUGRANGES"))
    return _debug_ranges


def code_debug_ranges(code):
    """Whether ``code`` has column positions (every code object made with
    them has some: even an empty module's RESUME is at column 0)."""
    positions = getattr(code, "co_positions", None)
    return positions is None or any(p[2] is not None for p in positions())


class FormatError(Exception):
    """Raised by the reader with a one-line reason (turned into a warning)."""


class ForeignArchive(FormatError):
    """A sound archive made for another interpreter: another Python version
    or build, another ``-O`` or ``-X no_debug_ranges``, another pycds
    archive format."""


class Header:
    """The parsed 256-byte header."""

    __slots__ = tuple(name for name, _, _ in _FIELDS)

    @classmethod
    def parse(cls, b, file_len, check_version=True):
        if len(b) < HEADER_SIZE:
            raise FormatError(f"file is {len(b)} bytes, shorter than a header")
        if b[:8] != MAGIC:
            raise FormatError("not a pycds archive (bad magic)")
        h = cls()
        for name, off, size in _FIELDS[1:]:
            setattr(h, name, _u(b, off, size))
        h.magic = b[:8]
        if h.format != FORMAT_VERSION:
            raise ForeignArchive(f"archive format {h.format}, this pycds reads "
                                 f"format {FORMAT_VERSION}")
        # Checked before the checksum: _imp.source_hash is SipHash-2-4 on
        # 3.10 and SipHash-1-3 from 3.11 on, so another version's header
        # could not even be verified; say which version made it instead.
        if check_version and h.py_hexversion >> 16 != sys.hexversion >> 16:
            raise ForeignArchive(
                f"made by Python {h.py_hexversion >> 24}.{h.py_hexversion >> 16 & 0xFF}, "
                f"this is Python {sys.version_info[0]}.{sys.version_info[1]}")
        if _u(b, _SUM_AT, 8) != checksum(b[:_SUM_AT], _HEADER_KEY):
            if (h.py_hexversion >= 0x030B0000) != (sys.hexversion >= 0x030B0000):
                # Not damage: the other side of the SipHash change (above).
                raise ForeignArchive(
                    f"made by Python {h.py_hexversion >> 24}.{h.py_hexversion >> 16 & 0xFF}, "
                    f"whose checksums this Python {sys.version_info[0]}."
                    f"{sys.version_info[1]} cannot verify; read it with that version")
            raise FormatError("header checksum mismatch")
        if h.file_len != file_len:
            raise FormatError(f"file is {file_len} bytes, header says {h.file_len} "
                              f"(truncated or appended to)")
        for off, length in ((h.meta_off, h.meta_len),
                            (h.buckets_off, h.nbuckets * 8),
                            (h.entries_off, h.entries_len),
                            (h.chunks_off, h.nmodules * CHUNK_REC),
                            (h.heap_off, h.heap_len),
                            (h.reloc_off, h.reloc_count * 4)):
            if off < HEADER_SIZE or off + length > file_len:
                raise FormatError("section outside the file")
        # (The writer makes at least 8 and twice the modules: a lookup
        # always ends at an empty bucket.)
        if h.nbuckets < 1 or h.nbuckets & (h.nbuckets - 1) or h.nbuckets < h.nmodules:
            raise FormatError("bad bucket table size")
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


class Index:
    """Read side of an archive: header checked, lookups by module name.

    ``Index.open(path)`` raises :class:`FormatError` with the reason when the
    archive cannot be used; it never reads more than the header, the meta
    block and the bucket table.
    """

    def __init__(self, path, fd, header, meta, buckets, foreign=None, file_id=None):
        self.path = path
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
        the program's way (native/descriptor.c; :meth:`adopt`).  Raises
        :class:`FormatError` (:class:`ForeignArchive`)."""
        try:
            # O_NONBLOCK: opening a FIFO (or a device) put at the archive
            # path must not block start-up; it is refused as not a regular
            # file just below.  No effect on regular files.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise FormatError(e.strerror or str(e)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError("not a regular file")
            if check_owner:
                check_trusted(st, path)
            h = Header.parse(os.pread(fd, HEADER_SIZE, 0), st.st_size,
                             check_version=check_interpreter)
            meta_b = os.pread(fd, h.meta_len, h.meta_off)
            if checksum(meta_b, h.archive_id) != h.meta_sum:
                raise FormatError("meta checksum mismatch")
            meta = marshal.loads(meta_b)
            if type(meta) is not dict:
                raise FormatError("meta block is not a dict")
            here = meta_for_this_interpreter()
            foreign = None
            for key, value in here.items():
                if key not in meta:
                    foreign = (f"made by an older pycds (its meta has no {key}); "
                               f"dump again")
                elif meta[key] != value:
                    foreign = (f"made by another interpreter ({key} "
                               f"{meta[key]!r}, this is {value!r})")
                if foreign is not None:
                    if check_interpreter:
                        raise ForeignArchive(foreign)
                    break
            buckets = os.pread(fd, h.nbuckets * 8, h.buckets_off)
            if len(buckets) != h.nbuckets * 8 or \
                    checksum(buckets, h.archive_id) != h.buckets_sum:
                raise FormatError("bucket table checksum mismatch")
            if out_of_the_way:
                os.close(fd)
                fd = -1
            return cls(path, fd, h, meta, buckets, foreign, (st.st_dev, st.st_ino))
        except FormatError:
            os.close(fd)
            raise
        except (OSError, ValueError, EOFError, TypeError) as e:
            os.close(fd)
            raise FormatError(f"unreadable ({e})") from None

    def lookup(self, name):
        """Return the :class:`ModuleEntry` for ``name``, or None."""
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
                entry = self._read_entry(off)
                if entry is None:
                    raise FormatError("index entry fails its checksum (archive "
                                      "corrupt, or replaced while in use)")
                if entry.name == name:
                    return entry
            i = (i + 1) & self._mask
        return None

    def _read_entry(self, off):
        h = self.header
        if off + 12 > h.entries_len:
            return None
        # One pread covers most entries (a few hundred bytes); a longer
        # entry gets a second read for the rest.
        fd = self.fd if self.fd >= 0 else self.descriptor()
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
                raise FormatError(f"bad index entry at {off}")
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
        except FormatError:
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
            raise FormatError(f"no chunk-table record for module {number}")
        import struct      # not at start-up: only verify reads records
        # native byte order (pycds/_writer.py, chunk_table)
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
        as at start-up.  Raises :class:`FormatError`, or OSError where the
        file cannot be opened."""
        if self.fd >= 0:
            return self.fd
        if not self._reopen:
            raise FormatError("archive closed")
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


# Symbolic links followed before giving up (the kernel's limit, MAXSYMLINKS).
_MAX_LINKS = 40


def _check_directory(path):
    """Refuse an archive that others could replace: one reached through a
    directory writable by others without the sticky bit (as /tmp has) --
    any directory name resolution passes through, from ``/`` down, including
    those holding the symbolic links on the way, whose links others could
    change.  One ``lstat`` a path component."""
    def check(d, mode):
        if mode & 0o002 and not mode & 0o1000:
            raise FormatError(f"its directory {d} is writable by others "
                              f"(mode {mode & 0o7777:o}, no sticky bit)")

    def lstat(p):
        try:
            return os.lstat(p)
        except OSError as e:
            raise FormatError(f"cannot stat {p} ({e.strerror})") from None

    cur = os.sep
    check(cur, lstat(cur).st_mode)
    parts = os.path.abspath(path).split(os.sep)[1:]
    links = 0
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur)     # cur has no links: its real parent
            continue
        nxt = os.path.join(cur, name)
        st = lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise FormatError(f"too many symbolic links in {path}")
            try:
                target = os.readlink(nxt)
            except OSError as e:
                raise FormatError(f"cannot read the link {nxt} ({e.strerror})") from None
            if target.startswith(os.sep):
                cur = os.sep
            parts[:0] = target.split(os.sep)
        elif parts:
            check(nxt, st.st_mode)     # a directory on the way
            cur = nxt


def check_trusted(st, path):
    """Raise :class:`FormatError` for an archive at ``path`` (of stat ``st``)
    that others could have written or could replace: what SHARE refuses."""
    _check_owner(st)
    _check_directory(path)


def _check_owner(st):
    """Archives are code: refuse one that others could have written."""
    if st.st_mode & 0o022:
        raise FormatError(f"writable by group or others (mode {st.st_mode & 0o777:o})")
    uid = os.getuid()
    if st.st_uid != uid and st.st_uid != 0:
        raise FormatError(f"owned by uid {st.st_uid}, not by this user ({uid}) or root")
