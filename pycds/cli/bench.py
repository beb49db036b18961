"""``python -m pycds bench [options] -- COMMAND [ARG ...]``: what SHARE does.

Runs the command line as given (no shell; ``sh -c '...'`` for shell
syntax), in the current directory with stdin from /dev/null: once plain to
check that it works, once under ``PYCDSMODE=DUMP`` to make an archive (a
temporary one, removed afterwards, unless ``--archive`` names one), then
``--reps`` times plain and as many times under ``PYCDSMODE=SHARE``, the two
interleaved rep by rep so that machine noise hits both alike, and once more
under SHARE with ``PYCDSVERBOSE=1`` to count the modules served.  Reports
the medians of wall time and CPU time (user+sys of the process and the
children it waited for, from wait4) and the median of the per-rep ratios
SHARE/plain; warns when the exit status or the output differs between
plain and SHARE runs.  ``--auto`` times ``PYCDSMODE=AUTO`` with the same
archive as a third variant (its steady state, nothing left to write) and
reports AUTO/SHARE.

The environment is passed through unchanged, except that plain runs get no
PYCDS* variable at all, and DUMP and SHARE runs get PYCDSMODE and
PYCDSARCHIVE from this command and keep the user's other pycds settings
(PYCDSCHECK, say; not PYCDSVERBOSE).

Exit status: 0 when the command was measured, 1 when it exited with a
non-zero status (unless ``--ignore-failure``) or wrote no archive, 2 on a
usage error, a command that cannot be started, or an ``--archive`` SHARE
would not use.

Also here, for the reference benchmark (``benchmarks/bench.py``) as well as
this command: :func:`run`, :func:`median`, :func:`ratio` and
:func:`interleave`.  Never imported by the import hook.
"""

import argparse
import os
import sys
import time

__all__ = ["run", "median", "ratio", "interleave", "add_parser", "cmd"]


# ---- measuring, shared with benchmarks/bench.py ------------------------------

def run(argv, env, executable=None):
    """Run argv; return (wall, cpu, stdout, stderr, status); raise OSError.

    Run ``argv`` (``executable``, default ``argv[0]``, is the file
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
    """Read pipes r and r2 to their ends and close them; return both texts.

    Read the pipes ``r`` and ``r2`` to their ends (both at once, so that
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
    """Return the median of the per-rep ratios a[i]/b[i].

    Median of the per-rep ratios a[i]/b[i] (pairs with b[i] == 0 left
    out): each rep's variants ran side by side, so each pair saw the same
    machine."""
    return median([x / y for x, y in zip(a, b) if y])


def interleave(variants, reps, run_one, warmup=1, progress=None):
    """Run variants interleaved, after warm-ups; return their results.

    Run each of ``variants`` (objects with a ``name``) ``warmup`` times
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


# ---- python -m pycds bench ---------------------------------------------------

# Settings this command makes for DUMP and SHARE runs (a user's value would
# send a run elsewhere or flood its stderr); plain runs get no PYCDS* at all.
_OWN = ("PYCDSMODE", "PYCDSARCHIVE", "PYCDSVERBOSE", "PYCDSLIST")
_SERVED = "[pycds] served "
_FALLBACK = "[pycds] fallback "
_WARNING = "[pycds] warning: "


class _Variant:
    def __init__(self, name, env):
        self.name = name
        self.env = env
        self.exits = set()      # exit statuses seen
        self.outs = set()       # hashes of stdout seen
        self.errs = set()       # hashes of stderr seen
        self.pycds_lines = []   # pycds warnings on its stderr


def _envs(archive):
    """The environments of plain, DUMP and SHARE runs."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("PYCDS")}
    # PYCDS_* are pycds's own bookkeeping (warnings given, dump sessions).
    user = {k: v for k, v in os.environ.items()
            if k.startswith("PYCDS") and not k.startswith("PYCDS_") and k not in _OWN}
    dump = dict(plain, **user, PYCDSMODE="DUMP", PYCDSARCHIVE=archive)
    share = dict(plain, **user, PYCDSMODE="SHARE", PYCDSARCHIVE=archive)
    return plain, dump, share


class _Failed(Exception):
    """The command exited with a non-zero status in run ``what``."""

    def __init__(self, what, rc, err):
        super().__init__(what)
        self.what, self.rc, self.err = what, rc, err


class _Progress:
    """One line on stderr, rewritten in place; only on a terminal."""

    def __init__(self, stream):
        self.stream = stream
        self.on = stream.isatty()
        self.shown = False

    def show(self, text):
        if self.on:
            self.stream.write(f"\r[pycds bench] {text}\x1b[K")
            self.stream.flush()
            self.shown = True

    def clear(self):
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _count(text, least):
    try:
        n = int(text)
    except ValueError:
        n = least - 1
    if n < least:
        kind = "a positive integer" if least else "an integer, 0 or more"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}")
    return n


