"""pycds's API functions stay what they are whatever its modes import: a
sub-package bound on the package under the name of a function (pycds.dump)
would replace it."""

import pytest

from support import run_python

CHECK = ("import pycds; print(*(callable(getattr(pycds, n)) "
         "for n in ('dump', '_dump', 'stats', 'start')))")


def test_two_dumps_in_a_row(tmp_path):
    img = str(tmp_path / "a.img")
    r = run_python(["-c", f"import pycds, json; pycds.dump({img!r}); pycds.dump({img!r}); "
                    + CHECK.split("; ", 1)[1]], cwd=tmp_path)
    assert r.rc == 0 and r.out == "True True True True\n", r


@pytest.mark.parametrize("mode", ["DUMP", "TRACE", "AUTO", "SHARE"])
def test_after_each_mode_started(tmp_path, mode):
    r = run_python(["-c", "import json; " + CHECK], cwd=tmp_path, PYCDSMODE=mode,
                   PYCDSARCHIVE=str(tmp_path / "a.img"), PYCDSLIST=str(tmp_path / "a.lst"))
    assert r.rc == 0 and r.out == "True True True True\n", r
