"""cffi API-mode build of ``pycds._native``, the archive writer and loader.

Named in setup.py as ``native/archive/build.py:ffibuilder``; run directly
(``python native/archive/build.py``) to build the module in place for
development.  The sources are in three folders: ``writer/`` (deep copy of
code objects into a heap), ``loader/`` (open, relocate, read ahead, give
back) and ``common/`` (what both use: errors, hash, address tables, the
interpreter image and the per-version object layout).  The cdef is read
from ``pycds_native.cdef`` and must match ``pycds_native.h``;
``-Werror=int-conversion`` and ``-Werror=incompatible-pointer-types`` turn
a drift between them into a build error.  The C sources include CPython's
headers (internal ones in ``common/layout.c``), so the module is built
without the limited API.  The version stamped into the module is
``pycds.__version__``, read from ``pycds/_config.py``.
"""

import os
import re
import sys

from cffi import FFI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sanitize import sanitize_args  # noqa: E402  (native/sanitize.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_header  # noqa: E402  (native/archive/format_header.py)

SANITIZE_COMPILE, SANITIZE_LINK = sanitize_args()

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SOURCES = [
    "common/errors.c", "common/hash.c", "common/image.c", "common/io.c",
    "common/layout.c", "common/table.c",
    "writer/writer.c", "writer/file.c",
    "loader/archive.c", "loader/fixpool.c", "loader/relocate.c", "loader/loader.c",
    "loader/prefetch.c", "loader/release.c", "loader/verify.c", "loader/descriptor.c",
    "loader/find.c", "loader/open.c", "loader/serve.c",
]
HEADERS = [
    "pycds_native.h", "common/pycds_internal.h", "common/layout.h",
    "loader/archive.h",
    "common/layout/layout_common.h", "common/layout/layout_310_311.h",
    "common/layout/layout_311_313.h", "common/layout/layout_312_313.h",
    "common/layout/layout_310.h", "common/layout/layout_311.h",
    "common/layout/layout_312.h", "common/layout/layout_313.h",
]


def package_version(root=ROOT):
    """``__version__`` of ``pycds/_config.py`` under root, read as text (the
    package is not importable while it is being built)."""
    with open(os.path.join(root, "pycds", "_config.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M)
    if m is None:
        raise RuntimeError("no __version__ in pycds/_config.py")
    return m.group(1)


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


def _rel(name):
    # Relative to the repository root, where setuptools runs: it places
    # objects under build_temp only for relative paths.
    return os.path.relpath(os.path.join(HERE, name), ROOT)


def _read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


# The format's constants, from pycds/_format.py (not kept in git).
GENERATED = os.path.join(ROOT, "native", "_gen")
FORMAT_HEADER, FORMAT_DIGEST = format_header.write(ROOT, GENERATED)

ffibuilder = FFI()
ffibuilder.cdef(_read("pycds_native.cdef"))
ffibuilder.set_source(
    "pycds._native",
    '#include "pycds_native.h"',
    sources=[_rel(s) for s in SOURCES],
    include_dirs=[_rel("."), _rel("common"), os.path.relpath(GENERATED, ROOT)],
    # setuptools rebuilds when these change (a stale build would keep an
    # old object layout).
    depends=[_rel(h) for h in HEADERS] + [os.path.relpath(FORMAT_HEADER, ROOT)],
    define_macros=[
        ("_CFFI_NO_LIMITED_API", None),
        ("PYCDS_BUILD_VERSION", '"%s"' % package_version()),
    ],
    extra_compile_args=compile_args() + SANITIZE_COMPILE,
    extra_link_args=SANITIZE_LINK,
    libraries=["dl", "pthread"],
    py_limited_api=False,
)

if __name__ == "__main__":
    os.chdir(ROOT)
    ffibuilder.compile(tmpdir=ROOT, verbose=True)
