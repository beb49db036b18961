"""Coverage-guided fuzzing of what reads an archive, with atheris (libFuzzer).

Run with an interpreter that has pycds and atheris installed; for coverage
of the native loader and sanitizer reports, pycds built with clang,
``PYCDS_SANITIZE=address,undefined,fuzzer`` (docs/reliability.md), and
``--asan``::

    python scripts/fuzz_coverage.py --asan --runs 1000000 --corpus DIR [--rounds 20]

One input is one archive, its first byte choosing how it is read:

* ``0`` *raw*: the bytes as they are, opened as SHARE opens an archive
  (``pycds._archive.Index``), then every module loaded by the native
  loader (``pycds._nativeapi.NativeArchive``) without ``PYCDSVERIFY``;
  the checksums must refuse any damage;
* ``1`` *re-signed*: the bytes taken apart and every checksum recomputed
  (``fuzz_archive.Model``), then opened and loaded with ``PYCDSVERIFY=1``,
  so that the structural checks behind the checksums are reached;
* ``2`` *re-signed, index only*: the same, without ``PYCDSVERIFY``, read
  only by the index (lookups, entries, chunk-table and chunk checksums),
  which must survive any well-signed content.

An exception is a refusal, as the finder takes it (``pycds.share``); a
crash, a sanitizer report, a hang (``-timeout``) or a leak of the
process's memory (``-rss_limit_mb``) is a finding, written by libFuzzer as
``crash-*``/``timeout-*``/``oom-*``.  A loaded archive keeps its mapping
for the life of the process (its code objects point into it), so the run is
split into ``--rounds`` processes sharing the corpus.  ``--seed-only``
writes the seed corpus (a small real archive in the three modes) and
stops; ``--minimize DIR`` merges the corpus into DIR (libFuzzer's
``-merge=1``: the fewest inputs with the same coverage).
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

RAW, RESIGNED, INDEX_ONLY = 0, 1, 2

# A module whose constants are of every type an archive holds.
SEED_MODULE = '''\
"""seed module"""
import sys
BIG = 1 << 100
CONSTS = (1, -2.5, 3j, b"bytes", "str", "\\u00e9t\\u00e9", "\\U0001f600", None, True, ...,
          frozenset({1, "a", (2, 3)}), (1, (2, (3,))))


class Shape:
    sides = 0

    def __init__(self, name, *args, scale=1.0, **kw):
        self.name = name
        self.args = args

    def area(self):
        return [x * x for x in self.args if x in {1, 2, 3}]


def outer(a, /, b, *, c=2):
    def inner(d):
        nonlocal a
        a += d
        return a + b + c
    return inner


async def coro():
    return 1


def gen():
    try:
        yield from range(3)
    except ValueError as e:
        raise RuntimeError(str(e)) from e
    finally:
        pass


lam = lambda x: x + BIG  # noqa: E731
'''


def sanitizer_env(python):
    """The environment a sanitizer build runs in: atheris's ASan runtime
    (with libFuzzer) preloaded, every report fatal, Python's objects taken
    from malloc (``PYTHONMALLOC=malloc``: ASan then sees a write into a
    freed or overrun object where it happens, not when pymalloc next reads
    its free list), and an allocation of more than 1 GiB failing
    (MemoryError, a refusal) rather than counted as a finding: the
    re-signing's marshal reads entries that may ask for any size."""
    where = subprocess.run([python, "-c", "import atheris; print(atheris.path())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return {"LD_PRELOAD": os.path.join(where, "asan_with_fuzzer.so"),
            "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:"
                            "max_allocation_size_mb=1024",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "PYTHONMALLOC": "malloc"}


def seed_archive(python, workdir):
    """A DUMP of a program importing a package holding SEED_MODULE;
    returns the archive's bytes."""
    pkg = os.path.join(workdir, "fuzzseed")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("from . import mod\nfrom .mod import Shape\n")
    with open(os.path.join(pkg, "mod.py"), "w") as f:
        f.write(SEED_MODULE)
    img = os.path.join(workdir, "seed.img")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    env.update(PYCDSMODE="DUMP", PYCDSARCHIVE=img)  # (a sanitizer build: inherited)
    subprocess.run([python, "-c", "import fuzzseed"], cwd=workdir, env=env,
                   check=True, timeout=120)
    with open(img, "rb") as f:
        return f.read()


def resign(body):
    """``body`` with every checksum recomputed, or None where it cannot be
    taken apart."""
    import fuzz_archive
    try:
        return fuzz_archive.Model(body).to_bytes()
    except Exception:
        return None


class Harness:
    """The per-input work: ``one(data)``."""

    def __init__(self, workdir):
        from pycds import _archive, _nativeapi
        self._archive, self._native = _archive, _nativeapi
        self.workdir = workdir
        self.n = 0

    def write(self, blob):
        # A new file each time: a loaded archive keeps its mapping, which
        # must not see the next input's bytes.  Unlinked after reading.
        self.n += 1
        self.path = os.path.join(self.workdir, f"input{self.n}.img")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, blob)
        finally:
            os.close(fd)

    def one(self, data):
        if not data:
            return
        mode, body = data[0] % 3, data[1:]
        if mode != RAW:
            body = resign(body)
            if body is None:
                return
        self.write(body)
        try:
            idx = self._archive.Index.open(self.path)
        except Exception:
            return
        finally:
            os.unlink(self.path)
        try:
            if mode == INDEX_ONLY:
                self.read_index(idx)
            else:
                self.load_all(idx, verify=mode == RESIGNED)
        except Exception:
            pass
        finally:
            idx.close()

    def read_index(self, idx):
        entries = idx.entries()
        for e in entries:
            idx.lookup(e.name)
            idx.chunk_intact(e)
        idx.lookup("no.such.module")
        idx.chunk_table_intact()

    def load_all(self, idx, verify):
        entries = idx.entries()
        na = self._native.NativeArchive(idx.descriptor(), idx.header,
                                        idx.meta.get("layout", ""), verify=verify)
        loaded = 0
        try:
            for e in entries:
                code = na.load(e)
                loaded += 1
                walk(code)
        finally:
            if not loaded:
                na.close()


