"""Say why an archive cannot be used, and what the user should do next.

What a warning about an archive that cannot be used says, and what it
tells the user to do next.

Imported only when such a warning is given: a run whose archive is usable
never pays for it.  The state of the file decides, not the error's wording:
nothing there, something there that is not a pycds archive (never written
over: pycds._files.check_replaceable), an archive of another user, of
another interpreter, one SHARE refuses for who could have written it, a
damaged one.
"""

import os

from . import _archive, _files
from .errors import PROGRAM_STATE_ERRORS, ArchiveFormatError, ForeignArchiveError

__all__ = ["refusal", "not_replaceable", "directory_refusal"]


def _untrusted(path, file=True):
    # pycds._nativeapi.check_trusted's reason, or "" (also where the native
    # module cannot be loaded -- not built, or its import refused by an
    # audit hook of the program's: the failure policy's "reason not to use
    # the archive" -- then no archive is used anyway).
    try:
        from ._nativeapi import check_trusted
    except PROGRAM_STATE_ERRORS:
        raise
    except Exception:
        return ""
    try:
        check_trusted(path, file)
    except (ArchiveFormatError, OSError) as e:
        return str(e)
    return ""


def directory_refusal(path):
    """Return why runs refuse an archive at path for where it lies, or "".

    Why every run would refuse an archive at ``path`` for where it lies
    (a directory on the way that others may write:
    pycds._nativeapi.check_trusted), "" where nothing there stands in the
    way."""
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)      # (a dump makes the missing ones, mode 0755)
    why = _untrusted(d, file=False)     # (the directories above d)
    if why:
        return why
    try:
        mode = os.stat(d).st_mode
    except OSError as e:
        return str(e)
    if mode & 0o002 and not mode & 0o1000:
        return f"its directory {d} is writable by others (mode {mode & 0o7777:o}, no sticky bit)"
    return ""


def not_replaceable(path):
    """Return why a dump may not write over what is at path, or "".

    Why a dump may not write over what is at ``path`` ("" where it may,
    or where nothing is there): pycds._files.check_replaceable's
    message.  Other failures (a path through a file, a name too long) are
    the write's to report."""
    try:
        _files.check_replaceable(path, _archive.ARCHIVE_FILE)
    except _files.NotReplaceable as e:
        return str(e)
    except OSError:
        pass
    return ""


def refusal(path, error, auto):
    """Return the warning's text for the archive at path that did not open.

    The warning's text after ``archive <path> ignored: `` for the
    archive at ``path`` that could not be opened with ``error`` (SHARE, or
    AUTO when ``auto``): why, then what to do so that the next run uses an
    archive, and for AUTO what it does itself."""
    reason = str(error) if error is not None else "damaged"
    if not os.path.lexists(path) and not path.endswith(os.sep):
        above = os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            return (f"{reason}; {above} is a file, not a directory: set PYCDSARCHIVE to a "
                    "path in a directory")
        return (f"{reason}; none has been written there yet: run the program once with "
                "PYCDSMODE=DUMP, or use PYCDSMODE=AUTO, which writes it at exit")
    taken = not_replaceable(path)
    if taken and os.path.isfile(path) and not os.path.islink(path):
        # (What the file is, rather than how reading it as an archive failed.)
        why = _files.why_not_ours(path, _archive.why_not_archive)
        if why:
            reason = "it " + why
    if taken:
        if os.path.isdir(path):
            where = f"the path of a file, such as {os.path.join(path, 'app.img')}"
        else:
            where = "a path of its own"
        if auto:
            return (f"{reason}; AUTO writes no archive over it (pycds replaces only its "
                    f"own files): set PYCDSARCHIVE to {where}")
        return f"{reason}; set PYCDSARCHIVE to {where}"
    if auto:
        if directory_refusal(path):
            return (f"{reason}; AUTO writes no archive there (no run would use it): "
                    "make the directory writable only by you (chmod o-w), or set "
                    "PYCDSARCHIVE to a path in one that is")
        return f"{reason}; AUTO writes a fresh one at exit"
    if isinstance(error, ForeignArchiveError):
        return (f"{reason}; write it again with this interpreter and pycds "
                "(PYCDSMODE=DUMP), or use PYCDSMODE=AUTO, which replaces an archive "
                "that does not fit")
    if _untrusted(path):
        return (f"{reason}; SHARE runs only an archive no other user could have "
                "written or replaced: chmod go-w it and keep it where only you can write")
    return (f"{reason}; write it again (PYCDSMODE=DUMP), or use PYCDSMODE=AUTO, which "
            "replaces a damaged archive")
