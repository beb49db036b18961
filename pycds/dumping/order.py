"""The order a dump lays its modules out in: predicted from their code.

A SHARE run asks for code objects in the order its imports start, and the
read-ahead thread (native/archive/loader/prefetch.c) reads the chunks that
follow the one asked for.  The order one DUMP run imported in would serve
that run best, but it depends on the run: threads racing to import, a loop
over a set of names (ordered by ``PYTHONHASHSEED``), a plugin found first.
An archive must not (reproducible bytes: docs/archive-format.md), so the
order is the one the modules' own code gives:

- a depth-first walk of the static imports: a module comes before the
  modules its body imports (``IMPORT_NAME`` in its module code and class
  bodies, not in functions), in bytecode order, as a plain import of it
  starts theirs; a package before its submodules, as importing
  ``a.b`` starts with ``a``;
- walked from the imports of the program's own code (``__main__``'s
  source, the ``-c`` command) or from the names a list gave
  (``pycds.dump``, ``pycds._dump``), then from every module nothing
  reached, by name.

Only the modules being archived are placed; imports of others are
skipped.  Imports only builtins and ``opcode``.
"""

import sys

__all__ = ["static_imports", "order"]


_OPS = None                  # IMPORT_NAME, LOAD_CONST, EXTENDED_ARG, CACHE
_CO_NEWLOCALS = 0x2          # function code objects; module and class bodies lack it


def static_imports(code, package):
    """Return the absolute names code's body starts importing, in order.

    The absolute names the body of ``code`` (a module's code object)
    starts importing, in bytecode order, with their parent packages first
    and the submodules its ``from`` imports may name (``from a import b``:
    ``a``, ``a.b``); imports in function bodies are not counted.
    ``package``: the module's ``__package__``, to resolve relative imports.
    Malformed bytecode gives fewer names, never an error."""
    global _OPS
    if _OPS is None:
        import opcode
        _OPS = (opcode.opmap["IMPORT_NAME"], opcode.opmap["LOAD_CONST"],
                opcode.opmap["EXTENDED_ARG"], opcode.opmap.get("CACHE", -1))
    out = []
    _scan(code, package, out, 0)
    return out


def _scan(code, package, out, depth):
    IMPORT_NAME, LOAD_CONST, EXTENDED_ARG, CACHE = _OPS
    b = code.co_code
    consts, names = code.co_consts, code.co_names
    last = [None, None]          # the values of the two LOAD_CONSTs before
    ext = 0
    for i in range(0, len(b) - 1, 2):
        op, arg = b[i], b[i + 1] | ext
        if op == EXTENDED_ARG:
            ext = arg << 8
            continue
        ext = 0
        if op == LOAD_CONST:
            const = consts[arg] if arg < len(consts) else None
            last = [last[1], const]
            if type(const) is type(code) and not const.co_flags & _CO_NEWLOCALS \
                    and depth < 20:
                _scan(const, package, out, depth + 1)   # a class body, run here
        elif op == IMPORT_NAME:
            if arg < len(names):
                _resolve(names[arg], last[0], last[1], package, out)
            last = [None, None]
        elif op != CACHE:
            last = [last[1], None]


def _resolve(name, level, fromlist, package, out):
    if type(level) is not int or level < 0 or type(name) is not str:
        return
    if level:
        if type(package) is not str or not package:
            return
        bits = package.rsplit(".", level - 1)
        if len(bits) < level:
            return
        base = bits[0]
        name = f"{base}.{name}" if name else base
    parts = name.split(".")
    for k in range(1, len(parts) + 1):
        out.append(".".join(parts[:k]))
    if type(fromlist) is tuple:
        for item in fromlist:
            if type(item) is str and item != "*":
                out.append(f"{name}.{item}")


def order(modules, first=()):
    """Return the names of modules in layout order.

    The names of ``modules`` (a dict of module name to ``(code,
    package)``) in layout order (see the module docstring); ``first``: the
    names the program's own code imports, walked first."""
    deps = {}
    for name, (code, package) in modules.items():
        try:
            deps[name] = [d for d in static_imports(code, package)
                          if d in modules and d != name]
        except Exception:          # a code object we cannot read: no edges
            deps[name] = []
    seen = set()
    out = []
    for root in [*first, *sorted(modules)]:
        _walk(root, deps, seen, out)
    return out


def _walk(root, deps, seen, out):
    """Append root and what it reaches to out, depth first.

    Without recursion: import chains can be long."""
    stack = [iter((root,))]
    while stack:
        name = next(stack[-1], None)
        if name is None:
            stack.pop()
            continue
        if name in seen or name not in deps:
            continue
        parent = name.rpartition(".")[0]
        if parent in deps and parent not in seen:
            stack.append(iter((parent, name)))   # the package's body first
            continue
        seen.add(name)
        out.append(name)
        stack.append(iter(deps[name]))


def program_imports():
    """Return what the program's own code imports; never raise.

    What the program's own code imports (``__main__``: its source file,
    or the ``-c`` command), as :func:`static_imports` gives it; empty when
    it cannot be had.  Never raises."""
    try:
        main = sys.modules.get("__main__")
        argv = list(getattr(sys, "orig_argv", ()))
        source = None
        path = getattr(main, "__file__", None)
        if type(path) is str and path.endswith(".py"):
            with open(path, "rb") as f:
                source = f.read()
        elif "-c" in argv[1:] and argv.index("-c", 1) + 1 < len(argv):
            source, path = argv[argv.index("-c", 1) + 1], "<string>"
        if source is None:
            return []
        code = compile(source, path, "exec", dont_inherit=True)
        return static_imports(code, getattr(main, "__package__", None) or "")
    except Exception:
        return []
