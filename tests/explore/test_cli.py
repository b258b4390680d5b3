"""`diloco-chaos explore` refuses a bad scenario, `[explore]` table or invariant name with exit 2, naming the key,
before any run starts (no explore.jsonl is written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco_chaos.harness.cli import main


@pytest.mark.parametrize("sets, message", [
    (["explore.min_faults=9"], "explore.min_faults = 9: must be at most explore.max_faults = 3"),
    (['explore.invariants=["initial_pul"]'], "unknown invariant 'initial_pul'"),
    (['explore.kinds=["kill_syncer"]'], "explore.kinds: 'kill_syncer' cannot be drawn for this scenario"),
    (["topology.learners=0"], "topology.learners = 0: must be in [1, 64]"),
])
def test_a_bad_table_exits_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str],
                                            message: str) -> None:
    out = tmp_path / "out"
    args = ["explore", "--builtin", "default", "--out", str(out), "--budget-s", "1"]
    assert main([*args, *(a for s in sets for a in ("--set", s))]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
