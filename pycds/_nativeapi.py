"""The only importer of ``pycds._native``: argument passing and error checks.

Objects go to C as ``id(obj)`` (their address on CPython) while Python holds
them; C appends results to a list passed the same way.  Every status code
goes through :func:`_check`, which raises :class:`pycds.errors.NativeError`
with the C side's message.  The loader's side (what SHARE imports); the
writer's calls are in pycds._nativewriter.
"""

import marshal
import os

from ._config import __version__, is_main_interpreter, meta_for_this_interpreter
from .errors import (E_CORRUPT, E_FOREIGN, E_NOMEM, ArchiveFormatError, ForeignArchiveError,
                     NativeError)

try:
    from ._native import ffi, lib
except ImportError as e:
    if not is_main_interpreter():
        raise     # 3.12+ refuses cffi modules there; the finder expects this one
    _here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(os.path.dirname(_here), "setup.py")):
        why = (f"the pycds imported is the source checkout {_here}, not the installed "
               f"one: the working directory comes first on sys.path. Run from another "
               f"directory (cd ..), or build the native module in place with "
               f"'python native/archive/build.py'")
    else:
        why = f"its native module is not built for this interpreter in {_here} ({e}); " \
              f"reinstall pycds"
    raise ImportError(f"pycds cannot run: {why}", name="pycds._native") from e

if ffi.string(lib.pycds_build_version()).decode() != __version__:
    raise ImportError(
        f"pycds._native was built for pycds "
        f"{ffi.string(lib.pycds_build_version()).decode()}, but the package is "
        f"{__version__}; reinstall pycds", name="pycds._native")


def error(rc, what):
    """Return the NativeError of status rc of the call that just failed.

    The NativeError of status ``rc`` (PYCDS_E_*) of the native call that
    just failed on this thread, its message ``what: reason: detail``."""
    reason = ffi.string(lib.pycds_strerror(rc)).decode()
    detail = ffi.string(lib.pycds_last_error()).decode("utf-8", "replace")
    return NativeError(f"{what}: {reason}: {detail}", code=rc)


def _check(rc, what):
    if rc != 0:
        raise error(rc, what)


def hash64(data, seed=0):
    """XXH64 of a bytes-like object with a 64-bit seed, as an int."""
    return lib.pycds_hash64(ffi.from_buffer(data), len(data), seed)


def _refused(rc):
    # The reader's refusal (native/archive/loader/open.c) as the exception a
    # reader of archives raises.
    detail = ffi.string(lib.pycds_last_error()).decode("utf-8", "replace")
    if rc == E_FOREIGN:
        return ForeignArchiveError(detail)
    if rc == E_NOMEM:
        return MemoryError(detail)
    return ArchiveFormatError(detail)


# Bytes of meta block and bucket table together beyond any a writer makes
# (the meta is a few hundred bytes and the program's argv; the table 16 to
# 32 bytes a module): a reader short of memory for more blames the file.
_PART_BYTES = 256 << 20


def _c_path(path):
    # A path as the C side takes it (os.open's rules: str, bytes, PathLike).
    b = os.fsencode(path)
    if b"\0" in b:
        raise ArchiveFormatError("unreadable (embedded null byte)")
    return b


def check_trusted(path, file=True):
    """Raise ArchiveFormatError if others could write path's archive.

    Raise :class:`ArchiveFormatError` for an archive at ``path`` that
    others could have written or could replace, what SHARE refuses: a
    directory on the way writable by others without the sticky bit; with
    ``file``, a file writable by group or others or owned by another user
    (native/archive/loader/open.c, pycds_trust_check).  As ssh refuses a
    loose private key."""
    rc = lib.pycds_trust_check(_c_path(path), lib.PYCDS_TRUST_FILE if file else 0)
    if rc:
        raise _refused(rc)


