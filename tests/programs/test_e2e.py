"""End to end: plain, DUMP and SHARE runs in fresh interpreters must agree,
and the share run must really serve the modules from the archive."""

import os
import textwrap
import types

import pytest

from pycds import _archive

from support import dump_and_share, installed, run_python, settle


class TestRoundTrip:
    def test_package_identical_and_served(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app_shop.py"], workspace, img)
        assert plain.rc == 3, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        served = set(share.served())
        assert {"shopkit", "shopkit.catalog", "shopkit.pricing"} <= served
        # stdlib modules imported from source are served too
        assert {"dataclasses", "inspect", "pickle", "asyncio"} <= served
        assert not share.warnings(), share.err
        assert os.stat(img).st_mode & 0o777 == 0o644

    def test_traceback_has_source_lines(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        plain, _, share = dump_and_share(["app_shop.py"], workspace, img)
        assert "return 1 / 0" in share.out
        if hasattr(types.CodeType, "co_positions"):
            # 3.11+ (PEP 657): carets from the archived co_positions
            assert "~~^~~" in share.out
        assert share.out == plain.out

    def test_stats_report_served_modules(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        src = ("import pycds, shopkit, json; s = pycds.stats(); "
               "print(s['served'] >= 3, s['archive'] is not None, s['load_ms'] >= 0, "
               "s['bytes_loaded'] > 0)")
        run_python(["-c", src], cwd=workspace, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        r = run_python(["-c", src], cwd=workspace, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert r.out.split() == ["True"] * 4, r

    def test_stats_have_the_same_keys_when_off(self, workspace, tmp_path):
        img = str(tmp_path / "app.img")
        src = "import pycds, json; print(sorted(pycds.stats()))"
        off = run_python(["-c", src], cwd=workspace)
        run_python(["-c", src], cwd=workspace, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        on = run_python(["-c", src], cwd=workspace, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert off.out == on.out and "startup_plain" in on.out, (off, on)

    def test_exit_paths_still_dump(self, tmp_path):
        (tmp_path / "m.py").write_text("X = 1\n")
        for code, rc in (("import m; raise SystemExit(7)", 7),
                         ("import m; raise KeyError('k')", 1)):
            img = str(tmp_path / f"a{rc}.img")
            r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
            assert r.rc == rc
            assert os.path.exists(img), r
            s = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE=1)
            assert s.rc == rc and "m" in s.served(), s

    def test_the_dump_api(self, tmp_path):
        (tmp_path / "m.py").write_text("X = 1\n")
        (tmp_path / "n.py").write_text("Y = 2\n")
        img = tmp_path / "api.img"
        r = run_python(["-c", f"import m, pycds; print(pycds.dump({str(img)!r}, ['n', 'nope']))"],
                       cwd=tmp_path)
        assert r.rc == 0 and int(r.out) > 2, r
        assert "module 'nope' not archived: importing it raised ModuleNotFoundError" \
            in r.err, r
        names = {e.name for e in _archive.Index.open(str(img)).entries()}
        assert {"m", "n"} <= names and "pycds" not in names
        s = run_python(["-c", "import m, n; print(m.X + n.Y)"], cwd=tmp_path,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=str(img), PYCDSVERBOSE=1)
        assert s.out == "3\n" and {"m", "n"} <= set(s.served()), s
        # No path given: $PYCDSARCHIVE, as a DUMP run would use.
        env_img = tmp_path / "env.img"
        r = run_python(["-c", "import m, pycds; pycds.dump()"], cwd=tmp_path,
                       PYCDSARCHIVE=str(env_img))
        assert r.rc == 0 and "m" in {e.name for e in _archive.Index.open(str(env_img)).entries()}
        r = run_python(["-c", "import pycds; pycds.dump('x.img', [b'm'])"], cwd=tmp_path)
        assert "TypeError: module names are str, not bytes" in r.err, r

    @pytest.mark.parametrize("length", [214, 226, 240, 255])
    def test_archive_names_up_to_name_max_are_written(self, tmp_path, length):
        # The temporary name made from the archive's name must fit NAME_MAX
        # (255 bytes) too; two-byte characters end some cuts mid-character.
        (tmp_path / "m.py").write_text("X = 1\n")
        name = ("\u00e9" * 200 + "a" * 255).encode()[:length - 4].decode("utf-8", "ignore")
        name = name + "x" * (length - 4 - len(name.encode())) + ".img"
        assert len(name.encode()) == length
        img = str(tmp_path / name)
        for _ in range(2):      # the second one replaces the first
            r = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=img)
            assert r.rc == 0 and r.err == "", r
        assert sorted(set(os.listdir(tmp_path)) - {"__pycache__"}) == sorted(["m.py", name])
        s = run_python(["-c", "import m"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "m" in s.served(), s

    def test_two_dumps_write_the_same_heap(self, tmp_path):
        """The heap and relocations of an archive are a function of the
        code archived: two DUMP runs of one program (one PYTHONHASHSEED, for
        the frozensets' order) write the same bytes.  Stale process memory
        copied with an object (padding its constructor never writes: 3.11's
        code objects, found by valgrind) made them differ; the header's
        archive id, time and the checksums keyed by that id legitimately
        do."""
        for i in range(3):
            src = "".join(
                f"def f{j}(a, b={j}, *, c='{i}.{j}'):\n"
                f"    return [a * b for _ in range({j})], lambda: c\n"
                for j in range(40))
            (tmp_path / f"det{i}.py").write_text(
                f'"""Module {i}."""\n{src}'
                f"class K{i}:\n    S = frozenset({{'x', 'y', {i}}})\n"
                f"    def m(self):\n        return {2 ** 70 + i}, -{i}.5, {i}j\n")
            installed(tmp_path / f"det{i}.py")
        settle(tmp_path)
        code = "import det0, det1, det2, json"
        heaps = []
        for n in (1, 2):
            img = tmp_path / f"a{n}.img"
            r = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP",
                           PYCDSARCHIVE=str(img), PYTHONHASHSEED=0)
            assert r.rc == 0 and os.path.exists(img), r
            data = img.read_bytes()
            h = _archive.Header.unpack(data)
            assert h.nmodules >= 4
            heaps.append((h.heap_len, h.reloc_count,
                          data[h.heap_off:h.heap_off + h.heap_len],
                          data[h.reloc_off:h.reloc_off + 4 * h.reloc_count]))
        (len1, n1, heap1, rel1), (len2, n2, heap2, rel2) = heaps
        assert (len1, n1) == (len2, n2)
        assert rel1 == rel2
        diff = [i for i, (a, b) in enumerate(zip(heap1, heap2)) if a != b]
        assert not diff, f"{len(diff)} heap bytes differ, first at {diff[:8]}"


    def test_the_loader_is_plain_imports(self, tmp_path):
        """Exact type, repr, equality and pickling, before and after the
        module ran (CPython's test_import looks loaders up by exact type)."""
        (tmp_path / "m.py").write_text("X = 1\n")
        (tmp_path / "use.py").write_text(textwrap.dedent('''\
            import copy, importlib.util, pickle, sys
            from importlib.machinery import SourceFileLoader
            spec = importlib.util.find_spec("m")
            print(type(spec.loader) is SourceFileLoader, repr(spec.loader).split(" at ")[0])
            again = importlib.util.find_spec("m")
            print(again == spec, again.loader == spec.loader, len({again.loader, spec.loader}))
            early = copy.deepcopy(spec)
            print(type(early.loader).__name__, early.loader.get_code("m").co_filename == spec.origin)
            print(pickle.loads(pickle.dumps(spec.loader)).get_code("m").co_names)
            fresh = SourceFileLoader("m", spec.origin)
            print(b"pycds" in pickle.dumps(spec), vars(early.loader) == vars(fresh),
                  vars(copy.copy(spec.loader)) == vars(fresh))
            # two threads running one spec both get code (one holding the
            # get_code it looked up before the other's call)
            stale = spec.loader.get_code
            print(type(spec.loader.get_code("m")).__name__, type(stale("m")).__name__)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["m"] = mod
            spec.loader.exec_module(mod)
            fresh = SourceFileLoader("m", spec.origin)
            print(mod.X, spec.loader == fresh, vars(spec.loader) == vars(fresh))
            print({SourceFileLoader: "pure Python"}[type(mod.__loader__)])
            print(pickle.loads(pickle.dumps(mod.__spec__)) == mod.__spec__,
                  copy.deepcopy(mod.__spec__) == mod.__spec__)
            print(mod.__loader__.get_code("m").co_names)
            '''))
        img = str(tmp_path / "a.img")
        run_python(["use.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        plain = run_python(["use.py"], cwd=tmp_path)
        r = run_python(["use.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert plain.rc == 0 and plain.out.splitlines()[0] == (
            "True <_frozen_importlib_external.SourceFileLoader object"), plain
        assert r.rc == 0 and r.out == plain.out, (plain, r)
        assert "m" in r.served() and not r.warnings(), r
