"""Compile and run a few lines of C against this interpreter's headers, to
read object layouts (offsets, sizes) from the headers themselves rather than
hard-code them.  Used by fuzz_archive.py and twin_check.py."""

import os
import subprocess
import sysconfig
import tempfile


def run(src):
    """Compile ``src`` with the C compiler that builds extensions, run it and
    return its standard output.  Raises RuntimeError without a working C
    compiler (or where the program fails)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "probe.c"), os.path.join(d, "probe")
        with open(c, "w") as f:
            f.write(src)
        try:
            subprocess.run([*cc, "-Wall", "-Wextra", "-I", sysconfig.get_paths()["include"],
                            c, "-o", exe], check=True, capture_output=True, text=True)
            return subprocess.run([exe], check=True, capture_output=True,
                                  text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or ""
            raise RuntimeError(f"cannot read the object layout: {e}\n{detail}") from None
