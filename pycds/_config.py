"""The PYCDS* environment variables, parsed in one place.

=================  =========================================================
``PYCDSMODE``      ``AUTO`` (share what the archive still serves, rewrite it at
                   exit when it no longer fits: pycds.auto), ``DUMP``,
                   ``SHARE``, ``TRACE`` or ``MANUALLY`` (nothing at start-up;
                   the API is used by hand).  Unset: pycds is off.
``PYCDSARCHIVE``   archive path; default: one per interpreter and program in
                   ``$XDG_CACHE_HOME/pycds/`` (else ``~/.cache/pycds/``).
``PYCDSLIST``      module list written by TRACE (default ``pycds.lst``).
``PYCDSVERBOSE``   unset: warnings and the line that says where a DUMP wrote
                   what; 0: warnings only; 1 (a line per module), 2 (more
                   detail).
``PYCDSCHECK``     source validation: ``mtime`` (default: mtime and size, as
                   timestamp .pyc files), ``hash`` (source hash, as PEP 552
                   checked pycs) or ``unchecked`` (immutable deployments).
``PYCDSVERIFY``    ``1``: also check every loaded chunk's object structure
                   (against crafted, re-signed archives); default ``0``.
``PYCDSPREFETCH``  ``1`` (default): read and relocate the chunks that follow
                   the one being imported on a second CPU; ``0``: off.
``PYCDSSETTLE``    seconds without a new import after which DUMP and AUTO
                   write the archive before the program ends (default 5; 0:
                   only at exit): pycds.dumping.settle.
``PYCDSRELEASE``   ``1`` (default): once a module body has run, give back
                   the memory of what only it used (its code object, dead
                   interned-string copies); ``0``: keep it; ``protect``
                   (debugging): make those pages inaccessible instead, so
                   that any use of them faults at once.
=================  =========================================================

Under ``-E`` or ``-I`` (``sys.flags.ignore_environment``) pycds stays off, so
that an isolated interpreter cannot be steered by the environment.  The table
is documented in docs/env-vars.md.  Also the facts of this interpreter an
archive must be made for, and the SHARE session a process belongs to, taken
at start-up, and the package's version (``pycds.__version__``; read as text
by the build).

Also the import system as pycds started with it: what plain import uses
(``SourceFileLoader``'s parts, the search's methods, the path hooks,
``FileFinder``'s loaders), taken when this module is first imported -- at
the ``.pth`` line, or at the program's ``import pycds`` -- so that a later
replacement by the program is seen by comparing identities
(:func:`loader_patched`, :func:`search_replayable`,
:func:`path_hooks_stock`); whether a name is pycds's own
(:func:`is_hook_module`), whether this is the main interpreter, whether the
interpreter itself started the import being found, and the native module's
import with pycds's own ``_cffi_backend`` (:func:`import_native`).  (One
module: each module imported at start-up costs every SHARE run its
import.)  Imports only builtins and importlib's bootstrap: this runs at
start-up from the .pth file.
"""

import _thread
import os
import sys

import _frozen_importlib_external as _bootstrap_external

__version__ = "0.1.0"

MODE_OFF = 0
MODE_TRACE = 1
MODE_DUMP = 2
MODE_SHARE = 3
MODE_MANUALLY = 4
MODE_AUTO = 5

_MODES = {
    "": MODE_OFF,
    "OFF": MODE_OFF,
    "TRACE": MODE_TRACE,
    "DUMP": MODE_DUMP,
    "SHARE": MODE_SHARE,
    "MANUALLY": MODE_MANUALLY,
    "AUTO": MODE_AUTO,
}
CHECKS = ("mtime", "hash", "unchecked")
# PYCDSRELEASE values (the native PYCDS_RELEASE_* modes)
RELEASE_OFF, RELEASE_ON, RELEASE_PROTECT = 0, 1, 2
_RELEASES = {"0": RELEASE_OFF, "1": RELEASE_ON, "protect": RELEASE_PROTECT}
# PYCDSSETTLE's default, seconds.
DEFAULT_SETTLE_S = 5.0


