"""A built manylinux wheel installs and works where no C compiler is.

Takes this interpreter's wheel from ``$PYCDS_WHEELHOUSE``, the OUTDIR of
``scripts/build_wheels.sh OUTDIR`` (``.ci/run`` builds them and sets it),
installs it into a fresh venv with ``pip --only-binary=:all:`` and a PATH
that holds no compiler, checks that ``pycds.pth`` landed in site-packages,
that both native modules load and that the bf16 kernels' CPU detection
finds what the interpreter's own pycds finds, then runs
``scripts/roundtrip.py`` there: plain, DUMP, SHARE and AUTO runs of a
small program print the same, and SHARE and AUTO serve its modules.  Without
``PYCDS_WHEELHOUSE`` the test skips and says how to run it; with it, a
missing wheel for this interpreter fails.
"""

import glob
import os
import platform
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROUNDTRIP = os.path.join(ROOT, "scripts", "roundtrip.py")
COMPILERS = ("gcc", "cc", "c99", "clang", "zig", "tcc", f"{platform.machine()}-linux-gnu-gcc")
TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"

# The bf16 kernels this CPU runs, as the pycds the interpreter finds detects
# them, loaded by file: the pycds.bf16 package imports numpy, which the
# wheel does not require.
KERNELS = r'''
import glob, importlib.util, os, pycds
here = os.path.dirname(pycds.__file__)
path, = glob.glob(os.path.join(here, "bf16", "_kernels.*.so"))
spec = importlib.util.spec_from_file_location("pycds.bf16._kernels", path)
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
print("bf16 kernels:", k.ffi.string(k.lib.bf16k_available_kernels()).decode())
'''

# The wheel's native modules, each used once.
CHECK_NATIVE = KERNELS + r'''
import sys, pycds._native
assert here.startswith(sys.prefix), (here, sys.prefix)
print(pycds._native.ffi.string(pycds._native.lib.pycds_strerror(0)).decode())
src = k.ffi.new("float[]", [1.0, -2.5, 0.15625])
bf = k.ffi.new("uint16_t[]", 3)
back = k.ffi.new("float[]", 3)
assert k.lib.bf16k_from_f32(src, bf, 3, 0) == 0
assert k.lib.bf16k_to_f32(bf, back, 3) == 0
assert list(back) == [1.0, -2.5, 0.15625], list(back)
'''


def _wheel():
    house = os.environ.get("PYCDS_WHEELHOUSE")
    if not house:
        pytest.skip("no built wheels: run `scripts/build_wheels.sh OUTDIR` and set "
                    "PYCDS_WHEELHOUSE=OUTDIR (.ci/run does both)")
    found = sorted(glob.glob(os.path.join(
        house, f"pycds-*-{TAG}-{TAG}-*manylinux*_{platform.machine()}.whl")),
        key=os.path.getmtime)
    if not found:
        pytest.fail(f"PYCDS_WHEELHOUSE={house!r} holds no {TAG} manylinux wheel for "
                    f"{platform.machine()}: scripts/build_wheels.sh {house} "
                    f"{sys.version_info[0]}.{sys.version_info[1]}")
    return found[-1]


def _no_compiler_env(bindir):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON", "PIP_REQUIRE_VIRTUALENV"))
           and k not in ("CC", "CXX", "LDSHARED", "CFLAGS", "LDFLAGS", "CPPFLAGS",
                         "VIRTUAL_ENV")}
    env["PATH"] = bindir
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def test_wheel_installs_and_serves_without_a_compiler(tmp_path):
    wheel = _wheel()
    # The PATH pip and the programs run with: one directory holding nothing
    # (the venv's interpreter is called by its path).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    found = {c: shutil.which(c, path=str(bindir)) for c in COMPILERS}
    assert not any(found.values()), found
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   capture_output=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = _no_compiler_env(str(bindir))
    # --only-binary: pip may build nothing, whatever it finds on PATH.
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "--only-binary=:all:", wheel],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isfile(os.path.join(purelib, "pycds.pth")), os.listdir(purelib)

    native = subprocess.run([py, "-c", CHECK_NATIVE], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stdout + native.stderr
    # The wheel's CPU feature detection finds what the source build's does
    # (a build whose __builtin_cpu_supports() says no to all would pick the
    # generic kernel on every CPU).
    ref_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    ref = subprocess.run([sys.executable, "-c", KERNELS], cwd=tmp_path, env=ref_env,
                         capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    kernels = [line for line in native.stdout.splitlines() if line.startswith("bf16 kernels:")]
    assert kernels == ref.stdout.splitlines(), (native.stdout, ref.stdout)

    trip = subprocess.run([py, ROUNDTRIP], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = trip.stdout + trip.stderr
    assert trip.returncode == 0, out
    assert "ok: plain, DUMP, SHARE and AUTO print the same" in out, out
