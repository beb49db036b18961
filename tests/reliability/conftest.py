"""Fixtures of the reliability tests: the fuzz program's archive, and a
directory for archives (the helpers are in support.reliability)."""

import os
import shutil

import pytest

from support import run_python
from support.reliability import PROGRAM, dump, make_program, share


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
