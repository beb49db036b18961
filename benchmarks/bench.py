"""``python benchmarks/bench.py``: start-up and import benchmarks of pycds.

Runs, with one command, every measurement of docs/performance.md, each in
fresh interpreters, variants interleaved rep by rep so that machine noise
hits them alike; reports medians and the median of per-rep ratios:

``inproc``   in-process import time (``time.perf_counter_ns`` around the
             import statement) per workload: *baseline* (plain import),
             *pycds* (SHARE), *inline* (SHARE with ``PYCDSPREFETCH=0``:
             every load on the importing thread, as on one CPU), *ideal*
             (every code object of the workload
             unmarshalled before the timer starts and served by a trivial
             dict-lookup finder: the bound for any code cache), *ideal+intern*
             (the ideal plus, inside the timer, one ``sys.intern`` of a fresh
             copy of every interned string of each module's code: what
             re-interning costs) and *peer* (the ``code-data-share``
             package, if ``--peer-python`` names an interpreter where it is
             installed).
``wall``     whole-process wall and CPU time (user+sys, from wait4) of
             ``python -c "import ..."``, same variants but ideal.
``startup``  ``python -c pass``: a venv without pycds (*nopycds*), pycds
             installed with PYCDSMODE unset (*off*), SHARE with the
             workload archive and SHARE with an archive of every importable
             source module of the stdlib and site-packages (*share-big*).
``finder``   the finder's own cost per import, in microseconds, at
             thousands of imports (hit: archived module, beyond what
             PathFinder.find_spec costs anyway; miss: not archived).
``memory``   8 concurrent processes importing the ``all`` workload: RSS and
             PSS per process from /proc/PID/smaps_rollup.
``dump``     archive size per module and DUMP run time vs a plain run.

Imports the standard library and the installed pycds (run it with an
interpreter where pycds is installed; matplotlib, optional, for
``--chart``).  Not part of the package: ``python -m pycds bench -- CMD``
is the users' command for their own program.  Typical use::

    python benchmarks/bench.py                  # everything (~10 min on 2 busy cores)
    python benchmarks/bench.py --quick          # fewer repetitions (~1.5 min)
    python benchmarks/bench.py --sections inproc,wall --workloads json,all
    python benchmarks/bench.py --peer-python /venv-cds/bin/python --chart out.png
"""

import argparse
import ast
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from pycds import _archive
    from pycds.cli.bench import interleave, median as _med, ratio as _ratio, run as _run
except ImportError as e:
    sys.exit(f"benchmarks/bench.py needs pycds installed in this interpreter: {e}")

WORKLOADS = {
    "json": "json",
    "numpy": "numpy",
    "flask": "flask",
    "boto3": "boto3",
    "all": "numpy, flask, boto3",
}
SECTIONS = ("inproc", "wall", "startup", "finder", "memory", "dump")

# In-process import time of one workload; only builtins are imported
# before the timer (time and sys are builtin modules).
_INPROC = """\
import sys, time
c0 = time.thread_time_ns()
t0 = time.perf_counter_ns()
{timed}import {mods}
t1 = time.perf_counter_ns()
c1 = time.thread_time_ns()
sys.stdout.write("%d %d" % (t1 - t0, c1 - c0))
{report}"""

# The ideal: every code object the workload imports from source is read and
# unmarshalled (SourceFileLoader.get_code, from the .pyc) before the timer;
# a finder first on sys.meta_path serves them from a dict; then the same
# timed import as _INPROC.  Nothing but modules already loaded at start-up
# is imported by the harness.
_IDEAL = """\
import sys, time, marshal, gc
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import SourceFileLoader
with open({listfile!r}, "rb") as f:
    mods = marshal.load(f)
table = {{}}
for name, origin, locs in mods:
    table[name] = (origin, locs, SourceFileLoader(name, origin).get_code(name))
{setup}gc.collect()

class _Loader(SourceFileLoader):
    def __init__(self, name, path, code):
        super().__init__(name, path)
        self._code = code
    def get_code(self, name):
        return self._code

class _Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        e = table.get(name)
        if e is None:
            return None
        origin, locs, code = e
        spec = ModuleSpec(name, _Loader(name, origin, code), origin=origin,
                          is_package=locs is not None)
        spec.has_location = True
        if locs is not None:
            spec.submodule_search_locations = list(locs)
        return spec

sys.meta_path.insert(0, _Finder)
""" + _INPROC

