"""Issue 3, part 6 (fast form): CPython's own test_json, test_code and
test_dis with every module they import served from a pycds archive give the
same per-test results as a plain run.  The 16-module selection is
scripts/cpython_regrtest.py (results in docs/reliability.md).

Marked ``slow`` for information only: it is not deselected by default
(about 10 s here)."""

import os
import sys

import pytest

from support import load_script

cpython_regrtest = load_script("cpython_regrtest")


@pytest.mark.slow
def test_fast_selection_same_as_plain(tmp_path):
    import importlib.util
    assert importlib.util.find_spec("test.support"), "this Python has no Lib/test"
    missing = [t for t in cpython_regrtest.FAST if importlib.util.find_spec(f"test.{t}") is None]
    if missing:
        # Debian's python3 has test.support and libregrtest, and its tests
        # apart: scripts/aarch64_check.sh installs them in its chroot.
        v = "%d.%d" % sys.version_info[:2]
        pytest.skip(f"this Python's Lib/test lacks {', '.join(missing)} "
                    f"(Debian: apt-get install libpython{v}-testsuite)")
    res = cpython_regrtest.compare(sys.executable, cpython_regrtest.FAST,
                                   str(tmp_path), jobs=2, timeout=600,
                                   log=lambda *a: None)
    assert res["plain"]["rc"] == 0, res["plain"]["tail"]
    assert len(res["plain"]["cases"]) > 250
    assert res["diffs"] == []
    assert res["share"]["rc"] == res["plain"]["rc"], res["share"]["tail"]
    assert res["served"] > 50 and res["warnings"] == []
    assert os.path.getsize(tmp_path / "regrtest.img") > 1 << 20
