"""Messages on stderr: warnings always, verbose lines gated by PYCDSVERBOSE.

Format: ``[pycds] served <module>``, ``[pycds] fallback <module>: <reason>``,
``[pycds] warning: <text>``.  Imports only builtins (it runs at start-up).
"""

import sys

# Set at start-up (pycds._start) from the configuration, and only imported then
# when PYCDSVERBOSE is set or a setting is bad; 0 = quiet, 1 = per module, 2 = detail.
level = 0


def verbose(msg, at=1):
    """Print ``[pycds] msg`` on stderr if PYCDSVERBOSE >= at."""
    if level >= at:
        _emit("[pycds] " + msg)


def warning(msg):
    """Print ``[pycds] warning: msg`` on stderr, whatever the verbosity."""
    _emit("[pycds] warning: " + msg)


def _emit(line):
    err = sys.stderr
    if err is None:
        return
    try:
        err.write(line + "\n")
        err.flush()
    except Exception:
        pass
