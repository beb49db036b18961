"""A dump never destroys a file of the user's (issue 41).

DUMP, AUTO, TRACE, ``pycds.dump()``, ``python -m pycds dump`` and ``cache
clear`` replace or remove a file at their path only when it is one of
pycds's own (an archive, whatever its state; a module list) or empty;
anything else is left byte for byte as it was, with one warning that names
it, and the program's exit status and output are those of a plain run.
"""

import os
import stat
import subprocess
import sys

import pytest

from support import clean_env, run_python

APP = "import json, email.message\nprint('app ran')\n"
MAGIC = b"PYCDS\x00ar"


@pytest.fixture
def app(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def _users_file(path, kind):
    """Make the user's file of ``kind`` at ``path``; returns a function
    that asserts it is untouched."""
    if kind == "source":
        path.write_text("def f():\n    return 42\n")
    elif kind == "text":
        path.write_text("notes\n")
    elif kind in ("empty __init__.py", "empty file"):
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(os.urandom(4096))
    elif kind == "symlink":
        target = path.parent / "target.txt"
        target.write_text("kept\n")
        os.symlink(target, path)
        return lambda: (os.path.islink(path) and target.read_text() == "kept\n")
    elif kind == "fifo":
        os.mkfifo(path)
        return lambda: stat.S_ISFIFO(os.lstat(path).st_mode)
    elif kind == "directory":
        path.mkdir()
        (path / "inside.txt").write_text("kept\n")
        return lambda: sorted(os.listdir(path)) == ["inside.txt"]
    data = path.read_bytes()
    return lambda: os.path.isfile(path) and not os.path.islink(path) \
        and path.read_bytes() == data


KINDS = ["source", "empty __init__.py", "empty file", "text", "binary", "symlink", "fifo",
         "directory"]


class TestDumpLeavesUsersFiles:
    @pytest.mark.parametrize("kind", KINDS)
    def test_dump(self, app, kind):
        target = app / ("__init__.py" if kind == "empty __init__.py" else "victim")
        untouched = _users_file(target, kind)
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(target))
        assert (r.rc, r.out) == (0, "app ran\n"), r
        assert untouched(), r
        [w] = r.warnings()
        assert str(target) in w and "left as it is" in w and "PYCDSARCHIVE" in w, w

    @pytest.mark.parametrize("kind", KINDS)
    def test_auto(self, app, kind):
        target = app / ("__init__.py" if kind == "empty __init__.py" else "victim")
        untouched = _users_file(target, kind)
        for _ in range(2):     # the second run meets what the first left
            r = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(target))
            assert (r.rc, r.out) == (0, "app ran\n"), r
            assert untouched(), r
            [w] = r.warnings()
            assert str(target) in w and "AUTO writes no archive over it" in w, w
            assert "fresh one" not in w

    def test_the_running_script(self, app):
        before = (app / "app.py").read_bytes()
        for mode in ("DUMP", "AUTO"):
            r = run_python(["app.py"], cwd=app, PYCDSMODE=mode, PYCDSARCHIVE="app.py")
            assert (r.rc, r.out) == (0, "app ran\n"), r
            assert len(r.warnings()) == 1, r
            assert (app / "app.py").read_bytes() == before
        r = run_python(["app.py"], cwd=app)
        assert (r.rc, r.out, r.err) == (0, "app ran\n", ""), r

    def test_trace_list(self, app):
        target = app / "names.txt"
        target.write_text("json\nmy own notes\n")
        r = run_python(["app.py"], cwd=app, PYCDSMODE="TRACE", PYCDSLIST=str(target))
        assert (r.rc, r.out) == (0, "app ran\n"), r
        [w] = r.warnings()
        assert "not a pycds module list" in w, w
        assert target.read_text() == "json\nmy own notes\n"

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file away")
    def test_another_users_file(self, app):
        # Even an archive: pycds does not replace what another user owns.
        for content in (b"theirs\n", MAGIC + b"\0" * 100):
            target = app / "theirs.img"
            target.write_bytes(content)
            os.chown(target, 65534, 65534)
            r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(target))
            assert (r.rc, r.out) == (0, "app ran\n"), r
            [w] = r.warnings()
            assert "belongs to another user" in w, w
            assert target.read_bytes() == content and os.stat(target).st_uid == 65534

    def test_api_and_cli(self, app):
        target = app / "notes.txt"
        target.write_text("keep me\n")
        (app / "mods.lst").write_text("json\n")
        r = run_python(["-c", "import pycds\n"
                        "try:\n    pycds.dump('notes.txt')\n"
                        "except FileExistsError as e:\n    print(e)"], cwd=app)
        assert r.rc == 0 and "notes.txt is not a pycds archive" in r.out, r
        r = run_python(["-m", "pycds", "dump", "mods.lst", "notes.txt"], cwd=app)
        assert r.rc == 2 and "not a pycds archive" in r.err and "Traceback" not in r.err, r
        assert target.read_text() == "keep me\n"


