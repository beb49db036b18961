"""Issue 3, part 3: archive fuzzing, reduced (the full form is
scripts/fuzz_archive.py, results in docs/reliability.md).

Two parts:
* ~70 mutants run as the real program under SHARE, one interpreter each,
  with the full oracle (no crash, no hang, plain stdout and exit code, at
  most one warning line of the right form);
* 400 more mutants opened and loaded (every module, not executed) in-process
  by a few child interpreters, 100 per child, to reach the native checks
  cheaply; a crashing batch fails the test with its mutants' labels.
"""

import json
import os
import random
import subprocess
import sys

from support import clean_env, load_script

fuzz_archive = load_script("fuzz_archive")

SEED = 20261129


def test_fuzz_program_runs(base_archive):
    work, _, data, plain, served = base_archive
    rng = random.Random(SEED)
    mutants = fuzz_archive.mutations(data, rng, 40, 30, served)
    results = fuzz_archive.fuzz(sys.executable, mutants, str(work), jobs=2, timeout=60)
    bad = [(r.verdict, r.label, r.detail) for r in results if not r.ok]
    assert bad == []
    s = fuzz_archive.summarize(results)
    assert s["cases"] >= 70
    # most mutants touch used parts and are refused; each refusal was one line
    assert s["refused"] >= 0.6 * s["cases"], s


BATCH_CHILD = r"""
import json, sys
from pycds import _archive, _nativeapi as N, errors
out = []
for path in sys.argv[1:]:
    try:
        idx = _archive.Index.open(path)
        try:
            na = N.NativeArchive(idx.fd, idx.header, idx.meta.get("layout", ""),
                                 verify=True)
            for e in idx.entries():
                na.load(e)
            out.append("loaded")
        finally:
            idx.close()
    except (errors.ArchiveFormatError, ImportError, OverflowError, TypeError) as e:
        out.append("refused")
print(json.dumps(out))
"""


def test_fuzz_in_process_batches(base_archive, archive_dir):
    _, _, data, _, served = base_archive
    rng = random.Random(SEED + 1)
    mutants = fuzz_archive.mutations(data, rng, 150, 250, served)
    paths = []
    for i, (label, blob) in enumerate(mutants):
        p = str(archive_dir / f"m{i}.img")
        with open(p, "wb") as f:
            f.write(blob)
        os.chmod(p, 0o644)
        paths.append(p)
    verdicts = []
    for start in range(0, len(paths), 100):
        batch = paths[start:start + 100]
        # cwd: not the checkout (-c puts the cwd first on sys.path)
        proc = subprocess.run([sys.executable, "-c", BATCH_CHILD, *batch],
                              capture_output=True, text=True, timeout=300,
                              env=clean_env(), cwd=str(archive_dir))
        labels = [label for label, _ in mutants[start:start + 100]]
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:], labels)
        verdicts += json.loads(proc.stdout)
    assert len(verdicts) == len(mutants)
    # No crash above is the point.  Loading every module reaches nearly all
    # damage: what loads is damage to unused bytes (padding) or a re-signed
    # change that is still a well-formed archive (a constant pointing at
    # None, a string not re-interned, an empty index).
    loaded = [label for (label, _), v in zip(mutants, verdicts) if v == "loaded"]
    assert len(loaded) < 0.1 * len(mutants), loaded
