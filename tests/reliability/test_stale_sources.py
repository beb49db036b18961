"""Issue 3, part 4: stale and shadowed sources beyond tests/share/test_freshness.py.

Every case compares a SHARE run with a plain run made under the same
conditions *at the same moment*: pycds may serve or fall back, but the
program must see what plain import gives it.
"""

import os
import py_compile
import textwrap

import pytest

from support import run_python


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def runs(cwd, args, img, **env):
    # SHARE first: a plain run may rewrite a .pyc and so hide a stale serve.
    share = run_python(args, cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1, **env)
    plain = run_python(args, cwd=cwd, **env)
    assert (share.rc, share.out) == (plain.rc, plain.out), (plain, share)
    # Only the stale-archive line a SHARE run may print at exit (pycds.share.stale_report).
    others = [w for w in share.warnings()
              if " archived modules this run imported were stale" not in w]
    assert not others and len(share.warnings()) <= 1, share
    return plain, share


def dump(cwd, args, img, **env):
    r = run_python(args, cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=img, **env)
    assert os.path.exists(img), r
    return r


def same_size_edit(path, old, new):
    """Replace old by new (same length) and restore the mtime."""
    assert len(old) == len(new)
    st = os.stat(path)
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


class TestPathRewriting:
    def test_init_rewrites_path(self, tmp_path):
        """pkg/__init__.py points __path__ at a directory chosen by an
        environment variable: pkg.mod comes from there, and the archived
        pkg.mod is served only when it is the file plain import picks."""
        write(tmp_path / "pkg/__init__.py", """
            import os
            __path__ = [os.path.join(os.path.dirname(__file__),
                                     os.environ.get("IMPL", "fast"))]
            """)
        write(tmp_path / "pkg/mod.py", "WHO = 'shadowed'\n")
        write(tmp_path / "pkg/fast/mod.py", "WHO = 'fast'\n")
        write(tmp_path / "pkg/slow/mod.py", "WHO = 'slow'\n")
        img = str(tmp_path / "a.img")
        args = ["-c", "import pkg.mod; print(pkg.mod.WHO, pkg.__path__[0][-4:])"]
        dump(tmp_path, args, img, IMPL="fast")
        plain, share = runs(tmp_path, args, img, IMPL="fast")
        assert plain.out.split()[0] == "fast" and "pkg.mod" in share.served()
        plain, share = runs(tmp_path, args, img, IMPL="slow")
        assert plain.out.split()[0] == "slow"
        assert "pkg.mod" not in share.served()
        assert any("pkg.mod: resolves to another file" in f for f in share.fallbacks())

    def test_path_extended_at_runtime(self, tmp_path):
        """A submodule found through a __path__ entry appended later."""
        write(tmp_path / "pkg/__init__.py", "")
        write(tmp_path / "extra/pkg_extra.py", "V = 2\n")
        write(tmp_path / "pkg/pkg_extra.py", "V = 1\n")
        code = ("import pkg, os; pkg.__path__.insert(0, os.path.abspath('extra'));"
                "import pkg.pkg_extra as m; print(m.V)")
        img = str(tmp_path / "a.img")
        dump(tmp_path, ["-c", code], img)
        plain, share = runs(tmp_path, ["-c", code], img)
        assert plain.out.strip() == "2" and "pkg.pkg_extra" in share.served()


class TestUnusualModules:
    def test_module_replaces_its_sys_modules_entry(self, tmp_path):
        write(tmp_path / "replaced.py", """
            import sys
            class _Proxy:
                answer = 42
                def __getattr__(self, name):
                    raise AttributeError(name)
            sys.modules[__name__] = _Proxy()
            """)
        args = ["-c", "import replaced; print(type(replaced).__name__, replaced.answer)"]
        img = str(tmp_path / "a.img")
        d = dump(tmp_path, args, img)
        assert d.rc == 0 and not d.err, d
        plain, share = runs(tmp_path, args, img)
        assert plain.out.split() == ["_Proxy", "42"]
        # The module body ran from the archive (its code was archived under
        # its spec before the entry was replaced? no: sys.modules holds the
        # proxy at exit, so it is not archived and imports plainly).
        assert "replaced" not in share.served()

    def test_module_getattr(self, tmp_path):
        """PEP 562 __getattr__ answering every name (also __spec__-like
        ones) must not confuse the dump, and lazy submodules still work."""
        write(tmp_path / "lazy/__init__.py", """
            import importlib
            def __getattr__(name):
                if name.startswith("sub"):
                    return importlib.import_module("." + name, __name__)
                return f"<{name}>"
            """)
        write(tmp_path / "lazy/sub1.py", "X = 'one'\n")
        args = ["-c", "import lazy; print(lazy.sub1.X, lazy.whatever, lazy.__loader__ is not None)"]
        img = str(tmp_path / "a.img")
        dump(tmp_path, args, img)
        plain, share = runs(tmp_path, args, img)
        assert plain.out.split() == ["one", "<whatever>", "True"]
        assert {"lazy", "lazy.sub1"} <= set(share.served())


