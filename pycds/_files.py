"""Writing an archive file atomically (its bytes laid out by pycds._archive).

The file is written to an unnamed temporary file (``O_TMPFILE``) in the
target's directory, linked under a temporary name and renamed over the
target, so a reader sees the old archive or the new one, never a torn one,
and a writer killed mid-write leaves nothing behind (the unnamed file
vanishes with its descriptor).  Where ``O_TMPFILE`` is unavailable a named
temporary file is used, and stale ones of dead writers are swept up by the
next dump.

The file's blocks are allocated (``fallocate``) before it is written: on
ext4 a rename over an existing file otherwise allocates and starts writing
back the new file's delayed blocks inside ``rename`` (native/archive/writer/file.c).

Nothing is fsync()ed, as CPython does not sync the ``.pyc`` files it
writes (``_write_atomic`` in importlib._bootstrap_external): an archive is
a cache whose every part is checksummed with keys unique to that archive,
so what a power loss can leave behind -- no file, an empty or partly
written one -- is refused at its next use (one warning, plain import) and
replaced by the next dump.
"""

import errno
import os
import stat
import sys
import time

_TMP_MARK = ".pycds-tmp."


def write_atomic(path, chunks, kind, length=None, xattrs=None):
    """Write chunks as path's whole content, atomically; raise OSError.

    Write ``chunks`` (a list of ``(offset, bytes-like)``) as the whole
    content of ``path``, atomically, over a file there only if
    :func:`check_replaceable` for ``kind`` allows it (checked again
    just before the rename); ``length``: the file's size in bytes (zeros
    after the last chunk: an archive without modules ends in an empty
    heap); ``xattrs``: extended attributes (name to bytes) to give the
    file, where its file system takes them.  Returns whether every one of
    ``xattrs`` was set.  Raises OSError on failure, leaving ``path`` as it
    was."""
    check_replaceable(path, kind)
    path = os.path.abspath(path)
    d, base = os.path.split(path)
    make_directory(d)
    sweep_stale(d, base)
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
            tmp = os.path.join(d, f"{_tmp_prefix(base)}{os.getpid()}.{time.monotonic_ns()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        # Blocks allocated up front (the size stays what the writes make it):
        # the rename over the old archive below then has no delayed
        # allocation to flush (native/archive/writer/file.c).
        from ._nativewriter import preallocate
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
        tagged = True
        for name, value in (xattrs or {}).items():
            try:
                os.setxattr(fd, name, value)
            except (OSError, AttributeError):   # not supported there (or here)
                tagged = False
        if unnamed:
            # linkat(AT_SYMLINK_FOLLOW) gives the unnamed file a name; os.link
            # uses linkat (not link) only when a dir_fd is passed.
            name = f"{_tmp_prefix(base)}{os.getpid()}.{time.monotonic_ns()}"
            dfd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _retry(os.link, f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
            tmp = os.path.join(d, name)
        check_replaceable(path, kind)  # (what the writing took may have let in)
        _retry(os.replace, tmp, path)
        tmp = None
        return tagged
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _retry(call, *args, **kwargs):
    """Return call(*args, **kwargs), calling again after EINTR.

    ``call(*args, **kwargs)``, again after EINTR: os.link and os.replace
    raise InterruptedError where a file system (NFS, FUSE) lets a signal
    interrupt them; PEP 475 retries only the calls that often block."""
    while True:
        try:
            return call(*args, **kwargs)
        except InterruptedError:
            continue


def make_directory(d):
    """Make directory d and its missing parents; raise OSError.

    Make directory ``d`` and its missing parents, each with mode 0755 less
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


class NotReplaceable(FileExistsError):
    """A file is at a dump's path, and it is not pycds's to replace.

    The path is one a dump would write; see :func:`check_replaceable`."""


# Bytes of a file's head given to a kind's judge.
HEAD = 4096


def check_replaceable(path, kind):
    """Raise NotReplaceable unless a dump may put a file of kind at path.

    Raise :class:`NotReplaceable` unless a dump may put a new file of
    ``kind`` at ``path``: nothing is there, or a regular file of this user
    that is one of pycds's own files of that kind, or an empty one named as
    they are.  ``kind``: ``(name, suffix, judge)``, as
    pycds._archive.ARCHIVE_FILE: what the file is called ("archive"), the
    suffix of an empty file taken for a place left for one (``.img``: an
    empty file of any other name may be a program's, still being written),
    and ``judge(head, size)``, "" for a file of ``size`` bytes whose first
    :data:`HEAD` bytes are ``head`` that is one, else why it is not.
    Anything else is the user's: a source file, the running script, a file
    of another user, a directory (also a path ending in a separator, as
    ``open()`` takes it), a FIFO, a device, a symbolic link (a rename would
    replace the link, not the file it names).  The message names the file
    and ends in "left as it is"."""
    if path.endswith(os.sep):
        raise NotReplaceable(f"{path} names a directory, not a regular file: "
                             "left as it is")
    # (Another dump may rename its archive into place while this one looks:
    # then it looks again.)
    for _ in range(_LOOKS):
        try:
            return _check_replaceable(path, kind)
        except _Replaced as e:
            replaced = str(e)
    raise NotReplaceable(replaced)


# The paths a run that writes at exit (DUMP, TRACE) found taken at its
# start, and said so (say_if_taken).
_said = set()


def say_if_taken(path, kind, what, var):
    """Warn at start-up if the run may not replace what is at path.

    At the start of a run that writes ``path`` at exit: one warning (for
    the process tree: pycds._log) when what is there is not a file of
    ``kind`` it may replace (:func:`check_replaceable`); the exit's
    :func:`say_not_written` then says nothing more.  ``what``: the run's
    words ("DUMP writes no archive"); ``var``: the variable naming the
    path."""
    try:
        check_replaceable(path, kind)
    except NotReplaceable as e:
        _said.add(path)
        from . import _log
        _log.warning(f"{what}: {e}; set {var} to a path of its own")
    except OSError:
        pass        # (the write at exit says what it meets)


def say_not_written(path, error, what, var):
    """Say at exit that error kept the write from path, once.

    At exit: ``error`` (a :class:`NotReplaceable`) kept the write from
    ``path``: one warning, or a verbose line where :func:`say_if_taken`
    said it at start-up."""
    from . import _log
    msg = f"{what}: {error}; set {var} to a path of its own"
    if path in _said:
        _log.verbose(msg, 1)
    else:
        _log.warning(msg)


# Times check_replaceable looks at a path that keeps being replaced.
_LOOKS = 5


class _Replaced(NotReplaceable):
    pass


def _check_replaceable(path, kind):
    name, suffix, judge = kind
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise NotReplaceable(f"{path} is a symbolic link, not a regular file: left as it "
                             f"is (name the file itself: {os.path.realpath(path)})")
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
        raise NotReplaceable(f"{path} is {what}, not a regular file: left as it is")
    if st.st_uid != os.geteuid():
        raise NotReplaceable(f"{path} belongs to another user (uid {st.st_uid}): "
                             "left as it is")
    if st.st_size == 0:
        if path.endswith(suffix):
            return
        raise NotReplaceable(f"{path} is an empty file, not a pycds {name}: left as it is "
                             f"(remove it for pycds to write there)")
    why = why_not_ours(path, judge, st)
    if why == _REPLACED:
        raise _Replaced(f"{path} {why}: left as it is")
    if why:
        raise NotReplaceable(f"{path} {why}: left as it is")


_REPLACED = "was replaced while it was looked at"


def why_not_ours(path, judge, st=None):
    """Return "" if path is a file judge takes for pycds's, else why not.

    "" when ``path`` is a regular file (not a symbolic link) that
    ``judge`` (as in :func:`check_replaceable`) takes for pycds's, else why
    not; ``st``: its lstat() if taken, and the file must still be that
    one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _REPLACED if st is not None else "cannot be read (it is gone)"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):
            return "is not a regular file"
        if st is not None and (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return _REPLACED
        return judge(os.pread(fd, HEAD, 0), now.st_size)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    finally:
        os.close(fd)


# Bytes of a file name (NAME_MAX on Linux file systems), and what a
# temporary name adds to its prefix: ".<pid>.<monotonic ns>".
_NAME_MAX = 255
_TMP_SUFFIX_MAX = 1 + 7 + 1 + 20


def _tmp_prefix(base):
    """Return the prefix of the temporary names for the archive base.

    The prefix of the temporary names for the archive named ``base``:
    ``.<base>.pycds-tmp.``, with ``base`` cut short and a hash of it added
    where the whole name would pass NAME_MAX (an archive name of about 215
    to 255 bytes is valid; its temporary name must be too)."""
    prefix = f".{base}{_TMP_MARK}"
    raw = os.fsencode(prefix)
    if len(raw) + _TMP_SUFFIX_MAX <= _NAME_MAX:
        return prefix
    import _imp
    b = os.fsencode(base)
    digest = _imp.source_hash(0x5059434453, b).hex()
    keep = _NAME_MAX - _TMP_SUFFIX_MAX - len(_TMP_MARK) - 2 - len(digest)
    # (A cut inside a multibyte character leaves bytes that fsdecode keeps.)
    return f".{os.fsdecode(b[:keep])}~{digest}{_TMP_MARK}"


def sweep_stale(d, base):
    """Remove named temporary files of dumps whose process is gone."""
    prefix = _tmp_prefix(base)
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


# Seconds a writer waits for the archive's directory lock before giving up
# (OSError: no archive written).  Writers hold it for one archive write (tens
# of ms); a lock that outlasts this is not a writer's: the program, or the
# parent it inherited the descriptor from (`flock DIR cmd`), locked the
# directory, and a blocking wait would hang the program's exit for good.
LOCK_WAIT_S = 10.0


_fcntl_module = None


def fcntl_module():
    """Return the stdlib's fcntl, out of sys.modules; raise ImportError.

    The standard library's ``fcntl``, loaded from its own directory and
    kept out of ``sys.modules``: ``import fcntl`` at exit would run a
    ``fcntl.py`` beside the program's script (plain Python never imports
    fcntl), and one imported at start-up would be what the program's own
    ``import fcntl`` gets instead of its file.  Raises ImportError."""
    global _fcntl_module
    if _fcntl_module is None:
        if "fcntl" in sys.builtin_module_names:
            import fcntl      # (builtins come before any file on the search)
            _fcntl_module = fcntl
        else:
            from _frozen_importlib import module_from_spec
            from _frozen_importlib_external import PathFinder
            where = [os.path.join(os.path.dirname(os.__file__), "lib-dynload")]
            where += [p for p in sys.path if type(p) is str and p.endswith("lib-dynload")]
            spec = PathFinder.find_spec("fcntl", where)
            if spec is None:
                raise ImportError(f"no fcntl module in {where[0]}", name="fcntl")
            module = module_from_spec(spec)
            spec.loader.exec_module(module)
            _fcntl_module = module
    return _fcntl_module


class directory_lock:
    """Hold flock() on the archive's directory; raise OSError on timeout.

    flock() on the archive's directory: writers of one directory take
    turns between reading the old archive and renaming the new one.
    Raises OSError when the lock stays taken for LOCK_WAIT_S."""

    def __init__(self, path):
        self.dir = os.path.dirname(os.path.abspath(path))
        self.fd = -1

    def __enter__(self):
        fcntl = fcntl_module()
        make_directory(self.dir)
        try:
            self.fd = os.open(self.dir, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return self   # no locking here (say, a directory we may not read)
        deadline = time.monotonic() + LOCK_WAIT_S
        pause = 0.001
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = -1
                    raise OSError(f"its directory {self.dir} stayed locked (flock) "
                                  f"for {LOCK_WAIT_S:.0f} s by another process "
                                  "or descriptor") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except OSError:
                return self   # no flock here (a file system without it)

    def __exit__(self, *exc):
        if self.fd >= 0:
            # Unlocked first: a process forked meanwhile (by the program,
            # while the settle watcher writes) shares this descriptor's
            # lock, which close() alone would leave held until it exits.
            fcntl = fcntl_module()
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(self.fd)
