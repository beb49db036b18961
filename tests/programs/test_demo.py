"""The demo: an inference service's start-up served from an archive, identical output."""

import os

from support import ROOT, dump_and_share, run_python

SERVICE = os.path.join(ROOT, "examples", "service.py")
BF16_INFER = os.path.join(ROOT, "examples", "bf16_infer.py")
DEMO = os.path.join(ROOT, "examples", "demo.py")


class TestDemo:
    def test_service_identical_from_archive(self, tmp_path):
        weights = str(tmp_path / "w.safetensors")
        made = run_python([SERVICE, "--write-weights", weights])
        assert made.rc == 0 and os.path.getsize(weights) > 0, made
        plain, dump, share = dump_and_share([SERVICE, weights], tmp_path,
                                            str(tmp_path / "service.img"))
        assert plain.rc == 0 and "POST /predict: 200, 64 scans" in plain.out, plain
        assert (dump.rc, dump.out) == (plain.rc, plain.out)
        assert (share.rc, share.out) == (plain.rc, plain.out)
        served = set(share.served())
        assert {"flask", "werkzeug.test", "numpy", "safetensors.numpy",
                "pycds.bf16.models"} <= served, sorted(served)[:40]
        # BF16 as uint16 bits: ml_dtypes (no archive shortens its start) stays out.
        assert not any(m.split(".")[0] == "ml_dtypes" for m in served)
        assert not share.warnings() and not share.fallbacks()

    def test_bf16_infer_identical_from_archive(self, tmp_path):
        img = str(tmp_path / "bf16.img")
        plain, dump, share = dump_and_share([BF16_INFER], tmp_path, img)
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
        assert "output identical to the plain run: yes" in r.out
        assert "flask: yes, numpy: yes, safetensors: yes, pycds.bf16: yes" in r.out
        assert "whole process (ms)" in r.out and "import of its modules (ms)" in r.out
