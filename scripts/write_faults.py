"""Faults while an archive is written: every file operation the writer
makes fails in turn, and dumps are killed at random moments.

    python scripts/write_faults.py [--python PY] [--modes DUMP AUTO]
                                   [--kills 100] [--workdir DIR]

A program (stdlib only) is dumped over the archive of another program (so
that the old and the new archive differ).  A census run under the
LD_PRELOAD shim scripts/faultshim.c lists the file operations made in the
archive's directory: ``open``, ``fallocate``, ``pwrite``, ``ftruncate``,
``fchmod``, ``fsetxattr``, ``link``, ``rename`` (and ``write``/``fsync``
where made).  Then each one fails in turn with ENOSPC, EIO and EINTR, each
write comes back short, and the process is SIGKILLed at each of them; last,
``--kills`` dumps are SIGKILLed at random moments of the exit-time write.
After each run:

- the program's output and exit status are a plain run's (not for kills);
- the archive is the old one, byte for byte, with one warning said, or a
  complete new one (``python -m pycds verify`` passes), with at most one
  warning (AUTO says it when the old one cannot be read); after
  EINTR or a short write, the new one (the operation is retried);
- a SHARE run gives the plain output with no warning;
- no temporary file is left (after a kill: after the next dump).

Prints one line per failure and a summary; exits 1 on any failure.
"""

import argparse
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCE = os.path.join(HERE, "faultshim.c")

OLD_PROGRAM = "import json\nprint(json.dumps([1]))\n"
PROGRAM = (
    "import json, email.parser, decimal, argparse, http.client, sys\n"
    "m = email.parser.Parser().parsestr('Subject: hi\\n\\nbody')\n"
    "print(json.dumps({'s': m['Subject']}), decimal.Decimal('1.1') + 1,\n"
    "      http.client.responses[404])\n"
    "if sys.argv[1:] == ['wait']:\n"
    "    sys.stdout.flush()\n"
    "    sys.stdin.read()\n")
ERRORS = ("ENOSPC", "EIO", "EINTR")
WRITES = ("pwrite", "write")
ARCHIVE = "app.img"


def build_shim(workdir, cc=None):
    """Compile scripts/faultshim.c; returns the shared object's path.
    Raises OSError where the C compiler fails."""
    out = os.path.join(workdir, "faultshim.so")
    cc = cc or os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
                        "-o", out, SHIM_SOURCE, "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"cannot build {SHIM_SOURCE}: {r.stderr.strip()}")
    return out


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    env.update(extra)
    return env


class Bench:
    """The program, its plain output, the old archive, one directory."""

    def __init__(self, python, workdir, shim, mode="DUMP"):
        self.python, self.dir, self.shim, self.mode = python, workdir, shim, mode
        self.adir = os.path.join(workdir, "archive")
        self.archive = os.path.join(self.adir, ARCHIVE)
        os.makedirs(self.adir, exist_ok=True)
        for name, text in (("prog.py", PROGRAM), ("old.py", OLD_PROGRAM)):
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text)
        self.plain = self.run([])
        if self.plain.returncode != 0:
            raise SystemExit(f"the plain run failed:\n{self.plain.stderr}")
        self.old = os.path.join(workdir, "old.img")
        r = self.run([], script="old.py", PYCDSMODE="DUMP", PYCDSARCHIVE=self.old)
        if r.returncode != 0 or not os.path.exists(self.old):
            raise SystemExit(f"the old program's dump failed:\n{r.stderr}")
        with open(self.old, "rb") as f:
            self.old_bytes = f.read()

    def run(self, args, script="prog.py", stdin=None, **env):
        return subprocess.run([self.python, script, *args], cwd=self.dir,
                              env=clean_env(**env), input=stdin,
                              capture_output=True, text=True, timeout=300)

    def reset(self):
        shutil.rmtree(self.adir)
        os.makedirs(self.adir)
        shutil.copy2(self.old, self.archive)

    def shim_env(self, fault=None, log=None):
        env = {"PYCDSMODE": self.mode, "PYCDSARCHIVE": self.archive,
               # (after a sanitizer's runtime, which must come first)
               "LD_PRELOAD": " ".join(filter(None, (os.environ.get("LD_PRELOAD"),
                                                    self.shim))),
               "PYCDS_FAULT_DIR": self.adir}
        if fault:
            env["PYCDS_FAULT"] = fault
        if log:
            env["PYCDS_FAULT_LOG"] = log
        return env

    def census(self):
        """{operation: how many} the write makes in the archive's directory."""
        self.reset()
        log = os.path.join(self.dir, "census.log")
        if os.path.exists(log):
            os.unlink(log)
        r = self.run([], **self.shim_env(log=log))
        if r.returncode != 0 or warnings(r):
            raise SystemExit(f"the census run failed:\n{r.stderr}")
        with open(log) as f:
            return collections.Counter(f.read().split())

    def leftovers(self):
        return sorted(n for n in os.listdir(self.adir) if n != ARCHIVE)

    def state(self):
        """"old", "new" (verified complete) or why neither."""
        if not os.path.exists(self.archive):
            return "no archive"
        with open(self.archive, "rb") as f:
            if f.read() == self.old_bytes:
                return "old"
        v = subprocess.run([self.python, "-m", "pycds", "verify", self.archive],
                           cwd=self.dir, env=clean_env(), capture_output=True,
                           text=True, timeout=300)
        return "new" if v.returncode == 0 else f"torn: {v.stdout.strip()[-300:]}"

    def check_after(self, r, killed, retried=False):
        """Failures (strings) of one faulted run ``r``; ``retried``: the
        fault is one to retry (EINTR, a short write), so the new archive
        must be there."""
        bad = []
        said = warnings(r)
        if not killed and (r.returncode, r.stdout) != (self.plain.returncode,
                                                       self.plain.stdout):
            bad.append(f"output or status differ: rc={r.returncode} {r.stdout!r}")
        st = self.state()
        if st not in ("old", "new"):
            bad.append(st)
        elif retried and st != "new":
            bad.append(f"not retried: {said}")
        elif not killed and st == "old" and len(said) != 1:
            bad.append(f"archive old with {len(said)} warnings: {said}")
        elif not killed and st == "new" and any("no archive was written" in w
                                                for w in said):
            bad.append(f"a new archive, said not written: {said}")
        if not killed and len(said) > 1:
            bad.append(f"{len(said)} warnings: {said}")
        share = self.run([], PYCDSMODE="SHARE", PYCDSARCHIVE=self.archive)
        if (share.returncode, share.stdout) != (self.plain.returncode, self.plain.stdout) \
                or warnings(share):
            bad.append(f"SHARE after it: rc={share.returncode} {share.stderr[-300:]!r}")
        if killed:
            # The next dump sweeps what a killed one left.
            nxt = self.run([], PYCDSMODE=self.mode, PYCDSARCHIVE=self.archive)
            if nxt.returncode != 0 or warnings(nxt):
                bad.append(f"the next dump: {nxt.stderr[-300:]!r}")
        if self.leftovers():
            bad.append(f"left behind: {self.leftovers()}")
        return bad


