"""aarch64 BFMMLA kernel, cross-compiled and run under qemu-user.

Runs ``scripts/test_bfmmla_qemu.sh``: builds ``native/bf16/bf16_driver.c`` +
``bf16_bfmmla.c`` + a C test driver with ``aarch64-linux-gnu-gcc -static``
and runs it with ``qemu-aarch64 -cpu max`` (a CPU with FEAT_BF16), checking
sbgemm against a double reference within the fp32 summation bound.

Needs the Debian packages ``gcc-aarch64-linux-gnu`` and ``qemu-user``.  When
they are missing the test skips, unless ``PYCDS_REQUIRE_QEMU=1`` (set by CI),
in which case it fails.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "test_bfmmla_qemu.sh")
TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64")
INSTALL = "apt-get install -y gcc-aarch64-linux-gnu qemu-user"


def _require():
    return os.environ.get("PYCDS_REQUIRE_QEMU", "") == "1"


def test_bfmmla_under_qemu():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        msg = f"missing {', '.join(missing)}; install with: {INSTALL}"
        if _require():
            pytest.fail(f"PYCDS_REQUIRE_QEMU=1 but {msg}")
        pytest.skip(msg)
    proc = subprocess.run(["sh", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}"
    assert "kernel: bfmmla" in out
    assert "FAIL" not in out, out
