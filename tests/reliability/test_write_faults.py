"""Faults while writing (issue 26, target 2), reduced: every file operation
a DUMP or AUTO write makes in the archive's directory fails in turn
(ENOSPC, EINTR, a short write) or is where the process is SIGKILLed, and
ten dumps are killed at random moments.  After each: the program's output
and status are plain's, the archive is the old one with one warning or a
complete new one (the new one after EINTR or a short write), SHARE serves
it without a warning, and no temporary file is left.  The whole run (EIO
too, 100 random kills) is scripts/write_faults.py; docs/reliability.md
has its figures."""

import os
import sys

import pytest

from support import load_script

write_faults = load_script("write_faults")


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return write_faults.build_shim(str(tmp_path_factory.mktemp("shim")))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["DUMP", "AUTO"])
def test_every_write_operation_fails_in_turn(shim, tmp_path, mode):
    bench = write_faults.Bench(sys.executable, str(tmp_path), shim, mode)
    counts = bench.census()
    # What the writer does, so that a change to it cannot leave this test
    # injecting nothing.
    assert {"open", "fallocate", "pwrite", "link", "rename"} <= set(counts), counts
    plan = write_faults.faults(counts, kinds=("ENOSPC", "EINTR", "SHORT", "KILL"))
    failed = write_faults.run_faults(bench, plan, log=lambda *a: None)
    assert failed == {}


@pytest.mark.slow
def test_dumps_killed_at_random_moments(shim, tmp_path):
    bench = write_faults.Bench(sys.executable, str(tmp_path), shim, "DUMP")
    failed, span = write_faults.random_kills(bench, 10, seed=1, log=lambda *a: None)
    assert failed == {}
    assert span > 0


def test_the_shim_makes_the_fault_it_is_asked_for(shim, tmp_path):
    # The oracle's own check: an ENOSPC on the first pwrite leaves the old
    # archive and says so once; without the shim the same run writes.
    bench = write_faults.Bench(sys.executable, str(tmp_path), shim, "DUMP")
    bench.reset()
    r = bench.run([], **bench.shim_env(fault="pwrite:1:ENOSPC"))
    said = write_faults.warnings(r)
    assert len(said) == 1 and "No space left on device" in said[0], r.stderr
    assert bench.state() == "old" and not bench.leftovers()
    r = bench.run([], **bench.shim_env())
    assert not write_faults.warnings(r) and bench.state() == "new"
    assert os.path.exists(bench.archive)
