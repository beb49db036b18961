"""What the integrity checks cost: open a ~50 MB archive, and verify and load
one module of it.

Run with the interpreter pycds is installed in::

    python scripts/reliability_costs.py [--mb 50] [--repeat 200]

Builds an archive of synthetic modules (plus the stdlib modules this script
imports) of about ``--mb`` MB in a temporary directory, then measures in a
fresh interpreter:

* ``open``: ``pycds._archive.Index.open`` -- header checksum, meta and bucket
  table SipHash checks, interpreter checks (what SHARE start-up pays, once);
* ``lookup``: one index entry read and checked (SipHash over the entry);
* ``xxh64``: the XXH64 of one module's chunk and relocation entries alone;
* ``load``: ``NativeArchive.load`` of a module -- pread of its chunk and
  relocations, XXH64, relocation, the structural check (verify_chunk),
  re-interning and frozensets -- i.e. everything a SHARE import pays before
  executing the code (median of 15 loads, each into a fresh mapping, so
  page faults of the anonymous memory are included);
* for scale, ``marshal.loads`` of the same module's code (what plain import
  pays to unmarshal its .pyc).

Prints one line per measure: median microseconds, and MB/s for the
per-module ones.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap


def synth_module(i, nfuncs):
    parts = [f'"""Synthetic module {i}."""', "import math", f"TABLE = {list(range(i % 50, i % 50 + 40))!r}"]
    for j in range(nfuncs):
        parts.append(textwrap.dedent(f'''
            def f{j}(x, y=({j}, "k{i}_{j}", {j}.5), *args, flag=frozenset({{"a{j}", "b"}})):
                """Function {j} of module {i}: docstrings are constants too."""
                s = f"{{x}}-{{y}}-m{i}f{j}"
                for k in range(x):
                    if k % 3 == {j % 3}:
                        s += str(k * {j + 1}) + "{'z' * (j % 17)}"
                    elif k in (1, 2, {j}):
                        s = s.upper()
                try:
                    return math.sqrt(len(s)) + {j}e-3
                except ValueError as e:
                    raise RuntimeError("never {i} {j}") from e
            '''))
    return "\n".join(parts)


BUILD = r"""
import importlib, sys, time
sys.path.insert(0, sys.argv[1])
n = int(sys.argv[2])
for i in range(n):
    importlib.import_module(f"synth{i:04d}")
import json, email.parser, decimal, argparse, typing
from pycds.dumping import dumper as _dumper
t0 = time.perf_counter()
print(_dumper.dump_modules(list(sys.modules.items()), sys.argv[3]), time.perf_counter() - t0)
"""

MEASURE = r"""
import json, marshal, os, statistics, sys, time
from pycds import _archive, _nativeapi as N
path, repeat = sys.argv[1], int(sys.argv[2])

def med(f, n=repeat):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        f()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3

out = {}
out["open_us"] = med(lambda: _archive.Index.open(path).close())
idx = _archive.Index.open(path)
out["file_mb"] = os.path.getsize(path) / 1e6
out["modules"] = idx.header.nmodules
entries = sorted(idx.entries(), key=lambda e: e.chunk_len)
out["lookup_us"] = med(lambda: idx.lookup("json.decoder"))
h = idx.header
rows = []
na = N.NativeArchive(idx.fd, h, idx.meta.get("layout", ""))
names = ["synth0000", entries[len(entries) // 2].name, entries[-1].name,
         "json.decoder", "email.parser", "decimal", "argparse", "typing"]
picks = [e for n in dict.fromkeys(names) for e in entries if e.name == n]
for e in picks:
    chunk = os.pread(idx.fd, e.chunk_len, h.heap_off + e.chunk_off)
    rel = os.pread(idx.fd, 4 * e.reloc_count, h.reloc_off + 4 * e.reloc_first)
    x = med(lambda: N.hash64(rel, N.hash64(chunk, 1)))
    # A module loads once per mapping: a fresh mapping per repetition.
    loads = []
    for _ in range(15):
        na = N.NativeArchive(idx.fd, h, idx.meta.get("layout", ""))
        t0 = time.perf_counter_ns()
        na.load(e)
        loads.append(time.perf_counter_ns() - t0)
    load = statistics.median(loads) / 1e3
    data = None
    if e.pyc_path and os.path.exists(e.pyc_path):
        with open(e.pyc_path, "rb") as f:
            data = f.read()[16:]
    um = med(lambda: marshal.loads(data), 50) if data else float("nan")
    rows.append({"name": e.name, "kb": e.chunk_len / 1e3, "relocs": e.reloc_count,
                 "xxh64_us": x, "load_us": load, "unmarshal_us": um})
out["modules_measured"] = rows
print(json.dumps(out))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--archive", help="measure this archive (built if missing)")
    ap.add_argument("--pythonpath", default="",
                    help="PYTHONPATH of the measuring run (another pycds build)")
    args = ap.parse_args(argv)
    d = tempfile.mkdtemp(prefix="pycds-costs-")
    try:
        nfuncs = 120
        per_module = 150e3      # heap bytes per synthetic module, measured
        n = max(1, int(args.mb * 1e6 / per_module))
        src = os.path.join(d, "src")
        os.makedirs(src)
        for i in range(n):
            with open(os.path.join(src, f"synth{i:04d}.py"), "w") as f:
                f.write(synth_module(i, nfuncs))
        img = args.archive or os.path.join(d, "big.img")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
        if not os.path.exists(img):
            b = subprocess.run([args.python, "-c", BUILD, src, str(n), img], env=env,
                               capture_output=True, text=True)
            if b.returncode:
                raise SystemExit(b.stderr)
            print(f"built: {b.stdout.strip()} (modules, skipped) seconds")
        menv = dict(env, PYTHONPATH=args.pythonpath) if args.pythonpath else env
        m = subprocess.run([args.python, "-c", MEASURE, img, str(args.repeat)], env=menv,
                           capture_output=True, text=True, cwd=d)
        if m.returncode:
            raise SystemExit(m.stderr)
        r = json.loads(m.stdout)
        print(f"archive: {r['file_mb']:.1f} MB, {r['modules']} modules")
        print(f"open (header + meta + buckets, checked): {r['open_us']:.1f} us")
        print(f"lookup (one entry, checked): {r['lookup_us']:.1f} us")
        print(f"{'module':16s} {'KB':>7s} {'relocs':>7s} {'xxh64 us':>9s} {'MB/s':>7s} "
              f"{'load us':>8s} {'unmarshal us':>12s}")
        for row in r["modules_measured"]:
            print(f"{row['name']:16s} {row['kb']:7.1f} {row['relocs']:7d} {row['xxh64_us']:9.1f} "
                  f"{row['kb'] / 1e3 / (row['xxh64_us'] / 1e6):7.0f} {row['load_us']:8.1f} "
                  f"{row['unmarshal_us']:12.1f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