class Config:
    """Parsed settings.  ``problems`` lists messages for bad values."""

    __slots__ = ("mode", "archive", "listfile", "verbose", "check", "verify",
                 "prefetch", "release", "settle", "problems", "quiet")

    def __init__(self, mode=MODE_OFF, archive="", listfile="", verbose=0,
                 check="mtime", problems=(), verify=False, prefetch=True,
                 release=RELEASE_ON, settle=DEFAULT_SETTLE_S, quiet=False):
        self.mode = mode
        self.quiet = quiet      # PYCDSVERBOSE=0: no line about what DUMP wrote
        self.settle = settle
        self.release = release
        self.verify = verify
        self.prefetch = prefetch
        self.archive = archive
        self.listfile = listfile
        self.verbose = verbose
        self.check = check
        self.problems = list(problems)

    def __repr__(self):
        return (f"Config(mode={self.mode}, archive={self.archive!r}, "
                f"listfile={self.listfile!r}, verbose={self.verbose}, "
                f"check={self.check!r})")


def from_environ(environ=None, flags=None):
    """Return the :class:`Config` for ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    flags = sys.flags if flags is None else flags
    if flags.ignore_environment:
        return Config()
    problems = []
    raw = environ.get("PYCDSMODE", "")
    mode = _MODES.get(raw.strip().upper())
    if mode is None:
        problems.append(f"PYCDSMODE={raw!r} is not one of AUTO, DUMP, SHARE, "
                        f"TRACE, MANUALLY, OFF; pycds is off")
        mode = MODE_OFF
    verbose = 0
    rawv = environ.get("PYCDSVERBOSE", "0").strip() or "0"
    quiet = environ.get("PYCDSVERBOSE", "").strip() == "0"
    try:
        verbose = max(0, min(2, int(rawv)))
    except ValueError:
        problems.append(f"PYCDSVERBOSE={rawv!r} is not 0, 1 or 2; using 0")
    check = environ.get("PYCDSCHECK", "mtime").strip().lower() or "mtime"
    if check not in CHECKS:
        problems.append(f"PYCDSCHECK={check!r} is not one of "
                        f"{', '.join(CHECKS)}; using mtime")
        check = "mtime"
    rawverify = environ.get("PYCDSVERIFY", "0").strip() or "0"
    verify = rawverify == "1"
    if rawverify not in ("0", "1"):
        problems.append(f"PYCDSVERIFY={rawverify!r} is not 0 or 1; using 0")
    rawpf = environ.get("PYCDSPREFETCH", "1").strip() or "1"
    prefetch = rawpf != "0"
    if rawpf not in ("0", "1"):
        problems.append(f"PYCDSPREFETCH={rawpf!r} is not 0 or 1; using 1")
    rawrel = environ.get("PYCDSRELEASE", "1").strip().lower() or "1"
    release = _RELEASES.get(rawrel)
    if release is None:
        problems.append(f"PYCDSRELEASE={rawrel!r} is not 0, 1 or protect; using 1")
        release = RELEASE_ON
    rawsettle = environ.get("PYCDSSETTLE", "").strip()
    settle = DEFAULT_SETTLE_S
    if rawsettle:
        try:
            settle = float(rawsettle)
            if not 0 <= settle < float("inf"):
                raise ValueError
        except ValueError:
            problems.append(f"PYCDSSETTLE={rawsettle!r} is not a finite number of "
                            f"seconds >= 0; using {DEFAULT_SETTLE_S:g}")
            settle = DEFAULT_SETTLE_S
    archive = environ.get("PYCDSARCHIVE", "")
    if not archive and mode in (MODE_DUMP, MODE_SHARE, MODE_AUTO):
        archive = default_archive_path(environ)
        if not archive:
            problems.append(f"PYCDSMODE={raw.strip()} without PYCDSARCHIVE needs a cache "
                            f"directory: XDG_CACHE_HOME is unset or relative and there is "
                            f"no home directory (or it does not exist); pycds is off")
            mode = MODE_OFF
    listfile = environ.get("PYCDSLIST", "") or "pycds.lst"
    if mode != MODE_OFF:
        # Relative to the directory the program starts in, not the one it
        # happens to be in when it exits (DUMP and TRACE write at exit).
        archive = _absolute(archive)
        listfile = _absolute(listfile)
    return Config(mode, archive, listfile, verbose, check, problems, verify,
                  prefetch, release, settle, quiet)


def _absolute(path):
    # (A "~" that no shell expanded, as in a Dockerfile's ENV, is the home
    # directory, not a directory named "~".)
    path = os.path.expanduser(path) if path.startswith("~") else path
    try:
        absolute = os.path.abspath(path) if path else path
    except OSError:      # the working directory was removed
        return path
    # "app.img/" names a directory, as open() takes it: abspath would make it
    # the file app.img.
    return absolute + os.sep if path.endswith(os.sep) and absolute != os.sep else absolute


# ---- the default archive path --------------------------------------------

# Options of the python command line that take a separate argument.
_OPTS_WITH_ARG = frozenset("WXQ")


_program = None      # program_id() of this process, taken at its first call


def program_id(argv=None):
    """Return what identifies the program being run, as (kind, value).

    What identifies the program being run, from ``sys.orig_argv``:
    ``("script", realpath)``, ``("-m", module)``, ``("-c", code)`` or
    ``("other", argv)``.  This process's (no ``argv``) is taken once, at
    start-up: the script's real path does not follow a later ``chdir``.
    """
    global _program
    if argv is None:
        if _program is None:
            _program = program_id(sys.orig_argv)
        return _program
    argv = list(argv)
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            if arg == "--check-hash-based-pycs":
                i += 1
            i += 1
            continue
        # -c and -m end the options, also inside a group like -Bc.
        for j, ch in enumerate(arg[1:], 1):
            if ch in "cm":
                rest = arg[j + 1:]
                value = rest if rest else (argv[i + 1] if i + 1 < len(argv) else "")
                return ("-" + ch, value)
            if ch in _OPTS_WITH_ARG:
                if j == len(arg) - 1:
                    i += 1
                break
        i += 1
    if i < len(argv):
        if argv[i] == "--":
            i += 1
        if i < len(argv) and argv[i] != "-":
            return ("script", os.path.realpath(argv[i]))
    return ("other", "\0".join(argv[1:]))


def cache_dir(environ=None):
    """Return pycds's cache directory, or None where there is no usable one.

    ``$XDG_CACHE_HOME/pycds``, else ``~/.cache/pycds``; None where neither
    is an absolute path.  A relative ``XDG_CACHE_HOME`` is ignored, as the
    XDG Base Directory Specification says; a home directory that cannot be
    found (``HOME`` unset and a user id with no passwd entry, as in ``docker
    run -u 12345``) leaves ``os.path.expanduser`` with ``~`` itself, which
    would have made a directory named ``~`` in the working directory.  A
    home directory that does not exist (``/nonexistent``, the home of
    service users in many images) is None too: pycds never makes a home
    directory, only ``.cache/pycds`` inside one."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home) or not os.path.isdir(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "pycds")


