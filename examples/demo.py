"""The pycds demo: an inference service's start-up, plain and from an archive.

    python examples/demo.py [--runs N] [--keep DIR]

1. writes the model's weights for ``examples/service.py`` (a Flask service
   that loads BF16 weights with safetensors, builds a ``pycds.bf16`` model
   and answers one request through Flask's test client), runs it plainly,
   then under ``PYCDSMODE=DUMP`` to record an archive of every module it
   imports from source (Flask's, numpy's, safetensors', pycds.bf16's, ...);
2. runs it under ``PYCDSMODE=SHARE`` and checks that its output is identical
   and that its modules came from the archive;
3. times fresh interpreters, baseline and pycds runs side by side: the whole
   process of the service, and the in-process import of its modules; prints
   the medians and the medians of the per-run ratios pycds/baseline, and
   checks the output of every timed run.

Child processes run without PYTHONDONTWRITEBYTECODE, so that the baseline
has the ``.pyc`` files a normal installation has.  Exit status 0 if every
pycds run printed what the plain run printed, 1 otherwise.
"""

import argparse
import os
import shutil
import sys
import tempfile

from pycds.cli.bench import interleave, median, ratio, run

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "service.py")
# Imports service.py's modules (not those the request imports lazily), with
# HERE in place of the working directory on sys.path.
IMPORT_TIMER = (f"import sys, time; sys.path[0] = {HERE!r}; t0 = time.perf_counter(); "
                "import service; print((time.perf_counter() - t0) * 1e3)")
SHOWN = ("flask", "numpy", "safetensors", "pycds.bf16")  # served: yes/no


class Variant:
    def __init__(self, name, **extra):
        self.name = name
        self.env = env(**extra)


def env(**extra):
    # The user's environment without PYCDS* and PYTHONDONTWRITEBYTECODE.
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("PYCDS") and k != "PYTHONDONTWRITEBYTECODE"}
    e.update(extra)
    return e


def python(args, variant_env):
    """Run this Python on `args`: (wall ms, stdout, stderr, exit status)."""
    wall, _, out, err, rc = run([sys.executable, *args], variant_env)
    return wall * 1e3, out, err, rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="timed runs per variant (default 15)")
    ap.add_argument("--keep", help="directory to keep the weights and the archive in")
    opts = ap.parse_args(argv)

    workdir = opts.keep or tempfile.mkdtemp(prefix="pycds-demo-")
    os.makedirs(workdir, exist_ok=True)
    try:
        return demo(opts.runs, workdir)
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def demo(runs, workdir):
    weights = os.path.join(workdir, "lenet_digits_u16.safetensors")
    archive = os.path.join(workdir, "service.img")
    service = [PROGRAM, weights]
    baseline = Variant("baseline")
    pycds = Variant("pycds", PYCDSMODE="SHARE", PYCDSARCHIVE=archive)

    print(f"pycds demo on Python {sys.version.split()[0]}: {os.path.relpath(PROGRAM)}, "
          "a Flask + numpy + safetensors + pycds.bf16 service starting up")
    if "PYTHONDONTWRITEBYTECODE" in os.environ:
        print("   (PYTHONDONTWRITEBYTECODE is set: not for the demo's runs, so that the "
              "baseline has its .pyc files)")
    steps = [("write the weights", [PROGRAM, "--write-weights", weights], baseline.env),
             ("plain run", service, baseline.env)]
    for what, args, e in steps:
        _, out, err, rc = python(args, e)
        if rc != 0:
            print(f"{what} failed (exit {rc}):\n{err}", file=sys.stderr)
            return 1
    plain_out = out

    dump_ms, _, err, rc = python(service, env(PYCDSMODE="DUMP", PYCDSARCHIVE=archive))
    size = os.path.getsize(archive) if os.path.exists(archive) else 0
    print(f"1. dump run: exit {rc}, archive {archive} ({size / 2**20:.1f} MiB), "
          f"{dump_ms / 1e3:.2f} s")
    if rc != 0 or not size:
        print(f"the dump run wrote no archive:\n{err}", file=sys.stderr)
        return 1
    _, out, err, rc = python(service, dict(pycds.env, PYCDSVERBOSE="1"))
    served = {line.split()[2] for line in err.splitlines() if line.startswith("[pycds] served ")}
    same = rc == 0 and out == plain_out
    print(f"2. share run: exit {rc}, {len(served)} modules served from the archive ("
          + ", ".join(f"{m}: {'yes' if m in served else 'NO'}" for m in SHOWN) + ")")
    for line in plain_out.splitlines():
        print("   | " + line)
    print(f"   output identical to the plain run: {'yes' if same else 'NO'}")
    for line in err.splitlines():
        if line.startswith("[pycds] warning"):
            print("   " + line)

    load = os.getloadavg()[0]
    print(f"3. timing, {runs} runs of each side by side (fresh interpreters; load average "
          f"{load:.1f} on {os.cpu_count()} CPUs: other processes slow both sides)")
    differ = []

    def once(v):
        wall, out, err, rc = python(service, v.env)
        if rc != 0 or out != plain_out:
            differ.append((v.name, rc, err))
        _, out, err, rc = python(["-c", IMPORT_TIMER], v.env)
        if rc != 0:
            differ.append((v.name + " import", rc, err))
            return wall, float("nan")
        return wall, float(out.split()[-1])

    t = interleave([baseline, pycds], runs, once)
    print(f"   {'':34} {'baseline':>9} {'pycds':>9} {'pycds/baseline':>15}")
    for i, label in enumerate(("whole process (ms)", "import of its modules (ms)")):
        b = [x[i] for x in t["baseline"]]
        p = [x[i] for x in t["pycds"]]
        print(f"   {label:34} {median(b):9.1f} {median(p):9.1f} {ratio(p, b):14.2f}x")
    print("   (medians; the ratio is the median of the per-run ratios)")
    for name, rc, err in differ[:3]:
        print(f"   a timed {name} run failed or printed what the plain run did not: "
              f"exit {rc}\n{err}")
    return 0 if same and served and not differ else 1


if __name__ == "__main__":
    sys.exit(main())
