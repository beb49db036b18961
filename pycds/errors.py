"""Exceptions raised by pycds, the native module's status codes, and which
exceptions are the program's rather than pycds's.

All exceptions derive from :class:`ImportError`, as
:class:`zipimport.ZipImportError` does: they describe why an import could not
be served from an archive.  The import hook never lets them escape into a
program: it warns and falls back to plain import.  Imported by SHARE runs
when they open the archive: builtins only.
"""

import os

from . import BOOTSTRAP_FILES

__all__ = ["PycdsError", "ArchiveFormatError", "ForeignArchiveError", "NativeError",
           "program_raised"]


class PycdsError(ImportError):
    """Base class of pycds errors."""


class ArchiveFormatError(PycdsError):
    """The file is not a usable pycds archive (bad magic, truncated, checksum
    mismatch, refused for its owner or mode); the message is a one-line
    reason, turned into a warning."""


class ForeignArchiveError(ArchiveFormatError):
    """A sound archive made for another interpreter: another Python version
    or build, another ``-O`` or ``-X no_debug_ranges``, another pycds
    archive format."""


class NativeError(PycdsError):
    """The native module returned an error status; ``code`` is one of the
    ``E_*`` values below."""

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


# Raised by whatever code runs when the program's stack or memory runs out.
PROGRAM_STATE_ERRORS = (RecursionError, MemoryError)

# The code of pycds's modules has this directory in co_filename (importlib
# sets it from the module's __file__); importlib's own frames have
# BOOTSTRAP_FILES.
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep


def program_raised(e):
    """Whether ``e``, caught around pycds's own work in an import (an index
    lookup, a ``stat``, a read, a native load or release), is the program's
    rather than a fault of the archive or of pycds: so it must propagate,
    as it would out of plain import's code, and the archive stays in use.

    - ``RecursionError`` and ``MemoryError``: the state of the program (its
      stack depth, its memory), met by whatever code runs at that moment.
    - An exception whose innermost frame is not pycds's or importlib's:
      Python code of the program ran inside pycds's and raised, as a signal
      handler does (PEP 475: a ``SIGALRM`` timeout's ``TimeoutError`` out of
      ``os.stat``), or a trace function.  pycds's own failures have a frame
      of pycds innermost, or of importlib when loading the native module
      fails.

    Not applied while the native module loads: what the program raises
    there (its audit hook refusing ``_cffi_backend``) is a reason not to use
    the archive (``pycds.finder._Archive.load_code``)."""
    if isinstance(e, PROGRAM_STATE_ERRORS):
        return True
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return not (filename.startswith(_PACKAGE_DIR) or filename in BOOTSTRAP_FILES)
