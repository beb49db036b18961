"""SHARE: the meta path finder and loader that serve modules from an archive.

:class:`CDSFinder` sits on ``sys.meta_path`` just before
:class:`importlib.machinery.PathFinder`.  For a module the archive holds, it
asks ``PathFinder`` which file plain import would use *now* (so ``sys.path``,
``__path__`` edits, shadowing files and extension modules are honoured;
directories unchanged since the dump run are not read again:
pycds._search), and serves the archived code only when that is the archived
file, loaded by the stock ``SourceFileLoader``, and unchanged since the
dump.  The spec it returns is PathFinder's own, loader included: the stock ``SourceFileLoader``,
whose ``get_code`` is, until the module's code is handed out, an
:class:`ArchivedCode` in the instance's dict that returns the archived code
object.  Everything else about the module (``__file__``, ``__cached__``,
``__spec__``, the loader's type, ``get_source``, ``get_data``, resource
readers) is exactly plain import's.

Anything unexpected of the archive or of pycds itself means one warning and
plain import; the finder raises into the import system only what the
program raised through it (:func:`pycds.errors.program_raised`), as plain
import's own code would pass it on.  The ``.pyc`` rules are pycds._pyc's,
the archive's format pycds._archive's.  Imports only builtins and importlib
(already loaded at start-up: ``_frozen_importlib_external`` is what
importlib.machinery re-exports).  The native module is loaded on the first
archive hit; pycds._search and pycds._pyc where a hit is judged in Python
(a changed directory, a moved tree, a program's path hook, PYCDSCHECK=hash).

Where the native verdict may serve, the hit itself runs in C: the finder's
own ``find_spec`` is its server's (native/archive/loader/serve.c), which
builds the spec and loads the code as this module does, and hands every
other case to :meth:`CDSFinder.find_spec` here.
"""

import _thread
import os
import sys
import time
from _frozen_importlib_external import (FileFinder, PathFinder, SourceFileLoader, _os,
                                        spec_from_file_location)
from _imp import _fix_co_filename

from .. import _config
from .._config import MODE_AUTO
from .._config import (FILE_LOADERS, STOCK_LOADER_ATTRS, STOCK_SEARCH, STOCK_SEARCH_FUNCS,
                      import_native, is_hook_module, loader_patched, path_hooks_stock,
                      search_replayable)
from ..errors import (E_STATE, FALLBACK, PROGRAM_STATE_ERRORS, ArchiveFormatError,
                      ForeignArchiveError, load_failure, native_refused_here, program_raised)

__all__ = ["CDSFinder", "ArchivedCode", "served_loader", "install", "uninstall",
           "stats"]

# ---- this process's state: set by install(), read by the rest ----------

# The finder installed (None: none).
_installed = None
# PYCDSVERBOSE, from the configuration install() was given.
# pycds._log is imported only to print: a quiet process never loads it.
_verbose = 0
# The search path as start-up left it: where the native module's
# _cffi_backend is looked up.
_startup_path = None
# Whether the finder was installed by AUTO, which rewrites an archive it
# finds damaged at exit.
_auto = False
# Why install() could not use the archive ("" when it could).
open_failure = ""
# The pid of this process if it began its process tree's SHARE session (the
# one that reports a stale archive, once for the tree; not a forked child).
_tree_root = 0
# Names of this run's imports the archive did not fit: looked up and not
# there (missed), or there but no longer what plain import would run
# (stale).  What AUTO rewrites (unserved()) and what a SHARE run's
# stale-archive line counts (pycds.share.stale_report).
missed = set()
stale = set()

# This process's counters (stats() adds what it reads elsewhere).
_counters = {
    "served": 0,
    "fallbacks": {},
    "archive": None,
    "modules_in_archive": 0,
    "bytes_loaded": 0,
    "load_ms": 0.0,
    "open_ms": 0.0,
    "released_bytes": 0,
    "startup_plain": 0,
    "searches_replayed": 0,     # by the native verdict (pycds._search counts its own)
}

# Bytes of heap read ahead after each load (native/archive/loader/prefetch.c): far more
# than a program imports between two of its own statements, small enough
# that a program that stops importing wastes little.
PREFETCH_WINDOW = 2 << 20

# Seconds an import waits for another thread's opening of the native handle
# before it is imported plainly (_Archive.open_handle): that thread may be
# waiting for this one.
OPEN_WAIT_S = 0.5

# Why an archive is dropped when the program closed pycds's descriptors.
_LOST_FD = "the program closed its file descriptor"


def _say(msg, at=1):
    """Print a verbose line.

    A verbose line (callers test ``_verbose >= at`` first; install()
    has imported pycds._log then)."""
    from .. import _log
    _log.verbose(msg, at)


