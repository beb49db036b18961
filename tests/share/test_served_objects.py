"""Archived objects behave as unmarshalled ones: wide strings through the
wchar_t C API, re-interned strings, frozenset iteration order."""

import sys
import textwrap

import pytest

from support import dump_and_share, installed, run_python, settle


class TestWideStrings:
    """Archived strs reach the wchar_t C API as unmarshalled ones do (3.10
    and 3.11 share a 4-byte-kind str's code units as its wstr; an archived
    copy without it passed non-BMP text on as UTF-16 halves)."""

    CONSTS = textwrap.dedent('''\
        S4 = "\\U00010000\\U0010ffff"
        MIXED = "UCS:\\xe9\\u20ac\\U0010ffff"
        EMOJI = "x\\U0001f600y"
        BMP = "\\u4e2d\\u6587"
        LATIN = "caf\\xe9"
        IDENT = "a non-BMP identifier"
        NAMES = tuple(n for n in dir() if not n.startswith("_"))
        ''')
    APP = textwrap.dedent('''\
        import ctypes, locale
        import consts
        for name in consts.NAMES:
            s = getattr(consts, name)
            if not isinstance(s, str):
                continue
            buf = ctypes.create_unicode_buffer(s)
            print(name, ascii(buf[:]), ascii(buf.value), len(buf))
            print(name, ascii(locale.strxfrm(s)), s.isidentifier())
        print(ascii(consts.NAMES))
        ''')

    def test_non_bmp_constants_through_wchar_t(self, tmp_path):
        # An identifier of a non-BMP letter (U+10000, LINEAR B SYLLABLE
        # B008 A): an interned 4-byte-kind str.
        src = self.CONSTS.replace("IDENT", "\U00010000")
        (tmp_path / "consts.py").write_text(src, encoding="utf-8")
        (tmp_path / "app.py").write_text(self.APP)
        installed(tmp_path / "consts.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img)
        assert plain.rc == 0, plain
        assert "'\\U00010000\\U0010ffff\\x00'" in plain.out, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "consts" in share.served(), share
        verified = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE",
                              PYCDSARCHIVE=img, PYCDSVERIFY=1, PYCDSVERBOSE=1)
        assert (verified.rc, verified.out) == (plain.rc, plain.out), verified
        assert "consts" in verified.served(), verified


class TestManyInternedStrings:
    """A module whose load re-interns more strings than one growth of the
    interned dict makes room for (3.13 reserves that room before interning,
    pycds/native layout_313.h): served, in batches, as plain import runs it.
    It used to spin for good in the reservation."""

    def test_more_strings_than_one_resize_makes_room_for(self, tmp_path):
        names = ", ".join(f'"name_{i}"' for i in range(60000))
        (tmp_path / "many.py").write_text(f"NAMES = ({names},)\n")
        (tmp_path / "app.py").write_text(
            "import sys, many\n"
            "print(len(many.NAMES), sum(sys.intern(n) is n for n in many.NAMES))\n")
        installed(tmp_path / "many.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img)
        assert (plain.rc, plain.out) == (0, "60000 60000\n"), plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out), dump
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "many" in share.served() and not share.warnings(), share


class TestFrozensetOrder:
    """A frozenset constant iterates as plain import's does: unmarshal adds
    its items in the order the .pyc holds them (3.11+: sorted by their own
    marshalled bytes), and so does the load (3.10 writes them in the writing
    process's order, unknown to the dump: only the items are compared)."""

    CONSTS = textwrap.dedent('''\
        def ints(x):
            return x in {0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120,
                         128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 256, 384, 392}
        def mixed(x):
            return x in {"name", "not an identifier", 10 ** 20, 2.5, -7, (1, "t"), b"b", 1j}
        def strs(x):
            return x in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta",
                         "theta", "iota", "kappa", "lambda", "mu", "nu", "xi"}
        def shared(x):
            return x in {10 ** 20, 2.5}, 2.5
        ''')
    APP = textwrap.dedent('''\
        import consts
        for f in (consts.ints, consts.mixed, consts.strs, consts.shared):
            fs, = [c for c in f.__code__.co_consts if type(c) is frozenset]
            print(f.__name__, [repr(v) for v in fs] if f.__name__ in ORDER
                  else sorted(map(repr, fs)))
        ''')

    @pytest.mark.parametrize("seed", ["0", "1", "random"])
    def test_iteration_order_is_plains(self, tmp_path, seed):
        (tmp_path / "consts.py").write_text(self.CONSTS)
        # Where the order is plain's own on every run: strs only under one
        # PYTHONHASHSEED.
        order = {"ints", "shared"} | ({"mixed", "strs"} if seed != "random" else set())
        if sys.version_info < (3, 11):
            order = set()
        (tmp_path / "app.py").write_text(f"ORDER = {sorted(order)}\n" + self.APP)
        installed(tmp_path / "consts.py")
        settle(tmp_path)
        img = str(tmp_path / "app.img")
        env = {"PYTHONHASHSEED": seed}
        plain, dump, share = dump_and_share(["app.py"], tmp_path, img, extra_env=env)
        assert plain.rc == 0, plain
        assert (share.rc, share.out) == (plain.rc, plain.out), share
        assert "consts" in share.served(), share
