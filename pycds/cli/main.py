"""Command line: ``python -m pycds {info,verify,dump,bench,cache} ...``.

``info ARCHIVE``     header, the program and interpreter it was made for, sizes
                     and the modules with their sizes
                     (an archive of another CPython version is read with that
                     version: its checksums are that version's)
``verify ARCHIVE``   modules whose sources changed since the dump, or whose
                     archived data fails its checksum, and whether SHARE would
                     refuse the file itself (permissions); exit 1 if any
``dump LIST ARCHIVE``  import the modules named in LIST and archive them, as
                       ``pycds._dump(LIST, ARCHIVE)`` in a fresh interpreter
                       does (plus the few modules this command line itself
                       imports, such as argparse)
``bench [options] -- COMMAND [ARG ...]``  run a command line plain and
                       under SHARE, side by side; report the times and
                       their ratios (``python -m pycds bench -h``)
``cache {list,clear,path}``  the default archives: which program each is
                       for and how stale, removing them, the one a command
                       line would use (pycds.cli.cache)
``--version``        pycds's version and place, the interpreter's version
                     and path (as ``pip --version``)

With no command (``python -m pycds``, ``python -m pycds cache``) the help
is printed on stdout and the exit status is 0, as ``pip`` does.

Exit status: 0 on success, 1 when ``verify`` finds stale modules, damaged
parts or a file SHARE would refuse, 2 on a usage error or when the archive
cannot be read (``info``, ``verify``) or written (``dump``), 130 when
interrupted; ``bench`` has its own (see its help).
"""

import argparse
import datetime
import os
import sys

from .. import _archive, _config, _pyc
from .._config import __version__
from .cache import counted
from ..errors import ArchiveFormatError


def _open(path, check_interpreter=True):
    try:
        return _archive.Index.open(path, check_owner=False,
                                   check_interpreter=check_interpreter)
    except ArchiveFormatError as e:
        print(f"pycds: {path}: {e}", file=sys.stderr)
        raise SystemExit(2)


def cmd_info(args):
    index = _open(args.archive, check_interpreter=False)
    h, meta = index.header, index.meta
    try:
        entries = index.entries()
    except ArchiveFormatError as e:
        print(f"pycds: {args.archive}: {e}", file=sys.stderr)
        return 2
    created = datetime.datetime.fromtimestamp(os.stat(args.archive).st_mtime).isoformat(
        " ", "seconds")
    print(f"archive:      {os.path.abspath(args.archive)}")
    print(f"format:       {h.format}")
    print(f"written:      {created} by pycds {meta.get('pycds', '?')}")
    argv = meta.get("program")
    if isinstance(argv, list):
        import shlex
        print(f"program:      {shlex.join(argv)}")
        print(f"executable:   {meta.get('executable', '?')}")
    print(f"interpreter:  {meta.get('version', '?').splitlines()[0]}")
    print(f"              hexversion {meta.get('hexversion', 0):#x}, "
          f"cache tag {meta.get('cache_tag')}, optimize {meta.get('optimize')}")
    print(f"layout:       {meta.get('layout', '?')}")
    if index.foreign:
        print(f"usable here:  no, {index.foreign}")
    print(f"modules:      {h.nmodules}")
    print(f"heap:         {counted(h.heap_len, 'byte')}")
    print(f"relocations:  {counted(h.reloc_count, 'entry', 'entries')} "
          f"({counted(4 * h.reloc_count, 'byte')})")
    print(f"chunk table:  {counted(h.nmodules * _archive.CHUNK_REC, 'byte')}")
    print(f"file:         {counted(h.file_len, 'byte')}")
    if args.quiet:
        return 0
    print()
    print(f"{'module':50} {'heap bytes':>11} {'relocs':>8} {'objects':>8}  origin")
    for e in sorted(entries, key=lambda e: e.name):
        print(f"{e.name:50} {e.chunk_len:11} {e.reloc_count:8} {e.nobjects:8}  {e.origin}")
    return 0