def _warn(msg):
    from .. import _log
    _log.warning(msg)


def _fallback(name, reason):
    """Count an archived module imported plainly for reason.

    Count (and at PYCDSVERBOSE=1 print) an archived module imported
    plainly, for ``reason``."""
    f = _counters["fallbacks"]
    f[reason] = f.get(reason, 0) + 1
    if _verbose:
        _say(f"fallback {name}: {reason}", 1)


# What the C servers (native/archive/loader/serve.c) count, as five native
# 64-bit integers: served, searches replayed, bytes served, load ns, bytes
# released.  This interpreter's, as _counters is (stats() adds them).
_served_counts = bytearray(5 * 8)


def unserved():
    """Return (missed, stale): names of imports the archive did not serve.

    ``(missed, stale)``, the sets of names (live: read, not changed) of
    this run's imports the archive did not hold, and of those it held but
    could not serve because their files changed (what AUTO writes into the
    archive at exit)."""
    return missed, stale


def _stale_fallback(name, reason):
    stale.add(name)
    _fallback(name, reason)


def stats():
    """Return this process's counters, as a dict.

    Counters of this process: ``served`` (modules executed from the
    archive), ``fallbacks`` (reason -> count of archived modules imported
    plainly), ``bytes_loaded`` (heap bytes of loaded modules), ``load_ms``
    (time in native loads, ms), ``open_ms`` (time to open the archive, ms),
    ``released_bytes`` (heap given back after module bodies ran -- their code
    objects and what only those used -- or queued to be given back by the
    read-ahead thread once imports pause),
    ``startup_plain`` (archive hits the interpreter itself imported before
    anything had loaded the native module, imported plainly without further
    checks: :func:`pycds._config.imported_by_interpreter`), ``archive`` (path),
    ``modules_in_archive``, ``prefetched`` (modules
    whose chunk the read-ahead thread had read and relocated before their
    import) and ``searches_replayed`` (modules found without reading a
    directory: every directory of their search had the mtime the dump run
    recorded, pycds._search)."""
    if _installed is not None:
        _installed.archive.release_finished()   # bring released_bytes up to date
    out = dict(_counters)
    out["fallbacks"] = dict(_counters["fallbacks"])
    native = _installed.archive._native if _installed is not None else None
    out["prefetched"] = native.prefetched() if native is not None else 0
    if _search_mod is not None:
        out["searches_replayed"] += _search_mod.replayed
    served, replayed, nbytes, ns, released = memoryview(_served_counts).cast("Q")
    out["served"] += served
    out["searches_replayed"] += replayed
    out["bytes_loaded"] += nbytes
    out["load_ms"] += ns / 1e6
    out["released_bytes"] += released
    return out


