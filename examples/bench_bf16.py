"""Benchmark ``pycds.bf16.gemm.sbgemm`` against numpy float32 matmul.

Prints GFLOP/s (2*M*N*K / time) for both, measured in the same process,
interleaved in alternating blocks of back-to-back calls (steady state only;
see BLOCK_S for why not call by call) in several rounds over all cases, as
medians, their ratio (numpy time / sbgemm time; > 1: sbgemm faster), and
sbgemm's GFLOP/s as a fraction of the limit of the instruction its kernel
issues on as many threads (VDPBF16PS or FMA; benchmarks/bf16_peak.c, measured
before and after the cases, the higher kept):

* square GEMMs 256, 1024, 2048 -- fp32 inputs converted to BF16 inside the
  timed region (``sbgemm`` on the fp32 activations, which it rounds to BF16,
  plus ``to_bf16`` of the weights), B not packed;
* ResNet-50 3x3 convolutions as im2col GEMMs, batch 1 (M = OH*OW,
  K = C*9, N = OC), weights packed once, activations converted in the loop;
* small-batch inference, M = 1 and 8 rows x K = N = 4096, packed weights.

Run (unset OpenBLAS overrides in this command only, and on a quiet machine)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        PYTHONPATH=. python examples/bench_bf16.py [--quick] [--rounds R]

Another kernel than the default (``PYCDS_BF16_KERNEL``, docs/env-vars.md), e.g.
the AVX2 FMA one of CPUs without BF16 instructions, against numpy on OpenBLAS's
AVX2 kernels as on such a CPU::

    env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=Haswell PYCDS_BF16_KERNEL=avx2fma \\
        PYTHONPATH=. python examples/bench_bf16.py --quick

Single-core comparison (robust when other processes share the machine)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
        PYTHONPATH=. python examples/bench_bf16.py --threads 1

Whole networks (ResNet-50 and AlexNet forwards against PyTorch) are timed by
``examples/bench_bf16_models.py``.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from pycds.bf16 import gemm
from pycds.bf16.convert import to_bf16

# (label, M, K, N): ResNet-50 3x3 convs, batch 1, 224x224 input.
RESNET50_3X3 = [
    ("resnet50 layer1 3x3", 56 * 56, 64 * 9, 64),
    ("resnet50 layer2 3x3", 28 * 28, 128 * 9, 128),
    ("resnet50 layer3 3x3", 14 * 14, 256 * 9, 256),
    ("resnet50 layer4 3x3", 7 * 7, 512 * 9, 512),
]


# After every sgemm, OpenBLAS worker threads keep spinning (sched_yield) for
# about 0.1 s of wall time (about 30 ms of CPU per call measured here, with
# the default OPENBLAS_THREAD_TIMEOUT).  A threaded sbgemm started inside that
# window shares a core with them and runs at about single-thread speed; the
# first call after an idle period is also slow (waking the second vCPU).
# So each library is timed in alternating blocks of back-to-back calls, and
# only each block's steady state is kept: samples starting within DISCARD_S
# of the block start are dropped (the last call is always kept).
BLOCK_S = 0.35
DISCARD_S = 0.15
# The machine may be shared: a pair of blocks during which other processes
# took more than QUIET_CPUS CPUs' worth of time (bf16_peak.OthersMeter) is
# dropped and timed again, up to MAX_DROPS times per case and round (then
# kept, and the row's "others" column shows it).
QUIET_CPUS = 0.1
MAX_DROPS = 12


def _block(f, block_s, meter):
    # Per-call seconds of f's steady state within one block, and the CPUs
    # other processes took during that steady state (None: not measured).
    start = time.perf_counter()
    kept, last = [], None
    while True:
        t0 = time.perf_counter()
        if meter is not None and not kept and t0 - start >= DISCARD_S:
            meter.start()
        f()
        t1 = time.perf_counter()
        last = t1 - t0
        if t0 - start >= DISCARD_S:
            kept.append(last)
        if t1 - start >= block_s:
            break
    others = meter.others() if meter is not None and kept else None
    return kept or [last], others


def _interleaved(fa, fb, meter, min_time=0.7):
    """Per-call seconds of fa and fb, timed in alternating blocks; pairs of
    blocks disturbed by other processes are dropped (at most MAX_DROPS).

    Returns (ta, tb, dropped, others): `others` is the most CPU another
    process took in a kept block (None: not measured)."""
    ta, tb = [], []
    dropped, worst = 0, None
    t_end = time.perf_counter() + min_time
    while not ta or time.perf_counter() < t_end:
        a, oa = _block(fa, BLOCK_S, meter)
        b, ob = _block(fb, BLOCK_S, meter)
        pair = max(oa, ob) if oa is not None and ob is not None else None
        if pair is not None and pair > QUIET_CPUS and dropped < MAX_DROPS:
            dropped += 1
            t_end += 2 * BLOCK_S
            continue
        ta += a
        tb += b
        if pair is not None:
            worst = pair if worst is None else max(worst, pair)
    return ta, tb, dropped, worst


def make_case(label, m, k, n, packed, rng):
    """Return (run_numpy, run_sbgemm) closures for one GEMM shape.

    Both take fp32 activations ``a`` (M, K) and produce fp32 (M, N); numpy
    multiplies by fp32 weights ``w`` (K, N), sbgemm rounds ``a`` to BF16
    in the timed call (given fp32 ``a``: the FMA kernels while packing it,
    the others with a conversion first) and uses ``w`` in BF16 -- packed
    once beforehand when `packed` (weights at model load), else converted
    and packed per call.
    """
    a = rng.standard_normal((m, k)).astype(np.float32)  # (M, K) activations
    w = rng.standard_normal((k, n)).astype(np.float32)  # (K, N) weights
    if packed:
        pw = gemm.pack(to_bf16(w))  # once, at model load

        def run_sb():
            gemm.sbgemm(a, pw)  # fp32 a: rounded to BF16 in the call
    else:
        def run_sb():
            gemm.sbgemm(a, to_bf16(w))

    def run_np():
        np.matmul(a, w)

    run_np()
    run_sb()
    return run_np, run_sb


def bench_cases(cases, rng, min_time, rounds, meter=None):
    """Time every case in `rounds` passes (spreading machine noise), medians.

    `meter` (a bf16_peak.OthersMeter, or None) lets disturbed blocks be
    dropped and timed again.

    Returns
    -------
    list of dict
        One row per case: ``case, m, k, n, packed, np_gflops, sb_gflops,
        np_ms, sb_ms, ratio`` (ratio = numpy time / sbgemm time),
        ``dropped`` (disturbed pairs of blocks timed again) and ``others``
        (the most CPU other processes took in a kept block, or None).
    """
    fns = [make_case(*c, rng=rng) for c in cases]
    t_np = [[] for _ in cases]
    t_sb = [[] for _ in cases]
    dropped = [0 for _ in cases]
    others = [None for _ in cases]
    for _ in range(rounds):
        for i, (run_np, run_sb) in enumerate(fns):
            ta, tb, d, o = _interleaved(run_np, run_sb, meter,
                                        min_time=min_time / rounds)
            t_np[i] += ta
            t_sb[i] += tb
            dropped[i] += d
            if o is not None:
                others[i] = o if others[i] is None else max(others[i], o)
    rows = []
    for (label, m, k, n, packed), tn, ts, d, o in zip(cases, t_np, t_sb,
                                                       dropped, others):
        tn, ts = statistics.median(tn), statistics.median(ts)
        flops = 2.0 * m * n * k
        rows.append(dict(case=label, m=m, k=k, n=n, packed=packed,
                         np_gflops=flops / tn / 1e9,
                         sb_gflops=flops / ts / 1e9,
                         np_ms=tn * 1e3, sb_ms=ts * 1e3, ratio=tn / ts,
                         dropped=d, others=o))
    return rows


def _peak_module():
    """benchmarks/bf16_peak.py (the limit, and OthersMeter), or None."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                        "benchmarks", "bf16_peak.py")
    try:
        spec = importlib.util.spec_from_file_location("bf16_peak", path)
        peak = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peak)
        return peak
    except OSError as e:
        print(f"warning: {path}: {e}", file=sys.stderr)
        return None


