"""Threads importing archived modules at the same time, in one process.

Before the fix, cffi released the GIL around the native load while the chunk
description was shared between calls: a second thread could overwrite it,
so a module got another module's chunk ("overlaps another module's") or
even ran another module's code.  That happened in about half of the runs of
this program.
"""

from conftest import run_python

RACE = r"""
import importlib, threading
barrier = threading.Barrier(4)
def work(names):
    barrier.wait()
    for n in names:
        importlib.import_module(n)
threads = [threading.Thread(target=work, args=([f"m{i}" for i in range(k, 80, 4)],))
           for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
import sys
wrong = [(i, sys.modules[f"m{i}"].X) for i in range(80) if sys.modules[f"m{i}"].X != i]
print("wrong", wrong)
"""


class TestThreads:
    def test_concurrent_imports_are_served_correctly(self, tmp_path):
        for i in range(80):
            (tmp_path / f"m{i}.py").write_text(
                f"X = {i}\n" + "".join(f"def f{j}(a):\n    return a + {j}\n" for j in range(30)))
        (tmp_path / "race.py").write_text(RACE)
        img = str(tmp_path / "r.img")
        d = run_python(["race.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.out == "wrong []\n", d
        for _ in range(12):
            r = run_python(["race.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE=1)
            assert r.out == "wrong []\n" and r.rc == 0, r
            assert r.warnings() == [] and r.fallbacks() == [], r.err[-1500:]
            assert {f"m{i}" for i in range(80)} <= set(r.served())

    def test_spec_and_loader_copy_and_pickle(self, tmp_path):
        (tmp_path / "m.py").write_text("X = 1\n")
        img = str(tmp_path / "a.img")
        code = ("import copy, pickle, m; s = copy.deepcopy(m.__spec__); "
                "l = pickle.loads(pickle.dumps(m.__loader__)); "
                "print(s.name, s.origin == m.__file__, type(l).__name__, "
                "l.get_source('m') == open(m.__file__).read())")
        run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python(["-c", code], cwd=tmp_path)
        r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out == plain.out == "m True SourceFileLoader True\n", (plain, r)
        assert "m" in r.served()
