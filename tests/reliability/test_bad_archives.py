"""Issue 3, part 1 and 2: bad and foreign archives.

Each bad archive must leave the program exactly as plain Python runs it
(stdout, exit code) with exactly one line
``[pycds] warning: archive <path> ignored: <reason>`` on stderr.  Damage is
placed in the parts the program uses (its modules' index entries, heap
chunks and relocation entries), so the lazy per-module checks are reached.
"""

import marshal
import os
import subprocess
import sys

import pytest

from support import Run, clean_env, load_script, run_python, without_dac_bypass
from support.reliability import dump, refused, share

from pycds import _archive

fuzz_archive = load_script("fuzz_archive")


def _write(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return str(path)


def _sections(data):
    return fuzz_archive._sections(data)


def _used_entry(data, name="fuzzpkg.shapes"):
    return fuzz_archive.entry_of(fuzz_archive.Model(data), name)


def _flip(data, pos, bit=0):
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


class TestTruncated:
    @pytest.mark.parametrize("where", ["0", "1", "header-1", "header", "meta",
                                       "entries", "heap-start", "heap-mid",
                                       "relocs", "last-byte"])
    def test_truncated(self, base_archive, archive_dir, where):
        work, _, data, plain, _ = base_archive
        s = _sections(data)
        cut = {"0": 0, "1": 1, "header-1": _archive.HEADER_SIZE - 1,
               "header": _archive.HEADER_SIZE, "meta": s["meta"][0] + 3,
               "entries": s["entries"][0] + s["entries"][1] // 2,
               "heap-start": s["heap"][0],
               "heap-mid": s["heap"][0] + s["heap"][1] // 2,
               "relocs": s["relocs"][0] + 4, "last-byte": len(data) - 1}[where]
        path = _write(archive_dir / "t.img", data[:cut])
        reason = refused(share(work, path), plain, path)
        assert ("truncated" in reason or "shorter than a header" in reason
                or "not a pycds archive" in reason)      # (cut inside the magic)

    def test_appended(self, base_archive, archive_dir):
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "t.img", data + b"\0" * 10)
        assert "appended" in refused(share(work, path), plain, path)


