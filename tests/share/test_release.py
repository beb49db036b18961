"""Memory given back once a module body ran (native/archive/loader/release.c).

Every SHARE child of the suite runs with PYCDSRELEASE=protect (support.clean_env):
the pages given back are made inaccessible, so a use of anything released
faults.  These tests build modules whose constants live on in every way a
module keeps them (globals, default arguments, class attributes and
docstrings, the module's own code object held by the program, a traceback
of a failed body) and check that the accelerated run prints exactly what the
plain one prints, in both modes, and that memory was given back."""

import os
import sys
import sysconfig
import textwrap

import pytest

from support import dump_and_share, installed, run_python, settle

RELEASES = sys.version_info >= (3, 11)    # 3.10 chunks hold raw data: kept
# What goes back is whole pages of this size (16 or 64 KiB on some aarch64
# kernels: scripts/aarch64_check.sh); the bounds below are for 4 KiB.
PAGE = os.sysconf("SC_PAGESIZE")

# Dead after the body ran: the string constants only len() sees, the
# bytecode and line table of 3000 statements (well over a page).
FILLER = "".join(f"_d = len('padding constant number {i} of the module body')\n"
                 for i in range(3000)) + "del _d\n"

RELMOD = '''"""Docstring of relmod."""
import sys
GREETING = "hello " + "world, folded"
TABLE = (1, "two words", (3.5, "x y z"), 10 ** 20, -7.25)
BIG = 123456789012345678901234567890
FROZEN = frozenset({"a b", "c d"})
def f(a="default arg value", b=(1, 2, "three four")):
    """f's docstring."""
    return a, b
class K:
    """Docstring of K."""
    ATTR = ("class", "attr tuple", 42, 2.5)
    NAME = "class attr string"
    def m(self, x="method default"):
        return self.ATTR, x
    class Inner:
        DEEP = ("inner class", "tuple")
        def g(self):
            return self.DEEP
''' + FILLER

USE = '''import gc, inspect, sys
import relmod
gc.collect()
from relmod import *
r = relmod
print(r.__doc__, r.GREETING, r.TABLE, r.BIG, sorted(r.FROZEN))
print(r.f(), r.f.__defaults__, r.f.__doc__)
print(r.K.__doc__, r.K.ATTR, r.K.NAME, r.K().m(), r.K.Inner().g())
print(inspect.getsource(r.K.m).strip())
print(r.GREETING == "hello world, folded", type(r.TABLE[3]).__name__)
print(sys.intern("default arg value") is not None)
import pycds
print("released", pycds.stats()["released_bytes"], file=sys.stderr)
'''


def released(run):
    for line in run.err.splitlines():
        if line.startswith("released "):
            return int(line.split()[1])
    raise AssertionError(f"no released line: {run!r}")


@pytest.fixture
def app(tmp_path):
    (tmp_path / "relmod.py").write_text(RELMOD)
    (tmp_path / "use.py").write_text(USE)
    return tmp_path


@pytest.mark.parametrize("mode", ["1", "protect"])
def test_constants_live_on_and_memory_is_given_back(app, mode):
    plain, dump, share = dump_and_share(
        ["use.py"], app, str(app / "a.img"), extra_env={"PYCDSRELEASE": mode})
    assert plain.rc == 0 and dump.rc == 0, (plain, dump)
    assert share.rc == 0, share
    assert "relmod" in share.served()
    assert share.out == plain.out
    assert not share.warnings()
    if RELEASES:
        # The 3000 statements' bytecode, line table and dead constants.
        assert released(share) >= 64 * 1024
    else:
        assert released(share) == 0


def test_off_gives_nothing_back(app):
    dump_and_share(["use.py"], app, str(app / "a.img"))
    off = run_python("use.py", cwd=app, PYCDSMODE="SHARE",
                     PYCDSARCHIVE=str(app / "a.img"), PYCDSRELEASE="0")
    assert off.rc == 0 and released(off) == 0, off


HEAP_RSS = '''
def heap_rss(obj, with_size=False):
    # Rss of the mapping holding obj: the archive heap for an archived object
    # (and the mapping's size: the kernel may merge an adjacent anonymous
    # mapping into it, which the Rss then includes).
    addr, inside = id(obj), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= addr < hi
            elif inside and head[0] == "Rss:":
                rss = int(head[1]) * 1024
                return (rss, hi - lo) if with_size else rss
'''