def _nonneg(text):
    return _count(text, 0)


def _positive(text):
    return _count(text, 1)


def add_parser(subparsers):
    """Add the ``bench`` subcommand to ``subparsers`` (of python -m pycds)."""
    p = subparsers.add_parser(
        "bench", help="time a command line plain and under SHARE",
        usage="python -m pycds bench [options] -- COMMAND [ARG ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(__doc__.split("\n\n")[1:3]).replace("``", ""),
        epilog=__doc__.split("\n\n")[3].replace("``", ""))
    p.add_argument("--reps", type=_positive, default=11,
                   help="timed runs of each variant (default: 11)")
    p.add_argument("--warmup", type=_nonneg, default=1,
                   help="untimed runs of each variant first (default: 1)")
    p.add_argument("--archive", metavar="PATH", default="",
                   help="share this archive, made by a DUMP run if it does not "
                        "exist, and keep it (default: a temporary one)")
    p.add_argument("--json", metavar="FILE", default="",
                   help="also write the times of every run here")
    p.add_argument("--auto", action="store_true",
                   help="also time PYCDSMODE=AUTO with the same archive (its steady "
                        "state: nothing to write) beside SHARE")
    p.add_argument("-i", "--ignore-failure", action="store_true",
                   help="measure a command that exits with a non-zero status")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd, bench_parser=p)
    return p


