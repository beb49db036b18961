"""x86-64 dispatch on other CPUs, under qemu-user: the AVX2 FMA kernel where
the CPU has AVX2 and no AVX-512, and nothing but baseline code on an
SSE2-only CPU.

Builds ``native/bf16/test_bfmmla_main.c`` (the standalone C check of the
driver: sbgemm and fused sbgemm against a double reference within the fp32
summation bound, conversions, im2col) natively and statically with every x86
source, then runs it with ``qemu-x86_64 -cpu Haswell-v4`` (AVX2 + FMA, no
AVX-512: cpuid must pick ``avx2fma``) and ``-cpu qemu64`` (SSE2: no kernel is
detected, the portable one runs, and no instruction outside the dispatched
kernels may fault).  Needs a C compiler and the Debian package ``qemu-user``;
skips without them unless ``PYCDS_REQUIRE_QEMU=1``.
"""

import os
import platform
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "native", "bf16")
SOURCES = ["test_bfmmla_main.c", "bf16_driver.c", "bf16_avx512.c", "bf16_fma.c",
           "bf16_bfmmla.c", "bf16_generic.c"]
QEMU = "qemu-x86_64"

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="x86-64 sources")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    missing = [name for name, path in (("cc", cc), (QEMU, shutil.which(QEMU)))
               if path is None]
    if missing:
        msg = f"missing {', '.join(missing)} (apt-get install -y gcc qemu-user)"
        if os.environ.get("PYCDS_REQUIRE_QEMU", "") == "1":
            pytest.fail(f"PYCDS_REQUIRE_QEMU=1 but {msg}")
        pytest.skip(msg)
    exe = str(tmp_path_factory.mktemp("x86") / "test_dispatch")
    proc = subprocess.run(
        [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-static",
         "-DBF16K_TEST_EXPECT=\"avx2fma\"", "-I" + SRC]
        + [os.path.join(SRC, s) for s in SOURCES] + ["-o", exe, "-lm"],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return exe


def _run(exe, cpu, *args):
    proc = subprocess.run([QEMU, "-cpu", cpu, exe, *args], capture_output=True,
                          text=True, timeout=300)
    return proc.returncode, proc.stdout


def test_avx2_cpu_runs_avx2fma(program):
    rc, out = _run(program, "Haswell-v4")
    assert rc == 0 and "kernel: avx2fma" in out and "FAIL" not in out, out


def test_sse2_cpu_runs_baseline_code_only(program):
    rc, out = _run(program, "qemu64", "generic")
    assert rc == 0 and "kernel: generic" in out and "FAIL" not in out, out
    rc, out = _run(program, "qemu64", "avx2fma")
    assert rc == 1 and "cannot select kernel avx2fma" in out, out