def default_archive_path(environ=None, argv=None):
    """Return the archive path used when PYCDSARCHIVE is unset, or "".

    The archive used when PYCDSARCHIVE is unset: one per interpreter,
    optimization level and program (see :func:`program_id`), named
    ``<program>-<hash>.img`` (:func:`program_name`); "" where there is no
    cache directory (:func:`cache_dir`)."""
    import _imp
    cache = cache_dir(environ)
    if cache is None:
        return ""
    kind, value = program_id(argv)
    key = "\0".join([sys.executable, sys.version, sys.implementation.cache_tag,
                     str(sys.flags.optimize), kind, value]).encode("utf-8", "surrogatepass")
    digest = _imp.source_hash(0x5059434453, key).hex()
    return os.path.join(cache, f"{program_name(kind, value)}-{digest}.img")


# The longest program name put in a default archive's file name.
_NAME_MAX = 40


def program_name(kind, value):
    """Return a file-name-safe name for the program of program_id().

    A file-name-safe name for the program of :func:`program_id`: a
    script's name without ``.py``, a ``-m`` module's name, ``python-c`` for
    ``-c``, ``python`` otherwise; characters other than letters, digits,
    ``.``, ``_`` and ``-`` become ``_``, cut to 40."""
    if kind == "script":
        name = os.path.basename(value)
        if name.endswith(".py"):
            name = name[:-3]
    elif kind == "-m":
        name = value
    elif kind == "-c":
        name = "python-c"
    else:
        name = "python"
    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_"
                   for ch in name[:_NAME_MAX]).lstrip(".")
    return name or "python"


