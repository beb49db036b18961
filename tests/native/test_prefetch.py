"""The read-ahead thread (native/archive/loader/prefetch.c): stage 1 of the modules after
the one being imported runs on another CPU.  Whatever it does, every module
must come out exactly as without it, a damaged chunk must be reported by
the importing thread, and fork() must leave neither a stuck module nor a
thread behind."""

import os
import platform
import random
import sys

import pytest

from pycds import _archive
from pycds import _nativeapi as N
from pycds.errors import NativeError

from support import flip_bits, run_python
from test_archive import archive_of, same_code

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
# A sanitizer build's runtime (docs/reliability.md) replaces glibc's malloc.
SANITIZER_MALLOC = "libasan" in os.environ.get("LD_PRELOAD", "")


def _smaps_is_the_hosts():
    """Whether /proc/self/smaps lists mappings /proc/self/maps does not:
    under qemu-user (scripts/aarch64_check.sh) maps is emulated, the
    guest's, and smaps is the host process's, qemu's own malloc arenas
    (one per guest thread, kept) and code buffer included."""
    def ranges(path):
        with open(path) as f:
            return {w[0] for w in map(str.split, f)
                    if w and w[0].count("-") == 1 and ":" not in w[0]}
    try:
        return bool(ranges("/proc/self/smaps") - ranges("/proc/self/maps"))
    except OSError:
        return False


def stdlib_codes(n=80):
    """n stdlib modules compiled from source: name -> code object."""
    import sysconfig
    d = sysconfig.get_paths()["stdlib"]
    names = sorted(f for f in os.listdir(d) if f.endswith(".py") and f != "antigravity.py")
    out = {}
    for f in names[:n]:
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            out[f[:-3]] = compile(fh.read(), path, "exec")
    return out


@pytest.fixture(scope="module")
def codes():
    return stdlib_codes()


def load_all(index, arch, order):
    return {name: arch.load(index.lookup(name)) for name in order}


def wait_prefetched(arch, n=1, timeout=10.0):
    """Wait until the read-ahead thread has done n modules (it runs on
    another CPU; on a loaded machine it may need a moment)."""
    import time
    end = time.monotonic() + timeout
    while arch.prefetched() < n and time.monotonic() < end:
        time.sleep(0.01)
    return arch.prefetched()


class TestSameObjects:
    @pytest.mark.parametrize("order", ["dump", "reversed", "random"])
    def test_every_module_as_without_read_ahead(self, codes, tmp_path, order):
        names = list(codes)
        if order == "reversed":
            names.reverse()
        elif order == "random":
            random.Random(7).shuffle(names)
        index, arch = archive_of(codes, tmp_path)
        arch.set_prefetch(64 << 10)
        got = load_all(index, arch, names[:1])
        if TWO_CPUS and order == "dump":
            # the modules after the first in heap order get read ahead
            assert wait_prefetched(arch) >= 1
        got.update(load_all(index, arch, names[1:]))
        for name, code in codes.items():
            assert same_code(code, got[name]), name
        if not TWO_CPUS:
            assert arch.prefetched() == 0
        index.close()

    def test_with_the_deep_check(self, codes, tmp_path):
        """With PYCDSVERIFY=1 stage 1 keeps each chunk's relocation entries
        for the deep check of stage 2 (without it, they go once stage 1
        ends): chunks read ahead are checked, and come out the same."""
        index, _ = archive_of(codes, tmp_path)
        arch = N.NativeArchive(index.fd, index.header, index.meta["layout"],
                               verify=True, prefetch=1 << 20)
        names = list(codes)
        got = load_all(index, arch, names[:1])
        if TWO_CPUS:
            assert wait_prefetched(arch) >= 1
        got.update(load_all(index, arch, names[1:]))
        for name, code in codes.items():
            assert same_code(code, got[name]), name
        index.close()

    def test_deep_check_is_set_before_the_first_load(self, codes, tmp_path):
        """Turning the deep check on later would find chunks read ahead
        without their relocation entries: refused, and the loads go on."""
        index, arch = archive_of(codes, tmp_path)
        names = list(codes)
        arch.load(index.lookup(names[0]))
        rc = N.lib.pycds_archive_set_verify(arch._a, 1)
        assert rc == -8     # PYCDS_E_STATE (native/archive/loader/archive.h)
        assert "before the first load" in N.ffi.string(N.lib.pycds_last_error()).decode()
        assert same_code(codes[names[1]], arch.load(index.lookup(names[1])))
        index.close()

    def test_off_reads_nothing_ahead(self, codes, tmp_path):
        index, arch = archive_of(codes, tmp_path)
        arch.set_prefetch(0)
        load_all(index, arch, list(codes))
        assert arch.prefetched() == 0
        index.close()

    def test_loading_twice_gives_the_same_object(self, codes, tmp_path):
        index, arch = archive_of(codes, tmp_path)
        arch.set_prefetch(1 << 20)
        first = load_all(index, arch, list(codes))
        again = load_all(index, arch, list(codes))
        assert all(first[n] is again[n] for n in codes)
        index.close()


