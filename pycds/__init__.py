"""pycds: start-up accelerator for CPython.

A *dump* run records the code objects of the modules a program imports into
one archive laid out as live CPython objects; later *share* runs read each
module's part on first import, fix it up and execute those code objects in
place, skipping the read and unmarshal of each ``.pyc``.  Switched on by
environment variables through ``pycds.pth``::

    PYCDSMODE=DUMP  PYCDSARCHIVE=app.img python app.py   # write the archive at exit
    PYCDSMODE=SHARE PYCDSARCHIVE=app.img python app.py   # run from the archive
    PYCDSMODE=AUTO python app.py    # share, and keep the archive current by itself

Exports: :func:`dump` (the API form of a dump), :func:`start` (the
``.pth`` line's work, from code), :func:`stats`, :func:`_dump` (the original
tool's form of a dump) and ``__version__``; :func:`_start` is what the
``.pth`` line calls.  Importing
this package loads nothing heavy; the native module is loaded on first use.
"""

import _thread
import sys

import _frozen_importlib_external as _bootstrap_external

# (First: what the import system is as pycds starts, before the program
# can replace any of it.)
from ._config import imported_by_interpreter, is_hook_module, is_main_interpreter
from ._config import __version__

__all__ = ["dump", "start", "stats", "_dump", "__version__"]

_started = False


def _start():
    """Start the mode the PYCDS* environment variables ask for; never raise.

    Switch on the mode the PYCDS* environment variables ask for (run by
    the ``pycds.pth`` line): SHARE puts the stand-in that opens the archive
    at the program's first import on ``sys.meta_path`` (:class:`_Opener`),
    DUMP and TRACE register an atexit handler, AUTO installs the finder and
    its handler (pycds.auto), MANUALLY does nothing.  It never raises: a problem is one warning on stderr and the
    program runs as plain Python.
    A second call is a no-op.

    It lives in the package itself, as does the rest of start-up's glue:
    every module imported at start-up is found, read and unmarshalled
    before anything is served."""
    global _started
    if _started:
        return None
    _started = True
    if not is_main_interpreter(cheap_only=True):
        return None
    from . import _config
    try:
        return _activate(_config.from_environ())
    except Exception as e:   # never break start-up
        from . import _log
        _log.warning(f"pycds not activated: {e!r}")
        return None


def _runs_own_cli():
    # Whether this is ``python [options] -m pycds ...``.
    from ._config import program_id
    return program_id()[:2] == ("-m", "pycds")


def _activate(cfg):
    from . import _config
    if cfg.mode != _config.MODE_OFF and _runs_own_cli():
        return None     # pycds's own command line: not a program to archive
    if cfg.verbose or cfg.problems:
        # Quiet processes (the usual case) never import _log at start-up.
        from . import _log
        _log.level = cfg.verbose
        for problem in cfg.problems:
            _log.warning(problem)
    import os
    if cfg.mode in (_config.MODE_SHARE, _config.MODE_DUMP, _config.MODE_AUTO):
        if cfg.archive and os.environ.get("PYCDSARCHIVE") != cfg.archive:
            # Children use this very archive (SHARE) or merge into it (DUMP),
            # also when they start in another directory, where a relative
            # path would name another file, and when it is the default one
            # (a multiprocessing worker started as `python -c ...` would
            # otherwise have a default archive of its own, never written).
            os.environ["PYCDSARCHIVE"] = cfg.archive
    if cfg.mode == _config.MODE_SHARE:
        if sys.flags.dev_mode or not os.path.isfile(cfg.archive):
            # (-X dev loads the native module at once: pycds.share.install.
            # No archive to open: its warning now.)
            from . import share as finder
            return finder.install(cfg)
        return _Opener.install(cfg)
    if cfg.mode == _config.MODE_AUTO:
        if not sys.flags.dev_mode and os.path.isfile(cfg.archive):
            # The archive (and AUTO's exit handler) at the first import, as
            # SHARE: a program that imports nothing more pays for neither.
            return _Opener.install(cfg)
        from . import auto
        return auto.install(cfg)
    if cfg.mode == _config.MODE_DUMP:
        import atexit
        from . import _archive, _files
        from .dumping import capture as _capture, dumper as _dumper
        _capture.install()
        _dumper.preload()
        atexit.register(_dumper.dump_at_exit, cfg)
        if _config.dump_session_began_here():
            _dumper.announcer = os.getpid()
        _config.dump_session()   # children started from here on inherit it
        _files.say_if_taken(cfg.archive, _archive.ARCHIVE_FILE, "DUMP writes no archive",
                             "PYCDSARCHIVE")
        if cfg.settle > 0:
            from .dumping import settle as _settle
            _settle.start(lambda: _dumper.write_archive(cfg, announce=False), cfg.settle)
    elif cfg.mode == _config.MODE_TRACE:
        import atexit
        from . import trace
        from .dumping import import_order as _import_order
        _import_order.install()
        # Children write into the same list, wherever they start.
        os.environ["PYCDSLIST"] = cfg.listfile
        _config.trace_session()
        from . import _files
        _files.say_if_taken(cfg.listfile, trace.LIST_FILE, "TRACE writes no module list",
                             "PYCDSLIST")
        atexit.register(trace.trace_at_exit, cfg)
    return None


