"""The archive writer's side of pycds._native, for DUMP and pycds.dumping.

The archive writer's side of ``pycds._native`` (native/archive/writer):
what DUMP and :func:`pycds.dump` use, apart from the loader's side
(pycds._nativeapi) that SHARE imports.  Argument passing and error checks
as there.
"""

from ._nativeapi import _check, ffi, hash64, lib

__all__ = ["layout_id", "version_counter_at", "preallocate", "frozenset_items", "Chunk", "Writer", "Renumbering",
           "hash64"]


def layout_id():
    """Text identifying this interpreter build's static-object layout."""
    buf = ffi.new("char[]", 512)
    _check(lib.pycds_layout_id(buf, 512), "layout id")
    return ffi.string(buf).decode()


def version_counter_at():
    """Return the offset of CPython 3.12's code version counter, or None.

    The offset from the image anchor of CPython 3.12's private code
    version counter (native/archive/pycds_native.h,
    pycds_layout_version_counter_at), for the loader to draw from it
    directly; None where there is none to find (other versions, a stripped
    libpython) or it cannot be checked."""
    out = ffi.new("int64_t *")
    return out[0] if lib.pycds_layout_version_counter_at(out) == 0 else None


def preallocate(fd, length):
    """Allocate the first length bytes of new file fd; raise OSError.

    Allocate the first ``length`` bytes of the new file ``fd`` before it
    is written, so that renaming it over an old archive does not flush it
    (native/archive/writer/file.c); the file's size does not change.  Does nothing where
    the file system cannot.  Raises OSError (ENOSPC, EBADF, ...)."""
    err = ffi.new("int *")
    rc = lib.pycds_preallocate(fd, length, err)
    if rc:
        if err[0]:
            import os
            raise OSError(err[0], f"cannot allocate {length} bytes for the archive: "
                                  f"{os.strerror(err[0])}")
        _check(rc, "preallocate")


def frozenset_items(fs):
    """Return frozenset fs's items in unmarshal order; raise NativeError.

    The items of frozenset ``fs`` in the order unmarshal adds them, as
    a list: the order ``marshal`` writes them in (3.11+: sorted by their
    own marshalled bytes), inferred from their reference counts, so right
    for a frozenset that only a freshly unmarshalled code object holds
    (native/archive/common/layout.c).  Raises NativeError."""
    out = []
    _check(lib.pycds_frozenset_items(id(fs), id(out)), "frozenset items")
    return out


class Chunk:
    """What the writer reports for one module (see pycds_chunk_info)."""

    __slots__ = ("chunk_off", "chunk_len", "root_off", "reloc_first",
                 "reloc_count", "checksum", "nobjects")


class Writer:
    """Deep-copy code objects into an archive heap.

    The C side: native/archive/writer/writer.c."""

    def __init__(self, seed):
        out = ffi.new("pycds_writer **")
        _check(lib.pycds_writer_new(seed, out), "writer")
        self._w = ffi.gc(out[0], lib.pycds_writer_free)
        self._info = ffi.new("pycds_chunk_info *")

    def add(self, code, ran=False, orders=None):
        """Copy code and what it reaches; return a Chunk or raise NativeError.

        Copy ``code`` and all it reaches; return a :class:`Chunk`.  The
        bytecode is copied in the form a fresh unmarshal gives, whether or
        not the code has run.  ``ran``: ``code`` is the code object the
        import executed; a function code object in it (or in its class
        bodies) that nothing but its ``co_consts`` holds is predicted dead
        and laid out with the module code, where the loader can give it
        back (native/archive/writer/writer.c).  ``orders``: a dict from
        ``id()`` of a frozenset in ``code`` to the tuple of its items in the
        order unmarshal adds them (:func:`frozenset_items` of a fresh copy),
        for those it gives.  Raises NativeError (the heap is left as before)
        on failure."""
        _check(lib.pycds_writer_add(self._w, id(code), bool(ran),
                                    id(orders) if orders is not None else 0,
                                    self._info),
               "copy")
        c = Chunk()
        for name in Chunk.__slots__:
            setattr(c, name, getattr(self._info, name))
        return c

    def heap(self):
        """A read-only view of the heap (valid until the next add())."""
        p = ffi.new("uint8_t **")
        n = ffi.new("size_t *")
        _check(lib.pycds_writer_heap(self._w, p, n), "heap")
        return ffi.buffer(p[0], n[0]) if n[0] else b""

    def relocs(self):
        """The relocation entries as bytes (uint32 little-endian each)."""
        p = ffi.new("uint32_t **")
        n = ffi.new("size_t *")
        _check(lib.pycds_writer_relocs(self._w, p, n), "relocs")
        return ffi.buffer(p[0], 4 * n[0]) if n[0] else b""

    def nstrings(self):
        """Return how many interned strings the chunks so far number.

        How many interned strings the chunks written so far number (their
        INTERN slots hold numbers below it)."""
        n = ffi.new("uint32_t *")
        _check(lib.pycds_writer_nstrings(self._w, n), "nstrings")
        return n[0]


class Renumbering:
    """Renumber the strings of chunks carried over from another archive.

    Gives the chunks carried over from another archive (pycds.dumping.dumper) string
    numbers after ``first`` (those of the archive being written): one number
    per number of the other archive, whose numbers are below ``bound`` (its
    relocation count)."""

    def __init__(self, first, bound):
        self._map = ffi.new("uint32_t[]", max(bound, 1))
        self._len = bound
        self._next = ffi.new("uint32_t *", first)

    def apply(self, chunk, relocs):
        """Renumber chunk's INTERN slots as relocs say; raise NativeError.

        Renumber the INTERN slots of ``chunk`` (a bytearray, changed in
        place) as its relocation entries ``relocs`` (bytes) say.  Raises
        NativeError (E_CORRUPT) for a slot or number out of range."""
        _check(lib.pycds_strings_renumber(ffi.from_buffer(chunk), len(chunk),
                                          ffi.from_buffer("uint32_t[]", relocs),
                                          len(relocs) // 4, self._map, self._len,
                                          self._next), "renumber")