class TestWhatIsNotQuiteOurs:
    def test_an_output_file_the_program_is_writing(self, app):
        # Empty at exit (its text still in the program's buffer): not a
        # place left for an archive.
        (app / "w.py").write_text("import json\nf = open('out.txt', 'w')\n"
                                  "f.write('precious result\\n')\nprint('done')\n")
        for mode, var in (("DUMP", "PYCDSARCHIVE"), ("AUTO", "PYCDSARCHIVE"),
                          ("TRACE", "PYCDSLIST")):
            (app / "out.txt").unlink(missing_ok=True)
            r = run_python(["w.py"], cwd=app, PYCDSMODE=mode, **{var: "out.txt"})
            assert (r.rc, r.out) == (0, "done\n"), (mode, r)
            assert (app / "out.txt").read_text() == "precious result\n", (mode, r)

    def test_an_archive_someone_appended_to(self, app):
        img = app / "app.log"
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
        assert r.rc == 0, r
        with open(img, "ab") as f:
            f.write(b"event from run 1\n")
        data = img.read_bytes()
        for mode in ("AUTO", "DUMP"):
            r = run_python(["app.py"], cwd=app, PYCDSMODE=mode, PYCDSARCHIVE=str(img))
            assert (r.rc, r.out) == (0, "app ran\n"), r
            [w] = r.warnings()
            assert "bytes appended" in w, w
            assert "left as it is" in w or "writes no archive over it" in w, w
            assert img.read_bytes() == data

    def test_a_truncated_archive_is_replaced(self, app):
        img = app / "app.img"
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
        assert r.rc == 0, r
        img.write_bytes(img.read_bytes()[:5000])
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
        assert (r.rc, r.warnings()) == (0, []), r
        s = run_python(["app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=str(img),
                       PYCDSVERBOSE=1)
        assert "json" in s.served(), s


class TestDumpRunsNothingOfTheProgramDirectory:
    @pytest.mark.parametrize("mode", ["DUMP", "TRACE", "AUTO"])
    def test_a_fcntl_py_beside_the_script(self, app, mode):
        # pycds locks the archive's directory with the standard fcntl, not
        # a fcntl.py the program's directory holds (plain Python never
        # imports it here); the program's own import gets its file.
        (app / "fcntl.py").write_text("print('the user fcntl ran')\n")
        (app / "u.py").write_text("import json\nprint('app ran')\n")
        r = run_python(["u.py"], cwd=app, PYCDSMODE=mode, PYCDSARCHIVE="a.img",
                       PYCDSLIST="a.lst")
        assert (r.rc, r.out, r.warnings()) == (0, "app ran\n", []), r
        (app / "v.py").write_text("import fcntl\n")
        r = run_python(["v.py"], cwd=app, PYCDSMODE=mode, PYCDSARCHIVE="b.img",
                       PYCDSLIST="b.lst")
        # Where fcntl is built into the interpreter (Debian's python3), the
        # built-in comes first for plain Python too: the user's never runs.
        plain = run_python(["v.py"], cwd=app)
        builtin = "fcntl" in sys.builtin_module_names
        assert plain.out == ("" if builtin else "the user fcntl ran\n"), plain
        assert (r.rc, r.out) == (0, plain.out), r


class TestDumpReplacesItsOwn:
    @pytest.mark.parametrize("content", [b"", MAGIC, MAGIC + os.urandom(5000)],
                             ids=["empty", "magic only", "damaged archive"])
    def test_replaced(self, app, content):
        target = app / "app.img"
        target.write_bytes(content)
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(target))
        assert (r.rc, r.out, r.warnings()) == (0, "app ran\n", []), r
        s = run_python(["app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=str(target),
                       PYCDSVERBOSE=1)
        assert (s.rc, s.out, s.warnings()) == (0, "app ran\n", []), s
        assert "json" in s.served(), s

    def test_auto_replaces_an_archive_with_a_damaged_module(self, app):
        target = app / "app.img"
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(target))
        assert r.rc == 0, r
        from pycds import _archive
        index = _archive.Index.open(str(target), check_owner=False)
        try:
            e = index.lookup("json.decoder")
            at = index.header.heap_off + e.chunk_off + e.chunk_len // 2
        finally:
            index.close()
        data = bytearray(target.read_bytes())
        data[at] ^= 0xFF
        target.write_bytes(bytes(data))
        _auto_mends(app, target, "json.decoder")

    def test_auto_replaces_a_damaged_archive(self, app):
        target = app / "app.img"
        target.write_bytes(MAGIC + b"\0" * 10)
        _auto_mends(app, target, "json")


