"""Page sizes other than this machine's: archives are served under 16 and
64 KiB pages (as on aarch64 kernels) like under 4 KiB ones, whichever page
size wrote them (docs/archive-format.md, "Page sizes").

A preloaded shim (scripts/pagesize_shim.c) makes the child interpreter's
sysconf(_SC_PAGESIZE) answer $PYCDS_PAGESIZE; the loader sizes its arenas
and the pages it gives back by it.  scripts/aarch64_check.sh runs the real
thing under qemu-user with QEMU_PAGESIZE."""

import os
import shutil
import subprocess
import sys

import pytest

from pycds import _archive

from support import ROOT, installed, load_script, run_python, settle

SHIM_SRC = os.path.join(ROOT, "scripts", "pagesize_shim.c")
PAGES = [16384, 65536]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler on Linux for the LD_PRELOAD shim")
    out = tmp_path_factory.mktemp("shim") / "pagesize_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
                    SHIM_SRC, "-o", str(out), "-ldl"], check=True)
    return str(out)


def pages(shim, size):
    """The environment that makes a child see pages of ``size`` bytes
    (None: this machine's).  Only sizes the real pages divide can be
    pretended (under QEMU_PAGESIZE=65536 the smaller ones are skipped)."""
    if size and size % os.sysconf("SC_PAGESIZE"):
        pytest.skip(f"pages of {size} bytes cannot be pretended over "
                    f"{os.sysconf('SC_PAGESIZE')}-byte ones")
    return {"LD_PRELOAD": shim, "PYCDS_PAGESIZE": size} if size else {}


PROGRAM = """
import argparse, decimal, email.message, json, os
print(os.sysconf("SC_PAGESIZE"))
p = argparse.ArgumentParser(prog="demo")
p.add_argument("--n", type=int, default=7)
args = p.parse_args([])
m = email.message.EmailMessage()
m["Subject"] = "pages"
m.set_content("body")
print(json.dumps({"n": args.n, "d": str(decimal.Decimal(1) / 7),
                  "subject": m["Subject"]}, sort_keys=True))
"""
WANTED = {"json", "argparse", "decimal", "email.message"}


def dump(tmp_path, archive, env):
    """DUMP the program into ``archive``, its heap section placed at a
    multiple of 4096 that neither 16384 nor 65536 divides (a long argument
    moves it on otherwise), so that the SHARE runs test what the loader
    asks of that offset."""
    pad = []
    for _ in range(3):
        run = run_python(["prog.py", *pad], cwd=str(tmp_path), PYCDSMODE="DUMP",
                         PYCDSARCHIVE=archive, **env)
        assert run.rc == 0, run
        index = _archive.Index.open(archive)
        heap_off = index.header.heap_off
        index.close()
        if heap_off % 16384:
            return heap_off
        pad.append("x" * 4096)
    pytest.fail(f"heap section stays 16 KiB aligned: {heap_off}")


@pytest.fixture
def program(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    installed(prog)
    settle(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("release", ["1", "protect"])
@pytest.mark.parametrize("dump_page, share_page", [(p, p) for p in PAGES]
                         + [(None, 65536), (65536, None), (16384, 65536)])
def test_served_whichever_page_size_wrote_it(program, shim, release, dump_page, share_page):
    archive = str(program / "app.img")
    plain = run_python(["prog.py"], cwd=str(program), **pages(shim, share_page))
    assert plain.rc == 0, plain
    assert plain.out.split()[0] == str(share_page or os.sysconf("SC_PAGESIZE"))
    heap_off = dump(program, archive, pages(shim, dump_page))
    assert heap_off % 4096 == 0
    share = run_python(["prog.py"], cwd=str(program), PYCDSMODE="SHARE", PYCDSARCHIVE=archive,
                       PYCDSVERBOSE=1, PYCDSRELEASE=release, **pages(shim, share_page))
    assert share.rc == 0, share
    assert share.warnings() == [], share
    assert share.out == plain.out
    assert WANTED <= set(share.served()), share


# Two modules whose tails are mostly copies of names the first interned:
# once both bodies ran, the loader gives back whole pages of the size in
# force, and the heap section sits at a multiple of 4096 but not of 65536.
GIVEN_BACK = """
import os, sys
import importlib.util
for _name in ("cprobe", "twin_check"):     # scripts/, by path (twin_check imports cprobe)
    _spec = importlib.util.spec_from_file_location(_name, os.path.join(sys.argv[1], _name + ".py"))
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])
T = sys.modules["twin_check"]
from pycds import _archive, _nativeapi as N, _nativewriter as NW
from pycds import _files as W
page = os.sysconf("SC_PAGESIZE")
names = [f"tab_given_back_name_{i:05d}" for i in range(6000)]
src_a = "".join(f"{n} = {i}\\n" for i, n in enumerate(names))
src_b = "".join(f"{n} = {i} + 1\\n" for i, n in enumerate(names))
path, _ = T.write_archive([("a", compile(src_a, "/v/a.py", "exec")),
                           ("b", compile(src_b, "/v/b.py", "exec"))], sys.argv[2])
index = _archive.Index.open(path)
h = index.header
if h.heap_off % 65536 == 0:
    # Move the heap (and the relocations after it) 4096 bytes on.
    with open(path, "rb") as f:
        data = f.read()
    front = data[256:h.heap_off]
    heap = data[h.heap_off:h.heap_off + h.heap_len]
    relocs = data[h.reloc_off:h.file_len]
    h.heap_off += 4096
    h.reloc_off = (h.heap_off + h.heap_len + 7) // 8 * 8
    h.file_len = h.reloc_off + len(relocs)
    index.close()
    os.unlink(path)
    W.write_atomic(path, [(0, h.pack()), (256, front), (h.heap_off, heap),
                          (h.reloc_off, relocs)], _archive.ARCHIVE_FILE,
                   length=h.file_len)
    index = _archive.Index.open(path)
    h = index.header
arch = N.NativeArchive(index.fd, h, NW.layout_id())
ea, eb = index.lookup("a"), index.lookup("b")
exec(arch.load(ea), {})
exec(arch.load(eb), {})
given = arch.release(ea) + arch.release(eb)
print(page, h.heap_off % 4096, h.heap_off % 65536 != 0, given % page, given > 0)
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 chunks are kept whole")
@pytest.mark.parametrize("size", PAGES)
def test_whole_pages_of_the_size_in_force_are_given_back(tmp_path, shim, size):
    run = run_python(["-c", GIVEN_BACK, os.path.join(ROOT, "scripts"), str(tmp_path)],
                     cwd=str(tmp_path), **pages(shim, size))
    assert run.rc == 0, run
    assert run.out.split() == [str(size), "0", "True", "0", "True"], run


def test_heap_section_off_the_formats_alignment_is_refused_with_the_reason(tmp_path):
    T = load_script("twin_check")
    from pycds import _nativeapi as N, _nativewriter as NW
    from pycds.errors import NativeError
    path, _ = T.write_archive([("a", compile("x = 1\n", "/v/a.py", "exec"))], str(tmp_path))
    index = _archive.Index.open(path)
    h = index.header
    h.heap_off += 8       # still inside the file; the header is not re-read
    with pytest.raises(NativeError, match=f"heap section at {h.heap_off} is not "
                                          f"{_archive.HEAP_ALIGN}-byte aligned"):
        N.NativeArchive(index.fd, h, NW.layout_id())
    index.close()
