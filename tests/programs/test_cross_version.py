"""An archive made by one CPython minor version, given to another: refused
with one clear warning, the program runs as plain Python (acceptance case
020-archive-other-python, for every ordered pair of supported versions).

The interpreters come from ``PYCDS_TEST_PYTHONS`` (paths separated by
os.pathsep, each with pycds installed) plus the one running the tests.  A
pair whose interpreter is missing is skipped with the reason shown, unless
``PYCDS_REQUIRE_ALL_PYTHONS=1`` (set by CI), which makes it a failure.
"""

import functools
import itertools
import os
import subprocess
import sys
import tempfile

import pytest

from support import clean_env, run_python

SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
PROBE = ("import _imp, sys, pycds._nativeapi; "
         "print('%d.%d' % sys.version_info[:2]); "
         "print(_imp.source_hash(1, b'pycds').hex()); print(sys.version)")


@functools.lru_cache(maxsize=None)
def interpreters():
    """{"3.X": (path, sys.version, keyed hash)} for every interpreter given,
    probed by running it; raises RuntimeError if one cannot import pycds.
    The keyed hash is _imp.source_hash's, which the archive header uses."""
    paths = [p for p in os.environ.get("PYCDS_TEST_PYTHONS", "").split(os.pathsep) if p]
    found = {}
    for path in [sys.executable] + paths:
        # Not from the checkout: -c puts the cwd first on sys.path.
        proc = subprocess.run([path, "-c", PROBE], env=clean_env(),
                              cwd=tempfile.gettempdir(), capture_output=True,
                              text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"PYCDS_TEST_PYTHONS: {path} cannot import "
                               f"pycds: {proc.stderr.strip()[-500:]}")
        minor, keyed_hash, version = proc.stdout.split("\n", 2)
        found.setdefault(minor, (path, version.strip(), keyed_hash))
    return found


def interpreter(minor):
    """(path, sys.version, keyed hash) of the interpreter for ``minor``, or
    skip/fail."""
    have = interpreters()
    if minor in have:
        return have[minor]
    why = (f"no Python {minor} with pycds installed: add its path to "
           f"PYCDS_TEST_PYTHONS (have {sorted(have)})")
    if os.environ.get("PYCDS_REQUIRE_ALL_PYTHONS") == "1":
        pytest.fail(why + "; PYCDS_REQUIRE_ALL_PYTHONS=1")
    pytest.skip(why)


@pytest.mark.parametrize("dumper,sharer",
                         list(itertools.permutations(SUPPORTED, 2)),
                         ids=lambda v: v)
def test_archive_from_another_version_is_refused(dumper, sharer, workspace,
                                                 tmp_path):
    dump_py, dump_version, dump_hash = interpreter(dumper)
    share_py, share_version, share_hash = interpreter(sharer)
    img = str(tmp_path / "app.img")

    dump = run_python(["app_shop.py"], cwd=workspace, python=dump_py,
                      PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert dump.warnings() == [], dump
    assert os.path.getsize(img) > 0

    plain = run_python(["app_shop.py"], cwd=workspace, python=share_py)
    share = run_python(["app_shop.py"], cwd=workspace, python=share_py,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert (share.rc, share.out) == (plain.rc, plain.out), share
    assert share.served() == [], share
    warnings = share.warnings()
    assert len(warnings) == 1, share
    assert f"made by Python {dumper}, this is Python {sharer}" in warnings[0], warnings
    # `info` names the version too (across 3.10/3.11 the header's checksum
    # cannot even be verified: another SipHash), never "checksum mismatch".
    info = run_python(["-m", "pycds", "info", img], python=share_py, cwd=tmp_path)
    text = info.out + info.err
    assert f"interpreter:  {dumper}." in text or f"made by Python {dumper}," in text, info
    assert "mismatch" not in info.out + info.err, info
