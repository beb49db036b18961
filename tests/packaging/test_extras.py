"""The hook without the bf16 companion's dependencies (plain
`pip install pycds`), and the companion naming its extra when they lack."""

from support import run_python


# The companion's dependencies, made unimportable (as in a venv of plain
# `pip install pycds`) by a .pth-free blocker in the child itself.
_NO_BF16_DEPS = ("import sys\n"
                 "for _m in ('numpy', 'ml_dtypes', 'safetensors'):\n"
                 "    sys.modules[_m] = None\n")


def test_the_hook_needs_none_of_the_companions_dependencies(tmp_path):
    (tmp_path / "m.py").write_text("X = 1\n")
    (tmp_path / "app.py").write_text(_NO_BF16_DEPS + "import json, m\nprint(m.X)\n")
    img = str(tmp_path / "a.img")
    for mode in ("DUMP", "SHARE", "AUTO"):
        r = run_python(["app.py"], cwd=tmp_path, PYCDSMODE=mode, PYCDSARCHIVE=img,
                       PYCDSVERBOSE=1)
        assert r.rc == 0 and r.out == "1\n" and r.warnings() == [], (mode, r)
    assert "m" in r.served()
    api = run_python(["-c", _NO_BF16_DEPS + "import m, pycds, pycds.auto, pycds.cli.cache\n"
                      f"print(pycds.dump({img!r}) > 0)"], cwd=tmp_path)
    assert api.out == "True\n", api


def test_importing_the_companion_without_its_dependencies_names_the_extra(tmp_path):
    r = run_python(["-c", _NO_BF16_DEPS + "import pycds.bf16"], cwd=tmp_path)
    assert r.rc == 1 and "ImportError: pycds.bf16 needs numpy" in r.err, r
    assert "pip install 'pycds[bf16]'" in r.err, r
