"""Programs that run subinterpreters.

pycds works in the main interpreter only.  On 3.12+ an isolated
subinterpreter refuses single-phase extension modules such as cffi's, and a
DUMP at a subinterpreter's exit used to try to load it there (a warning,
then an abort in CPython 3.12.1); the subinterpreter now imports plainly and
writes nothing.  On 3.10/3.11 (subinterpreters sharing the GIL) it may be
served, but only the main interpreter dumps.
"""

import sys

import pytest

from support import run_python

PROGRAM = r"""
import os
try:
    import _interpreters as interpreters          # 3.13
except ImportError:
    import _xxsubinterpreters as interpreters     # 3.10 - 3.12
r, w = os.pipe()
iid = interpreters.create()
interpreters.run_string(iid, "import json, email.parser, os; "
                        f"os.write({w}, (json.dumps([1, 2]) + '\\n').encode())")
interpreters.destroy(iid)
os.close(w)
print("sub", os.read(r, 100).decode().strip())
import json
print(json.dumps({"a": 1}))
"""


class TestSubinterpreters:
    def test_dump_and_share_with_a_subinterpreter(self, tmp_path):
        (tmp_path / "prog.py").write_text(PROGRAM)
        img = str(tmp_path / "a.img")
        plain = run_python(["prog.py"], cwd=tmp_path)
        assert plain.rc == 0 and plain.out == 'sub [1, 2]\n{"a": 1}\n', plain
        dump = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert dump.warnings() == [], dump
        share = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert share.warnings() == [], share
        assert "json" in share.served()

    @pytest.mark.skipif(sys.version_info >= (3, 12),
                        reason="served in the main interpreter only (and CPython 3.12.1 "
                               "aborts on a second subinterpreter importing these)")
    def test_a_quiet_share_run_serves_a_subinterpreter_without_hanging(self, tmp_path):
        # Not verbose, the finder's find_spec is the C server's
        # (native/archive/loader/serve.c), called with the subinterpreter's
        # thread state current: a PyGILState_Ensure there takes the main
        # interpreter's thread state of this thread and waits for the GIL
        # this thread holds (3.10/3.11).  Twice, one after the other: the
        # second subinterpreter makes the serving types again.
        (tmp_path / "prog.py").write_text(PROGRAM.replace(
            "interpreters.destroy(iid)\n",
            "interpreters.destroy(iid)\niid = interpreters.create()\n"
            "interpreters.run_string(iid, 'import json, email.parser')\n"
            "interpreters.destroy(iid)\n"))
        img = str(tmp_path / "a.img")
        plain = run_python(["prog.py"], cwd=tmp_path)
        assert plain.rc == 0 and plain.out == 'sub [1, 2]\n{"a": 1}\n', plain
        dump = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        share = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                           timeout=60)
        assert (share.rc, share.out, share.warnings()) == (plain.rc, plain.out, []), share

    def test_a_subinterpreter_s_served_modules_are_not_the_main_s(self, tmp_path):
        # stats() counts this interpreter's modules (pycds.share's counters
        # are each interpreter's): the C server's counters too.
        (tmp_path / "prog.py").write_text(PROGRAM.replace(
            "import json\n",
            "import pycds\nprint('main', pycds.stats()['served'])\nimport json\n"))
        img = str(tmp_path / "a.img")
        dump = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert dump.rc == 0 and "main 0\n" in dump.out, dump
        runs = [run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                           timeout=60, **env) for env in ({}, {"PYCDSVERBOSE": "1"})]
        quiet, verbose = runs
        assert verbose.rc == 0 and "main 0\n" in verbose.out, verbose
        assert (quiet.rc, quiet.out) == (verbose.rc, verbose.out), quiet