# Imports the interpreter itself starts (:func:`imported_by_interpreter`)
# that SHARE lets through plainly before it opens its archive: site's
# ``sitecustomize`` and ``usercustomize``, what 3.13 imports for ``-c``, what
# ``-m`` imports before the program's module; a ``sitecustomize`` that
# imports a framework opens the archive after these.
STARTUP_PLAIN_IMPORTS = 16

# Seconds an import waits for another thread's opening of the archive
# before it is imported plainly: that thread may be waiting for this one.
OPEN_WAIT_S = 0.5


class _Opener:
    """Stand-in on sys.meta_path that opens the archive at the first import.

    SHARE's (and AUTO's, when it has an archive file) place on
    ``sys.meta_path`` until the program's first import: it opens the archive
    then and puts pycds.share's finder in its place (AUTO: pycds.auto's
    install, with its exit handler),
    so that a start-up imports only this package and its settings
    (pycds._config), and a program that imports nothing opens nothing.  An
    archive it cannot use leaves it there, declining every import.  A meta
    path finder (importlib.abc.MetaPathFinder)."""

    def __init__(self, cfg):
        self.cfg = cfg
        # Where the native module's _cffi_backend is looked up.
        self.startup_path = list(sys.path)
        self.lock = _thread.allocate_lock()    # held while opening
        self.opening = 0        # the thread id that opens, while it does
        self.waited_out = False     # an import gave up waiting for that
        self.done = False
        self.finder = None
        self.plain = []     # the interpreter's imports let through
        # (AUTO) what start-up imported before pycds.pth ran: not archived.
        from ._config import MODE_AUTO
        self.preloaded = set(sys.modules) if cfg.mode == MODE_AUTO else None

    @classmethod
    def install(cls, cfg):
        global _opener
        from . import _config
        _config.share_session()     # for children started before the open
        _opener = opener = cls(cfg)
        meta_path = sys.meta_path
        try:
            at = meta_path.index(_bootstrap_external.PathFinder)
        except ValueError:
            at = len(meta_path)
        meta_path.insert(at, opener)
        return opener

    def find_spec(self, fullname, path=None, target=None):
        if self.done:
            finder = self.finder    # (None: the archive is not used)
        elif is_hook_module(fullname):
            # pycds's own, never archived: opening here would import
            # pycds.share inside the program's import of it, which would
            # then run it a second time.
            return None
        elif len(self.plain) < STARTUP_PLAIN_IMPORTS and imported_by_interpreter():
            self.plain.append(fullname)
            return None
        else:
            finder = self.open(fullname)
        return None if finder is None else finder.find_spec(fullname, path, target)

    def invalidate_caches(self):
        pass

    def open(self, first=None):
        """Return pycds.share's finder, put in this one's place, or None.

        pycds.share's finder, installed in this one's place on first
        call (``first``: the name being imported); None if the archive
        cannot be used (after one warning), while this thread opens it
        (pycds's own imports) or another one does: that wait lasts
        :data:`OPEN_WAIT_S` once, then imports are plain ones until the
        archive is open (the opening thread may be waiting, through a
        module lock, for the import of the waiting one)."""
        if self.done:
            return self.finder
        me = _thread.get_ident()
        if self.opening == me:
            return None
        if not self.lock.acquire(True, 0 if self.waited_out else OPEN_WAIT_S):
            self.waited_out = True
            return None
        try:
            if self.done:
                return self.finder
            self.opening = me
            try:
                self.finder = self._install(first)
            except (RecursionError, MemoryError):
                # The program's state (its depth, its memory): this import
                # is a plain one, the next one opens.
                return None
            finally:
                self.opening = 0
            # Not usable: this one stays on sys.meta_path, declining every
            # import (taken out now, it would make the import system, which
            # is going through that list, skip the finder after it).
            self.done = True
            return self.finder
        finally:
            self.lock.release()


    def _install(self, first):
        # pycds.share's install(), or None after one warning.  What the
        # program raises there propagates, as out of the finder; in
        # importing pycds's modules (its audit hook refusing them) it is a
        # reason not to use the archive, as for the native module
        # (pycds.share._Archive.load_code).
        try:
            from . import share as finder
            from .errors import program_raised
        except (RecursionError, MemoryError):
            raise
        except Exception as e:
            from . import _log
            _log.warning(f"pycds not activated: {e!r}")
            return None
        try:
            if self.preloaded is not None:
                from . import auto
                return auto.install(self.cfg, self.preloaded, replacing=self,
                                    startup_path=self.startup_path, started_plain=self.plain,
                                    first=first)
            return finder.install(self.cfg, replacing=self, startup_path=self.startup_path,
                                  started_plain=self.plain, first=first)
        except Exception as e:
            if program_raised(e):   # (RecursionError, MemoryError too)
                raise
            from . import _log
            _log.warning(f"pycds not activated: {e!r}")
            return None


