"""AUTO: share what the archive serves; at exit, write in what it lacked.

AUTO: share what the archive still serves; at exit, write into it what
it did not.

The behaviour of the JDK's ``-XX:+AutoCreateSharedArchive`` (JDK 19, JEP
350's dynamic archive made automatic): with the program's archive present
and usable, a run is a SHARE run (pycds.share); with none, or with one that
no longer fits, it shares what still fits and writes the archive at exit,
so that the next run is served whole.

At exit the modules of this run's imports that the archive did not fit --
not in it (``pycds.share.missed``), or in it but stale
(``pycds.share.stale_report``: edited, upgraded, moved) -- are copied into a
fresh archive together with every module of the old one they do not
replace, whose chunks are carried over as they are (pycds.dumping.dumper).  When a
write happens:

- no usable archive (none yet, damaged, made by another interpreter or
  another pycds): always;
- stale modules: always (each edit or upgrade is rewritten once);
- only modules the archive lacks: at once for the first
  :data:`FREE_ADDS` such rewrites in a row (the workers of a server, each
  importing what its requests need, fill the archive between them); after
  that only once the archive is :func:`add_backoff_s` old (1 s, 2 s, 4 s,
  ... up to an hour), so a program whose imports differ on every run
  (plugins picked at random) rewrites it a logarithmic number of times,
  not on every run.

Writers of one archive take turns under its directory's lock
(pycds.dumping.dumper); each one, holding it, looks again at the archive now there
and writes only what that one still lacks, so processes ending at once
(a server's workers, a test suite's subprocesses) write the archive once
between them and none loses what another wrote.  Where the archive cannot
be written (its directory read-only or not ours) AUTO shares what it can
and says so once for the process tree: the tree's first process, when it
lacked modules itself.
"""

import atexit
import os
import sys
import time

from . import _config
from ._config import is_hook_module
from . import share as finder

__all__ = ["install", "add_backoff_s"]

_ModuleType = type(sys)
_MODULE_DICT = _ModuleType.__dict__["__dict__"]

# Rewrites that only add modules made at once, in a row; the longest wait
# between two after those, seconds.
FREE_ADDS = 16
ADD_BACKOFF_MAX_S = 3600.0


def add_backoff_s(adds):
    """Return the seconds an archive must stand before an adds-only rewrite.

    Seconds the archive must have stood before a rewrite that only adds
    modules, after ``adds`` such rewrites in a row: 0 up to
    :data:`FREE_ADDS`, then 1, 2, 4, ... up to :data:`ADD_BACKOFF_MAX_S`."""
    if adds < FREE_ADDS:
        return 0.0
    return min(2.0 ** (adds - FREE_ADDS), ADD_BACKOFF_MAX_S)


