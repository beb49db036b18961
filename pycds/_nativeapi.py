"""The only importer of ``pycds._native``: argument passing and error checks.

Objects go to C as ``id(obj)`` (their address on CPython) while Python holds
them; C appends results to a list passed the same way.  Every status code
goes through :func:`_check`, which raises :class:`pycds.errors.NativeError`
with the C side's message.  The loader's side (what SHARE imports); the
writer's calls are in pycds._nativewriter.
"""

from . import __version__
from .errors import E_CORRUPT, NativeError

try:
    from ._native import ffi, lib
except ImportError as e:
    if "subinterpreter" in str(e):
        raise     # 3.12+ refuses cffi modules there; the finder expects this one
    import os as _os
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(_os.path.dirname(_here), "setup.py")):
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


def _check(rc, what):
    if rc != 0:
        reason = ffi.string(lib.pycds_strerror(rc)).decode()
        detail = ffi.string(lib.pycds_last_error()).decode("utf-8", "replace")
        raise NativeError(f"{what}: {reason}: {detail}", code=rc)


def hash64(data, seed=0):
    """XXH64 of a bytes-like object with a 64-bit seed, as an int."""
    return lib.pycds_hash64(ffi.from_buffer(data), len(data), seed)


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
        """Return the code object of ``entry`` (its ``number`` and ``name``:
        a pycds._archive.ModuleEntry, or the finder's _ChunkRef).
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
        """After ``entry``'s module body ran: give back the memory of its
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

    def close(self):
        """Release the handle (refused once a module was loaded)."""
        _check(lib.pycds_archive_close(self._a), "close")
        self._a = ffi.NULL


class IndexFinder:
    """The finder's archive hit in C (native/archive/loader/find.c): the
    index lookup of a name and the stats its checks take, as facts for
    pycds._search and pycds._pyc to judge.  ``index`` is an open
    pycds._archive.Index reading through descriptor ``fd``; ``files``:
    stat the source and .pyc too (not for PYCDSCHECK=unchecked).
    ``serving``: None, or ``(finder, PathFinder, search, loader)`` for
    :meth:`hit` to also require, before its verdict, what
    ``pycds.finder.CDSFinder.find_spec`` requires of the import system
    (``finder`` just before ``PathFinder`` on ``sys.meta_path``,
    ``pycds._STOCK_SEARCH``; ``pycds._STOCK_LOADER_ATTRS`` and
    ``pycds._STOCK_SEARCH_FUNCS`` in ``loader``); its True
    verdicts then come with the entry alone."""

    def __init__(self, index, fd, files=True, serving=None):
        h = index.header
        self._buckets = ffi.from_buffer(index._buckets)   # kept alive here
        self._ix = ffi.new("pycds_index *", {
            "fd": fd, "entries_off": h.entries_off, "entries_len": h.entries_len,
            "buckets": self._buckets, "nbuckets": h.nbuckets, "key": h.archive_id})
        self._flags = lib.PYCDS_FIND_FILES if files else 0
        self._find = lib.pycds_index_find
        self._hit = lib.pycds_index_hit
        from _frozen_importlib_external import FileFinder
        from . import FILE_LOADERS
        from ._archive import PYC_TIMESTAMP
        # (Kept alive here; the attribute names interned, as constants are.)
        self.serving = serving is not None
        self._ctx = (FileFinder, FILE_LOADERS, PYC_TIMESTAMP, "_loaders", "path", False,
                     serving)
        self._ctx_stock_hooks = self._ctx[:5] + (True, serving)

    def find(self, name):
        """``[entry tuple, stamps of the search's steps, package directory's
        stamp, source facts, .pyc facts]`` (pycds_native.h), None if
        ``name`` is not in the archive, False where C declined (read the
        index with Index.lookup)."""
        out = []
        if self._find(self._ix, id(name), self._flags, id(out)):
            return False
        return out or None


    def hit(self, name, path, stock_hooks=False):
        """:meth:`find`'s list and a sixth item, the native verdict
        (native/archive/loader/find.c, pycds_index_hit): True when plain
        import, searching ``path`` (a list, or None for ``sys.path``), would
        take the archived module as the dump recorded it (PYCDSCHECK=mtime
        rules).  Where a step's path entry has no finder in
        ``sys.path_importer_cache`` yet, PathFinder would run the path hooks
        there: False, unless ``stock_hooks`` says they are importlib's own
        (:func:`pycds.path_hooks_stock`), which make a FileFinder of that
        directory.  With ``serving``, a True verdict is ``[entry tuple,
        True]``.  None, False: as :meth:`find`."""
        out = []
        ctx = self._ctx_stock_hooks if stock_hooks else self._ctx
        if self._hit(self._ix, id(name), id(path), id(ctx), id(out)):
            return False
        return out or None


def keyed_hash(key, data):
    """pycds_keyed_hash: ``_imp.source_hash(key, data)`` as an int."""
    return lib.pycds_keyed_hash(key, ffi.from_buffer(data), len(data))
