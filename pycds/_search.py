"""Plain import's search for a module, recorded at DUMP and replayed at SHARE.

To serve a module, the finder must know that plain import would load the
archived file now: ``PathFinder.find_spec`` walks the search path (``sys.path``
or the parent package's ``__path__``), and each directory's ``FileFinder``
stats the directory, re-reads its listing when its mtime moved, and looks the
name up (importlib/_bootstrap_external.py, 3.10-3.13).  That walk was the
largest part of what a SHARE import costs beyond executing the module body.

A DUMP run records, per module, the directories that search examines up to
the one holding the module, each with the directory's ``st_mtime_ns``
(:func:`record`; none for a directory modified in the last two seconds,
which a later change could leave with the same mtime).  A SHARE run
(:func:`find_spec`) skips a directory whose mtime is unchanged -- its listing
is the one the dump run searched, the very test ``FileFinder`` uses to trust
its own cached listing -- and asks the directory's ``FileFinder`` as plain
import does when it has changed (the directory the archive was written to,
say).  When
the stamps of every directory hold, the spec is built as ``FileFinder`` builds
it (``spec_from_file_location``, same arguments) without reading a
directory; in every other case (another search path, a replaced path hook
or path importer cache entry, ``-vv``), the answer is ``PathFinder``'s.

Imports only builtins and importlib's bootstrap (loaded at start-up).
"""

import os
import sys
from _frozen_importlib_external import (FileFinder, PathFinder,
                                        SourceFileLoader,
                                        _get_supported_file_loaders,
                                        spec_from_file_location)

__all__ = ["record", "find_spec", "replayed"]

# FileFinder's (suffix, loader) pairs as its default path hook makes them
# (FileFinder.__init__ and _install in _bootstrap_external.py).
_LOADERS = [(suffix, loader) for loader, suffixes in _get_supported_file_loaders()
            for suffix in suffixes]
_MISSING = object()
# Under -vv FileFinder prints each file it tries; replaying would not.
_REPLAY = sys.flags.verbose < 2

# A directory modified this recently when the dump records it gets no stamp:
# a later change within the file system's timestamp granularity (1 s on
# ext3, 2 s on FAT; coarse clock ticks elsewhere) would leave its mtime
# as recorded.  Git's index treats "racily clean" files the same way.
_RACY_NS = 2_000_000_000

# Modules whose search this process answered from the stamps alone.
replayed = 0


def _file_finder(entry):
    """The standard FileFinder of search path entry ``entry`` (a str), or
    None when it has none (no such directory), or _MISSING when plain import
    would use something else for it."""
    finder = PathFinder._path_importer_cache(entry)
    if finder is None:
        return None
    if type(finder) is not FileFinder or finder._loaders != _LOADERS:
        return _MISSING
    return finder


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except (OSError, ValueError):
        return -1


def _stamp(before, after, now):
    """The stamp to record for a directory whose mtime was ``before`` and
    ``after`` around its search at time ``now`` (ns): -1 (always ask) when
    it changed meanwhile or too recently to be told apart from a change."""
    return before if before == after and 0 <= before < now - _RACY_NS else -1


def record(name, spec):
    """The search plain import makes for ``name`` now, if it ends at
    ``spec.origin`` with the stock ``SourceFileLoader``: ``(steps, pkg_dir,
    pkg_mtime_ns)``, where ``steps`` holds ``(path entry, directory,
    st_mtime_ns)`` for each entry examined (directory and mtime None where
    the entry has no finder, mtime -1 where the directory changed while
    being searched or less than two seconds before) and ``pkg_dir`` is the
    package's directory (None for a module).  None when the search cannot be
    replayed.  Never raises."""
    import time
    now = time.time_ns()
    try:
        parent = name.rpartition(".")[0]
        if parent:
            path = getattr(sys.modules.get(parent), "__path__", None)
        else:
            path = sys.path
        if type(path) is not list:
            return None
        steps = []
        for entry in path:
            if type(entry) is not str:
                return None
            finder = _file_finder(entry)
            if finder is None:
                steps.append((entry, None, None))
                continue
            if finder is _MISSING:
                return None
            directory = finder.path
            before = _mtime(directory)
            found = finder.find_spec(name)
            steps.append((entry, directory, _stamp(before, _mtime(directory), now)))
            if found is None or found.loader is None:
                continue     # not here, or a namespace portion: search on
            if found.origin != spec.origin or type(found.loader) is not SourceFileLoader:
                return None
            pkg_dir = pkg_stamp = None
            if found.submodule_search_locations is not None:
                pkg_dir = found.submodule_search_locations[0]
                pkg_mtime = _mtime(pkg_dir)
                pkg_stamp = _stamp(pkg_mtime, pkg_mtime, now)
            return tuple(steps), pkg_dir, pkg_stamp
    except Exception:
        pass
    return None


def find_spec(fullname, path, target, origin, search):
    """``PathFinder.find_spec(fullname, path, target)``, answered from
    ``search`` (what :func:`record` returned at DUMP for the module archived
    from ``origin``) for the directories whose mtime has not moved.  Raises
    what PathFinder raises."""
    global replayed
    if search is None or not _REPLAY:
        return PathFinder.find_spec(fullname, path, target)
    steps, pkg_dir, pkg_stamp = search
    if path is None:
        path = sys.path
    if type(path) is not list or len(path) < len(steps):
        return PathFinder.find_spec(fullname, path, target)
    last = len(steps) - 1
    for i, (entry, directory, stamp) in enumerate(steps):
        now = path[i]
        if type(now) is not str or now != entry:
            return PathFinder.find_spec(fullname, path, target)
        finder = _file_finder(entry)
        if finder is None and i < last:
            continue          # PathFinder skips it too
        if finder is None or finder is _MISSING:
            return PathFinder.find_spec(fullname, path, target)
        if (stamp is not None and stamp >= 0 and finder.path == directory
                and _mtime(directory) == stamp):
            if i < last:
                continue      # unchanged since the dump: not found there
            if pkg_dir is None or (pkg_stamp >= 0 and _mtime(pkg_dir) == pkg_stamp):
                replayed += 1
                return spec_from_file_location(
                    fullname, origin, loader=SourceFileLoader(fullname, origin),
                    submodule_search_locations=None if pkg_dir is None else [pkg_dir])
        # Changed since the dump: ask the directory, as PathFinder does.
        spec = finder.find_spec(fullname, target)
        if spec is not None and spec.loader is not None:
            return spec
        if i == last:
            break
    return PathFinder.find_spec(fullname, path, target)
