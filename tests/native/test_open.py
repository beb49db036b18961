"""The native reader's opening of an archive (native/archive/loader/open.c,
pycds._nativeapi.ArchiveFile): the header's fields as the writer laid them
out, and each refusal with its reason and its kind (damage, or another
interpreter's archive)."""

import json
import marshal
import os
import stat
import sys

import pytest

from pycds import _archive
from pycds.dumping import dumper as _dumper
from pycds import _nativeapi as N
from pycds.errors import ArchiveFormatError, ForeignArchiveError


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("open")
    path = str(d / "a.img")
    _dumper.dump_modules([("json", json), ("json.decoder", sys.modules["json.decoder"])], path)
    with open(path, "rb") as f:
        return f.read()


def _write(tmp_path, data, mode=0o644, name="x.img"):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    os.chmod(p, mode)
    return str(p)


def _resign(data, **fields):
    # The header with ``fields`` changed and its checksum made anew.
    h = _archive.Header.unpack(data)
    for k, v in fields.items():
        setattr(h, k, v)
    return h.pack() + bytes(data[_archive.HEADER_SIZE:])


def _with_meta(data, meta):
    # ``meta`` as the archive's meta block (at the end of the file: the
    # header points there), checksum keyed as the writer keys it.
    h = _archive.Header.unpack(data)
    blob = marshal.dumps(meta)
    body = bytes(data[_archive.HEADER_SIZE:]) + blob
    return _resign(data[:_archive.HEADER_SIZE] + body, meta_off=len(data), meta_len=len(blob),
                   meta_sum=_archive.checksum(blob, h.archive_id), file_len=len(data) + len(blob))


def refusal(path, **kw):
    with pytest.raises(ArchiveFormatError) as e:
        N.ArchiveFile(path, **kw)
    return e.value


def test_the_header_as_the_writer_laid_it_out(tmp_path, good):
    f = N.ArchiveFile(_write(tmp_path, good))
    try:
        h = _archive.Header.unpack(good)
        for name, _, _ in _archive._FIELDS[1:]:
            assert getattr(f.header, name) == getattr(h, name), name
        assert f.meta == marshal.loads(good[h.meta_off:h.meta_off + h.meta_len])
        assert f.buckets == good[h.buckets_off:h.buckets_off + 8 * h.nbuckets]
        assert f.foreign is None and f.fd >= 0
        st = os.fstat(f.fd)
        assert f.mtime == pytest.approx(st.st_mtime)
    finally:
        f.close()
    assert f.fd == -1


def test_the_pyc_kind_is_the_format_s(good):
    assert N.lib.PYCDS_PYC_TIMESTAMP == _archive.PYC_TIMESTAMP


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[:100], "file is 100 bytes, shorter than a header"),
    (lambda d: b"NOTPYCDS" + d[8:], "not a pycds archive (bad magic)"),
    (lambda d: d[:200] + bytes([d[200] ^ 1]) + d[201:], "header checksum mismatch"),
    (lambda d: d + b"x", "bytes, header says"),
    (lambda d: d[:-1], "bytes, header says"),
    (lambda d: _resign(d, meta_len=1 << 40), "section outside the file"),
    (lambda d: _resign(d, meta_off=(1 << 64) - 8, meta_len=16), "section outside the file"),
    (lambda d: _resign(d, nbuckets=(1 << 62) + 1), "section outside the file"),
    (lambda d: _resign(d, reloc_count=1 << 63), "section outside the file"),
    (lambda d: _resign(d, nbuckets=3), "bad bucket table size"),
    (lambda d: _resign(d, nmodules=1 << 20), "outside the file"),
    (lambda d: _resign(d, meta_sum=1), "meta checksum mismatch"),
    (lambda d: _resign(d, buckets_sum=1), "bucket table checksum mismatch"),
    (lambda d: _with_meta(d, [1, 2]), "meta block is not a dict"),
])
def test_damage_is_refused_with_its_reason(tmp_path, good, damage, reason):
    e = refusal(_write(tmp_path, damage(good)))
    assert reason in str(e) and not isinstance(e, ForeignArchiveError), e


