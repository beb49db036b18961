"""Sanitizer flags for the native builds, from ``PYCDS_SANITIZE``.

``PYCDS_SANITIZE=address,undefined pip install .`` builds both native
modules with ``-fsanitize=address,undefined`` (GCC or Clang): every report
is an error (``-fno-sanitize-recover``), frames are kept for the reports.
``fuzzer`` adds libFuzzer's coverage instrumentation
(``-fsanitize=fuzzer-no-link``, Clang only: ``CC=clang``), for
scripts/fuzz_coverage.py.
The interpreter itself is not instrumented, so such a build runs with the
sanitizer's runtime preloaded (docs/reliability.md):
``LD_PRELOAD=$(cc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0``.
Unset or empty: no flags."""

import os

KNOWN = {"address", "undefined", "fuzzer"}
FLAG = {"fuzzer": "fuzzer-no-link"}      # the module is not the fuzzer's main


def sanitize_args(environ=os.environ):
    """(compile args, link args) for ``$PYCDS_SANITIZE``; ValueError for a
    sanitizer this build does not know."""
    names = [n.strip() for n in environ.get("PYCDS_SANITIZE", "").split(",") if n.strip()]
    unknown = set(names) - KNOWN
    if unknown:
        raise ValueError(f"PYCDS_SANITIZE: unknown sanitizer(s) {sorted(unknown)}; "
                         f"known: {sorted(KNOWN)}")
    if not names:
        return [], []
    flag = "-fsanitize=" + ",".join(FLAG.get(n, n) for n in names)
    compile_args = [flag, "-fno-omit-frame-pointer", "-g", "-O1"]
    if "undefined" in names:
        compile_args.append("-fno-sanitize-recover=undefined")
    return compile_args, [flag]