# SHARE's (AUTO's) opener while its archive is not open (None: not started so).
_opener = None


def start():
    """Start what the PYCDS* variables ask for, as pycds.pth does; never raise.

    Switch on what the PYCDS* environment variables ask for, as the
    ``pycds.pth`` line does at start-up, from code: where no ``.pth`` file
    is read, as for packages installed with ``pip install --target`` and put
    on ``PYTHONPATH`` (a serverless zip; docs/deploy.md).  Imports made
    before the call are plain ones.  Never raises; a call after the
    ``.pth`` line's (or a second call) does nothing."""
    return _start()



def stats():
    """Return this process's share-mode counters, as a dict.

    Counters of this process's share mode (see pycds.share.stats):
    modules served, fallbacks by reason, bytes loaded, load time in ms,
    modules read ahead, bytes given back after module bodies ran, modules
    the interpreter imported at start-up that were imported plainly."""
    if _opener is not None:
        _opener.open()
    finder = sys.modules.get("pycds.share")
    if finder is None:
        return {"served": 0, "fallbacks": {}, "archive": None,
                "modules_in_archive": 0, "bytes_loaded": 0, "load_ms": 0.0,
                "open_ms": 0.0, "prefetched": 0, "released_bytes": 0,
                "searches_replayed": 0, "startup_plain": 0}
    return finder.stats()


def dump(archive=None, modules=None):
    """Archive the modules imported so far; return how many, or raise OSError.

    Write an archive of the modules imported so far, after importing the
    module names in ``modules`` (an iterable of str; None: none), to
    ``archive`` (a str, bytes or os.PathLike path; None: ``$PYCDSARCHIVE``,
    else this program's default archive, as DUMP would write).

    What is archived and how is what a DUMP run writes at exit
    (pycds.dumping.dumper); the file is replaced atomically.  Returns the number of
    modules archived.  Raises OSError if the archive cannot be written,
    ValueError if no archive path is known, TypeError if ``modules`` is a
    str or holds a name that is not a str.  Names that fail to import are reported on
    stderr and skipped.

    The code objects of the modules it imports are kept as they run
    (pycds.dumping.capture: an audit hook, which stays in the process, idle, once
    this returns), so that most need not be read again.
    """
    import os
    if isinstance(modules, (str, bytes)):
        raise TypeError("modules is an iterable of module names, not one name")
    names = [] if modules is None else list(modules)
    archive = os.fsdecode(archive) if archive is not None else None
    for name in names:
        if type(name) is not str:
            raise TypeError(f"module names are str, not {type(name).__name__}: {name!r}")
    from .dumping.dumper import dump_now
    return dump_now(names, archive or "")


def _dump(module_list="", archive=""):
    """Import the modules a file lists, then archive; return the count.

    Import the modules named in the file ``module_list`` (one a line; ``#``
    starts a comment line) and write an archive of every module imported so
    far to ``archive``: the original tool's API, kept; :func:`dump` takes
    the names themselves.

    An empty ``module_list`` archives the modules imported so far; an empty
    ``archive`` means ``$PYCDSARCHIVE`` (else the default per-program path).
    Returns the number of modules archived.  Raises OSError if the list
    cannot be read or the archive cannot be written, ValueError if the list
    is not UTF-8 text or no archive path is known.  Names that
    fail to import are reported on stderr and skipped.
    """
    from .dumping import dumper
    return dumper.dump_now(dumper.read_module_list(module_list) if module_list else [],
                           archive)