def test_a_meta_block_that_is_not_marshal_data(tmp_path, good):
    h = _archive.Header.unpack(good)
    blob = b"\xff\xfe"
    data = good + blob
    data = _resign(data, meta_off=len(good), meta_len=2, file_len=len(data),
                   meta_sum=_archive.checksum(blob, h.archive_id))
    assert str(refusal(_write(tmp_path, data))).startswith("unreadable (")


def test_another_format_or_python_is_foreign(tmp_path, good):
    e = refusal(_write(tmp_path, _resign(good, format=_archive.FORMAT_VERSION + 1)))
    assert isinstance(e, ForeignArchiveError)
    assert str(e) == f"archive format {_archive.FORMAT_VERSION + 1}, this pycds reads " \
                     f"format {_archive.FORMAT_VERSION}"
    other = sys.hexversion + (1 << 16)
    e = refusal(_write(tmp_path, _resign(good, py_hexversion=other), name="y.img"))
    assert isinstance(e, ForeignArchiveError)
    assert str(e) == (f"made by Python {other >> 24}.{other >> 16 & 0xFF}, this is Python "
                      f"{sys.version_info[0]}.{sys.version_info[1]}")


def test_another_interpreter_s_meta(tmp_path, good):
    h = _archive.Header.unpack(good)
    meta = marshal.loads(good[h.meta_off:h.meta_off + h.meta_len])
    path = _write(tmp_path, _with_meta(good, dict(meta, optimize=meta["optimize"] + 1)))
    e = refusal(path)
    assert isinstance(e, ForeignArchiveError) and "made by another interpreter (optimize" in str(e)
    f = N.ArchiveFile(path, check_interpreter=False)
    assert f.foreign == str(e)
    f.close()
    del meta["byteorder"]
    e = refusal(_write(tmp_path, _with_meta(good, meta), name="y.img"))
    assert str(e) == "made by an older pycds (its meta has no byteorder)"


def test_what_is_not_a_regular_file(tmp_path):
    assert str(refusal(str(tmp_path))) == "not a regular file"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert str(refusal(str(fifo))) == "not a regular file"    # (and did not block)
    assert str(refusal(str(tmp_path / "none"))) == os.strerror(2)
    assert str(refusal(str(tmp_path) + "/a\0b")) == "unreadable (embedded null byte)"


class TestTrust:
    """What others could have written or could replace is refused (as SHARE
    refuses it), from the file up through every directory and link."""

    def test_the_file_s_mode(self, tmp_path, good):
        path = _write(tmp_path, good, mode=0o664)
        assert str(refusal(path)) == "writable by group or others (mode 664)"
        N.ArchiveFile(path, check_owner=False).close()
        with pytest.raises(ArchiveFormatError, match="mode 664"):
            N.check_trusted(path)

    def test_a_directory_on_the_way(self, tmp_path, good, monkeypatch):
        d = tmp_path / "open" / "deeper"
        d.mkdir(parents=True)
        path = _write(d, good)
        os.chmod(tmp_path / "open", 0o777)
        want = f"its directory {tmp_path}/open is writable by others (mode 777, no sticky bit)"
        assert str(refusal(path)) == want
        # Relative, and through "..": the same directories.
        monkeypatch.chdir(d)
        assert str(refusal("../deeper/./x.img")) == want
        os.chmod(tmp_path / "open", 0o1777)     # sticky, as /tmp
        N.ArchiveFile(path).close()
        N.check_trusted(path)

    def test_a_link_s_directory_and_its_target_s(self, tmp_path, good):
        real = tmp_path / "real"
        loose = tmp_path / "loose"
        real.mkdir()
        loose.mkdir()
        path = _write(real, good)
        os.symlink(path, loose / "link.img")
        os.symlink("../real", loose / "rel")        # a relative link
        N.ArchiveFile(str(loose / "link.img")).close()
        N.ArchiveFile(str(loose / "rel" / "x.img")).close()
        os.chmod(loose, 0o777)
        for p in (loose / "link.img", loose / "rel" / "x.img"):
            assert "its directory" in str(refusal(str(p))) and "loose" in str(refusal(str(p)))
        os.chmod(loose, 0o755)
        os.chmod(real, 0o777)
        assert f"its directory {real} is writable" in str(refusal(str(loose / "rel" / "x.img")))
        # The directory alone: what is on the way to it, not its own mode.
        N.check_trusted(str(real), file=False)

    def test_a_link_loop(self, tmp_path):
        os.symlink("b", tmp_path / "a")
        os.symlink("a", tmp_path / "b")
        with pytest.raises(ArchiveFormatError) as e:
            N.check_trusted(str(tmp_path / "a" / "x.img"), file=False)
        assert str(e.value) == f"too many symbolic links in {tmp_path}/a/x.img"

    def test_a_missing_directory(self, tmp_path):
        with pytest.raises(ArchiveFormatError) as e:
            N.check_trusted(str(tmp_path / "no" / "x.img"), file=False)
        assert str(e.value) == f"cannot stat {tmp_path}/no ({os.strerror(2)})"

    def test_another_user_s_file(self, tmp_path, good):
        if os.getuid() != 0:
            pytest.skip("needs root to give the file away")
        path = _write(tmp_path, good)
        os.chown(path, 65534, 65534)
        assert str(refusal(path)) == "owned by uid 65534, not by this user (0) or root"
        assert stat.S_ISREG(os.stat(path).st_mode)


