"""The served hit in C (native/archive/loader/serve.c) against the finder's
Python path on the same inputs: the same spec for every name, the same
code object from the loader, and the same behaviour where the program
changed something between the two (a patched loader, a lazy import, a
changed directory, an exception raised while a directory is listed)."""

import contextlib
import copy
import importlib
import pickle
import sys
import textwrap
from importlib.machinery import SourceFileLoader

import pytest

from support import import_state, run_python, uncache
from pycds import share as finder
from test_cfind import dumped_app
from test_finder import archived_pkg, make_finder, placed  # noqa: F401  (fixture)

SPEC_FIELDS = ("name", "origin", "cached", "parent", "has_location",
               "submodule_search_locations")


def describe(spec):
    return {k: getattr(spec, k) for k in SPEC_FIELDS} | {
        "loader": (type(spec.loader), spec.loader.name, spec.loader.path)}


def served_by_c(f, name, path=None):
    """``name``'s spec from the finder's C find_spec (the first call opens
    the archive through the Python path: made once beforehand)."""
    assert type(f.find_spec).__name__ == "builtin_function_or_method"
    return f.find_spec(name, path)


def python_find_spec(f, name, path=None):
    return finder.CDSFinder.find_spec(f, name, path)


@contextlib.contextmanager
def opened(archived_pkg, first="fmod"):
    """A finder over archived_pkg's archive placed on sys.meta_path, the
    archive opened by a Python find_spec of ``first`` (import state
    restored after)."""
    root, img = archived_pkg
    f = make_finder(img)
    with import_state(path=[str(root)] + sys.path), uncache("fpkg", "fpkg.sub", "fmod"):
        placed(f)
        assert python_find_spec(f, first) is not None
        yield f


class TestTheSameSpec:
    @pytest.mark.parametrize("name", ["fmod", "fpkg", "fpkg.sub"])
    def test_c_and_python_give_the_same_spec(self, archived_pkg, name):
        with opened(archived_pkg, "fmod") as f:
            path = None
            if "." in name:
                path = importlib.import_module("fpkg").__path__
            by_c = served_by_c(f, name, path)
            by_py = python_find_spec(f, name, path)
            assert finder.served_loader(by_c.loader) and finder.served_loader(by_py.loader)
            assert describe(by_c) == describe(by_py)
            # (FileLoader.__eq__: the dicts, ArchivedCode and _PlainReduce included)
            assert by_c.loader == by_py.loader
            assert type(by_c.loader.get_code) is type(by_py.loader.get_code)

    def test_a_miss_is_none_and_counted_missed(self, archived_pkg):
        with opened(archived_pkg) as f:
            finder.missed.discard("not_archived_xyz")
            assert served_by_c(f, "not_archived_xyz") is None
            assert "not_archived_xyz" in finder.missed

    def test_stale_source_goes_to_the_python_side(self, archived_pkg):
        root, _ = archived_pkg
        with opened(archived_pkg, "fpkg") as f:
            finder.stale.discard("fmod")
            (root / "fmod.py").write_text("VALUE = 'edited'\n")
            spec = served_by_c(f, "fmod")
            assert spec is not None and not finder.served_loader(spec.loader)
            assert "fmod" in finder.stale


class TestTheLoader:
    def test_code_loaded_in_c_is_the_archived_module(self, archived_pkg):
        root, _ = archived_pkg
        with opened(archived_pkg, "fpkg") as f:
            before = finder.stats()["served"]
            spec = served_by_c(f, "fmod")
            get_code = vars(spec.loader)["get_code"]
            assert type(get_code).__mro__[1] is finder.ArchivedCode
            # (As import runs a spec: importlib._bootstrap._load, 3.10-3.13.)
            mod = importlib._bootstrap._load(spec)
            assert mod.VALUE == 42 and mod.__spec__ is spec
            assert finder.stats()["served"] == before + 1
            assert "get_code" not in vars(spec.loader)        # plain from now on
            assert mod.__loader__.get_code("fmod").co_filename == str(root / "fmod.py")

    def test_copy_and_pickle_of_a_served_loader_are_plain(self, archived_pkg):
        root, _ = archived_pkg
        with opened(archived_pkg, "fpkg") as f:
            spec = served_by_c(f, "fmod")
            for other in (copy.deepcopy(spec.loader), pickle.loads(pickle.dumps(spec.loader))):
                assert type(other) is SourceFileLoader and vars(other) == {
                    "name": "fmod", "path": str(root / "fmod.py")}
            assert pickle.loads(pickle.dumps(vars(spec.loader)["get_code"]))("fmod") \
                .co_filename == str(root / "fmod.py")

    def test_a_lazy_import_checks_the_source_again(self, archived_pkg):
        # Run later than found (no _initializing spec): the Python side stats
        # the source, as plain import reads it then.
        root, _ = archived_pkg
        with opened(archived_pkg, "fpkg") as f:
            spec = served_by_c(f, "fmod")
            (root / "fmod.py").write_text("VALUE = 'edited later'\n")
            code = spec.loader.get_code("fmod")
            ns = {}
            exec(code, ns)
            assert ns["VALUE"] == "edited later"

    def test_a_loader_patched_after_the_spec_runs_the_program_s(self, archived_pkg,
                                                                  monkeypatch):
        stock = SourceFileLoader.source_to_code
        before = finder.stats()["fallbacks"].get("SourceFileLoader is patched", 0)
        with opened(archived_pkg, "fpkg") as f:
            spec = served_by_c(f, "fmod")
            # (monkeypatch takes it out of SourceFileLoader's own dict after:
            # the stock one is SourceLoader's.)
            monkeypatch.setattr(SourceFileLoader, "source_to_code",
                                lambda self, data, path, **kw: stock(self, data, path, **kw))
            code = spec.loader.get_code("fmod")
            monkeypatch.undo()
        assert code.co_filename == spec.origin
        assert finder.stats()["fallbacks"].get("SourceFileLoader is patched", 0) == before + 1
        assert "source_to_code" not in vars(SourceFileLoader)


