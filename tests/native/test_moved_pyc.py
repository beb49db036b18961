"""Modules whose .pyc was compiled at another path (a venv copied or moved,
an image built in one directory and run in another): importlib sets their
co_filename to the source's path (_imp._fix_co_filename), a str of its own
that is not interned.  Copying such code must neither fail nor change the
program's objects."""

import os
import sys
import textwrap

import _imp
import py_compile

from support import run_python, settle
from pycds import _nativewriter as N

# unused() is copied first with fresh bytecode, the rest after they ran.
SOURCE = textwrap.dedent("""\
    import os

    def unused():
        return os.sep

    class Box:
        def __init__(self, v):
            self.v = v

        def double(self):
            return Box(self.v * 2)

    def f(n):
        return sum(Box(i).double().v for i in range(n))

    WHERE = f.__code__.co_filename
    """)


def test_code_run_from_a_moved_pyc_is_copied_as_it_is(tmp_path):
    code = compile(SOURCE, "/built/elsewhere/m.py", "exec")
    # A path of its own, as importlib's: not interned.
    origin = "".join([str(tmp_path), "/", "m.py"])
    _imp._fix_co_filename(code, origin)
    ns = {"__name__": "m"}
    exec(code, ns)
    for _ in range(100):       # specialised and counted: not fresh bytecode
        ns["f"](10)
    interned_before = sys._is_interned(code.co_filename) if hasattr(sys, "_is_interned") \
        else None
    chunk = N.Writer(7).add(code, ran=True)
    assert chunk.chunk_len > 0
    if interned_before is not None:
        # The copy changed nothing of the program's: its str is as it was.
        assert sys._is_interned(code.co_filename) == interned_before


def test_a_moved_pyc_is_archived_and_served(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "m.py").write_text(SOURCE)
    # The .pyc as a build in another directory wrote it (dfile: its
    # co_filename), dated as an installed file.
    then = os.stat(app / "m.py").st_mtime - 3600
    os.utime(app / "m.py", (then, then))
    pyc = py_compile.compile(str(app / "m.py"), dfile="/built/elsewhere/m.py", doraise=True)
    os.utime(pyc, (then, then))
    settle(app)
    prog = "import m; print(m.f(10), m.WHERE == m.__file__, m.Box.double.__code__.co_filename)"
    img = str(tmp_path / "a.img")
    plain = run_python(["-c", prog], cwd=app)
    dump = run_python(["-c", prog], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                      PYCDSVERBOSE=2)
    share = run_python(["-c", prog], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
    assert plain.rc == 0 and plain.out == f"90 True {app / 'm.py'}\n", plain
    assert dump.out == plain.out and "not archived m:" not in dump.err, dump
    assert share.out == plain.out and "m" in share.served(), share
