"""cffi API-mode builder for ``pycds.bf16._kernels`` (BF16 conversion + sbgemm).

Run by setuptools through ``cffi_modules=["native/bf16/build.py:ffibuilder"]``,
or directly for in-place development (puts the .so in ``pycds/bf16/``)::

    python native/bf16/build.py

The cdef is read from ``bf16_kernels.cdef`` beside this file; the preamble only
includes the real header, and the C files are ``sources``.  All paths are
relative to this file, since pip builds from a temporary copy.
"""

import os
import platform
import sys

from cffi import FFI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sanitize import sanitize_args  # noqa: E402  (native/sanitize.py)

SANITIZE_COMPILE, SANITIZE_LINK = sanitize_args()

SRC = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(SRC))


def _rel(path):
    # Relative to the repository root: setuptools runs there (setup.py's
    # directory) and places objects under build_temp only for relative paths.
    return os.path.relpath(path, ROOT)


def compile_args(machine=None):
    """Compiler flags; ISA extensions are enabled per function, not globally."""
    machine = (machine or platform.machine()).lower()
    args = [
        "-O3",
        "-std=c11",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror=int-conversion",
        "-Werror=incompatible-pointer-types",
        "-Werror=implicit-function-declaration",
        # No code here enables FP exceptions; without this GCC keeps float
        # compares as branches and does not vectorise the softmax's exp.
        "-fno-trapping-math",
    ]
    if machine in ("x86_64", "amd64"):
        args.append("-mtune=generic")
    return args


with open(os.path.join(SRC, "bf16_kernels.cdef")) as f:
    CDEF = f.read()

SOURCES = ["bf16_driver.c", "bf16_avx512.c", "bf16_fma.c", "bf16_bfmmla.c",
           "bf16_generic.c"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "pycds.bf16._kernels",
    '#include "bf16_kernels.h"',
    sources=[_rel(os.path.join(SRC, s)) for s in SOURCES],
    include_dirs=[_rel(SRC)],
    extra_compile_args=compile_args() + SANITIZE_COMPILE,
    extra_link_args=["-pthread"] + SANITIZE_LINK,
    libraries=["m"],    # sqrtf (bf16k_layernorm)
    py_limited_api=False,
    define_macros=[("_CFFI_NO_LIMITED_API", None)],
)

if __name__ == "__main__":
    # tmpdir=ROOT: the dotted module name lands at ROOT/pycds/bf16/; then
    # remove the generated C file and objects, keeping only the .so.
    os.chdir(ROOT)
    ffibuilder.compile(tmpdir=ROOT, verbose=True)
    for junk in [os.path.join(ROOT, "pycds", "bf16", "_kernels." + e)
                 for e in ("c", "o")] + [
            os.path.join(SRC, s[:-2] + ".o") for s in SOURCES]:
        if os.path.exists(junk):
            os.remove(junk)