class TestBitFlips:
    """One flipped bit in each part the program uses."""

    def _positions(self, data):
        s = _sections(data)
        m = fuzz_archive.Model(data)
        e = fuzz_archive.entry_of(m, "fuzzpkg.shapes")
        j = fuzz_archive.entry_of(m, "json")
        return {
            "header-magic": 3,
            "header-field": 41,          # meta_off
            "header-reserved": 200,
            "header-sum": 250,
            "meta": s["meta"][0] + s["meta"][1] // 2,
            "buckets": s["buckets"][0] + 5,
            "heap-chunk-start": s["heap"][0] + e.chunk_off + 1,
            "heap-chunk-end": s["heap"][0] + e.chunk_off + e.chunk_len - 3,
            "heap-json-middle": s["heap"][0] + j.chunk_off + j.chunk_len // 2,
            "relocs-used": s["relocs"][0] + 4 * (e.reloc_first + e.reloc_count // 2) + 1,
            "relocs-kind-bits": s["relocs"][0] + 4 * j.reloc_first,
        }

    @pytest.mark.parametrize("part", [
        "header-magic", "header-field", "header-reserved", "header-sum", "meta",
        "buckets", "heap-chunk-start", "heap-chunk-end", "heap-json-middle",
        "relocs-used", "relocs-kind-bits"])
    def test_flip(self, base_archive, archive_dir, part):
        work, _, data, plain, _ = base_archive
        pos = self._positions(data)[part]
        path = _write(archive_dir / "f.img", _flip(data, pos, 2))
        reason = refused(share(work, path), plain, path)
        assert "mismatch" in reason or "not a pycds archive" in reason or "checksum" in reason

    def test_flip_in_every_used_index_entry(self, base_archive, archive_dir):
        """A flip in the index entry of any module the program imports."""
        work, _, data, plain, served = base_archive
        s = _sections(data)
        h = _archive.Header.unpack(data)
        ents = data[h.entries_off:h.entries_off + h.entries_len]
        off, targets = 0, []
        while off < len(ents):
            length = int.from_bytes(ents[off:off + 4], "little")
            e = _archive.ModuleEntry(*marshal.loads(ents[off + 12:off + length]))
            if e.name in ("fuzzpkg", "json.decoder"):
                targets.append(s["entries"][0] + off + 12 + length // 3)
            off += length
        assert len(targets) == 2
        for pos in targets:
            path = _write(archive_dir / "e.img", _flip(data, pos, 5))
            assert "checksum" in refused(share(work, path), plain, path)


class TestNotAnArchive:
    def test_random_bytes(self, base_archive, archive_dir):
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "r.img", os.urandom(len(data)))
        assert "it is not a pycds archive" in refused(share(work, path), plain, path)

    def test_text_file(self, base_archive, archive_dir):
        work, _, _, plain, _ = base_archive
        path = _write(archive_dir / "r.img", b"print('hello')\n" * 100)
        assert "it is not a pycds archive" in refused(share(work, path), plain, path)

    def test_directory(self, base_archive, archive_dir):
        work, _, _, plain, _ = base_archive
        path = str(archive_dir / "d.img")
        os.mkdir(path)
        assert "not a regular file" in refused(share(work, path), plain, path)

    def test_fifo_does_not_block(self, base_archive, archive_dir):
        """Opening a FIFO blocks until a writer comes: start-up must not."""
        work, _, _, plain, _ = base_archive
        path = str(archive_dir / "p.img")
        os.mkfifo(path, 0o644)
        r = share(work, path)   # run_python's timeout turns a hang into an error
        assert "not a regular file" in refused(r, plain, path)

    def test_missing(self, base_archive, archive_dir):
        work, _, _, plain, _ = base_archive
        path = str(archive_dir / "nothing.img")
        assert "No such file" in refused(share(work, path), plain, path)


class TestPermissions:
    def test_group_writable(self, base_archive, archive_dir):
        work, _, data, plain, _ = base_archive
        for mode in (0o664, 0o646, 0o666):
            path = _write(archive_dir / "w.img", data, mode)
            assert "writable by group or others" in refused(share(work, path), plain, path)

    def test_owned_by_another_user(self, base_archive, archive_dir):
        work, _, data, plain, _ = base_archive
        if os.getuid() != 0:
            pytest.skip("giving a file to another user needs root")
        path = _write(archive_dir / "o.img", data, 0o644)
        os.chown(path, 65534, 65534)     # nobody
        assert os.getuid() != 65534
        assert "owned by uid 65534" in refused(share(work, path), plain, path)

    def test_unreadable(self, base_archive, archive_dir):
        """A mode-000 file, read by an interpreter that cannot bypass file
        permissions.  The tests run as root, and root reads any file
        (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH); ``setpriv`` drops both from
        the child's bounding set, so the open really fails with EACCES.
        (Running as another user is not possible here: the interpreter
        lives under /root, which is 0700.)"""
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "u.img", data, 0o000)
        proc = subprocess.run(
            without_dac_bypass([sys.executable, "prog.py"]), cwd=work, capture_output=True,
            text=True, timeout=120, env=clean_env(PYCDSMODE="SHARE", PYCDSARCHIVE=path))
        r = Run(proc)
        assert "Permission denied" in refused(r, plain, path)