class ArchiveFile:
    """An archive file opened and checked by the native reader.

The reader is native/archive/loader/open.c.  Attributes: ``header``
(the fields of pycds._archive.Header), ``meta`` (the meta block, a
dict), ``buckets`` (the bucket table, bytes), ``mtime`` (when it was
written, s) and ``fd``, the descriptor to read the rest through (-1
while none is held).

    Raises :class:`ArchiveFormatError` (:class:`ForeignArchiveError` for an
    archive of another format, Python version or interpreter build; the
    latter only with ``check_interpreter``, else ``foreign`` says why).
    ``check_owner``: refuse what :func:`check_trusted` refuses.  With
    ``out_of_the_way`` (SHARE) no descriptor is held once these are read
    (with ``hold`` too, until :meth:`let_go`): the first :meth:`descriptor`
    opens the file again, and a native handle then takes it out of the
    program's way (:meth:`adopt`; native/archive/loader/descriptor.c)."""

    def __init__(self, path, check_owner=True, check_interpreter=True, out_of_the_way=False,
                 hold=False):
        flags = (lib.PYCDS_OPEN_OWNER if check_owner else 0) | \
            (lib.PYCDS_OPEN_VERSION if check_interpreter else 0) | \
            (lib.PYCDS_OPEN_CLOSE if out_of_the_way and not hold else 0)
        o = ffi.new("pycds_opened *")
        rc = lib.pycds_archive_read_index(_c_path(path), flags, o)
        if rc == E_NOMEM and o.meta_len + o.nbuckets * 8 > _PART_BYTES:
            # The meta block and bucket table are as long as the header says
            # (up to the file's length), which no writer makes this long:
            # the memory this process could not give them is the file's
            # fault, a reason not to use it (one warning, plain import), not
            # the program's state (MemoryError, which SHARE lets through and
            # meets again at each import).
            raise ArchiveFormatError("unreadable (" + ffi.string(
                lib.pycds_last_error()).decode("utf-8", "replace") + ")")
        if rc:
            raise _refused(rc)
        try:
            meta_b = ffi.buffer(o.meta, o.meta_len)[:]
            self.buckets = ffi.buffer(o.buckets, o.nbuckets * 8)[:]
        finally:
            lib.pycds_opened_free(o)
        try:
            try:
                meta = marshal.loads(meta_b)
            except (ValueError, EOFError, TypeError) as e:
                raise ArchiveFormatError(f"unreadable ({e})") from None
            if type(meta) is not dict:
                raise ArchiveFormatError("meta block is not a dict")
            self.foreign = None     # why this interpreter may not use it
            for key, value in meta_for_this_interpreter().items():
                if key not in meta:
                    self.foreign = f"made by an older pycds (its meta has no {key})"
                elif meta[key] != value:
                    self.foreign = (f"made by another interpreter ({key} "
                                    f"{meta[key]!r}, this is {value!r})")
                if self.foreign is not None:
                    if check_interpreter:
                        raise ForeignArchiveError(self.foreign)
                    break
        except BaseException:
            if o.fd >= 0:
                os.close(o.fd)
            raise
        self.path = path
        self.header = o
        self.meta = meta
        self.mtime = o.mtime_ns / 1e9
        self.fd = o.fd
        self._file_id = (o.st_dev, o.st_ino)
        self._owned = True          # self.fd is ours to close (see adopt)
        self._reopen = o.fd < 0     # the first descriptor() opens the file again

    def let_go(self):
        """Close the descriptor an ``out_of_the_way`` file was opened holding.

        The first :meth:`descriptor` opens the file again."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._reopen = True

    def descriptor(self):
        """Return the descriptor to read through; raise ArchiveFormatError.

        The descriptor to read through; the first call of a file opened
        ``out_of_the_way`` opens it again, with the native reader (no
        "open" audit event for the program's hooks, which plain import
        does not raise either).  Where the path names another archive by
        then (a dump renamed a new archive over it, or one was copied over
        it in place; nothing was read from this one yet), that archive is
        taken, checked as at first (its
        header, meta and buckets replace these); one that others could
        have written since the opening is refused.  Raises
        :class:`ArchiveFormatError`."""
        if self.fd >= 0:
            return self.fd
        if not self._reopen:
            raise ArchiveFormatError("archive closed")
        self._reopen = False
        o = ffi.new("pycds_opened *")
        # (Its trust checked again: made writable by others since the
        # opening, it may hold anything by now.)
        if lib.pycds_archive_read_index(_c_path(self.path), lib.PYCDS_OPEN_OWNER, o) == 0:
            lib.pycds_opened_free(o)
            # (The same file, still the archive read at the opening: not
            # one copied over it in place since.)
            if (o.st_dev, o.st_ino) == self._file_id \
                    and o.archive_id == self.header.archive_id \
                    and o.file_len == self.header.file_len:
                self.fd, self._owned = o.fd, True
                return o.fd
            os.close(o.fd)
        # Another file, or this one no longer readable as it was: what the
        # path names now is checked as at first (or refused, with why).
        vars(self).update(vars(ArchiveFile(self.path)))
        return self.fd

    def adopt(self, fd):
        """Read through ``fd``, a descriptor on the same file, from now on.

        Its owner (the native handle) closes it; this one's own is closed."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        self._owned = False

    def fd_lost(self):
        """Return whether the descriptor no longer refers to the file.

        Whether the descriptor no longer refers to the file opened: the
        program closed it (daemonizing code closes every descriptor), and
        maybe opened another file under its number.  A read failing then
        says nothing about the archive.  Never raises."""
        if self.fd < 0:
            return False          # none held yet (or closed by pycds)
        try:
            st = os.fstat(self.fd)
        except (OSError, ValueError):
            return True
        return (st.st_dev, st.st_ino) != self._file_id

    def close(self):
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class NativeArchive:
    """A reserved archive heap from which modules are loaded once each.

    ``version_counter``: the offset of CPython 3.12's code version counter
    the archive records (pycds._nativewriter.version_counter_at), drawn
    from directly where it checks out (``self.version_counter``)."""

    def __init__(self, fd, header, layout, verify=False, prefetch=0, release=1,
                 version_counter=None):
        out = ffi.new("pycds_archive **")
        layout_id = ffi.new("char[]", layout.encode())   # alive for the call
        h = ffi.new("pycds_archive_header *", {
            "heap_off": header.heap_off, "heap_len": header.heap_len,
            "reloc_off": header.reloc_off, "reloc_count": header.reloc_count,
            "chunks_off": header.chunks_off, "chunks_sum": header.chunks_sum,
            "nmodules": header.nmodules, "seed": header.archive_id,
            "layout_id": layout_id})
        _check(lib.pycds_archive_open(fd, h, out), "open")
        self._a = out[0]
        # (3.12: where the archive names the code version counter and it is
        # there, versions are drawn from it; otherwise as before.)
        self.version_counter = type(version_counter) is int and \
            -(1 << 63) <= version_counter < 1 << 63 and \
            lib.pycds_layout_use_version_counter(version_counter) == 0
        _check(lib.pycds_archive_set_verify(self._a, bool(verify)), "verify")
        if prefetch:
            _check(lib.pycds_archive_set_prefetch(self._a, prefetch), "prefetch")
        if release != 1:
            _check(lib.pycds_archive_set_release(self._a, release), "release mode")
        self._released = ffi.new("uint64_t *")
        fd = ffi.new("int *")
        _check(lib.pycds_archive_fd(self._a, fd), "fd")
        self.fd = fd[0]    # the handle's own (it closes it)

    def load(self, entry):
        """Return the code object of entry; raise NativeError if it is corrupt.

        Return the code object of ``entry`` (its ``number`` and ``name``:
        a pycds._archive.ModuleEntry, or the finder's ArchivedCode).
        Raises NativeError if the chunk is corrupt or fails its fix-ups."""
        number = entry.number
        if type(number) is not int or not 0 <= number < 1 << 32:
            # (cffi would say "can't convert negative number to unsigned")
            raise NativeError(f"load {entry.name}: archive data is corrupt: module number "
                              f"{number!r} out of range", code=E_CORRUPT)
        out = []
        _check(lib.pycds_archive_load(self._a, number, id(out)), f"load {entry.name}")
        return out[0]

    def release(self, entry):
        """Give back entry's unused chunk memory; return the bytes freed.

        After ``entry``'s module body ran: give back the memory of its
        chunk's tail that nothing holds (native/archive/loader/release.c).  Returns the
        bytes given back; the module is then never handed out again (a
        later :meth:`load` raises NativeError, PYCDS_E_STATE)."""
        rc = lib.pycds_archive_release(self._a, entry.number, self._released)
        if rc:
            _check(rc, f"release {entry.name}")
        return self._released[0]

    def set_prefetch(self, window):
        """Read ahead ``window`` bytes of heap after each load (0: off)."""
        _check(lib.pycds_archive_set_prefetch(self._a, window), "prefetch")

    def prefetched(self):
        """Modules read and relocated ahead by the read-ahead thread."""
        n = ffi.new("uint64_t *")
        _check(lib.pycds_archive_prefetched(self._a, n), "prefetched")
        return n[0]

    def serve_with(self, server):
        """Let ``server`` (:func:`serve`) load modules through this handle."""
        _check(lib.pycds_serve_use(id(server), self._a), "serve")

    def close(self):
        """Release the handle (refused once a module was loaded)."""
        _check(lib.pycds_archive_close(self._a), "close")
        self._a = ffi.NULL


