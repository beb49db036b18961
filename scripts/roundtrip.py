"""Plain, DUMP and SHARE runs of one small program, each in a fresh interpreter.

Run with the interpreter whose installed pycds is to be checked (not from a
checkout's root, where ``pycds/`` would shadow the installed package)::

    python scripts/roundtrip.py

The program imports json, argparse, email, decimal (and flask when it is
installed) and prints what it made of them.  A plain run, a DUMP run, two
SHARE runs (``PYCDSRELEASE=1``, the default that gives pages back, and
``protect``, which makes them inaccessible) and two AUTO runs (the first
writes an archive of its own at exit, the second is served from it) must
print the same stdout, and each SHARE run and the second AUTO run must serve
the program's modules (``[pycds] served NAME`` on stderr under
``PYCDSVERBOSE=1``) without a warning.  Prints one line per
SHARE run and a verdict; exit status 0 when all of it holds, else 1.  Used by
``scripts/aarch64_check.sh`` (in the arm64 chroot), by the cibuildwheel
test-command in pyproject.toml and by ``tests/packaging/test_wheel.py``.
"""

import os
import shutil
import subprocess
import sys
import tempfile

PROGRAM = r'''
import argparse, decimal, email.message, email.utils, json, sys
try:
    import flask
except ImportError:
    flask = None
p = argparse.ArgumentParser(prog="check")
p.add_argument("--n", type=int, default=7)
args = p.parse_args([])
m = email.message.EmailMessage()
m["Subject"] = "pages"
m["Date"] = email.utils.formatdate(0, usegmt=True)
m.set_content("body")
with decimal.localcontext() as ctx:     # (3.10 takes no keywords there)
    ctx.prec = 40
    d = decimal.Decimal(1) / 7
print(json.dumps({"n": args.n, "d": str(d), "msg": m.as_string()}, sort_keys=True))
if flask is not None:
    app = flask.Flask("check")
    @app.route("/<name>")
    def hello(name):
        return flask.jsonify(hello=name)
    print(app.test_client().get("/arm").get_json())
print(sorted(k for k in sys.modules if k.split(".")[0] in ("json", "email", "flask")))
'''

# Emulated (qemu-user) a run takes seconds, not milliseconds.
TIMEOUT = 900


def run(prog, cwd, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYCDS", "PYTHON"))}
    e["PYTHONIOENCODING"] = "utf-8"
    e.update(env)
    return subprocess.run([sys.executable, prog], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=TIMEOUT)


def served_modules(stderr):
    return {line.split(" ", 2)[2].split()[0] for line in stderr.splitlines()
            if line.startswith("[pycds] served ")}


def check(work):
    """Run the program every way under ``work``; return the problems found."""
    prog = os.path.join(work, "prog.py")
    archive = os.path.join(work, "app.img")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    try:
        import flask  # noqa: F401
        want = {"json", "argparse", "decimal", "email.message", "flask"}
    except ImportError:
        want = {"json", "argparse", "decimal", "email.message"}
    page = os.sysconf("SC_PAGESIZE")
    runs = {"plain": run(prog, work),
            "DUMP": run(prog, work, PYCDSMODE="DUMP", PYCDSARCHIVE=archive)}
    for release in ("1", "protect"):
        runs["SHARE release=" + release] = run(prog, work, PYCDSMODE="SHARE",
                                               PYCDSARCHIVE=archive, PYCDSVERBOSE="1",
                                               PYCDSRELEASE=release)
    # AUTO: the first run finds no archive and writes one at exit, the
    # second is served from it.
    auto = os.path.join(work, "auto.img")
    runs["AUTO first"] = run(prog, work, PYCDSMODE="AUTO", PYCDSARCHIVE=auto)
    if not os.path.exists(auto):
        failed = [f"AUTO first: wrote no archive: {runs['AUTO first'].stderr[-2000:]}"]
    else:
        failed = []
    runs["AUTO second"] = run(prog, work, PYCDSMODE="AUTO", PYCDSARCHIVE=auto,
                              PYCDSVERBOSE="1")
    for name, r in runs.items():
        if r.returncode != 0:
            failed.append(f"{name}: exit {r.returncode}: {r.stderr[-2000:]}")
        elif r.stdout != runs["plain"].stdout:
            failed.append(f"{name}: stdout differs from the plain run's:\n{r.stdout[-2000:]}")
        if name.startswith("SHARE") or name == "AUTO second":
            served = served_modules(r.stderr)
            warned = [line for line in r.stderr.splitlines()
                      if line.startswith("[pycds] warning")]
            if warned:
                failed.append(f"{name}: " + "\n".join(warned))
            if not want <= served:
                failed.append(f"{name}: not served: {sorted(want - served)}")
            print(f"page {page}: {name}: {len(served)} modules served")
    if not failed:
        print(f"page {page}: ok: plain, DUMP, SHARE and AUTO print the same "
              f"({len(runs['plain'].stdout)} bytes); served {sorted(want)}")
    return failed


def main():
    work = tempfile.mkdtemp(prefix="pycds-roundtrip-")
    try:
        failed = check(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"page {os.sysconf('SC_PAGESIZE')}: FAILED\n" + "\n".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