RSS_OF_HEAP = '''import sys, time, relmod, pycds
given = pycds.stats()["released_bytes"]
# With read-ahead, the pages go back once imports pause (200 ms).
time.sleep(float(sys.argv[1]))
''' + HEAP_RSS + '''print(heap_rss(relmod.f.__code__), given)
'''


@pytest.mark.skipif(not RELEASES, reason="3.10 chunks are kept whole")
@pytest.mark.parametrize("prefetch,pause", [("0", "0"), ("1", "0.8")])
def test_given_back_pages_leave_the_resident_set(app, prefetch, pause):
    (app / "rss.py").write_text(RSS_OF_HEAP)
    dump_and_share(["rss.py", "0"], app, str(app / "a.img"))
    got = {}
    for mode in ("0", "1"):
        r = run_python(["rss.py", pause], cwd=app, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(app / "a.img"), PYCDSRELEASE=mode,
                       PYCDSPREFETCH=prefetch)
        assert r.rc == 0, r
        got[mode] = tuple(map(int, r.out.split()))
    (rss_kept, _), (rss_released, given) = got["0"], got["1"]
    assert given >= 64 * 1024
    assert rss_kept - rss_released == given


HOLDS_CODE = '''"""Keeps its own code object."""
import sys
CODE = sys._getframe().f_code
NAMES = CODE.co_names
''' + FILLER


def test_a_module_that_keeps_its_code_object(app):
    (app / "holder.py").write_text(HOLDS_CODE)
    (app / "use2.py").write_text(textwrap.dedent('''\
        import dis, gc, io, holder
        gc.collect()
        out = io.StringIO()
        dis.dis(holder.CODE, file=out)
        print(len(out.getvalue().splitlines()), holder.CODE.co_consts[:4])
        print(holder.NAMES[:5], holder.CODE.co_filename.endswith("holder.py"))
        ns = {"__name__": "again"}
        exec(holder.CODE, ns)
        print(ns["CODE"].co_name, len(ns["NAMES"]))
        '''))
    plain, dump, share = dump_and_share(["use2.py"], app, str(app / "a.img"))
    assert share.rc == 0 and share.out == plain.out, (plain, share)
    assert "holder" in share.served()


FAILS = '''"""Its body fails half way (when FAIL is set: the DUMP run has
to import it to archive it)."""
import os
VALUE = ("kept by the frame", 1)
def helper():
    return VALUE
''' + FILLER + '''if os.environ.get("FAIL"):
    raise ValueError("the body failed: " + str(len(VALUE)))
'''


def test_a_failed_body_and_its_traceback(app):
    (app / "fails.py").write_text(FAILS)
    (app / "dumpit.py").write_text("import fails\n")
    (app / "use3.py").write_text(textwrap.dedent('''\
        import gc, sys, traceback
        try:
            import fails
        except ValueError as e:
            err = e
        gc.collect()
        tb = err.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        print(tb.tb_frame.f_globals["VALUE"], tb.tb_frame.f_code.co_name, tb.tb_lineno)
        print(tb.tb_frame.f_globals["helper"]())
        print("".join(traceback.format_exception_only(type(err), err)).strip())
        del err, tb
        gc.collect()
        try:
            import fails        # again: plain import, the same failure
        except ValueError as e:
            print("again:", e)
        '''))
    dump = run_python("dumpit.py", cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(app / "a.img"))
    assert dump.rc == 0, dump
    plain = run_python("use3.py", cwd=app, FAIL="1")
    share = run_python("use3.py", cwd=app, FAIL="1", PYCDSMODE="SHARE",
                       PYCDSARCHIVE=str(app / "a.img"), PYCDSVERBOSE="1")
    assert plain.rc == 0, plain
    assert share.rc == 0 and share.out == plain.out, (plain, share)
    assert "fails" in share.served()


CACHES = '''"""Reads attributes CPython caches on a code object, as dis, a
debugger or a pickler would."""
import sys
CO_CODE = sys._getframe().f_code.co_code
def _gone(a, b):
    return a + b
VARNAMES = _gone.__code__.co_varnames
GONE_CODE = _gone.__code__.co_code
del _gone
''' + FILLER


