"""The line a SHARE run prints at exit when its archive has gone stale.

Modules edited, upgraded, moved or shadowed by a new file since the dump
are imported plainly, one by one and silently (``python -m pycds verify``
lists them); once they are a noticeable share of what the run imported
from the archive, the run says so, once for its process tree (the process
that began it), on stderr.
"""

from .. import _log

# Stale modules, as a share of the archived modules the run imported
# (served + stale), from which the line is printed.
STALE_SHARE = 0.10


def report(n_stale, n_served, archive):
    """Warn about stale modules of archive if their share is high.

    Print the line for ``n_stale`` stale and ``n_served`` served
    modules of ``archive`` (a path), if the share is at least
    :data:`STALE_SHARE`."""
    total = n_stale + n_served
    if not total or n_stale < STALE_SHARE * total:
        return
    _log.warning(
        f"{n_stale} of the {total} archived modules this run imported were stale "
        f"(changed, or shadowed by a new file, since the dump) and imported plainly; dump again "
        f"(PYCDSMODE=DUMP), or run with PYCDSMODE=AUTO, which keeps {archive} current")
