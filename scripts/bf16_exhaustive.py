"""Exhaustive check of float32 -> BF16 rounding over all 2**32 bit patterns.

Compares ``pycds.bf16.convert`` (the native loop and the numpy path) bit for
bit with ml_dtypes' round-to-nearest-even, and the "truncate" mode with
``u >> 16`` (NaN -> sign | 0x7FC0), in chunks of 2**CHUNK_BITS patterns.
Run once with the project's interpreter; takes about a minute per path::

    PYTHONPATH=. python scripts/bf16_exhaustive.py [--paths native,numpy]

Exit status 0 when every pattern matches; prints the first mismatches.
"""

import argparse
import sys
import time

import ml_dtypes
import numpy as np

from pycds.bf16 import convert


def _paths():
    return {
        "native": lambda f, r: convert._native_from_f32(f, r),
        "numpy": lambda f, r: convert._round_bits(f.view(np.uint32), r),
    }


def check_chunk(start, size, fn, rounding):
    # -> (mismatch count, first mismatching pattern or None)
    u = np.arange(start, start + size, dtype=np.uint64).astype(np.uint32)
    f = u.view(np.float32)
    got = fn(f, rounding)
    if rounding == "nearest":
        with np.errstate(invalid="ignore", over="ignore"):
            want = f.astype(ml_dtypes.bfloat16).view(np.uint16)
    else:
        want = (u >> np.uint32(16)).astype(np.uint16)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        want[nan] = (want[nan] & np.uint16(0x8000)) | np.uint16(0x7FC0)
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[0]
        return bad.size, (int(u[i]), int(got[i]), int(want[i]))
    return 0, None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="native,numpy")
    ap.add_argument("--roundings", default="nearest,truncate")
    ap.add_argument("--chunk-bits", type=int, default=24)
    args = ap.parse_args(argv)
    paths = _paths()
    size = 1 << args.chunk_bits
    total_bad = 0
    for name in args.paths.split(","):
        for rounding in args.roundings.split(","):
            t0 = time.perf_counter()
            bad = 0
            first = None
            for start in range(0, 1 << 32, size):
                n, f = check_chunk(start, size, paths[name], rounding)
                bad += n
                first = first or f
            dt = time.perf_counter() - t0
            print(f"{name:6s} {rounding:8s} 2**32 patterns: {bad} mismatches "
                  f"({dt:.1f} s)")
            if first:
                print(f"  first: u={first[0]:#010x} got {first[1]:#06x} "
                      f"want {first[2]:#06x}")
            total_bad += bad
    print("PASS" if total_bad == 0 else "FAIL")
    return 0 if total_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