# The ideal + interning: as the ideal, with, inside the timer, one
# sys.intern() per distinct interned string of each module's code (its names
# and name-like constants, as marshal interns them), each given as a fresh
# copy whose hash is not cached: what re-interning an archive's strings
# costs, where those strings are interned already.
_INTERN_SETUP = """\
_copies = []
def _fresh(s):
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
def _namelike(s):
    return type(s) is str and s.isascii() and s.replace("_", "a").isalnum()
def _walk(code, seen):
    names = [code.co_name, getattr(code, "co_qualname", code.co_name)]
    names += code.co_names + code.co_varnames + code.co_cellvars + code.co_freevars
    todo = list(code.co_consts)
    while todo:
        c = todo.pop()
        if type(c) is type(code):
            _walk(c, seen)
        elif type(c) in (tuple, frozenset):
            todo.extend(c)
        elif _namelike(c):
            names.append(c)
    for s in names:
        if id(s) in seen:
            continue
        seen.add(id(s))
        c = _fresh(s)
        if c is not s and sys.intern(c) is s:
            _copies.append(_fresh(s))
for _origin, _locs, _code in table.values():
    _walk(_code, set())
_intern = sys.intern
"""
_INTERN_TIMED = ("_i0 = time.perf_counter_ns()\n"
                 "for _s in _copies: _intern(_s)\n"
                 "_interning = time.perf_counter_ns() - _i0\n")

# The modules a workload imports from source (for the ideal's preload).
_LIST = """\
import sys, marshal
import {mods}
from _frozen_importlib_external import SourceFileLoader
out = []
for name, m in list(sys.modules.items()):
    spec = getattr(m, "__spec__", None)
    if spec is None or type(spec.loader) is not SourceFileLoader or name == "__main__":
        continue
    locs = spec.submodule_search_locations
    out.append((name, spec.origin, tuple(locs) if locs is not None else None))
with open({listfile!r}, "wb") as f:
    marshal.dump(out, f)
"""

# Every importable source module of the stdlib and site-packages, found by
# walking the directories (nothing imported).  Skipped: tests, __main__
# modules, and the few modules with side effects at import.
_ALLMODS = """\
import os, sys, sysconfig
skip_top = {"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle",
            "test", "lib2to3", "pydoc_data", "ensurepip", "venv", "pip",
            "_pyrepl", "__phello__", "__hello__", "pycds", "xxlimited"}
roots = []
for key in ("stdlib", "purelib", "platlib"):
    p = sysconfig.get_paths()[key]
    if p not in roots:
        roots.append(p)
names = set()
def walk(d, prefix):
    try:
        items = sorted(os.listdir(d))
    except OSError:
        return
    for it in items:
        p = os.path.join(d, it)
        if it.endswith(".py") and os.path.isfile(p):
            mod = it[:-3]
            if mod == "__init__":
                names.add(prefix[:-1])
            elif mod.isidentifier() and mod != "__main__":
                names.add(prefix + mod)
        elif it.isidentifier() and os.path.isfile(os.path.join(p, "__init__.py")):
            if it in ("tests", "test", "testing") or (not prefix and it in skip_top):
                continue
            walk(p, prefix + it + ".")
for r in roots:
    for it in sorted(os.listdir(r)):
        p = os.path.join(r, it)
        if it.endswith(".py") and it[:-3].isidentifier() and it[:-3] not in skip_top:
            names.add(it[:-3])
        elif it.isidentifier() and it not in skip_top and os.path.isfile(os.path.join(p, "__init__.py")):
            walk(p, it + ".")
names.discard("")
with open(sys.argv[1], "w") as f:
    f.write("\\n".join(sorted(names)) + "\\n")
"""