class _Archive:
    """An opened archive: its file, native hit path and native handle.

    An opened archive: its file (pycds._nativeapi.ArchiveFile), the
    native hit path, and the native handle that loads its modules, opened
    where a name's tag is first found (:meth:`open_handle`)."""

    def __init__(self, file, check, verify=False, prefetch=True, release=1):
        self.file = file
        self.check = check
        self.verify = verify
        self.prefetch = prefetch
        # 3.10 chunks are kept whole (native/archive/loader/release.c).
        self.release_mode = release if sys.version_info >= (3, 11) else 0
        # (entry, spec) of modules handed out, innermost import last: their
        # memory is given back once their body has run (release_finished).
        self.ran = []
        self.path = file.path
        self.disabled = False
        self.damaged = False    # disabled for damage found in the file
        self._N = None          # pycds._nativeapi
        self._native = None     # the native handle, once opened
        self._fast = None       # the native hit path
        self._index = None
        self.server = None      # the served hit in C (start)
        self.code_type = None   # its ArchivedCode type
        self._open_lock = _thread.allocate_lock()   # held while opening the handle
        self._opener = None     # thread id while it opens the handle
        self._open_waited_out = False   # an import gave up waiting for that
        self.finder = None      # the CDSFinder serving from it

    @property
    def index(self):
        # The index read in Python (pycds._archive), for what the native
        # hit path declines: made on first use.
        if self._index is None:
            from .._archive import Index
            self._index = Index(self.file)
        return self._index

    @property
    def fast(self):
        """The native hit path (a pycds._nativeapi.IndexFinder)."""
        return self._fast

    @fast.setter
    def fast(self, fast):
        # Another hit path (a test's): the server's, over the first, stops.
        self._fast = fast
        if self.server is not None:
            self.server.stop()

    def start(self, N):
        """Start the native hit path and its server over the file.

        The native hit path over the file, with ``N`` (pycds._nativeapi),
        and its server (native/archive/loader/serve.c), whose find_spec
        becomes the finder's own where a native verdict may serve."""
        self._N = N
        fast = self._fast = N.IndexFinder(self.file, -1, self.check != "unchecked",
                                          self._serving(), self.open_handle)
        finder = self.finder
        serving = finder is not None and self.check == "mtime" and fast.serving \
            and not _verbose
        # (The finder's Python find_spec, for what the server does not serve.)
        slow = CDSFinder.find_spec.__get__(finder) if finder is not None else None
        self.server, self.code_type = N.serve(fast, dict(
            methods=ArchivedCode, finder_slow=slow, release=self.release_finished,
            ran=self.ran, missed=missed, ctx=fast._ctx, loader_type=SourceFileLoader,
            spec_from=spec_from_file_location, plain_reduce=_PlainReduce,
            fix_filename=_fix_co_filename, archive=self, counts=_served_counts,
            find_on=serving, checked=self.check != "unchecked",
            release_mode=bool(self.release_mode), call_on=not _verbose))
        if serving:
            finder.find_spec = self.server.find_spec

    def open_handle(self):
        """Open the native handle; return True when open, else False.

        Open the native handle, on the file's descriptor (moved out of
        the program's way: native/archive/loader/descriptor.c), and read
        the index through it; True when open.  The first archived import
        does, so that until then a SHARE process holds no descriptor.  False
        where that fails (the archive is then disabled, after one warning),
        while this thread opens it (an audit hook of the program importing
        as the file is opened), or while another thread does, waited for at
        most :data:`OPEN_WAIT_S` (that thread may be waiting for this one).
        Raises only what the program's state raised
        (PROGRAM_STATE_ERRORS)."""
        me = _thread.get_ident()
        if self._native is not None:
            return True
        if self._opener == me or self.disabled:
            return False
        if not self._open_lock.acquire(True, 0 if self._open_waited_out else OPEN_WAIT_S):
            self._open_waited_out = True
            return False
        try:
            if self._native is None and not self.disabled:
                self._opener = me
                file = self.file
                try:
                    native = self._N.NativeArchive(
                        file.descriptor(), file.header, file.meta.get("layout", ""),
                        self.verify, PREFETCH_WINDOW if self.prefetch else 0,
                        self.release_mode, file.meta.get("version_counter"))
                    # One descriptor on the archive, out of the program's way.
                    file.adopt(native.fd)
                    self._fast.use(native.fd)
                    native.serve_with(self.server)
                    self._native = native
                except Exception as e:
                    if isinstance(e, PROGRAM_STATE_ERRORS):
                        raise
                    # Another build's layout, a bad mapping, a file replaced
                    # by an unusable one: the whole archive is unusable.
                    self.disable(str(e))
                finally:
                    self._opener = None
            return self._native is not None
        finally:
            self._open_lock.release()

    def _serving(self):
        # What the native verdict also checks for the finder (None under
        # -vv, whose searches are never replayed: pycds._config.search_replayable).
        if self.finder is None or sys.flags.verbose >= 2:
            return None
        return (self.finder, PathFinder, STOCK_SEARCH,
                STOCK_LOADER_ATTRS + STOCK_SEARCH_FUNCS)

    def disable(self, reason, damaged=False):
        # ``damaged``: the file is (the warning says what to do about it).
        if not self.disabled:
            self.disabled = True
            self.damaged = damaged
            if self.server is not None:
                self.server.stop()
            self.file.close()    # its own descriptor, if it holds one
            if damaged:
                from .._advice import refusal
                _warn(f"archive {self.path} ignored: "
                      f"{refusal(self.path, ArchiveFormatError(reason), _auto)}")
            else:
                _warn(f"archive {self.path} ignored: {reason}")

    def load_code(self, entry):
        """Return entry's archived code object, or None if unusable.

        The archived code object of ``entry`` (an :class:`ArchivedCode`
        or an index entry), or None (after a warning or a fallback line) when
        it cannot be used."""
        if self.disabled:
            return None
        t0 = time.perf_counter()
        native = self._native
        try:
            code = native.load(entry)
        except Exception as e:
            if program_raised(e):
                raise
            self.load_failed(entry, e)
            return None
        _counters["load_ms"] += (time.perf_counter() - t0) * 1e3
        _counters["bytes_loaded"] += entry.chunk_len
        return code

    def load_failed(self, entry, e):
        """Fall back for entry or disable the archive, as e means.

        What loading ``entry`` failing with ``e`` (not the program's)
        means: a fallback line for this module, or the archive disabled."""
        if load_failure(e) == FALLBACK:
            if e.code == E_STATE:
                # Failed before (said then), or being loaded by a stage 2
                # that ran Python code (native/archive/loader/archive.h).
                _fallback(entry.name, str(e).rsplit(": ", 1)[-1])
            else:
                _fallback(entry.name, f"archive entry unusable ({e})")
        elif self.file.fd_lost():
            # (The index reads through the native side's descriptor.)
            self.disable(_LOST_FD)
        else:
            # PYCDS_E_CORRUPT, PYCDS_E_IO, PYCDS_E_ARG (an index entry
            # out of range) or a malformed entry: the file is damaged or
            # was replaced; trust none of it from now on (modules already
            # loaded passed their checks and stay).
            self.disable(str(e), damaged=True)

    def release_finished(self):
        """Give back the memory only the finished module bodies used.

        Give back what only the bodies of modules that have run used
        (native/archive/loader/release.c), as plain import frees their code objects.

        Called on the next import, not from the loader's exec_module: a
        frame of pycds around every module body would show in tracebacks
        and move warnings' stacklevel.  A body has run when importlib has
        cleared its spec's ``_initializing`` (``_load_unlocked`` in
        importlib/_bootstrap.py, 3.10-3.13; also when the body failed).
        Imports nest, so the modules still running sit below the ones that
        are done: stop at the first still running.  What a module still
        holds (a traceback holding its frame, say) is kept by the native
        liveness check, never by this timing.  Raises only what the program
        raised through it (:func:`pycds.errors.program_raised`)."""
        ran = self.ran
        native = self._native
        while ran and native is not None:
            try:
                entry, spec = ran.pop()
            except IndexError:       # another thread emptied it
                break
            if getattr(spec, "_initializing", False):
                ran.append((entry, spec))
                break
            try:
                _counters["released_bytes"] += native.release(entry)
            except Exception as e:
                if program_raised(e):
                    raise
                if _verbose >= 2:
                    _say(f"release {entry.name}: {e}", 2)