def warnings(r):
    return [ln for ln in r.stderr.splitlines() if ln.startswith("[pycds] warning")]


def faults(counts, kinds=None):
    """Every (operation, n, kind) to inject, for a census ``counts``."""
    out = []
    for call, total in sorted(counts.items()):
        for n in range(1, total + 1):
            ks = list(ERRORS) + (["SHORT"] if call in WRITES else []) + ["KILL"]
            out += [(call, n, k) for k in ks if kinds is None or k in kinds]
    return out


def run_faults(bench, plan, log=print):
    """Inject each fault of ``plan``; returns {fault: failures}."""
    failed = {}
    for call, n, kind in plan:
        bench.reset()
        spec = f"{call}:{n}:{kind}"
        r = bench.run([], **bench.shim_env(fault=spec))
        killed = kind == "KILL"
        if killed and r.returncode != -9:
            failed[spec] = [f"not killed: rc={r.returncode}"]
            continue
        bad = bench.check_after(r, killed, retried=kind in ("EINTR", "SHORT"))
        if bad:
            failed[spec] = bad
            log(f"FAIL {bench.mode} {spec}: " + "; ".join(bad))
    return failed


def exit_write_seconds(bench):
    """How long the exit-time write takes: from the program's last input
    to its exit, median of 5 (s)."""
    times = []
    for _ in range(5):
        bench.reset()
        p = subprocess.Popen([bench.python, "prog.py", "wait"], cwd=bench.dir,
                             env=clean_env(PYCDSMODE=bench.mode, PYCDSARCHIVE=bench.archive),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        p.stdout.readline()
        t0 = time.monotonic()
        p.communicate(b"")
        times.append(time.monotonic() - t0)
    return sorted(times)[2]


def random_kills(bench, count, seed=0, log=print):
    """SIGKILL ``count`` dumps at random moments of their exit-time write;
    returns {delay: failures}."""
    rng = random.Random(seed)
    span = exit_write_seconds(bench)
    failed = {}
    for _ in range(count):
        bench.reset()
        delay = rng.uniform(0, 1.2 * span)
        p = subprocess.Popen([bench.python, "prog.py", "wait"], cwd=bench.dir,
                             env=clean_env(PYCDSMODE=bench.mode, PYCDSARCHIVE=bench.archive),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        p.stdout.readline()
        p.stdin.close()
        time.sleep(delay)
        p.kill()
        p.wait()
        out, err = p.stdout.read(), p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        bad = bench.check_after(r, killed=True)
        if bad:
            failed[round(delay, 4)] = bad
            log(f"FAIL {bench.mode} kill at {delay * 1000:.1f} ms: " + "; ".join(bad))
    return failed, span


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--modes", nargs="+", default=["DUMP", "AUTO"],
                    choices=["DUMP", "AUTO"])
    ap.add_argument("--kills", type=int, default=100,
                    help="random SIGKILLs per mode (default 100)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="pycds-faults-")
    os.makedirs(workdir, exist_ok=True)
    shim = build_shim(workdir)
    total_bad = 0
    for mode in args.modes:
        bench = Bench(args.python, os.path.join(workdir, mode.lower()), shim, mode)
        counts = bench.census()
        plan = faults(counts)
        t0 = time.monotonic()
        failed = run_faults(bench, plan)
        killed, span = random_kills(bench, args.kills)
        total_bad += len(failed) + len(killed)
        print(f"{mode}: operations {dict(sorted(counts.items()))}; "
              f"{len(plan)} faults injected, {len(failed)} failed; "
              f"{args.kills} random kills over {span * 1000:.0f} ms, "
              f"{len(killed)} failed ({time.monotonic() - t0:.0f} s)")
    if not args.workdir and not total_bad:
        shutil.rmtree(workdir, ignore_errors=True)      # (kept when something failed)
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
