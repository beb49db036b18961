"""The pycds demo: accelerate the import of a real program, side by side.

    python examples/demo.py [--runs N] [--keep DIR]

1. runs ``examples/bf16_infer.py`` (BF16 digit classification with
   ``pycds.bf16``) plainly, then under ``PYCDSMODE=DUMP`` to record an archive
   of every module it imports from source (numpy's included);
2. runs it under ``PYCDSMODE=SHARE`` and checks that the predictions are
   identical and that the modules came from the archive;
3. measures, interleaving baseline and pycds runs in fresh interpreters, the
   in-process import time of ``pycds.bf16`` (with numpy and what it pulls in)
   and the whole-process wall time, and prints medians and ratios.

Exit status 0 if the accelerated output is identical, 1 otherwise.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "bf16_infer.py")
IMPORT_TIMER = ("import time; t0 = time.perf_counter(); "
                "import pycds.bf16, pycds.bf16.models; "
                "print((time.perf_counter() - t0) * 1e3)")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYCDS")}
    e.update(extra)
    return e


def run(args, **extra):
    return subprocess.run([sys.executable, *args], env=env(**extra),
                          capture_output=True, text=True, cwd=HERE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="timed runs per variant (default 15)")
    ap.add_argument("--keep", help="directory to keep the archive in")
    opts = ap.parse_args(argv)

    workdir = opts.keep or tempfile.mkdtemp(prefix="pycds-demo-")
    os.makedirs(workdir, exist_ok=True)
    archive = os.path.join(workdir, "bf16_infer.img")
    share = {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": archive}

    print(f"pycds demo on {sys.version.split()[0]}: {os.path.relpath(PROGRAM)}")
    plain = run([PROGRAM])
    if plain.returncode != 0:
        print(plain.stderr, file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    dump = run([PROGRAM], PYCDSMODE="DUMP", PYCDSARCHIVE=archive, PYCDSVERBOSE="1")
    dump_s = time.perf_counter() - t0
    size = os.path.getsize(archive) if os.path.exists(archive) else 0
    print(f"1. dump run: exit {dump.returncode}, archive {archive} "
          f"({size / 2**20:.1f} MiB), {dump_s:.2f} s")
    shared = run([PROGRAM], PYCDSVERBOSE="1", **share)
    served = [l.split()[-1] for l in shared.stderr.splitlines()
              if l.startswith("[pycds] served ")]
    same = shared.returncode == plain.returncode and shared.stdout == plain.stdout
    print(f"2. share run: exit {shared.returncode}, {len(served)} modules served from "
          f"the archive (pycds.bf16: {'yes' if 'pycds.bf16' in served else 'NO'}, "
          f"numpy: {'yes' if 'numpy' in served else 'NO'})")
    print("   " + next(l for l in plain.stdout.splitlines() if l.startswith("accuracy")))
    print(f"   predictions identical to the plain run: {'yes' if same else 'NO'}")
    for line in shared.stderr.splitlines():
        if line.startswith("[pycds] warning"):
            print("   " + line)

    print(f"3. timing, {opts.runs} interleaved runs each (fresh interpreters):")
    imp = {"baseline": [], "pycds": []}
    wall = {"baseline": [], "pycds": []}
    for _ in range(opts.runs):
        for name, extra in (("baseline", {}), ("pycds", share)):
            r = run(["-c", IMPORT_TIMER], **extra)
            imp[name].append(float(r.stdout.strip().splitlines()[-1]))
            t0 = time.perf_counter()
            run([PROGRAM], **extra)
            wall[name].append((time.perf_counter() - t0) * 1e3)
    print(f"   {'':38} {'baseline':>10} {'pycds':>10} {'ratio':>7}")
    for label, data in (("import pycds.bf16 (in-process, ms)", imp),
                        ("bf16_infer.py whole process (ms)", wall)):
        b = statistics.median(data["baseline"])
        p = statistics.median(data["pycds"])
        print(f"   {label:38} {b:10.1f} {p:10.1f} {p / b:7.2f}x")
    if not opts.keep:
        for f in os.listdir(workdir):
            os.unlink(os.path.join(workdir, f))
        os.rmdir(workdir)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