CHANGED_DIR_PROG = """\
import os, sys
here = sys.path[0]
sys.path.insert(1, os.path.join(here, "lib"))
import json
# The directory changes after the first search went through it.
with open(os.path.join(here, f"later-{os.getpid()}.txt"), "w") as f:
    f.write("x")
if len(sys.argv) > 1:
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "_fill_cache":
            raise RuntimeError("raised while listing")
        return None
    sys.settrace(tracer)
F = sys.modules.get("pycds.share")
served = F.stats()["served"] if F else 0
try:
    import m
    print("imported", m.WHERE, "served" if F and F.stats()["served"] > served else "plain")
except RuntimeError as e:
    print("raised", e)
sys.settrace(None)
"""


class TestAChangedDirectory:
    def _app(self, tmp_path):
        return dumped_app(tmp_path, {"lib/m.py": "WHERE = 'lib'\n"}, CHANGED_DIR_PROG)

    def test_a_new_file_in_an_earlier_directory_is_listed(self, tmp_path):
        # The script's directory changed since the dump and since the first
        # search went through it: m, in the next directory, is served; once
        # a module of its name is in the first, that one is imported.
        app, img = self._app(tmp_path)
        share = run_python(["prog.py"], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (share.rc, share.out, share.warnings()) == (0, "imported lib served\n", []), \
            share
        (app / "m.py").write_text("WHERE = 'app'\n")
        for env in ({}, {"PYCDSMODE": "SHARE", "PYCDSARCHIVE": img}):
            r = run_python(["prog.py"], cwd=app, **env)
            assert (r.rc, r.out) == (0, "imported app plain\n"), r

    def test_what_listing_the_directory_raises_propagates(self, tmp_path):
        app, img = self._app(tmp_path)
        plain = run_python(["prog.py", "trace"], cwd=app)
        share = run_python(["prog.py", "trace"], cwd=app, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img)
        assert plain.out == "raised raised while listing\n", plain
        assert (share.rc, share.out, share.warnings()) == (plain.rc, plain.out, []), share


PROGRAM_FINDER_PROG = """\
import os, sys
from importlib.machinery import PathFinder
import importlib.util
here = sys.path[0]
sys.path.insert(1, os.path.join(here, "lib"))
import json
with open(os.path.join(here, f"later-{os.getpid()}.txt"), "w") as f:
    f.write("x")
if len(sys.argv) > 1:
    class Program:
        # The program's finder, put between pycds's and PathFinder: it
        # answers for m, so plain import never lists a directory for it.
        def find_spec(self, name, path=None, target=None):
            if name == "m":
                return importlib.util.spec_from_loader(name, self)
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            module.WHERE = "program"
    sys.meta_path.insert(sys.meta_path.index(PathFinder), Program())
    listed = []
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "_fill_cache":
            listed.append(frame.f_locals["self"].path)
            if sys.argv[1] == "raise":
                raise RuntimeError("raised while listing")
        return None
    sys.settrace(tracer)
try:
    import m
    print("imported", m.WHERE)
except RuntimeError as e:
    print("raised", e)
sys.settrace(None)
if len(sys.argv) > 1:
    print("listed", [os.path.relpath(p, here) for p in listed])
"""


class TestAFinderBeforePathFinder:
    # A finder of the program's between pycds's and PathFinder answers
    # first: no FileFinder of PathFinder's is asked, so no directory is
    # listed (no _fill_cache for a trace function to see or raise in).
    @pytest.mark.parametrize("how", ["trace", "raise"])
    def test_no_directory_is_listed_for_it(self, tmp_path, how):
        app, img = dumped_app(tmp_path, {"lib/m.py": "WHERE = 'lib'\n"}, PROGRAM_FINDER_PROG)
        plain = run_python(["prog.py", how], cwd=app)
        assert plain.out == "imported program\nlisted []\n", plain
        share = run_python(["prog.py", how], cwd=app, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
        assert (share.rc, share.out, share.warnings()) == (plain.rc, plain.out, []), share


def test_the_c_path_is_off_where_verbose(tmp_path):
    prog = textwrap.dedent("""
        import json, sys
        for f in sys.meta_path:
            if type(f).__name__ == "CDSFinder":
                print("find_spec", type(f.find_spec).__name__)
    """)
    img = str(tmp_path / "a.img")
    assert run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img).rc == 0
    quiet = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img)
    loud = run_python(["-c", prog], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSARCHIVE=img,
                      PYCDSVERBOSE=1)
    assert quiet.out == "find_spec builtin_function_or_method\n", quiet
    assert loud.out == "find_spec method\n" and "json" in loud.served(), loud
