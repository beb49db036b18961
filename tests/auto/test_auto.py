"""PYCDSMODE=AUTO (pycds.auto): the archive written, kept current and shared
by itself; and the line a SHARE run prints when its archive went stale."""

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from support import STARTUP_CUSTOMIZE, clean_env, installed, run_python
from pycds import _archive, auto

APP = """\
import sys
import {mods}
print("ok", {values})
"""


def archived(path):
    index = _archive.Index.open(str(path))
    try:
        return {e.name for e in index.entries()}
    finally:
        index.close()


def meta(path):
    index = _archive.Index.open(str(path))
    try:
        return dict(index.meta)
    finally:
        index.close()


def make_app(tmp_path, modules, imports=None):
    """An application directory: main.py importing ``imports`` (default:
    every module), each module ``name = value``, written as installed long
    ago (a valid .pyc, old mtimes)."""
    app = tmp_path / "app"
    app.mkdir(exist_ok=True)
    for name, value in modules.items():
        write_module(app / f"{name}.py", f"VALUE = {value!r}\n")
    imports = list(modules) if imports is None else imports
    write_main(app, imports)
    return app


def write_module(path, text, age=3600):
    path.write_text(text)
    installed(path, age=age)


def write_main(app, imports):
    values = ", ".join(f"{m}.VALUE" for m in imports) or "0"
    (app / "main.py").write_text(APP.format(mods=", ".join(imports + ["json"]),
                                            values=values))


def plugin_app(tmp_path, names):
    """An application importing the module its first argument names, one
    of ``names`` (each ``VALUE = <its number>``)."""
    app = make_app(tmp_path, {name: i for i, name in enumerate(names)}, imports=[])
    (app / "main.py").write_text(
        "import importlib, sys, json\n"
        "print(importlib.import_module(sys.argv[1]).VALUE)\n")
    return app


def auto_run(app, archive, *args, **env):
    return run_python([str(app / "main.py"), *args], cwd=str(app), PYCDSMODE="AUTO",
                      PYCDSARCHIVE=str(archive), PYCDSVERBOSE=1, **env)


def plain_run(app, *args):
    return run_python([str(app / "main.py"), *args], cwd=str(app))


def written(run):
    return [line for line in run.err.splitlines() if "AUTO: wrote" in line]


def test_first_run_writes_second_is_served_whole(tmp_path):
    app = make_app(tmp_path, {"alpha": 1, "beta": 2})
    archive = tmp_path / "a.img"
    plain = plain_run(app)
    first = auto_run(app, archive)
    assert first.rc == 0 and first.out == plain.out, first
    assert first.warnings() == [], first
    assert written(first), first
    assert {"alpha", "beta", "json", "json.decoder"} <= archived(archive)
    second = auto_run(app, archive)
    assert second.out == plain.out and second.rc == 0
    assert {"alpha", "beta", "json"} <= set(second.served()), second
    assert second.fallbacks() == [] and not written(second), second


def test_edit_then_next_run_rewrites_and_the_one_after_is_served(tmp_path):
    app = make_app(tmp_path, {"alpha": 1, "beta": 2})
    archive = tmp_path / "a.img"
    auto_run(app, archive)
    write_module(app / "alpha.py", "VALUE = 'edited'\n", age=60)
    after_edit = auto_run(app, archive)
    assert after_edit.out == plain_run(app).out == "ok edited 2\n", after_edit
    assert written(after_edit), after_edit
    again = auto_run(app, archive)
    assert again.out == "ok edited 2\n"
    assert "alpha" in again.served() and again.fallbacks() == [], again
    assert not written(again), again