# The finder's own cost per import, in-process under SHARE: every archived
# name (hits) and as many unknown names (misses), five rounds, medians.
_FINDER = """\
import sys, time, os
from _frozen_importlib_external import PathFinder
fin = [f for f in sys.meta_path if type(f).__name__ == "CDSFinder"][0]
entries = fin.archive.index.entries()
locs = {e.name: list(e.search_locations) for e in entries if e.search_locations is not None}
hits = []
for e in entries:
    parent = e.name.rpartition(".")[0]
    if not parent:
        hits.append((e.name, None))
    elif parent in locs:
        hits.append((e.name, locs[parent]))
miss = [("pycds_bench_absent_%d" % i, None) for i in range(len(hits))]
pc = time.perf_counter_ns
res = {"n_hit": len(hits), "n_miss": len(miss), "lookup": [], "find": [], "path": [], "miss": []}
idx = fin.archive.index
for rnd in range(6):
    t0 = pc()
    for n, p in hits:
        idx.lookup(n)
    t1 = pc()
    for n, p in hits:
        fin.find_spec(n, p)
    t2 = pc()
    for n, p in hits:
        PathFinder.find_spec(n, p)
    t3 = pc()
    for n, p in miss:
        fin.find_spec(n, p)
    t4 = pc()
    if rnd:   # the first round warms the path caches
        res["lookup"].append((t1 - t0) / len(hits) / 1e3)
        res["find"].append((t2 - t1) / len(hits) / 1e3)
        res["path"].append((t3 - t2) / len(hits) / 1e3)
        res["miss"].append((t4 - t3) / len(miss) / 1e3)
sys.stdout.write(repr(res))
"""

_HOLD = """\
import sys
import {mods}
sys.stdout.write("r")
sys.stdout.flush()
sys.stdin.read()
"""