# The start of a program whose first import (of a module no archive holds)
# opens the archive, and which then, given an argument, does to it what
# follows (indented) before its first archived import.
OPENED_THEN = ("import os, sys\n"
               "try:\n"
               "    import no_such_module    # (the opening: the archive is read)\n"
               "except ImportError:\n"
               "    pass\n"
               "if len(sys.argv) > 1:\n")


def test_a_meta_block_too_large_for_memory_is_one_warning(tmp_path, good):
    # A header (its checksum made anew) whose meta block spans a sparse
    # terabyte: the reader cannot allocate it.  That archive is refused
    # (ArchiveFormatError, not the MemoryError of the program's state that
    # SHARE lets through and retries at every import): a SHARE run says
    # so once and imports plainly; so does one that finds it renamed over
    # its archive between its first import and its first archived import
    # (the MemoryError was raised into the program's import there).
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "1":
            pytest.skip("overcommit_memory=1: the allocation would succeed")
    from support import run_python
    big = 1 << 40
    path = _write(tmp_path, _resign(good, file_len=big, meta_off=1 << 20,
                                    meta_len=big - (1 << 20)), name="huge.img")
    os.truncate(path, big)
    with pytest.raises(ArchiveFormatError, match="no memory for the meta"):
        N.ArchiveFile(path, out_of_the_way=True)
    ok = _write(tmp_path, good, name="ok.img")
    prog = tmp_path / "prog.py"
    prog.write_text(OPENED_THEN +
                    "    os.replace(sys.argv[1], os.environ['PYCDSARCHIVE'])\n"
                    "import json, csv, decimal\n"
                    "print(json.dumps([1]))\n")
    for swap in (False, True):
        args = [str(prog)]
        archive = path
        if swap:
            args.append(path)
            archive = ok
        r = run_python(args, cwd=str(tmp_path), PYCDSMODE="SHARE", PYCDSARCHIVE=archive)
        assert r.rc == 0 and r.out == "[1]\n", r
        assert len(r.warnings()) == 1 and "no memory for the meta" in r.warnings()[0], r


def test_the_program_s_audit_hooks_see_no_opening_of_the_archive(tmp_path):
    # Plain import opens no archive: a program's audit hook that reports
    # every "open" (security monitoring does) sees none of it in a SHARE
    # run either, neither at the opening (the native reader) nor where
    # the first archived import opens the file again for the native
    # handle.
    from support import run_python
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import os, sys\n"
        "arc = os.environ.get('PYCDSARCHIVE', '-')\n"
        "def hook(event, args):\n"
        "    if event == 'open' and args and os.fsdecode(args[0]) == arc:\n"
        "        print('audit:', event, file=sys.stderr)\n"
        "sys.addaudithook(hook)\n"
        "try:\n"
        "    import no_such_module\n"
        "except ImportError:\n"
        "    pass\n"
        "import json, email.message\n"
        "print(json.dumps([1]))\n")
    img = str(tmp_path / "a.img")
    assert run_python([str(prog)], cwd=str(tmp_path), PYCDSMODE="DUMP",
                      PYCDSARCHIVE=img).rc == 0
    plain = run_python([str(prog)], cwd=str(tmp_path))
    r = run_python([str(prog)], cwd=str(tmp_path), PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "[1]\n"), (plain, r)
    assert "json" in r.served() and not r.warnings(), r
    assert "audit:" not in r.err, r


