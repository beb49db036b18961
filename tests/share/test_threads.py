"""Threads importing archived modules at the same time, in one process.

Before the fix, cffi released the GIL around the native load while the chunk
description was shared between calls: a second thread could overwrite it,
so a module got another module's chunk ("overlaps another module's") or
even ran another module's code.  That happened in about half of the runs of
this program.
"""

import textwrap
import time

from support import run_python

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

    def test_an_import_made_while_the_archive_opens_is_plain(self, tmp_path):
        """The first archived import opens the archive file again (for the
        native handle): a profile function of the program that imports an
        archived module as that opening runs gets it imported plainly, not
        served from a handle half made, nor waited for.  (The opening is
        the native reader's: no "open" audit event, which plain import
        would not raise, for an audit hook to import on.)"""
        prog = textwrap.dedent("""\
            import sys
            fired = []
            def profile(frame, event, arg):
                if event == "call" and frame.f_code.co_name == "descriptor" \\
                        and "pycds" in frame.f_code.co_filename and not fired:
                    fired.append(1)
                    import email.utils
            sys.setprofile(profile)
            import json
            sys.setprofile(None)
            import email.utils
            print(bool(fired), email.utils.quote('a"b'), json.dumps([1]))
            """)
        (tmp_path / "prog.py").write_text(prog)
        img = str(tmp_path / "a.img")
        run_python(["-c", "import json, email.utils"], cwd=tmp_path, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, timeout=30)
        assert (r.rc, r.out) == (0, 'True a\\"b [1]\n') and not r.warnings(), r
        assert "[pycds] fallback email.utils: imported while the archive opens" \
            in r.fallbacks(), r
        assert "json" in r.served() and "email.utils" not in r.served(), r

    def test_an_import_waiting_on_the_native_load_does_not_hang(self, tmp_path):
        """The program's first import opens the archive and loads the native
        module, which imports _cffi_backend: an audit hook of the program
        importing there waits for the module lock of another thread's import
        of that module, which waits for the opening: both would hang for
        good.  That thread waits at most OPEN_WAIT_S, then imports
        plainly."""
        prog = textwrap.dedent("""\
            import sys, _thread, time, os
            go = _thread.allocate_lock(); go.acquire()
            done = _thread.allocate_lock(); done.acquire()
            fired = []
            def hook(event, args):
                if event == "import" and args[0] == "_cffi_backend" and not fired:
                    fired.append(1)
                    go.release(); time.sleep(0.3)
                    import email.utils
            sys.addaudithook(hook)
            def other():
                go.acquire()
                import email.utils
                done.release()
            _thread.start_new_thread(other, ())
            if os.environ.get("PYCDSMODE") != "SHARE":
                import _cffi_backend
            import json
            done.acquire()
            print("done", bool(fired))
            """)
        (tmp_path / "prog.py").write_text(prog)
        img = str(tmp_path / "a.img")
        run_python(["-c", "import json, email.utils"], cwd=tmp_path, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
        plain = run_python(["prog.py"], cwd=tmp_path)
        assert plain.out == "done True\n", plain
        t0 = time.monotonic()
        r = run_python(["prog.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, timeout=30)
        assert r.out == plain.out and r.rc == 0 and not r.warnings(), r
        assert "email.utils" not in r.served(), r
        assert time.monotonic() - t0 < 10, r
