"""The module code objects a DUMP run's imports executed, kept for the dump.

An audit hook (PEP 578) on the ``exec`` event sees the code object that
``_LoaderBasics.exec_module`` hands to ``exec`` (importlib/_bootstrap_external.py,
3.10-3.13: ``code = self.get_code(module.__name__)`` then
``_call_with_frames_removed(exec, code, module.__dict__)``): for the path
importer's ``SourceFileLoader`` that is exactly what plain import read from the
``.pyc`` or compiled from the source.  Archiving that object saves the dump at
exit a second read and unmarshal of every ``.pyc``, and says which of the
module's functions outlived its import: their code objects are held by more
than the ``co_consts`` tuple (native/writer.c, ``predicted_dead``).

The source's ``st_mtime_ns`` and size are taken when the body starts.  The
dump uses a capture only if the source still has them at exit and was last
modified more than :data:`SETTLED_NS` before the capture: an edit between
``get_code`` and that ``stat`` (microseconds) would give the file a newer
``mtime``, so a capture it could have spoiled is never used (the dump then
reads the ``.pyc`` again, as it does for modules imported before the hook).

Hooks cannot be removed (PEP 578): after the dump, :func:`stop` leaves one
that returns at once.  The hook keeps the loader and the code object (not the
module: a module a program drops still goes).  Imports only what start-up has
loaded already: this runs from the ``.pth`` file.
"""

import sys
from _frozen_importlib_external import SourceFileLoader, _LoaderBasics
from os import stat
from time import time_ns

__all__ = ["install", "active", "stop", "ran", "SETTLED_NS"]

# A source modified this recently before its body ran is not trusted to be
# the one its code came from (nanoseconds; mtime granularity is coarser on
# some file systems, 2 s on FAT).
SETTLED_NS = 2_000_000_000

_EXEC_MODULE = _LoaderBasics.exec_module.__code__
_ran = {}            # module name -> (loader, code, mtime_ns, size, when_ns)
_on = False
_hooked = False


def _hook(event, args):
    if event != "exec" or not _on:
        return
    try:
        # 0: this hook; 1: _call_with_frames_removed (exec is C, no frame);
        # 2: the exec_module that called it.
        frame = sys._getframe(2)
    except ValueError:
        return
    if frame.f_code is not _EXEC_MODULE:
        return
    try:
        local = frame.f_locals
        loader = local["self"]
        code = args[0]
        # The stock loader only (pycds's own ArchiveLoader serves code
        # from an archive, whose memory it may give back after the body).
        if local["code"] is not code or type(loader) is not SourceFileLoader:
            return
        when = time_ns()
        st = stat(loader.path)
        _ran[loader.name] = (loader, code, st.st_mtime_ns, st.st_size, when)
    except Exception:
        # Never disturb an import: without a capture the dump reads the
        # .pyc again.
        return


def install():
    """Start capturing (DUMP start-up).  False if the hook could not be
    added (another audit hook refused it)."""
    global _on, _hooked
    if not _hooked:
        try:
            sys.addaudithook(_hook)
        except Exception:
            return False
        _hooked = True
    _on = True
    return True


def active():
    """Whether imports are being captured now."""
    return _on


def stop():
    """Stop capturing and forget what was captured."""
    global _on
    _on = False
    _ran.clear()


def ran(name, loader, mtime_ns, size):
    """The code object the import of ``name`` by ``loader`` executed, if
    the source still has ``mtime_ns`` and ``size`` and had them, settled,
    before the body ran; else None."""
    got = _ran.get(name)
    if got is None or got[0] is not loader:
        return None
    _, code, c_mtime, c_size, when = got
    if (c_mtime, c_size) != (mtime_ns, size) or when - c_mtime <= SETTLED_NS:
        return None
    return code
