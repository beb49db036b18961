"""Print pycds's warnings and verbose lines on stderr.

Messages on stderr: warnings (not repeated by the processes a process
starts after printing one), verbose lines gated by PYCDSVERBOSE.

Format: ``[pycds] served <module>``, ``[pycds] fallback <module>: <reason>``,
``[pycds] warning: <text>``.  Imports only builtins and pycds._config (it
runs at start-up).
"""

import _imp
import os
import sys

from ._config import WARNED_KEEP, WARNED_VAR

# Set at start-up (pycds._start) from the configuration, and only imported then
# when PYCDSVERBOSE is set or a setting is bad; 0 = quiet, 1 = per module, 2 = detail.
level = 0

_DIGEST_KEY = 0x7079636473       # "pycds"


def say(msg):
    """Print ``[pycds] msg`` on stderr; never raise.

    Print ``[pycds] msg`` on stderr, whatever the verbosity (what a DUMP
    wrote: callers test PYCDSVERBOSE=0 first).  Never raises."""
    _emit("[pycds] " + msg)


def verbose(msg, at=1):
    """Print ``[pycds] msg`` on stderr if PYCDSVERBOSE >= at."""
    if level >= at:
        _emit("[pycds] " + msg)


def warning(msg):
    """Print a warning on stderr unless a parent printed it; never raise.

    Print ``[pycds] warning: msg`` on stderr, whatever the verbosity,
    unless a parent process printed it before starting this one: a child
    that inherited the same setting or archive (a spawn pool's eight
    workers refusing the stale archive their parent refused, say) does not
    repeat it.  (Siblings that each find a problem of their own -- workers
    that each fail to write at exit -- each say so.)  With PYCDSVERBOSE
    set, a repeat is a verbose line.  Never raises."""
    key = _digest(msg)
    try:
        seen = os.environ.get(WARNED_VAR, "").split()
    except Exception:
        seen = []
    if key in seen:
        verbose("warning already given in this process tree: " + msg, 1)
        return
    if _emit("[pycds] warning: " + msg):
        # Only what was said: a process without stderr leaves it to its
        # children to say.
        try:
            os.environ[WARNED_VAR] = " ".join((seen + [key])[-WARNED_KEEP:])
        except Exception:
            pass


def _digest(msg):
    """Return a digest of msg, 16 hex digits, the same in every process.

    A stable digest of the message, 16 hex digits: importlib's keyed
    SipHash (``_imp.source_hash``, PEP 552), unlike hash() the same in
    every process."""
    return _imp.source_hash(_DIGEST_KEY, msg.encode("utf-8", "surrogatepass")).hex()


def _emit(line):
    """Write ``line`` to stderr; whether it was written."""
    err = sys.stderr
    if err is None:
        return False
    try:
        err.write(line + "\n")
        err.flush()
    except Exception:
        return False
    return True
