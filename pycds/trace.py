"""TRACE: write the names of the modules a program imported, one a line.

The list (``PYCDSLIST``) is the input of :func:`pycds._dump`.  Names are in
the order their imports started (pycds._import_order); written atomically at
exit.
"""

import os
import sys

from . import _import_order, _log


def module_names():
    """Names of the modules imported so far, ``__main__`` excluded."""
    pairs = _import_order.in_start_order(list(sys.modules.items()))
    return [name for name, _ in pairs if name != "__main__"]


def write_list(path, names):
    """Write ``names`` to ``path``, one a line, via a temporary file."""
    path = os.path.abspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for name in names:
            f.write(name + "\n")
    os.replace(tmp, path)


def trace_at_exit(config):
    """atexit handler of TRACE mode; never raises; nothing in a
    subinterpreter."""
    from ._activate import is_main_interpreter
    if not is_main_interpreter():
        return
    try:
        write_list(config.listfile, module_names())
    except BaseException as e:
        _log.warning(f"module list not written to {config.listfile}: {e}")
