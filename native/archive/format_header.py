"""Write the C header of the archive format from pycds/_format.py.

``spec(root)`` reads the literal assignments of ``pycds/_format.py`` (as
text, with :mod:`ast`: the package is not importable while it is built);
``header(spec)`` is the text of ``pycds_format.h``, ``PYCDS_FMT_*``
macros the C loader uses instead of numbers of its own; ``digest(spec)``
is a 64-bit digest of that text, compiled into the module
(``pycds_format_digest()``) so that a test can tell a module built from
another specification.  Used by native/archive/build.py.
"""

import ast
import hashlib
import os

GENERATED = "pycds_format.h"


def spec(root):
    """The constants of ``root``/pycds/_format.py, as a dict in file order.
    Raises ValueError on an assignment that is not a literal."""
    path = os.path.join(root, "pycds", "_format.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{path}:{node.lineno}: not a literal") from None
    return out


def _c_bytes(b):
    return '"' + "".join(f"\\x{c:02x}" for c in b) + '"'


def header(s):
    """The text of pycds_format.h for the spec ``s`` (from :func:`spec`)."""
    lines = ["/* pycds_format.h -- the archive format's constants, written by",
             " * native/archive/format_header.py from pycds/_format.py at each build;",
             " * not kept in git.  docs/archive-format.md describes them. */",
             "#ifndef PYCDS_FORMAT_H", "#define PYCDS_FORMAT_H", ""]

    def define(name, value):
        lines.append(f"#define PYCDS_FMT_{name} {value}")

    define("MAGIC", _c_bytes(s["MAGIC"]))
    define("MAGIC_LEN", len(s["MAGIC"]))
    for name in ("FORMAT_VERSION", "HEADER_SIZE", "HEADER_SUM_AT", "BUCKET_SIZE",
                 "ENTRY_HEAD", "ENTRY_READ", "CHUNK_REC", "HEAP_ALIGN", "RELOC_SIZE",
                 "PYC_NONE", "PYC_TIMESTAMP", "PYC_CHECKED_HASH", "PYC_UNCHECKED_HASH"):
        define(name, s[name])
    for name in ("HEADER_KEY", "NAME_KEY"):
        define(name, f"0x{s[name]:X}ULL")
    define("EMPTY_BUCKET", f"0x{s['EMPTY_BUCKET']:X}u")
    for name, off, size in s["HEADER_FIELDS"]:
        define(f"H_{name.upper()}", off)
        define(f"H_{name.upper()}_SIZE", size)
    define("ENTRY_FIELDS", len(s["ENTRY_FIELDS"]))
    for i, name in enumerate(s["ENTRY_FIELDS"]):
        define(f"ENTRY_{name.upper()}", i)
    for name, off, size in s["CHUNK_FIELDS"]:
        define(f"CHUNK_{name.upper()}", off)
        define(f"CHUNK_{name.upper()}_SIZE", size)
    lines += ["", "#endif"]
    return "\n".join(lines) + "\n"


def digest(s):
    """64-bit digest of :func:`header`'s text for ``s`` (an int)."""
    return int.from_bytes(hashlib.sha256(header(s).encode()).digest()[:8], "little")


def write(root, where):
    """Write pycds_format.h for ``root``'s spec into directory ``where``
    (only if its text changed: an unchanged build stays up to date);
    returns ``(path, digest)``."""
    s = spec(root)
    text = header(s).replace("\n#endif\n", f"#define PYCDS_FMT_DIGEST 0x{digest(s):016X}ULL\n\n#endif\n")
    path = os.path.join(where, GENERATED)
    try:
        with open(path, encoding="utf-8") as f:
            same = f.read() == text
    except OSError:
        same = False
    if not same:
        os.makedirs(where, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return path, digest(s)
