"""DUMP archives the code objects its imports ran (pycds.dumping.capture), in their
fresh form, unless the source may have changed since: then it reads the
module again.  Either way a SHARE run behaves as a plain one."""

import sys

import pytest

from support import STARTUP_CUSTOMIZE, installed, run_python, settle

MOD = '''"""A module whose functions get hot in the dump run."""
VALUE = "first version"
def hot(n):
    s = 0
    for i in range(n):
        s += len(str(i)) + i % 7
    return s
class Shape:
    def area(self, x):
        return x.real * 2
'''

PROG = '''import sys
if len(sys.argv) > 1 and sys.argv[1] == "trace":
    sys.settrace(lambda *a: None)
import json, mod
total = sum(mod.hot(50) for _ in range(2000))
area = sum(mod.Shape().area(x) for x in [1, 2.5] * 1000)
print(mod.VALUE, total, area, mod.hot.__code__.co_code.hex()[:40])
if len(sys.argv) > 1 and sys.argv[1] == "edit":
    # a new version of the module, after its import and before the dump
    with open(mod.__file__) as f:
        text = f.read()
    with open(mod.__file__, "w") as f:
        f.write(text.replace("first", "second"))
'''


def read_again(run):
    return [line.rsplit(" ", 1)[1] for line in run.err.splitlines()
            if line.startswith("[pycds] read again ")]


def as_ran(run):
    for line in run.err.splitlines():
        if "modules archived as their import ran them" in line:
            return int(line.split()[1])
    raise AssertionError(f"no summary line: {run!r}")


def app(tmp_path, install=True):
    (tmp_path / "mod.py").write_text(MOD)
    (tmp_path / "prog.py").write_text(PROG)
    if install:
        installed(tmp_path / "mod.py")
    return tmp_path


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    """A directory per test, with mod.py installed (source and .pyc) and
    the other files each needs, all settled: changed more than
    SETTLED_NS ago, so that a DUMP run may take them from a capture (one
    wait for the whole module)."""
    root = tmp_path_factory.mktemp("capture")
    out = {}
    for name in ("ran", "traced", "edited", "api", "audited", "plugin",
                 "pinned-none", "pinned-checked-hash", "copied"):
        out[name] = d = root / name
        d.mkdir()
        app(d)
    setup_plugin(out["plugin"])
    setup_pinned(out["pinned-none"], checked_hash=False)
    setup_pinned(out["pinned-checked-hash"], checked_hash=True)
    setup_copied(out["copied"])
    settle(root)
    return out


def dump(cwd, *args):
    return run_python(["prog.py", *args], cwd=cwd, PYCDSMODE="DUMP",
                      PYCDSARCHIVE=str(cwd / "a.img"), PYCDSVERBOSE=2)


def share(cwd, *args):
    return run_python(["prog.py", *args], cwd=cwd, PYCDSMODE="SHARE",
                      PYCDSARCHIVE=str(cwd / "a.img"), PYCDSVERBOSE=1)


def test_the_dump_archives_the_code_its_imports_ran(apps):
    cwd = apps["ran"]
    d = dump(cwd)
    assert d.rc == 0 and not d.warnings(), d
    assert "mod" not in read_again(d) and "json" not in read_again(d), d
    assert as_ran(d) >= 3, d           # mod, json, json.decoder...
    plain = run_python("prog.py", cwd=cwd)
    s = share(cwd)
    assert s.rc == 0 and s.out == plain.out == d.out, (plain, s)
    assert "mod" in s.served() and not s.warnings()


def test_code_that_ran_traced_is_archived_fresh(apps):
    # A trace function instruments the bytecode in place on 3.12+.
    cwd = apps["traced"]
    d = dump(cwd, "trace")
    assert d.rc == 0 and "mod" not in read_again(d), d
    plain = run_python("prog.py", cwd=cwd)
    s = share(cwd)
    assert s.rc == 0 and s.out == plain.out, (plain, s)
    assert "mod" in s.served()


def test_a_source_edited_after_its_import_is_read_again(apps):
    cwd = apps["edited"]
    d = dump(cwd, "edit")
    assert d.rc == 0 and "first version" in d.out, d
    # The edit gave the source a new mtime: the code that ran is not the
    # source's any more, so the dump reads (compiles) the module again.
    assert "mod" in read_again(d), d
    plain = run_python("prog.py", cwd=cwd)
    assert "second version" in plain.out
    s = share(cwd)
    assert s.rc == 0 and s.out == plain.out, (plain, s)
    assert "mod" in s.served() and not s.fallbacks()