def _env(**extra):
    """The environment for children: no PYCDS*/PYTHON* variables leaking in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON"))}
    env.update(extra)
    return env


def _checked(res, what):
    wall, cpu, out, err, rc = res
    if rc != 0:
        raise RuntimeError(f"{what} failed (rc {rc}): {err[-2000:]}")
    return res


class Variant:
    """One way of running the interpreter: argv prefix plus environment."""

    def __init__(self, name, python, env):
        self.name = name
        self.python = python
        self.env = env


def _interleave(variants, make_argv, reps, parse, label):
    """Run each variant ``reps`` times, rotating the order each rep, after a
    warm-up run of each.  Returns {variant name: [parsed results]}."""
    return interleave(variants, reps, lambda v: parse(
        _checked(_run(make_argv(v), v.env), f"{label} {v.name}")))


class Bench:
    def __init__(self, args):
        self.args = args
        self.py = os.path.abspath(args.python)
        self.peer = os.path.abspath(args.peer_python) if args.peer_python else None
        self.tmp = tempfile.mkdtemp(prefix="pycds-bench-")
        self.results = {"machine": machine_info(self.py), "sections": {}}
        self.archives = {}
        self.peer_archives = {}

    # ---- archives --------------------------------------------------------

    def archive(self, wl):
        """The pycds archive of workload ``wl`` (made by a DUMP run)."""
        if wl not in self.archives:
            img = os.path.join(self.tmp, f"{wl}.img")
            _checked(_run([self.py, "-c", f"import {WORKLOADS[wl]}"],
                          _env(PYCDSMODE="DUMP", PYCDSARCHIVE=img)), f"dump {wl}")
            self.archives[wl] = img
        return self.archives[wl]

    def peer_archive(self, wl):
        """The code-data-share archive of ``wl``, made as its README says:
        PYCDSMODE=TRACE, then cds.dump.run_dump(list, archive)."""
        if wl not in self.peer_archives:
            lst = os.path.join(self.tmp, f"peer-{wl}.lst")
            img = os.path.join(self.tmp, f"peer-{wl}.img")
            _checked(_run([self.peer, "-c", f"import {WORKLOADS[wl]}"],
                          _env(PYCDSMODE="TRACE", PYCDSLIST=lst)), f"peer trace {wl}")
            _checked(_run([self.peer, "-c",
                           f"import cds.dump; cds.dump.run_dump({lst!r}, {img!r})"],
                          _env()), f"peer dump {wl}")
            self.peer_archives[wl] = img
        return self.peer_archives[wl]

    def variants(self, wl, ideal=False):
        vs = [Variant("baseline", self.py, _env()),
              Variant("pycds", self.py, _env(PYCDSMODE="SHARE",
                                             PYCDSARCHIVE=self.archive(wl))),
              # every load on the importing thread, as with one CPU
              Variant("inline", self.py, _env(PYCDSMODE="SHARE", PYCDSPREFETCH="0",
                                              PYCDSARCHIVE=self.archive(wl)))]
        if ideal:
            vs.append(Variant("ideal", self.py, _env()))
            vs.append(Variant("ideal+intern", self.py, _env()))
        if self.peer:
            vs.append(Variant("peer", self.peer, _env(
                PYCDSMODE="SHARE", PYCDSARCHIVE=self.peer_archive(wl))))
        return vs

    # ---- sections ----------------------------------------------------------

    def inproc(self):
        rows = {}
        for wl in self.args.workloads:
            mods = WORKLOADS[wl]
            listfile = os.path.join(self.tmp, f"{wl}.mods")
            _checked(_run([self.py, "-c", _LIST.format(mods=mods, listfile=listfile)],
                          _env()), f"list {wl}")
            code = {"ideal": _IDEAL.format(mods=mods, listfile=listfile, setup="",
                                           timed="", report=""),
                    # (its third number: the time of the interning alone)
                    "ideal+intern": _IDEAL.format(
                        mods=mods, listfile=listfile, setup=_INTERN_SETUP,
                        timed=_INTERN_TIMED,
                        report='sys.stdout.write(" %d" % _interning)\n')}
            inproc = _INPROC.format(mods=mods, timed="", report="")

            def argv(v):
                return [v.python, "-c", code.get(v.name, inproc)]
            r = _interleave(self.variants(wl, ideal=True), argv, self.args.reps,
                            lambda res: tuple(int(x) / 1e6 for x in res[2].split()),
                            f"inproc {wl}")
            rows[wl] = r
            self._say(f"inproc {wl}: " + ", ".join(
                f"{k} {_med([x[0] for x in v]):.1f} ms (CPU {_med([x[1] for x in v]):.1f})"
                for k, v in r.items()))
        self.results["sections"]["inproc"] = rows

    def wall(self):
        rows = {}
        for wl in self.args.workloads:
            code = f"import {WORKLOADS[wl]}"
            r = _interleave(self.variants(wl), lambda v: [v.python, "-c", code],
                            self.args.reps, lambda res: (res[0] * 1e3, res[1] * 1e3),
                            f"wall {wl}")
            rows[wl] = r
            self._say(f"wall {wl}: " + ", ".join(
                f"{k} {_med([x[0] for x in v]):.1f} ms" for k, v in r.items()))
        self.results["sections"]["wall"] = rows

    def plain_venv(self):
        """A venv of the same base interpreter without pycds: the other .pth
        files of the pycds venv are copied in, and a path line (processed
        first) puts its site-packages on sys.path, so start-up differs only
        by pycds.pth."""
        d = os.path.join(self.tmp, "nopycds")
        if os.path.exists(d):
            return os.path.join(d, "bin", "python")
        out = _checked(_run([self.py, "-c",
                             "import sys, site; print(sys._base_executable); "
                             "print(site.getsitepackages()[0])"], _env()), "venv facts")[2]
        base, site_dir = out.split("\n")[:2]
        _checked(_run([base, "-m", "venv", "--without-pip", d], _env()), "make venv")
        new_site = _checked(_run([os.path.join(d, "bin", "python"), "-c",
                                  "import site; print(site.getsitepackages()[0])"],
                                 _env()), "venv site")[2].strip()
        with open(os.path.join(new_site, "00-pycds-bench-site.pth"), "w") as f:
            f.write(site_dir + "\n")
        for name in os.listdir(site_dir):
            if name.endswith(".pth") and name != "pycds.pth":
                shutil.copy(os.path.join(site_dir, name), new_site)
        return os.path.join(d, "bin", "python")

    def big_archive(self):
        lst = os.path.join(self.tmp, "allmods.lst")
        img = os.path.join(self.tmp, "all-modules.img")
        _checked(_run([self.py, "-c", _ALLMODS, lst], _env()), "module walk")
        t0 = time.perf_counter()
        res = _checked(_run([self.py, "-c",
                             f"import pycds; print(pycds._dump({lst!r}, {img!r}))"],
                            _env(MPLBACKEND="Agg", DISPLAY="", BROWSER="true")),
                       "big dump")
        n = int(res[2].strip().splitlines()[-1])
        self._say(f"big archive: {n} modules, {os.path.getsize(img) / 2**20:.1f} MiB, "
                  f"{time.perf_counter() - t0:.0f} s")
        return img, n

    def startup(self):
        plain = self.plain_venv()
        big, nbig = self.big_archive()
        self.big = big
        vs = [Variant("nopycds", plain, _env()),
              Variant("off", self.py, _env()),
              Variant("share-all", self.py, _env(PYCDSMODE="SHARE",
                                                 PYCDSARCHIVE=self.archive("all"))),
              Variant("share-big", self.py, _env(PYCDSMODE="SHARE", PYCDSARCHIVE=big))]
        r = _interleave(vs, lambda v: [v.python, "-c", "pass"], self.args.startup_reps,
                        lambda res: (res[0] * 1e3, res[1] * 1e3), "startup")
        self.results["sections"]["startup"] = {"runs": r, "big_modules": nbig,
                                               "big_bytes": os.path.getsize(big)}
        self._say("startup: " + ", ".join(
            f"{k} {_med([x[0] for x in v]):.2f} ms" for k, v in r.items()))

    def finder(self):
        big = getattr(self, "big", None) or self.big_archive()[0]
        res = _checked(_run([self.py, "-c", _FINDER],
                            _env(PYCDSMODE="SHARE", PYCDSARCHIVE=big)), "finder")
        self.results["sections"]["finder"] = ast.literal_eval(res[2])
        f = self.results["sections"]["finder"]
        self._say(f"finder: hit {f['n_hit']} lookup {_med(f['lookup']):.2f} us, "
                  f"find {_med(f['find']):.2f} us vs PathFinder {_med(f['path']):.2f} us, "
                  f"miss {_med(f['miss']):.2f} us")

    def memory(self):
        vs = [Variant("baseline", self.py, _env()),
              Variant("pycds", self.py, _env(PYCDSMODE="SHARE",
                                             PYCDSARCHIVE=self.archive("all"))),
              ]
        if self.peer:
            vs.append(Variant("peer", self.peer, _env(
                PYCDSMODE="SHARE", PYCDSARCHIVE=self.peer_archive("all"))))
        code = _HOLD.format(mods=WORKLOADS["all"])
        out = {v.name: [] for v in vs}
        for rep in range(self.args.memory_reps):
            for v in (vs if rep % 2 == 0 else vs[::-1]):
                out[v.name].append(_hold_n(v, code, 8))
        self.results["sections"]["memory"] = out
        for k, reps in out.items():
            self._say(f"memory {k}: PSS total {_med([sum(p for _, p in r) for r in reps]) / 1024:.1f} MiB")

    def dump(self):
        rows = {}
        for wl in self.args.workloads:
            img = os.path.join(self.tmp, f"{wl}-dumptime.img")
            code = f"import {WORKLOADS[wl]}"
            vs = [Variant("plain", self.py, _env()),
                  Variant("dump", self.py, _env(PYCDSMODE="DUMP", PYCDSARCHIVE=img))]
            r = _interleave(vs, lambda v: [v.python, "-c", code], self.args.dump_reps,
                            lambda res: res[0] * 1e3, f"dump {wl}")
            sizes = _archive_sizes(img)
            rows[wl] = {"runs": r, **sizes}
            self._say(f"dump {wl}: {_med(r['dump']):.0f} ms vs {_med(r['plain']):.0f} ms, "
                      f"{sizes['nmodules']} modules, {sizes['file'] / 2**20:.1f} MiB")
        self.results["sections"]["dump"] = rows

    def _say(self, msg):
        print(f"# {msg}", file=sys.stderr, flush=True)

    def run(self):
        try:
            for s in self.args.sections:
                getattr(self, s)()
        finally:
            if not self.args.keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return self.results


# Seconds between the last process being ready and reading the memory:
# the steady state, not the instant after the imports (pycds gives memory
# back once a process has stopped importing for 200 ms: native/archive/loader/prefetch.c).
SETTLE_S = 0.5


def _hold_n(v, code, n):
    """Start ``n`` processes that import and wait; return their (rss, pss)
    in KiB from smaps_rollup, read while all are alive, SETTLE_S seconds
    after the last is ready."""
    procs = [subprocess.Popen([v.python, "-c", code], env=v.env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(n)]
    try:
        for p in procs:
            if p.stdout.read(1) != b"r":
                raise RuntimeError(f"memory {v.name}: child failed: "
                                   f"{p.stderr.read().decode()[-2000:]}")
        time.sleep(SETTLE_S)
        out = []
        for p in procs:
            rss = pss = 0
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss = int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss = int(line.split()[1])
            out.append((rss, pss))
        return out
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait()
            p.stdout.close()
            p.stderr.close()


def _archive_sizes(img):
    idx = _archive.Index.open(img, check_owner=False)
    try:
        entries = idx.entries()
        pyc = 0
        for e in entries:
            try:
                pyc += os.path.getsize(e.pyc_path) if e.pyc_path else 0
            except OSError:
                pass
        return {"nmodules": len(entries), "file": os.path.getsize(img),
                "heap": idx.header.heap_len, "relocs": idx.header.reloc_count,
                "pyc": pyc}
    finally:
        idx.close()


def machine_info(py):
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/loadavg") as f:
            info["loadavg"] = f.read().split()[:3]
    except OSError:
        pass
    # Which pycds is measured: the one the interpreter imports (a venv may
    # hold an older install than the tree the bench was started from).
    out = subprocess.run([py, "-c", "import sys, os; print(sys.version.split()[0], flush=True); "
                          "import pycds; print(os.path.dirname(pycds.__file__))"],
                         capture_output=True, text=True, env=_env(), cwd="/")
    lines = out.stdout.split("\n")
    info["python"] = lines[0].strip()
    info["pycds"] = lines[1].strip() if len(lines) > 1 else "?"
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return info


# ---- report ------------------------------------------------------------------

def report(results):
    """The results as markdown tables (one per section)."""
    m = results["machine"]
    lines = [f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m['platform']}, "
             f"Python {m['python']}, {m['date']}, load average {' '.join(m.get('loadavg', []))}",
             f"pycds measured: {m.get('pycds', '?')}",
             ""]
    s = results["sections"]
    if "inproc" in s:
        names = [n for n in ("baseline", "pycds", "inline", "ideal", "peer", "ideal+intern")
                 if n in next(iter(s["inproc"].values()))]
        has_peer = "peer" in names
        has_inline = "inline" in names
        has_intern = "ideal+intern" in names
        lines += ["In-process import time, ms: wall (main-thread CPU), medians; ratios are "
                  "medians of per-rep ratios, wall (CPU); inline: pycds with "
                  "PYCDSPREFETCH=0", "",
                  "| workload | " + " | ".join(names) + " | pycds/ideal | pycds/baseline"
                  + (" | inline/baseline" if has_inline else "")
                  + (" | peer/baseline" if has_peer else "")
                  + (" | pycds/ideal+intern" if has_intern else "") + " | reps |",
                  "|---" * (len(names) + 4 + has_peer + has_inline + has_intern) + "|"]
        for wl, r in s["inproc"].items():
            def col(n, i):
                return [x[i] for x in r[n]]

            def rat(a, b):
                return (f"{_ratio(col(a, 0), col(b, 0)):.3f} "
                        f"({_ratio(col(a, 1), col(b, 1)):.3f})")
            row = [wl] + [f"{_med(col(n, 0)):.1f} ({_med(col(n, 1)):.1f})" for n in names]
            row += [rat("pycds", "ideal"), rat("pycds", "baseline")]
            if has_inline:
                row.append(rat("inline", "baseline"))
            if has_peer:
                row.append(rat("peer", "baseline"))
            if has_intern:
                row.append(rat("pycds", "ideal+intern"))
            row.append(str(len(r["baseline"])))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        alone = {wl: _med([x[2] for x in r["ideal+intern"]]) for wl, r in s["inproc"].items()
                 if all(len(x) > 2 for x in r.get("ideal+intern", [()]))}
        if alone:
            lines += ["Re-interning alone (the ideal+intern variant's sys.intern loop, "
                      "measured inside each run), ms: "
                      + ", ".join(f"{wl} {ms:.1f}" for wl, ms in alone.items()), ""]
    if "wall" in s:
        names = list(next(iter(s["wall"].values())))
        lines += ["Whole process `python -c \"import ...\"`: wall ms (CPU ms = user+sys), median", "",
                  "| workload | " + " | ".join(names) + " | pycds/baseline wall | pycds/baseline CPU"
                  + (" | inline/baseline wall" if "inline" in names else "")
                  + (" | peer/baseline wall" if "peer" in names else "") + " |",
                  "|---" * (len(names) + 3 + ("peer" in names) + ("inline" in names)) + "|"]
        for wl, r in s["wall"].items():
            row = [wl] + [f"{_med([x[0] for x in r[n]]):.1f} ({_med([x[1] for x in r[n]]):.1f})"
                          for n in names]
            row += [f"{_ratio([x[0] for x in r['pycds']], [x[0] for x in r['baseline']]):.3f}",
                    f"{_ratio([x[1] for x in r['pycds']], [x[1] for x in r['baseline']]):.3f}"]
            if "inline" in names:
                row.append(f"{_ratio([x[0] for x in r['inline']], [x[0] for x in r['baseline']]):.3f}")
            if "peer" in names:
                row.append(f"{_ratio([x[0] for x in r['peer']], [x[0] for x in r['baseline']]):.3f}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if "startup" in s:
        st = s["startup"]
        r = st["runs"]
        base_w = [x[0] for x in r["nopycds"]]
        base_c = [x[1] for x in r["nopycds"]]
        lines += [f"`python -c pass` ({len(base_w)} reps each, interleaved; share-big: "
                  f"{st['big_modules']} modules, {st['big_bytes'] / 2**20:.1f} MiB)", "",
                  "| variant | wall ms | CPU ms | wall - nopycds (median of per-rep differences) "
                  "| CPU - nopycds |", "|---|---|---|---|---|"]
        for k, v in r.items():
            w = [x[0] for x in v]
            c = [x[1] for x in v]
            lines.append(f"| {k} | {_med(w):.2f} | {_med(c):.2f} | "
                         f"{_med([a - b for a, b in zip(w, base_w)]):+.2f} | "
                         f"{_med([a - b for a, b in zip(c, base_c)]):+.2f} |")
        lines.append("")
    if "finder" in s:
        f = s["finder"]
        lines += [f"Finder cost per import, µs (in-process, {f['n_hit']} archived names, "
                  f"{f['n_miss']} absent names, 5 rounds, median)", "",
                  "| index lookup (hit) | CDSFinder.find_spec (hit) | PathFinder.find_spec (same names) "
                  "| overhead per hit | CDSFinder.find_spec (miss) |", "|---|---|---|---|---|",
                  f"| {_med(f['lookup']):.2f} | {_med(f['find']):.2f} | {_med(f['path']):.2f} | "
                  f"{_med(f['find']) - _med(f['path']):.2f} | {_med(f['miss']):.2f} |", ""]
    if "memory" in s:
        mem = s["memory"]
        lines += ["8 concurrent processes importing numpy, flask, boto3 (KiB, from "
                  "/proc/PID/smaps_rollup; medians over reps)", "",
                  "| variant | RSS per process | PSS per process | total PSS |", "|---|---|---|---|"]
        for k, reps in mem.items():
            lines.append(f"| {k} | {_med([_med([x[0] for x in r]) for r in reps]):.0f} | "
                         f"{_med([_med([x[1] for x in r]) for r in reps]):.0f} | "
                         f"{_med([sum(x[1] for x in r) for r in reps]):.0f} |")
        lines.append("")
    if "dump" in s:
        lines += ["Archive size and DUMP time", "",
                  "| workload | modules | file MiB | heap KiB/module | .pyc KiB/module | relocations "
                  "| plain ms | DUMP ms | DUMP/plain |", "|---" * 9 + "|"]
        for wl, d in s["dump"].items():
            r = d["runs"]
            n = max(d["nmodules"], 1)
            lines.append(f"| {wl} | {d['nmodules']} | {d['file'] / 2**20:.1f} | "
                         f"{d['heap'] / 1024 / n:.1f} | {d['pyc'] / 1024 / n:.1f} | {d['relocs']} | "
                         f"{_med(r['plain']):.0f} | {_med(r['dump']):.0f} | "
                         f"{_ratio(r['dump'], r['plain']):.2f} |")
        lines.append("")
    return "\n".join(lines)


def chart(results, path, extra=None):
    """PNG bar chart of in-process import time per workload and variant:
    wall time (left) and main-thread CPU time (right), medians.  ``extra``:
    more results (another interpreter) drawn as a second row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [results] + ([extra] if extra else [])
    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 4.3 * len(runs)), dpi=100,
                             squeeze=False)
    colors = {"baseline": "#888888", "pycds": "#1f77b4", "ideal": "#2ca02c", "peer": "#ff7f0e"}
    for row, res in enumerate(runs):
        rows = res["sections"]["inproc"]
        names = [n for n in ("baseline", "pycds", "ideal", "peer")
                 if n in next(iter(rows.values()))]
        wls = list(rows)
        width = 0.8 / len(names)
        m = res["machine"]
        for col, what in enumerate(("wall", "main-thread CPU")):
            ax = axes[row][col]
            for i, n in enumerate(names):
                xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(wls))]
                ys = [_med([x[col] for x in rows[w][n]]) for w in wls]
                bars = ax.bar(xs, ys, width, color=colors[n],
                              label=n if n != "peer" else "code-data-share")
                for bar, y in zip(bars, ys):
                    ax.text(bar.get_x() + bar.get_width() / 2, y, f"{y:.0f}",
                            ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(wls)))
            ax.set_xticklabels([w if w != "all" else "numpy+flask+boto3" for w in wls])
            ax.set_ylabel(f"import time, {what} ms (median)")
            ax.set_title(f"CPython {m['python']}: in-process import, {what}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.split("\n")[0])
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with pycds installed (default: this one)")
    p.add_argument("--peer-python", default="",
                   help="interpreter of a venv with code-data-share installed (optional)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--reps", type=int, default=0, help="reps per variant (inproc, wall)")
    p.add_argument("--startup-reps", type=int, default=0)
    p.add_argument("--dump-reps", type=int, default=0,
                   help="DUMP and plain runs per workload (dump)")
    p.add_argument("--json", default="", help="also write the raw results here")
    p.add_argument("--chart", default="", help="write a PNG chart here (needs matplotlib)")
    p.add_argument("--chart-from", default="",
                   help="only draw the chart from results saved with --json "
                        "(comma-separated files, one row each), then exit")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args(argv)
    if args.chart_from:
        import json
        loaded = []
        for f in args.chart_from.split(","):
            with open(f) as fh:
                loaded.append(json.load(fh))
        chart(loaded[0], args.chart or "bench.png", *loaded[1:2])
        return 0
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.sections = [s for s in args.sections.split(",") if s]
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")
    for s in args.sections:
        if s not in SECTIONS:
            p.error(f"unknown section {s!r}")
    args.reps = args.reps or (7 if args.quick else 21)
    args.startup_reps = args.startup_reps or (40 if args.quick else 200)
    args.memory_reps = 1 if args.quick else 3
    args.dump_reps = args.dump_reps or (3 if args.quick else 11)
    # Children start in the temp directory: in a source checkout, `-c` code
    # would import that checkout's pycds (no native module built for the
    # interpreter under test) instead of the installed one.
    for name in ("python", "peer_python", "json", "chart"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    os.chdir(tempfile.gettempdir())
    results = Bench(args).run()
    text = report(results)
    print(text)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.chart and "inproc" in results["sections"]:
        try:
            chart(results, args.chart)
        except ImportError:
            print("# no matplotlib: chart not written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
