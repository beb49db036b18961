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

__version__ = "0.1.0"
__all__ = ["dump", "start", "stats", "_dump", "__version__"]

_started = False


_MISSING = object()


def _dicts(obj):
    # Where an attribute of ``obj`` is stored, in lookup order: the dicts of
    # its MRO's classes (a class), its dict (a module).  Looking a name up
    # there runs no descriptor and no comparison of a program's.
    return [cls.__dict__ for cls in obj.__mro__] if type(obj) is type else [obj.__dict__]


# What SourceLoader.get_code makes a module's code with, as a program may
# replace them: the methods it calls on the loader, the functions that name,
# check and unmarshal a .pyc; as (object, name, value) triples, the values
# as they were when pycds started (imported from the .pth line, before the
# program runs; by the program when it uses the API: getattr then finds
# what is stored, plain functions).  Compared by identity with what is
# stored now (:func:`_dicts`), here and by the native verdict
# (pycds._nativeapi.IndexFinder's ``serving``; find.c, stored()).
_STOCK_LOADER_ATTRS = tuple(
    (obj, name, getattr(obj, name, _MISSING))
    for obj, names in ((_bootstrap_external.SourceFileLoader,
                        ("get_code", "source_to_code", "get_data", "path_stats")),
                       (_bootstrap_external,
                        ("_compile_bytecode", "cache_from_source", "_classify_pyc",
                         "_validate_timestamp_pyc")),
                       (_bootstrap_external.marshal, ("loads",)),
                       (_bootstrap_external._imp, ("_fix_co_filename",)))
    for name in names)
_LOADER_MRO = _bootstrap_external.SourceFileLoader.__mro__
_loader_chains = None


def _chains():
    # _STOCK_LOADER_ATTRS as loader_patched() checks them: for each, the
    # dicts before the one holding the stock value (where a value of the
    # program's would shadow it), that one, the name and the value.  Made
    # at the first check; None (not kept) where a stock value is stored
    # nowhere any more.
    global _loader_chains
    chains = []
    for obj, name, stock in _STOCK_LOADER_ATTRS:
        before = []
        for d in _dicts(obj):
            if d.get(name, _MISSING) is stock:
                chains.append((tuple(before), d, name, stock))
                break
            before.append(d)
        else:
            return None
    _loader_chains = tuple(chains)
    return _loader_chains


def loader_patched():
    """Whether the program has replaced a part of the stock
    ``SourceFileLoader`` that plain import's ``get_code`` uses (a
    ``source_to_code`` that rewrites code, say; a wrapper around
    ``get_code`` that an APM agent installs): code made or archived then is
    not what the stock loader makes, so pycds neither archives nor serves
    it.  The stock parts are those pycds started with, compared by identity
    where they are stored (:func:`_dicts`: no descriptor runs)."""
    if _bootstrap_external.SourceFileLoader.__mro__ is not _LOADER_MRO:
        return True
    chains = _loader_chains or _chains()
    if chains is None:
        return True
    for before, holder, name, stock in chains:
        for d in before:
            if name in d:
                return True
        if holder.get(name, _MISSING) is not stock:
            return True
    return False


# The methods of plain import's search whose answer pycds replays
# (pycds._search, native/archive/loader/find.c), as pycds started with them:
# a program that replaces one gets it called.
_STOCK_SEARCH = tuple(
    (cls, name, cls.__dict__.get(name))     # (None: inherited)
    for cls, names in ((_bootstrap_external.PathFinder,
                        ("find_spec", "_get_spec", "_path_importer_cache")),
                       (_bootstrap_external.FileFinder,
                        ("find_spec", "_get_spec", "_fill_cache", "__getattribute__")))
    for name in names)
# The functions FileFinder.find_spec calls (importlib/_bootstrap_external.py,
# 3.10-3.13), as (module, name, value) triples compared as
# _STOCK_LOADER_ATTRS are (a module's attribute is stored in its dict).
_STOCK_SEARCH_FUNCS = tuple(
    (_bootstrap_external, name, getattr(_bootstrap_external, name, _MISSING))
    for name in ("_path_stat", "_path_join", "_path_isfile", "_path_isdir", "_relax_case"))


