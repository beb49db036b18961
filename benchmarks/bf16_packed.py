"""``python benchmarks/bf16_packed.py``: packed-B sbgemm at 1024^3 and 2048^3
against the limit, PyTorch bf16 and numpy fp32 (the figures of issue #44).

Each round measures the limit of the kernel's instruction
(:mod:`bf16_peak`, beside this file), then, on one thread and on two,
``sbgemm(a, packed_b, c)`` with BF16 operands already in place and, when
importable, PyTorch bf16 ``ta @ tb`` (run it in PyTorch's venv with pycds
importable; PyTorch is never a pycds dependency) and, on two threads, numpy
fp32 ``matmul(a, b, out=c)``.  Every contender runs in a block of
back-to-back calls of about 0.4 s whose first 0.1 s is not counted (the
previous contender's worker threads still spin then).  One-thread figures
are thread CPU time, two-thread ones wall time.  Printed: each round's
figures, the median and range of the per-round ratios, and the ratios of
the best block of each contender (the least disturbed, on a shared machine).

Environment: ``ROUNDS`` (3), ``SIZES`` ("1024 2048"), ``THREADS`` ("1 2"),
``KERNEL`` (a name from ``pycds.bf16.gemm.NATIVE_KERNELS``; default: the
automatic one).  Unset ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` in the
command, as for examples/bench_bf16.py.
"""

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bf16_peak  # noqa: E402

from pycds.bf16 import gemm  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def block(fn, seconds=0.4, skip=0.1, cpu=False):
    """Median seconds of fn() over a block of back-to-back calls, leaving out
    the calls that start in the first `skip` seconds (at least 3 counted)."""
    clock = time.thread_time if cpu else time.perf_counter
    start = time.perf_counter()
    times = []
    while True:
        now = time.perf_counter()
        if now - start > seconds and len(times) >= 3:
            break
        t0 = clock()
        fn()
        t1 = clock()
        if now - start >= skip:
            times.append(t1 - t0)
    return statistics.median(times)


def bits(rng, shape):
    """Random BF16 bit patterns of standard normal values."""
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main():
    sizes = [int(s) for s in os.environ.get("SIZES", "1024 2048").split()]
    rounds = int(os.environ.get("ROUNDS", "3"))
    threads = [int(s) for s in os.environ.get("THREADS", "1 2").split()]
    if os.environ.get("KERNEL"):
        gemm._select_kernel(os.environ["KERNEL"])
    kernel = gemm.kernel_name()
    kind = next((k for p, k in bf16_peak.KIND_OF_KERNEL.items() if kernel.startswith(p)), None)
    if kind is None:
        sys.exit(f"no limit is measured for kernel {kernel!r}")
    print(f"kernel {kernel}, limit of {kind}; torch "
          f"{torch.__version__ if torch else '-'}; numpy {np.__version__}")
    rng = np.random.default_rng(0)
    ops = {}
    for n in sizes:
        a, b = bits(rng, (n, n)), bits(rng, (n, n))
        ops[n] = dict(a=a, pb=gemm.pack(b), c=np.empty((n, n), np.float32),
                      af=(a.astype(np.uint32) << 16).view(np.float32),
                      bf=(b.astype(np.uint32) << 16).view(np.float32))
        if torch is not None:
            ops[n]["ta"] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            ops[n]["tb"] = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    per_round = {}   # (n, threads, what) -> [value per round]
    for r in range(rounds):
        one, _, many = bf16_peak.limits(2)[kind]
        print(f"round {r}: limit {one:.0f} GF/s on 1 thread, {many:.0f} on 2; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        for n in sizes:
            o = ops[n]
            flop = 2.0 * n ** 3
            for nt in threads:
                limit = one if nt == 1 else many
                gemm._set_num_threads(nt)
                got = {"sb": flop / block(lambda: gemm.sbgemm(o["a"], o["pb"], o["c"]),
                                          cpu=nt == 1) / 1e9}
                if torch is not None:
                    torch.set_num_threads(nt)
                    got["torch"] = flop / block(lambda: o["ta"] @ o["tb"], cpu=nt == 1) / 1e9
                if nt == 2:
                    got["numpy"] = flop / block(lambda: np.matmul(o["af"], o["bf"], out=o["c"]),
                                                seconds=0.6) / 1e9
                got["limit"] = limit
                line = "  ".join(f"{k} {v:7.1f}" for k, v in got.items())
                print(f"  {n}^3 {nt} thread(s): GF/s {line}; sb/limit {got['sb'] / limit:.3f}",
                      flush=True)
                for k, v in got.items():
                    per_round.setdefault((n, nt, k), []).append(v)
    print("per-round ratios, median [min-max]; then the best blocks' ratios")
    for n in sizes:
        for nt in threads:
            sb, lim = per_round[(n, nt, "sb")], per_round[(n, nt, "limit")]
            cols = [("sb/limit", [s / li for s, li in zip(sb, lim)], max(sb) / max(lim))]
            for other in ("torch", "numpy"):
                if (n, nt, other) in per_round:
                    o = per_round[(n, nt, other)]
                    cols.append((f"sb/{other}", [s / x for s, x in zip(sb, o)], max(sb) / max(o)))
            text = "  ".join(f"{name} {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}] "
                             f"best {best:.3f}" for name, v, best in cols)
            print(f"  {n}^3 {nt} thread(s): {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
