"""Trust checks: whether an archive file may be run as code.

Archives are code: SHARE refuses one that others could have written (its
mode, its owner) or could replace (a directory on the way that others may
write without the sticky bit), as ssh refuses a loose private key.  DUMP
warns when it writes an archive to such a place.
"""

import os
import stat

from .errors import ArchiveFormatError

__all__ = ["check_trusted"]

# Symbolic links followed before giving up (the kernel's limit, MAXSYMLINKS).
_MAX_LINKS = 40


def check_trusted(st, path):
    """Raise :class:`ArchiveFormatError` for an archive at ``path`` (of stat
    ``st``) that others could have written or could replace: what SHARE
    refuses."""
    _check_owner(st)
    _check_directory(path)


def _check_owner(st):
    if st.st_mode & 0o022:
        raise ArchiveFormatError(f"writable by group or others (mode {st.st_mode & 0o777:o})")
    uid = os.getuid()
    if st.st_uid != uid and st.st_uid != 0:
        raise ArchiveFormatError(f"owned by uid {st.st_uid}, not by this user ({uid}) or root")


def _check_directory(path):
    """Refuse an archive reached through a directory writable by others
    without the sticky bit (as /tmp has) -- any directory name resolution
    passes through, from ``/`` down, including those holding the symbolic
    links on the way, whose links others could change.  One ``lstat`` a
    path component."""
    def check(d, mode):
        if mode & 0o002 and not mode & 0o1000:
            raise ArchiveFormatError(f"its directory {d} is writable by others "
                                     f"(mode {mode & 0o7777:o}, no sticky bit)")

    def lstat(p):
        try:
            return os.lstat(p)
        except OSError as e:
            raise ArchiveFormatError(f"cannot stat {p} ({e.strerror})") from None

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
                raise ArchiveFormatError(f"too many symbolic links in {path}")
            try:
                target = os.readlink(nxt)
            except OSError as e:
                raise ArchiveFormatError(
                    f"cannot read the link {nxt} ({e.strerror})") from None
            if target.startswith(os.sep):
                cur = os.sep
            parts[:0] = target.split(os.sep)
        elif parts:
            check(nxt, st.st_mode)     # a directory on the way
            cur = nxt
