"""pycds's exceptions, native status codes and failure policy.

Exceptions raised by pycds, the native module's status codes, and the
failure policy: what a failure met in pycds's work means.

All exceptions derive from :class:`ImportError`, as
:class:`zipimport.ZipImportError` does: they describe why an import could not
be served from an archive.  The import hook never lets them escape into a
program: it warns and falls back to plain import.  Imported by SHARE runs
when they open the archive: builtins and pycds._config only.
"""

from ._config import is_main_interpreter, runs_importlib, runs_pycds

__all__ = ["PycdsError", "ArchiveFormatError", "ForeignArchiveError", "NativeError",
           "program_raised", "load_failure", "native_refused_here",
           "PROPAGATE", "FALLBACK", "DISABLE"]


class PycdsError(ImportError):
    """Base class of pycds errors."""


class ArchiveFormatError(PycdsError):
    """The file is not a usable pycds archive.

    Bad magic, truncated, checksum mismatch, refused for its owner or mode;
    the message is a one-line reason, turned into a warning."""


class ForeignArchiveError(ArchiveFormatError):
    """A sound archive made for another interpreter.

    Another Python version or build, another ``-O`` or
    ``-X no_debug_ranges``, another pycds archive format."""


class NativeError(PycdsError):
    """The native module returned an error status.

    ``code`` is one of the ``E_*`` values below."""

    def __init__(self, message, code=0, **kwargs):
        super().__init__(message, **kwargs)
        self.code = code


# The native module's status codes, mirrored from enum PYCDS_E_* in
# native/archive/pycds_native.h (tests/native/test_archive.py checks them).
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


# ---- the failure policy ----------------------------------------------------
# A failure met in pycds's own work during an import means one of three
# things, decided here, by exception type and status code (never by a
# message's text), and applied by pycds.share:
#   PROPAGATE  the program's (program_raised): raised on, as out of plain
#              import's own code; the archive stays in use.
#   FALLBACK   this module is imported plainly (a fallback line under
#              PYCDSVERBOSE); the archive stays in use.
#   DISABLE    the archive is not used again in this process (one warning);
#              modules already served stay.
PROPAGATE, FALLBACK, DISABLE = "propagate", "fallback", "disable"

# Raised by whatever code runs when the program's stack or memory runs out.
PROGRAM_STATE_ERRORS = (RecursionError, MemoryError)

# Native statuses that concern this process or this module, not the file:
# the module failed before or is being loaded (E_STATE), memory ran out or
# a C-API call failed (E_NOMEM, E_PYTHON).
_FALLBACK_CODES = frozenset((E_STATE, E_NOMEM, E_PYTHON))


def program_raised(e):
    """Return whether e, caught in pycds's work, is the program's own.

    Whether ``e``, caught around pycds's own work in an import (an index
    lookup, a ``stat``, a read, a native load or release), is the program's
    (PROPAGATE) rather than a fault of the archive or of pycds.

    - ``RecursionError`` and ``MemoryError``: the state of the program (its
      stack depth, its memory), met by whatever code runs at that moment.
    - An exception whose innermost frame runs neither pycds's code nor
      importlib's (:func:`pycds._config.runs_pycds`, by namespace
      identity): Python code of the program ran inside pycds's and raised,
      as a signal handler does (PEP 475: a ``SIGALRM`` timeout's
      ``TimeoutError`` out of ``os.stat``), or a trace function.  pycds's
      own failures have a frame of pycds innermost, or of importlib when
      loading the native module fails.

    Not applied while the native module loads: what the program raises
    there (its audit hook refusing ``_cffi_backend``) is a reason not to use
    the archive (``pycds.share._Archive.load_code``)."""
    if isinstance(e, PROGRAM_STATE_ERRORS):
        return True
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    return not (runs_pycds(frame) or runs_importlib(frame))


def load_failure(e):
    """Return FALLBACK or DISABLE: what a native load failing with e means.

    FALLBACK or DISABLE: what a native load of one module failing with
    ``e`` (not the program's: :func:`program_raised`) means.  FALLBACK for
    a status of this process or module (E_STATE, E_NOMEM, E_PYTHON);
    DISABLE for the file's (E_CORRUPT, E_IO, E_ARG: damaged or replaced) and
    for anything else (a malformed entry)."""
    if isinstance(e, NativeError) and e.code in _FALLBACK_CODES:
        return FALLBACK
    return DISABLE


def native_refused_here(e):
    """Return whether e is this interpreter refusing the native module.

    Whether ``e``, raised by loading the native module, is this
    interpreter refusing it as it should: a subinterpreter (3.12+ refuses
    single-phase modules such as cffi's there), whose imports are plain
    ones (no fault, no warning)."""
    return isinstance(e, ImportError) and not is_main_interpreter()
