"""Start-up activation from the environment (run by the ``pycds.pth`` line).

``from_env()`` reads the PYCDS* variables once and switches on the mode:
SHARE installs the finder, DUMP and TRACE register an atexit handler,
MANUALLY does nothing.  It never raises: a problem is one warning on stderr
and the program runs as plain Python.  A second call is a no-op.
"""

import _thread
import sys

from . import _config, _log

_done = False


def is_main_interpreter(cheap_only=False):
    """True unless this is a subinterpreter.  pycds works in the main
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


def from_env():
    """Activate pycds as the environment says (see pycds._config)."""
    global _done
    if _done:
        return None
    _done = True
    if not is_main_interpreter(cheap_only=True):
        return None
    try:
        return _activate(_config.from_environ())
    except Exception as e:   # never break start-up
        _log.warning(f"pycds not activated: {e!r}")
        return None


def _activate(cfg):
    _log.level = cfg.verbose
    for problem in cfg.problems:
        _log.warning(problem)
    import os
    if cfg.mode in (_config.MODE_SHARE, _config.MODE_DUMP):
        if cfg.archive and os.environ.get("PYCDSARCHIVE") != cfg.archive:
            # Children use this very archive (SHARE) or merge into it (DUMP),
            # also when they start in another directory, where a relative
            # path would name another file, and when it is the default one
            # (a multiprocessing worker started as `python -c ...` would
            # otherwise have a default archive of its own, never written).
            os.environ["PYCDSARCHIVE"] = cfg.archive
    if cfg.mode == _config.MODE_SHARE:
        from . import finder
        return finder.install(cfg)
    if cfg.mode == _config.MODE_DUMP:
        import atexit
        from . import _capture, _import_order, dump
        _capture.install()
        _import_order.install()
        atexit.register(dump.dump_at_exit, cfg)
        dump.dump_session()   # children started from here on inherit it
    elif cfg.mode == _config.MODE_TRACE:
        import atexit
        from . import _import_order, trace
        _import_order.install()
        # Children write into the same list, wherever they start.
        os.environ["PYCDSLIST"] = cfg.listfile
        trace.trace_session()
        atexit.register(trace.trace_at_exit, cfg)
    return None


def _reset_for_tests():
    global _done
    _done = False
    if "pycds.finder" in sys.modules:
        sys.modules["pycds.finder"].uninstall()