def _auto_mends(app, target, module):
    # One AUTO run warns that it writes the archive anew, the next one is
    # served from it without a warning.
    r = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(target))
    [w] = r.warnings()
    assert "AUTO writes a fresh one at exit" in w, w
    s = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(target),
                   PYCDSVERBOSE=1)
    assert (s.rc, s.out, s.warnings()) == (0, "app ran\n", []), s
    assert module in s.served(), s


class TestCacheClear:
    def test_removes_only_archives(self, app, tmp_path):
        cache = tmp_path / "xdg"
        env = {"XDG_CACHE_HOME": str(cache)}
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", **env)
        assert r.rc == 0, r
        [archive] = [p for p in (cache / "pycds").iterdir()]
        assert archive.name.startswith("app-") and archive.name.endswith(".img")
        mine = cache / "pycds" / "mine.img"
        mine.write_text("a user's file that happens to end in .img\n")
        r = run_python(["-m", "pycds", "cache", "list"], cwd=app, **env)
        assert r.rc == 0 and "1 archive in" in r.out and "mine.img" not in r.out, r
        r = run_python(["-m", "pycds", "cache", "clear"], cwd=app, **env)
        assert r.rc == 0 and "removed 1 of 1 archive" in r.out, r
        assert not archive.exists()
        assert mine.read_text() == "a user's file that happens to end in .img\n"
        assert "not a pycds archive" in r.err, r


