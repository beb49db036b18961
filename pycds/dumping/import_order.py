"""Record the order in which a TRACE run started importing modules.

The order in which a TRACE run *started* importing its modules: the
order of the module list it writes, which ``pycds.dump``/``_dump`` lay an
archive out from (pycds.dumping.order).

``sys.modules`` keeps modules in the order their import *finished*:
importlib moves a module to the end of ``sys.modules`` once its body has run
(``_load_unlocked`` in importlib/_bootstrap.py, 3.10-3.13), so a package
comes after every submodule its ``__init__`` imports.  A SHARE run asks for
code objects in the order imports start.

:class:`ImportOrderRecorder` sits first on ``sys.meta_path``, notes each name
the first time an import looks for it and declines (returns None), so the
import goes on exactly as without it.  Imports only builtins.
"""

import sys

__all__ = ["ImportOrderRecorder", "install", "uninstall", "in_start_order"]

# name -> rank of the first lookup
_started = {}


class ImportOrderRecorder:
    """Meta path finder that records names and finds nothing."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        # setdefault: one C call, so two threads never give one rank twice
        # to different names in a way that matters (ranks only order).
        _started.setdefault(fullname, len(_started))
        return None

    @staticmethod
    def invalidate_caches():
        pass


def install():
    """Put the recorder first on ``sys.meta_path``; False if it was there."""
    if ImportOrderRecorder in sys.meta_path:
        return False
    sys.meta_path.insert(0, ImportOrderRecorder)
    return True


def uninstall():
    """Take the recorder off ``sys.meta_path`` (what it noted stays)."""
    try:
        sys.meta_path.remove(ImportOrderRecorder)
    except ValueError:
        pass


def in_start_order(pairs):
    """Return pairs sorted by when their import started.

    ``pairs`` (``(name, module)``, in ``sys.modules`` order) sorted by
    when their import started.  Modules imported before the recorder was
    installed (at start-up, before ``.pth`` files ran) come first, in their
    ``sys.modules`` order."""
    rank = _started.get
    return sorted(pairs, key=lambda pair: rank(pair[0], -1))
