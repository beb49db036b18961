"""``python -m pycds cache {list,clear,path}``: the default archives.

Without ``PYCDSARCHIVE``, DUMP, SHARE and AUTO use one archive per
interpreter and program in the cache directory (pycds._config.cache_dir:
``$XDG_CACHE_HOME/pycds``, else ``~/.cache/pycds``), named after the
program and a hash (``app-<hash>.img``).

``list``             one line per archive: age, size, modules, how many are
                     stale now, the interpreter and the program it was made for
``clear [--older-than DAYS]``  remove archives (all, or those not written
                     for DAYS days) and temporary files of dead writers
``path -- COMMAND [ARG ...]``  the archive that command line would use (the
                     command's Python is asked: the path depends on it)
"""

import os
import shlex
import subprocess
import sys
import time

from .. import _archive, _config, _pyc
from ..errors import ArchiveFormatError

__all__ = ["add_parser", "archives", "counted"]

_SUFFIX = ".img"


def counted(n, noun, plural=None):
    """Return "n noun", noun in the plural unless n is 1.

    ``n`` and ``noun``, in the plural (``plural``, default ``noun`` + "s")
    unless ``n`` is 1: "1 archive", "0 archives" (for every count the
    command line prints: pycds.__main__, pycds.cli.bench)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def archives(cache=None, others=None):
    """Return the sorted archive paths in cache directory cache.

    The archive paths in the cache directory ``cache`` (default:
    pycds._config.cache_dir()), sorted; [] when there is none.  The other
    ``*.img`` names there (not pycds archives: a user's file, a symbolic
    link, a directory) are appended to ``others`` if given."""
    from .._files import why_not_ours
    cache = cache or _config.cache_dir()
    if not cache:
        return []
    try:
        names = os.listdir(cache)
    except OSError:
        return []
    out = []
    for p in sorted(os.path.join(cache, n) for n in names
                    if n.endswith(_SUFFIX) and not n.startswith(".")):
        if not why_not_ours(p, _archive.why_not_archive):
            out.append(p)
        elif others is not None:
            others.append(p)
    return out


def describe(path):
    """Return a dict of what ``cache list`` prints for the archive at path.

    A dict of what ``cache list`` prints for the archive at ``path``:
    ``bytes``, ``age_s`` (since it was written), ``modules``, ``stale``
    (modules changed since the dump; None when the archive is another
    interpreter's), ``python`` and ``program`` (its command line), or
    ``error`` when it cannot be read."""
    out = {"path": path}
    try:
        st = os.stat(path)
        index = _archive.Index.open(path, check_owner=False, check_interpreter=False)
    except (OSError, ArchiveFormatError) as e:
        out["error"] = (e.strerror if isinstance(e, OSError) and e.strerror else str(e))
        return out
    try:
        meta = index.meta
        out["bytes"] = st.st_size
        out["age_s"] = max(0.0, time.time() - st.st_mtime)
        out["modules"] = index.header.nmodules
        out["python"] = str(meta.get("version", "?")).split()[0]
        argv = meta.get("program")
        program = shlex.join(argv) if isinstance(argv, list) else "?"
        # (A program's arguments may hold terminal control characters.)
        out["program"] = "".join(c if c.isprintable() else repr(c)[1:-1] for c in program)
        out["stale"] = None
        if not index.foreign:
            out["stale"] = sum(_pyc.stale(e, "mtime", _pyc.cache_path(e.origin)) is not None
                               for e in index.entries())
    except ArchiveFormatError as e:
        out["error"] = str(e)
    finally:
        index.close()
    return out


def _age(s):
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit}"
    return f"{s:.0f}s"


def cmd_list(args):
    others = []
    paths = archives(others=others)
    for p in others:
        print(f"pycds: {p} is not a pycds archive: not listed", file=sys.stderr)
    if not paths:
        cache = _config.cache_dir()
        print(f"no archives in {cache}" if cache else
              "no archives: no cache directory (no home directory; set XDG_CACHE_HOME)")
        return 0
    print(f"{'age':>7} {'MiB':>7} {'modules':>7} {'stale':>5}  {'python':8} program")
    for p in paths:
        d = describe(p)
        if "error" in d:
            print(f"{'?':>7} {'?':>7} {'?':>7} {'?':>5}  {'?':8} unreadable: {d['error']} ({p})")
            continue
        stale = "-" if d["stale"] is None else d["stale"]
        print(f"{_age(d['age_s']):>7} {d['bytes'] / 2**20:7.1f} {d['modules']:7} {stale:>5}  "
              f"{d['python']:8} {d['program']}")
    print(f"{counted(len(paths), 'archive')} in {_config.cache_dir()}")
    return 0


def cmd_clear(args):
    cache = _config.cache_dir()
    others = []
    paths = archives(others=others)
    limit = None if args.older_than is None else args.older_than * 86400
    from .. import _files
    removed = 0
    for p in others:
        print(f"pycds: {p} is not a pycds archive: left as it is", file=sys.stderr)
    for p in paths:
        try:
            if limit is not None and time.time() - os.lstat(p).st_mtime < limit:
                continue
            os.unlink(p)
            removed += 1
        except OSError as e:
            print(f"pycds: {p}: {e.strerror or e}", file=sys.stderr)
    if cache and os.path.isdir(cache):
        for p in paths:
            _files.sweep_stale(cache, os.path.basename(p))
    print(f"removed {removed} of {counted(len(paths), 'archive')}")
    return 0


def cmd_path(args):
    command = args.command
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        args.path_parser.error("give the command line after --, as in "
                               "python -m pycds cache path -- python app.py")
    if not os.path.basename(command[0]).startswith(("python", "pypy")):
        # Asked as `COMMAND -c CODE`, anything else would run the program.
        args.path_parser.error(f"{command[0]} is not a Python interpreter: give the command "
                               "line with its Python, as in python -m pycds cache path -- "
                               "python app.py")
    # The path hashes the interpreter that runs the command: ask it.
    code = ("import sys; from pycds import _config; "
            "print(_config.default_archive_path(argv=sys.argv[1:]) or '')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCDS")}
    try:
        r = subprocess.run([command[0], *_optimize_options(command), "-c", code, *command],
                           env=env,
                           capture_output=True, text=True)
    except OSError as e:
        print(f"pycds: {command[0]}: {e.strerror or e}", file=sys.stderr)
        return 2
    if r.returncode != 0 or not r.stdout.strip():
        print(f"pycds: {command[0]} gives no default archive: {_why_no_path(r)}",
              file=sys.stderr)
        return 2
    print(r.stdout.strip())
    return 0


def _why_no_path(r):
    """Return why the command's Python printed no archive path, in words.

    Why the command's Python printed no archive path (``r``: its run),
    in words: no pycds there, not a Python, no cache directory."""
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if r.returncode == 0:
        return "there is no cache directory (no home directory; set XDG_CACHE_HOME)"
    if "No module named 'pycds'" in last:
        return "pycds is not installed for it"
    if last.partition(": ")[0].endswith(("Error", "Exception")):
        last = last.partition(": ")[2]      # a Python's traceback: its message
    return ("give the command line that starts the program with its Python, as in "
            "'-- python app.py'" + (f" (it said: {last})" if last else ""))


def _optimize_options(command):
    """Return the -O options the python command line command asks for.

    ``["-O"]``, ``["-OO"]`` or ``[]``: the optimization level the python
    command line ``command`` asks for before its program (the default
    archive's key holds it: pycds._config.default_archive_path)."""
    n = 0
    i = 1
    while i < len(command):
        arg = command[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            break
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j, ch in enumerate(arg[1:], 1):
            if ch in "cm":
                return ["-" + "O" * n] if n else []
            n += ch == "O"
            if ch in "WXQ":
                i += j == len(arg) - 1      # (its value is the next argument)
                break
        i += 1
    return ["-" + "O" * n] if n else []


def _days(text):
    import argparse
    try:
        v = float(text)
    except ValueError:
        v = -1
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days >= 0")
    return v


def add_parser(subparsers):
    """Add the ``cache`` subcommand to ``subparsers`` (of python -m pycds)."""
    import argparse
    p = subparsers.add_parser(
        "cache", help="list, clear or locate the default archives",
        description="The default archives: those DUMP, SHARE and AUTO use without "
                    "PYCDSARCHIVE, one per program and interpreter, in "
                    "$XDG_CACHE_HOME/pycds (else ~/.cache/pycds), named after the "
                    "program.")
    # No subcommand: this help (python -m pycds prints it, exit status 0).
    p.set_defaults(help_parser=p)
    sub = p.add_subparsers(dest="cache_command", metavar="COMMAND", title="commands")
    sub.add_parser(
        "list", help="list the archives, with their program and state",
        description="List the default archives, one a line: age (since written), size "
                    "in MiB, modules, how many of those are stale now (sources changed "
                    "since the dump; - for another interpreter's archive), the Python "
                    "version and the program (command line) it was made for; then how "
                    "many there are, and where.").set_defaults(func=cmd_list)
    c = sub.add_parser(
        "clear", help="remove archives",
        description="Remove the default archives (all, or those not written for DAYS "
                    "days) and the temporary files of writers that died. A file there "
                    "that is not a pycds archive is left as it is.")
    c.add_argument("--older-than", type=_days, metavar="DAYS",
                   help="only those not written for DAYS days (a number, 0 or more)")
    c.set_defaults(func=cmd_clear)
    w = sub.add_parser(
        "path", help="print the archive a command line would use",
        usage="python -m pycds cache path -- COMMAND [ARG ...]",
        description="Print the path of the default archive that COMMAND would use: "
                    "give, after --, the command line that starts the program with its "
                    "Python (python app.py, python -m pkg); that Python is asked, as the "
                    "path depends on the interpreter and the program.")
    w.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    w.set_defaults(func=cmd_path, path_parser=w)
    return p
