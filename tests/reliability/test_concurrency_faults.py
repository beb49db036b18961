"""Issue 3, part 5: concurrency, faults, process models and interpreter flags.

Concurrent SHARE runs; DUMP runs replacing an archive while others read it;
SIGKILLed dumps; a full disk (RLIMIT_FSIZE and a small tmpfs); a read-only
directory; fork, multiprocessing (spawn, forkserver), subprocesses; and the
command-line flags that change what an archive may hold.
"""

import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from support import Run, clean_env, run_python, without_dac_bypass

REAL = textwrap.dedent("""
    import json, email.parser, http.client, numpy, decimal, argparse
    msg = email.parser.Parser().parsestr("Subject: hi\\n\\nbody")
    print(json.dumps({"s": msg["Subject"], "n": int(numpy.arange(5).sum())}))
    print(http.client.responses[404], decimal.Decimal("1.10") + 1)
    print(argparse.ArgumentParser(prog="p").format_usage().strip())
    """)


def popen(args, cwd, **env):
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=clean_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    return Run(subprocess.CompletedProcess(p.args, p.returncode, out, err))


def leftovers(d, keep=()):
    """Files in d other than keep: temporary archives left behind."""
    return sorted(n for n in os.listdir(d) if n not in keep)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The real program, its plain run and its archive."""
    d = tmp_path_factory.mktemp("real")
    (d / "real.py").write_text(REAL)
    img = str(d / "real.img")
    plain = run_python(["real.py"], cwd=d)
    assert plain.rc == 0 and "Not Found" in plain.out, plain
    r = run_python(["real.py"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert os.path.exists(img) and (r.rc, r.out) == (0, plain.out), r
    return d, img, plain


class TestConcurrentRuns:
    def test_16_concurrent_share_runs(self, real):
        d, img, plain = real
        procs = [popen(["real.py"], d, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1) for _ in range(16)]
        runs = [finish(p) for p in procs]
        for r in runs:
            assert (r.rc, r.out) == (0, plain.out) and not r.warnings(), r
            assert {"json", "email.parser", "http.client", "numpy"} <= set(r.served())

    def test_dumps_replacing_the_archive_while_others_read(self, real, tmp_path):
        """4 DUMP runs write the same path again and again while SHARE runs
        read it: a reader gets the old or the new archive, complete (no
        checksum or length warning), and no temporary file stays."""
        d, img, plain = real
        adir = tmp_path / "shared"
        adir.mkdir()
        target = str(adir / "app.img")
        shutil.copy(img, target)
        deadline = time.monotonic() + 12
        writers, readers, done = [], [], []
        while time.monotonic() < deadline and len(done) < 40:
            writers = [w for w in writers if w.poll() is None]
            while len(writers) < 2:
                writers.append(popen(["real.py"], d, PYCDSMODE="DUMP", PYCDSARCHIVE=target))
            readers.append(popen(["real.py"], d, PYCDSMODE="SHARE", PYCDSARCHIVE=target,
                                 PYCDSVERBOSE=1))
            if len(readers) >= 3:
                done.append(finish(readers.pop(0)))
        done += [finish(p) for p in readers]
        for w in writers:
            finish(w)
        assert len(done) >= 10
        for r in done:
            assert (r.rc, r.out) == (0, plain.out), r
            assert not r.warnings(), r
            assert "numpy" in r.served(), r
        assert leftovers(adir, keep=("app.img",)) == []


class TestKilledAndFailedDumps:
    def test_sigkill_during_dump_leaves_nothing(self, real, tmp_path):
        """Kill DUMP runs at many moments of the exit-time write (the
        program ends when its stdin closes; the write takes ~0.1 s).
        O_TMPFILE: a writer killed before the link leaves nothing; the
        named link lives for microseconds before the rename, and a later
        dump sweeps one of a dead writer."""
        d, _, _ = real
        (d / "wait.py").write_text(REAL + "import sys; sys.stdin.read()\n")
        adir = tmp_path / "k"
        adir.mkdir()
        target = str(adir / "app.img")
        kinds = set()
        for i, delay in enumerate([0.0, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.2, 0.3]):
            p = subprocess.Popen([sys.executable, "wait.py"], cwd=d, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=target,
                                               PYTHONUNBUFFERED=1))
            while not p.stdout.readline().startswith(b"Not Found"):
                pass
            before = os.path.exists(target) and os.stat(target).st_ino
            p.stdin.close()               # the program exits: the dump starts
            time.sleep(delay)
            p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()
            after = os.path.exists(target) and os.stat(target).st_ino
            kinds.add("written" if after != before else "killed before rename")
            left = leftovers(adir, keep=("app.img",))
            if left:
                # Killed in the microseconds between the link and the
                # rename: the named temporary of a dead writer, which the
                # next dump sweeps.
                from pycds import _files as _writer
                assert left == [n for n in left
                                if n.startswith(f".app.img{_writer._TMP_MARK}{p.pid}.")], left
                _writer.sweep_stale(str(adir), "app.img")
                kinds.add("killed between link and rename")
            assert leftovers(adir, keep=("app.img",)) == [], (delay, os.listdir(adir))
            if os.path.exists(target):
                r = run_python(["real.py"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=target)
                assert not r.warnings(), r
        assert "killed before rename" in kinds, kinds

    def test_stale_named_temporary_is_swept(self, real, tmp_path):
        d, _, _ = real
        adir = tmp_path / "s"
        adir.mkdir()
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
        stale = adir / f".app.img.pycds-tmp.{dead}.123"
        stale.write_bytes(b"half an archive")
        r = run_python(["real.py"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=str(adir / "app.img"))
        assert r.rc == 0 and not r.warnings(), r
        assert leftovers(adir) == ["app.img"]

    @pytest.mark.parametrize("limit", [0, 4096, 1 << 20])
    def test_file_size_limit(self, real, tmp_path, limit):
        """RLIMIT_FSIZE: CPython ignores SIGXFSZ, so the write fails with
        EFBIG: same output and exit code, one warning, nothing left, and
        the previous archive untouched."""
        d, img, plain = real
        adir = tmp_path / "f"
        adir.mkdir()
        target = adir / "app.img"
        shutil.copy(img, target)
        old = target.read_bytes()

        def limit_fsize():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        proc = subprocess.run([sys.executable, "real.py"], cwd=d, capture_output=True,
                              text=True, preexec_fn=limit_fsize, timeout=120,
                              env=clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=str(target)))
        r = Run(proc)
        assert (r.rc, r.out) == (0, plain.out), r
        assert len(r.warnings()) == 1 and "no archive was written" in r.warnings()[0], r
        assert "File too large" in r.warnings()[0], r
        assert target.read_bytes() == old
        assert leftovers(adir, keep=("app.img",)) == []

    def test_full_tmpfs(self, real, tmp_path):
        """A 1 MiB tmpfs (ENOSPC), if this machine lets us mount one."""
        d, _, plain = real
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if m.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
        try:
            r = run_python(["real.py"], cwd=d, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=str(mnt / "app.img"))
            assert (r.rc, r.out) == (0, plain.out), r
            assert len(r.warnings()) == 1, r
            assert "No space left on device" in r.warnings()[0], r
            assert os.listdir(mnt) == []
        finally:
            subprocess.run(["umount", str(mnt)], check=True)

    def test_read_only_directory(self, real, tmp_path):
        """A 0555 directory, written by an interpreter that cannot bypass
        permissions (setpriv drops root's CAP_DAC_OVERRIDE; see
        test_bad_archives.TestPermissions.test_unreadable)."""
        d, _, plain = real
        ro = tmp_path / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        cmd = without_dac_bypass([sys.executable, "real.py"])
        proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=120,
                              env=clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=str(ro / "a.img")))
        r = Run(proc)
        assert (r.rc, r.out) == (0, plain.out), r
        assert len(r.warnings()) == 1 and "no archive was written" in r.warnings()[0], r
        assert "Permission denied" in r.warnings()[0]
        assert os.listdir(ro) == []


PROCS = textwrap.dedent("""
    import os, sys, json
    import multiprocessing as mp

    def work(x):
        import fractions, statistics      # imported in the child only
        return str(fractions.Fraction(x, 3) + statistics.mean([1, 2]))

    def put(q, x):
        q.put(work(x))

    if __name__ == "__main__":
        method = sys.argv[1]
        if method == "fork":
            pid = os.fork()
            if pid == 0:
                import textwrap, fractions
                print("child", textwrap.shorten("a b c d e f g", 8), fractions.Fraction(1, 3),
                      flush=True)
                os._exit(0)
            os.waitpid(pid, 0)
            import textwrap, fractions     # so that the DUMP run archives them
            print("parent", json.dumps([1]))
        elif method == "subprocess":
            import subprocess
            out = subprocess.run([sys.executable, "-c",
                                  "import fractions, os; print(fractions.Fraction(2, 6),"
                                  " os.environ.get('PYCDSMODE'))"],
                                 capture_output=True, text=True)
            print("sub", out.stdout.strip(), out.stderr.count("[pycds] served"))
        elif method.endswith("-process"):
            # Processes that end normally (Pool workers are terminated).
            ctx = mp.get_context(method.split("-")[0])
            q = ctx.Queue()
            ps = [ctx.Process(target=put, args=(q, i)) for i in (1, 2)]
            for p in ps:
                p.start()
            got = sorted(q.get() for p in ps)
            for p in ps:
                p.join()
            print(method, got, [p.exitcode for p in ps])
        else:
            with mp.get_context(method).Pool(2) as pool:
                print(method, pool.map(work, [1, 2, 3]))
            if "parent-too" in sys.argv:
                import fractions, statistics
    """)


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    d = tmp_path_factory.mktemp("procs")
    (d / "procs.py").write_text(PROCS)
    return d


class TestDumpEdges:
    """What a program may do that a DUMP at its exit must survive without
    changing what the program did."""

    def test_directories_made_under_umask_000_are_not_writable_by_others(self, tmp_path):
        """DUMP makes the archive's missing directories; under umask 000
        (a container's default, say) they were 0777 and the SHARE run
        refused the archive it had just written ("writable by others")."""
        img = tmp_path / "a" / "b" / "app.img"
        proc = subprocess.run(
            [sys.executable, "-c", "import os; os.umask(0); import subprocess, sys; "
             "sys.exit(subprocess.call([sys.executable, '-c', 'import json']))"],
            env=clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=str(img)), cwd=tmp_path,
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and img.exists(), proc
        assert "writable by others" not in proc.stderr, proc.stderr
        for d in (tmp_path / "a", tmp_path / "a" / "b"):
            assert os.stat(d).st_mode & 0o777 == 0o755, (d, oct(os.stat(d).st_mode))
        r = run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
        assert "json" in r.served() and not r.warnings(), r

    def test_the_program_locks_the_archive_directory(self, tmp_path):
        """flock on the directory by the program (or by `flock DIR cmd`
        around it): the dump gives up after its wait with one warning
        instead of waiting for good (pycds._files.LOCK_WAIT_S, shortened)."""
        prog = textwrap.dedent("""\
            import fcntl, json, os
            import pycds._files
            pycds._files.LOCK_WAIT_S = 0.3
            fd = os.open(".", os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("done")
            """)
        (tmp_path / "lock.py").write_text(prog)
        img = tmp_path / "a.img"
        r = run_python(["lock.py"], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=str(img), timeout=60)
        assert (r.rc, r.out) == (0, "done\n"), r
        assert len(r.warnings()) == 1 and "stayed locked" in r.warnings()[0], r
        assert not img.exists()

    @pytest.mark.parametrize("state", ["raising path hook", "no site-packages",
                                       "refusing finder"])
    def test_the_import_system_the_program_leaves_does_not_stop_the_dump(
            self, tmp_path, state):
        """The dump at exit needs the native module (with _cffi_backend,
        found on sys.path): imported at the start of the run
        (pycds.dumping.dumper.preload), not through what the program did to the import
        system by its end."""
        prog = textwrap.dedent("""\
            import sys, json
            from importlib.machinery import PathFinder
            if sys.argv[1] == "raising path hook":
                def hook(path):
                    if path == "special":
                        raise RuntimeError("hook exploded")
                    raise ImportError
                sys.path_hooks.insert(0, hook)
                sys.path.insert(0, "special")
                sys.path_importer_cache.clear()
            elif sys.argv[1] == "no site-packages":
                sys.path[:] = [p for p in sys.path if "-packages" not in p]
            else:
                class Refuse:
                    @staticmethod
                    def find_spec(name, path=None, target=None):
                        raise ImportError("no more imports")
                sys.meta_path.insert(0, Refuse)
            print("done")
            """)
        (tmp_path / "prog.py").write_text(prog)
        img = tmp_path / "a.img"
        r = run_python(["prog.py", state], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=str(img))
        assert (r.rc, r.out, r.warnings()) == (0, "done\n", []), r
        s = run_python(["-c", "import json; print('ok')"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
        assert "json" in s.served(), s

    @pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling symlink"])
    def test_no_archive_over_what_is_not_a_regular_file(self, tmp_path, kind):
        target = tmp_path / "a.img"
        other = tmp_path / "other.bin"
        if kind == "fifo":
            os.mkfifo(target)
        else:
            if kind == "symlink":
                other.write_bytes(b"kept")
            os.symlink(other, target)
        for mode, var in (("DUMP", "PYCDSARCHIVE"), ("TRACE", "PYCDSLIST")):
            r = run_python(["-c", "import json; print('ok')"], cwd=tmp_path,
                           PYCDSMODE=mode, **{var: str(target)})
            assert (r.rc, r.out) == (0, "ok\n"), r
            assert len(r.warnings()) == 1 and "not a regular file" in r.warnings()[0], r
            assert os.path.islink(target) or kind == "fifo"
            if kind == "fifo":
                import stat
                assert stat.S_ISFIFO(os.lstat(target).st_mode)
            elif kind == "symlink":
                assert other.read_bytes() == b"kept"
            else:
                assert not other.exists()

    def test_a_path_ending_in_a_separator_names_a_directory(self, tmp_path):
        img = tmp_path / "a.img"
        run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
        for mode in ("SHARE", "DUMP"):
            r = run_python(["-c", "import json; print('ok')"], cwd=tmp_path, PYCDSMODE=mode,
                           PYCDSARCHIVE=str(img) + "/", PYCDSVERBOSE=1)
            assert (r.rc, r.out) == (0, "ok\n") and len(r.warnings()) == 1, r
            assert not r.served(), r
        assert sorted(os.listdir(tmp_path)) == ["a.img"]

    def test_a_file_where_the_directory_should_be(self, tmp_path):
        (tmp_path / "app.py").write_text("")
        for under in ("app.py/a.img", "app.py/sub/a.img"):
            r = run_python(["-c", "import json; print('ok')"], cwd=tmp_path,
                           PYCDSMODE="DUMP", PYCDSARCHIVE=str(tmp_path / under))
            assert (r.rc, r.out) == (0, "ok\n") and len(r.warnings()) == 1, r
            assert "Not a directory" in r.warnings()[0], r

    def test_a_lazily_loaded_module_stays_unloaded(self, tmp_path):
        (tmp_path / "lazymod.py").write_text('print("LAZY BODY RAN")\nX = 1\n')
        (tmp_path / "main.py").write_text(textwrap.dedent("""\
            import importlib.util, sys
            spec = importlib.util.find_spec("lazymod")
            loader = importlib.util.LazyLoader(spec.loader)
            spec.loader = loader
            m = importlib.util.module_from_spec(spec)
            sys.modules["lazymod"] = m
            loader.exec_module(m)
            print("main done")
            """))
        plain = run_python(["main.py"], cwd=tmp_path)
        d = run_python(["main.py"], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=str(tmp_path / "a.img"))
        assert plain.out == "main done\n", plain
        assert (d.rc, d.out, d.warnings()) == (0, plain.out, []), d

    def test_odd_entries_in_sys_modules(self, tmp_path):
        """A key that is not a str, an object whose __dict__ raises: skipped,
        the rest archived."""
        prog = textwrap.dedent("""\
            import sys, json, decimal
            class Odd:
                @property
                def __dict__(self):
                    raise SystemExit(7)
            sys.modules[1] = decimal
            sys.modules["odd"] = Odd()
            print("ok")
            """)
        (tmp_path / "odd.py").write_text(prog)
        img = str(tmp_path / "a.img")
        d = run_python(["odd.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert (d.rc, d.out, d.warnings()) == (0, "ok\n", []), d
        s = run_python(["-c", "import json, decimal"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert {"json", "decimal"} <= set(s.served()), s


class TestDescriptorsClosedByTheProgram:
    """Daemonizing code closes every descriptor (os.closerange), pycds's
    included, and may open files that take their numbers.  The program runs
    as plain Python from then on, and the one warning says why: no longer
    "index entry fails its checksum (archive corrupt, or replaced while in
    use)", which it was not (a review)."""

    APP = textwrap.dedent("""\
        import os, sys, json
        os.closerange(3, 4096)
        files = [open(sys.argv[0], "rb") for _ in range(int(sys.argv[1]))]
        import decimal, fractions
        print(json.dumps([1]), decimal.Decimal("1.5") + 1, fractions.Fraction(2, 4))
        """)

    WARNING = "[pycds] warning: archive {} ignored: the program closed its file descriptor"

    @pytest.mark.parametrize("reuse", [0, 8])
    def test_said_as_it_is(self, tmp_path, reuse):
        # Loads read on the importing thread (no read-ahead): decimal's is
        # the first read after the closing.
        (tmp_path / "app.py").write_text(self.APP)
        img = str(tmp_path / "a.img")
        args = ["app.py", str(reuse)]
        assert run_python(args, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
        plain = run_python(args, cwd=tmp_path)
        r = run_python(args, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYCDSPREFETCH=0)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1] 2.5 1/2\n"), r
        assert "json" in r.served() and "decimal" not in r.served(), r
        warning, = r.warnings()
        assert warning == self.WARNING.format(img), r

    def test_what_was_read_before_is_served_then_one_warning(self, tmp_path):
        # With the read-ahead thread, modules it read (and checked) before
        # the closing may still be served; after the warning none is.
        (tmp_path / "app.py").write_text(self.APP)
        img = str(tmp_path / "a.img")
        args = ["app.py", "8"]
        assert run_python(args, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
        r = run_python(args, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (0, "[1] 2.5 1/2\n"), r
        lines = r.err.splitlines()
        warned = [i for i, line in enumerate(lines) if line.startswith("[pycds] warning")]
        assert [lines[i] for i in warned] in ([], [self.WARNING.format(img)]), r
        if warned:
            assert not any(line.startswith("[pycds] served") for line in lines[warned[0]:]), r


class TestTheProgramsDescriptors:
    """A SHARE process holds one descriptor on its archive, out of the
    program's way: the program gets the numbers a plain run gets and may
    open as many (CPython's test_subprocess test_pass_fds failed under
    SHARE: its SHARE child held the archive at the lowest free number, which
    the test expects closed; test_os's test_closerange found no two
    consecutive free numbers)."""

    # The open descriptors below SC_OPEN_MAX, as CPython's
    # Lib/test/subprocessdata/fd_status.py lists them.
    LISTED = textwrap.dedent("""\
        import os
        def listed():
            out = []
            for fd in range(os.sysconf("SC_OPEN_MAX")):
                try:
                    os.fstat(fd)
                except OSError:
                    continue
                out.append(fd)
            return out
        """)
    # What the program sees: the numbers open() gives before and after its
    # first archived import, what listed() lists, how many descriptors it
    # may open, its limit.
    APP = LISTED + textwrap.dedent("""\
        import resource, sys
        first = os.open(os.devnull, os.O_RDONLY)
        import json, email.message, decimal
        second = os.open(os.devnull, os.O_RDONLY)
        os.close(first)
        print("numbers", first, second, os.dup(second))
        print("listed", listed())
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as e:
            print("count", len(held), e.errno)
        for fd in held:
            os.close(fd)
        print("limit", resource.getrlimit(resource.RLIMIT_NOFILE))
        print(json.dumps({"k": [1, 2]}), decimal.Decimal("1.1") + 1)
        """)

    def _runs(self, tmp_path, soft, hard):
        (tmp_path / "app.py").write_text(self.APP)
        img = str(tmp_path / "a.img")

        def limited():
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        def run(**env):
            proc = subprocess.run([sys.executable, "app.py"], cwd=tmp_path,
                                  env=clean_env(**env), capture_output=True,
                                  text=True, timeout=120, preexec_fn=limited)
            return Run(proc)
        assert run(PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
        return run(), run(PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)

    @pytest.mark.parametrize("soft", [256, 1024, 8192])
    def test_below_the_hard_limit_nothing_differs(self, tmp_path, soft):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard <= soft:
            pytest.fail(f"the hard RLIMIT_NOFILE ({hard}) leaves no room for the test")
        plain, share = self._runs(tmp_path, soft, hard)
        assert plain.rc == 0 and "count" in plain.out, plain
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "json" in share.served() and not share.warnings(), share

    def test_at_a_limit_that_cannot_be_raised_the_low_numbers_are_the_programs(
            self, tmp_path):
        # soft == hard: without CAP_SYS_RESOURCE the descriptor is the
        # highest free number below min(limit, 4096), one descriptor fewer
        # for the program (docs/importer-compliance.md); with it, nothing
        # differs.
        soft = hard = 2048
        raisable = subprocess.run(
            [sys.executable, "-c", "import resource; r = resource.RLIMIT_NOFILE; "
             "resource.setrlimit(r, (2049, 2049))"],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
            capture_output=True).returncode == 0
        plain, share = self._runs(tmp_path, soft, hard)
        assert share.rc == plain.rc == 0 and "json" in share.served(), share
        if raisable:
            assert share.out == plain.out, share
            return
        lines = dict(ln.split(" ", 1) for ln in share.out.splitlines()[:3])
        want = dict(ln.split(" ", 1) for ln in plain.out.splitlines()[:3])
        assert lines["numbers"] == want["numbers"], share
        got, plain_fds = eval(lines["listed"]), eval(want["listed"])
        assert got[:-1] == plain_fds and got[-1] == soft - 1, share
        count, err = lines["count"].split()
        assert (int(count) + 1, err) == (int(want["count"].split()[0]),
                                         want["count"].split()[1]), share
        assert share.out.splitlines()[3:] == plain.out.splitlines()[3:], share

    def test_no_descriptor_before_the_first_archived_import(self, tmp_path):
        # test_subprocess's test_pass_fds_redirected and
        # test_close_fds_when_max_fd_is_lowered list a SHARE child's
        # descriptors (fd_status.py): one that imports nothing archived
        # holds none, whatever its limits.
        (tmp_path / "status.py").write_text(
            self.LISTED + "print(listed())\n")
        img = str(tmp_path / "a.img")
        assert run_python(["-c", "import json"], cwd=tmp_path, PYCDSMODE="DUMP",
                          PYCDSARCHIVE=img).rc == 0
        limited = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # noqa: E731
        runs = [subprocess.run([sys.executable, "status.py"], cwd=tmp_path,
                               env=clean_env(**env), capture_output=True, text=True,
                               preexec_fn=limited)
                for env in ({}, {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": img})]
        assert runs[0].returncode == 0 and runs[0].stdout == runs[1].stdout, runs

    def test_no_descriptor_after_start_up_imports_left_plain(self, tmp_path):
        # CPython 3.13's whole test_subprocess under SHARE: fd_status.py's
        # start-up imported the archived sitecustomize plainly, and the
        # index lookup before that decision left the archive open at the
        # lowest free number, where a closed pipe had been.
        (tmp_path / "sitecustomize.py").write_text("X = 1\n")
        # (status.py's own import opens the archive; the lookup of what
        # start-up let through comes then.)
        (tmp_path / "status.py").write_text("import quopri\n" + self.LISTED
                                            + "print(listed())\n")
        img = str(tmp_path / "a.img")
        env = {"PYTHONPATH": str(tmp_path)}
        assert run_python(["-c", "import sitecustomize, json"], cwd=tmp_path,
                          PYCDSMODE="DUMP", PYCDSARCHIVE=img, **env).rc == 0
        runs = [subprocess.run([sys.executable, "status.py"], cwd=tmp_path,
                               env=clean_env(**env, **more), capture_output=True, text=True)
                for more in ({}, {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": img,
                                  "PYCDSVERBOSE": "1"})]
        assert "[pycds] plain sitecustomize" in runs[1].stderr, runs
        assert runs[0].returncode == 0 and runs[0].stdout == runs[1].stdout, runs

    def test_pass_fds_as_cpython_tests_it(self, tmp_path):
        # test_subprocess.test_pass_fds: a SHARE child given one of ten
        # inheritable descriptors has none of the other nine.
        (tmp_path / "fd_status.py").write_text(
            self.LISTED + 'import json\nprint(",".join(map(str, listed())))\n')
        (tmp_path / "parent.py").write_text(textwrap.dedent("""\
            import os, subprocess, sys
            open_fds = set()
            for _ in range(5):
                fds = os.pipe()
                for fd in fds:
                    os.set_inheritable(fd, True)
                open_fds.update(fds)
            bad = 0
            for fd in sorted(open_fds):
                env = dict(os.environ, PYCDSMODE="SHARE", PYCDSARCHIVE=sys.argv[1])
                out = subprocess.run([sys.executable, "fd_status.py"], close_fds=True,
                                     pass_fds=(fd,), capture_output=True,
                                     env=env).stdout
                remaining = set(map(int, out.split(b",")))
                bad += fd not in remaining or bool(remaining & (open_fds - {fd}))
            print("bad", bad)
            """))
        img = str(tmp_path / "a.img")
        assert run_python(["fd_status.py"], cwd=tmp_path, PYCDSMODE="DUMP",
                          PYCDSARCHIVE=img).rc == 0
        # The parent runs plain, as regrtest's worker did: its pipes take
        # the lowest numbers, which a SHARE child used to take again.
        r = run_python(["parent.py", img], cwd=tmp_path)
        assert (r.rc, r.out) == (0, "bad 0\n"), r


RLIMIT_AS_PROBE = textwrap.dedent("""\
    import resource
    lim = 256 << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        b = bytearray(512 << 20)
    except MemoryError:
        print("enforced")
    else:
        print("not enforced: a limit of 256 MiB set, then 512 MiB allocated;",
              "getrlimit reads", resource.getrlimit(resource.RLIMIT_AS)[0])
    """)


def rlimit_as_enforced():
    """None where a process's RLIMIT_AS holds, else why not (qemu-user, as
    in the emulated arm64 chroot, accepts setrlimit(RLIMIT_AS) and ignores
    it: the emulator's own reservations would not fit)."""
    p = subprocess.run([sys.executable, "-c", RLIMIT_AS_PROBE], capture_output=True,
                       text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr
    return None if p.stdout == "enforced\n" else p.stdout.strip()


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="a sanitizer build's runtime (docs/reliability.md) maps terabytes "
                           "of shadow memory: no RLIMIT_AS leaves it room")
class TestAddressSpaceLimit:
    """RLIMIT_AS below what the imports need: the program fails as plain
    Python fails (MemoryError) or runs, never dies.  The read-ahead thread's
    first failure (out of memory) once wrote its message into _Thread_local
    storage, which glibc allocates lazily in a dlopen'd module and, failing
    that, aborts the process: exit 127 "cannot allocate memory for
    thread-local data" (native/archive/common/errors.c).  Skipped where the
    limit is not enforced at all: there is nothing to test."""

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _limit_holds(cls):
        why = rlimit_as_enforced()
        if why is not None:
            pytest.skip(f"RLIMIT_AS does not hold on this system: {why}")

    APP = textwrap.dedent("""\
        import sys, json, decimal, argparse, email.message, http.client, textwrap
        import fractions, statistics, dataclasses, typing, enum
        import mypkg
        print(json.dumps({"a": [1, 2.5]}), decimal.Decimal("1.1") + 1, mypkg.f(10))
        print(statistics.mean([1, 2, 3, 4]), fractions.Fraction(3, 6))
        sys.exit(3)
        """)
    LIMIT = textwrap.dedent("""\
        import resource, runpy, sys
        lim = int(sys.argv[1]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        sys.argv = ["app.py"]
        sys.path.insert(0, ".")
        runpy.run_path("app.py", run_name="__main__")
        """)

    def test_never_killed(self, tmp_path):
        (tmp_path / "mypkg").mkdir()
        (tmp_path / "mypkg" / "__init__.py").write_text("from .sub import f\n")
        (tmp_path / "mypkg" / "sub.py").write_text(
            "def f(n):\n    return sum(i * i for i in range(n))\n")
        (tmp_path / "app.py").write_text(self.APP)
        (tmp_path / "limit.py").write_text(self.LIMIT)
        img = str(tmp_path / "a.img")
        d = run_python(["limit.py", "100000"], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img)
        assert d.rc == 3, d
        for mib in range(16, 34, 2):
            r = run_python(["limit.py", str(mib)], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSRELEASE="1")
            assert r.rc in (1, 3) or self._cpython_gave_up(r), (mib, r)
            assert "thread-local" not in r.err, (mib, r)

    @staticmethod
    def _cpython_gave_up(r):
        # CPython's own death when memory runs out while it builds a
        # traceback (PyTraceBack_Here -> _PyErr_NormalizeException, no frame
        # of pycds's): plain 3.10 dies so too, at a lower limit (1 run in
        # ~1000 over 6-16 MiB), and SHARE meets it a few times in a thousand
        # near 18 MiB.  Anything else is a death of pycds's.
        return r.rc == -6 and r.err.startswith(
            "Fatal Python error: _PyErr_NormalizeException: Cannot recover from "
            "MemoryErrors while normalizing exceptions.")

    BIG = ("import asyncio, email.mime.multipart, http.server, xml.dom.minidom, unittest, "
           "argparse, logging.handlers, decimal, pydoc, json, tarfile, zipfile, inspect, "
           "dataclasses, typing, pickle, csv, urllib.request, difflib, ast, configparser, "
           "optparse, gettext\n")
    SMALL = textwrap.dedent("""\
        import os, resource, sys
        heap = int(sys.argv[1])
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        lim = vm + heap * 3 // 2
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        import json
        b = bytearray(heap)
        print("ok", json.dumps([1]))
        """)

    def test_a_big_archive_leaves_the_program_its_memory(self, tmp_path):
        # The heap's reservation counts against RLIMIT_AS as a whole from the
        # first archive hit: a program importing one module of a big archive
        # had that much less, and hit MemoryError where plain Python ran
        # (a review).  The archive is refused instead, with one warning: the
        # limit leaves 1.5 heaps (the program allocates one), so the heap
        # takes more than half of that whatever pycds's own loading took.
        # (A heap of 6 MiB leaves plain Python 3 MiB for importing json.)
        (tmp_path / "big.py").write_text(self.BIG)
        (tmp_path / "small.py").write_text(self.SMALL)
        img = str(tmp_path / "big.img")
        d = run_python(["big.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0, d
        from pycds import _archive
        index = _archive.Index.open(img)
        heap = index.header.heap_len
        index.close()
        assert heap > 6 << 20, heap
        plain = run_python(["small.py", str(heap)], cwd=tmp_path)
        assert (plain.rc, plain.out) == (0, "ok [1]\n"), plain
        r = run_python(["small.py", str(heap)], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (plain.rc, plain.out), r
        warning, = r.warnings()
        assert "RLIMIT_AS" in warning and "ignored" in warning, r


class TestProcessModels:
    @pytest.mark.parametrize("method", ["fork", "spawn", "forkserver", "subprocess"])
    def test_children_share(self, procs, method):
        img = str(procs / f"{method}.img")
        args = ["procs.py", method, "parent-too"]
        plain = run_python(args, cwd=procs)
        assert plain.rc == 0, plain
        run_python(args, cwd=procs, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(args, cwd=procs, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        if method == "subprocess":
            # the child's own "served" count is on its stderr, printed by us
            assert plain.out.split()[:2] == r.out.split()[:2] and r.rc == 0, r
            assert r.out.split()[2] == "SHARE", r
            assert int(r.out.split()[-1]) >= 1, r
        else:
            assert (r.rc, r.out) == (plain.rc, plain.out), r
        assert not r.warnings(), r
        served = r.served()
        if method == "fork":
            # the forked child imported textwrap from the parent's archive
            assert served.count("textwrap") == 2 and "fractions" in served, r
            assert r.out.startswith("child"), r
        elif method in ("spawn", "forkserver"):
            # the parent imports fractions after the pool: the workers served
            # it before (one or two of them)
            assert served.count("fractions") >= 2, r

    def test_dump_by_parent_and_children(self, procs):
        """Parent and spawn children all run under DUMP: see
        docs/reliability.md ("DUMP and child processes")."""
        img = str(procs / "tree.img")
        r = run_python(["procs.py", "spawn-process"], cwd=procs, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.rc == 0 and not r.warnings(), r
        # parent, 2 children and the resource tracker each write
        assert r.err.count("[pycds] dumped") >= 3, r
        assert leftovers(procs, keep=[n for n in os.listdir(procs)
                                      if not n.startswith(".")]) == []
        s = run_python(["procs.py", "spawn-process"], cwd=procs, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert s.rc == 0 and not s.warnings() and s.out == r.out, s
        # modules the children alone imported are in the archive too
        assert s.served().count("statistics") == 2, s

    @pytest.mark.parametrize("method", ["spawn", "forkserver"])
    def test_a_refused_archive_is_one_warning_for_the_process_tree(self, procs, method):
        """Workers inherit the archive their parent refused: they import
        plainly and say nothing more (pycds._log, PYCDS_WARNED)."""
        img = str(procs / f"refused-{method}.img")
        args = ["procs.py", method, "parent-too"]
        plain = run_python(args, cwd=procs)
        run_python(args, cwd=procs, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        with open(img, "r+b") as f:
            f.truncate(os.path.getsize(img) // 2)
        r = run_python(args, cwd=procs, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.rc == 0 and r.out.split()[:2] == plain.out.split()[:2], r
        assert len(r.warnings()) == 1 and img in r.warnings()[0], r
        # a bad setting too; with PYCDSVERBOSE the repeats are verbose lines
        r = run_python(args, cwd=procs, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSCHECK="sometimes", PYCDSVERBOSE=1)
        assert r.rc == 0 and len(r.warnings()) == 2, r
        assert "warning already given in this process tree" in r.err, r

    def test_a_warning_nobody_saw_is_said_again_by_a_child(self, tmp_path):
        """A parent without stderr prints nothing: its child, which has one,
        says it."""
        (tmp_path / "parent.py").write_text(textwrap.dedent("""\
            import subprocess, sys
            r = subprocess.run([sys.executable, "-c", "import json"],
                               stderr=subprocess.PIPE, text=True)
            print(r.stderr.count("[pycds] warning"), "ignored" in r.stderr)
            """))
        p = subprocess.run([sys.executable, "parent.py"], cwd=tmp_path, capture_output=True,
                           text=True, preexec_fn=lambda: os.close(2),
                           env=clean_env(PYCDSMODE="SHARE",
                                         PYCDSARCHIVE=str(tmp_path / "missing.img")))
        assert (p.returncode, p.stdout) == (0, "1 True\n"), p

    def test_a_child_with_another_archive_still_warns(self, tmp_path):
        """A subprocess (its stderr ours) refusing its parent's archive says
        nothing; one refusing an archive of its own says so."""
        (tmp_path / "junk.img").write_bytes(b"not an archive" * 100)
        (tmp_path / "other.img").write_bytes(b"another bad archive" * 100)
        (tmp_path / "parent.py").write_text(textwrap.dedent(f"""\
            import os, subprocess, sys
            import json
            subprocess.run([sys.executable, "-c", "import json; print('same')"])
            env = dict(os.environ, PYCDSARCHIVE={str(tmp_path / "other.img")!r})
            subprocess.run([sys.executable, "-c", "import json; print('other')"], env=env)
            """))
        r = run_python(["parent.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(tmp_path / "junk.img"))
        assert r.rc == 0 and r.out.split() == ["same", "other"], r
        warned = r.warnings()
        assert len(warned) == 2, r
        assert "junk.img" in warned[0] and "other.img" in warned[1], r


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    (d / "app").mkdir()
    (d / "app" / "__init__.py").write_text('"""app doc"""\nassert True\n')
    (d / "app" / "__main__.py").write_text(
        "import app, app.util, json\nprint(app.util.f(), app.__doc__, json.dumps(1))\n")
    (d / "app" / "util.py").write_text('def f():\n    "doc"\n    return f.__doc__\n')
    img = str(d / "app.img")
    run_python(["-m", "app"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    return d, img


class TestFlags:
    def test_python_m_package(self, app):
        d, img = app
        plain = run_python(["-m", "app"], cwd=d)
        r = run_python(["-m", "app"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "doc app doc 1\n"), r
        assert {"app", "app.util", "json"} <= set(r.served())

    @pytest.mark.parametrize("flags", [["-B"], ["-X", "importtime"], ["-X", "frozen_modules=off"]])
    def test_flags_served(self, app, flags):
        d, img = app
        plain = run_python([*flags, "-m", "app"], cwd=d)
        r = run_python([*flags, "-m", "app"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out), r
        assert "app.util" in r.served() and not r.warnings(), r
        if "importtime" in flags:
            assert "import time:" in r.err and "app.util" in r.err

    def test_dont_write_bytecode(self, app):
        d, img = app
        r = run_python(["-m", "app"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, PYTHONDONTWRITEBYTECODE=1)
        assert r.out == "doc app doc 1\n" and "app.util" in r.served(), r

    @pytest.mark.parametrize("flag", ["-I", "-E", "-S"])
    def test_flags_that_turn_pycds_off(self, app, flag):
        d, img = app
        args = [flag, "-c", "import sys; sys.path.insert(0, '.'); import app.util; print(app.util.f())"]
        plain = run_python(args, cwd=d)
        r = run_python(args, cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) and r.out == "doc\n", r
        assert r.served() == [] and not r.warnings(), r

    @pytest.mark.parametrize("dump_flags,share_flags", [
        ([], ["-O"]), ([], ["-OO"]), (["-O"], []), (["-OO"], ["-O"])])
    def test_other_optimization_level_is_refused(self, app, tmp_path, dump_flags, share_flags):
        d, _ = app
        img = str(tmp_path / "o.img")
        run_python([*dump_flags, "-m", "app"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python([*share_flags, "-m", "app"], cwd=d)
        r = run_python([*share_flags, "-m", "app"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (r.rc, r.out) == (plain.rc, plain.out), r
        w = r.warnings()
        assert len(w) == 1 and w[0].startswith(f"[pycds] warning: archive {img} ignored: "), r
        assert "optimize" in w[0]

    @pytest.mark.parametrize("flag,out", [("-O", "doc app doc 1\n"), ("-OO", "None None 1\n")])
    def test_same_optimization_level_is_served(self, app, tmp_path, flag, out):
        d, _ = app
        img = str(tmp_path / "o.img")
        run_python([flag, "-m", "app"], cwd=d, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python([flag, "-m", "app"], cwd=d, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.out == out and "app.util" in r.served() and not r.warnings(), r


@pytest.mark.skipif(sys.version_info < (3, 11), reason="column positions are new in 3.11")
class TestDebugRanges:
    """``-X no_debug_ranges`` / ``PYTHONNODEBUGRANGES``: plain import's code
    objects have no column positions, so tracebacks show no carets.  An
    archive made under the other setting is refused (it would show them, or
    lack them); one made under the same setting is served."""

    @pytest.fixture
    def prog(self, tmp_path):
        (tmp_path / "m.py").write_text('def f(d):\n    return d["a"]["b"] + 1\n')
        (tmp_path / "app.py").write_text('import m, json\nm.f({"a": {"b": None}})\n')
        return tmp_path

    @staticmethod
    def stderr(r):
        return [line for line in r.err.splitlines() if not line.startswith("[pycds]")]

    @pytest.mark.parametrize("dump_off,share_off", [(False, True), (True, False)])
    def test_archive_of_the_other_setting_is_refused(self, prog, dump_off, share_off):
        img = str(prog / "a.img")
        off = {"PYTHONNODEBUGRANGES": "1"}
        run_python(["app.py"], cwd=prog, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   **(off if dump_off else {}))
        env = off if share_off else {}
        plain = run_python(["app.py"], cwd=prog, **env)
        r = run_python(["app.py"], cwd=prog, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, **env)
        assert (r.rc, r.out, self.stderr(r)) == (plain.rc, plain.out, self.stderr(plain)), r
        # (With positions on, plain's carets depend on who wrote the .pyc:
        # one written under no_debug_ranges has none, and plain import
        # trusts it.  With them off, plain never shows any.)
        if share_off:
            assert "~~~~" not in r.err and "Traceback" in r.err
        assert r.served() == [] and len(r.warnings()) == 1, r
        assert "debug_ranges" in r.warnings()[0], r

    @pytest.mark.parametrize("share_flags", [[], ["-X", "no_debug_ranges"]])
    def test_archive_of_the_same_setting_is_served(self, prog, share_flags):
        img = str(prog / "a.img")
        run_python(["-X", "no_debug_ranges", "app.py"], cwd=prog, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
        env = {} if share_flags else {"PYTHONNODEBUGRANGES": "1"}
        plain = run_python([*share_flags, "app.py"], cwd=prog, **env)
        r = run_python([*share_flags, "app.py"], cwd=prog, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1, **env)
        assert (r.rc, r.out, self.stderr(r)) == (plain.rc, plain.out, self.stderr(plain)), r
        assert "~~~~" not in r.err and "Traceback" in r.err
        assert {"m", "json", "json.decoder"} <= set(r.served()) and not r.warnings(), r

    def test_a_child_of_the_other_setting_leaves_the_session_archive_alone(self, tmp_path):
        # A DUMP session's children merge their modules into one archive.
        # A child whose code cannot share it (here: no column positions)
        # writes nothing; it used to replace the archive with its own
        # modules, dropping what the children before it had written.
        for name in ("mod_a", "mod_b", "mod_p"):
            (tmp_path / f"{name}.py").write_text(f"NAME = {name!r}\n")
        (tmp_path / "parent.py").write_text(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import mod_a'], check=True)\n"
            "subprocess.run([sys.executable, '-X', 'no_debug_ranges', '-c', 'import mod_b'],"
            " check=True)\n"
            "import mod_p\n")
        img = str(tmp_path / "s.img")
        d = run_python(["parent.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0 and not d.warnings(), d
        r = run_python(["-c", "import mod_a, mod_b, mod_p"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert r.rc == 0 and not r.warnings(), r
        assert {"mod_a", "mod_p"} <= set(r.served()) and "mod_b" not in r.served(), r

    def test_the_setting_is_the_one_the_process_started_with(self, tmp_path):
        # A program that changes PYTHONNODEBUGRANGES (for its children, say)
        # has not changed its own code: the DUMP still writes, as what the
        # code is; the API form records the code's setting too.
        (tmp_path / "mod_p.py").write_text("NAME = 'p'\n")
        img = str(tmp_path / "a.img")
        d = run_python(["-c", "import os, mod_p; os.environ['PYTHONNODEBUGRANGES'] = '1'"],
                       cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0 and not d.warnings() and os.path.exists(img), d
        r = run_python(["-c", "import mod_p"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "mod_p" in r.served() and not r.warnings(), r
        api = str(tmp_path / "api.img")
        d = run_python(["-c", "import os, mod_p; os.environ['PYTHONNODEBUGRANGES'] = '1'; "
                        f"import pycds; pycds._dump('', {api!r})"], cwd=tmp_path)
        assert d.rc == 0 and not d.warnings(), d
        r = run_python(["-c", "import mod_p"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=api, PYCDSVERBOSE=1, PYTHONNODEBUGRANGES="1")
        assert r.served() == [] and len(r.warnings()) == 1, r
        assert "debug_ranges True, this is False" in r.warnings()[0], r

    def test_a_child_of_the_other_setting_writes_its_own_archive(self, tmp_path):
        (tmp_path / "mod_b.py").write_text("NAME = 'b'\n")
        own = str(tmp_path / "own.img")
        (tmp_path / "parent.py").write_text(
            "import os, subprocess, sys\n"
            f"env = dict(os.environ, PYCDSARCHIVE={own!r})\n"
            "subprocess.run([sys.executable, '-X', 'no_debug_ranges', '-c', 'import mod_b'],"
            " env=env, check=True)\n")
        d = run_python(["parent.py"], cwd=tmp_path, PYCDSMODE="DUMP",
                       PYCDSARCHIVE=str(tmp_path / "s.img"))
        assert d.rc == 0 and not d.warnings(), d
        r = run_python(["-X", "no_debug_ranges", "-c", "import mod_b"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=own, PYCDSVERBOSE=1)
        assert "mod_b" in r.served() and not r.warnings(), r

    @pytest.mark.parametrize("session", ["handmade", "0123456789abcdef"])
    def test_a_session_id_without_a_tag_is_taken_as_ours(self, tmp_path, session):
        (tmp_path / "mod_p.py").write_text("NAME = 'p'\n")
        img = str(tmp_path / "a.img")
        for _ in range(2):      # the second finds an archive of "its" session
            d = run_python(["-c", "import mod_p"], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=img, PYCDS_DUMP_SESSION=session)
            assert d.rc == 0 and not d.warnings(), d
        r = run_python(["-c", "import mod_p"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "mod_p" in r.served() and not r.warnings(), r


def test_an_index_opened_out_of_the_way_reads_the_archive_renamed_over_it(tmp_path):
    # SHARE's first import reads the header and buckets, then lets go of the file
    # (out_of_the_way); a DUMP or AUTO run may rename a new archive over it
    # before the first entry is read, which must then use the new one
    # throughout: its buckets, offsets and key, not a mix ("index entry
    # fails its checksum").  A miss before that reads no entry and holds no
    # descriptor.
    import csv
    import json
    from pycds import _archive
    from pycds.dumping import dumper as _dumper
    path = str(tmp_path / "a.cds")
    _dumper.dump_modules([("json", json)], path)
    index = _archive.Index.open(path, out_of_the_way=True)
    try:
        _dumper.dump_modules([("csv", csv), ("json", json)], path)
        assert index.lookup("csv") is None and index.fd < 0
        assert index.lookup("json").name == "json" and index.fd >= 0
        entry = index.lookup("csv")
        assert entry is not None and entry.name == "csv"
        assert index.chunk_intact(entry)
    finally:
        index.close()
