"""valgrind memcheck of a SHARE run of a real program (numpy + Flask + boto3).

Run with the interpreter pycds is installed in (a normal build)::

    python scripts/memcheck.py [--program examples/realapp.py] [--keep DIR]

Steps: a DUMP run writes the program's archive; the SHARE run then goes
under ``valgrind --tool=memcheck --leak-check=full`` with
``PYTHONMALLOC=malloc`` (pymalloc's arenas would hide and fake errors).
The plain run goes under memcheck too, as the baseline.  Reported: the
program's output against a plain run's, the number of modules served, the
memcheck errors (invalid reads and writes, uses of uninitialised values,
bad frees) of SHARE whose stack or whose value's origin
(``--track-origins``) passes through pycds's native module
(``pycds/_native*.so``), or whose place and origin the plain run does not
show (:func:`ours`), and every
leak record whose allocation stack passes through that module --
definitely or indirectly lost; CPython's own memory still held at exit is
not pycds's.  Exits 1 on any of these, or on another output.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAK_KINDS = ("Leak_DefinitelyLost", "Leak_IndirectlyLost")


def env_for(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    env.update(extra)
    return env


def frames(error, which=0):
    """(object file, function) of each frame of an error's stack number
    ``which`` (1: where an uninitialised value was made, --track-origins)."""
    stacks = error.findall("stack")
    out = []
    for f in stacks[which].findall("frame") if which < len(stacks) else []:
        out.append(((f.findtext("obj") or ""), (f.findtext("fn") or "?")))
    return out


def is_pycds(error):
    """Whether a stack of ``error`` runs pycds's own C code: a frame of the
    native module that is not cffi's generated set-up (``_cffi_*``,
    ``PyInit__native``: the ffi and lib objects every cffi module keeps to
    the end)."""
    return any("pycds" in obj and "_native" in os.path.basename(obj)
               and not fn.startswith(("_cffi_", "PyInit_"))
               for which in (0, 1) for obj, fn in frames(error, which))


def summarize(xml_path):
    """(errors, pycds leaks): lists of (kind, text, first functions, whether
    a stack of it -- where, or where the value came from -- passes through
    pycds) from valgrind's XML report."""
    root = ET.parse(xml_path).getroot()
    errors, leaks = [], []
    for e in root.findall("error"):
        kind = e.findtext("kind")
        where = [fn for _, fn in frames(e)[:8]]
        if kind.startswith("Leak_"):
            if kind in LEAK_KINDS and is_pycds(e):
                leaks.append((kind, e.findtext("xwhat/text") or "", where, True, ()))
        else:
            origin = tuple(fn for _, fn in frames(e, 1)[:4])
            errors.append((kind, e.findtext("what") or "", where, is_pycds(e), origin))
    return errors, leaks


def signature(error):
    """What identifies an error across runs: its kind and first functions."""
    return error[0], tuple(error[2])


def origin(error):
    """Where its uninitialised value was made (None: not such an error)."""
    return (error[0], error[4]) if error[4] else None


def ours(errors, baseline):
    """The errors of ``errors`` that are pycds's: through its native module,
    or neither at a place nor of an origin that the plain run shows (CPython
    3.11 reports uses of int digits _PyLong_New leaves unset, at many places)."""
    places = {signature(e) for e in baseline}
    origins = {origin(e) for e in baseline} - {None}
    return [e for e in errors
            if e[3] or (signature(e) not in places and origin(e) not in origins)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--program", default=os.path.join(ROOT, "examples", "realapp.py"))
    ap.add_argument("--keep", metavar="DIR", help="keep the archive and the report here")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found")
    work = args.keep or tempfile.mkdtemp(prefix="pycds-memcheck-")
    os.makedirs(work, exist_ok=True)
    img, report = os.path.join(work, "app.img"), os.path.join(work, "memcheck.xml")
    cmd = [args.python, args.program]
    plain = subprocess.run(cmd, env=env_for(), capture_output=True, text=True, timeout=600)
    subprocess.run(cmd, env=env_for(PYCDSMODE="DUMP", PYCDSARCHIVE=img),
                   capture_output=True, text=True, timeout=600, check=True)
    def memcheck(xml, **env):
        vg = ["valgrind", "--tool=memcheck", "--leak-check=full", "--show-leak-kinds=all",
              "--track-origins=yes", "--num-callers=30", "--xml=yes", f"--xml-file={xml}"]
        return subprocess.run(vg + cmd, capture_output=True, text=True, timeout=7200,
                              env=env_for(PYTHONMALLOC="malloc", **env))

    base_report = os.path.join(work, "memcheck-plain.xml")
    memcheck(base_report)
    r = memcheck(report, PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE="1")
    served = sum(ln.startswith("[pycds] served ") for ln in r.stderr.splitlines())
    base_errors, _ = summarize(base_report)
    errors, leaks = summarize(report)
    mine = ours(errors, base_errors)
    same = (r.returncode, r.stdout) == (plain.returncode, plain.stdout)
    print(f"program: {os.path.relpath(args.program, ROOT)}; output as plain: {same}; "
          f"modules served: {served}")
    print(f"memcheck errors: plain {len(base_errors)}, SHARE {len(errors)}; of SHARE's, "
          f"pycds's (see ours()): {len(mine)}; leak records through "
          f"pycds's native module: {len(leaks)}")
    for kind, what, where, _, _ in mine + leaks:
        print(f"  {kind}: {what}\n    at {' < '.join(where)}")
    print(f"reports: {base_report}, {report}")
    return 0 if same and served and not mine and not leaks else 1


if __name__ == "__main__":
    sys.exit(main())