class _Run:
    """This process's AUTO state, from start-up to its exit handler."""

    def __init__(self, cfg, installed, preloaded=None):
        self.cfg = cfg
        self.installed = installed
        # What start-up imported before pycds.pth ran: a SHARE run imports
        # it before its finder too, so it is not archived.
        self.preloaded = set(sys.modules) if preloaded is None else preloaded
        self.recording = False
        self.settling = False   # a pycds.dumping.settle watcher was started
        self.wrote = False      # an archive write was made by this process
        self.warned = False
        # The first AUTO process of a process tree says what the tree
        # cannot write; the processes it starts inherit the mark.
        self.tree_root = _config.auto_tree_root()

    def at_exit(self):
        # Never raises, never changes the exit status or the output.
        lock = None
        if self.settling:
            from .dumping import settle as _settle
            lock = _settle.stop()
        try:
            from ._config import is_main_interpreter
            # (The cheap look first: the full check of the interpreter
            # imports an extension module on 3.10/3.11.)
            if self.unfit() and is_main_interpreter():
                self.write()
        finally:
            if lock is not None:
                lock.release()
            if self.recording:
                from .dumping import capture as _capture
                _capture.stop()

    def is_tree_root(self):
        # (A child forked by the program inherits the mark, not the role.)
        return self.tree_root == os.getpid()

    def write(self):
        """Write what the archive lacks, if a write is due; never raise.

        Write what the archive lacks, if a write is due (at exit, or
        once imports have settled: pycds.dumping.settle).  Never raises; a
        failure is one warning from the process tree's first process (the
        others say it at PYCDSVERBOSE=1)."""
        try:
            self.write_if_due()
        except BaseException as e:
            from . import _log
            from ._files import NotReplaceable
            why = (e.strerror if isinstance(e, OSError) and e.strerror and
                   not isinstance(e, NotReplaceable) else str(e) or type(e).__name__)
            msg = (f"AUTO: no archive was written to {self.cfg.archive}: {why}; "
                   "what it lacks is imported plainly")
            if self.is_tree_root() and not self.warned:
                self.warned = True
                _log.warning(msg)
            elif self.cfg.verbose:
                _log.verbose(msg, 1)

    def no_archive(self):
        # No usable archive at start-up, or one found damaged during the
        # run (dropped for all of it): every module is written.
        return self.installed is None or self.installed.archive.disabled

    def todo(self):
        """Return (triples, stale): the modules the archive did not fit.

        ``(triples, stale)``: the ``(name, module, spec)`` of the
        archivable modules of this run the archive did not fit (specs read
        as pycds.dumping.dumper.collect reads them), and whether any is stale."""
        from .dumping import dumper as _dumper
        out = []
        stale = False
        fresh = self.no_archive()
        missed, stale_names = finder.unserved()
        for name, module, spec in _dumper.collect(_dumper.snapshot()):
            if name in self.preloaded:
                continue
            if fresh or name in missed:
                out.append((name, module, spec))
            elif name in stale_names:
                out.append((name, module, spec))
                stale = True
        return out, stale or fresh

    def unfit(self):
        """Return whether the run imported a module the archive did not fit.

        Whether the run imported a ``.py`` module the archive lacked or
        held stale: a cheap look before :meth:`todo` (which imports the
        writer's modules) in the usual case, where nothing is."""
        if self.no_archive():
            return True
        modules = sys.modules
        missed, stale = finder.unserved()
        for name in missed | stale:
            m = modules.get(name)
            if m is None or name in self.preloaded or not isinstance(m, _ModuleType) \
                    or is_hook_module(name):
                continue
            # (Read without running the module's class: a lazily loaded
            # module would run its body on any attribute.)
            origin = _MODULE_DICT.__get__(m).get("__file__")
            if type(origin) is str and origin.endswith(".py"):
                return True
        return False

    def write_if_due(self):
        if not self.unfit():
            return
        todo, replaces = self.todo()
        path = self.cfg.archive
        if not todo and (self.installed is not None or os.path.lexists(path)):
            return
        # (Nothing to archive and no file yet: an empty archive, so that the
        # next runs open it at their first import instead of recording.)
        if not replaces and not self.wrote:
            # (A process's exit write after its settle write is one rewrite.)
            index = self.installed.archive.index
            adds = index.meta.get("auto_adds", 0)
            age = time.time() - index.mtime
            wait = add_backoff_s(adds if type(adds) is int else 0)
            if age < wait:
                if self.cfg.verbose:
                    from . import _log
                    _log.verbose(f"AUTO: {len(todo)} modules not in {path}; "
                                 f"not rewritten before it is {wait:.0f} s old", 1)
                return
        why = _unwritable(path)
        if why:
            if self.is_tree_root() and not self.warned:
                self.warned = True
                from . import _log
                _log.warning(f"AUTO cannot write {path} ({why}): modules it lacks "
                             "are imported plainly; set PYCDSARCHIVE to a path in a "
                             "directory only you can write")
            return
        from .dumping import dumper as _dumper
        t0 = time.perf_counter()
        bump = not self.wrote
        self.wrote = True
        # An archive found damaged during the run is written anew whole:
        # its index may still list every module this run imported.
        damaged = self.installed is not None and self.installed.archive.damaged
        n, _ = _dumper.dump_modules(
            [], path, self.cfg.verbose,
            refresh=lambda p: _refresh(p, todo, replaces, self.cfg.check, bump, damaged))
        if self.cfg.verbose:
            ms = (time.perf_counter() - t0) * 1e3
            from . import _log
            _log.verbose(f"AUTO: wrote {n} modules to {path} in {ms:.1f} ms"
                         if n else f"AUTO: {path} already holds what this run lacked", 1)