# ---- the interpreter an archive is for --------------------------------------
# Taken at start-up, before the program can change its environment.

def meta_for_this_interpreter():
    """Return the interpreter facts an archive's meta block must match.

    The interpreter facts an archive's meta block must match, as a dict
    of str to builtins: version, build, ``-O`` level, byte order, column
    positions.  Checkable without the native module; the native layout id
    (image build and object layout) is added by the writer and checked by
    the native loader."""
    return {
        "version": sys.version,
        "hexversion": sys.hexversion,
        "cache_tag": sys.implementation.cache_tag,
        "optimize": sys.flags.optimize,
        "byteorder": sys.byteorder,
        "debug_ranges": debug_ranges(),
    }


_tag = None


def interpreter_tag():
    """Return 16 hex digits naming this process's interpreter facts.

    16 hex digits naming this process's facts, as they were at the first
    call (start-up in DUMP and SHARE runs): their SipHash-1-3 with key 0
    (pycds._archive.checksum).  A child process whose tag is not its DUMP
    session's does not write over the session's archive (pycds.dumping.dumper);
    one whose tag is not its SHARE session's takes an archive made for
    another interpreter quietly (pycds.share.install)."""
    global _tag
    if _tag is None:
        import _imp
        facts = repr(sorted(meta_for_this_interpreter().items()))
        digest = _imp.source_hash(0, facts.encode("utf-8", "surrogatepass"))
        _tag = "%016x" % int.from_bytes(digest, "little")
    return _tag


_debug_ranges = None


def debug_ranges():
    """Return whether code objects made here keep column positions.

    Whether code objects made in this process keep column positions
    (3.11+): ``-X no_debug_ranges`` and ``PYTHONNODEBUGRANGES`` (set and
    not empty, unless ``-E``) make ``_PyCode_New`` drop them.  The rule is
    the configuration's own (``config_read_complex_options`` in
    Python/initconfig.c, 3.11-3.13), applied once, at the first call (at
    start-up in SHARE and DUMP runs, before the program can change its
    environment): reading it off a code object would need ``__code__`` or a
    frame, which audit hooks see and a sandbox may refuse.  A DUMP records
    what its code objects have (pycds._archive.code_debug_ranges)."""
    global _debug_ranges
    if _debug_ranges is None:
        if sys.version_info < (3, 11):
            _debug_ranges = True     # line numbers only, nothing to drop
        elif "no_debug_ranges" in sys._xoptions:
            _debug_ranges = False
        else:
            _debug_ranges = bool(sys.flags.ignore_environment
                                 or not os.environ.get("PYTHONNODEBUGRANGES"))
    return _debug_ranges


# ---- the process tree ----------------------------------------------------
# What a run leaves in the environment for the processes it starts (they
# inherit it: subprocesses, multiprocessing workers), all documented in
# docs/env-vars.md, "Set by pycds for child processes".  Besides these,
# SHARE, DUMP and AUTO put the archive's absolute path in PYCDSARCHIVE and
# TRACE its list's in PYCDSLIST (pycds._activate), so that a child started
# in another directory uses the same file.

# The interpreter facts (:func:`interpreter_tag`) of the first SHARE process
# of a process tree, for the processes it starts, which share its archive.
SHARE_SESSION_VAR = "PYCDS_SHARE_SESSION"
# The id of a DUMP run, shared by the processes it starts (one archive).
DUMP_SESSION_VAR = "PYCDS_DUMP_SESSION"
# The id of a TRACE run, shared by the processes it starts (one list).
TRACE_SESSION_VAR = "PYCDS_TRACE_SESSION"
# Set by the first AUTO process of a process tree: only that one says the
# archive cannot be written.
AUTO_TREE_VAR = "PYCDS_AUTO_TREE"
# Digests of the warnings a process and its ancestors printed (pycds._log:
# each warning once per process tree), the last WARNED_KEEP of them.
WARNED_VAR = "PYCDS_WARNED"
WARNED_KEEP = 32