class TestForeign:
    """Archives of another interpreter, build or optimization level,
    fabricated by changing the meta block and re-signing everything."""

    # Another minor version than the running one, for fabricated metas.
    MINOR = sys.version_info[1]
    OTHER = MINOR + 1 if MINOR < 13 else MINOR - 1
    OTHER_HEX = (3 << 24) | (OTHER << 16) | 0x01F0

    @pytest.mark.parametrize("key,value,expect", [
        ("layout", lambda m: m["layout"].replace(
            f"cpython-3.{TestForeign.MINOR}", f"cpython-3.{TestForeign.OTHER}")
         .replace("hex=030%x" % TestForeign.MINOR, "hex=030%x" % TestForeign.OTHER),
         "another interpreter build"),
        ("layout", lambda m: m["layout"].replace("build=", "build=ff"),
         "another interpreter build"),
        ("layout", lambda m: m["layout"].replace("statics=", "statics=0"),
         "another interpreter build"),
        ("version", lambda m: m["version"].replace(
            "3.%d." % TestForeign.MINOR, "3.%d." % TestForeign.OTHER, 1),
         "another interpreter"),
        ("hexversion", lambda m: TestForeign.OTHER_HEX, "another interpreter"),
        ("cache_tag", lambda m: "cpython-3%d" % TestForeign.OTHER, "another interpreter"),
        ("optimize", lambda m: 1, "optimize 1, this is 0"),
        ("byteorder", lambda m: "big", "another interpreter"),
        ("debug_ranges", lambda m: not m["debug_ranges"], "debug_ranges False, this is True"),
    ])
    def test_refused(self, base_archive, archive_dir, key, value, expect):
        work, _, data, plain, _ = base_archive
        m = fuzz_archive.Model(data)
        new = value(m.meta)
        assert new != m.meta[key]
        m.meta[key] = new
        path = _write(archive_dir / "x.img", m.to_bytes())
        assert expect in refused(share(work, path), plain, path)

    @pytest.mark.parametrize("other", sorted({10, 11, 12, 13} - {sys.version_info[1]}))
    def test_header_of_another_version(self, base_archive, archive_dir, other):
        """An archive of another minor version: the header names the
        writer's version, checked before anything else."""
        work, _, data, plain, _ = base_archive
        hexversion = (3 << 24) | (other << 16) | 0x01F0
        m = fuzz_archive.Model(data)
        m.header_patch["py_hexversion"] = hexversion
        m.meta.update(hexversion=hexversion, cache_tag="cpython-3%d" % other)
        path = _write(archive_dir / "v.img", m.to_bytes())
        expect = (f"made by Python 3.{other}, this is Python 3.{sys.version_info[1]}; "
                  "write it again with this interpreter and pycds (PYCDSMODE=DUMP), or use "
                  "PYCDSMODE=AUTO, which replaces an archive that does not fit")
        assert refused(share(work, path), plain, path) == expect

    def test_archive_of_an_older_pycds(self, base_archive, archive_dir):
        """A meta block without a fact this version checks (debug_ranges,
        new in session 14) is an older pycds's archive: refused, saying so."""
        work, _, data, plain, _ = base_archive
        m = fuzz_archive.Model(data)
        del m.meta["debug_ranges"]
        path = _write(archive_dir / "old.img", m.to_bytes())
        assert refused(share(work, path), plain, path).startswith(
            "made by an older pycds (its meta has no debug_ranges); write it again")

    def test_a_bucket_table_without_an_empty_bucket_ends(self, base_archive, archive_dir):
        """Every empty bucket filled and the table re-signed: a lookup of a
        name the archive lacks probes each bucket once and ends (it looped
        for ever), and the program runs as plain."""
        work, _, data, plain, _ = base_archive
        h = _archive.Header.unpack(data)
        b = bytearray(data[h.buckets_off:h.buckets_off + 8 * h.nbuckets])
        for at in range(0, len(b), 8):
            if int.from_bytes(b[at + 4:at + 8], "little") == _archive.EMPTY:
                b[at:at + 8] = (0x12345678).to_bytes(4, "little") + bytes(4)
        h.buckets_sum = _archive.checksum(bytes(b), h.archive_id)
        out = bytearray(data)
        out[h.buckets_off:h.buckets_off + len(b)] = b
        out[:_archive.HEADER_SIZE] = h.pack()
        path = _write(archive_dir / "full.img", bytes(out))
        args = ["-c", "import tabnanny, fuzzpkg.shapes; print(tabnanny.__name__)"]
        r = share(work, path, args=args, PYCDSVERBOSE=1, timeout=60)
        assert (r.rc, r.out) == (0, "tabnanny\n") and not r.warnings(), r
        assert "fuzzpkg.shapes" in r.served() and "tabnanny" not in r.served(), r

    def test_resigned_copy_is_served(self, base_archive, archive_dir):
        """The re-signing helper itself is right: unchanged, it is served."""
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "same.img", fuzz_archive.Model(data).to_bytes())
        r = share(work, path, PYCDSVERBOSE=1)
        assert (r.rc, r.out) == (plain.rc, plain.out) and not r.warnings(), r
        assert "fuzzpkg.shapes" in r.served()


