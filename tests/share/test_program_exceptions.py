"""What the program raises while pycds's code runs inside an import
propagates as under plain import (pycds.errors.program_raised)."""

import textwrap

import pytest

from support import run_python


class TestProgramExceptions:
    """What the program raises while pycds's code runs inside an import (a
    signal handler, a trace function, its stack depth) propagates as out of
    plain import's code, and the archive stays in use: it is no fault of
    the archive (pycds.errors.program_raised)."""

    MODULES = ["json", "email.message", "argparse", "decimal", "csv", "string",
               "textwrap", "calendar", "fractions", "difflib", "pprint", "shlex"]

    def _dump(self, tmp_path):
        img = str(tmp_path / "a.img")
        d = run_python(["-c", "import " + ", ".join(self.MODULES)], cwd=tmp_path,
                       PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0, d
        return img

    REPORT = textwrap.dedent("""
        import pycds.share as f
        print("disabled", f._installed.archive.disabled, "served", f.stats()["served"])
    """)

    # The native hit path declining every name, so that the index is read
    # and the files stat'ed in Python (pycds._archive, pycds._pyc), as for
    # an entry the native lookup does not take.  Set after a first import,
    # which opens the archive.
    DECLINE = textwrap.dedent("""
        import inspect, pycds.share
        class Declining:
            serving = False
            def hit(self, *args):
                return False
            def find(self, *args):
                return False
        pycds.share._installed.archive.fast = Declining()
    """)

    def _import_under_tracer(self, tmp_path, tracer, exc):
        """SHARE run of: ``tracer`` (source defining ``tracer``, which
        raises ``exc`` somewhere in pycds's code) set, ``import json``,
        then a plain-again ``import csv``; asserts the program caught
        ``exc`` and the archive stayed in use.  Returns the run."""
        img = self._dump(tmp_path)
        prog = self.DECLINE + textwrap.dedent(tracer) + textwrap.dedent(f"""
            sys.settrace(tracer)
            try:
                import json
            except {exc} as e:
                print("raised", e)
            sys.settrace(None)
            import csv
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.rc == 0 and r.warnings() == [], r
        lines = r.out.splitlines()
        assert lines[0] == "raised from the trace function", r
        disabled, served = lines[-1].split()[1::2]
        assert disabled == "False" and int(served) >= 1, r
        return r

    def test_trace_function_exception_propagates(self, tmp_path):
        self._import_under_tracer(tmp_path, """
            import sys
            class Stop(Exception):
                pass
            def tracer(frame, event, arg):
                if event == "call" and frame.f_code.co_name == "lookup" \\
                        and frame.f_code.co_filename.endswith("_archive.py"):
                    raise Stop("from the trace function")
                return None
        """, "Stop")

    def test_os_error_of_the_program_inside_a_stat_propagates(self, tmp_path):
        # A TimeoutError (an OSError) raised where pycds stats a source, as a
        # signal handler's would be out of the interrupted os.stat: not
        # "source is gone", the program's.
        r = self._import_under_tracer(tmp_path, """
            import inspect, sys
            import pycds._pyc
            src, first = inspect.getsourcelines(pycds._pyc.stat_or_none)
            at = first + next(i for i, line in enumerate(src)
                              if "return _stat(path)" in line)
            armed = [True]
            def tracer(frame, event, arg):
                if frame.f_code.co_name == "stat_or_none" \\
                        and str(frame.f_locals.get("path")).endswith(".py"):
                    return local
                return None
            def local(frame, event, arg):
                if event == "line" and frame.f_lineno == at and armed[0]:
                    armed[0] = False
                    raise TimeoutError("from the trace function")
                return local
        """, "TimeoutError")
        assert not any("source is gone" in f for f in r.fallbacks()), r

    def test_a_replaced_os_stat_is_not_called(self, tmp_path):
        # importlib calls posix.stat as bound at start-up; so does pycds: a
        # program's replacement of os.stat (mock.patch) that refuses real
        # paths changes no import, served or plain.
        img = self._dump(tmp_path)
        prog = textwrap.dedent("""
            import os
            from unittest import mock
            def fake(path, *a, **k):
                raise FileNotFoundError(2, "fake file system", str(path))
            with mock.patch("os.stat", side_effect=fake):
                import json, csv
            print(json.dumps([csv.QUOTE_ALL]))
        """)
        plain = run_python(["-c", prog], cwd=tmp_path)
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n"), (plain, r)
        assert "json" in r.served() and r.warnings() == [], r

    def test_recursion_error_keeps_the_archive(self, tmp_path):
        img = self._dump(tmp_path)
        prog = textwrap.dedent("""
            import sys
            def dive(n):
                if n:
                    return dive(n - 1)
                try:
                    import json
                    return True
                except RecursionError:
                    return False
            d = sys.getrecursionlimit() - 20
            hit = 0
            while not dive(d):
                hit += 1
                d -= 5
            print("recursion errors", hit)
            import email.message, argparse, decimal
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.warnings() == [], r
        assert int(r.out.split()[2]) >= 1, r      # the import did hit the limit
        disabled, served = r.out.splitlines()[-1].split()[1::2]
        assert disabled == "False" and int(served) >= 4, r

    @pytest.mark.parametrize("exc", ["ImportError", "RuntimeError"])
    def test_program_refusing_the_native_module(self, tmp_path, exc):
        # A sandbox's audit hook refuses imports the program never makes
        # itself, such as the native module's _cffi_backend: that is a
        # reason not to use the archive (one warning), not an error of the
        # program's import of json.  (A meta path finder of the program is
        # not asked for it: pycds's dependency comes from where pycds was
        # found at start-up, test_the_programs_own_cffi_backend_is_its_own.)
        img = self._dump(tmp_path)
        prog = textwrap.dedent(f"""
            import sys
            def sandbox(event, args):
                if event == "import" and args[0] == "_cffi_backend":
                    raise {exc}("blocked by the sandbox")
            sys.addaudithook(sandbox)
            import json
            print(json.dumps([1]))
        """)
        plain = run_python(["-c", prog], cwd=tmp_path)
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n"), (plain, r)
        assert len(r.warnings()) == 1 and "blocked by the sandbox" in r.warnings()[0], r

    def test_signal_handler_exception_propagates(self, tmp_path):
        img = self._dump(tmp_path)
        prog = textwrap.dedent(f"""
            import importlib, signal, sys
            class Timeout(Exception):
                pass
            def on_alarm(sig, frame):
                raise Timeout()
            signal.signal(signal.SIGALRM, on_alarm)
            names = {self.MODULES!r}
            timeouts = 0
            for i in range(200):
                name = names[i % len(names)]
                sys.modules.pop(name, None)
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0.00002 * (1 + i % 40))
                    try:
                        importlib.import_module(name)
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                except Exception as e:
                    # the module body's own code may wrap it, as plain
                    # Python does: 3.12's enum turns an exception inside
                    # __set_name__ into a TypeError whose context is it
                    cause = e
                    while cause is not None and not isinstance(cause, Timeout):
                        cause = cause.__context__
                    if cause is None:
                        raise
                    timeouts += 1
            print("timeouts", timeouts)
        """) + self.REPORT
        r = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.warnings() == [], r
        assert int(r.out.split()[1]) >= 1, r
        disabled, _ = r.out.splitlines()[-1].split()[1::2]
        assert disabled == "False", r
