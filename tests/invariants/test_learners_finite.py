"""A learner that trains on NaN fails the run: a real run in which learner 1's loss turns NaN after step 100
(tests/invariants/nan_task.py) ends with `learners_finite` violated, naming the learner, its fragments and steps, and
the
CLI lists the learner under the errors as UNEXPECTED, although the syncer kept the global model finite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import tiny_table

from diloco_chaos.harness.cli import main
from diloco_chaos.harness.invariants import learners_finite, model_finite
from tests.report.test_results import write_toml

TESTS = Path(__file__).resolve().parent


def test_a_learner_training_on_nan_fails_learners_finite_and_is_an_unexpected_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tiny_table("decoupled", learners=2, chips=1, steps=140)
    path = write_toml(tmp_path / "nan.toml", table)
    path.write_text(path.read_text() + f"""
[task]
factory = "nan_task:nan_after"
path = "{TESTS}"

[task.args]
learner = 1
after = 100
""")
    rc = main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, (err + out)[-4000:]
    run_dir = Path(re.search(r"^run directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    # the syncer protected the global model: its invariant holds; the learner's does not
    assert model_finite(run_dir).ok, model_finite(run_dir).message()
    res = learners_finite(run_dir)
    assert not res.ok and res.figure == 1, res.message()
    assert "learner 1: loss non-finite at steps 101-140" in res.detail, res.detail
    frags = re.findall(r"fragment (\d): non-finite work rejected, steps (\d+)-(\d+)", res.detail)
    assert frags, res.detail
    # a rejected push holds the fragment's steps since its last accepted one: it ends after step 100
    assert all(100 < int(last) <= 140 for _, first, last in frags), res.detail
    assert "learner 0" not in res.detail, res.detail
    # the CLI: the verdict, and the learner among the UNEXPECTED errors
    assert re.search(r"^invariants: \d+ of \d+ violated: .*learners_finite", out, re.M), out
    assert re.search(r"^  FAIL learners_finite: learner 1: loss non-finite at steps 101-140", out, re.M), out
    unexpected = out[out.index("UNEXPECTED errors"):]
    assert re.search(r"^  learner1\.chip0 learner_nonfinite: training loss nan at step 101", unexpected, re.M), out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["unexpected_errors"] >= 1
    assert any(e["ev"] == "learner_nonfinite" and not e["expected"] for e in report["errors"]), report["errors"]
