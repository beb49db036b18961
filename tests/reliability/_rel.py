"""Helpers of the reliability tests: the program under test, its archive,
and the oracle every refusal must satisfy (plain stdout and exit code, and
exactly one ``[pycds] warning: archive <path> ignored: <reason>`` line)."""

import os
import sys

from conftest import ROOT, run_python

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import fuzz_archive  # noqa: E402  (scripts/ is not a package)

PROGRAM = ["prog.py"]


def make_program(base):
    """The fuzz program (stdlib + a local package, exit status 3)."""
    return fuzz_archive.make_workdir(str(base))


def refused(run, plain, path):
    """Assert run behaved as plain with one 'archive ... ignored' warning;
    returns the reason."""
    assert (run.rc, run.out) == (plain.rc, plain.out), run
    extra = [ln for ln in run.err.splitlines() if ln not in plain.err.splitlines()]
    assert len(extra) == 1, run
    prefix = f"[pycds] warning: archive {path} ignored: "
    assert extra[0].startswith(prefix), run
    return extra[0][len(prefix):]


def same_as_plain(run, plain):
    """Assert run printed and returned what plain did, with no warning."""
    assert (run.rc, run.out) == (plain.rc, plain.out), run
    assert not run.warnings(), run


def share(cwd, archive, args=PROGRAM, **env):
    return run_python(args, cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=archive, **env)


def dump(cwd, archive, args=PROGRAM, **env):
    r = run_python(args, cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=archive, **env)
    assert os.path.exists(archive), r
    return r


# ---- fixtures (imported by the test modules) --------------------------------

import shutil  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def base_archive(tmp_path_factory):
    """(workdir, archive path, archive bytes, plain Run, names served)."""
    d = tmp_path_factory.mktemp("rel")
    work = make_program(d / "w")
    img = str(d / "base.img")
    dump(work, img)
    plain = run_python(PROGRAM, cwd=work)
    assert plain.rc == 3 and plain.out, plain
    s = share(work, img, PYCDSVERBOSE=1)
    assert (s.rc, s.out) == (plain.rc, plain.out), s
    served = set(s.served())
    assert {"fuzzpkg", "fuzzpkg.shapes", "json", "fractions"} <= served, s
    with open(img, "rb") as f:
        data = f.read()
    return work, img, data, plain, served


@pytest.fixture
def archive_dir(tmp_path):
    """A 0755 directory for archives."""
    d = tmp_path / "a"
    d.mkdir()
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