def test_a_source_written_just_before_its_import_is_read_again(tmp_path):
    # An edit between the import's read of the .pyc and the capture's stat
    # would look like this: a source modified right before its body ran.
    cwd = app(tmp_path, install=False)
    d = dump(cwd)
    assert d.rc == 0 and "mod" in read_again(d), d
    plain = run_python("prog.py", cwd=cwd)
    s = share(cwd)
    assert s.rc == 0 and s.out == plain.out and "mod" in s.served(), (plain, s)


def test_the_api_form_archives_what_its_imports_ran(apps):
    cwd = apps["api"]
    (cwd / "mods.lst").write_text("mod\njson\n")
    code = ("import pycds, pycds.dumping.capture as c, sys\n"
            "n = pycds._dump('mods.lst', 'a.img')\n"
            "print(n, c.active(), 'mod' in sys.modules)\n")
    d = run_python(["-c", code], cwd=cwd, PYCDSMODE="MANUALLY", PYCDSVERBOSE=2)
    assert d.rc == 0 and d.out.split()[1:] == ["False", "True"], d
    assert "mod" not in read_again(d) and "json" not in read_again(d), d
    plain = run_python("prog.py", cwd=cwd)
    s = share(cwd)
    assert s.rc == 0 and s.out == plain.out and "mod" in s.served(), (plain, s)


def test_modules_start_up_imported_before_pycds_are_not_archived(tmp_path):
    # encodings (and the modules of .pth files before pycds.pth) are
    # imported before a SHARE run's finder exists: never served, so not
    # archived; a module re-imported after start-up is.
    cwd = app(tmp_path)
    (cwd / "again.py").write_text(
        "import sys, importlib\n"
        "del sys.modules['encodings.aliases']\n"
        "import encodings.aliases, json\n")
    d = run_python("again.py", cwd=cwd, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=str(cwd / "a.img"), PYCDSVERBOSE=2)
    assert d.rc == 0 and not d.warnings(), d
    from pycds import _archive
    index = _archive.Index.open(str(cwd / "a.img"))
    try:
        assert index.lookup("encodings") is None
        assert index.lookup("encodings.utf_8") is None
        assert index.lookup("encodings.aliases") is not None
        assert index.lookup("json") is not None
    finally:
        index.close()
    s = run_python("again.py", cwd=cwd, PYCDSMODE="SHARE",
                   PYCDSARCHIVE=str(cwd / "a.img"), PYCDSVERBOSE=1)
    assert s.rc == 0 and "encodings.aliases" in s.served(), s


