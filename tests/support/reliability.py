"""Helpers of the reliability tests: the program under test, its archive,
and the oracle every refusal must satisfy (plain stdout and exit code, and
exactly one ``[pycds] warning: archive <path> ignored: <reason>`` line).
Their fixtures are in tests/reliability/conftest.py."""

import os

from support import load_script, run_python

fuzz_archive = load_script("fuzz_archive")

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