class TestStructuralChecks:
    """Re-signed structural damage: the checksums pass, the checks in C
    (native/archive/loader/: ranges, relocation bounds and kinds, verify_chunk)
    must refuse."""

    def _resigned(self, data, mutate):
        m = fuzz_archive.Model(data)
        mutate(m, fuzz_archive.entry_of(m, "fuzzpkg.shapes"))
        return m.to_bytes()

    @pytest.mark.parametrize("name,mutate", [
        ("chunk past heap", lambda m, e: setattr(e, "chunk_off", len(m.heap))),
        ("chunk longer", lambda m, e: setattr(e, "chunk_len", e.chunk_len + 4096)),
        ("root outside", lambda m, e: setattr(e, "root_off", e.chunk_len)),
        ("root not code", lambda m, e: setattr(e, "root_off", 16)),
        ("fewer relocs", lambda m, e: setattr(e, "reloc_count", e.reloc_count - 1)),
        ("relocs past table", lambda m, e: setattr(e, "reloc_first", len(m.relocs) // 4)),
        ("module number", lambda m, e: setattr(e, "number", 10 ** 6)),
        ("reloc kind 7", lambda m, e: m.set_reloc(e.reloc_first, m.reloc(e.reloc_first) | 7)),
        ("reloc slot outside", lambda m, e: m.set_reloc(
            e.reloc_first, (e.chunk_len + 64) | (m.reloc(e.reloc_first) & 7))),
        ("external target shifted", lambda m, e: _shift_slot(m, e, 1, 8)),
        ("external target to anchor", lambda m, e: _set_slot(m, e, 1, 0)),
        ("internal target outside", lambda m, e: _set_slot(m, e, 0, e.chunk_len)),
        # target + header size wraps around 2**64 (an overflowing bound check
        # would accept it and point before the chunk)
        ("internal target wraps", lambda m, e: _set_slot(m, e, 0, -8)),
        ("chunk end wraps", lambda m, e: (setattr(e, "chunk_off", 2 ** 64 - 4096),
                                          setattr(e, "chunk_len", e.chunk_len + 4096))),
        ("internal target misaligned", lambda m, e: _shift_slot(m, e, 0, 4)),
        ("internal target shifted", lambda m, e: _shift_slot(m, e, 0, 8)),
    ])
    def test_refused(self, base_archive, archive_dir, name, mutate):
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "s.img", self._resigned(data, mutate))
        refused(share(work, path, PYCDSVERIFY=1), plain, path)

    def test_object_header_across_root_off_is_refused_at_relocation(
            self, base_archive, archive_dir):
        # Head and tail lie apart in memory (pycds_place): a target 8 bytes
        # before root_off would have its header read from whatever follows
        # the head -- another module's, maybe a page given back -- before
        # the deep check could see it.  The relocation pass refuses it.
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "b.img", self._resigned(
            data, lambda m, e: _set_slot(m, e, 0, e.root_off - 8)))
        reason = refused(share(work, path), plain, path)
        assert "relocation target" in reason, reason

    @pytest.mark.parametrize("delta", [1, 3, -2])
    def test_a_misaligned_external_target_is_refused_at_relocation(
            self, base_archive, archive_dir, delta):
        # Inside the interpreter image but not at an object's start (the
        # deep check then read its type through a misaligned pointer:
        # found by scripts/fuzz_coverage.py under UBSan).  No PYCDSVERIFY.
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "x.img", self._resigned(
            data, lambda m, e: _shift_slot(m, e, 1, delta)))
        reason = refused(share(work, path), plain, path)
        assert "external relocation outside the interpreter or misaligned" in reason, reason

    def test_negative_module_number_says_so(self, base_archive, archive_dir):
        work, _, data, plain, _ = base_archive
        path = _write(archive_dir / "n.img",
                      self._resigned(data, lambda m, e: setattr(e, "number", -1)))
        reason = refused(share(work, path), plain, path)
        assert "module number -1 out of range" in reason, reason


