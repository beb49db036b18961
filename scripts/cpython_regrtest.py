"""Run a selection of CPython's own regression tests with every module they
import served from a pycds archive, and compare per-test results with a
plain run.

Run with the interpreter pycds is installed in (its Lib/test must exist)::

    python scripts/cpython_regrtest.py [--tests test_json test_code ...]
                                       [--jobs 2] [--workdir DIR]

Steps: (1) plain run of the selection, (2) DUMP run of the same selection
with ``-j``: regrtest runs each test module in a fresh worker process, each
worker writes the archive at exit, and as they all belong to one DUMP session
(they inherit it from the main process) each keeps what the others wrote, so
the archive ends up with every module any worker imported -- the test
modules included, which a sequential run would have unloaded before exit --
(3) SHARE run with that archive (``-j`` workers inherit PYCDSMODE=SHARE and
use it too, as do the interpreters the tests start).
Results come from regrtest's ``--junit-xml`` (one record per test case).
The script prints, per test module, the cases run and how many differ, and
exits 1 if any case's outcome (pass, fail, error, skip) differs between the
plain and the SHARE runs, or if the SHARE run served no module.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

DEFAULT = ["test_importlib", "test_inspect", "test_traceback", "test_code",
           "test_dis", "test_dataclasses", "test_typing", "test_enum",
           "test_json", "test_pickle", "test_warnings", "test_zipimport",
           "test_pkgutil", "test_runpy", "test_site", "test_compile",
           "test_scope"]
FAST = ["test_json", "test_code", "test_dis"]


def env_for(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON")) and k != "SOURCE_DATE_EPOCH"}
    env.update(extra)
    return env


def regrtest(python, tests, xml, jobs, cwd, timeout, **env):
    """Run ``python -m test`` on tests; returns (rc, seconds, stderr tail)."""
    cmd = [python, "-m", "test", "--junit-xml", xml, "-q"]
    if jobs:
        cmd += ["-j", str(jobs)]
    t0 = time.time()
    p = subprocess.run(cmd + list(tests), cwd=cwd, env=env_for(**env),
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, time.time() - t0, (p.stdout + p.stderr)[-3000:]


def outcomes(xml):
    """{(module, testcase id): outcome} from a regrtest junit file."""
    out = {}
    root = ET.parse(xml).getroot()
    for case in root.iter("testcase"):
        # regrtest writes the dotted test id as "name" (no "classname").
        name = ".".join(filter(None, (case.get("classname"), case.get("name"))))
        mod = name.split(".")[1] if name.startswith("test.") else name.split(".")[0]
        status = "pass"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = child.tag
        key, n = (mod, name), 1
        while key in out:          # subtests repeat their test's id
            n += 1
            key = (mod, f"{name}#{n}")
        out[key] = status
    return out


def served_probe(python, archive, cwd, test):
    """Modules the SHARE run of one test module serves (PYCDSVERBOSE=1)."""
    p = subprocess.run([python, "-m", "test", "-q", test], cwd=cwd,
                       env=env_for(PYCDSMODE="SHARE", PYCDSARCHIVE=archive,
                                   PYCDSVERBOSE="1"),
                       capture_output=True, text=True, timeout=900)
    lines = (p.stdout + p.stderr).splitlines()
    return sum(1 for ln in lines if ln.startswith("[pycds] served ")), \
        [ln for ln in lines if ln.startswith("[pycds] warning")]


def compare(python, tests, workdir, jobs=2, timeout=3600, log=print, release="1"):
    """Run the three steps; returns a dict of results.  ``release``: the
    SHARE run's PYCDSRELEASE (``protect`` makes any use of memory given back
    after a module body ran fault at once)."""
    arch = os.path.join(workdir, "regrtest.img")
    res = {}
    for step, env, j in (("plain", {}, jobs),
                         ("dump", {"PYCDSMODE": "DUMP", "PYCDSARCHIVE": arch}, jobs),
                         ("share", {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": arch,
                                    "PYCDSRELEASE": release}, jobs)):
        xml = os.path.join(workdir, f"{step}.xml")
        rc, dt, tail = regrtest(python, tests, xml, j, workdir, timeout, **env)
        res[step] = {"rc": rc, "seconds": dt, "tail": tail,
                     "cases": outcomes(xml) if os.path.exists(xml) else {}}
        log(f"{step:6s} rc={rc} {dt:6.1f}s cases={len(res[step]['cases'])}")
        if step == "dump" and not os.path.exists(arch):
            raise SystemExit(f"the DUMP run wrote no archive:\n{tail}")
    plain, share = res["plain"]["cases"], res["share"]["cases"]
    diffs = sorted(k for k in set(plain) | set(share) if plain.get(k) != share.get(k))
    res["diffs"] = [(k, plain.get(k), share.get(k)) for k in diffs]
    per = {}
    for (mod, _), status in plain.items():
        d = per.setdefault(mod, {"cases": 0, "pass": 0, "failure": 0, "error": 0,
                                 "skipped": 0, "differ": 0})
        d["cases"] += 1
        d[status] += 1
    for (mod, _), _, _ in res["diffs"]:
        per.setdefault(mod, {"cases": 0, "pass": 0, "failure": 0, "error": 0,
                             "skipped": 0, "differ": 0})["differ"] += 1
    res["per_module"] = per
    res["archive_bytes"] = os.path.getsize(arch)
    res["served"], res["warnings"] = served_probe(python, arch, workdir, tests[0])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", nargs="+", default=DEFAULT)
    ap.add_argument("--fast", action="store_true", help=f"only {' '.join(FAST)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--release", default="1", choices=["0", "1", "protect"],
                    help="PYCDSRELEASE of the SHARE run (default 1)")
    args = ap.parse_args(argv)
    tests = FAST if args.fast else args.tests
    workdir = args.workdir or tempfile.mkdtemp(prefix="pycds-regrtest-")
    os.makedirs(workdir, exist_ok=True)
    res = compare(args.python, tests, workdir, args.jobs, release=args.release)
    print(f"{'module':20s} {'cases':>6s} {'pass':>6s} {'fail':>5s} {'error':>5s} "
          f"{'skip':>5s} {'differ':>6s}")
    for mod, d in sorted(res["per_module"].items()):
        print(f"{mod:20s} {d['cases']:6d} {d['pass']:6d} {d['failure']:5d} "
              f"{d['error']:5d} {d['skipped']:5d} {d['differ']:6d}")
    for key, a, b in res["diffs"]:
        print(f"DIFF {key[1]}: plain={a} share={b}")
    print(f"archive_bytes={res['archive_bytes']} served_in_{tests[0]}={res['served']} "
          f"warnings={len(res['warnings'])} plain_rc={res['plain']['rc']} "
          f"share_rc={res['share']['rc']} differ={len(res['diffs'])}")
    ok = not res["diffs"] and res["served"] > 0 and not res["warnings"] \
        and res["plain"]["rc"] == res["share"]["rc"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