def _hook_parts():
    # What importlib's own path hooks run for a directory (PathFinder's
    # _path_hooks, zipimporter's and FileFinder's constructors, the stat
    # helpers they call, the working directory for '': importlib/
    # _bootstrap_external.py and zipimport.py, 3.10-3.13), as a program
    # may replace them.
    b = _bootstrap_external
    zipimporter = getattr(sys.modules.get("zipimport"), "zipimporter", None)
    return (b.PathFinder.__dict__.get("_path_hooks"), b.FileFinder.__dict__.get("__init__"),
            b.FileFinder.__dict__.get("__new__"),
            zipimporter, getattr(zipimporter, "__init__", None),
            b._path_isdir, b._path_stat, b._path_is_mode_type, b._os.getcwd)


_STOCK_HOOKS = _hook_parts()


def _file_finder_hooks():
    # The closures FileFinder.path_hook made for FileFinder itself in
    # sys.path_hooks as pycds starts (importlib's _install puts one there).
    ff = _bootstrap_external.FileFinder
    code = ff.path_hook().__code__
    found = []
    try:
        for hook in sys.path_hooks:
            if type(hook) is type(_hook_parts) and hook.__code__ is code and \
                    hook.__closure__[code.co_freevars.index("cls")].cell_contents is ff:
                found.append(hook)
    except Exception:
        pass
    return tuple(found)


_STOCK_FILE_FINDER_HOOKS = _file_finder_hooks()


def path_hooks_stock():
    """Whether every entry of ``sys.path_hooks`` is one importlib put there
    (zipimporter, or a FileFinder hook there when pycds started) and what
    they run is as pycds started with it: running them for a directory runs
    no code of the program and changes nothing but what ``PathFinder``
    stores in ``sys.path_importer_cache``.  Never raises; reads no
    attribute of the hooks (no audit event)."""
    try:
        for now, stock in zip(_hook_parts(), _STOCK_HOOKS):
            if now is not stock:
                return False
        zipimporter = _STOCK_HOOKS[3]
        hooks = sys.path_hooks
        if type(hooks) is not list or not hooks:
            return False
        for hook in hooks:
            if hook is zipimporter and zipimporter is not None:
                continue
            for stock in _STOCK_FILE_FINDER_HOOKS:
                if hook is stock:
                    break
            else:
                return False
    except Exception:
        return False
    return True


# FileFinder's (suffix, loader) pairs as its default path hook makes them
# (FileFinder.__init__ and _install in importlib/_bootstrap_external.py).
FILE_LOADERS = [(suffix, loader)
                for loader, suffixes in _bootstrap_external._get_supported_file_loaders()
                for suffix in suffixes]


def search_replayable():
    """Whether a recorded search may be replayed: the search's methods are
    the stock ones and ``-vv`` is off (FileFinder prints each file it tries
    then; a replay would not)."""
    if sys.flags.verbose >= 2:
        return False
    for cls, name, original in _STOCK_SEARCH:
        if cls.__dict__.get(name) is not original:
            return False
    for module, name, original in _STOCK_SEARCH_FUNCS:
        if module.__dict__.get(name, _MISSING) is not original:
            return False
    return True

# The file names of importlib's own frames (frozen; 3.10-3.13, also under
# -X frozen_modules=off).
BOOTSTRAP_FILES = ("<frozen importlib._bootstrap>",
                   "<frozen importlib._bootstrap_external>")

# Bound at import: a program may replace sys._getframe (mock.patch) or
# delete it, and find_spec must not follow it.
_getframe = sys._getframe
# Deeper stacks are taken for the program's: the interpreter's own imports
# run a few frames deep, and 3.13 builds a frame object for every frame
# walked.
_MAX_WALK = 1000


def imported_by_interpreter():
    """Whether the import being found was started by the interpreter itself:
    the outermost frame of this thread is importlib's, so no code of the
    program lies beneath it (``site`` and what it imports at start-up, such
    as ``sitecustomize``; ``linecache``, which 3.13 imports for ``-c``
    before running the command; ``runpy`` for ``-m``), or the body of a
    module such an import is running.  The program's own imports have its
    frames below them, except on a thread started from C with no Python
    frame (a C extension's worker, an embedding host importing the
    application from C), which this takes for the interpreter's: a matter
    of speed only (:data:`STARTUP_PLAIN_IMPORTS`).  Never raises (False on any surprise)."""
    try:
        f = _getframe(1)
        for _ in range(_MAX_WALK):
            back = f.f_back
            if back is None:
                return f.f_code.co_filename in BOOTSTRAP_FILES
            f = back
    except Exception:
        pass
    return False


