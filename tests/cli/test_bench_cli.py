"""python -m pycds bench -- COMMAND: the user's program, plain vs SHARE.

Timings are not asserted (a shared machine); what is: both variants ran as
often as asked, in the environments promised, side by side in a table with
their ratios; the modules served are counted; failures and differences are
reported; no temporary archive is left behind.
"""

import io
import json
import os
import re
import sys

from pycds.cli import bench as _bench

from support import run_python

IMPORTS = "import json, email.parser"


def bench(tmp_path, *args, **env):
    """``python -m pycds bench ARGS`` with its own empty TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return run_python(["-m", "pycds", "bench", *args], cwd=tmp_path, TMPDIR=str(tmp), **env)


def table(out):
    """{row label: [plain, SHARE, SHARE/plain]} from the report."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(wall ms|CPU ms)\s+(\S+)\s+(\S+)\s+(\S+)$", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.groups()[1:]]
    return rows


class TestBenchCommand:
    def test_plain_and_share_side_by_side(self, tmp_path):
        r = bench(tmp_path, "--reps", "2", "--json", str(tmp_path / "r.json"),
                  "--", sys.executable, "-c", IMPORTS)
        assert r.rc == 0, r
        assert re.search(r"plain\s+SHARE\s+SHARE/plain", r.out), r
        rows = table(r.out)
        assert set(rows) == {"wall ms", "CPU ms"}, r
        for label, values in rows.items():
            assert all(v > 0 for v in values), (label, r)
        served = int(re.search(r"^served:\s+(\d+) modules", r.out, re.M).group(1))
        assert served > 0, r
        assert "warning" not in r.err, r
        with open(tmp_path / "r.json") as f:
            res = json.load(f)
        assert [len(res["runs"][v]) for v in ("plain", "SHARE")] == [2, 2]
        assert res["served"] == served and res["archive"] is None
        assert res["ratio"]["wall"] > 0 and res["ratio"]["cpu"] > 0
        assert os.listdir(tmp_path / "tmp") == []      # the temporary archive is gone

    def test_environments(self, tmp_path):
        """Plain runs get no PYCDS* variable; DUMP and SHARE runs get the
        command's mode and archive and keep the user's other settings;
        everything else passes through."""
        log = tmp_path / "env.log"
        code = ("import os, sys; g = os.environ.get; "
                "open(sys.argv[1], 'a').write(' '.join(g(k, '-') for k in "
                "('PYCDSMODE', 'PYCDSCHECK', 'PYCDSARCHIVE', 'OPENBLAS_NUM_THREADS')) + '\\n')")
        user_img = str(tmp_path / "user.img")
        r = bench(tmp_path, "--reps", "2", "--warmup", "1", "--", sys.executable, "-c", code,
                  str(log), PYCDSCHECK="hash", PYCDSARCHIVE=user_img, OPENBLAS_NUM_THREADS="1")
        assert r.rc == 0, r
        lines = log.read_text().splitlines()
        plain = [line for line in lines if line.startswith("- ")]
        assert plain == ["- - - 1"] * 4, lines          # check run, warm-up, 2 reps
        others = [line.split() for line in lines if not line.startswith("- ")]
        assert sorted(mode for mode, *_ in others) == ["DUMP"] + ["SHARE"] * 4, lines
        archives = {archive for _, _, archive, _ in others}
        assert len(archives) == 1 and user_img not in archives, lines
        assert all(check == "hash" and blas == "1" for _, check, _, blas in others), lines
        assert not os.path.exists(user_img)
        assert os.listdir(tmp_path / "tmp") == []

    def test_failing_command_is_reported(self, tmp_path):
        r = bench(tmp_path, "--reps", "2", "--", sys.executable, "-c",
                  "import sys; sys.exit(3)")
        assert r.rc == 1, r
        assert "exited with status 3" in r.err, r
        assert os.listdir(tmp_path / "tmp") == []

    def test_ignore_failure_measures_anyway(self, tmp_path):
        r = bench(tmp_path, "--reps", "2", "--ignore-failure", "--", sys.executable, "-c",
                  "import json, sys; sys.exit(3)")
        assert r.rc == 0, r
        assert set(table(r.out)) == {"wall ms", "CPU ms"}, r

    def test_double_dash_is_required(self, tmp_path):
        r = bench(tmp_path, "--reps", "2", sys.executable, "-c", "pass")
        assert r.rc == 2 and "usage:" in r.err and "after --" in r.err, r
        r = bench(tmp_path, "--reps", "2", "--")
        assert r.rc == 2 and "usage:" in r.err, r

    def test_output_differences_are_reported(self, tmp_path):
        r = bench(tmp_path, "--reps", "2", "--", sys.executable, "-c",
                  "import json, os; print(os.environ.get('PYCDSMODE'))")
        assert r.rc == 0, r
        assert "warning: stdout differs between plain and SHARE runs" in r.err, r
        # Output that changes from run to run is not taken for a difference.
        r = bench(tmp_path, "--reps", "2", "--", sys.executable, "-c",
                  "import json, time; print(time.perf_counter_ns())")
        assert r.rc == 0, r
        assert "stdout varies from one plain run to the next" in r.err, r
        assert "differs" not in r.err, r

    def test_given_archive_is_made_once_and_kept(self, tmp_path):
        img = str(tmp_path / "app.img")
        args = ["--reps", "1", "--archive", img, "--", sys.executable, "-c", IMPORTS]
        first = bench(tmp_path, *args)
        assert first.rc == 0 and "made by a DUMP run" in first.out, first
        assert os.path.exists(img)
        st = os.stat(img)
        second = bench(tmp_path, *args)
        assert second.rc == 0 and "given" in second.out, second
        assert os.stat(img).st_mtime_ns == st.st_mtime_ns    # no second DUMP

    def test_bad_arguments_are_usage_errors(self, tmp_path):
        for reps in ("abc", "1.5", "0"):
            r = bench(tmp_path, "--reps", reps, "--", sys.executable, "-c", "pass")
            assert r.rc == 2 and "--reps" in r.err and "positive integer" in r.err, r
            assert "_positive" not in r.err, r
        # Where --json cannot be written: said before anything runs.
        r = bench(tmp_path, "--json", str(tmp_path / "missing" / "r.json"), "--",
                  sys.executable, "-c", "import sys; sys.exit(3)")
        assert r.rc == 2 and "--json" in r.err and "exited" not in r.err, r

    def test_command_that_cannot_start_says_why(self, tmp_path):
        prog = tmp_path / "prog.py"
        prog.write_text("import json\n")
        prog.chmod(0o644)
        r = bench(tmp_path, "--", str(prog))
        assert r.rc == 2 and "not found" not in r.err and "not executable" in r.err, r
        r = bench(tmp_path, "--", str(tmp_path / "absent"))
        assert r.rc == 2 and "command not found" in r.err, r

    def test_unusable_given_archive_is_an_error(self, tmp_path):
        img = tmp_path / "garbage.img"
        img.write_bytes(b"not an archive" * 100)
        r = bench(tmp_path, "--reps", "1", "--archive", str(img), "--",
                  sys.executable, "-c", IMPORTS)
        assert r.rc == 2 and "not a pycds archive" in r.err, r
        assert table(r.out) == {}, r

    def test_a_failed_dump_says_why(self, tmp_path):
        blocked = tmp_path / "blocked"
        blocked.write_text("a file where the archive's directory should be\n")
        r = bench(tmp_path, "--reps", "1", "--archive", str(blocked / "app.img"), "--",
                  sys.executable, "-c", IMPORTS)
        assert r.rc == 1 and "wrote no archive" in r.err, r
        assert "no archive was written to" in r.err, r     # the DUMP run's own warning

    def test_nothing_served_hint_fits_a_program_importing_nothing(self, tmp_path):
        r = bench(tmp_path, "--reps", "1", "--", sys.executable, "-c", "pass")
        assert r.rc == 1 or r.rc == 0, r
        assert "installed?" not in r.err, r

    def test_progress_line_only_on_a_terminal(self):
        class Tty(io.StringIO):
            def isatty(self):
                return True
        tty, pipe = Tty(), io.StringIO()
        for stream in (tty, pipe):
            p = _bench._Progress(stream)
            p.show("rep 1/2: plain")
            p.clear()
        assert tty.getvalue() == "\r[pycds bench] rep 1/2: plain\x1b[K\r\x1b[K"
        assert pipe.getvalue() == ""

    def test_counts_in_the_report_are_in_the_right_number(self):
        times = {"wall": 10.0, "cpu": 9.0}
        r = {"command": ["python", "app.py"], "reps": 1, "warmup": 1, "archive": None,
             "archive_modules": 1, "archive_bytes": 2**20, "served": 1, "fallbacks": 0,
             "median_ms": {"plain": times, "SHARE": times}, "ratio": {"wall": 1, "cpu": 1}}
        one = _bench._table(r, True, True)
        assert "temporary, made by a DUMP run: 1 module, 1.0 MiB" in one, one
        assert "served:   1 module in a SHARE run" in one, one
        assert "after 1 warm-up" in one and "1 warm-ups" not in one, one
        many = _bench._table(dict(r, archive_modules=2, served=0, warmup=2), True, True)
        assert "2 modules, 1.0 MiB" in many and "served:   0 modules" in many, many
        assert "after 2 warm-ups" in many, many


