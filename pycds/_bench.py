"""Measuring commands side by side: the primitives of the reference
benchmark (``benchmarks/bench.py``, which imports them from the installed
package): :func:`run`, :func:`median`, :func:`ratio` and
:func:`interleave`.  Never imported by the import hook.
"""

import os
import time

__all__ = ["run", "median", "ratio", "interleave"]


# ---- measuring, shared with benchmarks/bench.py ------------------------------

def run(argv, env, executable=None):
    """Run ``argv`` (``executable``, default ``argv[0]``, is the file
    started) with stdin from /dev/null; return (wall seconds, cpu seconds,
    stdout, stderr, exit status).  CPU time is user+sys of the child from
    wait4 (less sensitive than wall time to other processes on a shared
    machine).  Raises OSError if the child cannot be started."""
    r, w = os.pipe()
    r2, w2 = os.pipe()
    t0 = time.perf_counter()
    try:
        pid = os.posix_spawn(executable or argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w2, 2),
            (os.POSIX_SPAWN_CLOSE, r), (os.POSIX_SPAWN_CLOSE, r2),
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
    except OSError:
        for fd in (r, w, r2, w2):
            os.close(fd)
        raise
    os.close(w)
    os.close(w2)
    out = _read_all(r, r2)
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, out[0], out[1], rc


def _read_all(r, r2):
    """Read the pipes ``r`` and ``r2`` to their ends (both at once, so that
    a child filling one is never blocked), close them; return both texts."""
    import selectors
    sel = selectors.DefaultSelector()
    bufs = {r: [], r2: []}
    sel.register(r, selectors.EVENT_READ)
    sel.register(r2, selectors.EVENT_READ)
    open_fds = 2
    while open_fds:
        for key, _ in sel.select():
            data = os.read(key.fd, 65536)
            if data:
                bufs[key.fd].append(data)
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_fds -= 1
    sel.close()
    return (b"".join(bufs[r]).decode("utf-8", "replace"),
            b"".join(bufs[r2]).decode("utf-8", "replace"))


def median(xs):
    """The median of ``xs``; NaN for none."""
    import statistics
    return statistics.median(xs) if xs else float("nan")


def ratio(a, b):
    """Median of the per-rep ratios a[i]/b[i] (pairs with b[i] == 0 left
    out): each rep's variants ran side by side, so each pair saw the same
    machine."""
    return median([x / y for x, y in zip(a, b) if y])


def interleave(variants, reps, run_one, warmup=1, progress=None):
    """Run each of ``variants`` (objects with a ``name``) ``warmup`` times
    (results dropped: page cache, .pyc files, archives), then ``reps``
    times, rotating the order each rep.  ``run_one(v)`` runs ``v`` once and
    returns its result; ``progress(rep, v)``, if given, is called before
    each run (rep 0: a warm-up).  Returns {name: [results in rep order]}."""
    out = {v.name: [] for v in variants}
    for v in variants:
        for _ in range(warmup):
            if progress:
                progress(0, v)
            run_one(v)
    for i in range(reps):
        order = variants[i % len(variants):] + variants[:i % len(variants)]
        for v in order:
            if progress:
                progress(i + 1, v)
            out[v.name].append(run_one(v))
    return out
