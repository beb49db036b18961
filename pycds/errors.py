"""Exceptions raised by pycds.

All derive from :class:`ImportError`, as :class:`zipimport.ZipImportError`
does, because they describe why an import could not be served from an
archive.  The import hook never lets them escape into a program: it warns and
falls back to plain import.
"""

__all__ = ["PycdsError", "ArchiveFormatError", "NativeError"]


class PycdsError(ImportError):
    """Base class of pycds errors."""


class ArchiveFormatError(PycdsError):
    """The archive file is not a valid pycds archive for this interpreter
    (bad magic, truncated, checksum mismatch, other Python version).
    """


class NativeError(PycdsError):
    """The native archiver returned an error code.

    ``code`` is the negative ``PYCDS_E_*`` value from ``native/pycds_native.h``.
    """

    def __init__(self, message, code=0, **kwargs):
        super().__init__(message, **kwargs)
        self.code = code