def test_upgraded_package_is_served_after_one_run(tmp_path):
    # A `pip install` of a new version: the package's files replaced, one
    # module added, in a directory on the search path.
    site = tmp_path / "site"
    pkg = site / "lib"
    pkg.mkdir(parents=True)
    write_module(pkg / "__init__.py", "from .core import VALUE\n")
    write_module(pkg / "core.py", "VALUE = 'v1'\n")
    app = tmp_path / "app"
    app.mkdir()
    write_main(app, ["lib"])
    archive = tmp_path / "a.img"
    env = {"PYTHONPATH": str(site)}
    assert auto_run(app, archive, **env).out == "ok v1\n"
    shutil.rmtree(pkg)
    pkg.mkdir()
    write_module(pkg / "__init__.py", "from .core import VALUE\nfrom . import extra\n", age=30)
    write_module(pkg / "core.py", "VALUE = 'version 2'\n", age=30)
    write_module(pkg / "extra.py", "X = 1\n", age=30)
    upgraded = auto_run(app, archive, **env)
    assert upgraded.out == "ok version 2\n", upgraded
    assert written(upgraded)
    assert {"lib", "lib.core", "lib.extra"} <= archived(archive)
    after = auto_run(app, archive, **env)
    assert after.out == "ok version 2\n"
    assert {"lib", "lib.core", "lib.extra"} <= set(after.served()), after
    assert after.fallbacks() == [] and not written(after), after


def test_a_new_import_is_added_at_once(tmp_path):
    app = make_app(tmp_path, {"alpha": 1, "beta": 2}, imports=["alpha"])
    archive = tmp_path / "a.img"
    auto_run(app, archive)
    assert "beta" not in archived(archive)
    write_main(app, ["alpha", "beta"])
    added = auto_run(app, archive)
    assert added.out == "ok 1 2\n" and written(added), added
    assert "beta" in archived(archive)
    assert meta(archive)["auto_adds"] == 1
    full = auto_run(app, archive)
    assert {"alpha", "beta"} <= set(full.served()) and not written(full), full


def test_imports_that_differ_on_every_run_back_off(tmp_path):
    # A plugin picked at random on each run: the archive is rewritten for
    # the first FREE_ADDS new ones, then not again until it has stood
    # add_backoff_s.
    n = auto.FREE_ADDS
    app = plugin_app(tmp_path, [f"plugin{i}" for i in range(n + 3)])
    archive = tmp_path / "a.img"
    assert written(auto_run(app, archive, "plugin0"))       # the first archive
    for i in range(1, n + 1):
        assert written(auto_run(app, archive, f"plugin{i}")), i
    assert meta(archive)["auto_adds"] == n
    # Written a moment ago as the next run sees it, however long that run
    # takes to get there (emulated, more than the 1 s back-off).
    now = time.time() + 60
    os.utime(archive, (now, now))
    held = auto_run(app, archive, f"plugin{n + 1}")
    assert held.out == f"{n + 1}\n" and not written(held), held
    assert "not rewritten before it is 1 s old" in held.err
    assert f"plugin{n + 1}" not in archived(archive)


def test_add_backoff_grows_to_an_hour():
    n = auto.FREE_ADDS
    assert [auto.add_backoff_s(k) for k in range(n + 4)] == [0] * n + [1, 2, 4, 8]
    assert auto.add_backoff_s(100) == auto.ADD_BACKOFF_MAX_S == 3600


def test_concurrent_runs_leave_one_archive_with_every_module(tmp_path):
    mods = {f"m{i}": i for i in range(8)}
    app = plugin_app(tmp_path, mods)
    archive = tmp_path / "a.img"
    env = clean_env(PYCDSMODE="AUTO", PYCDSARCHIVE=str(archive))
    procs = [subprocess.Popen([sys.executable, str(app / "main.py"), f"m{i}"],
                              cwd=str(app), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [o for o, _ in outs] == [f"{i}\n" for i in range(8)]
    assert all(e == "" for _, e in outs), outs
    assert set(mods) | {"json"} <= archived(archive)
    assert [f for f in os.listdir(tmp_path) if f not in ("app", "a.img")] == []
    served = auto_run(app, archive, "m5")
    assert "m5" in served.served() and not written(served), served


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_read_only_directory_is_one_warning_for_the_tree(tmp_path):
    app = make_app(tmp_path, {"alpha": 1})
    (app / "main.py").write_text(
        "import subprocess, sys, alpha\n"
        "subprocess.run([sys.executable, '-c', 'import alpha; print(alpha.VALUE)'])\n"
        "print('parent', alpha.VALUE)\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (f"mount --bind -o ro {ro} {ro} 2>/dev/null || "
              f"{{ mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}; }} && "
              f"exec {sys.executable} {app / 'main.py'}")
    env = clean_env(PYCDSMODE="AUTO", PYCDSARCHIVE=str(ro / "a.img"),
                    PYTHONPATH=str(app))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          cwd=str(app), env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\nparent 1\n"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[pycds]")]
    assert len(lines) == 1 and "AUTO cannot write" in lines[0], proc.stderr
    assert not (ro / "a.img").exists()


