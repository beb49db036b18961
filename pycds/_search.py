"""Plain import's search for a module, recorded at DUMP and replayed at SHARE.

To serve a module, the finder must know that plain import would load the
archived file now: ``PathFinder.find_spec`` walks the search path (``sys.path``
or the parent package's ``__path__``), and each directory's ``FileFinder``
stats the directory, re-reads its listing when its mtime moved, looks the
name up, and checks the candidates it lists (``name/__init__<suffix>``
files, ``name<suffix>`` files: importlib/_bootstrap_external.py, 3.10-3.13).
That walk was the largest part of what a SHARE import costs beyond executing
the module body.

A DUMP run records, per module, the directories that search examines up to
the one holding the module, each with a *stamp*: the directory's mtime,
ctime, inode and device (:class:`Recorder`).  A directory gets no stamp --
it is asked at every search -- when anything in it bears a name the search
looks at other than the archived file itself (a ``name/`` folder whose
``__init__`` may appear, a symlink whose target may appear: the listing would
not change), or when it changed in the two seconds before the record (a
later change within the file system's timestamp granularity could leave the
same times).  A SHARE run (:func:`find_spec`) skips a directory whose stamp
holds -- its listing is the one the dump searched, and nothing in it could
answer -- and asks the directory's ``FileFinder``, as plain import does,
when it does not.  When every stamp holds, the spec is built as
``FileFinder`` builds it (``spec_from_file_location``, same arguments)
without reading a directory.  Any other case (another search path, a path
importer cache entry that is not a standard ``FileFinder``, PathFinder or
FileFinder replaced by the program, ``-vv``) gets ``PathFinder``'s answer.

Imports only builtins and importlib's bootstrap (loaded at start-up).
"""

import os
import sys
from _frozen_importlib_external import (FileFinder, PathFinder,
                                        SourceFileLoader,
                                        _get_supported_file_loaders,
                                        spec_from_file_location)

from ._config import FILE_LOADERS, search_replayable
from ._pyc import stat_or_none

__all__ = ["Recorder", "find_spec", "replayed"]

_INITS = frozenset("__init__" + suffix for suffix, _ in FILE_LOADERS)
_MISSING = object()

# A directory changed this recently when the dump records it gets no stamp:
# a later change within the file system's timestamp granularity (1 s on
# ext3, 2 s on FAT; coarse clock ticks elsewhere) could leave its times as
# recorded.  Git's index treats "racily clean" files the same way.
_RACY_NS = 2_000_000_000

# Modules whose search this process answered from the stamps alone.
replayed = 0


