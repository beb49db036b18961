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

The machine may be shared: a round in which other processes took more than
``QUIET_CPUS`` CPUs' worth of time during any block or during the limit's
measurement (:class:`bf16_peak.OthersMeter`) is reported and timed again,
up to ``MAX_TRIES`` times the rounds asked; the summary gives the
undisturbed rounds and, apart, all of them.

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


QUIET_CPUS = 0.1
MAX_TRIES = 4


def block(fn, seconds=0.4, skip=0.1, cpu=False, meter=None):
    """Median seconds of fn() over a block of back-to-back calls, leaving out
    the calls that start in the first `skip` seconds (at least 3 counted);
    with `meter` (an OthersMeter), also the CPUs other processes took
    meanwhile: returns (median, others)."""
    clock = time.thread_time if cpu else time.perf_counter
    start = time.perf_counter()
    times = []
    while True:
        now = time.perf_counter()
        if now - start > seconds and len(times) >= 3:
            break
        if meter is not None and not times and now - start >= skip:
            meter.start()
        t0 = clock()
        fn()
        t1 = clock()
        if now - start >= skip:
            times.append(t1 - t0)
    if meter is None:
        return statistics.median(times)
    return statistics.median(times), meter.others()


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
    all_rounds = {}  # the same, disturbed rounds included
    meter = bf16_peak.OthersMeter()
    r = tries = 0
    while r < rounds and tries < MAX_TRIES * rounds:
        tries += 1
        meter.start()
        one, _, many = bf16_peak.limits(2)[kind]
        worst = meter.others()
        print(f"round {tries - 1}: limit {one:.0f} GF/s on 1 thread, {many:.0f} on 2; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        got_round = {}
        for n in sizes:
            o = ops[n]
            flop = 2.0 * n ** 3
            for nt in threads:
                limit = one if nt == 1 else many
                gemm._set_num_threads(nt)
                timed = {"sb": block(lambda: gemm.sbgemm(o["a"], o["pb"], o["c"]),
                                     cpu=nt == 1, meter=meter)}
                if torch is not None:
                    torch.set_num_threads(nt)
                    timed["torch"] = block(lambda: o["ta"] @ o["tb"], cpu=nt == 1, meter=meter)
                if nt == 2:
                    timed["numpy"] = block(lambda: np.matmul(o["af"], o["bf"], out=o["c"]),
                                           seconds=0.6, meter=meter)
                got = {k: flop / t / 1e9 for k, (t, _) in timed.items()}
                seen = [x for _, x in timed.values() if x is not None]
                oth = max(seen) if seen else None
                if oth is not None:
                    worst = oth if worst is None else max(worst, oth)
                got["limit"] = limit
                line = "  ".join(f"{k} {v:7.1f}" for k, v in got.items())
                print(f"  {n}^3 {nt} thread(s): GF/s {line}; sb/limit {got['sb'] / limit:.3f}"
                      f"; others {'-' if oth is None else format(oth, '.2f')}", flush=True)
                for k, v in got.items():
                    got_round[(n, nt, k)] = v
        for key, v in got_round.items():
            all_rounds.setdefault(key, []).append(v)
        if worst is not None and worst > QUIET_CPUS:
            print(f"  (disturbed: other processes took {worst:.2f} CPUs; timed again)",
                  flush=True)
            continue
        r += 1
        for key, v in got_round.items():
            per_round.setdefault(key, []).append(v)
    summarize("undisturbed rounds", per_round, sizes, threads)
    summarize("all rounds", all_rounds, sizes, threads)
    return 0


def summarize(title, per_round, sizes, threads):
    """Print the median [min-max] of per-round ratios and the best blocks'."""
    if not per_round:
        print(f"{title}: none")
        return
    print(f"{title} ({len(next(iter(per_round.values())))}): per-round ratios, "
          "median [min-max]; then the best blocks' ratios")
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


if __name__ == "__main__":
    sys.exit(main())