def _slots(m, e, kind):
    return [(i, slot) for i, slot, k in fuzz_archive._ptr_slots(m, e) if k == kind]


def _set_slot(m, e, kind, value, which=-1):
    i, slot = _slots(m, e, kind)[which]
    at = e.chunk_off + slot
    m.heap[at:at + 8] = (value % 2 ** 64).to_bytes(8, "little")


def _shift_slot(m, e, kind, delta, which=-1):
    i, slot = _slots(m, e, kind)[which]
    at = e.chunk_off + slot
    old = int.from_bytes(m.heap[at:at + 8], "little")
    m.heap[at:at + 8] = ((old + delta) % 2 ** 64).to_bytes(8, "little")


class TestObjectFields:
    """Re-signed damage to what marshal never reads from a .pyc but the
    constructors compute (native/archive/common/layout/layout_3XX.h,
    pycds_layout_check_object): refused under PYCDSVERIFY=1 on every
    version.  3.12 and 3.13 had no such check until a review crashed them
    with a code object's co_nlocalsplus and a str's UTF-8 pointer."""

    def _mutated(self, data, mutate):
        m = fuzz_archive.Model(data)
        mutate(m, fuzz_archive.entry_of(m, "fuzzpkg.shapes"))
        return m.to_bytes()

    @pytest.mark.parametrize("field", fuzz_archive.code_int_fields()
                             + fuzz_archive.code_ptr_fields())
    def test_code_field(self, base_archive, archive_dir, field):
        """A count off by one, or a per-process pointer set."""
        work, _, data, plain, _ = base_archive
        at = fuzz_archive.code_layout()[field]

        def mutate(m, e):
            o = e.chunk_off + e.root_off + at
            if field in fuzz_archive.code_int_fields():
                old = int.from_bytes(m.heap[o:o + 4], "little", signed=True)
                m.heap[o:o + 4] = (old + 1).to_bytes(4, "little", signed=True)
            else:
                m.heap[o:o + 8] = (0x4141414141410).to_bytes(8, "little")
        path = _write(archive_dir / "c.img", self._mutated(data, mutate))
        reason = refused(share(work, path, PYCDSVERIFY=1), plain, path)
        assert "code object" in reason, reason

    def test_str_utf8_pointer(self, base_archive, archive_dir):
        # shapes.UNIT, "µm²": a non-ASCII constant of the module code.
        work, _, data, plain, _ = base_archive
        lay = fuzz_archive.code_layout()
        found = []

        def mutate(m, e):
            for _, t in fuzz_archive.const_items(m, e, e.root_off):
                if t is None:
                    continue
                o = e.chunk_off + t
                state = int.from_bytes(m.heap[o + lay["str.state"]:o + lay["str.state"] + 4],
                                       "little")
                length = int.from_bytes(m.heap[o + 16:o + 24], "little")
                kind, compact, ascii = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
                if length == 3 and kind == 1 and compact and not ascii:
                    at = o + lay["str.utf8"]
                    m.heap[at:at + 8] = (0x4141414141410).to_bytes(8, "little")
                    found.append(t)
        path = _write(archive_dir / "u.img", self._mutated(data, mutate))
        assert len(found) == 1
        reason = refused(share(work, path, PYCDSVERIFY=1), plain, path)
        assert "str with per-process state" in reason, reason

    @pytest.mark.parametrize("opname", ["INSTRUMENTED_LINE", "ENTER_EXECUTOR", "CACHE",
                                        "RESUME_CHECK", "LOAD_ATTR_SLOT"])
    def test_bytecode(self, base_archive, archive_dir, opname):
        """An instruction a fresh code object never holds, as the module
        code's second (its first, RESUME, the first-traceable count checks
        already): scripts/fuzz_coverage.py found on 3.13 that reading
        co_code of a code object with INSTRUMENTED_LINE follows its NULL
        _co_monitoring (SEGV); a specialised instruction whose caches run
        past the code would be read beyond it.  Checked on 3.11+, whose
        bytecode the interpreter specialises in place."""
        import dis
        import opcode
        if sys.version_info < (3, 11):
            pytest.skip("3.10's bytecode has no specialised or cache units")
        ops = {**getattr(dis, "_all_opmap", {}), **opcode.opmap,
               **getattr(opcode, "_specialized_opmap", {})}
        if opname not in ops:
            pytest.skip(f"no {opname} in this CPython")
        work, _, data, plain, _ = base_archive
        at = fuzz_archive.code_layout()["co_code_adaptive"]

        def mutate(m, e):
            o = e.chunk_off + e.root_off + at
            assert m.heap[o] == opcode.opmap["RESUME"]
            m.heap[o + 2] = ops[opname]
        path = _write(archive_dir / "b.img", self._mutated(data, mutate))
        reason = refused(share(work, path, PYCDSVERIFY=1), plain, path)
        assert "bytecode holds an instruction unmarshal never makes" in reason, reason

    @pytest.mark.parametrize("which", ["module code (tail)", "function code (head)",
                                       "constants tuple"])
    def test_reference_count(self, base_archive, archive_dir, which):
        """A count below the writer's lets the program free archive memory:
        scripts/fuzz_coverage.py found a bad free of a module code object
        whose count was 0."""
        work, _, data, plain, _ = base_archive

        def mutate(m, e):
            if which.startswith("module"):
                off = e.root_off
            elif which.startswith("function"):
                off = fuzz_archive.nested_code(m, e, e.root_off)[0][1]
            else:
                off = fuzz_archive.internal_target(
                    m, e, e.root_off + fuzz_archive.code_layout()["co_consts"])
            o = e.chunk_off + off
            m.heap[o:o + 8] = (1).to_bytes(8, "little")
        path = _write(archive_dir / "r.img", self._mutated(data, mutate))
        reason = refused(share(work, path, PYCDSVERIFY=1), plain, path)
        assert "wrong reference count" in reason, reason

    def test_the_offsets_are_this_interpreters(self, base_archive):
        # The module code object read at the offsets the mutations use has
        # the compiled module's stack size, flags and first line.
        work, _, data, _, _ = base_archive
        lay = fuzz_archive.code_layout()
        m = fuzz_archive.Model(data)
        e = fuzz_archive.entry_of(m, "fuzzpkg.shapes")
        with open(e.origin) as f:
            code = compile(f.read(), e.origin, "exec")

        def i32(name):
            o = e.chunk_off + e.root_off + lay[name]
            return int.from_bytes(m.heap[o:o + 4], "little", signed=True)
        assert (i32("co_stacksize"), i32("co_flags"), i32("co_firstlineno")) == \
            (code.co_stacksize, code.co_flags, code.co_firstlineno)
        nested = fuzz_archive.nested_code(m, e, e.root_off)
        assert len(nested) == sum(isinstance(c, type(code)) for c in code.co_consts)