def _stamp(path):
    """(st_mtime_ns, st_ctime_ns, st_ino, st_dev) of path, or None."""
    st = stat_or_none(path)
    if st is None:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class Recorder:
    """Record the searches of one DUMP run's modules.

    The searches of one DUMP run's modules (each directory listed once,
    freshly: the process's FileFinder caches may predate the last change)."""

    def __init__(self):
        import time
        self._since = time.time_ns() - _RACY_NS
        self._dirs = {}
        self._finders = {}

    def _listing(self, directory):
        """(stamp or None, names or None) of ``directory``, listed now."""
        got = self._dirs.get(directory)
        if got is None:
            stamp = _stamp(directory)
            try:
                names = frozenset(os.listdir(directory))
            except (OSError, ValueError):
                names = None
            if stamp is not None and (stamp != _stamp(directory)
                                      or max(stamp[0], stamp[1]) >= self._since):
                stamp = None
            got = self._dirs[directory] = (stamp, names)
        return got

    def record(self, name, spec):
        """Return the search plain import makes for name now, or None.

        The search plain import makes for ``name`` now, if it ends at
        ``spec.origin`` with the stock ``SourceFileLoader``: ``(steps,
        pkg_dir, pkg_stamp)``; ``steps`` holds ``(path entry, directory,
        stamp)`` for each entry examined (directory None where the entry has
        no finder, stamp None where the directory must be asked at every
        search) and ``pkg_dir`` is the package's directory (None for a
        module).  None when the search cannot be replayed.  Runs no path
        hook; never raises."""
        try:
            return self._record(name, spec)
        except Exception:
            return None

    def _record(self, name, spec):
        parent, _, tail = name.rpartition(".")
        if parent:
            path = getattr(sys.modules.get(parent), "__path__", None)
        else:
            path = sys.path
        if type(path) is not list:
            return None
        candidates = {tail} | {tail + suffix for suffix, _ in FILE_LOADERS}
        cache = sys.path_importer_cache
        steps = []
        for entry in path:
            if type(entry) is not str:
                return None
            finder = cache.get(entry or os.getcwd(), _MISSING)
            if finder is None:
                steps.append((entry, None, None))
                continue
            if type(finder) is not FileFinder or finder._loaders != FILE_LOADERS:
                return None       # not cached (_MISSING), or not the standard one
            directory = finder.path
            stamp, names = self._listing(directory)
            if names is None:
                return None
            here = names & candidates
            if not here:
                steps.append((entry, directory, stamp))
                continue
            base = os.path.basename(spec.origin)
            if here == {base} and spec.origin == f"{directory}/{base}":
                # The archived module's file, alone of its names: what
                # FileFinder answers (the dump just read the file).
                steps.append((entry, directory, stamp))
                return tuple(steps), None, None
            if here == {tail} and spec.origin == f"{directory}/{tail}/{base}":
                pkg_dir = f"{directory}/{tail}"
                pkg_stamp, inside = self._listing(pkg_dir)
                if inside is not None and inside & _INITS == {base}:
                    steps.append((entry, directory, stamp))
                    return tuple(steps), pkg_dir, pkg_stamp
            # Anything else: ask a FileFinder of this directory's own.
            fresh = self._finders.get(directory)
            if fresh is None:
                fresh = FileFinder(directory, *_get_supported_file_loaders())
                self._finders[directory] = fresh
            found = fresh.find_spec(name)
            if found is None or found.loader is None:
                # A namespace portion, a dangling symlink, a folder without
                # __init__: what it answers may change with no change here.
                steps.append((entry, directory, None))
                continue
            if found.origin != spec.origin or type(found.loader) is not SourceFileLoader:
                return None
            pkg_dir = None
            if found.submodule_search_locations is not None:
                pkg_dir = found.submodule_search_locations[0]
            # Other names here, or around the package's __init__: asked.
            steps.append((entry, directory, None))
            return tuple(steps), pkg_dir, None
        return None


def own_search_methods(finder):
    """Return whether FileFinder finder has a search method of its own.

    Whether FileFinder ``finder`` has a search method of its own in its
    dict (a program's wrapper), which PathFinder calls: then its search is
    not replayed."""
    d = finder.__dict__
    return "find_spec" in d or "_get_spec" in d or "_fill_cache" in d


def find_spec(fullname, path, target, origin, search, stamps=None):
    """Answer PathFinder.find_spec from a recorded search; raise as it does.

    ``PathFinder.find_spec(fullname, path, target)``, answered from
    ``search`` (what :meth:`Recorder.record` returned at DUMP for the module
    archived from ``origin``) for the directories whose stamp holds.
    ``stamps``: the stamps of the steps' directories (None where a step has
    none) and of the package directory, taken a moment ago by the native hit
    path (native/archive/loader/find.c); None: take them now.  Raises what
    PathFinder raises."""
    global replayed
    if search is None or not search_replayable():
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
        finder = PathFinder._path_importer_cache(entry)
        if finder is None and i < last:
            continue          # PathFinder skips it too
        if type(finder) is not FileFinder or finder._loaders != FILE_LOADERS \
                or own_search_methods(finder):
            return PathFinder.find_spec(fullname, path, target)
        if stamp is not None and finder.path == directory and \
                (_stamp(directory) if stamps is None else stamps[0][i]) == stamp:
            if i < last:
                continue      # unchanged since the dump: nothing of that name
            if pkg_dir is None or (pkg_stamp is not None and (
                    _stamp(pkg_dir) if stamps is None else stamps[1]) == pkg_stamp):
                replayed += 1
                return spec_from_file_location(
                    fullname, origin, loader=SourceFileLoader(fullname, origin),
                    submodule_search_locations=None if pkg_dir is None else [pkg_dir])
        # Changed since the dump, or to be asked always: ask the directory,
        # as PathFinder does.
        spec = finder.find_spec(fullname, target)
        if spec is not None and spec.loader is not None:
            return spec
        if i == last:
            break
    return PathFinder.find_spec(fullname, path, target)