class TestDamage:
    def test_damaged_chunk_is_reported_by_the_importer(self, codes, tmp_path):
        """The read-ahead thread meets the bad chunk first; the import of
        that module must still fail with the checksum message, and only
        that one."""
        names = list(codes)
        index, arch = archive_of(codes, tmp_path)
        victim = index.lookup(names[5])
        path = index.path
        index.close()
        flip_bits(path, index.header.heap_off + victim.chunk_off + victim.chunk_len // 2,
                  0x40)
        index = _archive.Index.open(path)
        arch = N.NativeArchive(index.fd, index.header, index.meta["layout"],
                               prefetch=1 << 20)
        for i, name in enumerate(names):
            entry = index.lookup(name)
            if i == 5:
                with pytest.raises(NativeError, match="checksum mismatch"):
                    arch.load(entry)
            else:
                assert same_code(codes[name], arch.load(entry))
        with pytest.raises(NativeError, match="failed to load before"):
            arch.load(index.lookup(names[5]))
        index.close()

    def test_damaged_chunk_table_refuses_the_archive(self, codes, tmp_path):
        index, _ = archive_of(codes, tmp_path)
        path, h = index.path, index.header
        index.close()
        flip_bits(path, h.chunks_off + _archive.CHUNK_REC + 3)
        index = _archive.Index.open(path)
        with pytest.raises(NativeError, match="chunk table checksum mismatch"):
            N.NativeArchive(index.fd, index.header, index.meta["layout"])
        index.close()

    def test_wrapping_chunk_refuses_the_archive(self, codes, tmp_path):
        """chunk_off + chunk_len wrapping past 2**64 to land inside the heap:
        a pread there would write before the reservation."""
        self._resigned_table(codes, tmp_path, 4, chunk_off=2 ** 64 - 4096, chunk_len=4160)

    def _resigned_table(self, codes, tmp_path, victim, **fields):
        index, _ = archive_of(codes, tmp_path)
        entries = index.entries()
        with open(index.path, "rb") as f:
            data = f.read()
        h = _archive.Header.unpack(data)
        index.close()
        for k, v in fields.items():
            setattr(entries[victim], k, v)
        table, h.chunks_sum = _archive.chunk_table(entries, h.archive_id, strict=False)
        blob = bytearray(data)
        blob[h.chunks_off:h.chunks_off + len(table)] = table
        blob[:_archive.HEADER_SIZE] = h.pack()
        path = str(tmp_path / "resigned.img")
        with open(path, "wb") as f:
            f.write(blob)
        index = _archive.Index.open(path)
        with pytest.raises(NativeError, match=f"chunk table entry {victim} out of range"):
            N.NativeArchive(index.fd, index.header, index.meta["layout"], prefetch=1 << 20)
        index.close()

    def test_overlapping_chunks_refuse_the_archive(self, codes, tmp_path):
        """A re-signed table whose chunks overlap: a chunk read would land
        on another module's live objects, so the whole table is refused."""
        index, _ = archive_of(codes, tmp_path)
        off2 = index.entries()[2].chunk_off
        index.close()
        self._resigned_table(codes, tmp_path, 3, chunk_off=off2 + 8)


class TestReentry:
    @pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ collects at the eval "
                        "breaker, never inside an allocation of the loader's stage 2")
    def test_load_from_a_finalizer_during_stage_2(self, tmp_path):
        """Stage 2 builds frozensets; on 3.10/3.11 that allocation can run a
        collection, and with it Python code.  Asking for the module being
        loaded from there is refused (plain import), not waited for."""
        import gc
        src = "def f(x):\n" + "".join(
            f"    if x in {{{i}, {i + 1}, 'a{i}'}}: return {i}\n" for i in range(60))
        index, arch = archive_of({"fs": compile(src, "/v/fs.py", "exec")}, tmp_path)
        entry = index.lookup("fs")
        seen = []

        def during_collection(phase, info):
            if phase == "start" and not seen:
                try:
                    seen.append(arch.load(entry))
                except NativeError as e:
                    seen.append(str(e))

        old = gc.get_threshold()
        gc.callbacks.append(during_collection)
        gc.set_threshold(1)
        try:
            code = arch.load(entry)
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(during_collection)
        assert seen and "being loaded by another import" in seen[0], seen
        ns = {}
        exec(code, ns)
        assert ns["f"](31) == 30 and ns["f"]("a7") == 7
        index.close()

    def test_close_with_loaded_modules_is_refused(self, codes, tmp_path):
        index, arch = archive_of(codes, tmp_path)
        arch.set_prefetch(1 << 20)
        names = list(codes)
        arch.load(index.lookup(names[0]))
        with pytest.raises(NativeError, match="stays mapped"):
            arch.close()
        arch.load(index.lookup(names[1]))     # schedules read-ahead again
        if TWO_CPUS:
            assert wait_prefetched(arch) >= 1  # read-ahead still on after the refusal
        for name in names[1:]:
            assert same_code(codes[name], arch.load(index.lookup(name)))
        index.close()