class TestHashBasedPycs:
    """PEP 552 pycs: plain import checks a checked one against the source,
    trusts an unchecked one, and --check-hash-based-pycs overrides both."""

    def _setup(self, tmp_path, mode):
        src = write(tmp_path / "hb.py", "VALUE = 'old'\n")
        py_compile.compile(str(src), invalidation_mode=mode, doraise=True)
        return src

    @pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.CHECKED_HASH,
                                      py_compile.PycInvalidationMode.UNCHECKED_HASH])
    @pytest.mark.parametrize("policy", ["default", "always", "never"])
    def test_edit_same_size_same_mtime(self, tmp_path, mode, policy):
        src = self._setup(tmp_path, mode)
        opt = ["--check-hash-based-pycs", policy]
        args = [*opt, "-c", "import hb; print(hb.VALUE)"]
        img = str(tmp_path / "a.img")
        dump(tmp_path, args, img, PYTHONDONTWRITEBYTECODE=1)
        plain, share = runs(tmp_path, args, img, PYTHONDONTWRITEBYTECODE=1)
        assert plain.out.strip() == "old" and "hb" in share.served()
        # An edit that keeps size and mtime: only a source hash sees it.
        same_size_edit(src, "'old'", "'new'")
        plain, share = runs(tmp_path, args, img, PYTHONDONTWRITEBYTECODE=1)
        checks = policy == "always" or (
            policy == "default" and mode == py_compile.PycInvalidationMode.CHECKED_HASH)
        assert plain.out.strip() == ("new" if checks else "old")

    @pytest.mark.parametrize("dump_policy,share_policy", [
        ("default", "always"), ("always", "never"), ("never", "default")])
    def test_policy_changes_between_dump_and_share(self, tmp_path, dump_policy,
                                                   share_policy):
        src = self._setup(tmp_path, py_compile.PycInvalidationMode.UNCHECKED_HASH)
        # The pyc is stale from the start: it says 'old', the source 'new'.
        src.write_text("VALUE = 'new!'\n")
        code = "import hb; print(hb.VALUE)"
        img = str(tmp_path / "a.img")
        dump(tmp_path, ["--check-hash-based-pycs", dump_policy, "-c", code], img,
             PYTHONDONTWRITEBYTECODE=1)
        plain, share = runs(tmp_path, ["--check-hash-based-pycs", share_policy, "-c", code],
                            img, PYTHONDONTWRITEBYTECODE=1)
        assert plain.out.strip() == ("new!" if share_policy == "always" else "old")

    def test_source_date_epoch_build(self, tmp_path):
        """SOURCE_DATE_EPOCH makes py_compile (and compileall) write checked
        hash pycs, as reproducible-build tooling does."""
        src = write(tmp_path / "repro/mod.py", "STAMP = 'aaa'\n")
        write(tmp_path / "repro/__init__.py", "")
        r = run_python(["-m", "compileall", "-q", "repro"], cwd=tmp_path,
                       SOURCE_DATE_EPOCH="1700000000")
        assert r.rc == 0, r
        pyc = next((tmp_path / "repro/__pycache__").glob("mod.*.pyc"))
        assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 3  # checked hash
        args = ["-c", "import repro.mod as m; print(m.STAMP)"]
        img = str(tmp_path / "a.img")
        dump(tmp_path, args, img, SOURCE_DATE_EPOCH="1700000000")
        plain, share = runs(tmp_path, args, img, SOURCE_DATE_EPOCH="1700000000")
        assert plain.out.strip() == "aaa" and "repro.mod" in share.served()
        same_size_edit(src, "'aaa'", "'bbb'")
        plain, share = runs(tmp_path, args, img, SOURCE_DATE_EPOCH="1700000000")
        assert plain.out.strip() == "bbb"


class TestSearchPathChanges:
    def test_pythonpath_changes_between_dump_and_share(self, tmp_path):
        write(tmp_path / "a/conf.py", "WHERE = 'a'\n")
        write(tmp_path / "b/conf.py", "WHERE = 'b'\n")
        write(tmp_path / "b/only_b.py", "X = 1\n")
        args = ["-c", "import conf; print(conf.WHERE)"]
        img = str(tmp_path / "x.img")
        dump(tmp_path, args, img, PYTHONPATH=str(tmp_path / "a"))
        plain, share = runs(tmp_path, args, img, PYTHONPATH=str(tmp_path / "a"))
        assert plain.out.strip() == "a" and "conf" in share.served()
        for pp in (str(tmp_path / "b"), f"{tmp_path / 'b'}:{tmp_path / 'a'}"):
            plain, share = runs(tmp_path, args, img, PYTHONPATH=pp)
            assert plain.out.strip() == "b" and "conf" not in share.served()
        # Gone from the path altogether: plain fails, and so does SHARE.
        plain, share = runs(tmp_path, args, img, PYTHONPATH=str(tmp_path / "nowhere"))
        assert plain.rc == 1 and "ModuleNotFoundError" in plain.err
        assert "ModuleNotFoundError" in share.err