def walk(obj, depth=0):
    """Touch what a loaded code object holds, as running it would."""
    if depth > 50:
        return
    if type(obj).__name__ == "code":
        for name in ("co_name", "co_qualname", "co_filename", "co_names",
                     "co_varnames", "co_freevars", "co_cellvars", "co_code",
                     "co_linetable", "co_exceptiontable", "co_lnotab"):
            v = getattr(obj, name, None)
            if v is not None:
                hash(v)
        list(obj.co_lines())
        if hasattr(obj, "co_positions"):
            list(obj.co_positions())
        for c in obj.co_consts:
            walk(c, depth + 1)
    elif isinstance(obj, (tuple, frozenset)):
        for c in obj:
            walk(c, depth + 1)
    else:
        repr(obj)


def write_seeds(python, corpus, workdir):
    blob = seed_archive(python, workdir)
    os.makedirs(corpus, exist_ok=True)
    for mode in (RAW, RESIGNED, INDEX_ONLY):
        with open(os.path.join(corpus, f"seed-{mode}"), "wb") as f:
            f.write(bytes([mode]) + blob)
    return len(blob)


def fuzz_main(argv):
    """Inside one round: libFuzzer's own command line (argv)."""
    import atheris
    import resource
    # Each loaded archive keeps its descriptor too.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with atheris.instrument_imports(include=["pycds"]):    # not the re-signing
        import pycds._archive  # noqa: F401
        import pycds._nativeapi  # noqa: F401
        import fuzz_archive  # noqa: F401
    # The parent's directory (libFuzzer exits without running atexit), or
    # one of its own when run alone.
    harness = Harness(os.environ.get(WORK_VAR) or work_dir())
    atheris.Setup(argv, harness.one)
    atheris.Fuzz()


WORK_VAR = "PYCDS_COVFUZZ_WORK"
# An executable that runs this harness: libFuzzer's -merge=1 starts its
# inner processes as argv[0] with its own flags.
SELF_VAR = "PYCDS_COVFUZZ_SELF"