def test_a_dump_with_nothing_to_archive_writes_a_usable_archive(tmp_path):
    # A program that imports nothing after start-up (3.13's -c imports
    # linecache: a file): an archive without modules, which a SHARE run
    # opens without a warning.
    img = str(tmp_path / "a.img")
    (tmp_path / "nothing.py").write_text("pass\n")
    d = run_python(["nothing.py"], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
    assert d.rc == 0 and not d.err, d
    from pycds import _archive
    index = _archive.Index.open(img)
    # (An interpreter's sitecustomize, as Debian's, site imports after pycds.pth.)
    assert {e.name for e in index.entries()} <= STARTUP_CUSTOMIZE
    index.close()
    s = run_python(["-c", "import json; print(json.dumps([1]))"], cwd=tmp_path,
                   PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
    assert s.rc == 0 and s.out == "[1]\n" and not s.warnings() and not s.served(), s


AUDITED = '''import sys
def deny(event, args):
    # What a sandbox might refuse: frame introspection.
    if event in ("sys._getframe", "object.__getattr__"):
        raise RuntimeError("denied: " + event)
import json               # (its import introspects frames itself)
sys.addaudithook(deny)
import mod
print(mod.VALUE, mod.hot(30), json.dumps([1]))
'''


def test_the_capture_raises_no_audit_event_of_its_own(apps):
    # A program whose audit hook refuses events the capture might raise
    # (frame introspection) runs under DUMP as it does plainly.
    cwd = apps["audited"]
    (cwd / "audited.py").write_text(AUDITED)
    plain = run_python("audited.py", cwd=cwd)
    assert plain.rc == 0, plain
    d = run_python("audited.py", cwd=cwd, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=str(cwd / "a.img"), PYCDSVERBOSE=2)
    assert d.rc == 0 and d.out == plain.out and not d.warnings(), d
    assert "mod" not in read_again(d), d


PINNED = '''import os, sys
def write(v):
    with open("cfg.py", "w") as f:
        f.write(f'MODE = "{v}"\\n')
    os.utime("cfg.py", ns=(10**18, 10**18))   # pinned mtime (reproducible builds)
if sys.argv[1:] == ["setup"]:
    write("AAAA")
    sys.exit()
import cfg
print("imported", cfg.MODE)
if os.environ.get("PYCDSMODE") == "DUMP":
    write("BBBB")      # same size, same mtime
'''


def setup_pinned(d, checked_hash):
    (d / "pinned.py").write_text(PINNED)
    assert run_python(["pinned.py", "setup"], cwd=d, PYTHONDONTWRITEBYTECODE="1").rc == 0
    if checked_hash:
        import os
        import py_compile
        pyc = py_compile.compile(
            str(d / "cfg.py"), doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        os.utime(pyc, ns=(10**18, 10**18))


@pytest.mark.parametrize("pyc", ["none", "checked-hash"])
def test_an_edit_keeping_mtime_and_size_is_not_served_stale(apps, pyc):
    # Where plain import would see the edit (no .pyc: it compiles the
    # source; a checked hash-based .pyc: it compares the source hash), the
    # code that ran before the edit must not be archived.
    cwd = apps["pinned-" + pyc]
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    img = str(cwd / "a.img")
    d = run_python("pinned.py", cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=2, **env)
    assert d.rc == 0 and "imported AAAA" in d.out and "cfg" in read_again(d), d
    plain = run_python("pinned.py", cwd=cwd, **env)
    s = run_python("pinned.py", cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1, **env)
    assert plain.out == "imported BBBB\n", plain
    assert s.rc == 0 and s.out == plain.out, (plain, s)


COPIED = '''import os, shutil, sys
import m
print(m.VALUE)
if os.environ.get("PYCDSMODE") == "DUMP":
    # A new release copied over the installed one, times kept (cp -p,
    # rsync -a, tar x): same mtimes, same sizes, source and .pyc.
    shutil.copy2("v2/m.py", "m.py")
    shutil.copy2(os.path.join("v2", os.path.relpath(m.__cached__)), m.__cached__)
'''


def setup_copied(d):
    import os
    import py_compile
    (d / "copied.py").write_text(COPIED)
    (d / "v2").mkdir()
    pinned = (1577836800 * 10**9,) * 2          # both releases: 2020-01-01
    for where, value in ((d, "one"), (d / "v2", "two")):
        (where / "m.py").write_text(f"VALUE = {value!r}\n")
        os.utime(where / "m.py", ns=pinned)
        os.utime(py_compile.compile(str(where / "m.py"), doraise=True), ns=pinned)


def test_a_release_copied_over_with_its_times_is_read_again(apps):
    # Source and .pyc replaced after the import by files with the same
    # mtimes and sizes: only their ctime and inode say so.
    cwd = apps["copied"]
    img = str(cwd / "a.img")
    d = run_python("copied.py", cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=2)
    assert d.rc == 0 and d.out == "one\n" and "m" in read_again(d), d
    plain = run_python("copied.py", cwd=cwd)
    s = run_python("copied.py", cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert plain.out == "two\n", plain
    assert s.rc == 0 and s.out == plain.out and "m" in s.served(), (plain, s)


PLUG = '''def f(x: int) -> int:
    return x
print("plug body ran")
'''

PLUGIN_LOADER = '''from __future__ import annotations
import importlib.util, sys
def load(name, path):
    # A plugin loader that runs the module's source itself: compile()
    # inherits this file's __future__ flags.
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    with open(path) as fh:
        exec(compile(fh.read(), path, "exec"), mod.__dict__)
    return mod
'''

PLUGIN_APP = '''import os
if os.environ.get("VIA_PLUGIN"):
    import plugin_loader
    m = plugin_loader.load("plug", os.path.abspath("plug.py"))
else:
    import plug as m
print(m.f.__annotations__)
'''


def setup_plugin(d):
    (d / "plug.py").write_text(PLUG)
    (d / "plugin_loader.py").write_text(PLUGIN_LOADER)
    (d / "plugin_app.py").write_text(PLUGIN_APP)
    installed(d / "plug.py")
    installed(d / "plugin_loader.py")


def test_a_module_a_program_runs_itself_is_read_again(apps):
    # Its spec names the stock loader, but the code that ran is the
    # program's own compile() (here with different __future__ flags), not
    # what plain import of that module runs.
    cwd = apps["plugin"]
    img = str(cwd / "a.img")
    d = run_python("plugin_app.py", cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=2, VIA_PLUGIN="1")
    assert d.rc == 0 and "plug" in read_again(d), d
    assert "plugin_loader" not in read_again(d), d
    plain = run_python("plugin_app.py", cwd=cwd)
    s = run_python("plugin_app.py", cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=1)
    assert "<class 'int'>" in plain.out, plain
    assert s.rc == 0 and s.out == plain.out and "plug" in s.served(), (plain, s)


WORKOUT = '''import argparse, json, email.parser, textwrap, dataclasses
@dataclasses.dataclass
class P:
    x: int
    y: str = "a"
p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=3)
for _ in range(200):
    a = p.parse_args(["--n", "5"])
    s = json.dumps({"k": [P(a.n).x, textwrap.dedent("  z")]})
    json.loads(s)
    email.parser.Parser().parsestr("Subject: hi\\\\n\\\\nbody")
print(s)
'''


def same_as_pycs(img, names=None, skip=()):
    """Load (without running) the modules ``names`` of archive ``img``
    (default: every one but ``skip``) and assert each code object is what
    ``marshal.loads`` of its .pyc gives: same bytecode and, 3.11+, same
    adaptive bytecode.  Returns how many code objects were compared."""
    import marshal
    from pycds import _archive
    from pycds import _nativeapi as N
    index = _archive.Index.open(img)
    arch = N.NativeArchive(index.fd, index.header, index.meta["layout"])

    def walk(c):
        yield c
        for k in c.co_consts:
            if type(k) is type(c):
                yield from walk(k)

    checked = 0
    try:
        for e in index.entries():
            if e.name in skip or (names is not None and e.name not in names):
                continue
            with open(e.pyc_path, "rb") as f:
                ref = marshal.loads(f.read()[16:])
            got = arch.load(e)
            for g, r in zip(walk(got), walk(ref), strict=True):
                assert (g.co_name, g.co_code) == (r.co_name, r.co_code), e.name
                if sys.version_info >= (3, 11):
                    assert g._co_code_adaptive == r._co_code_adaptive, (e.name, g.co_name)
                checked += 1
    finally:
        index.close()
    return checked


def test_every_archived_code_object_is_what_its_pyc_gives(tmp_path):
    # The code objects a DUMP run's imports ran (and specialised: the
    # program runs their functions hot) are archived as a fresh .pyc load
    # gives them: same bytecode and, 3.11+, same adaptive bytecode.
    (tmp_path / "workout.py").write_text(WORKOUT)
    img = str(tmp_path / "a.img")
    d = run_python("workout.py", cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=2)
    assert d.rc == 0 and as_ran(d) >= 20, d
    assert same_as_pycs(img, skip=read_again(d)) > 1000

TRACEMOD = '''def lines_ok(frame):
    last = None
    for start, end, line in frame.f_code.co_lines():
        if start <= frame.f_lasti < end:
            last = line
    return last == frame.f_lineno
def work(k):
    return sum(range(k))
'''

TRACEDUMP = '''import sys, tracemod
def trace(frame, event, arg):
    tracemod.lines_ok(frame)
    return trace
sys.settrace(trace); tracemod.work(5); tracemod.work(5); sys.settrace(None)
'''


def test_code_run_only_under_a_trace_function_is_archived_fresh(tmp_path):
    """On 3.13 a function that ran only under sys.settrace (here: called by
    the trace function itself) keeps its first RESUME while its body
    specialises; taken for code that never ran, it was archived with the
    DUMP process's inline caches, and the SHARE run crashed on them (found
    by a review; CPython's test_sys_settrace crashed the same way)."""
    (tmp_path / "tracemod.py").write_text(TRACEMOD)
    (tmp_path / "dump.py").write_text(TRACEDUMP)
    (tmp_path / "use.py").write_text(
        "import sys, tracemod\nprint(tracemod.lines_ok(sys._getframe()), tracemod.work(4))\n")
    installed(tmp_path / "tracemod.py")
    settle(tmp_path)
    img = str(tmp_path / "a.img")
    d = run_python("dump.py", cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img,
                   PYCDSVERBOSE=2)
    assert d.rc == 0 and "tracemod" not in read_again(d), d
    plain = run_python("use.py", cwd=tmp_path)
    share = run_python("use.py", cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
    assert share.rc == 0 and "tracemod" in share.served(), share
    assert share.out == plain.out == "True 6\n", (plain, share)
    assert same_as_pycs(img, names={"tracemod"}) == 3     # module, lines_ok, work