def cmd_verify(args):
    index = _open(args.archive)
    try:
        entries = index.entries()
    except ArchiveFormatError as e:
        print(f"pycds: {args.archive}: {e}", file=sys.stderr)
        return 2
    stale = damaged = 0
    refused = _share_refusal(args.archive)
    if refused:
        print(f"SHARE would ignore this archive: {refused}")
    if not index.chunk_table_intact():
        damaged += 1
        print("chunk table fails its checksum: no module can be loaded")
    for e in sorted(entries, key=lambda e: e.name):
        if not index.chunk_intact(e):
            damaged += 1
            print(f"{e.name}: archived data fails its checksum")
        reason = _pyc.stale(e, args.check, _pyc.cache_path(e.origin))
        if reason is not None:
            stale += 1
            print(f"{e.name}: {reason} ({e.origin})")
    total = counted(len(entries), "module")
    print(f"{stale} of {total} changed since the dump")
    if damaged:
        print(f"{damaged} of {total} (and tables) damaged in the archive")
    return 1 if stale or damaged or refused else 0


def _share_refusal(path):
    """Why SHARE would refuse the file (ownership, permissions), or None."""
    try:
        _archive.Index.open(path).close()
    except ArchiveFormatError as e:
        return str(e)
    return None


def cmd_dump(args):
    from ..dumping import dumper
    try:
        names = dumper.read_module_list(args.list) if args.list else []
        n = dumper.dump_now(names, args.archive)
    except (OSError, ValueError) as e:    # the list unreadable, the archive unwritable
        print(f"pycds: {_os_error(e)}", file=sys.stderr)
        return 2
    print(f"archived {counted(n, 'module')} to {args.archive}")
    return 0


def _os_error(e):
    """Return OSError e as one line for a user.

    ``e`` as one line for a user: ``path: No such file or directory``
    rather than ``[Errno 2] No such file or directory: 'path'``."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror
    return str(e)


# The pycds package's directory (this module is in its cli/).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _native_missing(e):
    """Return what to do when the native module cannot be loaded.

    What to do when the native module cannot be loaded (``e``, from
    pycds._nativeapi), in words that name no module."""
    here = _PACKAGE_DIR
    if e.__cause__ is not None and os.path.exists(
            os.path.join(os.path.dirname(here), "setup.py")):
        return (f"the pycds imported is the source checkout {here}, not the installed "
                f"one (the working directory comes first): run this command from "
                f"another directory")
    return (f"the pycds in {here} has no compiled part that this interpreter can load "
            f"(not built for it, or for another pycds version): reinstall pycds")


# ---- the parser ----------------------------------------------------------------

_MODES = """\
modes: set PYCDSMODE for your program (PYCDSMODE=AUTO python app.py), not for
this command; PYCDSARCHIVE names the archive (default: one per program and
interpreter, see "cache"):
  PYCDSMODE=AUTO   share the archive and keep it current by itself (usual)
  PYCDSMODE=DUMP   run normally; write the archive of what it imported at exit
  PYCDSMODE=SHARE  import from the archive a DUMP or AUTO run wrote
  PYCDSMODE=TRACE  write the names of the imported modules to PYCDSLIST