class ArchivedCode:
    """A served module's loader's ``get_code`` until the code is handed out.

    The loader of a served module is the stock ``SourceFileLoader`` that
    plain import would use: its type and repr are plain import's (code that
    looks loaders up by exact type, as CPython's own test_import does, sees
    no difference).  Until the module's code is handed out its instance dict
    holds this object under ``get_code``, where attribute lookup finds it
    before the class's method, and a :class:`_PlainReduce` under
    ``__reduce_ex__``, which copy and pickle look up on the instance: a copy
    or a pickle of the loader (or of a spec holding it) is a plain loader
    for the same file, with nothing of pycds (the archive belongs to this
    process).  importlib's ``exec_module`` calls it
    (``_LoaderBasics.exec_module``, importlib/_bootstrap_external.py,
    3.10-3.13); it takes both entries out of the loader and returns the
    archived code object, so from then on the loader is exactly a plain one
    (a later ``get_code`` reads the ``.pyc``, as with plain import).  If the
    archived code cannot be loaded, the stock ``get_code`` runs."""

    # Instances are of the type native/archive/loader/serve.c makes with this
    # class as its base (_Archive.code_type): ``loader``, ``archive``,
    # ``name``, ``number`` and ``chunk_len`` of the module's index entry,
    # the source's ``mtime_ns`` and ``size`` as find_spec found them (not
    # the whole entry, held by every served module's loader for the life
    # of the process), and ``entry``, the object itself, for
    # _Archive.load_code.  Its call is C: this class's _call_py where any
    # of its conditions does not hold.
    __slots__ = ()

    @staticmethod
    def install(loader, archive, name, number, chunk_len, mtime_ns, size):
        d = loader.__dict__
        d["get_code"] = archive.code_type(archive.server, loader, name, number, chunk_len,
                                          mtime_ns, size)
        d["__reduce_ex__"] = _PlainReduce((loader.name, loader.path))

    def __reduce__(self):
        # (Pickled on its own: the stock get_code of a plain loader.)
        loader = self.loader
        return (getattr, (SourceFileLoader(loader.name, loader.path), "get_code"))

    # Two specs found for one module compare equal, as plain import's do
    # (FileLoader.__eq__ compares the loaders' dicts).  Not by the loaders
    # themselves: their dicts hold these.
    def __eq__(self, other):
        if not isinstance(other, ArchivedCode):
            return NotImplemented
        return (self.archive is other.archive and self.number == other.number
                and self.loader.name == other.loader.name
                and self.loader.path == other.loader.path)

    def __hash__(self):
        return hash((self.number, self.loader.name))

    def _failed(self, fullname, rc):
        # The C call's load failed with status rc: as _Archive.load_code.
        archive = self.archive
        archive.load_failed(self, archive._N.error(rc, f"load {self.name}"))
        return SourceFileLoader.get_code(self.loader, fullname)

    def _call_py(self, fullname):
        loader = self.loader
        if fullname != loader.name:
            return SourceFileLoader.get_code(loader, fullname)
        # Plain from now on (and the loader -> self cycle is gone).  Two
        # threads running one spec may both get here: both are served.
        d = loader.__dict__
        if d.get("get_code") is self:
            d.pop("get_code", None)
            d.pop("__reduce_ex__", None)
        if loader_patched():
            # Plain import runs the program's replacement: so does this
            # (CDSFinder.find_spec checks first: this is for a replacement
            # made between the two).
            _fallback(fullname, "SourceFileLoader is patched")
            return SourceFileLoader.get_code(loader, fullname)
        archive = self.archive
        ref = self
        # importlib runs exec_module with the module in sys.modules, its
        # spec marked _initializing (_load_unlocked, _exec; 3.10-3.13).
        spec = getattr(sys.modules.get(fullname), "__spec__", None)
        if archive.check != "unchecked" and not getattr(spec, "_initializing", False):
            # Run later than found (importlib.util.LazyLoader runs the
            # module at its first attribute access; runpy calls get_code
            # itself): plain import reads the source's stat now.  (Within
            # an import statement, find_spec checked it a moment ago.)
            st = (_pyc or _pyc_rules()).stat_or_none(loader.path)
            if st is None or st.st_mtime_ns != ref.mtime_ns or st.st_size != ref.size:
                _stale_fallback(fullname, "source changed since it was found")
                return SourceFileLoader.get_code(loader, fullname)
        code = archive.load_code(ref)
        if code is None:
            return SourceFileLoader.get_code(loader, fullname)
        # As plain import names a .pyc's code after the source it found
        # (_compile_bytecode): the path of a moved tree's new place.
        _fix_co_filename(code, loader.path)
        if archive.release_mode:
            # Its spec says when the body is done.
            archive.ran.append((ref, spec))
        _counters["served"] += 1
        if _verbose:
            _say(f"served {fullname}", 1)
        return code


