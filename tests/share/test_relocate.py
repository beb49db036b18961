"""An archive serves a tree that moved since the dump (issue #25: a venv
built at one path and run at another), when its files are the dumped ones;
whatever plain import does differently at the new place is still done."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support import clean_env, installed, run_python, settle

MAIN = textwrap.dedent("""\
    import importlib.resources, inspect, sys, traceback
    import appkit.core, libkit, libkit.tools
    for m in (appkit, appkit.core, libkit, libkit.tools):
        print(m.__name__, m.__file__, m.__cached__, m.__spec__.origin,
              getattr(m, "__path__", None))
    print(appkit.core.area.__code__.co_filename)
    print(inspect.getsource(libkit.tools.shout))
    print(importlib.resources.files("appkit").joinpath("data.txt").read_text())
    print(libkit.tools.shout("hi"))
    try:
        appkit.core.fail()
    except ZeroDivisionError:
        traceback.print_exc(file=sys.stdout)
    """)


def make_tree(root):
    """app/ (main.py, package appkit) and lib/ (package libkit, on
    PYTHONPATH), installed with valid .pyc files an hour old."""
    app, lib = root / "app", root / "lib"
    (app / "appkit").mkdir(parents=True)
    (lib / "libkit").mkdir(parents=True)
    (app / "main.py").write_text(MAIN)
    (app / "appkit" / "__init__.py").write_text("NAME = 'appkit'\n")
    (app / "appkit" / "data.txt").write_text("data of appkit\n")
    (app / "appkit" / "core.py").write_text(
        "def area(r):\n    return 3 * r * r\n\ndef fail():\n    return 1 / 0\n")
    (lib / "libkit" / "__init__.py").write_text("from . import tools\n")
    (lib / "libkit" / "tools.py").write_text(
        "def shout(s):\n    return s.upper() + '!'\n")
    for f in ("appkit/__init__.py", "appkit/core.py"):
        installed(app / f)
    for f in ("libkit/__init__.py", "libkit/tools.py"):
        installed(lib / f)
    return root


MODULES = {"appkit", "appkit.core", "libkit", "libkit.tools"}


def run(root, **env):
    return run_python([str(root / "app" / "main.py")], cwd=root / "app",
                      PYTHONPATH=str(root / "lib"), **env)


@pytest.fixture
def dumped(tmp_path):
    """A tree dumped at tmp_path/a, and its archive (outside the tree)."""
    a = make_tree(tmp_path / "a")
    settle(a)
    img = tmp_path / "app.img"
    d = run(a, PYCDSMODE="DUMP", PYCDSARCHIVE=str(img))
    assert d.rc == 0 and img.exists(), d
    s = run(a, PYCDSMODE="SHARE", PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
    assert MODULES <= set(s.served()), s
    return a, img


def share_as_plain(root, img, **env):
    share = run(root, PYCDSMODE="SHARE", PYCDSARCHIVE=str(img), PYCDSVERBOSE=1, **env)
    plain = run(root)
    assert plain.rc == 0 and str(root) in plain.out, plain
    assert (share.rc, share.out) == (plain.rc, plain.out), share
    assert not share.warnings(), share.err
    return share


class TestMovedTree:
    def test_renamed_tree_is_served(self, dumped, tmp_path):
        a, img = dumped
        b = tmp_path / "b"
        os.rename(a, b)
        share = share_as_plain(b, img)
        assert MODULES <= set(share.served()), share
        assert str(a) not in share.out

    def test_copy_with_times_is_served(self, dumped, tmp_path):
        a, img = dumped
        b = tmp_path / "elsewhere" / "b"
        shutil.copytree(a, b)            # copy2: times kept, as cp -a
        share = share_as_plain(b, img)
        assert MODULES <= set(share.served()), share

    def test_copy_without_times_is_served_by_source_hash(self, dumped, tmp_path):
        a, img = dumped
        b = tmp_path / "b"
        shutil.copytree(a, b, copy_function=shutil.copyfile)
        shutil.rmtree(a)
        share = share_as_plain(b, img)
        assert MODULES <= set(share.served()), share

    @pytest.mark.parametrize("check", ["mtime", "unchecked"])
    def test_a_file_changed_at_the_new_place_is_not_served(self, dumped, tmp_path, check):
        a, img = dumped
        b = tmp_path / "b"
        shutil.copytree(a, b)
        tools = b / "lib" / "libkit" / "tools.py"
        st = os.stat(tools)
        # Same size and times: only its bytes differ.
        tools.write_text(tools.read_text().replace("'!'", "'?'"))
        os.utime(tools, ns=(st.st_atime_ns, st.st_mtime_ns))
        shutil.rmtree(b / "lib" / "libkit" / "__pycache__")
        # (PYCDSCHECK=unchecked trusts the files the dump saw, not a copy.)
        share = share_as_plain(b, img, PYCDSCHECK=check)
        assert "HI?" in share.out
        served = set(share.served())
        assert "libkit.tools" not in served and {"appkit", "libkit"} <= served, share

    def test_shadowing_at_the_new_place_is_honoured(self, dumped, tmp_path):
        a, img = dumped
        b = tmp_path / "b"
        os.rename(a, b)
        # A libkit earlier on the search path (the script's directory).
        shutil.copytree(b / "lib" / "libkit", b / "app" / "libkit")
        (b / "app" / "libkit" / "tools.py").write_text(
            "def shout(s):\n    return 'shadowed ' + s\n")
        share = share_as_plain(b, img)
        assert "shadowed hi" in share.out
        assert "libkit.tools" not in share.served()
        assert {"appkit", "appkit.core"} <= set(share.served()), share

    def test_another_layout_is_not_taken_for_a_move(self, dumped, tmp_path):
        a, img = dumped
        b = tmp_path / "b"
        os.rename(a, b)
        # libkit now a module of the same content's first file, not a package.
        shutil.rmtree(b / "lib" / "libkit")
        (b / "lib" / "libkit.py").write_text("from appkit import core as tools\n")
        r = run(b, PYCDSMODE="SHARE", PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
        plain = run(b)
        assert (r.rc, r.out, r.err.count("Traceback")) == \
            (plain.rc, plain.out, plain.err.count("Traceback")), r
        assert "libkit" not in r.served()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_read_only_mount_at_another_path_is_served(dumped, tmp_path):
    """The container recipe: the tree dumped at one path, mounted read-only
    at another (plain import can write no .pyc there)."""
    a, img = dumped
    ro = tmp_path / "ro"
    ro.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    runs = " && ".join(
        f"{{ {env} {sys.executable} {ro}/app/main.py > {out}/{name}.out 2> {out}/{name}.err; "
        f"echo $? > {out}/{name}.rc; }}"
        for name, env in (("share", f"PYCDSMODE=SHARE PYCDSARCHIVE={img} PYCDSVERBOSE=1"),
                          ("plain", "")))
    script = (f"mount --bind -o ro {a} {ro} 2>/dev/null || "
              f"{{ mount --bind {a} {ro} && mount -o remount,bind,ro {ro}; }} && "
              f"cd {ro}/app && {runs}")
    env = clean_env(PYTHONPATH=f"{ro}/lib")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    got = {name: [(out / f"{name}.{ext}").read_text() for ext in ("rc", "out")]
           for name in ("share", "plain")}
    assert got["share"] == got["plain"] and str(ro) in got["plain"][1], got
    err = (out / "share.err").read_text()
    served = {line.split(" ", 2)[2] for line in err.splitlines()
              if line.startswith("[pycds] served ")}
    assert MODULES <= served, err
    assert "[pycds] warning" not in err, err
