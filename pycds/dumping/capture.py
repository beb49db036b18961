"""The module code objects a DUMP run's imports executed, kept for the dump.

An audit hook (PEP 578) on the ``exec`` event sees every code object handed
to ``exec``; importlib's ``_LoaderBasics.exec_module`` hands it the module
code that ``SourceFileLoader.get_code`` returned (importlib/_bootstrap_external.py,
3.10-3.13), whose ``co_filename`` is the module's origin.  The hook keeps,
per source file, the module code executed from it and the file's
``st_mtime_ns`` and size.  Archiving that object saves the dump at exit a
second read and unmarshal of every ``.pyc``, and says which of the module's
functions outlived its import: their code objects are held by more than the
``co_consts`` tuple (native/archive/writer/writer.c, ``predicted_dead``).

Code that ran while the program had replaced part of the stock loader
(``pycds._pyc.loader_patched``: an import hook rewriting code in
``source_to_code``) is not what the stock loader makes: it is not kept.

The hook calls nothing that raises an audit event of its own (no frame
introspection: ``sys._getframe`` and ``frame.f_code`` do), and never raises.
So it cannot tell which loader ran a code object: a file whose module code
ran twice (a reload, a second name, ``runpy``, a tool that rewrites modules)
is marked ambiguous, and a capture serves only a module imported after
capturing started (:func:`preloaded`) by importlib's own ``_load_unlocked``
(pycds.dumping.dumper: not one a program built and ran itself).  What makes a capture
the code plain import would run now is checked at exit (pycds.dumping.dumper): the
source's stat (mtime, size, ctime, inode) is what it was when the body
started, its ctime (which every write, rename and ``utime`` sets to the
present: ``cp -p`` cannot keep it) was more than :data:`SETTLED_NS` earlier
than the capture, and the ``.pyc`` plain import would trust now has a ctime
as old, so the capture is that ``.pyc``'s code.  Otherwise the dump reads the
module again.

Hooks cannot be removed (PEP 578): after the dump, :func:`stop` leaves one
that returns at once.  The hook keeps code objects, never modules: a module
a program drops still goes.  Imports only what start-up has loaded already:
this runs from the ``.pth`` file.
"""

import sys
from _weakref import ref
from os import stat
from time import time_ns

from .._config import loader_patched

__all__ = ["install", "active", "preloaded", "stop", "ran", "stat_key",
           "SETTLED_NS"]

# A file changed (its ctime) this recently before its module code ran is
# not trusted to be the one that code came from (nanoseconds; file times are
# coarser than the clock: a kernel tick, 2 s on FAT).
SETTLED_NS = 2_000_000_000

_AMBIGUOUS = ()
_ran = {}            # source path -> (code, stat key, when_ns) or _AMBIGUOUS
_on = False
_hooked = False
_preloaded = None    # name -> weak reference to the module in sys.modules
                     # when capturing first started


def _hook(event, args):
    if event != "exec" or not _on:
        return
    try:
        code = args[0]
        if code.co_name != "<module>":
            return
        path = code.co_filename
        if not path.endswith(".py"):
            return                     # "<string>" and the like
        got = _ran.get(path)
        if got is not None:
            if got is not _AMBIGUOUS and got[0] is not code:
                _ran[path] = _AMBIGUOUS
            return
        _ran[path] = _AMBIGUOUS        # until this capture is complete
        if loader_patched():
            return                     # not the stock loader's code
        when = time_ns()
        st = stat(path)
        _ran[path] = (code, stat_key(st), when)
    except Exception:
        # Never disturb an import: without a capture the dump reads the
        # module again.
        return


def stat_key(st):
    """What must not change in a file's stat: mtime, size, ctime, inode."""
    return (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino, st.st_dev)


def install():
    """Start capturing; return False if the audit hook could not be added.

    Start capturing (DUMP start-up).  False if the hook could not be
    added (another audit hook refused it)."""
    global _on, _hooked, _preloaded
    if _preloaded is None:
        _preloaded = {}
        for name, m in list(sys.modules.items()):
            try:
                _preloaded[name] = ref(m)
            except TypeError:       # not a module: no spec, never archived
                pass
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


def preloaded(name, module):
    """Return whether module was sys.modules[name] when capture began.

    Whether ``module`` was ``sys.modules[name]`` already when capturing
    first started.  Under DUMP that is start-up, before ``pycds.pth`` ran
    (``encodings``, modules of earlier ``.pth`` files): a SHARE run imports
    them before its finder is installed, so the archive never serves them."""
    r = _preloaded.get(name) if _preloaded is not None else None
    return r is not None and r() is module


def stop():
    """Stop capturing and forget what was captured."""
    global _on
    _on = False
    _ran.clear()


def ran(name, module, origin, st):
    """Return (code, when_ns) of module's captured execution, or None.

    ``(code, when_ns)``: the module code executed from ``origin``, once,
    if ``module`` (``sys.modules[name]``) was imported after capturing
    started (so its own execution is the one captured) and the source's
    stat ``st`` (now) is the one it had when the code ran (``when_ns``:
    time.time_ns()), unchanged since :data:`SETTLED_NS` before; else None."""
    got = _ran.get(origin)
    if not got or _preloaded is None or preloaded(name, module):
        return None
    code, key, when = got
    if key != stat_key(st) or when - st.st_ctime_ns <= SETTLED_NS:
        return None
    return code, when
