"""A soak: processes dumping and sharing one archive of a real program
while its sources are edited.

    python scripts/soak.py [--minutes 10] [--dumpers 4] [--sharers 12]
                           [--edit-every 3] [--python PY] [--workdir DIR]

The program is a package of its own (``app``: four modules the editor
rewrites, one it never touches) on top of json, email, decimal, argparse,
http.client and, where installed, numpy and Flask.  Each edited module
holds a version number and a function of it; the program prints, per
module, the version it imported and the function's value.  The editor
replaces one module at a time (a new file renamed over the old, a new size
each time, as editors save) every ``--edit-every`` seconds and logs when.
After a first dump, ``--dumpers`` loops run the program under DUMP and
``--sharers`` under SHARE, all on one archive, for ``--minutes``.

A run passes when its exit status is 0, it printed for every module a
version that was that module's current one at some moment of the run and
the function's value of that version (what a plain run at that moment
prints), and it said no warning other than the stale-archive line.  Exits 1
on any crash, mismatch, warning or temporary file left in the archive's
directory at the end.
"""

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

EDITED = ("alpha", "beta", "gamma", "delta")
MAIN = """\
import json, email.parser, decimal, argparse, http.client
try:
    import numpy
except ImportError:
    numpy = None
try:
    import flask
except ImportError:
    flask = None
from app import alpha, beta, gamma, delta, fixed
for m in (alpha, beta, gamma, delta):
    print(m.__name__, m.VERSION, m.value())
print("fixed", fixed.total(), numpy is not None, flask is not None)
"""
FIXED = """\
import decimal
def total():
    return str(sum(decimal.Decimal(i) / 7 for i in range(50)))
"""


def module_source(name, version):
    """An edited module at ``version``; its size changes with every version
    (CPython's .pyc check is mtime in seconds and size)."""
    pad = "#" * (version % 5 + 1)
    return (f"VERSION = {version}\n"
            f"def value():\n"
            f"    return sum(i * {version} for i in range({len(name)} + {version} % 13))\n"
            f"{pad}\n")


def expected_value(name, version):
    return sum(i * version for i in range(len(name) + version % 13))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    env.update(extra)
    return env


class Editor(threading.Thread):
    """Rewrites one edited module every ``every`` seconds; keeps, per
    module, the (time it became current, version) history."""

    def __init__(self, pkg, every, stop):
        super().__init__(daemon=True)
        self.pkg, self.every, self.stop = pkg, every, stop
        # per module: (replace began, replace ended, version), in order
        self.history = {n: [(0.0, 0.0, 0)] for n in EDITED}
        self.lock = threading.Lock()
        self.edits = 0

    def run(self):
        i = 0
        while not self.stop.wait(self.every):
            name = EDITED[i % len(EDITED)]
            i += 1
            with self.lock:
                version = self.history[name][-1][2] + 1
            path = os.path.join(self.pkg, f"{name}.py")
            tmp = f"{path}.edit"
            with open(tmp, "w") as f:
                f.write(module_source(name, version))
            before = time.monotonic()
            os.replace(tmp, path)
            after = time.monotonic()
            with self.lock:
                self.history[name].append((before, after, version))
                self.edits += 1

    def versions_during(self, name, t0, t1):
        """The versions current at some moment of [t0, t1]."""
        with self.lock:
            h = list(self.history[name])
        out = set()
        for k, (since, _, v) in enumerate(h):
            until = h[k + 1][1] if k + 1 < len(h) else float("inf")
            if since <= t1 and until >= t0:
                out.add(v)
        return out


def check(out, editor, t0, t1):
    """Why a run's output is not what a plain run at some moment of
    [t0, t1] prints, or None."""
    lines = out.splitlines()
    if len(lines) != len(EDITED) + 1:
        return f"output has {len(lines)} lines"
    for name, line in zip(EDITED, lines):
        parts = line.split()
        if len(parts) != 3 or parts[0] != f"app.{name}":
            return f"bad line {line!r}"
        version, value = int(parts[1]), int(parts[2])
        if version not in editor.versions_during(name, t0, t1):
            return (f"app.{name} version {version} was not current during the run "
                    f"(current then: {sorted(editor.versions_during(name, t0, t1))})")
        if value != expected_value(name, version):
            return f"app.{name} value {value} is not version {version}'s"
    return None