def _refresh(path, todo, replaces, check, bump=True, damaged=False):
    """Return what to write into the archive at path now, or None.

    What to write into the archive now at ``path`` (pycds.dumping.dumper's
    ``refresh``, under the directory lock): the ``(name, module)`` pairs of
    the modules of ``todo`` (:meth:`_Run.todo`) it still lacks or holds
    stale (all of them when this run found it ``damaged``), and the
    rewrite count; None when another process has written them since this
    one started."""
    from . import _archive, _pyc
    from .errors import ArchiveFormatError
    if damaged:
        return [(name, module) for name, module, _ in todo], {"auto_adds": 0}
    try:
        index = _archive.Index.open(path)
    except ArchiveFormatError:
        return [(name, module) for name, module, _ in todo], {"auto_adds": 0}
    try:
        left = []
        stale = False
        for name, module, spec in todo:
            entry = index.lookup(name)
            if entry is None:
                left.append((name, module))
            elif entry.origin != spec.origin or \
                    _pyc.check(entry, check, spec.cached)[0] is not None:
                left.append((name, module))
                stale = True
        if not left:
            return None
        adds = index.meta.get("auto_adds", 0)
        if type(adds) is not int or stale or replaces:
            adds = 0
        elif bump:
            adds += 1
        return left, {"auto_adds": adds}
    finally:
        index.close()


def _unwritable(path):
    """Return why the archive at path cannot be written here, or "".

    Why the archive at ``path`` cannot be written here ("" if it can):
    checked before copying anything, so that a read-only deployment costs
    nothing at exit."""
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(d):        # (made by the writer)
        parent = os.path.dirname(d)
        if parent == d:
            return "no directory"
        d = parent
    if not os.access(d, os.W_OK | os.X_OK):
        return f"{d} is not writable"
    # An archive there would be refused by every run that reads it.
    from ._advice import directory_refusal
    return directory_refusal(path)


def install(cfg, preloaded=None, **where):
    """Start AUTO: return the finder (or None) and set the exit handler.

    AUTO's start-up, or its program's first import (pycds._Opener): the
    finder over what the archive serves (None when there is no usable
    archive), and the exit handler that writes what it lacked.  With no
    usable archive the run records as DUMP does (the code its imports ran,
    their order), since it writes every module.  ``preloaded``: the modules
    start-up imported before pycds.pth ran (default: those imported now);
    ``where``: pycds.share.install's placement arguments."""
    installed = finder.install(cfg, **where)
    run = _Run(cfg, installed, preloaded)
    if installed is None:
        from ._advice import not_replaceable
        from ._advice import directory_refusal
        # A file of the user's, or a directory others may write: install()
        # said AUTO writes nothing there.
        run.warned = bool(not_replaceable(cfg.archive) or (
            os.path.lexists(cfg.archive) and directory_refusal(cfg.archive)))
    if installed is None:
        from .dumping import capture as _capture, dumper as _dumper, import_order as _import_order
        run.recording = _capture.install()
        _import_order.install()
        _dumper.preload()
    atexit.register(run.at_exit)
    if cfg.settle > 0:
        from .dumping import settle as _settle
        _settle.start(run.write, cfg.settle)
        run.settling = True
    return installed
