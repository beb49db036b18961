"""What a warning about an archive that cannot be used tells the user to do.

Imported only when such a warning is given: a run whose archive is usable
never pays for it.  The state of the file decides the advice, not the
error's wording: nothing there, something there that is not a pycds archive
(never written over: pycds._writer.check_replaceable), an archive of
another interpreter, one SHARE refuses for who could have written it, a
damaged one.
"""

import os

from . import _archive, _trust, _writer
from .errors import ArchiveFormatError, ForeignArchiveError

__all__ = ["next_step", "writable"]


def writable(path):
    """Why a dump may not write at ``path`` ("" if it may):
    pycds._writer.check_replaceable's message."""
    try:
        _writer.check_replaceable(path, _archive.MAGIC)
    except OSError as e:
        return str(e)
    return ""


def next_step(path, error, auto):
    """The clause that follows ``archive <path> ignored: <error>`` (SHARE,
    or AUTO when ``auto``): what to do so that the next run uses an
    archive, and for AUTO what it does itself."""
    if not os.path.lexists(path) and not path.endswith(os.sep):
        return ("none has been written there yet: run the program once with "
                "PYCDSMODE=DUMP, or use PYCDSMODE=AUTO, which writes it at exit")
    taken = writable(path)
    if taken:
        if os.path.isdir(path):
            where = f"the path of a file, such as {os.path.join(path, 'app.img')}"
        else:
            where = "a path of its own"
        if auto:
            return f"AUTO writes no archive over it (pycds replaces only its own): " \
                   f"set PYCDSARCHIVE to {where}"
        return f"it is not a pycds archive: set PYCDSARCHIVE to {where}"
    if auto:
        return "AUTO writes a fresh one at exit"
    if isinstance(error, ForeignArchiveError):
        return ("write it again with this interpreter (PYCDSMODE=DUMP), or use "
                "PYCDSMODE=AUTO, which replaces an archive that does not fit")
    try:
        _trust.check_trusted(os.stat(path), path)
    except (ArchiveFormatError, OSError):
        return ("SHARE runs only an archive no other user could have written or "
                "replaced: chmod go-w it and keep it where only you can write")
    return ("write it again (PYCDSMODE=DUMP), or use PYCDSMODE=AUTO, which replaces "
            "a damaged archive")
