"""The layout order predicted from the modules' code (pycds.dumping.order)."""

import textwrap

from pycds.dumping import order as _dump_order


def imports(src, package=""):
    return _dump_order.static_imports(compile(textwrap.dedent(src), "m", "exec"), package)


def test_absolute_relative_and_from_imports_in_bytecode_order():
    got = imports("""
        import a.b.c
        from . import x
        from ..p import q, r
        from m import *
        import z as zz
    """, "pk.sub")
    assert got == ["a", "a.b", "a.b.c",
                   "pk", "pk.sub", "pk.sub.x",
                   "pk", "pk.p", "pk.p.q", "pk.p.r",
                   "m", "z"]


def test_class_bodies_count_functions_do_not():
    got = imports("""
        class K:
            import inclass
            def method(self):
                import inmethod
        def f():
            import infunc
        if TYPE_CHECKING:
            import only_when_checking
    """)
    assert got == ["inclass", "only_when_checking"]


def test_names_past_255_take_extended_args():
    src = "".join(f"v{i} = 1\n" for i in range(300)) + "from . import late\n"
    assert imports(src, "pk") == ["pk", "pk.late"]


def test_a_relative_import_above_the_top_is_no_name():
    assert imports("from ... import x\nimport ok", "pk") == ["ok"]
    assert imports("from . import x\nimport ok", "") == ["ok"]


def modules(tree):
    return {name: (compile(textwrap.dedent(src), name, "exec"),
                   name if is_pkg else name.rpartition(".")[0])
            for name, (src, is_pkg) in tree.items()}


TREE = {
    "app": ("import lib.tools\nimport json_like\n", False),
    "lib": ("from . import core\n", True),
    "lib.core": ("import helper\n", False),
    "lib.tools": ("from .core import thing\n", False),
    "helper": ("", False),
    "json_like": ("import helper\n", False),
    "dynamic_b": ("", False),
    "dynamic_a": ("", False),
    "lonely.sub": ("", False),
    "lonely": ("", True),
}


def test_depth_first_from_the_programs_imports_then_by_name():
    got = _dump_order.order(modules(TREE), ["app", "not_archived"])
    assert got == ["app", "lib", "lib.core", "helper", "lib.tools", "json_like",
                   "dynamic_a", "dynamic_b", "lonely", "lonely.sub"]


def test_the_order_does_not_depend_on_the_dicts_order():
    tree = modules(TREE)
    backwards = dict(reversed(list(tree.items())))
    assert _dump_order.order(tree, ["app"]) == _dump_order.order(backwards, ["app"])


def test_a_long_import_chain_needs_no_recursion():
    tree = {f"m{i}": (compile(f"import m{i + 1}\n", "m", "exec"), "") for i in range(5000)}
    got = _dump_order.order(tree, ["m0"])
    assert got[:3] == ["m0", "m1", "m2"] and len(got) == 5000


def test_program_imports_of_a_c_command(monkeypatch):
    import sys
    import types
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", "import json, csv.x"])
    assert _dump_order.program_imports() == ["json", "csv", "csv.x"]
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", "syntax error ("])
    assert _dump_order.program_imports() == []
