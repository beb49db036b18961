"""The coverage-guided fuzzer's findings and seeds, replayed (issue 26,
target 4; scripts/fuzz_coverage.py, docs/reliability.md section 13).

Each file of fuzz_corpus/cpython-3.X/ is one fuzzer input of that CPython
(its first byte the mode: raw, re-signed with PYCDSVERIFY=1, re-signed
read by the index only), run by the fuzzer's own harness in a child
interpreter: it must end normally.  Another version, or another build of
the same one (aarch64 Debian's 3.11.2), refuses the inputs as foreign,
which is checked too: there the replays exercise that refusal only.  Named findings, each fixed:

* 3.11 refcount-0-bad-free: a module code object's reference count 0,
  freed by the program (PYCDSVERIFY=1 now checks every count);
* 3.11 external-target-misaligned: a static-object reference inside the
  interpreter but not at an object (the relocation pass now refuses it);
* 3.11 entry-length-5, marshal-huge-list: inputs the re-signing itself
  took minutes or gigabytes on;
* 3.13 bytecode-instrumented-opcode, bytecode-cache-unit: inputs the 3.13
  fuzzing crashed on (a corrupted pymalloc free list; a SEGV reading
  co_code, whose deopt_code follows NULL _co_monitoring and zeroes caches
  past the end of its bytes), holding an instrumented opcode and a CACHE
  unit as an instruction (PYCDSVERIFY=1 now checks the bytecode).

fuzz_corpus/minimized/cpython-3.X.tar.gz is a whole run's corpus of that
CPython minimised (``fuzz_coverage.py --minimize``: the fewest inputs with
its coverage), replayed in one child per archive.
"""

import os
import subprocess
import sys
import tarfile

import pytest

from support import ROOT, clean_env, load_script

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_corpus")
INPUTS = sorted(f"{d}/{n}" for d in os.listdir(CORPUS) if d.startswith("cpython-")
                for n in os.listdir(os.path.join(CORPUS, d)))
MINIMIZED = sorted(os.listdir(os.path.join(CORPUS, "minimized")))
HERE = "cpython-%d.%d" % sys.version_info[:2]

REPLAY = r"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location(
    "fuzz_coverage", os.path.join(sys.argv[1], "scripts", "fuzz_coverage.py"))
fuzz_coverage = importlib.util.module_from_spec(spec)
sys.modules["fuzz_coverage"] = fuzz_coverage
spec.loader.exec_module(fuzz_coverage)
h = fuzz_coverage.Harness(os.getcwd())
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        h.one(f.read())
    print("done", os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path),
          flush=True)
"""


def test_the_corpus_holds_the_findings():
    assert {"cpython-3.11/refcount-0-bad-free", "cpython-3.11/external-target-misaligned",
            "cpython-3.13/bytecode-instrumented-opcode",
            "cpython-3.13/bytecode-cache-unit"} <= set(INPUTS)
    for d in ("cpython-3.11", "cpython-3.13"):
        assert {f"{d}/seed-0", f"{d}/seed-1", f"{d}/seed-2"} <= set(INPUTS)


@pytest.mark.parametrize("name", INPUTS)
def test_replay(name, tmp_path):
    p = subprocess.run([sys.executable, "-c", REPLAY, ROOT, os.path.join(CORPUS, name)],
                       capture_output=True, text=True, timeout=300, env=clean_env(),
                       cwd=str(tmp_path))
    assert (p.returncode, p.stdout) == (0, f"done {name}\n"), p.stderr[-3000:]


def test_the_minimised_corpora_are_kept():
    assert {"cpython-3.11.tar.gz", "cpython-3.13.tar.gz"} <= set(MINIMIZED)


@pytest.mark.parametrize("name", MINIMIZED)
def test_replay_minimised(name, tmp_path):
    with tarfile.open(os.path.join(CORPUS, "minimized", name)) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(tmp_path, members=members,
                       **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    paths = sorted(str(tmp_path / m.name) for m in members)
    assert len(paths) > 100
    p = subprocess.run([sys.executable, "-c", REPLAY, ROOT, *paths], capture_output=True,
                       text=True, timeout=600, env=clean_env(), cwd=str(tmp_path))
    done = p.stdout.splitlines()
    assert (p.returncode, len(done)) == (0, len(paths)), \
        (paths[len(done):len(done) + 1], p.stderr[-3000:])


SEEDS_LOAD = r"""
import sys
from pycds import _archive, _nativeapi as N
from pycds.errors import ForeignArchiveError
try:
    idx = _archive.Index.open(sys.argv[1])
except ForeignArchiveError as e:
    print("foreign:", e)
    raise SystemExit(0)
na = N.NativeArchive(idx.fd, idx.header, idx.meta.get("layout", ""), verify=True)
print(sorted(e.name for e in idx.entries()), {na.load(e).co_name for e in idx.entries()})
"""


def load_seed(tmp_path, blob):
    img = tmp_path / "seed.img"
    img.write_bytes(blob)
    os.chmod(img, 0o644)
    p = subprocess.run([sys.executable, "-c", SEEDS_LOAD, str(img)], capture_output=True,
                       text=True, timeout=120, env=clean_env(), cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def assert_seed_served(out):
    names, loaded = out.rsplit("] ", 1)
    assert {"'fuzzseed'", "'fuzzseed.mod'"} <= set(names.strip("[").split(", ")), out
    assert loaded == "{'<module>'}\n", out


@pytest.mark.skipif(not os.path.isdir(os.path.join(CORPUS, HERE)),
                    reason="no seeds of this CPython in the corpus")
def test_the_seeds_load(tmp_path):
    # The seeds are served as they are: what the fuzzer mutates is a good
    # archive.  They were made by one build of this CPython version (the
    # fuzzing machine's x86-64 one); any other build (aarch64 Debian's
    # 3.11.2, another patch release) refuses them as made by another
    # interpreter, as it must, and then a seed made here the fuzzer's way
    # (fuzz_coverage.seed_archive) is served instead.
    with open(os.path.join(CORPUS, HERE, "seed-1"), "rb") as f:
        out = load_seed(tmp_path, f.read()[1:])
    if out.startswith("foreign:"):
        assert "made by another interpreter (version " in out, out
        fuzz_coverage = load_script("fuzz_coverage")
        work = tmp_path / "seedwork"
        work.mkdir()
        out = load_seed(tmp_path, fuzz_coverage.seed_archive(sys.executable, str(work)))
    assert_seed_served(out)
