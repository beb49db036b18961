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
                       line would use (pycds._cache)

Exit status: 0 on success, 1 when ``verify`` finds stale modules, damaged
parts or a file SHARE would refuse, 2 when the archive cannot be read
(``info``, ``verify``) or written (``dump``); ``bench`` has its own (see
its help).
"""

import argparse
import datetime
import os
import sys

from . import _archive, _config, _pyc
from .errors import ArchiveFormatError


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
    print(f"heap:         {h.heap_len} bytes")
    print(f"relocations:  {h.reloc_count} entries ({4 * h.reloc_count} bytes)")
    print(f"chunk table:  {h.nmodules * _archive.CHUNK_REC} bytes")
    print(f"file:         {h.file_len} bytes")
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
    print(f"{stale} of {len(entries)} modules changed since the dump")
    if damaged:
        print(f"{damaged} of {len(entries)} modules (and tables) damaged in the archive")
    return 1 if stale or damaged or refused else 0


def _share_refusal(path):
    """Why SHARE would refuse the file (ownership, permissions), or None."""
    try:
        _archive.Index.open(path).close()
    except ArchiveFormatError as e:
        return str(e)
    return None


def cmd_dump(args):
    from . import _dump
    try:
        n = _dump(args.list, args.archive)
    except (OSError, ValueError) as e:    # the list unreadable, the archive unwritable
        print(f"pycds: {e}", file=sys.stderr)
        return 2
    print(f"archived {n} modules to {args.archive}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pycds",
                                 description="Inspect and build pycds archives.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="print an archive's header and modules")
    p.add_argument("archive")
    p.add_argument("-q", "--quiet", action="store_true", help="header only")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("verify", help="list modules whose sources changed")
    p.add_argument("archive")
    env_check = _config.from_environ().check      # PYCDSCHECK, as SHARE reads it
    p.add_argument("--check", choices=("mtime", "hash"),
                   default=env_check if env_check in ("mtime", "hash") else "mtime",
                   help="how to compare sources: mtime and size, or the source "
                        "hash (default: $PYCDSCHECK, as SHARE checks, else mtime)")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("dump", help="import the modules in LIST and archive them")
    p.add_argument("list")
    p.add_argument("archive")
    p.set_defaults(func=cmd_dump)
    from . import _bench, _cache
    _bench.add_parser(sub)
    _cache.add_parser(sub)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # `python -m pycds info app.img | head`: the reader left; say
        # nothing more (and keep the interpreter's final flush quiet).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
