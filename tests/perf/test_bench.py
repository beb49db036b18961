"""benchmarks/bench.py: the report arithmetic, and one real (small) run end
to end.

The benchmark's numbers are not asserted (they are ratios measured on a
shared machine, see docs/performance.md); what is asserted is that every
variant really ran, that ratios are medians of per-rep ratios, and that the
hook never imports the benchmark code.
"""

import importlib.util
import os
import subprocess
import sys

import pycds

from support import ROOT, clean_env

# The reference benchmark is a script of the checkout, not a module of the
# installed package: load it by path (it imports the installed pycds).
BENCH = os.path.join(ROOT, "benchmarks", "bench.py")
_spec = importlib.util.spec_from_file_location("pycds_reference_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


class TestArithmetic:
    def test_ratio_is_median_of_pairwise_ratios(self):
        # Pairwise: 1/2, 4/2, 9/3 -> median 2.0 (the ratio of medians
        # would be 4/2 = 2.0 too; make them differ).
        assert bench._ratio([1, 4, 9], [2, 2, 3]) == 2.0
        assert bench._ratio([10, 1, 1], [1, 10, 10]) == 0.1

    def test_report_tables(self):
        runs = {"baseline": [(10.0, 9.0)] * 3, "pycds": [(8.0, 7.0)] * 3,
                "ideal": [(5.0, 4.0)] * 3}
        results = {"machine": {"platform": "p", "cpus": 2, "python": "3.x",
                               "date": "d", "loadavg": ["1", "1", "1"]},
                   "sections": {"inproc": {"json": runs}}}
        text = bench.report(results)
        row = [line for line in text.splitlines() if line.startswith("| json")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:4] == ["10.0 (9.0)", "8.0 (7.0)", "5.0 (4.0)"]
        assert cells[4] == "1.600 (1.750)"      # pycds/ideal
        assert cells[5] == "0.800 (0.778)"      # pycds/baseline


class TestRun:
    def test_inproc_json_one_rep(self, tmp_path):
        out = subprocess.run(
            [sys.executable, BENCH, "--sections", "inproc",
             "--workloads", "json", "--reps", "1", "--json",
             str(tmp_path / "r.json")],
            cwd=str(tmp_path), env=clean_env(), capture_output=True, text=True,
            timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        import json
        with open(tmp_path / "r.json") as f:
            results = json.load(f)
        r = results["sections"]["inproc"]["json"]
        # The report names the pycds it measured: the child's, this one.
        assert results["machine"]["pycds"] == os.path.dirname(pycds.__file__)
        assert f"pycds measured: {os.path.dirname(pycds.__file__)}" in out.stdout
        for variant in ("baseline", "pycds", "ideal"):
            (wall, cpu), = r[variant]
            assert wall > 0 and cpu > 0, (variant, r)
        (wall, cpu, interning), = r["ideal+intern"]
        assert wall > interning > 0 and cpu > 0, r
        assert "Re-interning alone" in out.stdout
        assert "| json |" in out.stdout

    def test_ideal_intern_interns_fresh_copies_of_each_modules_names(self, tmp_path):
        # The strings timed are copies (not the interned objects, no hash
        # cached), one per distinct interned string of each module's code.
        listfile = str(tmp_path / "json.mods")
        run = subprocess.run([sys.executable, "-c",
                              bench._LIST.format(mods="json", listfile=listfile)],
                             env=clean_env(), capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        probe = bench._IDEAL.format(mods="json", listfile=listfile,
                                    setup=bench._INTERN_SETUP, timed="", report="").split(
            "import sys, time\nc0")[0] + (
            "assert all(sys.intern(_fresh(c)) is not c for c in _copies)\n"
            "names = {c for c in _copies}\n"
            "assert {'JSONDecoder', 'loads', 'scanstring'} <= names, sorted(names)[:20]\n"
            "print(len(_copies), len(table))\n")
        out = subprocess.run([sys.executable, "-c", probe], env=clean_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-3000:]
        copies, modules = map(int, out.stdout.split())
        assert modules >= 4 and copies > 20 * modules, out.stdout

    def test_hook_does_not_import_bench(self, tmp_path):
        # Neither the reference benchmark nor the code it shares with
        # `python -m pycds bench` (pycds.cli.bench).
        out = subprocess.run(
            [sys.executable, "-c", "import sys, json; print(any(m in sys.modules for m in "
             "('pycds.cli.bench', 'pycds_reference_bench', 'bench')))"],
            cwd=str(tmp_path), env=clean_env(PYCDSMODE="SHARE",
                                             PYCDSARCHIVE=str(tmp_path / "none.img")),
            capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "False", out
        assert not os.path.exists(tmp_path / "none.img")