"""


def _docs():
    """Return where the README and docs/env-vars.md are, or a description.

    Where the README and docs/env-vars.md are: the source tree pycds runs
    from, or the local one pip installed it from (PEP 610's
    direct_url.json), while it still has them; else a description."""
    names = ("README.md", os.path.join("docs", "env-vars.md"))
    trees = [os.path.dirname(_PACKAGE_DIR)]
    try:
        import json
        from importlib import metadata
        from urllib.parse import unquote, urlsplit
        url = json.loads(metadata.distribution("pycds").read_text("direct_url.json")
                         or "{}").get("url", "")
        if url.startswith("file:"):
            trees.append(unquote(urlsplit(url).path))
    except Exception:       # not installed by pip, no metadata: say it in words
        pass
    for tree in trees:
        if all(os.path.isfile(os.path.join(tree, n)) for n in names):
            return (f"docs: {os.path.join(tree, names[0])} (start there) and\n"
                    f"      {os.path.join(tree, names[1])} (every variable)")
    return ("docs: README.md (start there) and docs/env-vars.md (every variable)\n"
            "      in the pycds source repository")


class _Parser(argparse.ArgumentParser):
    """The top-level parser, whose epilog is made when help is printed.

    The top-level parser: its epilog (modes, docs) is made when the
    help is printed, not at every command."""

    def format_help(self):
        self.epilog = _MODES + _docs()
        return super().format_help()


def _version():
    # platform.python_implementation() and python_version(), without
    # importing platform at every command.
    impl = {"cpython": "CPython"}.get(sys.implementation.name, sys.implementation.name)
    return (f"pycds {__version__} from {_PACKAGE_DIR} "
            f"({impl} {sys.version.split()[0]}, {sys.executable})")


_VERIFY = """\
Check an archive against the files it was made from, with the Python that
made it: the modules whose sources changed since the dump (SHARE imports
those plainly), the parts of the archive that fail their checksums (damaged:
SHARE switches the archive off when it meets one), and whether SHARE would
refuse the file itself (its owner or permissions). Prints one line per
finding, then how many modules changed."""


def parser():
    """The argument parser of ``python -m pycds``."""
    ap = _Parser(
        prog="python -m pycds", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="pycds: start-up accelerator for CPython. Programs use it through\n"
                    "PYCDSMODE (below); this command inspects, builds, times and manages\n"
                    "its archives.")
    ap.add_argument("-V", "--version", action="version", version=_version(),
                    help="show the versions of pycds and the interpreter, and exit")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                            parser_class=argparse.ArgumentParser)   # not _Parser's epilog
    p = sub.add_parser(
        "info", help="print an archive's header and modules",
        description="Print an archive's header (the program and interpreter it was made "
                    "for, when and by which pycds, sizes) and its modules with their sizes "
                    "and source files. Run it with the Python that made the archive.")
    p.add_argument("archive", metavar="ARCHIVE", help="the archive file")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print the header only, not the modules")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser(
        "verify", help="check an archive: sources changed, damage, refusal by SHARE",
        description=_VERIFY,
        epilog="Exit status: 0 when nothing is found, 1 when a module changed, a part "
               "is damaged or SHARE would refuse the file, 2 when the file cannot be "
               "read as an archive of this interpreter.")
    p.add_argument("archive", metavar="ARCHIVE", help="the archive file")
    env_check = _config.from_environ().check      # PYCDSCHECK, as SHARE reads it
    p.add_argument("--check", choices=("mtime", "hash"),
                   default=env_check if env_check in ("mtime", "hash") else "mtime",
                   help="how to compare sources: mtime and size, or the source "
                        "hash (default: $PYCDSCHECK, as SHARE checks, else mtime)")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser(
        "dump", help="import the modules named in a list and archive them",
        description="Import the modules named in LIST and archive them in ARCHIVE, as "
                    "pycds._dump(LIST, ARCHIVE) does in a fresh interpreter, with the few "
                    "modules this command itself imports. A module that cannot be imported "
                    "is a warning and is left out. A file already at ARCHIVE is replaced "
                    "only if it is a pycds archive.",
        epilog="Exit status: 0 when the archive was written, 2 when LIST cannot be read "
               "or ARCHIVE cannot be written.")
    p.add_argument("list", metavar="LIST",
                   help="module names, one a line (# starts a comment), as a "
                        "PYCDSMODE=TRACE run writes them")
    p.add_argument("archive", metavar="ARCHIVE", help="the archive file to write")
    p.set_defaults(func=cmd_dump)
    from . import bench as _bench, cache as _cache
    _bench.add_parser(sub)
    _cache.add_parser(sub)
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # No command: the help, on stdout, exit status 0, as pip does
        # (argparse's own "required" would be a usage error, status 2).
        getattr(args, "help_parser", ap).print_help()
        return 0
    try:
        return func(args)
    except ImportError as e:
        if not (e.name or "").startswith("pycds._native"):
            raise
        print(f"pycds: {_native_missing(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pycds: interrupted", file=sys.stderr)
        return 130


def run():
    """Run :func:`main` with sys.argv and exit with its status.

    This is ``python -m pycds``."""
    try:
        status = main()
        # A pipe's stdout is block-buffered: its first write is often this
        # flush, which must fail here and not in the interpreter's exit.
        sys.stdout.flush()
        sys.exit(status)
    except BrokenPipeError:
        # `python -m pycds info app.img | head`: the reader left; say
        # nothing more (and keep the interpreter's final flush quiet).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