def _start():
    """Switch on the mode the PYCDS* environment variables ask for (run by
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
            # (-X dev loads the native module at once: pycds.finder.install.
            # No archive to open: its warning now.)
            from . import finder
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
        from . import _archive, _capture, _dumper, _writer
        _capture.install()
        _dumper.preload()
        atexit.register(_dumper.dump_at_exit, cfg)
        if not os.environ.get(_dumper.SESSION_VAR):
            _dumper.announcer = os.getpid()
        _dumper.dump_session()   # children started from here on inherit it
        _writer.say_if_taken(cfg.archive, _archive.ARCHIVE_FILE, "DUMP writes no archive",
                             "PYCDSARCHIVE")
        if cfg.settle > 0:
            from . import _settle
            _settle.start(lambda: _dumper.write_archive(cfg, announce=False), cfg.settle)
    elif cfg.mode == _config.MODE_TRACE:
        import atexit
        from . import _import_order, trace
        _import_order.install()
        # Children write into the same list, wherever they start.
        os.environ["PYCDSLIST"] = cfg.listfile
        trace.trace_session()
        from . import _writer
        _writer.say_if_taken(cfg.listfile, trace.LIST_FILE, "TRACE writes no module list",
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
    """SHARE's (and AUTO's, when it has an archive file) place on
    ``sys.meta_path`` until the program's first import: it opens the archive
    then and puts pycds.finder's finder in its place (AUTO: pycds.auto's
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
            # pycds.finder inside the program's import of it, which would
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
        """pycds.finder's finder, installed in this one's place on first
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
        # pycds.finder's install(), or None after one warning.  What the
        # program raises there propagates, as out of the finder; in
        # importing pycds's modules (its audit hook refusing them) it is a
        # reason not to use the archive, as for the native module
        # (pycds.finder._Archive.load_code).
        try:
            from . import finder
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


def import_native(search_path=None):
    """``pycds._nativeapi``, imported with pycds's own ``_cffi_backend``:
    at the first archive hit of a SHARE run, at the start of a DUMP run
    and of an AUTO run that records (pycds._dumper.preload).  (Here, not
    in a module of its own: a SHARE run's first hit would import one more
    module.)

    Where the program has imported a ``_cffi_backend``, the native module
    uses that one.  Else pycds's is loaded from ``search_path`` (the search
    path as start-up left it, where pycds and its dependencies were found),
    not from what the program's ``sys.path`` names now -- a
    ``_cffi_backend`` beside its script, a vendored cffi put first -- and
    taken out of ``sys.modules`` again once the native module has it (the
    library stays loaded): the program's own ``import _cffi_backend`` is
    then plain import's.  (Left: a thread of the program importing
    ``_cffi_backend`` during the first archive hit gets pycds's: the native
    module's init imports it by name through ``sys.modules``.)  The
    module's import lock is held meanwhile, so that a thread's import of it
    already under way finishes first, and is the one used.  The program's
    audit hooks see the import (``_bootstrap._load`` raises the "import"
    event) and may refuse it.  Raises ImportError where it cannot be
    loaded."""
    api = sys.modules.get(__package__ + "._nativeapi")
    if api is not None:
        return api
    import _frozen_importlib as _bootstrap
    with _bootstrap._ModuleLockManager("_cffi_backend"):
        if "_cffi_backend" in sys.modules:
            from . import _nativeapi
            return _nativeapi
        spec = None
        if search_path:
            spec = _bootstrap_external.PathFinder.find_spec("_cffi_backend",
                                                            list(search_path))
        if spec is not None:
            ours = _bootstrap._load(spec)
        else:
            import _cffi_backend as ours
        try:
            from . import _nativeapi
        finally:
            if sys.modules.get("_cffi_backend") is ours:
                del sys.modules["_cffi_backend"]
    return _nativeapi


def start():
    """Switch on what the PYCDS* environment variables ask for, as the
    ``pycds.pth`` line does at start-up, from code: where no ``.pth`` file
    is read, as for packages installed with ``pip install --target`` and put
    on ``PYTHONPATH`` (a serverless zip; docs/deploy.md).  Imports made
    before the call are plain ones.  Never raises; a call after the
    ``.pth`` line's (or a second call) does nothing."""
    return _start()


