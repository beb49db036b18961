"""Assembling an archive file and writing it atomically.

The file is written to an unnamed temporary file (``O_TMPFILE``) in the
target's directory, linked under a temporary name and renamed over the
target, so a reader sees the old archive or the new one, never a torn one,
and a writer killed mid-write leaves nothing behind (the unnamed file
vanishes with its descriptor).  Where ``O_TMPFILE`` is unavailable a named
temporary file is used, and stale ones of dead writers are swept up by the
next dump.

The file's blocks are allocated (``fallocate``) before it is written: on
ext4 a rename over an existing file otherwise allocates and starts writing
back the new file's delayed blocks inside ``rename`` (native/file.c).

Nothing is fsync()ed, as CPython does not sync the ``.pyc`` files it
writes (``_write_atomic`` in importlib._bootstrap_external): an archive is
a cache whose every part is checksummed with keys unique to that archive,
so what a power loss can leave behind -- no file, an empty or partly
written one -- is refused at its next use (one warning, plain import) and
replaced by the next dump.  The two syncs (file, directory) cost 2 to 12 ms
here, most of the extra time of a DUMP run of a small program.
"""

import errno
import marshal
import os
import stat
import sys
import time

from . import _format as F

_TMP_MARK = ".pycds-tmp."
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
        # struct.pack("=QIIQIIQ", ...): native byte order, the C loader
        # reads the records as structs (struct itself is not imported: the
        # dump of a small program pays ~0.3 ms for it)
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
    meta_b = marshal.dumps(meta)
    blobs = []
    offsets = []
    pos = 0
    for e in entries:
        payload = marshal.dumps(e.to_tuple())
        rec = (len(payload) + 12).to_bytes(4, "little") + \
            F.checksum(payload, archive_id).to_bytes(8, "little") + payload
        offsets.append(pos)
        blobs.append(rec)
        pos += len(rec)
    entries_b = b"".join(blobs)
    buckets = bytearray(b"\xff" * (nbuckets * 8))
    mask = nbuckets - 1
    for e, off in zip(entries, offsets):
        h = F.name_hash(e.name)
        i = h & mask
        while buckets[i * 8 + 4:i * 8 + 8] != b"\xff\xff\xff\xff":
            i = (i + 1) & mask
        buckets[i * 8:i * 8 + 4] = (h >> 32).to_bytes(4, "little")
        buckets[i * 8 + 4:i * 8 + 8] = off.to_bytes(4, "little")
    buckets = bytes(buckets)

    h = F.Header()
    h.magic = F.MAGIC
    h.format = F.FORMAT_VERSION
    h.header_size = F.HEADER_SIZE
    h.archive_id = archive_id
    h.created_ns = time.time_ns()
    h.nmodules = n
    h.flags = flags
    h.py_hexversion = sys.hexversion
    h.meta_off = F.HEADER_SIZE
    h.meta_len = len(meta_b)
    h.buckets_off = _align(h.meta_off + h.meta_len, 8)
    h.nbuckets = nbuckets
    h.entries_off = h.buckets_off + len(buckets)
    h.entries_len = len(entries_b)
    table, h.chunks_sum = chunk_table(entries, archive_id, strict)
    h.chunks_off = _align(h.entries_off + h.entries_len, 8)
    h.heap_off = _align(h.chunks_off + len(table), F.PAGE)
    h.heap_len = heap_len
    h.reloc_off = _align(h.heap_off + heap_len, 8)
    h.reloc_count = reloc_count
    h.file_len = h.reloc_off + 4 * reloc_count
    h.meta_sum = F.checksum(meta_b, archive_id)
    h.buckets_sum = F.checksum(buckets, archive_id)
    parts = [(h.meta_off, meta_b), (h.buckets_off, buckets),
             (h.entries_off, entries_b), (h.chunks_off, table)]
    return h, parts


def _align(x, a):
    return (x + a - 1) // a * a


def write_atomic(path, chunks, length=None):
    """Write ``chunks`` (a list of ``(offset, bytes-like)``) as the whole
    content of ``path``, atomically; ``length``: the file's size in bytes
    (zeros after the last chunk: an archive without modules ends in an
    empty heap).  Raises OSError on failure, leaving ``path`` as it was,
    and when ``path`` is there but not a regular file (check_replaceable)."""
    check_replaceable(path)
    path = os.path.abspath(path)
    d, base = os.path.split(path)
    make_directory(d)
    _sweep_stale(d, base)
    tmp = None
    fd = None
    unnamed = hasattr(os, "O_TMPFILE")
    try:
        if unnamed:
            try:
                fd = os.open(d, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            except OSError:
                unnamed = False
        if not unnamed:
            tmp = os.path.join(d, f".{base}{_TMP_MARK}{os.getpid()}.{time.monotonic_ns()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        # Blocks allocated up front (the size stays what the writes make it):
        # the rename over the old archive below then has no delayed
        # allocation to flush (native/file.c: 5.5 vs 1.3 ms for 6 MiB, ext4).
        from ._nativeapi import preallocate
        preallocate(fd, max([off + memoryview(data).nbytes for off, data in chunks]
                            + [length or 0]))
        for off, data in chunks:
            view = memoryview(data).cast("B")
            while view:
                n = os.pwrite(fd, view, off)
                view = view[n:]
                off += n
        if length is not None:
            os.ftruncate(fd, length)
        os.fchmod(fd, 0o644)
        if unnamed:
            # linkat(AT_SYMLINK_FOLLOW) gives the unnamed file a name; os.link
            # uses linkat (not link) only when a dir_fd is passed.
            name = f".{base}{_TMP_MARK}{os.getpid()}.{time.monotonic_ns()}"
            dfd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
            tmp = os.path.join(d, name)
        os.replace(tmp, path)
        tmp = None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def make_directory(d):
    """Make directory ``d`` and its missing parents, each with mode 0755 less
    the umask (``os.makedirs`` gives the parents 0777 less the umask: under
    ``umask 000`` directories a SHARE run then refuses, being writable by
    others, docs/reliability.md); "Not a directory" where a part of ``d`` is
    a file.  Raises OSError."""
    missing = []
    head = os.path.abspath(d)
    while not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not os.path.isdir(path):     # (made meanwhile by another process: fine)
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                         path) from None


def check_replaceable(path):
    """Raise OSError unless ``path`` is absent or a regular file.  A new file
    renamed over it would replace whatever is there: ``/dev/null`` (as root),
    a FIFO, a symbolic link (not the file it names); and a path ending in a
    separator names a directory, as ``open()`` takes it."""
    if path.endswith(os.sep):
        raise IsADirectoryError(errno.EISDIR, "the path names a directory", path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                "a directory" if stat.S_ISDIR(st.st_mode) else
                "a device, FIFO or socket")
        raise OSError(f"{path} is {kind}, not a regular file: left as it is")


def _sweep_stale(d, base):
    """Remove named temporary files of dumps whose process is gone."""
    prefix = f".{base}{_TMP_MARK}"
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix):].split(".", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
