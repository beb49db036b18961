"""Run a selection of CPython's own regression tests with every module they
import served from a pycds archive, and compare per-test results with a
plain run.

Run with the interpreter pycds is installed in (its Lib/test must exist)::

    python scripts/cpython_regrtest.py [--tests test_json test_code ...]
                                       [--jobs 2] [--workdir DIR]
    python scripts/cpython_regrtest.py --all [--recheck 2]

``--all`` runs every test module ``python -m test`` runs (resources as its
default: none), each with regrtest's ``--timeout``; ``--recheck N`` runs
each test module with a differing case N more times alone, plain and
SHARE, and says per case whether plain Python itself varies there
(unstable) or only SHARE does (a pycds difference).

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
plain and the SHARE runs (with ``--recheck``: if any differing case is not
unstable plain), or if the SHARE run served no module.
"""

import argparse
import collections
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
PER_TEST_TIMEOUT = 1200     # s, regrtest's --timeout in --all


def env_for(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON")) and k != "SOURCE_DATE_EPOCH"}
    env.update(extra)
    return env


def regrtest(python, tests, xml, jobs, cwd, timeout, per_test=None, **env):
    """Run ``python -m test`` on tests (all of them where empty); returns
    (rc, seconds, stderr tail)."""
    cmd = [python, "-m", "test", "--junit-xml", xml, "-q"]
    if jobs:
        cmd += ["-j", str(jobs)]
    if per_test:
        cmd += ["--timeout", str(per_test)]
    t0 = time.time()
    p = subprocess.run(cmd + list(tests), cwd=cwd, env=env_for(**env),
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, time.time() - t0, (p.stdout + p.stderr)[-3000:]


def outcomes(xml):
    """{(test module, testcase id): outcome} from a regrtest junit file.
    regrtest writes one <testsuite> per test module, unnamed, and the
    dotted test id as the case's "name"; a doctest's id is the module it
    tests ("json"), so a suite's test module is the one its "test.X" ids
    name most."""
    out = {}
    root = ET.parse(xml).getroot()
    for suite in root.iter("testsuite"):
        cases = []
        for case in suite.iter("testcase"):
            name = ".".join(filter(None, (case.get("classname"), case.get("name"))))
            status = "pass"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    status = child.tag
            cases.append((name, status))
        named = collections.Counter(n.split(".")[1] for n, _ in cases
                                    if n.startswith("test.") and n.count(".") >= 1)
        for name, status in cases:
            mod = named.most_common(1)[0][0] if named else name.split(".")[0]
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


def compare(python, tests, workdir, jobs=2, timeout=3600, log=print, release="1",
            per_test=None, probe=None):
    """Run the three steps; returns a dict of results.  ``tests`` empty: the
    whole suite.  ``release``: the SHARE run's PYCDSRELEASE (``protect``
    makes any use of memory given back after a module body ran fault at
    once).  ``probe``: the test module the served count is taken from
    (default: the first of ``tests``)."""
    arch = os.path.join(workdir, "regrtest.img")
    res = {}
    for step, env, j in (("plain", {}, jobs),
                         ("dump", {"PYCDSMODE": "DUMP", "PYCDSARCHIVE": arch}, jobs),
                         ("share", {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": arch,
                                    "PYCDSRELEASE": release}, jobs)):
        xml = os.path.join(workdir, f"{step}.xml")
        rc, dt, tail = regrtest(python, tests, xml, j, workdir, timeout, per_test, **env)
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
    res["probe"] = probe or tests[0]
    res["served"], res["warnings"] = served_probe(python, arch, workdir, res["probe"])
    return res


def recheck(python, res, workdir, times, release="1", log=print):
    """Run each test module with a differing case ``times`` more times
    alone, plain and SHARE (with the same archive); returns
    {(module, case): (plain outcomes seen, SHARE outcomes seen, verdict)},
    the verdict "unstable" where plain Python itself gave more than one
    outcome (the first run included), else "pycds" where a SHARE rerun gave
    one plain never did, else "agree" (the difference did not come back)."""
    arch = os.path.join(workdir, "regrtest.img")
    seen = {}           # case: (plain outcomes, SHARE outcomes of the reruns)
    first = {k: a for k, a, _ in res["diffs"]}
    for mod in sorted({k[0] for k in first}):
        for k in first:
            if k[0] == mod:
                seen[k] = (set(), set())
        for i in range(times):
            for side, env in (("plain", {}), ("share", {"PYCDSMODE": "SHARE",
                                                        "PYCDSARCHIVE": arch,
                                                        "PYCDSRELEASE": release})):
                xml = os.path.join(workdir, f"recheck-{mod}-{side}-{i}.xml")
                rc, dt, _ = regrtest(python, [mod], xml, 0, workdir, 3600,
                                     PER_TEST_TIMEOUT, **env)
                cases = outcomes(xml) if os.path.exists(xml) else {}
                for k in seen:
                    if k[0] == mod:
                        seen[k][side == "share"].add(cases.get(k))
                log(f"recheck {mod} {side} #{i + 1}: rc={rc} {dt:.1f}s")
    out = {}
    for k, (p, s) in seen.items():
        p.add(first[k])
        verdict = "unstable" if len(p) > 1 else "pycds" if s - p else "agree"
        out[k] = (sorted(map(str, p)), sorted(map(str, s)), verdict)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", nargs="+", default=DEFAULT)
    ap.add_argument("--fast", action="store_true", help=f"only {' '.join(FAST)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--release", default="1", choices=["0", "1", "protect"],
                    help="PYCDSRELEASE of the SHARE run (default 1)")
    ap.add_argument("--all", action="store_true",
                    help="every test module regrtest runs by default")
    ap.add_argument("--recheck", type=int, default=0, metavar="N",
                    help="rerun modules with a differing case N times alone")
    args = ap.parse_args(argv)
    tests = [] if args.all else FAST if args.fast else args.tests
    workdir = args.workdir or tempfile.mkdtemp(prefix="pycds-regrtest-")
    os.makedirs(workdir, exist_ok=True)
    if args.all:
        res = compare(args.python, [], workdir, args.jobs, timeout=12 * 3600,
                      release=args.release, per_test=PER_TEST_TIMEOUT,
                      probe="test_json")
    else:
        res = compare(args.python, tests, workdir, args.jobs, release=args.release)
    print(f"{'module':20s} {'cases':>6s} {'pass':>6s} {'fail':>5s} {'error':>5s} "
          f"{'skip':>5s} {'differ':>6s}")
    for mod, d in sorted(res["per_module"].items()):
        print(f"{mod:20s} {d['cases']:6d} {d['pass']:6d} {d['failure']:5d} "
              f"{d['error']:5d} {d['skipped']:5d} {d['differ']:6d}")
    for key, a, b in res["diffs"]:
        print(f"DIFF {key[1]}: plain={a} share={b}")
    real = len(res["diffs"])
    if args.recheck and res["diffs"]:
        checked = recheck(args.python, res, workdir, args.recheck, args.release)
        for key, (p, s, verdict) in sorted(checked.items()):
            print(f"RECHECK {key[1]}: plain={','.join(p)} share={','.join(s)} {verdict}")
        real = sum(1 for v in checked.values() if v[2] != "unstable")
    cases = len(res["plain"]["cases"])
    print(f"cases={cases} archive_bytes={res['archive_bytes']} "
          f"served_in_{res['probe']}={res['served']} "
          f"warnings={len(res['warnings'])} plain_rc={res['plain']['rc']} "
          f"share_rc={res['share']['rc']} differ={len(res['diffs'])} "
          f"not_unstable={real}")
    ok = real == 0 and res["served"] > 0 and not res["warnings"] \
        and (res["plain"]["rc"] == res["share"]["rc"] or not real)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