class _PlainReduce(tuple):
    """The ``__reduce_ex__`` of a served module's loader: a plain loader's.

    The ``__reduce_ex__`` of a served module's loader until its code is
    handed out (see :class:`ArchivedCode`): that of a plain loader for the
    same file, ``(name, path)``.  (A tuple: made without running Python
    code, compared by value.)"""

    __slots__ = ()

    def __call__(self, protocol):
        return SourceFileLoader(self[0], self[1]).__reduce_ex__(protocol)


def served_loader(loader):
    """Return whether loader will hand out archived code.

    Whether ``loader`` will hand out archived code (its module has not run
    yet): it has an :class:`ArchivedCode` as ``get_code``."""
    return isinstance(getattr(loader, "__dict__", {}).get("get_code"), ArchivedCode)


def _module_entry(*fields):
    # pycds._archive's ModuleEntry, imported where a hit is judged in Python
    # (a hit the native verdict did not take).
    global _module_entry
    from .._archive import ModuleEntry
    _module_entry = ModuleEntry
    return ModuleEntry(*fields)


def _first_search(*args):
    # pycds._search is imported on the first archive hit, not at start-up
    # (a program that imports nothing archived does not pay for it).
    global _search_find_spec, _search_mod
    from .. import _search
    _search_find_spec = _search.find_spec
    _search_mod = _search
    return _search.find_spec(*args)


_search_find_spec = _first_search
_search_mod = None      # pycds._search, once imported


def _pyc_rules():
    # pycds._pyc, imported where a check is made in Python (a hit the
    # native verdict did not take), not on a replayed hit's path.
    global _pyc
    from .. import _pyc as rules
    _pyc = rules
    return rules


_pyc = None

# PathFinder's: the working directory for the path entry ''.
_getcwd = _os.getcwd


def _hooks_pending(search):
    """Return whether replaying search runs path hooks.

    Whether replaying ``search`` (an entry's recorded search, or None)
    runs path hooks: a step's path entry has no finder in
    ``sys.path_importer_cache`` yet (PathFinder._path_importer_cache's key:
    the working directory for '')."""
    if search is None:
        return False
    cache = sys.path_importer_cache
    try:
        for step in search[0]:
            if (step[0] or _getcwd()) not in cache:
                return True
    except Exception:
        return True
    return False


def _run_stock_hooks(search, path):
    """Run search's pending path hooks; return whether finders are as assumed.

    Run the path hooks of the entries of the recorded ``search`` not in
    ``sys.path_importer_cache`` yet, with ``PathFinder``'s own
    ``_path_importer_cache``, in the search's order: what plain import's
    search does on its way to the archived module once the native verdict
    has said that it gets there (``path``: the path list searched, None for
    ``sys.path``).  Then whether each step's entry has the finder the
    verdict assumed: a FileFinder of the recorded directory with the stock
    loaders (None where the dump found none).  Raises only what the program
    raised through it, as from plain import's search."""
    if path is None:
        path = sys.path
    try:
        for i, (entry, directory, _) in enumerate(search[0]):
            now = path[i]
            if type(now) is not str or now != entry:
                return False
            finder = PathFinder._path_importer_cache(now)
            if directory is None:
                if finder is not None:
                    return False
            elif type(finder) is not FileFinder or finder.path != directory \
                    or finder._loaders != FILE_LOADERS:
                return False
    except Exception as e:
        if program_raised(e):
            raise
        return False
    return True


