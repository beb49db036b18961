"""cffi API-mode build of ``pycds._native``, the archiver and loader.

Named in setup.py as ``native/build_native.py:ffibuilder``; run directly
(``python native/build_native.py``) to build the module in place for
development.  The cdef is read from ``pycds_native.cdef`` and must match
``pycds_native.h``; ``-Werror=int-conversion`` and
``-Werror=incompatible-pointer-types`` turn a drift between them into a
build error.  The C sources include CPython's headers (internal ones in
``layout.c``), so the module is built without the limited API.
"""

import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"

SOURCES = ["errors.c", "hash.c", "image.c", "layout.c", "writer.c", "loader.c",
           "verify.c", "prefetch.c", "release.c", "file.c", "table.c",
           "descriptor.c"]
HEADERS = ["pycds_native.h", "pycds_internal.h", "archive.h", "layout/layout_310.h",
           "layout/layout_311.h", "layout/layout_312.h"]


def compile_args(platform=sys.platform):
    """Warning flags for every source (the same on every supported Python)."""
    args = [
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror=implicit-function-declaration",
        "-Werror=int-conversion",
        "-Werror=incompatible-pointer-types",
        "-fno-strict-aliasing",
    ]
    if platform.startswith("linux"):
        args.append("-D_GNU_SOURCE")
    return args


def _read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


ffibuilder = FFI()
ffibuilder.cdef(_read("pycds_native.cdef"))
ffibuilder.set_source(
    "pycds._native",
    '#include "pycds_native.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[HERE],
    # setuptools rebuilds when these change (a stale build would keep an
    # old object layout).
    depends=[os.path.relpath(os.path.join(HERE, h)) for h in HEADERS],
    define_macros=[
        ("_CFFI_NO_LIMITED_API", None),
        ("PYCDS_BUILD_VERSION", '"%s"' % VERSION),
    ],
    extra_compile_args=compile_args(),
    libraries=["dl", "pthread"],
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.path.dirname(HERE), verbose=True)