def test_share_says_once_when_the_archive_went_stale(tmp_path):
    mods = {"alpha": 1, "beta": 2, "gamma": 3, "delta": 4}
    app = make_app(tmp_path, mods)
    # The line is said once for the process tree: not by the child.
    (app / "main.py").write_text(
        APP.format(mods="alpha, beta, gamma, delta, json, subprocess",
                   values="alpha.VALUE, beta.VALUE, gamma.VALUE, delta.VALUE")
        + "subprocess.run([sys.executable, '-c', 'import alpha, beta, gamma, delta'])\n")
    archive = tmp_path / "a.img"

    def share():
        return run_python([str(app / "main.py")], cwd=str(app), PYCDSMODE="SHARE",
                          PYCDSARCHIVE=str(archive))

    run_python([str(app / "main.py")], cwd=str(app), PYCDSMODE="DUMP",
               PYCDSARCHIVE=str(archive))
    assert share().err == ""                      # nothing stale, nothing said
    # One edited module of the run's ~30 archived ones: below STALE_SHARE.
    write_module(app / "alpha.py", "VALUE = 'a'\n", age=60)
    one = share()
    assert one.out == "ok a 2 3 4\n" and one.err == "", one
    for name in ("beta", "gamma", "delta"):
        write_module(app / f"{name}.py", f"VALUE = {name[0]!r}\n", age=60)
    stale = share()
    assert stale.out == "ok a b g d\n", stale
    assert len(stale.warnings()) == 1 and stale.err.count("\n") == 1, stale
    assert stale.warnings()[0].startswith("[pycds] warning: 4 of the "), stale
    assert "PYCDSMODE=AUTO" in stale.err and str(archive) in stale.err


SERVER = """\
import signal, sys, time
import alpha, json
def on_usr1(signum, frame):
    print("usr1", alpha.VALUE, flush=True)
signal.signal(signal.SIGUSR1, on_usr1)
print("ready", flush=True)
t0 = time.monotonic()
while True:
    time.sleep(30)    # a signal handler interrupts it (PEP 475 resumes it)
    if time.monotonic() - t0 > 25:
        sys.exit("not stopped")
"""