def report(lines, path):
    """Print a failed round's finding: the sanitizer's or libFuzzer's report
    from its first line (the top of the stack), the whole output kept at
    ``path``."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    first = next((i for i, ln in enumerate(lines)
                  if "ERROR: " in ln or "runtime error:" in ln), max(0, len(lines) - 60))
    print("\n".join(lines[first:first + 60]), flush=True)
    print(f"(the round's whole output: {path})", flush=True)


def work_dir():
    """A private directory for the inputs' files (tmpfs where there is one:
    a file per input)."""
    work = tempfile.mkdtemp(prefix="pycds-covfuzz-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(work, 0o700)
    return work


def timeouts_unreproduced(me, arts, before, timeout):
    """True if the round stopped only on timeouts that do not come back
    when the input runs alone (the machine was busy): each is renamed
    ``slow-*`` and the run goes on."""
    new = sorted(set(os.listdir(arts)) - before)
    if not new or not all(n.startswith("timeout-") for n in new):
        return False
    for n in new:
        again = subprocess.run(me + [f"-timeout={timeout}", os.path.join(arts, n)],
                               capture_output=True)
        if again.returncode != 0:
            return False
        os.rename(os.path.join(arts, n), os.path.join(arts, "slow-" + n[len("timeout-"):]))
        print(f"  {n}: not a hang when run alone (the machine was busy)", flush=True)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--corpus", required=True, help="corpus directory (grows)")
    ap.add_argument("--runs", type=int, default=1_000_000, help="executions in all")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--artifacts", default=None, help="where findings go (default: corpus/..)")
    ap.add_argument("--timeout", type=int, default=30, help="s per input")
    ap.add_argument("--seed-only", action="store_true")
    ap.add_argument("--minimize", metavar="DIR")
    ap.add_argument("--asan", action="store_true",
                    help="pycds is a PYCDS_SANITIZE build: preload atheris's ASan runtime")
    args, rest = ap.parse_known_args(argv)
    if rest and rest[0] == "--libfuzzer":
        return fuzz_main([os.environ.get(SELF_VAR, sys.argv[0])] + rest[1:])
    corpus = os.path.abspath(args.corpus)
    if args.asan:
        os.environ.update(sanitizer_env(args.python))
    if not os.path.isdir(corpus) or not os.listdir(corpus):
        seeds = tempfile.mkdtemp(prefix="pycds-covseed-")
        try:
            n = write_seeds(args.python, corpus, seeds)
        finally:
            shutil.rmtree(seeds, ignore_errors=True)
        print(f"seed archive: {n} bytes", flush=True)
    if args.seed_only:
        return 0
    work = os.environ[WORK_VAR] = work_dir()
    try:
        return run_rounds(args, corpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def self_command(me, where):
    """A shell script in ``where`` (not the work directory: /dev/shm may be
    mounted noexec) that runs ``me`` with the arguments it is given (set as
    the harness's argv[0])."""
    path = os.path.join(where, "harness.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in me) + ' "$@"\n')
    os.chmod(path, 0o700)
    os.environ[SELF_VAR] = path
    return path


def run_rounds(args, corpus):
    arts = os.path.abspath(args.artifacts or os.path.dirname(corpus)) + "/"
    me = [args.python, os.path.abspath(__file__), "--corpus", corpus, "--libfuzzer"]
    if args.minimize:
        os.makedirs(args.minimize, exist_ok=True)
        where = tempfile.mkdtemp(prefix="pycds-covself-")
        try:
            me = [self_command(me, where)]
            return subprocess.run(me + ["-merge=1", f"-artifact_prefix={arts}",
                                        os.path.abspath(args.minimize), corpus]).returncode
        finally:
            shutil.rmtree(where, ignore_errors=True)
    per_round = -(-args.runs // args.rounds)
    done, status = 0, 0
    for r in range(args.rounds):
        before = set(os.listdir(arts))
        p = subprocess.run(me + [f"-runs={per_round}", f"-timeout={args.timeout}",
                                 "-rss_limit_mb=4096", "-malloc_limit_mb=2048",
                                 f"-artifact_prefix={arts}",
                                 "-print_final_stats=1", corpus],
                           stderr=subprocess.PIPE, text=True)
        tail = p.stderr.splitlines()
        stats = [ln for ln in tail if ln.startswith(("stat::", "Done "))]
        print(f"round {r + 1}/{args.rounds}: rc={p.returncode} " + "; ".join(stats),
              flush=True)
        if p.returncode != 0 and not timeouts_unreproduced(me, arts, before, args.timeout):
            report(tail, os.path.join(arts, f"round-{r + 1}.log"))
            status = 1
            break
        done += per_round
    print(f"executions: {done}; corpus: {len(os.listdir(corpus))} inputs; "
          f"findings: {'yes' if status else 'none'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
