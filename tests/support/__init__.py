"""What the tests share: fresh interpreters for end-to-end runs
(run_python, dump_and_share, clean_env), files made to look installed and
settled, import-state helpers for in-process finder tests (after CPython's
test_importlib/util.py), and the scripts of scripts/ loaded by path
(load_script).  Fixtures and pytest's hooks are in tests/conftest.py.
"""

import ast
import contextlib
import importlib.util
import os
import subprocess
import sys
import sysconfig

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
WORKSPACE = os.path.join(TESTS, "workspace")
SCRIPTS = os.path.join(ROOT, "scripts")


def pycds_installed_pth():
    """Path of pycds.pth in this interpreter's site-packages (or None)."""
    for key in ("purelib", "platlib"):
        p = os.path.join(sysconfig.get_paths()[key], "pycds.pth")
        if os.path.exists(p):
            return p
    return None


# Modules site imports at start-up after the .pth files ran (pycds.pth
# among them): a sitecustomize or usercustomize of the interpreter's, as
# Debian's python3 has.  DUMP and AUTO runs archive them like any import
# (SHARE imports them plainly, before it opens its archive).
STARTUP_CUSTOMIZE = frozenset(m for m in ("sitecustomize", "usercustomize")
                              if m in sys.modules)


def without_dac_bypass(cmd):
    """``cmd`` (an argv list) as run by a process that cannot bypass file
    permissions: for root, under ``setpriv``, which drops CAP_DAC_OVERRIDE
    and CAP_DAC_READ_SEARCH from the bounding set.  Skips where the system
    cannot drop capabilities at all (qemu-user, running the emulated arm64
    chroot, fails the calls: "activate capabilities: Bad address")."""
    if os.getuid() != 0:
        return cmd
    import shutil
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's DAC bypass"
    drop = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run(drop + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this system cannot drop capabilities: {probe.stderr.strip()}")
    return drop + cmd


def clean_env(**extra):
    """The environment for a child interpreter: no PYCDS*/PYTHON* leaking in;
    ``PYCDSVERBOSE=0`` unless ``extra`` says otherwise (None: unset).
    Memory given back after a module body ran is made inaccessible instead
    (PYCDSRELEASE=protect), so that every SHARE run of the suite also checks
    that nothing uses it: a use faults.  Tests of the default pass
    PYCDSRELEASE=1."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCDS", "PYTHON")) and k != "SOURCE_DATE_EPOCH"}
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYCDSRELEASE"] = "protect"
    # Without the line a DUMP run prints to say what it wrote, so that a
    # test can compare stderr with plain Python's; PYCDSVERBOSE=None: unset.
    env["PYCDSVERBOSE"] = "0"
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        env.pop(k, None)
    return env


class Run:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def served(self):
        return [line.split(" ", 2)[2] for line in self.err.splitlines()
                if line.startswith("[pycds] served ")]

    def fallbacks(self):
        return [line for line in self.err.splitlines()
                if line.startswith("[pycds] fallback ")]

    def warnings(self):
        return [line for line in self.err.splitlines()
                if line.startswith("[pycds] warning:")]

    def __repr__(self):
        return f"Run(rc={self.rc}, out={self.out[-500:]!r}, err={self.err[-1500:]!r})"


def run_python(args, cwd=None, timeout=120, python=None, **env):
    """Run ``python args`` in a fresh interpreter with a clean environment
    plus ``env``; returns a :class:`Run` (CDS's assert_python_ok wrapper)."""
    if isinstance(args, str):
        args = [args]
    proc = subprocess.run([python or sys.executable, *args], cwd=cwd,
                          env=clean_env(**env), capture_output=True, text=True,
                          timeout=timeout)
    return Run(proc)


def installed(path, age=3600):
    """Make the module at ``path`` look installed ``age`` seconds ago: the
    source and a valid .pyc (py_compile, as pip and compileall write them)
    with mtimes that old.  Once :func:`settle` d, a DUMP run archives the
    code the import of such a module ran (pycds.dumping.capture); a module written
    just now is read again."""
    import py_compile
    import time
    then = time.time() - age
    os.utime(path, (then, then))
    pyc = py_compile.compile(str(path), doraise=True)
    os.utime(pyc, (then, then))
    return pyc


def settle(*dirs):
    """Wait until every file under ``dirs`` was last changed (its ctime)
    longer ago than pycds.dumping.capture.SETTLED_NS: a DUMP run takes no module
    from a capture whose source or .pyc changed less than that before its
    import.  Tests that need captures make all their files first, then
    settle once."""
    import time
    from pycds.dumping import capture as _capture
    newest = 0
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in files:
                newest = max(newest, os.stat(os.path.join(root, f)).st_ctime_ns)
    wait = (newest + _capture.SETTLED_NS) / 1e9 + 0.2 - time.time()
    if wait > 0:
        time.sleep(wait)


def dump_and_share(args, cwd, archive, extra_env=None, verbose=1):
    """plain, DUMP and SHARE runs of the same command; returns the three."""
    extra_env = extra_env or {}
    plain = run_python(args, cwd=cwd, **extra_env)
    dump = run_python(args, cwd=cwd, PYCDSMODE="DUMP", PYCDSARCHIVE=archive,
                      **extra_env)
    share = run_python(args, cwd=cwd, PYCDSMODE="SHARE", PYCDSARCHIVE=archive,
                       PYCDSVERBOSE=verbose, **extra_env)
    return plain, dump, share


@contextlib.contextmanager
def import_state(**kwargs):
    """Save and restore sys.meta_path, sys.path, sys.path_importer_cache and
    sys.path_hooks around a block, setting any given as keyword arguments."""
    names = ("meta_path", "path", "path_importer_cache", "path_hooks")
    saved = {n: getattr(sys, n) for n in names}
    try:
        for n in names:
            value = kwargs.get(n, getattr(sys, n))
            setattr(sys, n, value.copy() if hasattr(value, "copy") else value)
        yield
    finally:
        for n, v in saved.items():
            setattr(sys, n, v)


def flip_bits(path, at, mask=0x01):
    """XOR the byte at offset ``at`` of the file ``path`` with ``mask``."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


@contextlib.contextmanager
def uncache(*names):
    """Remove ``names`` from sys.modules during the block and after it."""
    def clear():
        for name in names:
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
    clear()
    try:
        yield
    finally:
        clear()


def load_script(name):
    """scripts/<name>.py as a module, loaded by its path (scripts/ is not a
    package, and no test puts it on sys.path).  Loaded once: registered in
    sys.modules under ``name``, as an import would, since its own code needs
    that (a dataclass looks its module up there); the scripts it imports by
    name (cprobe, fuzz_archive) are loaded the same way first."""
    path = os.path.join(SCRIPTS, name + ".py")
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == path:
        return mod
    for dep in _scripts_imported(path):
        load_script(dep)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def _scripts_imported(path):
    """The names of the scripts of scripts/ that the script at ``path``
    imports, at its top or in a function."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names
                  if os.path.isfile(os.path.join(SCRIPTS, n + ".py")))