def _cached(spec, entry):
    """Return spec.cached for entry's own origin, taken from the entry.

    ``spec.cached`` for the spec of ``entry``'s own origin, taken from
    the entry where ModuleSpec would compute the same path: the dump's
    ``spec.cached`` for that origin (the same cache tag and optimization
    level: the archive is this interpreter's), made with no
    ``sys.pycache_prefix``, and none now (``cache_from_source`` costs about
    a sixth of a hit).  The spec keeps it, as ModuleSpec keeps what it
    computes."""
    pyc = entry.pyc_path
    if spec._cached is None and sys.pycache_prefix is None and \
            pyc.startswith(entry.origin.rpartition("/")[0] + "/__pycache__/"):
        spec._cached = pyc
    return spec.cached


def _path_finder_next(finder):
    """Return whether finder stands just before the stock PathFinder.

    Whether ``finder`` stands just before the stock PathFinder on
    ``sys.meta_path``, as install() put it.  Only then is PathFinder's answer
    the one plain import would get after ``finder`` declined: a program may
    have put a finder of its own in between, or in PathFinder's place (to
    refuse imports, to log them), or removed PathFinder.  Never raises."""
    try:
        meta_path = sys.meta_path
        for i in range(len(meta_path) - 1):
            if meta_path[i] is finder:
                return meta_path[i + 1] is PathFinder
    except Exception:
        pass
    return False


