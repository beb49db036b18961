"""The demo program: BF16 inference accelerated by pycds, identical output."""

import os
import sys

from conftest import ROOT, dump_and_share, run_python

PROGRAM = os.path.join(ROOT, "examples", "bf16_infer.py")
DEMO = os.path.join(ROOT, "examples", "demo.py")


class TestDemo:
    def test_bf16_infer_identical_from_archive(self, tmp_path):
        img = str(tmp_path / "bf16.img")
        plain, dump, share = dump_and_share([PROGRAM], tmp_path, img)
        assert plain.rc == 0 and "accuracy:" in plain.out, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out)
        assert (share.rc, share.out) == (plain.rc, plain.out)
        served = set(share.served())
        assert {"pycds.bf16", "pycds.bf16.models", "pycds.bf16.functional",
                "numpy", "numpy.linalg"} <= served, sorted(served)[:40]
        assert not share.warnings() and not share.fallbacks()

    def test_demo_script_reports_identity(self):
        r = run_python([DEMO, "--runs", "1"], cwd=ROOT, timeout=300)
        assert r.rc == 0, r
        assert "predictions identical to the plain run: yes" in r.out
        assert "pycds.bf16: yes, numpy: yes" in r.out