@pytest.mark.parametrize("change", ["file", "directory"])
def test_an_archive_others_could_write_since_the_opening_is_refused(tmp_path, change):
    # Made writable by others (the file, or its directory without the
    # sticky bit) between the opening and the first archived import, the
    # archive may hold anything by the time the native handle opens it
    # again: refused then (one warning, plain import), as at the opening.
    from support import run_python
    d = tmp_path / "arc"
    d.mkdir()
    img = str(d / "a.img")
    prog = tmp_path / "prog.py"
    prog.write_text(
        OPENED_THEN +
        "    os.chmod(sys.argv[1], 0o666 if sys.argv[1].endswith('.img') else 0o777)\n"
        "import json, email.message\n"
        "print(json.dumps([1]))\n")
    assert run_python([str(prog)], cwd=str(tmp_path), PYCDSMODE="DUMP",
                      PYCDSARCHIVE=img).rc == 0
    r = run_python([str(prog)], cwd=str(tmp_path), PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "[1]\n" and "json" in r.served(), r
    r = run_python([str(prog), img if change == "file" else str(d)], cwd=str(tmp_path),
                   PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "[1]\n" and r.served() == [], r
    assert len(r.warnings()) == 1, r
    assert ("writable by group or others" if change == "file"
            else "is writable by others") in r.warnings()[0], r


def test_an_archive_copied_over_in_place_before_the_first_hit_is_taken(tmp_path):
    # `cp new.img archive.img` between the opening and the first archived
    # import keeps the inode but not the archive the opening read: the
    # archive there now is taken (as one renamed over it is), not read
    # with the first one's index (which would take it for damage).
    from support import run_python
    img, other = str(tmp_path / "a.img"), str(tmp_path / "b.img")
    prog = tmp_path / "prog.py"
    prog.write_text(
        OPENED_THEN +
        "    src = os.open(sys.argv[1], os.O_RDONLY)\n"
        "    dst = os.open(os.environ['PYCDSARCHIVE'], os.O_WRONLY | os.O_TRUNC)\n"
        "    while True:\n"
        "        b = os.read(src, 1 << 20)\n"
        "        if not b:\n"
        "            break\n"
        "        os.write(dst, b)\n"
        "    os.close(src)\n"
        "    os.close(dst)\n"
        "import mymod, json, email.message\n"
        "print(json.dumps([1]))\n")
    # (The first archive holds nothing pycds's opening imports, re say:
    # the program's first import it holds, mymod, is after the copy.)
    (tmp_path / "mymod.py").write_text("X = 1\n")
    assert run_python(["-c", "import mymod"], cwd=str(tmp_path), PYCDSMODE="DUMP",
                      PYCDSARCHIVE=img).rc == 0
    assert run_python([str(prog)], cwd=str(tmp_path), PYCDSMODE="DUMP",
                      PYCDSARCHIVE=other).rc == 0
    r = run_python([str(prog), other], cwd=str(tmp_path), PYCDSMODE="SHARE",
                   PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert r.rc == 0 and r.out == "[1]\n" and not r.warnings(), r
    assert "json" in r.served() and "email.message" in r.served(), r


def test_a_descriptor_held_then_let_go(tmp_path, good):
    # SHARE's opening for a first import the archive holds keeps its
    # descriptor (pycds.share.install's `first`); let go, the next
    # descriptor() opens the file again, checked as at the opening.
    path = _write(tmp_path, good)
    f = N.ArchiveFile(path, out_of_the_way=True, hold=True)
    held = f.fd
    assert held >= 0 and os.path.samestat(os.fstat(held), os.stat(path))
    assert f.descriptor() == held
    f.let_go()
    assert f.fd == -1
    with pytest.raises(OSError):
        os.fstat(held)
    again = f.descriptor()
    assert again >= 0 and os.path.samestat(os.fstat(again), os.stat(path))
    f.close()
    assert N.ArchiveFile(path, out_of_the_way=True).fd == -1