# Bytes of the entries section a lookup reads at once (the lookups that
# follow find their entries there).
ENTRY_WINDOW = 64 << 10


class IndexFinder:
    """The finder's archive hit in C: index lookups and the stats they take.

    The finder's archive hit in C (native/archive/loader/find.c): the
    index lookup of a name and the stats its checks take, as facts for
    pycds._search and pycds._pyc to judge.  ``index`` is an open
    :class:`ArchiveFile` (or a pycds._archive.Index), read through
    descriptor ``fd`` (-1: none yet; then ``open_file()`` is called where a
    name's tag is found, and should :meth:`use` a descriptor, or return
    False); ``files``: stat the source and .pyc too (not for
    PYCDSCHECK=unchecked).  ``serving``: None, or ``(finder, PathFinder,
    search, loader)`` for :meth:`hit` to also require, before its verdict,
    what ``pycds.share.CDSFinder.find_spec`` requires of the import system
    (``finder`` just before ``PathFinder`` on ``sys.meta_path``,
    ``pycds._config.STOCK_SEARCH``; ``pycds._config.STOCK_LOADER_ATTRS`` and
    ``pycds._config.STOCK_SEARCH_FUNCS`` in ``loader``); its True verdicts then
    come with the entry alone."""

    def __init__(self, index, fd, files=True, serving=None, open_file=None):
        self._file = index
        self._open_file = open_file
        self.use(fd)
        self._flags = lib.PYCDS_FIND_FILES if files else 0
        self._find = lib.pycds_index_find
        self._hit = lib.pycds_index_hit
        from _frozen_importlib_external import FileFinder
        from ._config import FILE_LOADERS
        # (Kept alive here; the attribute names interned, as constants are.)
        self.serving = serving is not None
        self._ctx = (FileFinder, FILE_LOADERS, lib.PYCDS_PYC_TIMESTAMP, "_loaders", "path",
                     False, serving)
        self._ctx_stock_hooks = self._ctx[:5] + (True, serving)

    def use(self, fd):
        """Read through descriptor fd, and the index as it is now.

        Read through descriptor ``fd`` from now on, the index as it is now
        (ArchiveFile.descriptor() may have taken another file's).  The
        struct is updated in place: a server (:func:`serve`) holds it."""
        h = self._file.header
        buckets = ffi.from_buffer(self._file.buckets)
        ix = getattr(self, "_ix", None)
        if ix is None:
            self._ix = ix = ffi.new("pycds_index *")
            self._window = ffi.new("uint8_t[]", ENTRY_WINDOW)    # kept alive here
            ix.window, ix.window_cap = self._window, ENTRY_WINDOW
        # (Another thread's lookup may run between these lines: with no
        # buckets and no descriptor it declines until the last two.)
        ix.nbuckets, ix.fd, ix.window_len = 0, -1, 0
        ix.entries_off, ix.entries_len, ix.key = h.entries_off, h.entries_len, h.archive_id
        ix.buckets = buckets
        self._buckets = buckets      # kept alive here
        ix.nbuckets = h.nbuckets
        ix.fd = fd

    def find(self, name):
        """Return name's entry and facts; None if absent, False if declined.

        ``[entry tuple, stamps of the search's steps, package directory's
        stamp, source facts, .pyc facts]`` (pycds_native.h), None if
        ``name`` is not in the archive, False where C declined (read the
        index with Index.lookup)."""
        out = []
        rc = self._find(self._ix, id(name), self._flags, id(out))
        if rc == lib.PYCDS_FIND_NO_FILE and self._open_file is not None and self._open_file():
            rc = self._find(self._ix, id(name), self._flags, id(out))
        return False if rc else out or None

    def holds(self, name):
        """Return whether the archive (likely) holds name.

        Whether the archive holds ``name``; before a descriptor is set,
        whether a bucket holds its tag (the likely answer: 32 bits of its
        hash), reading nothing."""
        out = []
        rc = self._find(self._ix, id(name), 0, id(out))
        return rc == lib.PYCDS_FIND_NO_FILE or (rc == 0 and bool(out))

    def hit(self, name, path, stock_hooks=False):
        """Return find()'s list plus the native verdict for name.

        :meth:`find`'s list and a sixth item, the native verdict
        (native/archive/loader/find.c, pycds_index_hit): True when plain
        import, searching ``path`` (a list, or None for ``sys.path``), would
        take the archived module as the dump recorded it (PYCDSCHECK=mtime
        rules).  Where a step's path entry has no finder in
        ``sys.path_importer_cache`` yet, PathFinder would run the path hooks
        there: False, unless ``stock_hooks`` says they are importlib's own
        (:func:`pycds._config.path_hooks_stock`), which make a FileFinder of that
        directory.  With ``serving``, a True verdict is ``[entry tuple,
        True]``.  None, False: as :meth:`find`."""
        out = []
        ctx = self._ctx_stock_hooks if stock_hooks else self._ctx
        rc = self._hit(self._ix, id(name), id(path), id(ctx), id(out))
        if rc == lib.PYCDS_FIND_NO_FILE and self._open_file is not None and self._open_file():
            rc = self._hit(self._ix, id(name), id(path), id(ctx), id(out))
        return False if rc else out or None


def serve(index, parts):
    """Return (server, ArchivedCode type) over index; raise NativeError.

    The served hit in C (native/archive/loader/serve.c) over ``index`` (an
    :class:`IndexFinder`), made of ``parts``, a dict of the Python objects
    and flags serve.c names (part_names, flag_names: all of them)."""
    out = []
    _check(lib.pycds_serve_new(id(parts), index._ix, id(out)), "serve")
    return out[0], out[1]


def keyed_hash(key, data):
    """pycds_keyed_hash: ``_imp.source_hash(key, data)`` as an int."""
    return lib.pycds_keyed_hash(key, ffi.from_buffer(data), len(data))