@pytest.mark.skipif(not RELEASES, reason="3.10 chunks are kept whole")
def test_caches_of_given_back_code_objects_are_freed(app):
    """A code object given back frees what code_dealloc frees: the cached
    co_code (3.11+) and co_varnames (3.12+) are then held only by the
    program, as with plain import (they leaked before)."""
    (app / "caches.py").write_text(CACHES)
    (app / "use5.py").write_text(textwrap.dedent('''\
        import sys, caches, pycds
        pycds.stats()       # gives back what the body left dead
        print([sys.getrefcount(getattr(caches, n))
               for n in ("CO_CODE", "VARNAMES", "GONE_CODE")])
        '''))
    # Installed a while ago: the dump archives the code its import ran,
    # which tells it that _gone does not outlive the body (as in
    # test_functions_the_module_drops_are_given_back).
    installed(app / "caches.py")
    settle(app)
    plain, dump, share = dump_and_share(["use5.py"], app, str(app / "a.img"))
    assert plain.rc == 0 and dump.rc == 0, (plain, dump)
    assert "caches" in share.served(), share
    assert share.rc == 0 and share.out == plain.out, (plain, share)
    assert plain.out.strip() == "[2, 2, 2]", plain


def test_reload_after_release(app):
    (app / "use4.py").write_text(textwrap.dedent('''\
        import importlib, relmod
        relmod.GREETING = "changed"
        importlib.reload(relmod)
        print(relmod.GREETING, relmod.f(), relmod.K().m())
        '''))
    plain, dump, share = dump_and_share(["use4.py"], app, str(app / "a.img"))
    assert share.rc == 0 and share.out == plain.out, (plain, share)
    assert not share.warnings()
    if RELEASES:
        assert any("ran before and was released" in f for f in share.fallbacks()), share


def test_no_pycds_frame_around_a_module_body(app):
    """Release happens on a later import, not in a wrapper around the body:
    tracebacks and warnings' stacklevel see exactly plain import's frames."""
    (app / "warnmod.py").write_text(
        "import os, warnings\n"
        "warnings.warn('from the body', UserWarning, stacklevel=2)\n"
        "if os.environ.get('FAIL'):\n"
        "    raise ValueError('body failed')\n" + FILLER)
    (app / "use5.py").write_text("import warnmod\nimport json\n")
    dump = run_python("use5.py", cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=str(app / "a.img"))
    assert dump.rc == 0, dump
    for fail in ("", "1"):
        plain = run_python("use5.py", cwd=app, FAIL=fail)
        share = run_python("use5.py", cwd=app, FAIL=fail, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=str(app / "a.img"))
        assert "use5.py:1: UserWarning: from the body" in plain.err
        assert (share.rc, share.err) == (plain.rc, plain.err)


FORKS = '''import os, sys, relmod, pycds
given = pycds.stats()["released_bytes"]
pid = os.fork()          # at once: the pages still wait for the quiet moment
''' + HEAP_RSS + '''rss, size = heap_rss(relmod.f.__code__, True)
if pid == 0:
    print("child", rss, given, size, relmod.K().m(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", rss, given, size, relmod.f())
'''


@pytest.mark.skipif(not RELEASES, reason="3.10 chunks are kept whole")
def test_pages_waiting_to_go_back_go_before_a_fork(app):
    """A program that forks right after its imports (a pre-fork server): the
    pages queued for the read-ahead thread are given back before fork()."""
    (app / "forks.py").write_text(FORKS)
    dump_and_share(["forks.py"], app, str(app / "a.img"))
    def run(mode):
        r = run_python("forks.py", cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=str(app / "a.img"),
                       PYCDSRELEASE=mode, PYCDSPREFETCH="1")
        assert r.rc == 0, r
        rows = {line.split()[0]: line.split()[1:4] for line in r.out.splitlines()}
        return {who: int(v[0]) for who, v in rows.items()}, int(rows["parent"][1]), \
            {int(v[2]) for v in rows.values()}

    # Whether the read-ahead thread had also read the next chunks of the
    # archive before fork() (a few hundred KiB more resident, released or
    # not) differs from run to run: the two runs are compared once they
    # agree on it.  Pages not given back before fork() never make the
    # difference the released bytes.
    seen = []
    for _ in range(8):
        (rss0, _, size0), (rss1, given, size1) = run("0"), run("1")
        seen.append((rss0, rss1, size0, size1))
        if size0 == size1 and all(rss0[w] - rss1[w] == given for w in ("child", "parent")):
            break
    else:
        raise AssertionError(f"released {given} bytes before fork(), never seen: {seen}")
    assert given >= 64 * 1024


