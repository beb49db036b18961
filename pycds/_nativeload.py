"""Loading the native module: ``pycds._nativeapi`` (which imports
``pycds._native``) with pycds's own ``_cffi_backend``, the program's view of
``_cffi_backend`` left as it was.

Called on the first archive hit of a SHARE run, at the start of a DUMP run
(:func:`pycds._dumper.preload`) and by ``pycds._dump``.
"""

import sys

import _frozen_importlib_external as _bootstrap_external

__all__ = ["import_native"]


def import_native(search_path=None):
    """``pycds._nativeapi``, imported with pycds's own ``_cffi_backend``.

    Where the program has imported a ``_cffi_backend``, the native module
    uses that one.  Else pycds's is loaded from ``search_path`` (the search
    path as start-up left it, where pycds and its dependencies were found),
    not from what the program's ``sys.path`` names now -- a
    ``_cffi_backend`` beside its script, a vendored cffi put first -- and
    taken out of ``sys.modules`` again once the native module has it (the
    library stays loaded): the program's own ``import _cffi_backend`` is
    then plain import's.  (Left: a thread of the program importing
    ``_cffi_backend`` during the first archive hit gets pycds's: the native
    module's init imports it by name through ``sys.modules``.)  The
    module's import lock is held meanwhile, so that a thread's import of it
    already under way finishes first, and is the one used.  The program's
    audit hooks see the import (``_bootstrap._load`` raises the "import"
    event) and may refuse it.  Raises ImportError where it cannot be
    loaded."""
    api = sys.modules.get(__package__ + "._nativeapi")
    if api is not None:
        return api
    import _frozen_importlib as _bootstrap
    with _bootstrap._ModuleLockManager("_cffi_backend"):
        if "_cffi_backend" in sys.modules:
            from . import _nativeapi
            return _nativeapi
        spec = None
        if search_path:
            spec = _bootstrap_external.PathFinder.find_spec("_cffi_backend",
                                                            list(search_path))
        if spec is not None:
            ours = _bootstrap._load(spec)
        else:
            import _cffi_backend as ours
        try:
            from . import _nativeapi
        finally:
            if sys.modules.get("_cffi_backend") is ours:
                del sys.modules["_cffi_backend"]
    return _nativeapi