def inherited_session(var, tag=""):
    """Return the id of this run of a recording mode, kept in variable var.

    The id of this run of a recording mode, kept in the environment
    variable ``var``: made by the run's first process and put in its
    environment, so that the child processes it starts share it (DUMP:
    ``PYCDS_DUMP_SESSION``, TRACE: ``PYCDS_TRACE_SESSION``).  A new id is
    16 random hex digits, then ``-tag`` if a ``tag`` is given."""
    session = os.environ.get(var, "")
    if not session:
        session = os.urandom(8).hex() + (f"-{tag}" if tag else "")
        os.environ[var] = session
    return session



def dump_session():
    """Return the id of this DUMP run, tagged with its interpreter facts.

    The id of this DUMP run (:func:`inherited_session` of
    ``PYCDS_DUMP_SESSION``), tagged with the interpreter facts of the process
    that began it (:func:`interpreter_tag`)."""
    return inherited_session(DUMP_SESSION_VAR, interpreter_tag())


def dump_session_began_here():
    """Return whether no ancestor of this process began a DUMP run.

    Whether no ancestor of this process began a DUMP run (read before
    :func:`dump_session` puts this one's id in the environment)."""
    return not os.environ.get(DUMP_SESSION_VAR)


def trace_session():
    """Return the id of this TRACE run.

    The id of this TRACE run (:func:`inherited_session` of
    ``PYCDS_TRACE_SESSION``)."""
    return inherited_session(TRACE_SESSION_VAR)


def auto_tree_root():
    """Return this pid if it is its tree's first AUTO process, else 0.

    This process's pid if it is the first AUTO process of its process
    tree, else 0; marks the tree for the processes it starts."""
    root = 0 if os.environ.get(AUTO_TREE_VAR) else os.getpid()
    os.environ[AUTO_TREE_VAR] = "1"
    return root


_share = None


def share_session():
    """Return (tag, root) of this process tree's SHARE session.

    ``(tag, root)``: the interpreter tag of this process tree's SHARE
    session and the pid of the process that began it, 0 when an ancestor
    did (its tag is in ``PYCDS_SHARE_SESSION``).  Decided at the first call
    (SHARE's start-up), which puts this process's tag there for its
    children when none is."""
    global _share
    if _share is None:
        session = os.environ.get(SHARE_SESSION_VAR)
        if session:
            _share = (session, 0)
        else:
            session = os.environ[SHARE_SESSION_VAR] = interpreter_tag()
            _share = (session, os.getpid())
    return _share