def _serve_until_killed(app, env, wait_s):
    """Start the server-like program, let it run ``wait_s`` seconds after
    it is ready, signal it once (SIGUSR1: its handler prints), then stop it
    with SIGTERM.  Returns (stdout, stderr, returncode, usr1 latency s)."""
    import signal
    p = subprocess.Popen([sys.executable, str(app / "main.py")], cwd=str(app), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(wait_s)
        t0 = time.monotonic()
        p.send_signal(signal.SIGUSR1)
        line = p.stdout.readline()
        latency = time.monotonic() - t0
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    return line + out, err, p.returncode, latency


@pytest.mark.parametrize("mode", ["DUMP", "AUTO"])
def test_a_server_killed_by_sigterm_has_its_archive(tmp_path, mode):
    app = make_app(tmp_path, {"alpha": 1})
    (app / "main.py").write_text(SERVER)
    archive = tmp_path / "a.img"
    plain = _serve_until_killed(app, clean_env(), 0.1)
    env = clean_env(PYCDSMODE=mode, PYCDSARCHIVE=str(archive), PYCDSSETTLE="0.3")
    recorded = _serve_until_killed(app, env, 1.5)
    # Same output, same exit status (killed by SIGTERM), and the handler
    # ran at once: the watcher thread took no signal meant for the program.
    assert recorded[:3] == plain[:3] == ("usr1 1\n", "", -15), recorded
    assert recorded[3] < 5, recorded
    assert {"alpha", "json"} <= archived(archive)
    shared = _serve_until_killed(
        app, clean_env(PYCDSMODE="SHARE", PYCDSARCHIVE=str(archive), PYCDSVERBOSE="1"), 0.1)
    assert shared[0] == "usr1 1\n" and "[pycds] served alpha" in shared[1], shared


def test_settle_zero_writes_only_at_exit(tmp_path):
    app = make_app(tmp_path, {"alpha": 1})
    (app / "main.py").write_text(SERVER)
    archive = tmp_path / "a.img"
    env = clean_env(PYCDSMODE="DUMP", PYCDSARCHIVE=str(archive), PYCDSSETTLE="0")
    assert _serve_until_killed(app, env, 1.0)[2] == -15
    assert not archive.exists()


def test_the_watcher_is_not_a_thread_the_program_sees(tmp_path):
    app = make_app(tmp_path, {"alpha": 1})
    (app / "main.py").write_text(
        "import threading, time, alpha\n"
        "time.sleep(0.6)\n"
        "print(threading.active_count(), [t.name for t in threading.enumerate()])\n")
    plain = plain_run(app)
    for mode in ("DUMP", "AUTO"):
        run = run_python([str(app / "main.py")], cwd=str(app), PYCDSMODE=mode,
                         PYCDSARCHIVE=str(tmp_path / f"{mode}.img"), PYCDSSETTLE="0.2")
        assert run.out == plain.out == "1 ['MainThread']\n", run
        assert "alpha" in archived(tmp_path / f"{mode}.img")


def test_a_child_forked_while_the_lock_is_held_does_not_keep_it(tmp_path):
    # The settle watcher writes while the program forks: the child shares
    # the lock's descriptor, and close() alone left the lock held until the
    # child exited (the next writer waited LOCK_WAIT_S, then gave up).
    import fcntl
    from pycds import _files
    path = str(tmp_path / "a.img")
    with _files.directory_lock(path):
        pid = os.fork()
        if pid == 0:
            time.sleep(3)
            os._exit(0)
    try:
        fd = os.open(str(tmp_path), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free at once
        finally:
            os.close(fd)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_forked_child_does_not_repeat_the_stale_line(tmp_path):
    mods = {f"s{i}": i for i in range(6)}
    app = make_app(tmp_path, mods)
    (app / "main.py").write_text(
        "import os, sys, json, " + ", ".join(mods) + "\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('done')\n")
    archive = tmp_path / "a.img"
    run_python([str(app / "main.py")], cwd=str(app), PYCDSMODE="DUMP", PYCDSARCHIVE=str(archive))
    for name in mods:
        write_module(app / f"{name}.py", "VALUE = 'new'\n", age=60)
    r = run_python([str(app / "main.py")], cwd=str(app), PYCDSMODE="SHARE",
                   PYCDSARCHIVE=str(archive))
    assert r.out == "done\n" and len(r.warnings()) == 1, r
    assert "were stale" in r.warnings()[0], r


def test_dump_takes_path_like_archives_and_refuses_a_str_of_modules(tmp_path):
    (tmp_path / "m.py").write_text("X = 1\n")
    img = tmp_path / "p.img"
    r = run_python(["-c", "import pathlib, pycds, m\n"
                    f"print(pycds.dump(pathlib.Path({str(img)!r})) > 0)"], cwd=str(tmp_path))
    assert r.out == "True\n" and "m" in archived(img), r
    r = run_python(["-c", "import pycds; pycds.dump('x.img', 'json')"], cwd=str(tmp_path))
    assert "TypeError: modules is an iterable of module names" in r.err, r
    assert not (tmp_path / "x.img").exists()


def test_a_program_that_imports_nothing_gets_an_empty_archive(tmp_path):
    """Nothing to archive: AUTO writes an archive of no module, so that the
    next runs take the SHARE path (the archive opened at the first import,
    here never) instead of recording again on every run."""
    img = tmp_path / "a.img"
    r = run_python(["-c", "print('ok')"], cwd=tmp_path, PYCDSMODE="AUTO",
                   PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
    assert (r.rc, r.out, r.warnings()) == (0, "ok\n", []), r
    # (3.13 imports linecache for -c, after pycds started: the interpreter's,
    # as is a sitecustomize such as Debian's.)
    assert archived(img) <= {"linecache"} | STARTUP_CUSTOMIZE
    probe = ("import sys; print('ok', 'pycds.share' in sys.modules, "
             "'pycds.dumping.capture' in sys.modules)")
    r = run_python(["-c", probe], cwd=tmp_path, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img),
                   PYCDSVERBOSE=1)
    # Neither opened nor recording: nothing but the package and its settings
    # (and the line saying the interpreter's sitecustomize went by plainly).
    plain_lines = {f"[pycds] plain {m}: imported by the interpreter before the "
                   "archive was opened" for m in STARTUP_CUSTOMIZE}
    err = [line for line in r.err.splitlines() if line not in plain_lines]
    assert (r.rc, r.out, err) == (0, "ok False False\n", []), r


def test_auto_opens_at_the_first_import_and_adds_what_it_lacked(tmp_path):
    app = make_app(tmp_path, {"m1": 1})
    img = tmp_path / "a.img"
    for _ in range(2):
        r = run_python(["main.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img))
        assert (r.rc, r.out, r.warnings()) == (0, "ok 1\n", []), r
    write_module(app / "m2.py", "VALUE = 2\n")
    write_main(app, ["m1", "m2"])
    r = run_python(["main.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img),
                   PYCDSVERBOSE=1)
    assert r.out == "ok 1 2\n" and "m1" in r.served(), r
    assert {"m1", "m2", "json"} <= archived(img)
    r = run_python(["main.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img),
                   PYCDSVERBOSE=1)
    assert r.out == "ok 1 2\n" and {"m1", "m2"} <= set(r.served()), r


@pytest.mark.parametrize("mode", ["AUTO", "DUMP"])
def test_a_fork_sees_no_thread_of_pycds(tmp_path, mode):
    """The settle watcher is not there across fork(): 3.12+ warns (a
    DeprecationWarning on stderr) when a process with more than one thread
    forks, which plain Python does not here; and it writes afterwards."""
    (tmp_path / "fk.py").write_text(
        "import json, os, sys, time\n"
        "import email.parser\n"
        "time.sleep(0.3)\n"          # the watcher is waiting for imports to settle
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "import csv\n"                          # settles: the watcher, started again, writes
        "deadline = time.monotonic() + (30 if os.environ.get('PYCDSMODE') else 0)\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0.2)\n"
        "print('forked', os.path.exists(sys.argv[1]))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n")             # no exit handler: only the watcher writes
    img = tmp_path / "k.img"
    plain = run_python(["fk.py", str(img)], cwd=tmp_path)
    assert (plain.rc, plain.out, plain.err) == (0, "forked False\n", ""), plain
    r = run_python(["fk.py", str(img)], cwd=tmp_path,
                   PYCDSMODE=mode, PYCDSARCHIVE=str(img), PYCDSSETTLE="0.5")
    assert (r.rc, r.out, r.err) == (0, "forked True\n", ""), r
    assert "csv" in archived(img)


def test_an_audit_hook_refusing_the_native_module_runs_plain(tmp_path):
    # With an archive to share, AUTO loads the native module at the first
    # import; the program's audit hook refuses _cffi_backend: one warning,
    # the program runs as plain Python (it once died of the hook's error,
    # raised again by AUTO's look at the archive's directory).
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""\
        import sys
        def hook(event, args):
            if event == "import" and args[0] == "_cffi_backend":
                raise RuntimeError("no cffi here")
        if len(sys.argv) > 1:
            sys.addaudithook(hook)
        import json, csv, email.message
        print("ran", json.dumps([1]))
        """))
    img = str(tmp_path / "a.img")
    first = run_python([str(prog)], cwd=tmp_path, PYCDSMODE="AUTO", PYCDSARCHIVE=img)
    assert first.rc == 0 and os.path.exists(img), first
    plain = run_python([str(prog), "hook"], cwd=tmp_path)
    r = run_python([str(prog), "hook"], cwd=tmp_path, PYCDSMODE="AUTO", PYCDSARCHIVE=img)
    assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "ran [1]\n"), (plain, r)
    # What the hook raised is the reason, said where the archive is
    # ignored (and where AUTO cannot write it): no traceback.
    assert r.warnings()[0] == f"[pycds] warning: archive {img} ignored: no cffi here", r
    assert "Traceback" not in r.err, r