def _limit(peak, kernel, threads):
    """The GFLOP/s limit of the instruction ``kernel`` issues on ``threads``
    threads (benchmarks/bf16_peak.py), or None (no compiler, a portable
    kernel)."""
    try:
        return None if peak is None else peak.limit_for(kernel, threads)
    except (OSError, RuntimeError) as e:
        print(f"warning: no limit measured: {e}", file=sys.stderr)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="shorter timing windows (noisier)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="passes over all cases; samples are pooled")
    ap.add_argument("--threads", type=int, default=0,
                    help="sbgemm worker threads (0: all CPUs); for a fair "
                         "comparison also set OPENBLAS_NUM_THREADS to it")
    args = ap.parse_args(argv)
    min_time = 0.7 if args.quick else 3.0  # seconds per case, all rounds
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        if var in os.environ:
            print(f"warning: {var}={os.environ[var]} is set", file=sys.stderr)
    nthreads = gemm._set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    # OpenBLAS is slow until a large GEMM has run in the process: warm up.
    x = rng.standard_normal((2048, 2048)).astype(np.float32)
    for _ in range(3):
        x @ x
    peak = _peak_module()
    limit = _limit(peak, gemm.kernel_name(), nthreads)
    print(f"kernel: {gemm.kernel_name()}  sbgemm threads {nthreads}  "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')}"
          f"  numpy {np.__version__}  cpus {os.cpu_count()}  "
          f"loadavg {os.getloadavg()[0]:.2f}  "
          f"limit {'-' if limit is None else f'{limit:.0f} GF/s'} (benchmarks/bf16_peak.c)")
    cases = [(f"square {s}", s, s, s, False) for s in (256, 1024, 2048)]
    cases += [(lbl, m, k, n, True) for lbl, m, k, n in RESNET50_3X3]
    cases += [(f"inference M={m}", m, 4096, 4096, True) for m in (1, 8)]
    meter = peak.OthersMeter() if peak is not None else None
    rows = bench_cases(cases, rng, min_time, args.rounds, meter)
    # Measured again after the cases: another process on a core lowers the
    # figure (two threads then reach about 1.35x one), so keep the higher.
    after = _limit(peak, gemm.kernel_name(), nthreads)
    if after is not None:
        print(f"limit again after the cases: {after:.0f} GF/s; using "
              f"{max(after, limit or 0):.0f}")
        limit = max(after, limit or 0)
    head = (f"{'case':22s} {'M':>5s} {'K':>5s} {'N':>5s} {'B':>6s} "
            f"{'numpy GF/s':>10s} {'sbgemm GF/s':>11s} {'ms np':>8s} "
            f"{'ms sb':>8s} {'sb/np':>6s} {'sb/limit':>8s} {'others':>6s} "
            f"{'drop':>4s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:22s} {r['m']:5d} {r['k']:5d} {r['n']:5d} "
              f"{'packed' if r['packed'] else 'raw':>6s} "
              f"{r['np_gflops']:10.1f} {r['sb_gflops']:11.1f} "
              f"{r['np_ms']:8.3f} {r['sb_ms']:8.3f} {r['ratio']:6.2f} "
              f"{'-' if limit is None else format(r['sb_gflops'] / limit, '.2f'):>8s} "
              f"{'-' if r['others'] is None else format(r['others'], '.2f'):>6s} "
              f"{r['dropped']:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
