"""Explore's written files read back: an incident file is what `load_incident` accepts, with the same faults;
an explore.jsonl line is the same record after a round trip; the reproduce command names the mutation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from diloco_chaos.chaos.schedule import parse_fault
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.explore.generate import draw, vocabulary
from diloco_chaos.harness.explore.incident import run_command, write_incident
from diloco_chaos.harness.explore.records import Base, RunLine, Verdict, read_lines
from diloco_chaos.harness.run.replay import load_incident
from diloco_chaos.trainers.mutations import ENV_VAR

SETS = ["recovery.policy=restart", "recovery.syncer_policy=restart"]


def test_a_drawn_schedule_written_as_an_incident_loads_back_the_same(tmp_path: Path) -> None:
    sc = scenario_mod.builtin("fault-free", SETS)
    v = vocabulary(sc)
    for i in range(10):
        t = draw(v, 3, i)
        assert t is not None
        path = write_incident(tmp_path / f"i{i}.toml", t.tables(), "a \"quoted\" description", ["line one"])
        assert path.read_text().startswith("# line one\n")
        loaded = load_incident(path, sc.replace(train=dataclasses.replace(sc.train, steps=t.steps)))
        assert loaded.faults == tuple(parse_fault(x, "f", 4) for x in t.tables())


def test_the_trial_scenario_is_what_run_set_and_incident_give() -> None:
    base = Base(None, "fault-free", tuple(SETS))
    sc = base.load()
    t = draw(vocabulary(sc), 0, 0)
    assert t is not None
    args = base.run_args(t, 4)
    assert args[:2] == ["--builtin", "fault-free"] and f"train.steps={t.steps}" in args
    ran = base.trial_scenario(t, 4)
    assert ran.train.steps == t.steps and len(ran.faults) == len(t.faults)
    assert base.valid(t, 4) and not base.valid(t.__class__(t.faults, 10_000_000_000, 4), 4)


def test_an_explore_line_reads_back(tmp_path: Path) -> None:
    line = RunLine(index=3, phase="explore", seed=1, outcome="failed", failed=("initial_pull",),
                   faults=({"action": "kill_learner", "learner": 1, "at": {"step": 5, "learner": 1}},), steps=20,
                   learners=2, verdicts=(Verdict("initial_pull", False, 1, 0), Verdict("faults_fired", True, 1, 1,
                                                                                        judged=False)),
                   run_dir="x", wall_s=1.5)
    (tmp_path / "e.jsonl").write_text(line.json_line() + "\n" + line.json_line() + "\n")
    assert read_lines(tmp_path / "e.jsonl") == [line, line]


def test_the_command_names_the_mutation_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "skip_initial_pull")
    assert run_command(["s.toml", "--set", "train.steps=20"], "m.toml") == (
        f"{ENV_VAR}=skip_initial_pull diloco-chaos run s.toml --set train.steps=20 --incident m.toml")
    monkeypatch.delenv(ENV_VAR)
    assert run_command(["--builtin", "default"], "m.toml") == "diloco-chaos run --builtin default --incident m.toml"
