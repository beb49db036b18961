"""The reference workload: a real program importing numpy, Flask and boto3."""

import os

from support import ROOT, dump_and_share, run_python

REALAPP = os.path.join(ROOT, "examples", "realapp.py")

# Modules plain Python loaded through the stock source loader in this run.
LIST_SOURCE_MODULES = r"""
import sys, importlib.machinery as m
if sys.argv[1:] == ["import"]:
    import numpy, flask, boto3
names = sorted(n for n, mod in list(sys.modules.items())
               if n != "__main__" and not (n == "pycds" or n.startswith("pycds."))
               and type(getattr(mod, "__spec__", None) and mod.__spec__.loader)
               in (m.SourceFileLoader,) and mod.__spec__.name == n)
print("\n".join(names))
"""


class TestRealApp:
    def test_realapp_identical_and_served(self, tmp_path):
        img = str(tmp_path / "app.img")
        plain, dump, share = dump_and_share([REALAPP], tmp_path, img)
        assert plain.rc == 0 and "boto3 buckets=['logs', 'models']" in plain.out, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out)
        assert (share.rc, share.out) == (plain.rc, plain.out)
        assert not share.warnings() and not share.fallbacks(), share.err[-2000:]
        served = set(share.served())
        assert {"numpy", "flask", "boto3", "botocore.stub", "werkzeug.test"} <= served

    def test_every_source_module_is_served(self, tmp_path):
        img = str(tmp_path / "app.img")
        code = "import numpy, flask, boto3"
        run_python(["-c", code], cwd=tmp_path, PYCDSMODE="DUMP", PYCDSARCHIVE=img)
        share = run_python(["-c", code], cwd=tmp_path, PYCDSMODE="SHARE",
                           PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert share.rc == 0, share
        # What plain Python (with pycds off) loads from source for this import:
        listing = run_python(["-c", LIST_SOURCE_MODULES, "import"], cwd=tmp_path)
        # ... less what start-up loaded before any hook could act (encodings,
        # other .pth files) and what the listing script itself imports:
        startup = run_python(["-c", LIST_SOURCE_MODULES], cwd=tmp_path)
        expected = set(listing.out.split()) - set(startup.out.split())
        assert len(expected) > 300, listing
        missing = expected - set(share.served())
        assert not missing, sorted(missing)[:20]
