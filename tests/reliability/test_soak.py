"""The soak (issue 26, target 5), reduced: DUMP and SHARE runs on one
archive while the program's sources are edited; every run prints what a
plain run at some moment of it prints.  The 10-minute run is
scripts/soak.py; docs/reliability.md has its figures."""

import sys

import pytest

from support import load_script

soak = load_script("soak")


def test_the_oracle_rejects_a_version_that_was_not_current():
    editor = soak.Editor("unused", 1, None)
    editor.history["alpha"] += [(10.0, 10.1, 1), (20.0, 20.1, 2)]
    line = {v: f"app.alpha {v} {soak.expected_value('alpha', v)}" for v in (0, 1, 2)}
    rest = [f"app.{n} 0 {soak.expected_value(n, 0)}" for n in soak.EDITED[1:]]

    def out(v):
        return "\n".join([line[v]] + rest + ["fixed 1 True True"]) + "\n"
    assert soak.check(out(1), editor, 12.0, 15.0) is None
    assert soak.check(out(2), editor, 12.0, 20.05) is None     # edited meanwhile
    assert soak.check(out(1), editor, 12.0, 20.05) is None
    assert "not current" in soak.check(out(0), editor, 12.0, 15.0)   # stale code
    assert "not current" in soak.check(out(2), editor, 12.0, 15.0)
    wrong = out(1).replace(line[1], f"app.alpha 1 {soak.expected_value('alpha', 1) + 1}")
    assert "is not version 1's" in soak.check(wrong, editor, 12.0, 15.0)


@pytest.mark.slow
def test_a_short_soak(tmp_path):
    res = soak.soak(sys.executable, str(tmp_path), minutes=0.3, dumpers=1, sharers=3,
                    every=1.5, log=lambda *a: None, runs_at_least=4)
    assert res["failures"] == []
    assert res["edits"] >= 5
    assert res["stats"]["SHARE runs"] >= 10 and res["stats"]["DUMP runs"] >= 3
    assert res["stats"]["SHARE app modules served"] > 0