class CDSFinder:
    """Meta path finder serving archived modules (see the module docstring)."""

    def __init__(self, archive):
        self.archive = archive
        archive.finder = self

    # Start of importlib.abc.MetaPathFinder interface

    def find_spec(self, fullname, path=None, target=None, _hit=None):
        # Where a native verdict may serve, the finder's own find_spec is
        # its server's (native/archive/loader/serve.c), which calls this
        # where it does not serve, with ``_hit``, its native hit's facts
        # (the list without the verdict), where it has them.
        archive = self.archive
        ran = archive.ran
        if ran and not getattr(ran[-1][1], "_initializing", False):
            archive.release_finished()
        if archive.disabled:
            return None
        if _hit is not None:
            entry, facts, verdict = _hit[0], _hit, False
        else:
            try:
                # Once the native module is loaded, the lookup and the stats the
                # checks below take are made in one native call; what they mean
                # is judged here and in pycds._search and pycds._pyc, as for
                # facts Python took (native/archive/loader/find.c).
                fast = archive.fast
                verdict = False
                if archive.check == "mtime":
                    facts = fast.hit(fullname, path)
                    if facts:
                        verdict = facts.pop()
                else:
                    facts = fast.find(fullname)
                if facts is False:
                    if archive._native is None:
                        # (Not opened: by this thread now, or by another, or it
                        # failed, said then.)
                        if not archive.disabled:
                            _fallback(fullname, "imported while the archive opens")
                        return None
                    if is_hook_module(fullname):
                        return None     # (never archived; the index reader is one)
                    entry, facts = archive.index.lookup(fullname), None
                elif facts is None:
                    entry = None
                elif verdict and fast.serving:
                    # (served from the entry's tuple, below: the native verdict
                    # checked the import system's parts too.  Without `serving`,
                    # under -vv, searches are never replayed: judged below.)
                    entry = None
                else:
                    # (The entry's tuple, made a ModuleEntry below where a hit is
                    # judged in Python.)
                    entry, verdict = facts[0], False
            except Exception as e:
                if program_raised(e):
                    raise
                if archive.file.fd_lost():
                    archive.disable(_LOST_FD)
                else:
                    archive.disable(f"index unreadable ({e})", damaged=True)
                return None
        if verdict:
            return self._verdict_spec(fullname, facts[0])
        if entry is None:
            missed.add(fullname)
            if _verbose >= 2:
                _say(f"not in archive {fullname}", 2)
            return None
        if not _path_finder_next(self):
            # Plain import would ask what now stands there (a program's
            # finder put in PathFinder's place, or before it), or nothing.
            _fallback(fullname, "PathFinder does not follow pycds on sys.meta_path")
            return None
        if facts is not None and _hooks_pending(entry[-1]):     # (the tuple's search)
            # The search runs path hooks (as PathFinder would): the native
            # call's stats, taken before them, may be out of date.
            facts = None
            if archive.check == "mtime" and search_replayable() and not loader_patched() \
                    and path_hooks_stock():
                # importlib's own hooks: the native verdict judges the
                # FileFinders they would make.  Where plain import takes the
                # archived module, its search runs them all, in order, and
                # so does this (_run_stock_hooks, called from here: as deep
                # in the stack as PathFinder calls them); elsewhere the
                # search below runs them where PathFinder would.  What they
                # look up as they run (zipimport's globals, os.stat) may be
                # the program's: the verdict is taken again after them.
                try:
                    hit = archive.fast.hit(fullname, path, True)
                    if hit and hit.pop() and _run_stock_hooks(entry[-1], path):
                        hit = archive.fast.hit(fullname, path)
                        if hit and hit.pop():
                            return self._verdict_spec(fullname, hit[0])
                except Exception as e:
                    if program_raised(e):
                        raise
        if type(entry) is tuple:
            entry = _module_entry(*entry)
        # PathFinder's answer, from the dump run's directory stamps where
        # they hold (pycds._search).
        replays = _search_mod.replayed if _search_mod is not None else 0
        spec = _search_find_spec(fullname, path, target, entry.origin, entry.search,
                                 facts and facts[1:3])
        if facts is not None and _search_mod.replayed == replays:
            # Not answered from the stamps alone: the search asked a finder
            # (a changed directory's, a program's, PathFinder's own), whose
            # work may have changed the files since the native call's stats.
            facts = None
        if spec is None:
            _fallback(fullname, "not found on the search path")
            return None
        if type(spec.loader) is not SourceFileLoader:
            _fallback(fullname, "plain import uses another loader")
            return spec
        if loader_patched():
            # Its replacement runs as with plain import, without a frame of
            # pycds around it (in a traceback of what it raises, say).
            _fallback(fullname, "SourceFileLoader is patched")
            return spec
        moved = False
        if spec.origin != entry.origin:
            # The archived tree moved (a venv built at one path and run at
            # another): served where the files at the new place are the
            # dumped ones, checked there.
            entry = entry.moved_to(spec.origin, spec.cached,
                                   spec.submodule_search_locations is not None)
            if entry is None:
                _stale_fallback(fullname, "resolves to another file")
                return spec
            facts, moved = None, True
        # (PYCDSCHECK=unchecked trusts the dumped files, not others.)
        check = "mtime" if moved and archive.check == "unchecked" else archive.check
        cached = spec.cached if moved else _cached(spec, entry)
        reason, st = (_pyc or _pyc_rules()).check(entry, check, cached, facts and facts[3:])
        if reason is not None:
            _stale_fallback(fullname, f"resolves to another file ({reason} there)"
                            if moved else reason)
            if reason == "source is gone":
                # Gone within the directory's mtime granularity: the
                # listing replayed from the dump may be out of date.
                spec = PathFinder.find_spec(fullname, path, target)
            return spec
        if st is None:    # (not stat'ed: PYCDSCHECK=unchecked)
            mtime_ns, size = entry.mtime_ns, entry.size
        else:
            mtime_ns, size = st[0], st[1]
        ArchivedCode.install(spec.loader, archive, fullname, entry.number, entry.chunk_len,
                             mtime_ns, size)
        return spec

    def _verdict_spec(self, fullname, e):
        """Return the spec of a native verdict for index entry tuple e.

        The spec of a native verdict for index entry tuple ``e``: the
        search replays and the files are the dumped ones
        (native/archive/loader/find.c).  Built as pycds._search builds it,
        with the .pyc path as ModuleSpec computes it (_cached)."""
        origin, pkg_dir = e[2], e[20][1]
        loader = SourceFileLoader(fullname, origin)
        spec = spec_from_file_location(
            fullname, origin, loader=loader,
            submodule_search_locations=None if pkg_dir is None else [pkg_dir])
        spec._cached = e[8]
        _counters["searches_replayed"] += 1
        ArchivedCode.install(loader, self.archive, fullname, e[0], e[14], e[5], e[6])
        return spec

    def invalidate_caches(self):
        pass

    # End of importlib.abc.MetaPathFinder interface


def _native_api():
    from .. import _nativeapi
    return _nativeapi