def setup(workdir):
    pkg = os.path.join(workdir, "app")
    os.makedirs(pkg, exist_ok=True)
    for path, text in [(os.path.join(pkg, "__init__.py"), ""),
                       (os.path.join(pkg, "fixed.py"), FIXED),
                       (os.path.join(workdir, "main.py"), MAIN)] + \
            [(os.path.join(pkg, f"{n}.py"), module_source(n, 0)) for n in EDITED]:
        with open(path, "w") as f:
            f.write(text)
    adir = os.path.join(workdir, "archive")
    os.makedirs(adir, exist_ok=True)
    return pkg, os.path.join(adir, "app.img")


def soak(python, workdir, minutes, dumpers, sharers, every, log=print, runs_at_least=0):
    """Run the soak; returns a dict of counts and the failures.  With
    ``runs_at_least``, each loop goes on past ``minutes`` (up to 10 times as
    long) until it has made that many runs: a slow machine still soaks."""
    pkg, archive = setup(workdir)
    first = subprocess.run([python, "main.py"], cwd=workdir, capture_output=True,
                           text=True, env=clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=archive))
    if first.returncode != 0 or not os.path.exists(archive):
        raise SystemExit(f"the first dump failed:\n{first.stderr}")
    stop = threading.Event()
    editor = Editor(pkg, every, stop)
    stats = collections.Counter()
    failures = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline, last = start + minutes * 60, start + minutes * 600

    def loop(mode):
        env = clean_env(PYCDSMODE=mode, PYCDSARCHIVE=archive, PYCDSVERBOSE="1")
        runs = 0
        while time.monotonic() < (deadline if runs >= runs_at_least else last):
            runs += 1
            t0 = time.monotonic()
            p = subprocess.run([python, "main.py"], cwd=workdir, env=env,
                               capture_output=True, text=True, timeout=600)
            t1 = time.monotonic()
            served = sum(1 for ln in p.stderr.splitlines()
                         if ln.startswith("[pycds] served app."))
            said = [ln for ln in p.stderr.splitlines()
                    if ln.startswith("[pycds] warning") and "were stale" not in ln]
            why = (f"exit status {p.returncode}: {p.stderr[-500:]}" if p.returncode
                   else check(p.stdout, editor, t0, t1) or
                   (f"warning: {said}" if said else None))
            with lock:
                stats[f"{mode} runs"] += 1
                stats[f"{mode} app modules served"] += served
                if why:
                    failures.append(f"{mode}: {why}")
                    log(f"FAIL {mode}: {why}")

    threads = [threading.Thread(target=loop, args=("DUMP",)) for _ in range(dumpers)]
    threads += [threading.Thread(target=loop, args=("SHARE",)) for _ in range(sharers)]
    editor.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    editor.join()
    left = [n for n in os.listdir(os.path.dirname(archive)) if n != "app.img"]
    if left:
        failures.append(f"left in the archive's directory: {left}")
    return {"stats": dict(stats), "edits": editor.edits, "failures": failures,
            "left": left}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--dumpers", type=int, default=4)
    ap.add_argument("--sharers", type=int, default=12)
    ap.add_argument("--edit-every", type=float, default=3, metavar="S")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="pycds-soak-")
    res = soak(args.python, workdir, args.minutes, args.dumpers, args.sharers,
               args.edit_every)
    s = res["stats"]
    print(f"{args.minutes:g} min: {s.get('DUMP runs', 0)} DUMP and "
          f"{s.get('SHARE runs', 0)} SHARE runs, {res['edits']} edits, "
          f"{s.get('SHARE app modules served', 0)} app modules served to SHARE runs; "
          f"{len(res['failures'])} failures; {len(res['left'])} temporary files left")
    if not args.workdir and not res["failures"]:
        shutil.rmtree(workdir, ignore_errors=True)      # (kept when something failed)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