FORKER = r"""
import os, sys, time
import json, email.parser, http.client
pids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        import xml.dom.minidom, logging.handlers, pycds
        ok = pycds.stats()["served"] > 3 and \
            xml.dom.minidom.parseString("<a/>").documentElement.tagName == "a"
        os._exit(0 if ok else 3)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
time.sleep(0.6)        # the read-ahead thread exits after 200 ms idle
threads = len(os.listdir("/proc/self/task"))
print(codes, threads)
"""


class TestProcess:
    def test_fork_while_reading_ahead(self, tmp_path):
        (tmp_path / "forker.py").write_text(FORKER)
        img = str(tmp_path / "f.img")
        prog = ["-c", "import json, email.parser, http.client, xml.dom.minidom, "
                "logging.handlers"]
        d = run_python(prog, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0, d
        # The tasks of a process that started no thread: 1, or 2 under
        # qemu-user (its own RCU thread; scripts/aarch64_check.sh).
        alone = run_python(["-c", "import os; print(len(os.listdir('/proc/self/task')))"])
        assert alone.rc == 0, alone
        for _ in range(3):
            # -W always: CPython 3.12+ warns when a multi-threaded process forks
            r = run_python(["-W", "always", "forker.py"], cwd=tmp_path,
                           PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
            assert r.rc == 0, r
            assert "multi-threaded" not in r.err, r
            assert r.out == f"[0, 0, 0, 0, 0, 0] {alone.out.strip()}\n", r
            assert r.warnings() == [] and r.fallbacks() == [], r
            assert "json" in r.served() and "xml.dom.minidom" in r.served(), r

    @pytest.mark.skipif(not TWO_CPUS, reason="read-ahead needs two CPUs")
    def test_switch(self, tmp_path):
        img = str(tmp_path / "s.img")
        # a pause after the first import gives the read-ahead thread its turn
        # even on a loaded machine
        prog = ["-c", "import json, time; time.sleep(0.5); import email.parser, http.client, "
                "pycds; print(pycds.stats()['served'] > 5, pycds.stats()['prefetched'] > 0)"]
        d = run_python(prog, cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        assert d.rc == 0, d
        on = run_python(prog, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        off = run_python(prog, cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                         PYCDSPREFETCH="0")
        assert (on.out, off.out) == ("True True\n", "True False\n"), (on, off)
        assert on.err == off.err == ""


ARENA = '''import os, sys, time
sys.path[:0] = [{tests!r}, {native!r}]
import test_prefetch as T
from test_archive import archive_of
import pathlib, tempfile

def thread_arenas_kib():
    """Resident KiB of glibc's per-thread malloc arenas: anonymous mappings
    that start on a 64 MiB boundary (HEAP_MAX_SIZE on 64-bit)."""
    total, start = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) <= 6 and not line.startswith(("Rss", "Size")):
                lo = int(head[0].split("-")[0], 16)
                start = lo if len(head) == 5 and lo % (64 << 20) == 0 else None
            elif head[0] == "Rss:" and start is not None:
                total += int(head[1])
    return total

codes = T.stdlib_codes(400)
with tempfile.TemporaryDirectory() as d:
    index, arch = archive_of(codes, pathlib.Path(d))
    arch.set_prefetch(4 << 20)
    before = thread_arenas_kib()
    for i, name in enumerate(codes):
        entry = index.lookup(name)
        arch.load(entry)
        # as after the module body ran: pages go back, queued for the thread
        arch.release(entry)
        # let the thread keep ahead: every later load finds its module
        # read ahead, and the window grows to its 4 MiB
        T.wait_prefetched(arch, i, timeout=2.0)
    end = time.monotonic() + 10
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < end:
        time.sleep(0.05)        # the thread exits once idle (native/archive/loader/prefetch.c)
    print(arch.prefetched(), thread_arenas_kib() - before)
'''


@pytest.mark.skipif(not TWO_CPUS, reason="read-ahead needs a second CPU")
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or SANITIZER_MALLOC,
                    reason="glibc's per-thread arenas (ASan's allocator has none)")
@pytest.mark.skipif(_smaps_is_the_hosts(), reason="smaps shows qemu-user's own arenas")
def test_read_ahead_leaves_no_malloc_arena_behind(tmp_path):
    """What the read-ahead thread hands to the importing thread (fix-up
    records) comes from mmap'd blocks given back when the thread exits, not
    from malloc: malloc'd, it sat in the thread's own glibc arena, freed by
    the importing thread but resident for good (~0.2 MiB a process for
    numpy, flask and boto3; before that the relocation entries too, ~0.5
    MiB), nor does it free() anything (the release queue's buffer, which
    the importing thread allocated, is kept for reuse: free() would have
    set up the thread's arena for its per-thread cache).  The stdlib's
    modules loaded and released with read-ahead, the thread gone: no arena
    of the thread's at all."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "arena.py"
    script.write_text(ARENA.format(tests=os.path.dirname(here), native=here))
    r = run_python([str(script)], cwd=tmp_path)
    assert r.rc == 0, r
    prefetched, kib = map(int, r.out.split())
    assert prefetched > 100, r.out
    assert kib == 0, r.out
