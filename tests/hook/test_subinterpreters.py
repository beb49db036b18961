"""Programs that run subinterpreters.

pycds works in the main interpreter only.  On 3.12+ an isolated
subinterpreter refuses single-phase extension modules such as cffi's, and a
DUMP at a subinterpreter's exit used to try to load it there (a warning,
then an abort in CPython 3.12.1); the subinterpreter now imports plainly and
writes nothing.  On 3.10/3.11 (subinterpreters sharing the GIL) it may be
served, but only the main interpreter dumps.
"""

from conftest import run_python

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
