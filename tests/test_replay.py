"""Replay and incident files: the same fault timeline again from a run directory; incidents validated like scenarios."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import tiny

from harness.replay import compare_timelines, fault_timeline, load_incident, recorded_scenario
from harness.scenario import ScenarioError
from harness.supervisor import run_scenario

FAULTS = [
    {"action": "partition", "learner": 1, "at": {"step": 15, "learner": 0}, "until": {"step": 30, "learner": 0}},
    {"action": "degrade", "learner": 0, "latency_ms": 20, "at": {"merges": 5}},
]


def test_replay_reproduces_the_fault_timeline(runs_dir):
    sc = tiny("decoupled", learners=2, chips=1, steps=60).replace(faults=FAULTS)
    first = run_scenario(sc, runs_dir)
    assert recorded_scenario(first.run_dir) == sc
    out = subprocess.run([sys.executable, "-m", "harness.cli", "replay", str(first.run_dir), "--runs-dir",
                          str(runs_dir / "replays"), "--quiet"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    (replay_dir,) = (runs_dir / "replays").iterdir()
    a = sorted(fault_timeline(first.run_dir), key=lambda x: x["index"])
    b = sorted(fault_timeline(replay_dir), key=lambda x: x["index"])
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