# ---- the import system as pycds started with it -----------------------

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
STOCK_LOADER_ATTRS = tuple(
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
    # STOCK_LOADER_ATTRS as loader_patched() checks them: for each, the
    # dicts before the one holding the stock value (where a value of the
    # program's would shadow it), that one, the name and the value.  Made
    # at the first check; None (not kept) where a stock value is stored
    # nowhere any more.
    global _loader_chains
    chains = []
    for obj, name, stock in STOCK_LOADER_ATTRS:
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
    """Return whether the program replaced part of the stock loader.

    Whether the program has replaced a part of the stock
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
STOCK_SEARCH = tuple(
    (cls, name, cls.__dict__.get(name))     # (None: inherited)
    for cls, names in ((_bootstrap_external.PathFinder,
                        ("find_spec", "_get_spec", "_path_importer_cache")),
                       (_bootstrap_external.FileFinder,
                        ("find_spec", "_get_spec", "_fill_cache", "__getattribute__")))
    for name in names)
# The functions FileFinder.find_spec calls (importlib/_bootstrap_external.py,
# 3.10-3.13), as (module, name, value) triples compared as
# STOCK_LOADER_ATTRS are (a module's attribute is stored in its dict).
STOCK_SEARCH_FUNCS = tuple(
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


STOCK_HOOKS = _hook_parts()


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


STOCK_FILE_FINDER_HOOKS = _file_finder_hooks()


def path_hooks_stock():
    """Return whether sys.path_hooks are importlib's own; never raise.

    Whether every entry of ``sys.path_hooks`` is one importlib put there
    (zipimporter, or a FileFinder hook there when pycds started) and what
    they run is as pycds started with it: running them for a directory runs
    no code of the program and changes nothing but what ``PathFinder``
    stores in ``sys.path_importer_cache``.  Never raises; reads no
    attribute of the hooks (no audit event)."""
    try:
        for now, stock in zip(_hook_parts(), STOCK_HOOKS):
            if now is not stock:
                return False
        zipimporter = STOCK_HOOKS[3]
        hooks = sys.path_hooks
        if type(hooks) is not list or not hooks:
            return False
        for hook in hooks:
            if hook is zipimporter and zipimporter is not None:
                continue
            for stock in STOCK_FILE_FINDER_HOOKS:
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
    """Return whether a recorded search may be replayed.

    Whether a recorded search may be replayed: the search's methods are
    the stock ones and ``-vv`` is off (FileFinder prints each file it tries
    then; a replay would not)."""
    if sys.flags.verbose >= 2:
        return False
    for cls, name, original in STOCK_SEARCH:
        if cls.__dict__.get(name) is not original:
            return False
    for module, name, original in STOCK_SEARCH_FUNCS:
        if module.__dict__.get(name, _MISSING) is not original:
            return False
    return True

# The namespaces of importlib's own code: a frame whose f_globals is one of
# them runs importlib (3.10-3.13, also under -X frozen_modules=off).
import _frozen_importlib as _bootstrap  # noqa: E402  (builtin, loaded at start-up)

BOOTSTRAP_NAMESPACES = (_bootstrap.__dict__, _bootstrap_external.__dict__)


def runs_importlib(frame):
    """Whether ``frame`` runs importlib's own code (by namespace identity)."""
    g = frame.f_globals
    return g is BOOTSTRAP_NAMESPACES[0] or g is BOOTSTRAP_NAMESPACES[1]


def runs_pycds(frame):
    """Return whether frame runs the code of one of pycds's own modules.

    Whether ``frame`` runs the code of one of pycds's own modules
    (:func:`is_hook_module`): its globals are that module's namespace."""
    g = frame.f_globals
    name = g.get("__name__")
    if type(name) is not str or not is_hook_module(name):
        return False
    module = sys.modules.get(name)
    return module is not None and getattr(module, "__dict__", None) is g

# Bound at import: a program may replace sys._getframe (mock.patch) or
# delete it, and find_spec must not follow it.
_getframe = sys._getframe
# Deeper stacks are taken for the program's: the interpreter's own imports
# run a few frames deep, and 3.13 builds a frame object for every frame
# walked.
_MAX_WALK = 1000


def imported_by_interpreter():
    """Return whether the interpreter started this import; never raise.

    Whether the import being found was started by the interpreter itself:
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
                return runs_importlib(f)
            f = back
    except Exception:
        pass
    return False



def import_native(load, search_path=None):
    """Return load() run with pycds's own _cffi_backend; raise ImportError.

    ``load`` imports and returns ``pycds._nativeapi`` (its caller's: this
    module imports none of the native side): run with pycds's own
    ``_cffi_backend`` at the first archive hit of a SHARE run, at the start
    of a DUMP run and of an AUTO run that records
    (pycds.dumping.dumper.preload).  (Here, not in a module of its own: a
    SHARE run's first hit would import one more module.)

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
    if __package__ + "._native" in sys.modules:
        return load()       # (its _cffi_backend is bound already)
    import _frozen_importlib as _bootstrap
    with _bootstrap._ModuleLockManager("_cffi_backend"):
        if "_cffi_backend" in sys.modules:
            return load()
        spec = None
        if search_path:
            spec = _bootstrap_external.PathFinder.find_spec("_cffi_backend",
                                                            list(search_path))
        if spec is not None:
            ours = _bootstrap._load(spec)
        else:
            import _cffi_backend as ours
        try:
            return load()
        finally:
            if sys.modules.get("_cffi_backend") is ours:
                del sys.modules["_cffi_backend"]



def is_main_interpreter(cheap_only=False):
    """Return True unless this is a subinterpreter.

    pycds works in the main
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
    """Return whether module name is pycds's own import hook.

    Whether module ``name`` is pycds's own import hook, which is never
    archived (it runs before the archive is open); its companion pycds.bf16
    is an ordinary library and is."""
    return (name == "pycds" or name.startswith("pycds.")) and \
        not (name == "pycds.bf16" or name.startswith("pycds.bf16."))


