"""TRACE: write the names of the modules a program imported, one a line.

The list (``PYCDSLIST``) is the input of :func:`pycds._dump`.  Names are in
the order their imports started (pycds.dumping.import_order); written atomically at
exit.  The processes of one TRACE run (a program and the children that
inherit its environment: multiprocessing workers, subprocesses) write one
list: each adds the names the list lacks, under a lock, as the processes of
a DUMP run do with their archive.
"""

import os
import time

from . import _config, _log

_HEADER = "# pycds trace session "


def _why_not_list(head, size):
    # pycds._files.check_replaceable's judge of a module list: TRACE's header.
    if head.startswith(_HEADER.encode()):
        return ""
    return f"is not a pycds module list (a file of {size} bytes without its header line)"


LIST_FILE = ("module list", ".lst", _why_not_list)
# A module run as the program (multiprocessing's spawn imports the main
# module of the parent as __mp_main__): not importable by that name.
_MAIN_NAMES = ("__main__", "__mp_main__")


def module_names():
    """Return the names of imported modules an import would find again.

    Names of the modules imported so far that an import of that name
    finds again, the main module excluded: a module whose spec has that
    name (``pycds.dumping.dumper._spec_of``).  Not what extension modules put in
    sys.modules themselves (Cython's spec-less ``cython_runtime`` and
    ``_cython_3_x``), nor aliases (``sys.modules['alias'] = json``):
    :func:`pycds._dump` would warn about them."""
    from .dumping.dumper import spec_of, snapshot
    from .dumping.import_order import in_start_order
    return [name for name, module in in_start_order(snapshot())
            if name not in _MAIN_NAMES and spec_of(name, module) is not None]


def _session_names(path, session):
    """The names in the list at ``path`` if this session wrote it, else []."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    if not lines or lines[0] != _HEADER + session:
        return []
    return [line for line in lines[1:] if line and not line.startswith("#")]


def write_list(path, names, session):
    """Write names to path after those of the session's earlier processes.

    Write ``names`` to ``path``, one a line, via a temporary file, after
    the names an earlier process of ``session`` wrote there."""
    from ._files import check_replaceable
    from ._files import directory_lock
    check_replaceable(path, LIST_FILE)
    path = os.path.abspath(path)
    with directory_lock(path):
        old = _session_names(path, session)
        have = set(old)
        names = old + [name for name in names if name not in have]
        tmp = f"{path}.tmp.{os.getpid()}.{time.monotonic_ns()}"
        f = open(tmp, "x", encoding="utf-8")
        try:
            with f:
                f.write(_HEADER + session + "\n")
                for name in names:
                    f.write(name + "\n")
            check_replaceable(path, LIST_FILE)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)      # (ours: made by the open above)
            except OSError:
                pass
            raise


def trace_at_exit(config):
    """TRACE mode's atexit handler; never raises.

    Does nothing in a subinterpreter."""
    from ._config import is_main_interpreter
    if not is_main_interpreter():
        return
    try:
        write_list(config.listfile, module_names(), _config.trace_session())
    except BaseException as e:
        from ._files import NotReplaceable, say_not_written
        if isinstance(e, NotReplaceable):
            say_not_written(config.listfile, e, "TRACE wrote no module list", "PYCDSLIST")
            return
        _log.warning(f"module list not written to {config.listfile}: {e}")