def cmd(args):
    """Run ``python -m pycds bench``; return its exit status."""
    import shutil
    import tempfile
    command = args.command
    # argparse keeps the "--" that starts a REMAINDER argument.
    if not command or command[0] != "--":
        args.bench_parser.error("give the command line after --, as in "
                                "python -m pycds bench -- python app.py")
    argv = command[1:]
    if not argv:
        args.bench_parser.error("no command line after --")
    if args.json:
        d = os.path.dirname(os.path.abspath(args.json))
        if not (os.path.isdir(d) and os.access(d, os.W_OK)):
            args.bench_parser.error(f"--json {args.json}: cannot write in {d}")
    exe = shutil.which(argv[0])
    if exe is None:
        named = os.sep in argv[0] and os.path.isfile(argv[0])
        why = "not executable" if named else "command not found"
        print(f"pycds bench: {argv[0]}: {why}", file=sys.stderr)
        return 2
    if args.archive and os.path.exists(args.archive):
        refused = _refusal(args.archive)
        if refused:
            print(f"pycds bench: {args.archive}: SHARE would not use it: {refused}",
                  file=sys.stderr)
            return 2
    tmp = None
    if args.archive:
        archive = os.path.abspath(args.archive)
    else:
        tmp = tempfile.mkdtemp(prefix="pycds-bench-")
        archive = os.path.join(tmp, "bench.img")
    progress = _Progress(sys.stderr)
    try:
        return _bench(args, argv, exe, archive, tmp is not None, progress)
    except _Failed as e:
        progress.clear()
        tail = "\n".join(e.err.rstrip().splitlines()[-20:])
        print(f"pycds bench: the command exited with status {e.rc} ({e.what})"
              + (f"; its stderr ends:\n{tail}" if tail else ""), file=sys.stderr)
        return 1
    except OSError as e:       # the command cannot be started, --json not written
        progress.clear()
        print(f"pycds bench: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        progress.clear()
        print("pycds bench: interrupted", file=sys.stderr)
        return 130
    finally:
        progress.clear()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _bench(args, argv, exe, archive, temporary, progress):
    plain_env, dump_env, share_env = _envs(archive)
    plain = _Variant("plain", plain_env)
    share = _Variant("SHARE", share_env)
    variants = [plain, share]
    if getattr(args, "auto", False):
        variants.append(_Variant("AUTO", dict(share_env, PYCDSMODE="AUTO")))

    def once(v, what):
        wall, cpu, out, err, rc = run(argv, v.env, exe)
        if rc != 0 and not args.ignore_failure:
            raise _Failed(what, rc, err)
        v.exits.add(rc)
        v.outs.add(hash(out))
        v.errs.add(hash(err))
        if v is not plain:
            v.pycds_lines += [line for line in err.splitlines() if line.startswith(_WARNING)]
        return wall * 1e3, cpu * 1e3

    progress.show("plain run (checks the command)")
    once(plain, "plain run, not under pycds")
    made = not os.path.exists(archive)
    if made:
        progress.show("DUMP run (makes the archive)")
        _, _, _, err, rc = run(argv, dump_env, exe)
        if rc != 0 and not args.ignore_failure:
            raise _Failed("DUMP run", rc, err)
        if not os.path.exists(archive):
            progress.clear()
            said = [line for line in err.splitlines() if line.startswith(_WARNING)]
            print("pycds bench: the DUMP run wrote no archive: the command must run "
                  "a Python with pycds installed that exits normally (atexit)"
                  + "".join("\n  " + line for line in said), file=sys.stderr)
            return 1
    times = {v.name: [] for v in variants}    # the timed runs so far
    timed = [False]

    def show(rep, v):
        timed[0] = rep > 0
        if rep == 0:
            progress.show(f"warm-up: {v.name}")
            return
        so_far = ", ".join(f"{k} {median([t[0] for t in ts]):.1f} ms"
                           for k, ts in times.items() if ts)
        progress.show(f"rep {rep}/{args.reps}: {v.name}" + (f"  ({so_far})" if so_far else ""))

    def one(v):
        t = once(v, f"{v.name} run")
        if timed[0]:
            times[v.name].append(t)
        return t

    res = interleave(variants, args.reps, one, args.warmup, show)
    progress.show("SHARE run with PYCDSVERBOSE=1 (counts the modules served)")
    _, _, _, err, rc = run(argv, dict(share_env, PYCDSVERBOSE="1"), exe)
    if rc != 0 and not args.ignore_failure:
        raise _Failed("SHARE run with PYCDSVERBOSE=1", rc, err)
    lines = err.splitlines()
    served = sum(line.startswith(_SERVED) for line in lines)
    fallbacks = sum(line.startswith(_FALLBACK) for line in lines)
    progress.clear()

    nmodules, size = _archive_facts(archive)
    result = {
        "command": argv, "reps": args.reps, "warmup": args.warmup,
        "archive": None if temporary else archive, "archive_modules": nmodules,
        "archive_bytes": size, "served": served, "fallbacks": fallbacks,
        "runs": {k: [list(t) for t in v] for k, v in res.items()},
        "median_ms": {k: {"wall": median([t[0] for t in v]), "cpu": median([t[1] for t in v])}
                      for k, v in res.items()},
        "ratio": {what: ratio([t[i] for t in res["SHARE"]], [t[i] for t in res["plain"]])
                  for i, what in enumerate(("wall", "cpu"))},
    }
    if "AUTO" in res:
        result["auto_ratio"] = {
            what: ratio([t[i] for t in res["AUTO"]], [t[i] for t in res["SHARE"]])
            for i, what in enumerate(("wall", "cpu"))}
    result["warnings"] = warnings = _differences(plain, share)
    for v in variants[2:]:
        warnings += [w.replace("SHARE", v.name) for w in _differences(plain, v)]
    if served == 0:
        warnings.append("no module was served from the archive" + (
            ": the command imports no module pycds archives" if not nmodules else
            f" ({fallbacks} imported plainly; PYCDSVERBOSE=1 says why)"))
    print(_table(result, made, temporary))
    for w in warnings:
        print(f"pycds bench: warning: {w}", file=sys.stderr)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _differences(plain, share):
    """Warnings for what differs between the plain and the SHARE runs."""
    out = []
    if plain.exits != share.exits:
        out.append(f"exit status differs: plain {sorted(plain.exits)}, "
                   f"SHARE {sorted(share.exits)}")
    for what, p, s in (("stdout", plain.outs, share.outs),
                       ("stderr", plain.errs, share.errs)):
        if len(p) > 1:
            out.append(f"{what} varies from one plain run to the next: "
                       f"not compared with SHARE")
        elif p != s:
            out.append(f"{what} differs between plain and SHARE runs")
    seen = []
    for line in share.pycds_lines:
        if line not in seen:
            seen.append(line)
    out += [f"under SHARE: {line}" for line in seen[:5]]
    return out


def _refusal(path):
    """Return why SHARE would not use the archive at path, or None.

    Why SHARE would not use the archive at ``path`` (damaged, not an
    archive, refused for its owner or place), or None; an archive of
    another interpreter is the command's to judge."""
    from .._archive import Index
    from ..errors import ArchiveFormatError, ForeignArchiveError
    try:
        Index.open(path, check_interpreter=False).close()
    except ForeignArchiveError:
        return None
    except ArchiveFormatError as e:
        return str(e)
    return None


def _archive_facts(path):
    """Return (modules, bytes) of the archive at path, or None.

    (modules, bytes) of the archive at ``path``; None for what cannot
    be read (an archive of another CPython version has its module count)."""
    from .._archive import Index
    from ..errors import ArchiveFormatError
    try:
        size = os.path.getsize(path)
        idx = Index.open(path, check_owner=False, check_interpreter=False)
    except (OSError, ArchiveFormatError):
        return None, None
    try:
        return idx.header.nmodules, size
    finally:
        idx.close()


def _table(r, made, temporary):
    import shlex
    from .cache import counted
    if r["archive_modules"] is None:
        facts = "unreadable"
    else:
        facts = (f"{counted(r['archive_modules'], 'module')}, "
                 f"{r['archive_bytes'] / 2**20:.1f} MiB")
    where = "temporary" if temporary else r["archive"]
    how = "made by a DUMP run" if made else "given"
    m = r["median_ms"]
    rows = [("wall ms", "wall"), ("CPU ms", "cpu")]
    lines = [f"command:  {shlex.join(r['command'])}",
             f"archive:  {where}, {how}: {facts}",
             f"served:   {counted(r['served'], 'module')} in a SHARE run"
             + (f", {r['fallbacks']} fell back to plain import" if r["fallbacks"] else ""),
             f"reps:     {r['reps']} of each, interleaved, after "
             f"{counted(r['warmup'], 'warm-up')}",
             "",
             f"{'':10} {'plain':>10} {'SHARE':>10} {'SHARE/plain':>12}"
             + (f" {'AUTO':>10} {'AUTO/SHARE':>11}" if "AUTO" in m else "")]
    for label, key in rows:
        lines.append(f"{label:10} {m['plain'][key]:10.1f} {m['SHARE'][key]:10.1f} "
                     f"{r['ratio'][key]:12.3f}"
                     + (f" {m['AUTO'][key]:10.1f} {r['auto_ratio'][key]:11.3f}"
                        if "AUTO" in m else ""))
    lines += ["", "Times are medians; a ratio is the median of the per-rep ratios.",
              "CPU: user+sys of the command and the processes it waited for."]
    return "\n".join(lines)