class TestInterleave:
    def test_rotates_and_drops_warmups(self):
        class V:
            def __init__(self, name):
                self.name = name
        a, b = V("a"), V("b")
        calls = []

        def run_one(v):
            calls.append(v.name)
            return len(calls)
        out = _bench.interleave([a, b], 3, run_one, warmup=1)
        assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
        assert out == {"a": [3, 6, 7], "b": [4, 5, 8]}

    def test_ratio_pairs_reps(self):
        assert _bench.ratio([1, 4, 9], [2, 2, 3]) == 2.0
        assert _bench.ratio([2, 2], [0, 1]) == 2.0    # a zero baseline is left out


def test_auto_variant_is_timed_beside_share(tmp_path):
    # AUTO's steady state, with the archive the DUMP run made: one more
    # column, AUTO/SHARE, the same output, and nothing written.
    archive = tmp_path / "b.img"
    script = tmp_path / "prog.py"
    script.write_text("import json\nprint(json.dumps([1]))\n")
    r = run_python(["-m", "pycds", "bench", "--reps", "2", "--auto", "--archive",
                    str(archive), "--json", str(tmp_path / "r.json"), "--",
                    sys.executable, str(script)], cwd=str(tmp_path))
    assert r.rc == 0, r
    header = [line for line in r.out.splitlines() if "SHARE/plain" in line][0]
    assert "AUTO" in header and "AUTO/SHARE" in header
    res = json.loads((tmp_path / "r.json").read_text())
    assert len(res["runs"]["AUTO"]) == 2 and res["auto_ratio"]["wall"] > 0
    assert res["warnings"] == [], res