# Small modules: each tail well under a page, with constant tuples that live
# on (function defaults, __slots__, a global) among dead ones (from-lists).
SMALL = '''from os.path import join, split
def f{i}(a=({i}, "default tuple {i}"), b=("x", "y")):
    return a, b
class C{i}:
    __slots__ = ("p{i}", "q{i}")
    def m(self, k=({i}.5, "method default")):
        return k
KEEP{i} = ("global", "tuple", {i})
for _w in ("dead", "loop", "tuple"):
    pass
_t = [n for n in (1, 2, 3) if n in (2, 3)]
'''

# As many as give about three pages of tails (~1.6 KB each): 40 with pages
# of 4 or 16 KiB, 120 with 64 KiB.
NSMALL = max(40, 3 * PAGE // 1600)
SMALL_USE = '''import sys, pycds
import ''' + ", ".join(f"small{i}" for i in range(NSMALL)) + '''
mods = [sys.modules[f"small{i}"] for i in range(''' + str(NSMALL) + ''')]
print([(getattr(m, f"f{i}")(), getattr(m, f"C{i}").__slots__,
        getattr(m, f"C{i}")().m(), getattr(m, f"KEEP{i}")) for i, m in enumerate(mods)])
print("released", pycds.stats()["released_bytes"], file=sys.stderr)
'''


@pytest.mark.skipif(not RELEASES, reason="3.10 chunks are kept whole")
def test_small_tails_go_back_together(tmp_path):
    # Tails of a few hundred bytes each: no page of their own, but packed
    # together (loader.c) they fill pages, and the constant tuples that stay
    # alive sit before the tails (writer.c) instead of pinning their pages.
    for i in range(NSMALL):
        (tmp_path / f"small{i}.py").write_text(SMALL.format(i=i))
    (tmp_path / "use.py").write_text(SMALL_USE)
    img = str(tmp_path / "s.img")
    plain, dump, share = dump_and_share(["use.py"], tmp_path, img)
    assert share.rc == 0 and share.out == plain.out, share
    from pycds import _archive
    index = _archive.Index.open(img)
    tails = [index.lookup(f"small{i}") for i in range(NSMALL)]
    tail_bytes = sum(e.chunk_len - e.root_off for e in tails)
    assert max(e.chunk_len - e.root_off for e in tails) < 4096
    if 2 * PAGE > tail_bytes:
        pytest.skip(f"{tail_bytes} bytes of tails fill fewer than 2 pages of {PAGE}")
    assert released(share) >= tail_bytes // 2, (released(share), tail_bytes)


# A module that defines functions it does not keep: one it calls and deletes,
# one it replaces (as operator.py replaces its own with _operator's), a class
# method it overrides.  Each is big: well over a page of bytecode, line
# table and constants.  With KEEP set (the SHARE run only), it keeps one of
# them: the dump run's prediction is then wrong for that one.
BIG_BODY = "".join(f"    _v = len('statement {i} of a function the module drops')\n"
                   for i in range(1500))
DROPS = f'''"""Defines functions and drops them."""
import os
def _setup():
{BIG_BODY}    return "set up"
STATE = _setup()
def replaced(x):
{BIG_BODY}    return "python " + str(x)
replaced = repr
class Shape:
    def area(self):
{BIG_BODY.replace("    ", "        ")}        return "slow area"
    area = lambda self: "fast area"
if os.environ.get("KEEP"):
    KEPT = _setup
del _setup
'''

USE_DROPS = '''import gc, sys, drops
gc.collect()
import json      # the next import gives back what the body left dead
print(drops.STATE, drops.replaced(3), drops.Shape().area())
kept = getattr(drops, "KEPT", None)
print(kept() if kept else "nothing kept", kept.__code__.co_consts[:2] if kept else "")
import pycds
print("released", pycds.stats()["released_bytes"], file=sys.stderr)
'''


@pytest.fixture(scope="module")
def drops_apps(tmp_path_factory):
    # An installed module, not one written a moment ago: the dump archives
    # the code its import ran (pycds.dumping.capture), whose reference counts tell
    # which functions live.
    root = tmp_path_factory.mktemp("drops")
    for keep in ("keep", "drop"):
        (root / keep).mkdir()
        (root / keep / "drops.py").write_text(DROPS)
        (root / keep / "usedrops.py").write_text(USE_DROPS)
        installed(root / keep / "drops.py")
    settle(root)
    return root


@pytest.mark.skipif(not RELEASES, reason="3.10 chunks are kept whole")
@pytest.mark.parametrize("keep", ["", "1"])
def test_functions_the_module_drops_are_given_back(drops_apps, keep):
    app = drops_apps / ("keep" if keep else "drop")
    a = str(app / "a.img")
    dump = run_python("usedrops.py", cwd=app, PYCDSMODE="DUMP", PYCDSARCHIVE=a)
    assert dump.rc == 0, dump
    plain = run_python("usedrops.py", cwd=app, KEEP=keep)
    share = run_python("usedrops.py", cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=a,
                       PYCDSVERBOSE=1, KEEP=keep)
    assert share.rc == 0 and share.out == plain.out, (plain, share)
    assert "drops" in share.served() and not share.warnings()
    # Three functions of ~1500 statements each (~150 KiB with what they
    # reach).  When the program keeps one that the dump run dropped, that
    # one stays (and works: the run above faults on any use of memory given
    # back).  Without the prediction 144 KiB go back.  With larger pages,
    # the pages a kept one spans reach up to a page further on each side.
    dropped = 2 if keep else 3
    assert released(share) >= dropped * 96 * 1024 - 2 * (PAGE - 4096), share


def test_the_writer_predicts_the_functions_a_body_drops():
    # Given the code object that ran, a function code object in its (or its
    # class bodies') co_consts that nothing else holds goes to the tail.
    from pycds import _nativeapi as N, _nativewriter as NW
    def big(name, indent):
        # constants of its own: the compiler shares equal constants
        return "".join(f"{indent}v = '{name} {i}'\n" for i in range(300))
    src = textwrap.dedent('''\
        def kept(): pass
        def gone():
        {gone}    return v
        class C:
            def m(self): pass
            def dropped(self):
        {dropped}        return v
            del dropped
        def outer():
            def inner():
        {inner}        return v
            return inner
        del gone
        ''').format(gone=big("gone", " " * 4), dropped=big("dropped", " " * 8),
                     inner=big("inner", " " * 8))
    code = compile(src, f"<predict {os.getpid()}>", "exec")
    ns = {}
    exec(code, ns)

    def tail(ran):
        c = NW.Writer(1).add(code, ran=ran)
        return c.chunk_len - c.root_off

    by_count, without = tail(True), tail(False)
    # gone and dropped, not inner (its code goes with outer, which lives):
    # about twice the size of one of them copied alone
    one = NW.Writer(1).add(next(c for c in code.co_consts
                               if getattr(c, "co_name", "") == "gone")).chunk_len
    assert 1.75 * one < by_count - without < 2.25 * one, (by_count, without, one)
    ns.clear()      # now nothing holds kept, m or outer either
    assert tail(True) > by_count


NAMES_MOD = "".join(f"name_new_to_the_process_{i} = {i}\n" for i in range(2000))

BLOCKS = '''import sys
import warmmod      # the first archive hit loads the native module
before = sys.getallocatedblocks()
import namesmod
grew = sys.getallocatedblocks() - before
import pycds
print(grew, pycds.stats()["served"])
'''


@pytest.mark.skipif(sys.version_info >= (3, 12) and (
                        hasattr(sys, "gettotalrefcount")
                        or "-DNDEBUG" not in (sysconfig.get_config_var("CFLAGS") or "")),
                    reason="3.12+ debug or assertion builds intern a heap copy of each new "
                           "name (native/archive/common/layout/layout_312_313.h)")
def test_new_names_are_interned_in_place(tmp_path):
    """2000 names no module interned before: plain import allocates a string
    object for each (unmarshal); a served module's own strings become the
    interned ones (3.12+: those of the chunk's head, immortal), so the
    import allocates a few blocks (the interned dict's and the module
    dict's tables), not one per name."""
    (tmp_path / "namesmod.py").write_text(NAMES_MOD)
    (tmp_path / "warmmod.py").write_text("WARM = 1\n")
    (tmp_path / "blocks.py").write_text(BLOCKS)
    img = str(tmp_path / "n.img")
    plain, dump, share = dump_and_share(["blocks.py"], tmp_path, img)
    assert plain.rc == 0 and dump.rc == 0 and share.rc == 0, (plain, dump, share)
    plain_grew, _ = map(int, plain.out.split())
    share_grew, served = map(int, share.out.split())
    assert served == 2, share
    assert plain_grew > 2000, plain
    assert share_grew < 200, (share_grew, plain_grew)
