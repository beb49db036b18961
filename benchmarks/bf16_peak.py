"""``python benchmarks/bf16_peak.py [THREADS] [SECONDS]``: the arithmetic
limit of this CPU, against which the sbgemm benchmarks are read.

Compiles ``bf16_peak.c`` (beside this file) with ``cc`` into a temporary
directory and runs it: GFLOP/s of VDPBF16PS (AVX512-BF16), of fp32 FMA on
zmm (AVX-512F) and on ymm (AVX2), each on one thread and on THREADS
(default: every usable CPU), for the kinds this CPU has.  Raises
RuntimeError when no C compiler is found or the program fails.

Also :class:`OthersMeter`: how much CPU other processes took while a
benchmark block ran (the machines these benches run on are shared), so
the benches can drop and repeat disturbed blocks.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The kernel pycds.bf16.gemm.kernel_name() reports, to the limit it is
# measured against (the instruction its inner loop issues).
KIND_OF_KERNEL = {"avx512bf16": "avx512bf16", "avx512": "avx512f", "avx2": "avx2"}


def limits(threads=None, seconds=0.5):
    """``{kind: (gflops_one_thread, threads, gflops_all_threads)}`` for the
    kinds this CPU has ("avx512bf16", "avx512f", "avx2")."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc) to build bf16_peak.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bf16_peak")
        r = subprocess.run([cc, "-O2", "-pthread", os.path.join(HERE, "bf16_peak.c"),
                            "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building bf16_peak.c failed: {r.stderr.strip()}")
        args = [exe, str(threads or 0), str(seconds)]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"bf16_peak failed: {r.stderr.strip()}")
    out = {}
    for line in r.stdout.splitlines():
        kind, _, one, n, many = line.split()
        out[kind] = (float(one), int(n), float(many))
    return out


def limit_for(kernel, threads=None):
    """GFLOP/s limit on ``threads`` threads for the sbgemm kernel named
    ``kernel`` (pycds.bf16.gemm.kernel_name()), or None where it has no
    measured kind (the portable kernels)."""
    kind = next((k for prefix, k in KIND_OF_KERNEL.items() if kernel.startswith(prefix)),
                None)
    got = limits(threads).get(kind) if kind else None
    return None if got is None else got[2]


def _busy_seconds():
    # CPU seconds all CPUs spent busy since boot (/proc/stat: user, nice,
    # system, irq, softirq and steal, the time the hypervisor gave away).
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _own_seconds():
    # CPU seconds of this process (all its threads) and its waited-for
    # children (the limit program).
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OthersMeter:
    """CPUs' worth of time other processes took since :meth:`start`.

    ``others()`` is (busy CPU time of the machine - this process's CPU
    time) / wall time: 1.0 means another process held a whole CPU
    throughout.  /proc/stat counts in ticks of 10 ms, so a block of 0.25 s
    reads to about +-0.05.  None where /proc/stat is missing (not Linux).
    """

    def __init__(self):
        self.start()

    def start(self):
        try:
            self._busy = _busy_seconds()
        except (OSError, ValueError, IndexError):
            self._busy = None
        self._own = _own_seconds()
        self._wall = time.perf_counter()

    def others(self):
        if self._busy is None:
            return None
        wall = time.perf_counter() - self._wall
        used = (_busy_seconds() - self._busy) - (_own_seconds() - self._own)
        return max(0.0, used) / wall if wall > 0 else 0.0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    threads = int(argv[0]) if argv else None
    seconds = float(argv[1]) if len(argv) > 1 else 0.5
    print(f"{'kind':12s} {'1 thread GF/s':>14s} {'threads':>8s} {'GF/s':>8s}")
    for kind, (one, n, many) in limits(threads, seconds).items():
        print(f"{kind:12s} {one:14.1f} {n:8d} {many:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
