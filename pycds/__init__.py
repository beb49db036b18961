"""pycds: start-up accelerator for CPython.

A *dump* run records the code objects of the modules a program imports into
one archive laid out as live CPython objects; later *share* runs map it and
execute those code objects in place, skipping the read and unmarshal of each
``.pyc``.  Switched on by environment variables through ``pycds.pth``::

    PYCDSMODE=DUMP  PYCDSARCHIVE=app.img python app.py   # write the archive at exit
    PYCDSMODE=SHARE PYCDSARCHIVE=app.img python app.py   # run from the archive

Exports: :func:`stats`, :func:`_dump` (the API form of a dump) and
``__version__``.  Importing this package loads nothing heavy; the native
module is loaded on first use.
"""

__version__ = "0.1.0"
__all__ = ["stats", "_dump", "__version__"]


def stats():
    """Counters of this process's share mode (see pycds.finder.stats):
    modules served, fallbacks by reason, bytes loaded, load time in ms,
    modules read ahead, bytes given back after module bodies ran."""
    import sys
    finder = sys.modules.get("pycds.finder")
    if finder is None:
        return {"served": 0, "fallbacks": {}, "archive": None,
                "modules_in_archive": 0, "bytes_loaded": 0, "load_ms": 0.0,
                "open_ms": 0.0, "prefetched": 0, "released_bytes": 0,
                "searches_replayed": 0}
    return finder.stats()


def _dump(module_list="", archive=""):
    """Import the modules named in the file ``module_list`` (one a line) and
    write an archive of every module imported so far to ``archive``.

    An empty ``module_list`` archives the modules imported so far; an empty
    ``archive`` means ``$PYCDSARCHIVE`` (else the default per-program path).
    Returns the number of modules archived.  Raises OSError if the archive
    cannot be written, ValueError if no archive path is known.  Names that
    fail to import are reported on stderr and skipped.

    The code objects of the modules it imports are kept as they run
    (pycds._capture: an audit hook, which stays in the process, idle, once
    this returns), so that most need not be read again.
    """
    from . import _capture
    own_capture = not _capture.active() and _capture.install()
    try:
        return _import_and_dump(module_list, archive)
    finally:
        if own_capture:
            _capture.stop()


def _import_and_dump(module_list, archive):
    import importlib
    import os
    from . import _config, _import_order, _log, dump
    if module_list:
        with open(module_list, encoding="utf-8") as f:
            names = [line.strip() for line in f
                     if line.strip() and not line.lstrip().startswith("#")]
        # The archive lays modules out in the order their imports start.
        added = _import_order.install()
        try:
            for name in names:
                if name in ("__main__", "__mp_main__") or name in __import__("sys").modules:
                    continue
                try:
                    importlib.import_module(name)
                except BaseException as e:   # a listed module may exit or fail
                    _log.warning(f"_dump: cannot import {name}: {e!r}")
        finally:
            if added:
                _import_order.uninstall()
    if not archive:
        archive = os.environ.get("PYCDSARCHIVE", "") or _config.default_archive_path()
    if not archive:
        raise ValueError("no archive path: pass one or set PYCDSARCHIVE")
    n, _ = dump.dump_modules(dump.snapshot(), archive)
    return n
