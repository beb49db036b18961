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
                   only at exit): pycds._settle.
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
at start-up.  Imports only builtins: this runs at start-up from the .pth
file.
"""

import os
import sys

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
    """What identifies the program being run, from ``sys.orig_argv``:
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


def inherited_session(var, tag=""):
    """The id of this run of a recording mode, kept in the environment
    variable ``var``: made by the run's first process and put in its
    environment, so that the child processes it starts share it (DUMP:
    ``PYCDS_DUMP_SESSION``, TRACE: ``PYCDS_TRACE_SESSION``).  A new id is
    16 random hex digits, then ``-tag`` if a ``tag`` is given."""
    session = os.environ.get(var, "")
    if not session:
        session = os.urandom(8).hex() + (f"-{tag}" if tag else "")
        os.environ[var] = session
    return session


def cache_dir(environ=None):
    """``$XDG_CACHE_HOME/pycds``, else ``~/.cache/pycds``; None where neither
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
    """The archive used when PYCDSARCHIVE is unset: one per interpreter,
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
    """A file-name-safe name for the program of :func:`program_id`: a
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
    """The interpreter facts an archive's meta block must match, as a dict
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
    """16 hex digits naming this process's facts, as they were at the first
    call (start-up in DUMP and SHARE runs): their SipHash-1-3 with key 0
    (pycds._archive.checksum).  A child process whose tag is not its DUMP
    session's does not write over the session's archive (pycds._dumper);
    one whose tag is not its SHARE session's takes an archive made for
    another interpreter quietly (pycds.finder.install)."""
    global _tag
    if _tag is None:
        import _imp
        facts = repr(sorted(meta_for_this_interpreter().items()))
        digest = _imp.source_hash(0, facts.encode("utf-8", "surrogatepass"))
        _tag = "%016x" % int.from_bytes(digest, "little")
    return _tag


_debug_ranges = None


def debug_ranges():
    """Whether code objects made in this process keep column positions
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


# The environment variable in which the first SHARE process of a process
# tree names its interpreter facts (:func:`interpreter_tag`) for the
# processes it starts, which inherit its archive through PYCDSARCHIVE.
SHARE_SESSION_VAR = "PYCDS_SHARE_SESSION"

_share = None


def share_session():
    """``(tag, root)``: the interpreter tag of this process tree's SHARE
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