class TestDumpSaysWhatItWrote:
    def test_one_line(self, app, tmp_path):
        env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSVERBOSE=None, **env)
        assert r.rc == 0 and r.out == "app ran\n", r
        lines = r.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("[pycds] wrote "), r
        [archive] = list((tmp_path / "xdg" / "pycds").iterdir())
        assert str(archive) in lines[0] and "modules" in lines[0], lines
        # The number said is the number archived.
        n = int(lines[0].split()[2])
        info = subprocess.run([sys.executable, "-m", "pycds", "info", "-q", str(archive)],
                              capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
        assert f"modules:      {n}\n" in info.stdout, info.stdout

    def test_one_module(self, app):
        (app / "one.py").write_text("import email.charset\n")
        r = run_python(["-c", "import one"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="o.img",
                       PYCDSVERBOSE=None)
        assert r.err.startswith("[pycds] wrote "), r
        n = int(r.err.split()[2])
        assert r.err.split()[3] == ("module" if n == 1 else "modules"), r

    def test_a_given_archive_is_named_in_how_to_use_it(self, app):
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="x.img",
                       PYCDSVERBOSE=None)
        assert f"PYCDSARCHIVE={app / 'x.img'}" in r.err, r

    def test_a_tree_says_a_refused_path_once(self, app):
        (app / "tree.py").write_text(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import json'], check=True)\n"
            "print('tree ran')\n")
        (app / "notes.txt").write_text("mine\n")
        r = run_python(["tree.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="notes.txt",
                       PYCDSVERBOSE=None)
        assert (r.rc, r.out) == (0, "tree ran\n"), r
        assert len(r.warnings()) == 1 and "wrote" not in r.err, r
        assert (app / "notes.txt").read_text() == "mine\n"

    def test_a_home_directory_not_expanded_by_a_shell(self, app, tmp_path):
        home = tmp_path / "home"
        home.mkdir()
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="~/x.img",
                       HOME=str(home))
        assert r.rc == 0, r
        assert (home / "x.img").exists() and not (app / "~").exists()

    def test_pycds_command_line_is_not_archived(self, app, tmp_path):
        env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
        for mode in ("AUTO", "DUMP"):
            r = run_python(["-m", "pycds", "cache", "list"], cwd=app, PYCDSMODE=mode, **env)
            assert r.rc == 0 and r.err == "", r
        assert not (tmp_path / "xdg" / "pycds").exists() or \
            not os.listdir(tmp_path / "xdg" / "pycds")

    def test_quiet_with_verbose_0(self, app):
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="a.img",
                       PYCDSVERBOSE=0)
        assert (r.rc, r.out, r.err) == (0, "app ran\n", ""), r
        assert (app / "a.img").read_bytes()[:8] == MAGIC

    def test_children_do_not_repeat_it(self, app):
        (app / "tree.py").write_text(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import json'], check=True)\n"
            "print('tree ran')\n")
        r = run_python(["tree.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="t.img",
                       PYCDSVERBOSE=None)
        assert (r.rc, r.out) == (0, "tree ran\n"), r
        assert len([x for x in r.err.splitlines() if x.startswith("[pycds] wrote ")]) == 1, r


class TestFirstRunAdvice:
    def test_share_without_archive(self, app):
        r = run_python(["app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE="none.img")
        assert (r.rc, r.out) == (0, "app ran\n"), r
        [w] = r.warnings()
        assert "PYCDSMODE=DUMP" in w and "PYCDSMODE=AUTO" in w, w

    def test_share_of_a_foreign_archive(self, app):
        target = app / "app.img"
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(target),
                       PYCDSVERBOSE=0)
        assert r.rc == 0, r
        s = run_python(["-O", "app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=str(target))
        [w] = s.warnings()
        assert "write it again with this interpreter" in w, w

    def test_share_of_a_directory(self, app):
        (app / "d").mkdir()
        r = run_python(["app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE="d")
        [w] = r.warnings()
        assert os.path.join(str(app), "d", "app.img") in w, w

    def test_auto_on_a_directory_says_it_writes_nothing(self, app):
        (app / "d").mkdir()
        r = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE="d")
        assert (r.rc, r.out) == (0, "app ran\n"), r
        [w] = r.warnings()
        assert "AUTO writes no archive" in w and "fresh one" not in w, w
        assert os.listdir(app / "d") == []

    def test_share_through_a_file(self, app):
        (app / "notes.txt").write_text("mine\n")
        r = run_python(["app.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE="notes.txt/x.img")
        assert (r.rc, r.out) == (0, "app ran\n"), r
        [w] = r.warnings()
        assert f"{app / 'notes.txt'} is a file, not a directory" in w, w

    def test_a_symbolic_link_names_its_file(self, app):
        (app / "real.img").write_bytes(b"")
        os.symlink("real.img", app / "link.img")
        r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE="link.img")
        [w] = r.warnings()
        assert f"name the file itself: {app / 'real.img'}" in w, w


def test_auto_in_a_directory_others_may_write(app, tmp_path):
    """An archive there would be refused by every run: AUTO writes none,
    says so once a run, and what to do."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    img = shared / "app.img"
    for _ in range(2):
        r = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img))
        assert (r.rc, r.out) == (0, "app ran\n"), r
        [w] = r.warnings()
        assert "writable by others" in w and "PYCDSARCHIVE" in w, w
        assert not img.exists()
    # An archive already there (written by hand): one warning, no rewrite.
    r = run_python(["app.py"], cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
    assert r.rc == 0 and img.exists(), r
    before = os.stat(img).st_mtime_ns
    r = run_python(["app.py"], cwd=app, PYCDSMODE="AUTO", PYCDSARCHIVE=str(img))
    [w] = r.warnings()
    assert "AUTO writes no archive there" in w and "chmod o-w" in w, w
    assert os.stat(img).st_mtime_ns == before