def install(config, replacing=None, startup_path=None, started_plain=(), first=None):
    """Open the archive and install a CDSFinder; return it, or None.

    Open ``config.archive`` and put a :class:`CDSFinder` on
    ``sys.meta_path`` before PathFinder, or in the place of ``replacing``
    (SHARE's stand-in there since start-up, pycds._Opener; not there: the
    program took it away, and nothing is installed).  ``startup_path``:
    ``sys.path`` as start-up left it (default: as it is now).
    ``started_plain``: the names the stand-in let through as the
    interpreter's imports, counted as such where the archive has them
    (``startup_plain``).  ``first``: the name being imported, for which
    the stand-in opens the archive: where the archive holds it, the
    descriptor of the opening is kept for its load (not opened again).  Loads the native module, which opens the archive
    (native/archive/loader/open.c).  Returns the finder, or None (after one
    warning) when the archive cannot be used."""
    global _installed, _verbose, _startup_path, _auto
    if _installed is not None:
        return _installed
    if replacing is not None and replacing not in sys.meta_path:
        return None
    _startup_path = list(sys.path) if startup_path is None else startup_path
    t0 = time.perf_counter()
    _verbose = config.verbose
    if _verbose:
        # Imported now, not by the first line printed: from inside
        # find_spec that import would come back to this finder.
        from .. import _log
        _log.level = max(_log.level, _verbose)
    # The first SHARE process of a process tree names its interpreter facts
    # for the processes it starts, which inherit its archive (PYCDSARCHIVE).
    global _tree_root
    session, _tree_root = _config.share_session()
    auto = _auto = config.mode == MODE_AUTO
    try:
        N = import_native(_native_api, _startup_path)
    except Exception as e:
        # Loading the native module runs imports the program does not make
        # (_cffi_backend), which its audit hooks (or, where it is not on the
        # start-up search path, its meta path finders) may refuse with
        # anything: whatever the program raised there is a reason not to use
        # the archive, not an error of the program's import.
        if isinstance(e, PROGRAM_STATE_ERRORS):
            raise
        if native_refused_here(e):
            # (Archived objects and the native state are the main
            # interpreter's.)
            if _verbose:
                _say(f"archive {config.archive} not used: {e}", 1)
        else:
            _warn(f"archive {config.archive} ignored: {e}")
        return None
    try:
        file = N.ArchiveFile(config.archive, out_of_the_way=True, hold=first is not None)
    except ArchiveFormatError as e:
        global open_failure
        open_failure = str(e)
        if isinstance(e, ForeignArchiveError) and session != _config.interpreter_tag():
            # A child run by another Python or with other flags (-O) was
            # handed its parent's archive, not one made for it: plain
            # import, as without pycds, and nothing on its stderr.
            if _verbose:
                _say(f"archive {config.archive} not used: {e} (the archive of "
                     "a parent process run by another interpreter)", 1)
        elif auto and (isinstance(e, ForeignArchiveError)
                       or not os.path.lexists(config.archive)):
            # AUTO writes the first archive, or replaces the one another
            # interpreter (or an older pycds) made, at exit: nothing wrong.
            if _verbose:
                _say(f"archive {config.archive} not used: {e}; AUTO writes one at exit", 1)
        else:
            from .._advice import refusal
            _warn(f"archive {config.archive} ignored: {refusal(config.archive, e, auto)}")
        return None
    try:
        finder = CDSFinder(_Archive(file, config.check, config.verify,
                                    config.prefetch, config.release))
        finder.archive.start(N)
        _count_started_plain(finder.archive, started_plain)
        if first is not None and not finder.archive.fast.holds(first):
            file.let_go()     # (held by no process that imports nothing archived)
    except BaseException:
        file.close()
        raise
    meta_path = sys.meta_path
    try:
        if replacing is not None:
            meta_path[meta_path.index(replacing)] = finder
        else:
            meta_path.insert(meta_path.index(PathFinder), finder)
    except ValueError:       # (PathFinder taken away; or, now, `replacing`)
        meta_path.append(finder)
    _installed = finder
    _counters["archive"] = config.archive
    _counters["modules_in_archive"] = file.header.nmodules
    _counters["open_ms"] = (time.perf_counter() - t0) * 1e3
    if not auto:
        # (AUTO rewrites a stale archive instead: pycds.auto.)
        import atexit
        atexit.register(_report_stale)
    return finder


def _count_started_plain(archive, names):
    # The interpreter's imports the stand-in left plain that the archive
    # holds.  (An unreadable index: the first lookup of the program's
    # import says so.)
    try:
        for name in names:
            if archive.fast.holds(name):
                _counters["startup_plain"] += 1
                if _verbose:
                    _say(f"plain {name}: imported by the interpreter before the "
                         "archive was opened", 1)
    except Exception as e:
        if program_raised(e):
            raise



def _report_stale():
    # The SHARE run's exit: one line when much of the archive was stale.
    if stale and _tree_root == os.getpid() and _installed is not None:
        from . import stale_report as _stale
        _stale.report(len(stale), stats()["served"], _counters["archive"])


def uninstall():
    """Remove the installed finder from ``sys.meta_path`` (for tests)."""
    global _installed
    if _installed is not None:
        try:
            sys.meta_path.remove(_installed)
        except ValueError:
            pass
        _installed = None