# 40 nested functions, each with a str constant of its own.
CHAIN = "".join("    " * i + f"def f{i}():\n" + "    " * (i + 1) + f"s = 'a{i}'\n"
                for i in range(40)) + "    " * 40 + "return s\n"


def _chain_archive(tmp_path):
    """(workdir, plain Run, Model and entry of the dumped CHAIN module)."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "chain.py").write_text(CHAIN)
    (work / "app.py").write_text("import chain\nprint(chain.f0.__name__)\n")
    img = str(tmp_path / "c.img")
    dump(str(work), img, args=["app.py"])
    plain = run_python(["app.py"], cwd=str(work))
    m = fuzz_archive.Model.read(img)
    return work, plain, m, fuzz_archive.entry_of(m, "chain")


def _point_a_constant_at(m, e, code, target):
    """Make a relocated co_consts item of the code object at chunk offset
    ``code`` other than its nested code objects (its str) point at chunk
    offset ``target``."""
    slots = ({s for s, _ in fuzz_archive.const_items(m, e, code)}
             - {s for s, _ in fuzz_archive.nested_code(m, e, code)})
    for i, slot, kind in fuzz_archive._ptr_slots(m, e):
        if slot in slots:
            m.set_reloc(i, slot | 0)        # INTERNAL
            at = e.chunk_off + slot
            m.heap[at:at + 8] = target.to_bytes(8, "little")
            return
    raise AssertionError("no other constant")


def _written(tmp_path, m):
    path = tmp_path / "m.img"
    path.write_bytes(m.to_bytes())
    os.chmod(path, 0o644)
    return str(path)


def test_shared_nested_code_objects_are_initialised_once(tmp_path):
    """A code object reached twice through co_consts (marshal's references
    can share one, and so can a crafted archive) is set up once per load
    (3.12+: layout_312_313.h, init_loaded): with each function of a 40-deep
    chain holding the next one twice, a walk without that memory took 2^40
    steps and never finished (found by a review)."""
    work, plain, m, e = _chain_archive(tmp_path)
    code, depth = e.root_off, 0
    while True:
        nested = fuzz_archive.nested_code(m, e, code)
        if not nested:
            break
        (_, inner), = nested
        if code != e.root_off:
            _point_a_constant_at(m, e, code, inner)
        code, depth = inner, depth + 1
    assert depth == 40
    path = _written(tmp_path, m)
    for verify in ("0", "1"):
        r = share(str(work), path, args=["app.py"], PYCDSVERIFY=verify,
                  PYCDSVERBOSE=1, timeout=60)
        assert (r.rc, r.out) == (plain.rc, plain.out) == (0, "f0\n"), r
        assert "chain" in r.served(), r


def test_a_code_object_among_its_own_constants_is_refused(tmp_path):
    """No .pyc can hold one (marshal refuses a reference to a code object
    whose fields it is still reading), and hash() of one recurses without
    end.  Refused under PYCDSVERIFY=1 on every version (verify.c,
    check_acyclic), and by 3.12+'s per-load pass in any mode; before,
    that pass refused it only by running into the depth limit, and after
    it had learned to skip code objects seen before, the process crashed
    (a review)."""
    work, plain, m, e = _chain_archive(tmp_path)
    (_, f0), = fuzz_archive.nested_code(m, e, e.root_off)
    _point_a_constant_at(m, e, f0, f0)
    path = _written(tmp_path, m)
    modes = ("0", "1") if sys.version_info >= (3, 12) else ("1",)
    for verify in modes:
        r = share(str(work), path, args=["app.py"], PYCDSVERIFY=verify, timeout=60)
        reason = refused(r, plain, path)
        assert "contains itself" in reason, (verify, r)