def is_main_interpreter(cheap_only=False):
    """True unless this is a subinterpreter.  pycds works in the main
    interpreter only: its native module is single-phase (cffi), which 3.12+
    refuses to load in isolated subinterpreters, and archives and DUMP
    sessions belong to the process.  3.12+ answers cheaply; on 3.10/3.11
    the answer needs an extension module, so ``cheap_only`` says True."""
    check = getattr(_thread, "_is_main_interpreter", None)
    if check is not None:
        return check()
    if cheap_only:
        return True
    try:
        import _xxsubinterpreters as interpreters
        return interpreters.get_current() == interpreters.get_main()
    except Exception:
        return True


def is_hook_module(name):
    """Whether module ``name`` is pycds's own import hook, which is never
    archived (it runs before the archive is open); its companion pycds.bf16
    is an ordinary library and is."""
    return (name == "pycds" or name.startswith("pycds.")) and \
        not (name == "pycds.bf16" or name.startswith("pycds.bf16."))


def stats():
    """Counters of this process's share mode (see pycds.finder.stats):
    modules served, fallbacks by reason, bytes loaded, load time in ms,
    modules read ahead, bytes given back after module bodies ran, modules
    the interpreter imported at start-up that were imported plainly."""
    if _opener is not None:
        _opener.open()
    finder = sys.modules.get("pycds.finder")
    if finder is None:
        return {"served": 0, "fallbacks": {}, "archive": None,
                "modules_in_archive": 0, "bytes_loaded": 0, "load_ms": 0.0,
                "open_ms": 0.0, "prefetched": 0, "released_bytes": 0,
                "searches_replayed": 0, "startup_plain": 0}
    return finder.stats()


def dump(archive=None, modules=None):
    """Write an archive of the modules imported so far, after importing the
    module names in ``modules`` (an iterable of str; None: none), to
    ``archive`` (a str, bytes or os.PathLike path; None: ``$PYCDSARCHIVE``,
    else this program's default archive, as DUMP would write).

    What is archived and how is what a DUMP run writes at exit
    (pycds._dumper); the file is replaced atomically.  Returns the number of
    modules archived.  Raises OSError if the archive cannot be written,
    ValueError if no archive path is known, TypeError if ``modules`` is a
    str or holds a name that is not a str.  Names that fail to import are reported on
    stderr and skipped.

    The code objects of the modules it imports are kept as they run
    (pycds._capture: an audit hook, which stays in the process, idle, once
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
    from . import _capture
    own_capture = not _capture.active() and _capture.install()
    try:
        return _import_and_dump(names, archive or "", "dump")
    finally:
        if own_capture:
            _capture.stop()


def _dump(module_list="", archive=""):
    """Import the modules named in the file ``module_list`` (one a line; ``#``
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
    names = []
    if module_list:
        with open(module_list, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{module_list}: not a UTF-8 module list (byte "
                             f"{data[e.start]:#04x} at offset {e.start})") from None
        names = [line.strip() for line in text.split("\n")
                 if line.strip() and not line.lstrip().startswith("#")]
    from . import _capture
    own_capture = not _capture.active() and _capture.install()
    try:
        return _import_and_dump(names, archive, "_dump")
    finally:
        if own_capture:
            _capture.stop()


def _import_and_dump(names, archive, caller):
    import importlib
    import os
    from . import _archive, _config, _log, _dumper, _writer
    if not archive:
        archive = _config._absolute(os.environ.get("PYCDSARCHIVE", "")) \
            or _config.default_archive_path()
    if not archive:
        raise ValueError("no archive path: pass one or set PYCDSARCHIVE")
    # (Before the imports: a path that holds a file of the user's costs nothing.)
    _writer.check_replaceable(archive, _archive.ARCHIVE_FILE)
    for name in names or ():
        if name in ("__main__", "__mp_main__") or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except BaseException as e:   # a listed module may fail, or exit
            _log.warning(f"module {name!r} not archived: importing it raised "
                         f"{type(e).__name__}: {e}")
    # Laid out from the names given, in their order (pycds._dump_order).
    n, _ = _dumper.dump_modules(_dumper.snapshot(), archive, roots=names or None)
    return n
