"""What a person sees from `diloco-chaos run` with three faults: each firing and ending in the live output,
then the faults table, every invariant's verdict and the errors, expected or not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import tiny_table

from diloco_chaos.harness.cli import main
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.report.timeline import fault_bands
from tests.report.test_results import write_toml


def three_faults(tmp_path: Path) -> Path:
    table = tiny_table("decoupled", learners=2, chips=2, steps=60, recovery={"policy": "restart", "repair_s": 0.5})
    path = write_toml(tmp_path / "three.toml", table)
    path.write_text(path.read_text() + """
[[faults]]
action = "degrade"
learner = 0
latency_ms = 20
at = { step = 8, learner = 0 }
until = { step = 16, learner = 0 }

[[faults]]
action = "kill_chip"
learner = 1
chip = 1
at = { step = 20, learner = 1 }

[[faults]]
action = "freeze"
learner = 0
at = { step = 30, learner = 0 }
until = { step = 40, learner = 1 }
""")
    return path


def test_three_faults_fire_and_end_on_screen_and_the_final_table_gives_their_verdicts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", str(three_faults(tmp_path)), "--runs-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert rc == 0, (err + out)[-4000:]
    live = err + out
    for i, what in enumerate(("degrade", "kill_chip", "freeze")):
        fired = re.search(rf"fault F{i} fired: {what}.*; trigger: (.+)", live)
        assert fired is not None, f"F{i} firing not shown:\n{live[-4000:]}"
        assert "step" in fired.group(1), fired.group(0)  # the trigger that fired it: training progress
        ended = live.find(f"fault F{i} ended: {what}")
        assert ended > live.find(fired.group(0)), f"F{i} ending not shown after its firing:\n{live[-4000:]}"
    # the final table: the three faults, every invariant held, and no unexpected error
    table = out[out.index("faults fired: 3"):]
    # in firing order: F2 (learner 0 at step 30) fires before F1 (learner 1 at step 20) when learner 1 lags
    assert sorted(m.group(1) for m in re.finditer(r"^  F(\d) ", table, re.M)) == ["0", "1", "2"], table
    verdicts = re.search(r"^invariants: all (\d+) held$", table, re.M)
    assert verdicts is not None and int(verdicts.group(1)) >= 5, table
    assert "UNEXPECTED" not in table, table
    # report.json and the HTML report's fault bands give every fault the same response figures
    run_dir = Path(re.search(r"^run directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    report = json.loads((run_dir / "report.json").read_text())
    bands = {b["index"]: b for b in fault_bands(read_events(run_dir / EVENTS_FILE))}
    why = f"{report['fault_response']}\n{table}"
    assert sorted(bands) == [r["index"] for r in report["fault_response"]] == [0, 1, 2], why
    for r in report["fault_response"]:
        assert (bands[r["index"]]["detect_s"], bands[r["index"]]["rejoin_s"]) == (r["detect_s"], r["rejoin_s"]), why
    assert report["fault_response"][1]["rejoin_s"] is not None, f"the killed chip's learner came back: {why}"
