"""The package's import graph runs one way: no module of pycds imports the
package's __init__ (the entry points), and no two modules import each
other, even lazily (imports inside functions count)."""

import ast
import collections
import os

import pycds

PACKAGE = os.path.dirname(os.path.abspath(pycds.__file__))


def _modules():
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, os.path.dirname(PACKAGE))
        if "bf16" in rel.split(os.sep) or "__pycache__" in rel:
            continue          # the companion library is not the hook
        for f in files:
            if f.endswith(".py"):
                parts = rel.split(os.sep) + ([] if f == "__init__.py" else [f[:-3]])
                out[".".join(parts)] = os.path.join(folder, f)
    return out


def _edges(mods):
    edges = collections.defaultdict(set)
    for name, path in mods.items():
        pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            edges[name].update(s for s in subs if s != name)
            if len(subs) < len(node.names) and target in mods and target != name:
                edges[name].add(target)       # names taken from the module itself
    return edges


def test_no_module_imports_the_package_entry_points():
    mods = _modules()
    assert len(mods) > 20
    edges = _edges(mods)
    assert sorted(m for m in mods if "pycds" in edges[m]) == []


def test_no_import_cycle():
    mods = _modules()
    edges = _edges(mods)
    state = {}
    cycles = []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(mods):
        if m not in state:
            visit(m, [m])
    assert cycles == []
