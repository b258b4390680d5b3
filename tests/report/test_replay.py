"""Replay and incident files: the same fault timeline again from a run directory, both runs' figures and verdicts
side by side (exit 1 when a verdict differs); incidents validated like scenarios."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny

from diloco_chaos.harness import cli
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.report.results import InvariantFigure, recorded_invariants
from diloco_chaos.harness.run.replay import (
    RunVerdicts,
    compare_timelines,
    finished_run,
    fired_faults,
    load_incident,
    recorded_scenario,
    side_by_side,
)
from diloco_chaos.harness.run.supervisor import run_scenario

FAULTS = [
    {"action": "partition", "learner": 1, "at": {"step": 15, "learner": 0}, "until": {"step": 30, "learner": 0}},
    {"action": "degrade", "learner": 0, "latency_ms": 20, "at": {"merges": 5}},
]


def test_replay_reproduces_the_fault_timeline(runs_dir):
    sc = tiny("decoupled", learners=2, chips=1, steps=60).replace(faults=FAULTS)
    first = run_scenario(sc, runs_dir)
    assert recorded_scenario(first.run_dir) == sc
    out = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "replay", str(first.run_dir),
                          "--runs-dir", str(runs_dir / "replays"), "--quiet"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "verdicts: the same in both runs" in out.stdout, out.stdout
    (replay_dir,) = (runs_dir / "replays").iterdir()
    for name in ("faults_fired", "updates_accounted", "pushes_received"):
        (row,) = [ln for ln in out.stdout.splitlines() if ln.startswith(f"invariant {name} ")]
        assert row.split()[2] == "holds" and "differs" not in row, row
    a = sorted(fired_faults(finished_run(first.run_dir)), key=lambda x: x["index"])
    b = sorted(fired_faults(finished_run(replay_dir)), key=lambda x: x["index"])
    assert [(x["index"], x["describe"], x["trigger"]) for x in a] == \
        [(x["index"], x["describe"], x["trigger"]) for x in b]
    assert [x["trigger"] for x in a][:1] == ["learner 0 reached step 15"]
    for x, y in zip(a, b, strict=True):  # the progress seen at firing trails the trigger by at most a poll
        if x["index"] == 0:
            assert 15 <= x["steps"]["0"] <= 25 and 15 <= y["steps"]["0"] <= 25, (x, y)
    assert compare_timelines(a, b) == []
    assert compare_timelines(a, b[:1]) == ["faults[1] degrade(learner 0, latency_ms=20.0) at 'syncer reached 5 "
                                          "merges' fired in only one of the runs"]


def test_incident_file_adds_faults_and_names_bad_keys(tmp_path):
    sc = tiny("decoupled", learners=2, chips=1)
    good = tmp_path / "incident.toml"
    good.write_text('description = "link to region B at 10% for a while"\n'
                    '[[faults]]\naction = "degrade"\nlearner = 1\nbandwidth_kbps = 800\n'
                    'at = { time_s = 2.0 }\nuntil = { after_s = 5.0 }\n')
    out = load_incident(good, sc)
    assert [f.describe() for f in out.faults] == ["degrade(learner 1, bandwidth_kbps=800.0)"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[faults]]\naction = "kill_chip"\nlearner = 1\nchip = 7\n')
    with pytest.raises(ScenarioError, match=r"faults\[0\].chip = 7: must be in \[0, 0\]"):
        load_incident(bad, sc.replace(recovery=type(sc.recovery)(policy="restart")))
    with pytest.raises(ScenarioError, match=r"incident file '.*x.toml': unknown key 'when'"):
        (tmp_path / "x.toml").write_text('when = 3\n[[faults]]\naction = "partition"\nlearner = 0\n')
        load_incident(tmp_path / "x.toml", sc)
    with pytest.raises(ScenarioError, match="is not a run directory"):
        recorded_scenario(tmp_path)


def test_replay_with_a_mutation_exits_1_naming_the_verdict_that_differs(runs_dir: Path) -> None:
    """The replay runs with DILOCO_CHAOS_MUTATION=drop_pushes (the syncer silently drops ~10% of pushes,
    diloco_chaos/trainers/mutations.py), which pushes_received catches: its verdict differs from the original's."""
    first = run_scenario(tiny("decoupled", learners=2, chips=1, steps=60), runs_dir)
    recorded = recorded_invariants(first.run_dir)
    assert recorded is not None and all(f.ok for f in recorded), recorded
    env = {**os.environ, "DILOCO_CHAOS_MUTATION": "drop_pushes"}
    out = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "replay", str(first.run_dir),
                          "--runs-dir", str(runs_dir / "replays"), "--quiet"],
                         capture_output=True, text=True, timeout=240,
                         env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    (row,) = [ln for ln in out.stdout.splitlines() if ln.startswith("invariant pushes_received ")]
    assert row.split()[2:4] == ["holds", "0"] and "VIOLATED" in row and row.endswith("<- verdict differs"), row
    assert "replay's verdict differs: invariant pushes_received: holds 0 (<= 0) in the original, VIOLATED" \
        in out.stderr, out.stderr
    assert "mutation (DILOCO_CHAOS_MUTATION) none in the original, drop_pushes in the replay" in out.stderr
    for key in ("final eval loss", "goodput", "merges", "uptime", "unexpected errors"):
        assert any(ln.startswith(key + " ") for ln in out.stdout.splitlines()), key
    (replay_dir,) = (runs_dir / "replays").iterdir()
    replayed = {f.name: f for f in recorded_invariants(replay_dir) or ()}
    assert not replayed["pushes_received"].ok and replayed["pushes_received"].figure > 0
    # two finished runs compared without running anything: the same exit codes
    assert cli.main(["replay", str(first.run_dir), "--against", str(replay_dir)]) == 1
    assert cli.main(["replay", str(first.run_dir), "--against", str(first.run_dir)]) == 0


def _verdicts(unexpected: int, *figures: InvariantFigure) -> RunVerdicts:
    return RunVerdicts("run", 2.0, 0.95, 60, 1.0, unexpected, figures)


def test_side_by_side_lists_each_differing_verdict() -> None:
    held = InvariantFigure("model_finite", True, 0, 0, "<=", "", "non-finite values", "")
    broke = InvariantFigure("model_finite", False, 3, 0, "<=", "", "non-finite values", "3 NaN")
    lines, diffs = side_by_side(_verdicts(0, held), _verdicts(0, held))
    assert diffs == [] and lines[-1].split() == ["invariant", "model_finite", "holds", "0", "(<=", "0)", "holds",
                                                 "0", "(<=", "0)"]
    _, diffs = side_by_side(_verdicts(0, held), _verdicts(2, broke))
    assert diffs == ["unexpected errors: 0 in the original, 2 in the replay",
                     "invariant model_finite: holds 0 (<= 0) in the original, VIOLATED 3 (<= 0) in the replay"]
    _, diffs = side_by_side(_verdicts(1, held), _verdicts(2))  # errors in both: no verdict differs on them
    assert diffs == ["invariant model_finite: holds 0 (<= 0) in the original, not checked in the replay"]
